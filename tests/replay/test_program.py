"""What a replay runs: the instructions, the memory their buffers share, and how the inputs reach
them. Each test compares a captured step with the same step run eagerly, bit for bit, on calls
after the recording (and checks that they replayed)."""
import functools
import warnings

import numpy as np
import pytest

import nnkit as nn

from .models import build


def replayed(step, calls, signatures=1):
    """``step`` captured over ``calls`` (argument tuples): what each call returned (as arrays)
    and the capture; the first call of each of the ``signatures`` records and the rest must
    replay."""
    captured = nn.capture(step)
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # no eager fallback: every call replays
        results = [np.array(captured(*args).data) for args in calls]
    assert captured.replays == len(calls) - signatures, captured
    return results, captured


def eager(step, calls):
    return [np.array(step(*args).data) for args in calls]


def test_an_array_made_full_of_negative_zeros_is_remade_with_their_sign():
    """A created array that something writes into is rebuilt at each replay: negative zeros
    are not zeros to rebuild with a fill(0) (+0.0 + -0.0 is +0.0, -0.0 + -0.0 is -0.0)."""
    def step(x):
        z = np.full(x.shape, -0.0)
        z += x._data
        return nn.NetVar(z, requires_grad=False) * 1.0 + x

    calls = [(nn.NetVar(np.ones(4)),)] + [(nn.NetVar(np.full(4, -0.0)),)] * 3
    results, _ = replayed(step, calls)
    assert all(np.signbit(r).all() for r in results[1:])
    for a, b in zip(eager(step, calls), results):
        assert a.tobytes() == b.tobytes()


def distinct_memory(captured):
    """Bytes of the distinct memory the arrays of a capture's instructions live in."""
    (schedule,) = captured.schedules.values()
    roots = {}
    for _, args in schedule.program:
        for array in _arrays(args):
            while isinstance(array.base, np.ndarray):
                array = array.base
            roots[id(array)] = array.nbytes
    return sum(roots.values())


def _arrays(value):
    if isinstance(value, np.ndarray):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _arrays(item)


def test_buffers_whose_lives_do_not_overlap_share_memory_and_train_as_eager():
    """The forward's temporaries die before the backward's are made: the replay's buffers
    take less memory than one array each, and training still gives eager's bits."""
    calls = build("mlp", np.float64).batches(30)
    want = eager(build("mlp", np.float64).step, calls)
    built = build("mlp", np.float64)
    got, captured = replayed(built.step, calls)
    assert [a.tobytes() for a in want] == [b.tobytes() for b in got]
    (schedule,) = captured.schedules.values()
    each = sum(buffer.nbytes for buffer in _written_buffers(schedule))
    assert distinct_memory(captured) < each + sum(p.data.nbytes for p in built.model.vars)


def _written_buffers(schedule):
    """The arrays the instructions write into (an out= argument), one per memory."""
    seen = {}
    for function, args in schedule.program:
        if isinstance(function, np.ufunc) and len(args) == function.nin + 1:
            seen[id(args[-1])] = args[-1]
    return seen.values()


def _reads(captured, array):
    """Whether an instruction of the capture's one schedule reads ``array`` itself."""
    schedule, = captured.schedules.values()
    return any(value is array for _, args in schedule.program for value in _flat(args))


def _flat(value):
    if isinstance(value, (tuple, list)):
        return [v for item in value for v in _flat(item)]
    return [value]


@pytest.mark.parametrize("rows", [4, 4000])
def test_the_replay_reads_a_large_input_itself_and_copies_a_small_one(rows):
    """A large C-ordered input is read where it lies (no copy), a small one copied in (cheaper
    than pointing its readers at it); either way changing it between calls in place changes
    what the next call computes, as it does eagerly."""
    x = np.arange(rows * 3.0).reshape(rows, 3) / rows

    def step(x):
        return nn.Sum(nn.Tanh(nn.NetVar(x, requires_grad=False)) * 2.0, axis=1)

    results, captured = replayed(step, [(x,), (x,)])
    assert _reads(captured, x) == (rows == 4000)        # 96,000 bytes, one reader
    x *= -0.5                                   # in place: the same object next call
    again = np.array(captured(x).data)
    assert again.tobytes() == np.array(step(x).data).tobytes()
    assert not np.array_equal(again, results[-1])


