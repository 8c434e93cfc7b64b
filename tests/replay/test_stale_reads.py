"""Never stale, continued: what a step reads through the ways Python keeps settings (a module, a
class, a property, slots, an object in a list, a helper several calls deep, an array in a dict),
the state around a replay (a parameter frozen or unfrozen, a node input's gradient, an input
that is a parameter's data, a gradient written by hand) and a replay that raises midway.

Each test runs a scenario eagerly and captured from the same seed and compares every loss,
parameter and gradient bit for bit; it also checks that the captured run replayed (a test that
never replays would pass by running eagerly).
"""
import types
import warnings

import numpy as np
import pytest

import nnkit as nn

rng = np.random.default_rng(1)
BATCHES = [(rng.standard_normal((5, 4)), rng.integers(0, 3, 5)) for _ in range(8)]


def training_step(forward, opt, captured=False):
    """The step every test here captures: softmax cross-entropy of ``forward(x)``, back(),
    the optimizer's step; captured with ``captured``."""
    def step(x, y):
        loss = nn.SoftmaxCELoss(forward(x), y)
        loss.back()
        opt.step()
        return loss
    return nn.capture(step) if captured else step


def scenario(captured, scale, change, n=8, optimizer=nn.GD, check=False):
    """A Linear(4, 3) trained on BATCHES[:n], the logits passed through ``scale``;
    ``change(i, layer, opt)`` runs before call i. Returns (losses, params, grads, step)."""
    nn.seed(0)
    layer = nn.layers.Linear(4, 3)
    opt = optimizer(layer.vars, lr=0.1)

    step = training_step(lambda x: scale(layer(x)), opt)
    if captured:
        step = nn.capture(step, check=check)
    losses = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, (x, y) in enumerate(BATCHES[:n]):
            change(i, layer, opt)
            losses.append(np.array(step(x, y).data))
    return losses, [p.data.copy() for p in layer.vars], [np.array(p.g) for p in layer.vars], step


def same_as_eager(scale, change, min_replays=2, **options):
    eager = scenario(False, scale, change, **options)
    captured = scenario(True, scale, change, **options)
    for what, a, b in zip(("loss", "parameter", "gradient"), eager[:3], captured[:3]):
        for k, (u, v) in enumerate(zip(a, b)):
            assert np.array_equal(u, v), f"{what} {k} differs from eager ({captured[3]})"
    assert captured[3].replays >= min_replays, captured[3]
    return captured[3]


# ------------------------------------------------------------------ where settings are kept

settings_module = types.ModuleType("settings_module")       # as `import settings_module`
settings_module.T = 1.0


class Settings:
    T = 1.0                     # a class attribute


class Instance:                 # an instance reading its class's attribute
    T = 1.0


class WithProperty:
    def __init__(self):
        self._T = 1.0

    @property
    def T(self):
        return self._T


class WithSlots:
    __slots__ = ("T",)

    def __init__(self):
        self.T = 1.0


class Plain:
    pass


instance, with_property, with_slots, in_list = Instance(), WithProperty(), WithSlots(), Plain()
LISTED = [in_list]
DEEP = 1.0


def deep6(z):
    return z / DEEP


def deep5(z):
    return deep6(z)


def deep4(z):
    return deep5(z)


def deep3(z):
    return deep4(z)


def deep2(z):
    return deep3(z)


def deep1(z):
    return deep2(z)


def _set_global(name):
    def set_(value):
        globals()[name] = value
    return set_


HOLDERS = {
    "a module's attribute": (lambda z: z / settings_module.T,
                             lambda v: setattr(settings_module, "T", v)),
    "a class attribute": (lambda z: z / Settings.T, lambda v: setattr(Settings, "T", v)),
    "a class attribute read from an instance": (lambda z: z / instance.T,
                                                lambda v: setattr(Instance, "T", v)),
    "a property": (lambda z: z / with_property.T, lambda v: setattr(with_property, "_T", v)),
    "a slot": (lambda z: z / with_slots.T, lambda v: setattr(with_slots, "T", v)),
    "an object in a list": (lambda z: z / LISTED[0].T, lambda v: setattr(in_list, "T", v)),
    "a global six calls deep": (deep1, _set_global("DEEP")),
}


