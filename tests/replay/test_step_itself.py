"""Never stale, through what a step does itself and what is done around it: writes into its
inputs or into arrays from outside, errors it catches, values it formats, NumPy scalars it
returns, read-only arrays; an optimizer's step kept from before the capture, the
generator and the optimizer's state a user holds between calls.

Each scenario runs eagerly and captured from the same seed, over fresh inputs: what every call
returned (or raised), the parameters and what the scenario observes after each call must be
the same bits.
"""
import collections
import warnings

import numpy as np
import pytest

import nnkit as nn


def _bits(value):
    if isinstance(value, nn.NetVar):
        value = value.data
    if isinstance(value, (np.ndarray, np.generic)):
        return type(value).__name__, value.dtype.str, np.shape(value), value.tobytes()
    if isinstance(value, dict):
        return type(value).__name__, [(key, _bits(item)) for key, item in value.items()]
    if isinstance(value, (tuple, list)):
        return type(value).__name__, [_bits(item) for item in value]
    return value


def same_as_eager(build, calls):
    """``build()`` returns ``(step, observed)``; ``calls()`` the argument tuples, made anew for
    each run. Returns the captured step after checking both runs alike."""
    runs = []
    for captured in (False, True):
        nn.seed(0)
        step, observed = build()
        if captured:
            step = nn.capture(step)
        seen = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for args in calls():
                try:
                    result = _bits(step(*args))
                except Exception as error:      # noqa: BLE001 (eager's error is the expected)
                    result = f"{type(error).__name__}: {error}"
                seen.append((result, [_bits(value) for value in observed()]))
        runs.append(seen)
    assert runs[0] == runs[1]
    return step


def linear_gd(loss_of, lr=0.1, outputs=2):
    """A Linear(3, outputs) trained by GD on ``loss_of(layer, *inputs)``: ``(step, observed)``,
    observed the parameters."""
    layer = nn.layers.Linear(3, outputs)
    opt = nn.GD(layer.vars, lr=lr)

    def step(*inputs):
        loss = loss_of(layer, *inputs)
        loss.back()
        opt.step()
        return loss
    return step, lambda: list(layer.vars)


def batches(*scales, rows=2):
    return lambda: [(np.full((rows, 3), scale, np.float32),) for scale in scales]


# ------------------------------------------------------------------ what the step writes

COUNT = np.zeros((), np.int64)


def test_a_write_into_an_array_from_outside_the_step_runs_eagerly():
    """np.add(COUNT, ..., out=COUNT): the first call adds 0, so no guard sees the step change
    it; the check of the first replay ran the step eagerly and replayed it, adding twice."""
    def build():
        COUNT[...] = 0

        def loss_of(layer, x):
            out = layer(x)
            np.add(COUNT, (np.abs(out.data) > 1).sum(), out=COUNT)
            return nn.Sum(out)
        step, params = linear_gd(loss_of)
        return step, lambda: params() + [COUNT.copy()]

    step = same_as_eager(build, batches(0.01, 3, 6, 9))
    assert step.replays == 0 and len(step.schedules) == 1


def _flat_write(x):
    x.flat[0] = 100.0


def _nditer_clamp(x):
    for value in np.nditer(x[0], op_flags=["readwrite"]):
        value[...] = min(value, 5.0)


@pytest.mark.parametrize("write", [_flat_write, _nditer_clamp])
def test_a_write_into_an_input_that_no_instruction_sees_runs_eagerly(write):
    """Through .flat or np.nditer (which clamps nothing until the third call): the caller's
    array and the losses as eager's."""
    inputs = []

    def build():
        def loss_of(layer, x, w):
            write(x)
            return nn.Sum(layer(x) * nn.constant(w))
        step, params = linear_gd(loss_of, outputs=1)
        return step, lambda: params() + inputs[-1:]

    def calls():
        inputs[:] = [np.arange(12, dtype=np.float32).reshape(4, 3) * (i + 1) for i in range(5)]
        return [(x, np.arange(1, 5, dtype=np.float32).reshape(4, 1)) for x in inputs]

    assert same_as_eager(build, calls).replays == 0


def test_a_write_into_a_node_inputs_data_reaches_the_callers_array_when_recording():
    x = nn.NetVar(np.ones(3))

    def build():
        x.data = np.ones(3)

        def loss_of(layer, node):
            node.data[...] *= 2
            return nn.Sum(node * 1.0)
        step, params = linear_gd(loss_of)
        return step, lambda: [x.data.copy()]

    same_as_eager(build, lambda: [(x,)])


def test_a_write_into_a_read_only_input_raises_as_eagerly_before_any_update():
    def build():
        def loss_of(layer, x):
            x *= 2
            return nn.Sum(layer(x))
        return linear_gd(loss_of)

    def calls():
        made = [np.ones((2, 3)) for _ in range(3)]
        for x in made:
            x.setflags(write=False)
        return [(x,) for x in made]

    same_as_eager(build, calls)


# ------------------------------------------------------------------ what the step reads

def test_an_error_the_step_catches_runs_eagerly_whichever_call_raises():
    """1 / x raises under errstate(divide="raise") when x holds a zero: recorded on the call
    that raised (the except path) or on one that did not (a replay meets the error)."""
    def loss_of(layer, x):
        try:
            with np.errstate(divide="raise"):
                scale = 1.0 / x
        except FloatingPointError:
            scale = x * 0 + 1.0
        return nn.Sum(layer(nn.constant(scale) * x))

    for zeros in ({2}, {0, 1}):
        def calls():
            made = [np.full((2, 3), 1.0 + i, np.float32) for i in range(5)]
            for i in zeros:
                made[i][0, 0] = 0
            return [(x,) for x in made]
        same_as_eager(lambda: linear_gd(loss_of), calls)


def test_a_value_formatted_into_a_string_is_read_as_the_step_reads_it():
    def loss_of(layer, x):
        tag = f"{x.max():.0f}"
        return nn.Sum(layer(x)) * (2.0 if tag == "1" else 1.0)

    same_as_eager(lambda: linear_gd(loss_of), batches(1.0, 1.1, 5.0, 6.0, 1.0))


