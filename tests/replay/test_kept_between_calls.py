"""Never stale, through what lives on from one call to the next outside the parameters: a
modifier's or an optimizer's own record of earlier steps (a list of norms, an array it updates
in place, the gradients it was handed), and the gradient a node input carries from call to call
beside inputs whose values the step reads (an RNN's lengths).

Each scenario runs eagerly and captured from the same seed: the parameters, and what the
scenario observes, must be the same bits after every call.
"""
import copy
import pickle
import warnings

import numpy as np
import pytest

import nnkit as nn

RNG = np.random.default_rng(0)
BATCHES = [(RNG.standard_normal((8, 5)).astype(np.float32), RNG.integers(0, 3, 8))
           for _ in range(8)]


def _run(make_optimizer, attach_at=None, modifier=None, calls=8):
    """A small classifier trained by ``make_optimizer(params)`` eagerly, then captured, with
    ``modifier()`` attached before call ``attach_at`` (None: never). Returns, per run, the
    parameters and losses after each call, and the captured step."""
    runs, step = [], None
    for captured in (False, True):
        nn.seed(0)
        model = nn.layers.Sequential(nn.layers.Linear(5, 16), nn.Tanh, nn.layers.Linear(16, 3))
        opt = make_optimizer(model.vars)

        def train(x, y):
            loss = nn.SoftmaxCELoss(model(x), y)
            loss.back()
            opt.step()
            return loss
        step = nn.capture(train) if captured else train
        seen = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i, (x, y) in enumerate(BATCHES[:calls]):
                if i == attach_at:
                    opt.add_modifier(modifier())
                seen.append(step(x, y).data.copy())
                seen += [p.data.copy() for p in model.vars]
        runs.append(seen)
    return runs, step


def _same(runs):
    eager, captured = runs
    assert len(eager) == len(captured)
    for position, (a, b) in enumerate(zip(eager, captured)):
        assert np.array_equal(a, b), f"array {position} differs"


class MedianClip:
    """Clips to the median of the norms it has seen (a list it appends to)."""

    def __init__(self):
        self.history = []

    def modify_gradients(self, params, grads):
        norm = float(np.sqrt(sum(float((g * g).sum()) for g in grads if g is not None)))
        self.history.append(norm)
        scale = np.float32(min(1.0, float(np.median(self.history)) / (norm + 1e-6)))
        return [None if g is None else g * scale for g in grads]


class AverageClip:
    """Clips to twice a running average of the norm, kept in an array it updates in place."""

    def __init__(self):
        self.average = np.zeros(())

    def modify_gradients(self, params, grads):
        norm = np.sqrt(sum((g * g).sum() for g in grads if g is not None))
        self.average *= 0.9
        self.average += 0.1 * norm
        scale = np.minimum(1.0, 2 * self.average / (norm + 1e-6)).astype(np.float32)
        return [None if g is None else g * scale for g in grads]


class Extrapolate:
    """g + ½ (g − the previous step's g): keeps the list of gradients it was handed."""

    def __init__(self):
        self.previous = None

    def modify_gradients(self, params, grads):
        previous, self.previous = self.previous, list(grads)
        if previous is None:
            return grads
        return [g + 0.5 * (g - before) for g, before in zip(grads, previous)]


@pytest.mark.parametrize("modifier", [MedianClip, AverageClip, Extrapolate])
@pytest.mark.parametrize("attach_at", [0, 1, 3])
def test_a_modifier_keeping_a_record_of_earlier_steps_trains_as_eager(modifier, attach_at):
    # attached after the recording (call 0), a modifier was run by replays unseen: the check of
    # the first replay ran it twice (eager, then the replay) and put back only its attributes,
    # not the list it appended to or the array it updated in place; one keeping the gradients
    # it was handed kept the replay's own arrays, which the next replay overwrote
    runs, _ = _run(lambda params: nn.GD(params, lr=0.5), attach_at, modifier)
    _same(runs)


class KeepsItsGradient(nn.Optimizer):
    """Heavy ball from the fourth step, on the gradient of the step before kept in its state."""
    options = ("lr",)

    def __init__(self, params, lr=0.1):
        super().__init__(params, lr)

    def _update(self, p, g, state):
        t = state["t"] = state.get("t", 0) + 1
        p._data -= self.lr * (g + 0.5 * state["previous"] if t > 3 else g)
        state["previous"] = g               # eager's g is an array of this step's own