@pytest.mark.parametrize("holder", list(HOLDERS))
def test_a_number_read_through_a_settings_holder_records_again_when_it_changes(holder):
    # guard: world.py reads the attributes the step's code names on modules, classes, slots,
    # properties' code and objects inside lists, and follows calls without a depth limit
    scale, set_ = HOLDERS[holder]
    set_(1.0)
    in_list.T = 1.0
    try:
        step = same_as_eager(scale, lambda i, layer, opt: set_(1.0 + i // 3))
    finally:
        set_(1.0)
    assert step.records == 3, step


CONFIG = {"weight": np.ones((1, 3))}
PAIR = (np.ones((1, 3)), 0)
ROWS = [np.ones((1, 3))]


@pytest.mark.parametrize("where", ["dict", "tuple", "list"])
def test_an_array_in_a_container_the_step_reads_edited_in_place_records_again(where):
    # guard: an array kept in a list, tuple or dict is compared by contents, as a bare one
    read = {"dict": lambda: CONFIG["weight"], "tuple": lambda: PAIR[0],
            "list": lambda: ROWS[0]}[where]
    scale = {"dict": lambda z: z * CONFIG["weight"], "tuple": lambda z: z * PAIR[0],
             "list": lambda z: z * ROWS[0]}[where]
    read()[...] = 1.0

    def change(i, layer, opt):
        read()[0, 1] = 1.0 if i < 3 else 3.0
    try:
        step = same_as_eager(scale, change)
    finally:
        read()[...] = 1.0
    assert step.records == 2, step


ZERO = 0.0
ZEROS = {"shift": 0.0}
ZERO_ARRAY = np.zeros(1)


def _sign(value):
    return 2.0 if np.copysign(1.0, value) < 0 else 1.0


@pytest.mark.parametrize("where", ["a global", "a dict of numbers", "an array"])
def test_negative_zero_is_another_number_than_zero(where):
    # guard: numbers and arrays are compared bit for bit (== takes -0.0 for 0.0)
    scale = {"a global": lambda z: z * _sign(ZERO),
             "a dict of numbers": lambda z: z * _sign(ZEROS["shift"]),
             "an array": lambda z: z * _sign(ZERO_ARRAY[0])}[where]

    def change(i, layer, opt):
        global ZERO
        ZERO = ZEROS["shift"] = ZERO_ARRAY[0] = -0.0 if i >= 3 else 0.0
    try:
        step = same_as_eager(scale, change)
    finally:
        change(0, None, None)
    assert step.records == 2, step


def test_negative_zero_as_an_input_is_another_signature():
    nn.seed(0)
    layer = nn.layers.Linear(4, 3)

    def predict(x, shift):
        return nn.Softmax(layer(x) * (2.0 if np.copysign(1.0, shift) < 0 else 1.0))
    captured = nn.capture(predict)
    x = BATCHES[0][0]
    for shift in (0.0, 0.0, -0.0, -0.0, 0.0):
        assert np.array_equal(captured(x, shift).data, predict(x, shift).data), shift
    assert len(captured.schedules) == 2 and captured.replays == 3, captured


# ------------------------------------------------------------------ the state around a step

def test_a_parameter_frozen_or_unfrozen_between_calls_records_again():
    # guard: each parameter's requires_grad is the recording's (Schedule.stale)
    def freeze(i, layer, opt):
        layer.b.requires_grad = i < 3

    def unfreeze(i, layer, opt):
        layer.b.requires_grad = i >= 3
    for change in (freeze, unfreeze):
        step = same_as_eager(lambda z: z, change)
        assert step.records == 2, step


def test_a_gradient_written_by_hand_before_each_call_replays_without_a_false_alarm():
    # the check against eager saves the gradients' values, not the arrays eager adds into
    def change(i, layer, opt):
        layer.W.g[...] = 0.01 * i       # in place, into the array the last step left
    for check in (False, True):
        step = same_as_eager(lambda z: z, change, check=check, min_replays=6)
        assert step.records == 1, step


def test_a_node_inputs_gradient_adds_up_over_calls_as_eager():
    # guard: a node input's gradient at entry is handed in at each replay (not the recording's)
    results = []
    for captured in (False, True):
        nn.seed(0)
        layer = nn.layers.Linear(4, 3)
        opt = nn.GD(layer.vars, lr=0.1)

        step = training_step(layer, opt, captured)
        a = nn.NetVar(BATCHES[0][0])
        for _, y in BATCHES:
            step(a, y)
        results.append((np.array(a.g), layer.W.data.copy(), step))
    assert np.array_equal(results[0][0], results[1][0])
    assert np.array_equal(results[0][1], results[1][1])
    assert results[1][2].replays >= 4, results[1][2]


NOISE = np.random.default_rng(5)       # a generator of the step's own


def test_a_node_inputs_gradient_is_compared_by_check_true():
    nn.seed(0)
    layer = nn.layers.Linear(4, 3)

    def step(x, y):
        loss = nn.SoftmaxCELoss(layer(x), y)
        loss.back()
        x.g[...] += NOISE.standard_normal(x.shape)      # draws capture cannot see
        return loss
    captured = nn.capture(step, check=True)
    a = nn.NetVar(BATCHES[0][0])
    captured(a, BATCHES[0][1])
    captured(a, BATCHES[1][1])
    with pytest.raises(AssertionError, match="gradient of input 0"):
        captured(a, BATCHES[2][1])


@pytest.mark.parametrize("first_aliased", [0, 3])
def test_an_input_that_is_a_parameters_data_runs_eagerly(first_aliased):
    # the step reads the parameter's memory through its input, after the optimizer updates it:
    # a copy of the input would be stale, so such a call is not recorded (from the first call,
    # or from a later one, which a replay would hand a copy of)
    results = []
    for captured in (False, True):
        nn.seed(0)
        l1, l2 = nn.layers.Linear(4, 4), nn.layers.Linear(4, 3)
        opt = nn.GD(l1.vars + l2.vars, lr=0.1)

        def step(x, y):
            loss = nn.SoftmaxCELoss(l2(l1(BATCHES[0][0])), y)
            loss.back()
            opt.step()
            return loss + nn.Sum(nn.NetVar(x, requires_grad=False))
        if captured:
            step = nn.capture(step)
        losses = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i, (_, y) in enumerate(BATCHES[:6]):
                x = l1.W.data if i >= first_aliased else l1.W.data.copy()
                losses.append(np.array(step(x, y).data))
        results.append((losses, l1.W.data.copy(), caught))
    assert all(np.array_equal(a, b) for a, b in zip(results[0][0], results[1][0]))
    assert np.array_equal(results[0][1], results[1][1])
    assert any("parameter" in str(w.message) for w in results[1][2])


# ------------------------------------------------------------------ a replay that raises

def bn_scenario(captured, bad_call, how):
    nn.seed(0)
    l1, bn, l2 = nn.layers.Linear(4, 6), nn.layers.BatchNorm(6), nn.layers.Linear(6, 3)
    opt = nn.Adam(l1.vars + bn.vars + l2.vars, lr=0.05)

    step = training_step(lambda x: l2(nn.Tanh(bn(l1(x)))), opt, captured)
    raised = 0
    for i, (x, y) in enumerate(BATCHES):
        if i == bad_call and how == "optimizer":
            opt.lr = -1.0
        if i == bad_call and how == "labels":
            y = np.array([0, 1, 2, 7, 0])
        try:
            step(x, y)
        except (ValueError, IndexError):
            raised += 1
        opt.lr = 0.05
    state = [bn.stats.running_mean.copy(), bn.stats.running_var.copy(),
             np.array(bn.stats.num_batches_tracked)]
    return state + [p.data.copy() for p in opt.params] + [np.array(p.g) for p in opt.params], \
        raised, step


@pytest.mark.parametrize("how", ["optimizer", "labels"])
def test_a_replay_that_raises_midway_leaves_what_eager_leaves(how):
    # what the replay computed before the error is handed out (running statistics, counters,
    # gradients), what comes after it is not, as eager
    eager, raised, _ = bn_scenario(False, 4, how)
    state, raised_captured, step = bn_scenario(True, 4, how)
    assert raised == raised_captured == 1
    for k, (a, b) in enumerate(zip(eager, state)):
        assert np.array_equal(a, b), f"state {k} differs ({step})"
    assert step.replays >= 4, step       # (after the error the gradients are there: it records)


@pytest.mark.parametrize("what", ["running statistics", "a node input's gradient"])
def test_a_replay_that_raises_between_two_updates_hands_out_the_first(what):
    # BatchNorm rebinds its statistics at each update, and each back() a node input's
    # gradient: a replay raising between two updates handed out neither (nor the counter's
    # first step), where eager keeps the first
    def scenario(captured):
        nn.seed(0)
        model = nn.layers.Sequential(nn.layers.Linear(4, 6), nn.layers.BatchNorm(6),
                                     nn.layers.Linear(6, 3))
        opt = nn.GD(model.vars, lr=0.1)

        def step(x, y):
            loss = nn.SoftmaxCELoss(model(x), y)
            loss.back()
            opt.step()
            with np.errstate(over="raise"):
                probe = x.data.astype(np.float64) * 1e308      # overflows where |x| > 1.8
            after = nn.Sum(model(x * (probe * 0.0 + 1.0).astype(np.float32)))
            if what == "a node input's gradient":
                after.back()
                opt.reset()
            return loss
        if captured:
            step = nn.capture(step)
        seen = []
        for i, (rows, y) in enumerate(BATCHES):
            rows = np.clip(rows, -1, 1).astype(np.float32)
            if i == 4:
                rows[0, 0] = 10.0
            x = nn.NetVar(rows)
            try:
                step(x, y)
                seen.append("no error")
            except FloatingPointError:
                seen.append("overflow")
            stats = model[1].stats
            seen += [stats.running_mean.copy(), stats.running_var.copy(),
                     stats.num_batches_tracked, np.array(x.g) if x._g is not None else None]
        return seen + [p.data for p in model.vars], step
    eager, _ = scenario(False)
    captured, step = scenario(True)
    assert any(isinstance(value, str) and value == "overflow" for value in eager)
    for k, (a, b) in enumerate(zip(eager, captured)):
        assert (a is None and b is None) or np.array_equal(a, b), f"{k} differs ({step})"
    assert step.replays >= 4, step


def _two_optimizers(lin, lin2, opt, opt2, x, y):
    nn.SoftmaxCELoss(lin(x), y).back()
    opt.step()
    loss = nn.Sum(lin2(x) ** 2)
    loss.back()
    opt2.step()
    return loss


def _errstate_around_the_step(lin, lin2, opt, opt2, x, y):
    loss = nn.SoftmaxCELoss(lin(x), y)
    loss.back()
    with np.errstate(over="raise"):     # an update whose g·g overflows raises
        opt.step()
    return loss


@pytest.mark.parametrize("step_of, how", [
    (_two_optimizers, "the first refuses"),
    (_errstate_around_the_step, "overflow"),
    (_errstate_around_the_step, "overflow, errstate set outside the step too")])
def test_an_optimizer_step_that_raises_at_a_replay_leaves_what_eager_leaves(step_of, how):
    # an update raising under the step's own errstate stepped twice (the recording had not
    # seen it as the optimizer's step); an optimizer raising after it reset its gradients
    # left them to the next call; the second optimizer's gradients, computed into its flat
    # array, were handed out from the last call where eager left none
    def scenario(captured):
        nn.seed(0)
        lin, lin2 = nn.layers.Linear(4, 3), nn.layers.Linear(4, 3)
        opt, opt2 = nn.Adam(lin.vars, lr=0.1), nn.GD(lin2.vars, lr=0.1)
        step = (lambda x, y: step_of(lin, lin2, opt, opt2, x, y))
        if captured:
            step = nn.capture(step)
        seen = []
        with warnings.catch_warnings(), np.errstate(
                over="raise" if "outside" in how else "warn"):
            warnings.simplefilter("ignore")
            for i, (x, y) in enumerate(BATCHES):
                x = x.astype(np.float32) * (np.float32(1e20) if i == 4 and "overflow" in how
                                            else 1)
                opt.lr = -0.1 if i == 4 and "refuses" in how else 0.1
                try:
                    step(x, y)
                    seen.append("no error")
                except (ValueError, FloatingPointError) as error:
                    seen.append(type(error).__name__)
                seen += [None if p._g is None else p._g.copy() for p in lin.vars + lin2.vars]
                seen += [value for state in opt.state for value in state.values()]
        return seen + [p.data for p in lin.vars + lin2.vars], step
    eager, _ = scenario(False)
    captured, step = scenario(True)
    for k, (a, b) in enumerate(zip(eager, captured)):
        assert (a is None and b is None) or np.array_equal(a, b), f"{k} differs ({step})"
    assert step.replays >= 4, step


TEMPERATURE = 1.0


def sequential_with(entry, change):
    """A Sequential of a Linear(4, 3) and ``entry`` trained eagerly and captured over BATCHES,
    ``change(i)`` before call i (and ``change(0)`` after): the captured step, checked to give
    eager's losses."""
    def scenario(captured):
        nn.seed(0)
        model = nn.layers.Sequential(nn.layers.Linear(4, 3), entry)
        step = training_step(model, nn.GD(model.vars, lr=0.1), captured)
        losses = []
        for i, (x, y) in enumerate(BATCHES):
            change(i)
            losses.append(np.array(step(x, y).data))
        return losses, step
    try:
        eager, _ = scenario(False)
        losses, step = scenario(True)
    finally:
        change(0)
    assert all(np.array_equal(a, b) for a, b in zip(eager, losses))
    return step


def test_a_global_read_by_a_lambda_inside_a_sequential_records_again_when_it_changes():
    # guard: the functions a Module keeps are read as the step's code (world.py)
    def change(i):
        globals()["TEMPERATURE"] = 1.0 + i // 3
    step = sequential_with(lambda z: z / TEMPERATURE, change)
    assert step.records == 3 and step.replays >= 4, step