def test_a_numpy_scalar_the_step_returns_is_handed_out_as_one():
    def build():
        step, params = linear_gd(lambda layer, x: nn.Sum(layer(x)))

        def returning(x):
            step(x)
            return x.sum()
        return returning, params

    step = same_as_eager(build, batches(1.0, 2.0, 3.0, 4.0))
    assert step.replays == 3


def test_a_namedtuple_or_ordered_dict_returned_comes_back_as_eager_gives_it():
    Out = collections.namedtuple("Out", "loss doubled")
    for wrap in (lambda loss: Out(loss, loss * 2.0),
                 lambda loss: collections.OrderedDict(loss=loss),
                 lambda loss: collections.defaultdict(list, loss=loss)):
        def build():
            step, params = linear_gd(lambda layer, x: nn.Sum(layer(x)))
            return (lambda x: wrap(step(x))), params
        assert same_as_eager(build, batches(1.0, 2.0, 3.0)).replays == 2



def test_integer_and_boolean_nodes_the_step_returns_keep_their_dtype():
    # a returned node was handed out through constant(), which gives an int or bool array
    # nnkit's float dtype: the recording call returned ArgMax as float32 (2**24 + 1 rounded)
    def build():
        step, params = linear_gd(lambda layer, x: nn.Sum(layer(x)))

        def returning(x, ids):
            loss = step(x)
            return nn.ArgMax(loss * x, axis=1), nn.NetVar(ids, dtype=int) * 1, x > 1.5
        return returning, params

    def calls():
        return [(np.full((2, 3), scale, np.float32), np.array([2 ** 24 + 1, 3]))
                for scale in (1.0, 2.0, 3.0, 4.0)]
    step = same_as_eager(build, calls)
    assert step.replays >= 2, step


# ------------------------------------------------------------------ around the step

def test_an_optimizer_step_kept_before_the_capture_is_not_replayed_with_a_fixed_rate():
    """opt.step wrapped on the optimizer before capture (a timer) and a StepLR between
    calls: its update must not be recorded as arithmetic with the first call's rate."""
    def build():
        layer = nn.layers.Linear(3, 2)
        opt = nn.GD(layer.vars, lr=0.1, momentum=0.0)
        original = opt.step
        opt.step = lambda: original()
        schedule = nn.StepLR(opt, 2, gamma=0.1)

        def step(x):
            loss = nn.Sum(layer(x) ** 2)
            loss.back()
            opt.step()
            return loss

        def observed():
            schedule.step()
            return list(layer.vars)
        return step, observed

    assert same_as_eager(build, batches(1.0, 2.0, 3.0, 4.0, 5.0, 6.0)).replays == 0


def test_draws_between_calls_from_the_generator_a_user_holds_follow_the_step():
    """gen = nn.backend.rng() held by the user, drawn from between calls, with Dropout in the
    step: the check of the first replay puts the generator back in place, so gen stays it."""
    def build():
        model = nn.layers.Sequential(nn.layers.Linear(3, 8), nn.layers.Dropout(0.5),
                                     nn.layers.Linear(8, 2))
        opt = nn.Adam(model.vars, lr=0.01)
        gen = nn.backend.rng()

        def step(x):
            loss = nn.Sum(model(x) ** 2)
            loss.back()
            opt.step()
            return loss
        return step, lambda: list(model.vars) + [gen.standard_normal(2)]

    assert same_as_eager(build, batches(1.0, 2.0, 3.0, 4.0, 5.0)).replays == 4


def test_the_optimizer_state_a_user_holds_stays_the_live_one():
    held = []

    def build():
        held.clear()
        model = nn.layers.Linear(3, 2)
        opt = nn.Adam(model.vars, lr=0.01)

        def step(x):
            loss = nn.Sum(model(x) ** 2)
            loss.back()
            opt.step()
            return loss

        def observed():
            if not held:
                held.extend([opt.state[0], opt.state[0]["m"]])
            return [held[0]["t"], held[1].copy(), opt.state[0]["m"]]
        return step, observed

    assert same_as_eager(build, batches(1.0, 2.0, 3.0, 4.0, 5.0)).replays == 4


def test_a_frozen_layer_with_read_only_data_replays():
    """A layer kept out of the optimizer whose data is read-only (np.broadcast_to, a memory
    map): the check of the first replay saves and puts back only what a step can write."""
    def build():
        frozen, layer = nn.layers.Linear(3, 3), nn.layers.Linear(3, 2)
        frozen.W.data = np.broadcast_to(np.float32(0.5), (3, 3))
        frozen.W.requires_grad = frozen.b.requires_grad = False
        opt = nn.Adam(layer.vars, lr=0.01)

        def step(x):
            loss = nn.Sum(layer(frozen(x)) ** 2)
            loss.back()
            opt.step()
            return loss
        return step, lambda: list(layer.vars)

    assert same_as_eager(build, batches(1.0, 2.0, 3.0, 4.0)).replays == 3


def test_an_array_input_times_a_node_replays():
    """x @ W with x a plain array: NumPy lets the node's operator answer; that answer is no
    value read into Python (each batch was its own signature, recorded again)."""
    def build():
        W = nn.NetVar(np.random.default_rng(0).standard_normal((3, 2)).astype(np.float32))
        opt = nn.Adam([W], lr=0.01)

        def step(x):
            loss = nn.Sum((x @ W) ** 2)
            loss.back()
            opt.step()
            return loss
        return step, lambda: [W]

    def calls():
        rng = np.random.default_rng(1)
        return [(rng.standard_normal((4, 3)).astype(np.float32),) for _ in range(5)]

    assert same_as_eager(build, calls).replays == 4


def test_keyword_arguments_run_eagerly_with_a_warning():
    layer = nn.layers.Linear(3, 2)

    def step(x, scale=1.0):
        return nn.Sum(layer(x)) * scale
    captured = nn.capture(step)
    with pytest.warns(UserWarning, match="keyword arguments \\(scale\\): pass its inputs by position"):
        loss = captured(np.ones((2, 3), np.float32), scale=2.0)
    assert loss.data.dtype == np.float32 and captured.records == 0