@pytest.mark.parametrize("layout", ["transposed", "mixed", "same twice"])
def test_inputs_laid_out_otherwise_are_copied_in_and_give_eagers_values(layout):
    """Inputs that are views in another order are read through a copy; an input given once
    in C order and then in F order (and back) is read right each time (the two orders are two
    signatures: a sum's bits follow the layout). (Gaps between elements: eager,
    test_step_itself.py.)"""
    rng = np.random.default_rng(3)

    def step(a, b):
        return nn.NetVar(a, requires_grad=False) @ nn.NetVar(b, requires_grad=False) + a

    def pair(k):
        a = rng.standard_normal((3, 3))
        if layout == "transposed" or (layout == "mixed" and k % 2):
            a = np.ascontiguousarray(a).T
        return (a, a) if layout == "same twice" else (a, rng.standard_normal((3, 3)))

    calls = [pair(k) for k in range(6)]
    results, _ = replayed(step, calls, signatures=2 if layout == "mixed" else 1)
    assert [r.tobytes() for r in results] == [e.tobytes() for e in eager(step, calls)]


def test_a_step_returning_its_input_hands_out_this_calls_value():
    """An input the step also returns is copied in (the output is handed out from its buffer),
    though the instructions could read it where it lies."""
    def step(x, w):
        return x, nn.NetVar(w, requires_grad=False) * 2.0 + nn.NetVar(x, requires_grad=False)

    captured = nn.capture(step)
    rng = np.random.default_rng(0)
    for _ in range(4):
        x, w = rng.standard_normal(3), rng.standard_normal(3)
        got = captured(x, w)
        assert np.array_equal(got[0], x) and got[0] is not x
        assert np.array_equal(got[1].data.reshape(-1), w * 2.0 + x)
    assert captured.replays >= 2


def run(instructions):
    for function, args, kwargs in instructions:
        function(*args, **kwargs)


@pytest.mark.parametrize("first_touch", ["in place", "in part"])
def test_a_buffer_whose_first_touch_reads_what_it_held_keeps_its_memory(first_touch):
    """The planner moves a buffer into a dead one's memory only when its first instruction
    writes all of it without reading it; a buffer first updated in place, or written in part,
    holds values from before (its recording, another call) and keeps its own memory."""
    from nnkit.replay.program import _shared

    a, b = np.arange(4.0), np.full(4, 2.0)
    dead, kept, out = np.empty(4), np.arange(10.0, 14.0), np.empty(4)
    part = kept[:2]
    first = ((np.add, (kept, b), {"out": kept}, (kept,)) if first_touch == "in place" else
             (np.add, (a[:2], b[:2]), {"out": part}, (part,)))
    instructions = [(np.multiply, (a, b), {"out": dead}, (dead,)),
                    (np.add, (dead, b), {"out": out}, (out,)),
                    first,
                    (np.multiply, (kept, out), {"out": out}, (out,))]
    want = kept.copy()
    run([i[:3] for i in instructions])
    want, kept[:] = (kept.copy(), want)
    planned = _shared(instructions, pinned=[out, a, b], trusted=())
    run(planned)
    assert np.array_equal(kept, want)


def test_the_planner_moves_a_buffer_written_whole_into_a_dead_ones_memory():
    """Its positive case: the same program with the third instruction writing all of a fresh
    buffer moves that buffer into the first one's memory, with the same results."""
    from nnkit.replay.program import _shared

    a, b = np.arange(4.0), np.full(4, 2.0)
    dead, fresh, out = np.empty(4), np.empty(4), np.empty(4)
    instructions = [(np.multiply, (a, b), {"out": dead}, (dead,)),
                    (np.add, (dead, b), {"out": out}, (out,)),
                    (np.subtract, (a, b), {"out": fresh}, (fresh,)),
                    (np.multiply, (fresh, out), {"out": out}, (out,))]
    run([i[:3] for i in instructions])
    want = out.copy()
    planned = _shared(instructions, pinned=[out, a, b], trusted=())
    assert np.shares_memory(planned[2][2]["out"], dead)
    out[:] = 0
    run(planned)
    assert np.array_equal(out, want)


def test_a_program_with_an_array_out_of_sight_shares_no_memory():
    """An argument the planner cannot see into (here a partial holding a buffer) could read a
    buffer after its last visible use: then no buffer moves."""
    import functools

    from nnkit.replay.program import _shared

    a, b = np.arange(4.0), np.full(4, 2.0)
    dead, fresh, out = np.empty(4), np.empty(4), np.empty(4)
    instructions = [(np.multiply, (a, b), {"out": dead}, (dead,)),
                    (np.subtract, (a, b), {"out": fresh}, (fresh,)),
                    (functools.partial(np.add, dead), (fresh,), {"out": out}, (out,))]
    run([i[:3] for i in instructions])
    want = out.copy()
    out[:] = 0
    run(_shared(instructions, pinned=[out, a, b], trusted=()))
    assert np.array_equal(out, want)