def test_an_optimizer_keeping_its_gradient_in_its_state_trains_as_eager():
    # the gradient it kept was the recording's array, which each replay computes anew: from
    # the fourth step on it read this step's gradient as the last one's, without a warning
    runs, step = _run(lambda params: KeepsItsGradient(params, lr=0.5))
    _same(runs)
    assert step.replays >= 5, step


def test_nnkits_own_optimizers_and_modifiers_keep_no_gradient_they_are_handed():
    # (what lets a replay hand them its gradient arrays without a look at what they kept)
    modifiers = [lambda: nn.ClipGradNorm(1.0), lambda: nn.ClipValue(0.1),
                 lambda: nn.L2Decay(0.01), lambda: nn.L1Decay(0.01), lambda: nn.MaxNorm(2.0)]
    optimizers = [nn.GD, lambda params: nn.GD(params, lr=0.1, momentum=0.9), nn.Adam, nn.AdamW,
                  nn.RMSProp, nn.AdaGrad, nn.Nesterov]
    for make in optimizers:
        layer = nn.layers.Linear(4, 3)
        opt = make(layer.vars)
        for modifier in modifiers:
            opt.add_modifier(modifier())
        for _ in range(2):
            nn.Sum(layer(np.ones((2, 4), np.float32)) ** 2).back()
            grads = [p._g for p in layer.vars]
            opt.step()
            kept = [value for state in opt.state for value in state.values()] + [
                value for modifier in opt.modifiers for value in vars(modifier).values()]
            assert not any(isinstance(value, np.ndarray) and np.may_share_memory(value, g)
                           for value in kept for g in grads), opt


# ------------------------------------------------------------------ a node input's gradient

def test_a_node_inputs_gradient_adds_up_beside_an_inputs_values_read_by_the_step():
    # an RNN's lengths are read into Python, so their values join the signature; the key was
    # taken again after the call, when back() had given the node input h0 a gradient: the
    # recording made without one at entry was filed as made with one, and replays overwrote
    # h0's gradient instead of adding to it
    T, B, F, H = 3, 2, 2, 3
    rng = np.random.default_rng(9)
    xs = [rng.standard_normal((T, B, F)).astype(np.float32) for _ in range(5)]
    lengths = np.array([3, 1])
    runs = []
    for captured in (False, True):
        nn.seed(0)
        rnn = nn.layers.GRU(F, H)
        opt = nn.GD(rnn.vars, lr=0.1)
        h0 = nn.NetVar(np.ones((B, H), np.float32), requires_grad=True)

        def train(x, lengths, h0):
            h = rnn(x, lengths, h0)
            loss = (h.final * h.final).sum()
            loss.back()
            opt.step()
            return loss
        step = nn.capture(train) if captured else train
        seen = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i, x in enumerate(xs):
                if i == 1:
                    h0.g[...] = 0           # its gradient zeroed in place once, then adding up
                step(x, lengths, h0)
                seen += [h0.g.copy()] + [p.data.copy() for p in rnn.vars]
        runs.append(seen)
    _same(runs)
    assert step.replays >= 2, step


def test_a_fresh_node_input_beside_lengths_replays():
    # the same key taken after the call: a fresh input node (no gradient at entry) never found
    # the recording filed under "has a gradient", so every call recorded, without a warning
    rng = np.random.default_rng(0)
    lengths = np.array([4, 2, 3])
    nn.seed(0)
    rnn = nn.layers.LSTM(2, 3)
    opt = nn.Adam(rnn.vars, lr=0.01)

    @nn.capture
    def step(x, lengths):
        loss = (rnn(x, lengths).final ** 2).sum()
        loss.back()
        opt.step()
        return loss
    for _ in range(6):
        step(nn.NetVar(rng.standard_normal((4, 3, 2)).astype(np.float32), requires_grad=True),
             lengths)
    assert (step.records, step.replays) == (1, 5), step



# ------------------------------------------------------------------ nodes a Module keeps

def _language_model_runs(carry):
    """A SequenceModel language model trained eagerly and captured, over chunks of one batch of
    token streams; with ``carry`` each chunk starts from the last one's final state (truncated
    BPTT), which the step returns. Returns each run's losses and parameters, and the step."""
    rng = np.random.default_rng(1)
    chunks = [rng.integers(0, 7, (6, 3)) for _ in range(6)]
    lengths = np.array([6, 4, 5])
    runs, step = [], None
    for captured in (False, True):
        lm = nn.SequenceModel(7, 4, 7, cell="lstm", embedding=3, seed=0)
        opt = nn.Adam(lm.vars, lr=0.01)

        def train(tokens, lengths, *state):
            logits = lm(tokens[:-1], lengths - 1, state=state or None)
            loss = nn.SoftmaxCELoss(logits, tokens[1:], lengths=lengths - 1)
            loss.back()
            opt.step()
            return (loss, *lm.final_state) if carry else loss
        step = nn.capture(train) if captured else train
        seen, state = [], ()
        for tokens in chunks:
            result = step(tokens, lengths, *state)
            if carry:
                result, *state = result
                state = [s.detach() for s in state]
            seen += [result.data.copy()] + [p.data.copy() for p in lm.vars]
        runs.append(seen)
    return runs, step