def test_a_copy_of_a_captured_step_captures_the_step_anew():
    import copy
    import pickle
    step, params = linear_gd(lambda layer, x: nn.Sum(layer(x)))
    captured = nn.capture(step, max_signatures=3)
    for _ in range(2):
        captured(np.ones((2, 3), np.float32))
    for copied in (copy.copy(captured), copy.deepcopy(captured)):
        assert (copied.fn, copied.max_signatures, copied.records) == (step, 3, 0)
        before = [p.data.copy() for p in params()]
        copied(np.ones((2, 3), np.float32))
        assert copied.records == 1 and any(
            (p.data != b).any() for p, b in zip(params(), before))
    assert pickle.loads(pickle.dumps(nn.capture(np.add))).fn is np.add


def test_a_buffer_the_step_names_and_returns_replays_as_eager():
    """bn.stats.running_mean named in the step (returned for monitoring): the step's own
    state, handed in at each replay, so no guard of its contents; the check of the first replay
    leaves the array eager returned as eager made it."""
    def build():
        model = nn.layers.Sequential(nn.layers.Linear(3, 4), nn.layers.BatchNorm(4),
                                     nn.layers.Linear(4, 1))
        bn, opt = model.layers[1], nn.GD(model.vars, lr=0.1)

        def step(x):
            loss = nn.Sum(model(x) ** 2)
            loss.back()
            opt.step()
            return loss, bn.stats.running_mean
        return step, lambda: list(model.vars) + [bn.stats.running_var]

    def calls():
        return [(np.random.default_rng(i).standard_normal((5, 3)),) for i in range(4)]

    assert same_as_eager(build, calls).replays == 3


def test_an_optimizer_that_did_not_step_before_an_error_keeps_its_gradients():
    """Two optimizers; the first refuses a learning rate set between calls (at a replay):
    eager leaves every gradient in place, and so does the replay, for the next calls."""
    def build():
        first, second = nn.layers.Linear(3, 4), nn.layers.Linear(4, 2)
        opt1, opt2 = nn.GD(first.vars, lr=0.1), nn.GD(second.vars, lr=0.1)
        calls = []

        def step(x):
            loss = nn.Sum(second(nn.Tanh(first(x))) ** 2)
            loss.back()
            opt2.step()
            opt1.step()
            return loss

        def observed():
            calls.append(None)
            opt2.lr = -1.0 if len(calls) == 3 else 0.1      # refused at the fourth call
            return [(p.data, None if p._g is None else p.g) for p in first.vars + second.vars]
        return step, observed

    same_as_eager(build, batches(1.0, 2.0, 3.0, 4.0, 5.0, 6.0))


class Holder:
    pass


def test_a_gradient_left_on_a_parameter_of_an_optimizer_found_as_the_step_ran_is_used():
    """The step finds its optimizer by a name in a string; the optimizer also updates a layer
    the step does not use, whose gradient the user sets between calls (or before the first)."""
    for before_first in (False, True):
        def build():
            layer, unused = nn.layers.Linear(3, 2), nn.layers.Linear(2, 2)
            trainer = Holder()
            trainer.optimizer = nn.GD(layer.vars + unused.vars, lr=0.1)
            calls = []

            def step(x):
                loss = nn.Sum(layer(x) ** 2)
                loss.back()
                getattr(trainer, "optim" + "izer").step()
                return loss

            def observed():
                calls.append(None)
                if len(calls) == 3:
                    unused.W.g = np.ones((2, 2))
                return [unused.W.data, layer.W.data]
            if before_first:
                unused.W.g = np.ones((2, 2))
            return step, observed
        step = same_as_eager(build, batches(1.0, 2.0, 3.0, 4.0, 5.0))
        refusals = [why for why in step.schedules.values() if isinstance(why, str)]
        assert any("from a gradient it had before the call, and capture found the optimizer "
                   "only as the step ran" in why for why in refusals), refusals


def test_two_updates_in_one_step_through_a_batchnorm_replay():
    """A shape read (the running statistics' shape BatchNorm checks) after the first update
    is no value read into Python: the signature fixes it."""
    def build():
        model = nn.layers.Sequential(nn.layers.Linear(3, 4), nn.layers.BatchNorm(4),
                                     nn.layers.Linear(4, 1))
        opt = nn.Adam(model.vars, lr=0.01)

        def step(x):
            for _ in range(2):
                loss = nn.Sum(model(x) ** 2)
                loss.back()
                opt.step()
            return loss
        return step, lambda: list(model.vars) + [model.layers[1].stats.running_mean]

    assert same_as_eager(build, batches(1.0, 2.0, 3.0, 4.0, rows=5)).replays == 3


def test_another_threads_eager_step_while_one_records_is_not_the_steps():
    import threading
    nn.seed(0)
    mine, theirs = nn.layers.Linear(3, 2), nn.layers.Linear(3, 2)
    opt = nn.GD(mine.vars, lr=0.1)
    inside, done = threading.Event(), threading.Event()

    def step(x):
        loss = nn.Sum(mine(x) ** 2)
        if not inside.is_set():
            inside.set()
            done.wait(10)           # the other thread trains while this one records
        loss.back()
        opt.step()
        return loss

    def other():
        inside.wait(10)
        nn.Sum(theirs(np.ones((2, 3), np.float32))).back()
        done.set()

    captured = nn.capture(step)
    thread = threading.Thread(target=other)
    thread.start()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            captured(np.ones((2, 3), np.float32))
    thread.join()
    assert captured.replays == 2


