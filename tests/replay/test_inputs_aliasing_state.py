"""Never stale: an input that is, or shares memory with, state the step changes: an optimizer's
state array, a node input's own gradient, one array given twice. Eager reads the live array
through the input; a replay's copy of it would not, so such a call runs eagerly (the first
call) or records again (a later one), and the caller's arrays end as eager leaves them.

Each scenario runs eagerly and captured from the same seed over the same calls and compares
what every call returned and the state after it, bit for bit.
"""
import warnings

import numpy as np
import pytest

import nnkit as nn

rng = np.random.default_rng(3)
ROWS = [rng.standard_normal((5, 4)) for _ in range(6)]
CALLS = []      # the steps the scenarios call, the captured one last


def both(run):
    """``run(captured)`` for eager and captured: their results must be the same bits."""
    results = []
    for captured in (False, True):
        nn.seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results.append(run(captured))
    for k, (a, b) in enumerate(zip(*results)):
        assert np.array_equal(a, b) and np.asarray(a).dtype == np.asarray(b).dtype, \
            f"result {k} differs from eager"


@pytest.mark.parametrize("optimizer", [
    lambda params: nn.GD(params, lr=0.1, momentum=0.9),
    lambda params: nn.Adam(params, lr=0.1)], ids=["GD momentum", "Adam"])
@pytest.mark.parametrize("first_aliased", [0, 1, 2])
def test_an_input_that_is_an_optimizers_state_array_runs_eagerly(optimizer, first_aliased):
    # the recording copied its stale input copy back over the live state (saying the step
    # wrote into the input); replays returned the previous step's state, silently
    def run(captured):
        layer = nn.layers.Linear(4, 3)
        opt = optimizer(layer.vars)

        def step(x, watched):
            loss = nn.Sum(layer(x) ** 2)
            loss.back()
            opt.step()
            return loss, watched * 1.0
        step(ROWS[-1], np.zeros((4, 3), np.float32))    # a step before: the state exists
        call = nn.capture(step) if captured else step
        CALLS.append(call)
        seen = []
        for i, x in enumerate(ROWS):
            state = opt.state[0]
            watched = state[next(key for key in state if key != "t")] if i >= first_aliased \
                else np.zeros((4, 3), np.float32)     # (the state's dtype: one signature)
            loss, value = call(x, watched)
            seen += [loss.data, np.array(value.data if hasattr(value, "data") else value)]
        return seen + [p.data for p in layer.vars] + [
            value for state in opt.state for value in state.values()]
    both(run)
    assert CALLS[-1].replays >= (first_aliased == 2), CALLS[-1]     # (checked before)


@pytest.mark.parametrize("first_aliased", [0, 2])
def test_a_node_inputs_own_gradient_given_as_an_input_runs_eagerly(first_aliased):
    # back() adds into x.g in place, which the step reads through its second input: a
    # replay added into its own copy and read the stale input, silently
    def run(captured):
        layer = nn.layers.Linear(4, 2)
        x = nn.NetVar(np.zeros((5, 4)))
        x.g = np.zeros((5, 4))
        x.g                                     # owned: back() adds into it in place

        def step(x, gx):
            nn.Sum(layer(x)).back()
            return gx * 1.0
        call = nn.capture(step) if captured else step
        CALLS.append(call)
        seen = []
        for i, rows in enumerate(ROWS):
            x.data[...] = rows
            gx = x.g if i >= first_aliased else np.zeros((5, 4))
            seen.append(np.array(call(x, gx)))
        return seen + [x.g]
    both(run)
    assert CALLS[-1].replays >= (first_aliased == 2), CALLS[-1]


def test_an_array_given_twice_and_written_through_one_ends_as_eager_leaves_it():
    # the recording copied each input's buffer back in turn: the second, unwritten, undid
    # what the step wrote through the first
    def run(captured):
        layer = nn.layers.Linear(4, 2)

        def step(a, b):
            a[0, 0] = 1.0
            return nn.Sum(layer(nn.NetVar(b))) * 1.0
        call = nn.capture(step) if captured else step
        seen = []
        for rows in ROWS[:3]:
            array = rows.copy()
            seen += [call(array, array).data, array]
        return seen
    both(run)


@pytest.mark.parametrize("rows", [4, 4000], ids=["copied in", "read where it lies"])
def test_an_array_given_twice_then_two_arrays_replay_as_eager(rows):
    # one array given twice shares one buffer (a write through one shows through the other,
    # as eagerly); two arrays afterwards are another signature, not one buffer read twice
    def run(captured):
        def step(a, b):
            return nn.Sum(nn.Tanh(nn.NetVar(a, requires_grad=False)) * 2.0
                          + nn.NetVar(b, requires_grad=False), axis=1)
        call = nn.capture(step) if captured else step
        CALLS.append(call)
        seen = []
        for i in range(6):
            a = np.random.default_rng(i).standard_normal((rows, 3))
            seen.append(call(a, a.copy() if i >= 3 else a).data)
        return seen
    both(run)
    assert CALLS[-1].replays == 4, CALLS[-1]


def test_overlapping_inputs_replay_and_a_write_through_one_raises():
    # step(seq[:-1], seq[1:]) ran eagerly at every call, without a word; a step writing into
    # one of two overlapping inputs ran on a copy of each, where the write did not show
    # through the other
    def run(captured):
        layer = nn.layers.Linear(4, 4)
        opt = nn.GD(layer.vars, lr=0.1)

        def step(inputs, targets):
            loss = nn.MSELoss(layer(inputs), targets)
            loss.back()
            opt.step()
            return loss
        call = nn.capture(step) if captured else step
        CALLS.append(call)
        return [call(seq[:-1], seq[1:]).data for seq in ROWS] + [p.data for p in layer.vars]
    both(run)
    assert CALLS[-1].replays == 5, CALLS[-1]



@pytest.mark.parametrize("given", ["overlapping arrays", "a node and its array"])
def test_a_write_through_one_of_two_inputs_sharing_memory_raises_changing_nothing(given):
    # the recording ran on a copy of each, where the write did not show through the other:
    # its result and its update were not eager's (a node of an array given beside the array
    # was taken for two arrays of their own, and the call said it ran eagerly)
    nn.seed(0)
    layer = nn.layers.Linear(4, 4)
    opt = nn.Adam(layer.vars, lr=0.1, modifiers=[nn.ClipGradNorm(1.0)])

    def step(counts, inputs, targets):
        counts += 1                     # (written first, back into the caller's array)
        (targets.data if isinstance(targets, nn.NetVar) else targets)[0, 0] = 0.5
        loss = nn.MSELoss(layer(inputs), targets)
        loss.back()
        opt.step()
        return loss
    seq, counts = ROWS[0].copy(), np.zeros(3)
    args = (seq[:-1], seq[1:]) if given == "overlapping arrays" else (nn.NetVar(seq), seq)
    before = [p.data.copy() for p in layer.vars], seq.copy(), dict(vars(opt.modifiers[0]))
    with pytest.raises(RuntimeError, match=r"capture: the step wrote into input 2, which shares "
                                           r"memory with input 1; the call ran on a copy of "
                                           r"each, .* what it changed is put back"):
        nn.capture(step)(counts, *args)
    assert all(np.array_equal(a, p.data) for a, p in zip(before[0], layer.vars))
    assert np.array_equal(before[1], seq) and all(not state for state in opt.state)
    assert all(p._g is None for p in layer.vars) and not counts.any()
    assert vars(opt.modifiers[0]) == before[2]