@pytest.mark.parametrize("carry", [False, True], ids=["chunks", "carried state"])
def test_a_sequence_model_replays_as_eager(carry):
    # SequenceModel keeps its last call's nodes (final_state reads them): the step changed a
    # Module's attributes, so every step with one ran eagerly
    runs, step = _language_model_runs(carry)
    _same(runs)
    assert step.replays == (4 if carry else 5), step    # (carried: a state from the second on)


def test_a_node_a_module_keeps_of_a_replayed_call_says_there_is_none():
    # after a replay, the node of the recording's call would be stale: any use of it raises
    lm = nn.SequenceModel(7, 4, 7, cell="gru", embedding=3, seed=0)
    opt = nn.GD(lm.vars, lr=0.1)

    @nn.capture
    def train(tokens):
        loss = nn.SoftmaxCELoss(lm(tokens[:-1]), tokens[1:])
        loss.back()
        opt.step()
        return loss
    rng = np.random.default_rng(2)
    train(rng.integers(0, 7, (5, 2)))
    assert lm.final_state[0].shape == (2, 4)      # the recording's call ran eagerly
    train(rng.integers(0, 7, (5, 2)))
    train(rng.integers(0, 7, (5, 2)))
    assert train.replays == 2, train
    with pytest.raises(AttributeError, match=r"SequenceModel\.recurrent: the last call was a "
                       "replay of nn.capture"):
        lm.final_state
    state, copied = lm.state(), copy.deepcopy(lm)     # what walks a model takes it as no node
    assert all(np.array_equal(state[name], p.data) for name, p in lm.named_vars().items())
    assert pickle.loads(pickle.dumps(copied)).vars[0].shape == lm.vars[0].shape
    lm(rng.integers(0, 7, (5, 2)))                # a call outside the step keeps its nodes again
    assert lm.final_state[0].shape == (2, 4)


def test_the_articles_ffn_trained_by_a_captured_step_replays_as_eager():
    # FFN keeps its last output for net.back(): the same as SequenceModel
    rng = np.random.default_rng(3)
    batches = [(rng.standard_normal((4, 3)), np.eye(2)[rng.integers(0, 2, 4)]) for _ in range(5)]
    start = [rng.standard_normal((3, 5)), np.zeros(5), rng.standard_normal((5, 2)), np.zeros(2)]
    runs, step = [], None
    for captured in (False, True):
        W1, b1, W2, b2 = (nn.NetVar(value.copy()) for value in start)
        net = nn.FFN((nn.Multiply, W1), (nn.Add, b1), (nn.Tanh,), (nn.Multiply, W2),
                     (nn.Add, b2))
        opt = nn.GD(net.vars, lr=0.1, momentum=0.9)

        def train(x, y):
            loss = nn.MSELoss(net(x), y)
            loss.back()
            opt.step()
            return loss
        step = nn.capture(train) if captured else train
        runs.append([value for x, y in batches for value in
                     [step(x, y).data.copy()] + [p.data.copy() for p in net.vars]])
    _same(runs)
    assert step.replays == 4, step
    with pytest.raises(AttributeError, match=r"FFN\.output: the last call was a replay"):
        net.back()


def test_the_node_a_module_keeps_of_the_recording_call_is_its_own_as_eagers():
    # FFN.output of the call that recorded held the recording's arrays (of the replay's type),
    # which every replay after it overwrote: a node the user kept changed behind their back
    rng = np.random.default_rng(3)
    net = nn.FFN((nn.Multiply, nn.NetVar(rng.standard_normal((3, 5)))), (nn.Add, nn.zeros(5)),
                 (nn.Tanh,), (nn.Multiply, nn.NetVar(rng.standard_normal((5, 2)))))
    opt = nn.GD(net.vars, lr=0.1)

    @nn.capture
    def train(x, y):
        loss = nn.MSELoss(net(x), y)
        loss.back()
        opt.step()
        return loss

    train(rng.standard_normal((4, 3)), np.zeros((4, 2)))
    kept = net.output
    graph = [kept] + list(kept.parents) + list(kept.parents[0].parents)
    graph = [node for node in graph if node.parents]        # (not the parameters, trained)
    assert len(graph) == 3
    values = [node.data.copy() for node in graph]
    for _ in range(4):
        train(rng.standard_normal((4, 3)), np.zeros((4, 2)))
    assert train.replays == 4
    for node, value in zip(graph, values):
        assert type(node.data) is np.ndarray
        np.testing.assert_array_equal(node.data, value)