def test_a_branch_taking_turns_replays_both_recordings_of_the_signature():
    """A branch on a computed value taking turns: a recording, its (checked) replay, another
    recording, its replay, then replays of each in turn (a signature keeps the recording
    before its last), as eager, never a warning."""
    def build():
        layer = nn.layers.Linear(3, 2)
        opt = nn.GD(layer.vars, lr=0.1)

        def step(x):
            out = layer(x)
            if x[0, 0] > 0:
                out = out * 2.0
            loss = nn.Sum(out ** 2)
            loss.back()
            opt.step()
            return loss
        return step, lambda: list(layer.vars)

    signs = (1, 1, -1, -1, 1, 1, -1, -1, 1, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        captured = same_as_eager(build, lambda: [(np.full((2, 3), sign, np.float32),)
                                                 for sign in signs])
    assert (captured.records, captured.replays) == (2, 8)


@pytest.mark.parametrize("take", ["index", "item", "astype"])
def test_what_is_taken_from_a_draw_of_nnkits_generator_follows_each_draw(take):
    """A random flip decided from nn.backend.rng() inside the step (draw[0], draw.item()), or
    noise cast with .astype: each replay's own draw, not the recording's (seed 0 drew the
    recording's flip again at the checked replay, then kept it)."""
    def build():
        layer = nn.layers.Linear(3, 2, seed=1)
        opt = nn.GD(layer.vars, lr=0.1)

        def step(x):
            draw = nn.backend.rng().integers(0, 2, 1)
            if take == "astype":
                x = x + nn.backend.rng().standard_normal(x.shape).astype(np.float32)
            elif (draw[0] if take == "index" else draw.item()):
                x = x[:, ::-1]
            loss = nn.Sum(layer(x) ** 2)
            loss.back()
            opt.step()
            return loss
        return step, lambda: list(layer.vars)

    def calls():
        rng = np.random.default_rng(0)
        return [(rng.standard_normal((4, 3)).astype(np.float32),) for _ in range(12)]

    step = same_as_eager(build, calls)
    assert step.replays >= (11 if take == "astype" else 1)


def test_a_single_number_drawn_from_nnkits_generator_runs_eagerly_saying_so():
    step, params = linear_gd(lambda layer, x: nn.Sum(layer(x)) * nn.backend.rng().uniform(1, 2))
    captured = nn.capture(step)
    with pytest.warns(UserWarning, match="draws a single number from nnkit's generator"):
        captured(np.ones((2, 3), np.float32))


# ------------------------------------------------------------------ how the inputs lie in memory

BASE = np.random.default_rng(0).standard_normal((16, 16, 16)).astype(np.float32)


def _permuted(perm):
    """BASE's values laid out in memory in the order ``perm`` (a sum follows the layout)."""
    return np.ascontiguousarray(BASE.transpose(perm)).transpose(np.argsort(perm))


def _unaligned(array):
    raw = np.empty(array.nbytes + 1, np.uint8)
    moved = raw[1:].view(array.dtype).reshape(array.shape)
    moved[...] = array
    return moved


LAYOUTS = {     # five calls' inputs: one layout, then another of the same shape and order flags
    "a node's F order": lambda i: nn.constant(np.asfortranarray(BASE[0] * (i + 1))
                                              if i >= 2 else BASE[0] * (i + 1)),
    "two layouts neither C nor F": lambda i: _permuted((1, 0, 2) if i < 2 else (0, 2, 1)) * 1,
    "negative strides": lambda i: (BASE * (i + 1))[:, :, ::-1],
    "gaps between elements": lambda i: (np.repeat(BASE, 2, axis=2) * (i + 1))[:, :, ::2],
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_an_input_laid_out_otherwise_is_another_signature_or_runs_eagerly(layout):
    def build():
        norm = nn.layers.LayerNorm(16)
        opt = nn.GD(norm.vars, lr=0.1)

        def step(x):
            loss = nn.Sum(norm(x if isinstance(x, nn.NetVar) else nn.constant(x)))
            loss.back()
            opt.step()
            return loss
        return step, lambda: list(norm.vars)

    same_as_eager(build, lambda: [(LAYOUTS[layout](i),) for i in range(5)])


def test_a_gradient_given_as_an_input_is_read_as_eager_reads_it():
    """W.g passed in (after an earlier call's back()): eager's back() adds into that very array,
    which the step reads afterwards."""
    held = []

    def build():
        layer = nn.layers.Linear(3, 2)
        held[:] = [layer]

        def step(x, g):
            loss = nn.Sum(layer(x) ** 2)
            loss.back()
            return loss + nn.Sum(nn.constant(g))
        return step, lambda: [layer.W.g]

    def calls():                # (made call by call: held[0] is this run's layer)
        x = np.ones((2, 3), np.float32)
        for i in range(6):
            yield x, np.zeros((3, 2), np.float32) if i < 3 else held[0].W.g
    same_as_eager(build, calls)


@pytest.mark.parametrize("node", [False, True])
def test_an_unaligned_input_is_another_signature(node):
    """A float32 view at an odd address: over 8,192 elements NumPy's sum of it differs in the
    last bits from an aligned copy's."""
    rows = [np.random.default_rng(i).standard_normal((40, 333)).astype(np.float32)
            for i in range(6)]

    def build():
        p = nn.NetVar(np.ones(3, np.float32))
        opt = nn.GD([p], lr=0.1)

        def step(x):
            loss = nn.Mean(x if node else nn.constant(x)) * nn.Sum(p * p)
            loss.back()
            opt.step()
            return loss
        return step, lambda: [p]

    def calls():
        for i, x in enumerate(rows):
            x = _unaligned(x) if i >= 2 else x.copy()
            yield (nn.constant(x) if node else x),
    same_as_eager(build, calls)


# ------------------------------------------------------------------ the optimizer's flat gradients

def _two_layers(loss_of, optimizer=nn.GD):
    """Linear(4, 6), tanh, Linear(6, 2) trained by ``optimizer`` on ``loss_of(model, *inputs)``:
    ``(step, observed)``, observed the parameters."""
    model = nn.Module()
    model.l1, model.l2 = nn.layers.Linear(4, 6), nn.layers.Linear(6, 2)
    opt = optimizer(model.vars, lr=0.1)

    def step(*inputs):
        loss = loss_of(model, *inputs)
        loss.back()
        opt.step()
        return loss
    return step, opt, model


def _rows(*sizes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n, 4)) for n in sizes]


