"""Never stale, and never a crash, through code users write themselves as docs/contributing.md
teaches: their own ops (one output or several), an elementwise optimizer, an object declaring
the state it changes, and NumPy's ways of viewing an input (``sliding_window_view``) or of
computing with Python objects (``frompyfunc``).

Each scenario runs eagerly and captured from the same seed: what each call returns and the
parameters after it must be the same bits, and the captured step must replay.
"""
import warnings

import numpy as np
import pytest

import nnkit as nn
from nnkit import NetOp, backend
from tests.test_core import SquareAndCube   # (docs/contributing.md's op of two outputs)


def _same_as_eager(build, calls, replays):
    """``build()`` returns ``(step, params)``; each of ``calls`` is an argument tuple. Both
    runs must give the same bits; the captured step must replay at least ``replays`` times."""
    runs, step = [], None
    for captured in (False, True):
        nn.seed(0)
        step, params = build()
        step = nn.capture(step) if captured else step
        seen = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for args in calls:
                seen.append(np.array(step(*args).data))
                seen += [p.data.copy() for p in params]
        runs.append(seen)
    assert len(runs[0]) == len(runs[1])
    for position, (a, b) in enumerate(zip(*runs)):
        assert a.dtype == b.dtype and np.array_equal(a, b), f"array {position} differs"
    assert step.replays >= replays, step
    return step


def _batches(count=5, shape=(3, 4), seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(shape).astype(np.float32),) for _ in range(count)]


class MyTanh(NetOp):
    """y = tanh(x);  dx = g · (1 − y²)  (docs/contributing.md's example)"""
    __slots__ = ()

    def __init__(self, x):
        super().__init__(backend.array_module(x.data).tanh(x.data), x)

    def _back(self, x):
        x.accumulate(self.g * (1 - self.data ** 2))


def _step_of(make_model, loss_of=lambda h: (h ** 2).sum(), optimizer=nn.GD):
    """A ``build`` for ``_same_as_eager``: ``make_model()`` trained by ``optimizer`` on
    ``loss_of(model(x))``; ``build.model`` is the model of its last call."""
    def build():
        model = build.model = make_model()
        opt = optimizer(model.vars, lr=0.1)

        def step(x):
            loss = loss_of(model(x))
            loss.back()
            opt.step()
            return loss
        return step, model.vars
    return build


def _linear_step(loss_of, optimizer=nn.GD):
    return _step_of(lambda: nn.layers.Linear(4, 2), loss_of, optimizer)


def test_an_op_of_a_users_own_replays_as_eager():
    # the recording reads the arguments of each function of the user's it enters, and met
    # the op's own __init__ before NetOp's had set its parents: AttributeError '_parents'
    _same_as_eager(_linear_step(lambda h: MyTanh(h).sum()), _batches(), replays=4)


def test_an_op_of_a_users_own_with_two_outputs_replays_as_eager():
    def loss_of(h):
        square, cube = SquareAndCube(h)
        return (square + cube).sum()
    _same_as_eager(_linear_step(loss_of), _batches(), replays=4)


class Descent(nn.Optimizer):
    """p −= lr · g, declared elementwise as docs/contributing.md recommends."""
    elementwise = True

    def _update(self, p, g, state):
        p._data -= self.lr * g


def test_an_elementwise_optimizer_of_a_users_own_replays():
    # the runs of small parameters it updates together were read as a settings object whose
    # array the update changed: the step ran eagerly, saying it changed p._data
    _same_as_eager(_linear_step(lambda h: (h * h).sum(), Descent), _batches(), replays=4)


class RunningMean:
    """State an op-like object of a user's changes at each call, declared (contributing.md)."""
    buffers = ("mean",)
    counters = ("count",)

    def __init__(self):
        self.mean = np.zeros(2, np.float32)
        self.count = 0