@pytest.mark.parametrize("order", ["C", "F", "A"])
def test_copies_made_by_reshape_and_astype_replay_as_eager(order):
    """A reshape that must copy (its array is not laid out for a view) and an astype are
    written straight into their buffers (C order), else called as recorded (F, A)."""
    def step(x):
        flat = x[::2, ::2].reshape(-1, order=order)     # in no order: each reshape copies
        y = np.empty_like(flat)
        np.multiply(flat, 2.0, out=y)
        z = np.empty(y.shape, np.float32)
        np.copyto(z, y.astype(np.float32) + np.float32(1))
        return nn.NetVar(z, requires_grad=False) * np.float32(0.5)

    rng = np.random.default_rng(0)
    calls = [(rng.standard_normal((4, 6)),) for _ in range(4)]
    results, _ = replayed(lambda x: step(x), calls)
    assert [r.tobytes() for r in results] == [e.tobytes() for e in eager(step, calls)]


def test_back_on_what_a_captured_forward_returns_says_to_call_it_inside_the_step():
    """A step returning a loss for the caller to differentiate (as a Trainer's step_fn does) is
    no step to capture: what it returns are values, and back() on one says so."""
    nn.seed(0)
    layer = nn.layers.Linear(3, 2)

    def forward(x, y):
        return nn.SoftmaxCELoss(layer(x), y)

    captured = nn.capture(forward)
    x, y = np.ones((4, 3)), np.array([0, 1, 0, 1])
    for _ in range(3):
        loss = captured(x, y)
        with pytest.raises(RuntimeError, match="nn.capture"):
            loss.back()
    assert not layer.W.g.any()            # (zeros: no back() reached it)


def test_ones_like_is_made_once_and_full_like_follows_its_fill_value():
    """``ones_like(a)`` reads only a's shape and dtype (made once, left out of the replay);
    ``full_like(a, v)`` reads v, which the replay reads again."""
    def step(x):
        filled = np.full_like(x, x.sum()) + np.ones_like(x) * x.dtype.type(2)
        return nn.NetVar(filled, requires_grad=False) * 1.0

    rng = np.random.default_rng(1)
    calls = [(rng.standard_normal(5),) for _ in range(4)]
    results, captured = replayed(step, calls)
    assert [r.tobytes() for r in results] == [e.tobytes() for e in eager(step, calls)]
    (schedule,) = captured.schedules.values()
    assert not any(getattr(args[1], "__name__", "") == "ones_like" for f, args in schedule.program
                   if getattr(f, "__name__", "") == "_into")


def test_operations_run_under_the_floating_point_error_state_they_were_recorded_under():
    """A step that asks NumPy to raise on an overflow (``np.errstate``) raises at a replay too,
    where a replay calling the operation bare would hand out inf; and one that silences the
    overflow stays silent."""
    def step(x, how):
        with np.errstate(over=how):
            y = np.exp(x._data)
        return nn.NetVar(y, requires_grad=False) * 1.0

    for how in ("raise", "ignore"):
        captured = nn.capture(step)
        small = nn.NetVar(np.array([1.0, 2.0]))
        for _ in range(3):
            np.testing.assert_array_equal(captured(small, how).data, np.exp([[1.0, 2.0]]))
        assert captured.replays == 2
        large = nn.NetVar(np.array([1.0, 1000.0]))
        with warnings.catch_warnings():
            warnings.simplefilter("error")              # an overflow warning fails the test
            if how == "raise":
                with pytest.raises(FloatingPointError):
                    captured(large, how)
            else:
                assert np.isinf(captured(large, how).data).any()


def _live_gradients(captured):
    """The gradients the one schedule's optimizer step is handed, and the views of the
    optimizer's flat gradient arrays (optim/flat.py) each parameter's would be copied into."""
    from nnkit.optim import flat
    from nnkit.replay.instructions import _live_step
    (schedule,) = captured.schedules.values()
    (_, optimizer, grads), = [args for function, args in schedule.program
                              if function is _live_step]
    homes = flat.gradient_homes(optimizer)
    return [(g, homes.get(id(p))) for p, g, _ in grads]


def test_gradients_are_computed_into_the_flat_arrays_the_optimizer_updates_from():
    """From the second replay on, the program computes each small parameter's gradient in its
    place in the optimizer's flat array (small parameters updated together): the step finds it
    there and copies none. Training gives eager's bits, before and after the optimizer's state
    is forgotten (its flat arrays made anew: the gradients are copied into them again)."""
    calls = build("mlp", np.float32).batches(12)
    reference = build("mlp", np.float32)
    want = eager(reference.step, calls[:6])
    built = build("mlp", np.float32)
    got, captured = replayed(built.step, calls[:6])
    assert [a.tobytes() for a in want] == [b.tobytes() for b in got]
    assert all(g is home for g, home in _live_gradients(captured))
    for optimizer in (reference.optimizer, built.optimizer):
        optimizer.state[0] = {}
    want = eager(reference.step, calls[6:])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = [np.array(captured(*args).data) for args in calls[6:]]
    assert [a.tobytes() for a in want] == [b.tobytes() for b in got]
    assert not any(g is home for g, home in _live_gradients(captured))
    assert all(np.array_equal(a, b) for a, b in zip(reference.state(), built.state()))