@pytest.mark.parametrize("optimizer", [nn.GD, nn.Adam])
def test_a_gradient_the_signature_fixes_is_not_computed_into_the_optimizers_flat_array(
        optimizer):
    # the last bias's gradient under a Sum is the batch size: no replay computes it, yet from
    # the second replay on the program pointed it into the optimizer's flat gradient array,
    # which the other signature's replays and an eager step of the optimizer wrote: its
    # update used their batch size, silently
    def build():
        step, opt, model = _two_layers(lambda model, x: nn.Sum(model.l2(nn.Tanh(model.l1(x)))),
                                       optimizer)
        return step, lambda: list(model.vars)

    sizes = (5, 5, 5, 8, 8, 8, 5, 5)
    step = same_as_eager(build, lambda: [(x,) for x in _rows(*sizes)])
    assert step.replays >= 4, step

    def with_an_eager_step_between():
        step, opt, model = _two_layers(
            lambda model, x: nn.Sum(model.l2(nn.Tanh(model.l1(x)))), optimizer)
        eager_step = step

        def mixed(x):           # a batch of 8 runs the uncaptured step, of the same optimizer
            return eager_step(x) if len(x) == 8 else captured(x)
        captured = nn.capture(step) if with_an_eager_step_between.capturing else step
        with_an_eager_step_between.last = captured
        return mixed, lambda: list(model.vars)
    runs = []
    for capturing in (False, True):
        with_an_eager_step_between.capturing = capturing
        nn.seed(0)
        mixed, observed = with_an_eager_step_between()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for x in _rows(5, 5, 5, 8, 5, 5, seed=1):
                mixed(x)
        runs.append([p.data.copy() for p in observed()])
    assert all(np.array_equal(a, b) for a, b in zip(*runs))
    assert with_an_eager_step_between.last.replays >= 3, with_an_eager_step_between.last


def test_a_gradient_kept_across_two_steps_of_one_optimizer_is_not_overwritten():
    # both steps' gradients were computed into the same place of the optimizer's flat array
    # from the second replay on: the first, kept by the step, read as the second
    def loss_of(model, x, x2):
        nn.Sum(model.l2(nn.Tanh(model.l1(x))) ** 2).back()
        first = model.l1.W.g
        opts[-1].step()
        loss = nn.Sum(model.l2(nn.Tanh(model.l1(x2))) ** 2)
        loss.back()
        model.l1.W.g += 0.5 * first
        return loss
    opts = []

    def build():
        step, opt, model = _two_layers(loss_of)
        opts.append(opt)
        return step, lambda: list(model.vars)

    rows = _rows(*[5] * 12)
    step = same_as_eager(build, lambda: list(zip(rows[::2], rows[1::2])))
    assert step.replays >= 3, step


def test_a_shape_that_follows_the_data_after_the_optimizers_step_runs_eagerly():
    # a replay met the other shape after the optimizer had updated, and the call recorded
    # again: the whole step ran a second time, updating the parameters twice, silently
    def build():
        step, opt, model = _two_layers(lambda model, x, y: nn.MSELoss(
            model.l2(nn.Tanh(model.l1(x))), y))

        def with_a_metric(x, y, positive):
            loss = step(x, y)
            return loss, x[positive].mean()         # rows of label 1, after opt.step()
        return with_a_metric, lambda: list(model.vars)

    def calls():
        rng = np.random.default_rng(0)
        return [(rng.standard_normal((6, 4)), rng.standard_normal((6, 2)),
                 np.arange(6) < (2 if i < 4 else 3)) for i in range(6)]
    same_as_eager(build, calls)


@pytest.mark.parametrize("shaped", [lambda y: np.bincount(y), lambda y: np.repeat(y, y),
                                    lambda y: np.unique_counts(y).counts],
                         ids=["bincount", "repeat", "unique_counts"])
def test_more_shapes_that_follow_the_data_after_an_optimizers_step_run_eagerly(shaped):
    # recorded, a replay meeting another shape stopped the call with an error
    def build():
        step, opt, model = _two_layers(lambda model, x, y: nn.SoftmaxCELoss(
            model.l2(nn.Tanh(model.l1(x))), y))

        def counting(x, y):
            loss = step(x, y)
            return loss, shaped(y)
        return counting, lambda: list(model.vars)

    def calls():
        rng = np.random.default_rng(0)
        return [(rng.standard_normal((6, 4)), np.array([0, 1, 1, 0, 1, 0]) * (i < 3))
                for i in range(5)]
    same_as_eager(build, calls)


@pytest.mark.parametrize("shaped", [lambda y: np.repeat(y, 2), lambda y: y.repeat(2),
                                    lambda y: np.delete(y, 0)],
                         ids=["np.repeat", "repeat", "delete"])
def test_repeat_and_delete_by_a_number_after_an_optimizers_step_replay(shaped):
    # named among the functions whose shapes follow the data, they ran eagerly at every call
    def build():
        step, opt, model = _two_layers(lambda model, x, y: nn.SoftmaxCELoss(
            model.l2(nn.Tanh(model.l1(x))), y))
        return (lambda x, y: (step(x, y), shaped(y))), lambda: list(model.vars)

    def calls():
        rng = np.random.default_rng(0)
        return [(rng.standard_normal((6, 4)), rng.integers(0, 2, 6)) for _ in range(4)]
    assert same_as_eager(build, calls).replays == 3


def test_arrays_shaped_by_their_arguments_after_an_optimizers_step_replay():
    # a GAN's step (the discriminator's update, then the generator's through LReLU and
    # Sigmoid, whose np.where takes no out=) ran eagerly: only a shape that follows the data
    # is refused after an update
    def build():
        G = nn.layers.Sequential(nn.layers.Linear(4, 8), nn.LReLU, nn.layers.Linear(8, 3))
        D = nn.layers.Sequential(nn.layers.Linear(3, 8), nn.LReLU, nn.layers.Linear(8, 1),
                                 nn.Sigmoid)
        opt_d, opt_g = nn.Adam(D.vars, lr=0.01), nn.Adam(G.vars, lr=0.01)

        def step(z, real):
            fake = G(z)
            d_loss = (-(D(real) + 1e-6).log() - (1 - D(fake.detach()) + 1e-6).log()).mean()
            d_loss.back()
            opt_d.step()
            g_loss = (-(D(G(z)) + 1e-6).log()).mean()
            g_loss.back()
            opt_g.step()
            return d_loss, g_loss
        return step, lambda: list(G.vars) + list(D.vars)

    def calls():
        rng = np.random.default_rng(0)
        return [(rng.standard_normal((6, 4)), rng.standard_normal((6, 3))) for _ in range(6)]
    assert same_as_eager(build, calls).replays >= 4