class Centered(nn.Module):
    def __init__(self):
        self.layer = nn.layers.Linear(4, 2)
        self.stats = RunningMean()

    def forward(self, x):
        h = self.layer(x)
        self.stats.mean *= 0.9
        self.stats.mean += 0.1 * h.data.mean(axis=0)
        self.stats.count += 1
        return h - nn.constant(self.stats.mean)


class WarmingUp(Centered):
    def forward(self, x):
        h = super().forward(x)
        return h * 0.5 if self.stats.count <= 3 else h      # a warm-up on the counter's value


def test_a_declared_counter_the_steps_code_reads_is_guarded():
    # a replay advances a declared counter as eager does, but a value read into Python
    # (here a branch) would have been the recording's; the step runs eagerly
    build = _step_of(WarmingUp)
    _same_as_eager(build, _batches(6), replays=0)
    assert build.model.stats.count == 6


class StatefulRNN(nn.Module):
    """Carries its last state on when the batch has as many rows (a stateful RNN)."""
    last_call = ("h",)

    def __init__(self):
        self.inp, self.rec = nn.layers.Linear(4, 3), nn.layers.Linear(3, 3)
        self.h = None

    def forward(self, x):
        if getattr(self.h, "shape", (None,))[0] != x.shape[0]:
            h0 = nn.constant(np.zeros((x.shape[0], 3), np.float32))
        else:
            h0 = self.h.detach()
        self.h = nn.Tanh(self.inp(x) + self.rec(h0))
        return self.h


def test_a_forward_reading_the_node_it_kept_at_the_call_before_is_guarded():
    # last_call's names were left unguarded in the module's own forward, which here reads its
    # kept node's shape before setting it: with two signatures recorded back to back, the
    # replays took the branch each recording had seen
    rng = np.random.default_rng(0)
    rows = [5, 6, 5, 6, 6, 6]
    calls = [(rng.standard_normal((n, 4)).astype(np.float32),) for n in rows]
    _same_as_eager(_step_of(StatefulRNN), calls, replays=0)


def test_windows_of_an_input_follow_the_input():
    # sliding_window_view's view keeps NumPy's stand-in object as its base, where the search
    # for the array whose memory it views stopped: the sums over windows of the input were
    # taken for constants, computed once at the recording (the check of the first replay,
    # made on the same batch, passed)
    windows = np.lib.stride_tricks.sliding_window_view
    batches = _batches()
    batches = [batches[0]] + batches

    def build():
        layer = nn.layers.Linear(2, 1)
        opt = nn.GD(layer.vars, lr=0.01)

        def step(x):
            features = np.ascontiguousarray(windows(x, 3, axis=1).sum(-1))   # (3, 2)
            loss = (layer(features) ** 2).sum()
            loss.back()
            opt.step()
            return loss
        return step, layer.vars
    _same_as_eager(build, batches, replays=4)


def test_an_array_of_python_objects_made_in_the_step_replays():
    # np.frompyfunc's result holds references; the memory plan viewed it as bytes: TypeError
    rounded = np.frompyfunc(lambda v: round(float(v), 1), 1, 1)

    def loss_of(h):
        return (h * nn.constant(rounded(h.data).astype(np.float32))).sum()
    _same_as_eager(_linear_step(loss_of), _batches(), replays=4)


def test_a_shuffle_in_place_by_nnkits_generator_runs_eagerly_saying_so():
    # it returns None, which the refusal took for a single number drawn ("give size=1")
    def loss_of(h):
        order = np.arange(len(h.data))
        backend.rng().shuffle(order)
        return (h[order] * nn.constant(np.arange(len(order), dtype=np.float32)[:, None])).sum()
    step, _ = _linear_step(loss_of)()
    step = nn.capture(step)
    with pytest.warns(UserWarning, match="calls shuffle of nnkit's generator .* in place"):
        step(*_batches()[0])
    _same_as_eager(_linear_step(loss_of), _batches(), replays=0)