def test_rehome_moves_the_views_inside_an_arrays_bytes_and_refuses_a_view_across_them():
    from nnkit.replay.program import rehome
    memory = np.zeros(20)
    g = memory[4:10].reshape(2, 3)          # the gradient's bytes: elements 4 to 9
    home = np.zeros((2, 3))
    row, apart = g[1], memory[12:16]
    program = [(np.add, (row, 1.0, row)), (np.multiply, (apart, 2.0, apart)),
               (np.sum, ([g],))]
    moved = rehome(program, (), g, home)
    assert moved[0][1][0].base is home and moved[0][1][0].shape == (3,)
    np.add(*moved[0][1])
    assert home[1].tolist() == [1.0, 1.0, 1.0] and not memory.any()     # g's row, moved
    assert moved[1][1][0] is apart                                        # not g's: left
    assert moved[2][1][0][0] is home
    across = memory[8:14]                   # part of g's bytes and more
    assert rehome(program + [(np.negative, (across, across))], (), g, home) is None
    assert rehome(program, ([memory[5:7]],), g, home) is None               # handed out
    written_by_keyword = (functools.partial(np.maximum, out=g[0]), (g[0], 0.0))
    assert rehome(program + [written_by_keyword], (), g, home) is None


def test_a_step_handing_out_a_gradient_and_two_optimizers_train_as_eager_once_homed():
    """Gradients computed into two optimizers' flat arrays, except one read and handed out
    before its step (it stays in its buffer): each call's values and the parameters after are
    eager's bits."""
    def build_pair():
        nn.seed(0)
        first, second = nn.layers.Linear(4, 4), nn.layers.Linear(4, 1)
        adam, gd = nn.Adam(first.vars, lr=0.01), nn.GD(second.vars, lr=0.05, momentum=0.9)

        def step(x):
            loss = nn.MSELoss(second(first(x)), nn.NetVar(np.ones((6, 1))))
            loss.back()
            seen = first.W.g            # read before the step: a copy, handed out
            adam.step()
            gd.step()
            return loss, seen
        return step, first.vars + second.vars

    rng = np.random.default_rng(1)
    calls = [(rng.standard_normal((6, 4)),) for _ in range(6)]
    step, params = build_pair()
    want = [[np.array(v.data if hasattr(v, "data") else v) for v in step(*c)] for c in calls]
    step, replayed_params = build_pair()
    captured = nn.capture(step)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = [[np.array(v.data if hasattr(v, "data") else v) for v in captured(*c)]
               for c in calls]
    assert captured.replays == len(calls) - 1
    assert [[a.tobytes() for a in w] for w in want] == [[b.tobytes() for b in g] for g in got]
    assert all(p.data.tobytes() == q.data.tobytes() for p, q in zip(params, replayed_params))
    from nnkit.optim import flat
    from nnkit.replay.instructions import _live_step
    (schedule,) = captured.schedules.values()
    steps = [args for function, args in schedule.program if function is _live_step]
    homed = [g is flat.gradient_homes(optimizer)[id(p)]
             for _, optimizer, grads in steps for p, g, _ in grads]
    assert homed == [False, True, True, True]       # the one handed out stays where it is


def test_a_step_without_an_optimizer_hands_each_gradient_out_once():
    """The model's parameters are found before the step (the Module) and met as it runs (the
    graph): a replay copies each one's gradient out once, not once per finding."""
    nn.seed(0)
    model = nn.layers.Sequential(nn.layers.Linear(3, 4), nn.Tanh, nn.layers.Linear(4, 1))

    def step(x):
        loss = nn.MSELoss(model(x), nn.NetVar(np.zeros((5, 1))))
        loss.back()
        return loss

    x = np.random.default_rng(2).standard_normal((5, 3))
    captured = nn.capture(step)
    handed = []
    for _ in range(3):
        for p in model.vars:
            p.reset()
        captured(x)
        handed.append([p.g.copy() for p in model.vars])
    assert captured.replays == 2
    (schedule,) = captured.schedules.values()
    assert sorted(id(leaf) for leaf, _ in schedule.grads_out) == sorted(map(id, model.vars))
    for p in model.vars:
        p.reset()
    step(x)
    assert all(p.g.tobytes() == h.tobytes() for p, h in zip(model.vars, handed[-1]))