def test_a_value_of_constants_read_after_an_optimizers_step_replays():
    # a second loss whose target the step makes (its range check reads the target's min and
    # max into Python) after the first optimizer's step: every call ran eagerly
    def build():
        A, B = nn.layers.Linear(4, 1), nn.layers.Linear(4, 1)
        opt_a, opt_b = nn.Adam(A.vars, lr=0.01), nn.Adam(B.vars, lr=0.01)

        def step(x):
            loss_a = nn.MSELoss(A(x), x[:, :1])
            loss_a.back()
            opt_a.step()
            loss_b = nn.SigmoidCELoss(B(x), np.ones((len(x), 1), np.float32))
            loss_b.back()
            opt_b.step()
            return loss_a, loss_b
        return step, lambda: list(A.vars) + list(B.vars)

    def calls():
        rng = np.random.default_rng(0)
        return [(rng.standard_normal((6, 4)).astype(np.float32),) for _ in range(5)]
    assert same_as_eager(build, calls).replays == 4


def test_gradients_accumulated_over_calls_replay_both_recordings_of_the_signature():
    # the optimizer's step outside the captured step resets the gradients every K calls: a
    # call without gradients at entry and one with them took turns replacing the signature's
    # one recording, so every call (K = 2) recorded again
    K = 3

    def run(captured):
        nn.seed(0)
        model = nn.layers.Sequential(nn.layers.Linear(6, 8), nn.ReLU, nn.layers.Linear(8, 3))
        opt = nn.Adam(model.vars, lr=0.02)

        def accumulate(x, y):
            loss = nn.SoftmaxCELoss(model(x), y) * (1 / K)
            loss.back()
            return loss
        step = nn.capture(accumulate) if captured else accumulate
        rng = np.random.default_rng(1)
        losses = []
        for i in range(5 * K):
            x, y = rng.standard_normal((4, 6)), rng.integers(0, 3, 4)
            losses.append(step(x, y).data.copy())
            if i % K == K - 1:
                opt.step()
        return step, losses, [p.data.copy() for p in model.vars]

    _, eager_losses, eager_params = run(False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step, losses, params = run(True)
    assert (step.records, step.replays) == (2, 5 * K - 2)
    for a, b in zip(eager_losses + eager_params, losses + params):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("loss_of", [
    lambda z, y: nn.SoftmaxCELoss(z, y, ignore_index=-1),             # Σ of the kept: an array
    lambda z, y: nn.SoftmaxCELoss(z, np.maximum(y, 0), weight=np.array([0.2, 1.0, 3.0])),
    lambda z, y: nn.SoftmaxCELoss(z, np.maximum(y, 0)),                # rows: a number
], ids=["ignored", "class-weights", "rows"])
def test_a_loss_a_replay_hands_out_keeps_what_it_divided_by_for_the_trainer(loss_of):
    # the replay handed out a constant: Trainer.evaluate weighed each batch by its rows, not
    # by what the loss divided by (another validation loss, silently)
    rng = np.random.default_rng(0)
    batches = []
    for ignored in (4, 12, 7, 0):
        y = rng.integers(0, 3, 16)
        y[:ignored] = -1
        batches.append((rng.standard_normal((16, 6)), y))
    nn.seed(0)
    model = nn.layers.Sequential(nn.layers.Linear(6, 8), nn.Tanh, nn.layers.Linear(8, 3))

    def step(x, y):
        return loss_of(model(x), y)
    captured = nn.capture(step)
    opt = nn.GD(model.vars, lr=0.0)
    eager = nn.Trainer(lambda batch: step(*batch), opt).evaluate(batches)
    replayed = nn.Trainer(lambda batch: captured(*batch), opt).evaluate(batches)
    assert captured.replays == 3 and replayed == eager
    loss = captured(*batches[0])
    assert float(np.asarray(loss.denominator)) == float(np.asarray(step(*batches[0]).denominator))


def test_a_method_of_nnkits_own_replaced_on_a_layers_class_records_again():
    # a user's subclass of an nnkit layer given another _drop between calls (the method its
    # nnkit forward calls, whose code capture does not read): every replay kept the old one
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((5, 4, 8)).astype(np.float32) for _ in range(6)]
    runs = []
    for captured in (False, True):
        class Halved(nn.layers.TransformerEncoderLayer):
            pass
        nn.seed(0)
        encoder = Halved(8, 2, 16)
        opt = nn.GD(encoder.vars, lr=0.01)

        def step(x):
            loss = nn.Sum(encoder(x) ** 2)
            loss.back()
            opt.step()
            return loss
        step = nn.capture(step) if captured else step
        losses = []
        for i, x in enumerate(inputs):
            if i == 3:
                Halved._drop = lambda self, v: v * 0.5
            losses.append(step(x).data.copy())
        runs.append(losses + [p.data.copy() for p in encoder.vars])
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
    assert (step.records, step.replays) == (2, 4)


def test_an_override_calling_a_captured_method_of_its_base_replays():
    # the base's capture, bound to the object while the override recorded, was taken for an
    # attribute the step changed: the override ran eagerly for good
    class Halving(_Learner):     # (below: its step is captured)
        @nn.capture
        def step(self, x):
            return super().step(x * 0.5)

    rng = np.random.default_rng(0)
    nn.seed(0)
    learner = Halving()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(5):
            learner.step(rng.standard_normal((5, 4)).astype(np.float32))
    assert Halving.step.__get__(learner).replays == 4


@pytest.mark.parametrize("mean", ["array", "node"])
def test_a_float16_mean_replays(mean):
    # NumPy's float16 mean ends in a conversion of its own, which capture did not record: every
    # float16 step with a mean (of an array, nn.Mean, BatchNorm, mean_over_time) ran eagerly
    def build():
        w = nn.NetVar(np.linspace(-1, 1, 8, dtype=np.float16).reshape(1, 8))
        opt = nn.GD([w], lr=0.01)

        def step(x):
            loss = nn.Sum((x * w) ** 2) if mean == "array" else nn.Mean((x * w) ** 2)
            loss.back()
            spread = w.g.mean(axis=0, keepdims=True) if mean == "array" else loss
            opt.step()
            return loss, spread
        return step, lambda: [w]

    def calls():
        rng = np.random.default_rng(0)
        return [(rng.standard_normal((4, 8)).astype(np.float16),) for _ in range(4)]
    assert same_as_eager(build, calls).replays == 3