def test_a_module_of_a_users_own_keeping_its_last_output_runs_eagerly_saying_how_to_replay():
    class Keeps(nn.Module):
        def __init__(self):
            self.fc = nn.layers.Linear(3, 2)
            self.output = None

        def forward(self, x):
            self.output = self.fc(x)
            return self.output
    model = Keeps()
    opt = nn.GD(model.vars, lr=0.1)

    def step(x):
        loss = nn.Sum(model(x) ** 2)
        loss.back()
        opt.step()
        return loss
    train = nn.capture(step)
    with pytest.warns(UserWarning, match=r"declare last_call = \('output',\) on Keeps"):
        train(np.ones((2, 3), np.float32))
    Keeps.last_call = ("output",)       # declared: replays, and the output says there is none
    train = nn.capture(step)
    for _ in range(3):
        train(np.ones((2, 3), np.float32))
    assert train.replays == 2, train
    assert "after a replay" in repr(model.output)


def test_after_a_first_replay_that_differed_the_model_keeps_eagers_nodes():
    # the check of the first replay puts back eager's state when the replay differs; the nodes
    # a Module keeps were left as the replay's marker: final_state raised after a call that
    # had run eagerly, and so did the next call reading it
    noise = np.random.default_rng(1)        # the step's own generator: its replay differs
    nn.seed(0)
    model = nn.SequenceModel(2, 5, 3, cell="lstm")
    opt = nn.Adam(model.vars, lr=0.01)

    @nn.capture
    def step(x, t):
        x = x + noise.standard_normal(x.shape).astype(np.float32)
        loss = nn.SoftmaxCELoss(model(x), t)
        loss.back()
        opt.step()
        return loss
    rng = np.random.default_rng(0)
    for _ in range(3):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            step(rng.standard_normal((4, 3, 2)).astype(np.float32), rng.integers(0, 3, (4, 3)))
        h, c = model.final_state
        assert h.shape == c.shape == (3, 5)
    assert step.replays == 0, step


def test_a_step_reading_the_node_of_the_call_before_runs_eagerly():
    # the recording read the data of final_state's nodes, made by the call before, as
    # constants; a replay would have gone on reading them (only the check of the first
    # replay, comparing values, stood in the way)
    nn.seed(0)
    lm = nn.SequenceModel(7, 4, 7, cell="gru", embedding=3, seed=0)
    opt = nn.GD(lm.vars, lr=0.1)
    rng = np.random.default_rng(4)
    lm(rng.integers(0, 7, (5, 2)))          # a call before: final_state holds its nodes

    @nn.capture
    def step(tokens):
        state = tuple(s.detach() for s in lm.final_state)
        loss = nn.SoftmaxCELoss(lm(tokens[:-1], state=state), tokens[1:])
        loss.back()
        opt.step()
        return loss
    with pytest.warns(UserWarning, match=r"reads SequenceModel\.recurrent, a node of the call "
                                         "before"):
        step(rng.integers(0, 7, (5, 2)))
    assert step.replays == 0


def test_a_last_call_attribute_set_to_a_list_of_nodes_runs_eagerly():
    # only a bare node was taken for one a replay leaves a marker for: a list of this call's
    # nodes stayed the recording's after every replay
    class Two(nn.Module):
        last_call = ("outs",)

        def __init__(self):
            self.layer = nn.layers.Linear(3, 2)
            self.outs = None

        def forward(self, x):
            h = self.layer(x)
            self.outs = [h, h * 2.0]
            return h
    model = Two()
    opt = nn.GD(model.vars, lr=0.1)

    @nn.capture
    def step(x):
        loss = (model(x) ** 2).sum()
        loss.back()
        opt.step()
        return loss
    rng = np.random.default_rng(0)
    with pytest.warns(UserWarning, match=r"set Two\.outs to a list"):
        step(rng.standard_normal((2, 3)).astype(np.float32))
    step(rng.standard_normal((2, 3)).astype(np.float32))
    assert step.replays == 0, step