def test_a_replay_stopped_after_the_optimizers_step_raises_instead_of_stepping_twice(
        monkeypatch):
    # the net under the refusal above: a replay that meets another shape after the update
    # keeps the update and raises, where recording again stepped a second time
    from nnkit.replay import record
    monkeypatch.setattr(record, "_shape_may_follow", lambda function, args: False)
    runs = []
    for captured in (False, True):
        nn.seed(0)
        step, opt, model = _two_layers(lambda model, x: nn.Sum(model.l2(model.l1(x))))

        def with_a_metric(x, positive):
            loss = step(x)
            return loss, x[positive].mean()
        if captured:
            with_a_metric = nn.capture(with_a_metric)
        rng = np.random.default_rng(0)
        for i in range(4):
            x, positive = rng.standard_normal((6, 4)), np.arange(6) < (2 if i < 3 else 3)
            if captured and i == 3:
                with pytest.raises(RuntimeError, match=r"capture: a replay stopped \(__getitem__ "
                                   r"returned shape \(3, 4\), not \(2, 4\)\) after the step had "
                                   r"changed what lasts"):
                    with_a_metric(x, positive)
            else:
                with_a_metric(x, positive)
        runs.append([p.data.copy() for p in model.vars])
    assert with_a_metric.replays == 2, with_a_metric
    assert all(np.array_equal(a, b) for a, b in zip(*runs))


def test_a_call_check_true_refuses_leaves_the_state_it_found():
    # the AssertionError left the parameters and the optimizer's state as the replay had made
    # them: neither the state before the call nor eager's after it
    def build():
        nn.seed(0)
        noise = np.random.default_rng(1)         # a generator of the step's own: unseen
        step, opt, model = _two_layers(lambda model, x: nn.Sum(
            model.l2(model.l1(x + noise.standard_normal(x.shape)))), nn.Adam)
        return step, opt, model

    first, second = _rows(5, 5)
    step, opt, model = build()
    step(first)
    expected = [p.data.copy() for p in model.vars], [dict(s) for s in opt.state]
    step, opt, model = build()
    step = nn.capture(step, check=True)
    step(first)
    with pytest.raises(AssertionError, match="the replay differs from eager"):
        step(second)
    assert all(np.array_equal(a, p.data) for a, p in zip(expected[0], model.vars))
    for was, now in zip(expected[1], opt.state):
        assert was.keys() == now.keys() and all(
            np.array_equal(was[key], now[key]) for key in was)


def test_a_modifier_of_a_users_own_replays_with_its_settings_read_live():
    # the gradients the optimizer hands a modifier were guarded as arrays the step reads: each
    # replay's differed from the recording's, so every other call recorded again
    class Scale:
        def __init__(self, s):
            self.s = s

        def modify_gradients(self, params, grads):
            return [g * self.s for g in grads]

    modifiers = []

    def build():
        step, opt, model = _two_layers(lambda model, x: nn.Sum(model.l2(model.l1(x)) ** 2),
                                       nn.Adam)
        modifiers.append(opt.add_modifier(Scale(0.5)))
        return step, lambda: list(model.vars)
    runs = []
    for captured in (False, True):
        nn.seed(0)
        step, observed = build()
        if captured:
            step = nn.capture(step)
        for i, x in enumerate(_rows(*[5] * 10)):
            if i == 5:
                modifiers[-1].s = 2.0
            step(x)
        runs.append([p.data.copy() for p in observed()])
    assert all(np.array_equal(a, b) for a, b in zip(*runs))
    assert (step.records, step.replays) == (2, 8), step     # (again when its setting changed)


def test_an_empty_batch_replays_as_eager():
    # NumPy's view of an empty input shares no memory with it, so the view read as a new array
    # written into the input: the step ran eagerly, saying it wrote into its input
    def build():
        step, opt, model = _two_layers(lambda model, x: nn.Sum(model.l2(model.l1(x))), nn.Adam)
        return step, lambda: list(model.vars)
    step = same_as_eager(build, lambda: [(np.empty((0, 4)),)] * 4)
    assert step.replays == 3, step


@pytest.mark.parametrize("modifier", [lambda: nn.ClipValue(0.001), lambda: nn.L2Decay(0.1)],
                         ids=["ClipValue", "L2Decay"])
def test_a_gradient_read_after_the_optimizers_step_is_the_one_back_made(modifier):
    # computed into the optimizer's flat array, the gradient was overwritten there by the
    # modifier's new one, which the step then read after the update: silently the clipped one
    runs = []
    for captured in (False, True):
        nn.seed(0)
        model = nn.Module()
        model.l1, model.l2 = nn.layers.Linear(4, 6), nn.layers.Linear(6, 2)
        opt = nn.Adam(model.vars, lr=0.1)
        opt.add_modifier(modifier())

        def step(x):
            nn.Sum(model.l2(model.l1(x)) ** 2).back()
            kept = model.l2.b.g
            opt.step()
            return kept * 1.0
        call = nn.capture(step) if captured else step
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            runs.append([np.array(call(x).data) for x in _rows(*[5] * 6)]
                        + [p.data.copy() for p in model.vars])
    assert all(np.array_equal(a, b) for a, b in zip(*runs))
    assert call.replays >= 4, call


def test_a_method_captured_with_the_decorator_captures_each_objects_own_step():
    # Captured was no descriptor: obj.step(x) called the function without its object
    class Learner(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.layers.Linear(4, 2)
            self.opt = nn.Adam(self.layer.vars, lr=0.1)

        def step(self, x):
            loss = nn.Sum(self.layer(x) ** 2)
            loss.back()
            self.opt.step()
            return loss

    class Captured(Learner):
        step = nn.capture(Learner.step)

    class AssignedLater(Learner):
        pass
    AssignedLater.step = nn.capture(Learner.step)

    runs = []
    for kind in (Learner, Captured, AssignedLater):
        nn.seed(0)
        learners = [kind(), kind()]
        losses = [learners[i % 2].step(x).data for i, x in enumerate(_rows(*[5] * 8))]
        runs.append(losses + [p.data for learner in learners for p in learner.vars])
        if kind is not Learner:
            assert [learner.step.replays for learner in learners] == [3, 3]
            assert learners[0].step is learners[0].step         # one capture per object
    for run in runs[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(runs[0], run))


def test_a_method_captured_on_an_object_without_dict_says_what_to_capture():
    class Slotted:
        __slots__ = ()

        @nn.capture
        def step(self, x):
            return x

    with pytest.raises(TypeError, match=r"capture: .*Slotted.step is captured as a method of "
                                        r"an object without __dict__ \(Slotted\); capture the "
                                        r"bound method instead: self.step = "
                                        r"nn.capture\(self.step\)"):
        Slotted().step(np.ones(2))


class _Learner(nn.Module):
    """A Module with a captured method (at module level: pickled by name)."""

    def __init__(self):
        super().__init__()
        self.layer = nn.layers.Linear(4, 2)
        self.opt = nn.GD(self.layer.vars, lr=0.1)

    @nn.capture
    def step(self, x):
        loss = nn.Sum(self.layer(x) ** 2)
        loss.back()
        self.opt.step()
        return loss

    alias = step


class _Halving(_Learner):
    def step(self, x):
        return super().step(x * 0.5)


def test_captured_methods_keep_overrides_aliases_copies_and_class_methods_apart():
    # each object kept its capture under the method's name, where it hid an override that
    # calls super(), made an alias record at every call, and came back from a pickle as a
    # capture of a capture; a class method met no name and raised StopIteration
    import copy
    import pickle
    Base, Halving = _Learner, _Halving
    runs = []
    for halve in (False, True):
        nn.seed(0)
        plain = Base()
        nn.seed(0)
        captured = Halving()
        for x in _rows(*[5] * 6):
            if halve:
                captured.step(x)
            else:
                plain.step.__wrapped__(x * 0.5)
        runs.append([p.data.copy() for p in (captured if halve else plain).vars])
    assert all(np.array_equal(a, b) for a, b in zip(*runs))
    assert Base.step.__get__(captured).replays == 5

    nn.seed(0)
    learner = Base()
    for x in _rows(*[5] * 4):
        learner.alias(x)
    assert learner.alias is learner.step and learner.step.replays == 3
    for copied in (copy.deepcopy(learner), pickle.loads(pickle.dumps(learner))):
        for x in _rows(*[5] * 3):
            copied.step(x)
        assert copied.step.fn.__self__ is copied and copied.step.replays == 2
        assert all(not np.array_equal(a.data, b.data) for a, b in zip(copied.vars, learner.vars))

    shallow = copy.copy(learner)            # (its __dict__ holds the original's capture)
    nn.seed(1)
    shallow.layer = nn.layers.Linear(4, 2)
    shallow.opt = nn.GD(shallow.layer.vars, lr=0.1)
    kept = [p.data.copy() for p in learner.vars]
    shallow.step(_rows(5)[0])
    assert all(np.array_equal(a, p.data) for a, p in zip(kept, learner.vars))
    assert shallow.step.fn.__self__ is shallow

    class Twin(Base):
        @nn.capture
        def step(self, x):
            return super().step(x * 0.5)
    # (a subclass of its base's very name, in another module or a notebook: the two captures
    # were one, and super() ran the override's again, without end)
    vars(Twin)["step"].fn.__qualname__ = vars(Base)["step"].fn.__qualname__
    results = []
    for kind in (Halving, Twin):
        nn.seed(0)
        learner_of_kind = kind()
        for x in _rows(*[5] * 3):
            learner_of_kind.step(x)
        results.append([p.data.copy() for p in learner_of_kind.vars])
    assert all(np.array_equal(a, b) for a, b in zip(*results))

    class Static:
        @nn.capture
        @staticmethod
        def doubled(x):
            return nn.Sum(nn.NetVar(x, requires_grad=False)) * 2.0

        @nn.capture
        @staticmethod
        def counted(x):                 # a generator: eager, through the class too
            x += 1
            yield x.sum()
    assert float(Static().doubled(_rows(5)[0]).data) == float(_rows(5)[0].sum() * 2.0)
    x = np.zeros(3)
    seen = [float(next(Static.counted(x))) for _ in range(3)]
    assert seen == [3.0, 6.0, 9.0] and np.array_equal(x, [3.0, 3.0, 3.0])

    class Counting:
        calls = 0

        @classmethod
        @nn.capture
        def scaled(cls, x):
            return nn.Sum(nn.NetVar(x, requires_grad=False)) * 2.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        values = [Counting.scaled(x).data for x in _rows(5, 5, 5)]
    assert [float(v) for v in values] == [float(x.sum() * 2.0) for x in _rows(5, 5, 5)]


def test_a_generator_function_runs_eagerly_on_the_callers_arrays():
    # its body runs as it is iterated: the generator of the recording call read the copy of
    # the input the recording had made, not the caller's array refilled before iterating
    runs = []
    for captured in (False, True):
        nn.seed(0)
        layer = nn.layers.Linear(4, 2)
        opt = nn.Adam(layer.vars, lr=0.1)

        def steps(x):
            for _ in range(2):
                loss = nn.Sum(layer(x) ** 2)
                loss.back()
                opt.step()
                yield loss.data.copy()
        call = nn.capture(steps) if captured else steps
        batch, seen = np.empty((5, 4)), []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for rows, refilled in zip(_rows(5, 5, 5), _rows(5, 5, 5, seed=1)):
                batch[...] = rows
                losses = call(batch)
                batch[...] = refilled           # a loader refilling its buffer
                seen += list(losses)
        runs.append(seen + [p.data.copy() for p in layer.vars])
    assert all(np.array_equal(a, b) for a, b in zip(*runs))
    assert "generator" in str(caught[0].message)
