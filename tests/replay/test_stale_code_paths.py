"""Never stale, through the code a step runs: settings reached through a Module's own methods
and attributes, objects handed to helpers, callable objects, partials and cached or wrapped
functions, dynamic lookups, nested and odd containers, module names that begin like a
library's; and the inputs and optimizers around a step (a parameter or one node given as an
input, an optimizer kept on the model, a learning rate given as a NumPy number).

Scenarios as in test_stale_reads.py: eager and captured from the same seed, every loss,
parameter and gradient compared bit for bit, and the captured run must have replayed.
"""
import collections.abc
import dataclasses
import functools
import sys
import types
import warnings

import numpy as np
import pytest

import nnkit as nn

from .test_stale_reads import BATCHES, same_as_eager, sequential_with, training_step


def changing(holder, name, first=1.0, then=3.0):
    """``change`` setting ``holder``'s ``name`` (an attribute, or an item of a mapping or an
    array) to ``first`` before call 3 and ``then`` from call 3 on."""
    def change(i, layer=None, opt=None):
        value = first if i < 3 else then
        if isinstance(holder, (collections.abc.MutableMapping, np.ndarray)):
            holder[name] = value
        else:
            setattr(holder, name, value)
    return change


class Config:
    pass


def gd_step(loss_of, captured, outputs=3):
    """A seeded Linear(4, outputs), GD over it, and the step ``loss_of(layer, opt, *inputs)``,
    back(), the optimizer's step (captured with ``captured``)."""
    nn.seed(0)
    layer = nn.layers.Linear(4, outputs)
    opt = nn.GD(layer.vars, lr=0.1)

    def step(*inputs):
        loss = loss_of(layer, opt, *inputs)
        loss.back()
        opt.step()
        return loss
    return layer, opt, nn.capture(step) if captured else step


def alike(scenario, reset):
    """``scenario(captured)`` -> (losses, step), run eagerly and captured (``reset()`` after,
    whatever happens): the same losses, bit for bit. Returns the captured step."""
    try:
        eager, _ = scenario(False)
        losses, step = scenario(True)
    finally:
        reset()
    assert all(np.array_equal(a, b) for a, b in zip(eager, losses))
    return step


def records_again_when_changed(scale, change):
    """The scenario (``same_as_eager``) gives eager's bits, recording once more: at the change
    ``change`` makes from call 3 on."""
    try:
        step = same_as_eager(scale, change)
    finally:
        change(0)
    assert step.records == 2, step


# ------------------------------------------------------------------ code met as the step runs

class Tempered(nn.Module):
    """A Module whose forward calls a method of its own that reads a global, and reads an
    object and an array kept as attributes."""
    def __init__(self):
        self.inner = nn.layers.Linear(4, 3)
        self.cfg = Config()
        self.cfg.temperature = 1.0
        self.weights = np.ones((1, 3))

    def forward(self, x):
        return self.post(self.inner(x)) / self.cfg.temperature * (self.weights / 2).sum()

    def post(self, z):
        return z * MODULE_GAIN


MODULE_GAIN = 1.0


def module_scenario(captured, change):
    nn.seed(0)
    model = Tempered()
    opt = nn.GD(model.vars, lr=0.1)
    step = training_step(model, opt, captured)
    losses = []
    for i, (x, y) in enumerate(BATCHES):
        change(i, model)
        losses.append(np.array(step(x, y).data))
    return losses, [p.data.copy() for p in model.vars], step


def _set_gain(i, model):
    globals()["MODULE_GAIN"] = 1.0 if i < 3 else 3.0


def _set_temperature(i, model):
    model.cfg.temperature = 1.0 if i < 3 else 3.0


def _edit_weights(i, model):
    model.weights[0, 1] = 1.0 if i < 3 else 5.0


@pytest.mark.parametrize("change", [_set_gain, _set_temperature, _edit_weights],
                         ids=["a global read by a Module's own method",
                              "an object kept on a Module", "an array kept on a Module"])
def test_what_a_modules_own_code_reads_records_again_when_it_changes(change):
    # guard: a Module's attributes and methods named by its code are read as any object's
    try:
        eager = module_scenario(False, change)
        captured = module_scenario(True, change)
    finally:
        globals()["MODULE_GAIN"] = 1.0
    assert all(np.array_equal(a, b) for a, b in zip(eager[0] + eager[1], captured[0] + captured[1]))
    assert captured[2].records == 2 and captured[2].replays >= 5, captured[2]


passed = Config()
passed.smoothing = 1.0


def smooth(z, settings):
    return z * settings.smoothing


class ClassScaled:
    k = 1.0

    @classmethod
    def apply(cls, z):
        return z * cls.k


class CallableScale:
    def __init__(self):
        self.factor = 1.0

    def __call__(self, z):
        return z * self.factor


callable_scale = CallableScale()
GAIN = 1.0


def gained(z, k):
    return z * (k * GAIN)


partial = functools.partial(gained, k=1.0)
K = 1.0


@functools.lru_cache(maxsize=None)
def cached_factor():
    return K


def _keyword_only(z, *, settings=passed):
    return z * settings.smoothing


local_settings = types.ModuleType("nnkit_test_local_settings")
local_settings.scale = 1.0
sys.modules[local_settings.__name__] = local_settings


def _imported_here(z):
    import nnkit_test_local_settings
    return z * nnkit_test_local_settings.scale


class Overridable:
    def apply(self, z):
        return z


overridable = Overridable()


def _tripled(z):
    return z * 3.0


def _override(i, layer=None, opt=None):
    overridable.__dict__.pop("apply", None)
    if i >= 3:
        overridable.apply = _tripled


def _set_global(name):
    def change(i, layer=None, opt=None):
        globals()[name] = 1.0 if i < 3 else 3.0
        cached_factor.cache_clear()
        cached_factor()         # warm: the step's call does not run the function
    return change


CODE_PATHS = {
    "an object handed to a helper": (lambda z: smooth(z, passed),
                                     changing(passed, "smoothing")),
    "a class attribute read through cls": (lambda z: ClassScaled.apply(z),
                                           changing(ClassScaled, "k")),
    "a callable object": (lambda z: callable_scale(z), changing(callable_scale, "factor")),
    "a global read by a partial's function": (lambda z: partial(z), _set_global("GAIN")),
    "a partial's keywords": (lambda z: partial(z), changing(partial.keywords, "k")),
    "a global read by a cached function": (lambda z: z * cached_factor(), _set_global("K")),
    "a keyword-only default": (_keyword_only, changing(passed, "smoothing")),
    "a module imported inside the code": (_imported_here, changing(local_settings, "scale")),
    "a method replaced on the object": (lambda z: overridable.apply(z), _override),
}


@pytest.mark.parametrize("path", list(CODE_PATHS))
def test_what_code_met_as_the_step_runs_reads_records_again_when_it_changes(path):
    # guard: the code a recording runs is read as it runs (world.meet: the functions, their
    # arguments and globals), and the bindings of the methods the step names are compared
    records_again_when_changed(*CODE_PATHS[path])


def test_a_partial_inside_a_sequential_records_again_when_its_global_changes():
    step = sequential_with(functools.partial(gained, k=1.0), _set_global("GAIN"))
    assert step.records == 2, step


# ------------------------------------------------------------------ dynamic lookups, containers

dynamic = Config()
dynamic.scale = 1.0
NAME = "scale"
DEEP = {"loss": {"logits": {"scale": 1.0}}}
SCALES = {1.0}
EXTRA = collections.defaultdict(float, scale=1.0)


class AttrConfig:
    def __init__(self):
        self._values = {"scale": 1.0}

    def __getattr__(self, name):
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None


attr_config = AttrConfig()


def _set_scales(i, layer=None, opt=None):
    SCALES.clear()
    SCALES.add(1.0 if i < 3 else 3.0)


LOOKUPS = {
    "getattr with a name in a variable": (lambda z: z * getattr(dynamic, NAME),
                                          changing(dynamic, "scale")),
    "vars(object)[name]": (lambda z: z * vars(dynamic)["scale"], changing(dynamic, "scale")),
    "an object answering through __getattr__": (lambda z: z * attr_config.scale,
                                                changing(attr_config._values, "scale")),
    "a dict three levels deep": (lambda z: z * DEEP["loss"]["logits"]["scale"],
                                 changing(DEEP["loss"]["logits"], "scale")),
    "a set of numbers": (lambda z: z * max(SCALES), _set_scales),
    "a defaultdict": (lambda z: z * EXTRA["scale"], changing(EXTRA, "scale")),
}


@pytest.mark.parametrize("lookup", list(LOOKUPS))
def test_settings_looked_up_dynamically_or_nested_record_again_when_they_change(lookup):
    # guard: an object read dynamically (getattr, vars, __getattr__) is compared attribute by
    # attribute; nested containers and sets are compared item by item
    records_again_when_changed(*LOOKUPS[lookup])


OPTIONS = {"scale": 0.1}


def test_a_number_that_changes_type_but_not_value_records_again():
    # 0.1 == np.float64(0.1), but float32 · np.float64 is float64 in NumPy 2 (float32 · 0.1 is
    # float32): a dict of numbers is compared by type and bits
    def features(captured):
        step = nn.capture(lambda x: x * OPTIONS["scale"]) if captured else \
            (lambda x: x * OPTIONS["scale"])
        out = []
        for i in range(6):
            OPTIONS["scale"] = 0.1 if i < 3 else np.float64(0.1)
            out.append(np.asarray(step(np.full(3, 1.1, np.float32))))
        OPTIONS["scale"] = 0.1
        return out, step
    eager, _ = features(False)
    captured, step = features(True)
    assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(eager, captured))
    assert step.replays >= 2, step


def test_a_module_named_like_a_library_is_read_as_the_users():
    # guard: libraries are recognised by their package name, not by a prefix of it
    mathconfig = types.ModuleType("mathconfig")
    mathconfig.scale = 1.0
    globals()["mathconfig"] = mathconfig
    try:
        step = same_as_eager(lambda z: z * mathconfig.scale, changing(mathconfig, "scale"))
    finally:
        del globals()["mathconfig"]
    assert step.records == 2, step


class Chain:
    """Seven methods deep, the last reading an attribute."""
    k = 1.0

    def m0(self, z):
        return self.m1(z)

    def m1(self, z):
        return self.m2(z)

    def m2(self, z):
        return self.m3(z)

    def m3(self, z):
        return self.m4(z)

    def m4(self, z):
        return self.m5(z)

    def m5(self, z):
        return self.m6(z)

    def m6(self, z):
        return z * self.k


chain = Chain()


def test_a_chain_of_methods_is_read_however_deep():
    step = same_as_eager(lambda z: chain.m0(z), changing(chain, "k"))
    assert step.records == 2, step


# ------------------------------------------------------------------ inputs and optimizers

WHICH = "adam"


@pytest.mark.parametrize("where", ["on the model", "found by a name in a string"])
def test_an_optimizer_kept_on_the_model_or_found_at_run_time_is_checked(where):
    # the first replay's check saves and restores every optimizer the step steps (those the
    # recording met stepping too)
    def scenario(captured):
        nn.seed(0)
        model = nn.layers.Sequential(nn.layers.Linear(4, 3))
        model.opt = holder = Config()
        holder.adam = nn.Adam(model.vars, lr=0.1)

        if where == "on the model":
            def update():
                model.opt.adam.step()
        else:
            def update():
                getattr(holder, WHICH).step()

        def step(x, y):
            loss = nn.SoftmaxCELoss(model(x), y)
            loss.back()
            update()
            return loss
        step = nn.capture(step) if captured else step
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            losses = [np.array(step(x, y).data) for x, y in BATCHES]
        return losses, [p.data.copy() for p in model.vars], holder.adam.state, step
    eager = scenario(False)
    captured = scenario(True)
    assert all(np.array_equal(a, b) for a, b in zip(eager[0] + eager[1], captured[0] + captured[1]))
    assert captured[3].replays >= 6, captured[3]


def test_a_parameter_given_as_an_input_runs_eagerly():
    # a learned input updated by the optimizer: a replay's copy of it would miss the update
    results = []
    for captured in (False, True):
        nn.seed(0)
        layer = nn.layers.Linear(4, 3)
        prompt = nn.NetVar(np.zeros((1, 4), np.float32))
        opt = nn.GD(layer.vars + [prompt], lr=0.1)

        def step(p, x, y):
            loss = nn.SoftmaxCELoss(layer(p + x.astype(np.float32)), y)
            loss.back()
            opt.step()
            return loss
        step = nn.capture(step) if captured else step
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            losses = [np.array(step(prompt, x, y).data) for x, y in BATCHES]
        results.append((losses, prompt.data.copy(), caught))
    assert all(np.array_equal(a, b) for a, b in zip(results[0][0], results[1][0]))
    assert np.array_equal(results[0][1], results[1][1])
    assert any("parameter" in str(w.message) for w in results[1][2])


def test_one_node_given_twice_is_another_signature_and_adds_both_gradients():
    results = []
    for captured in (False, True):
        layer, _, step = gd_step(lambda layer, opt, a, b, y: nn.SoftmaxCELoss(layer(a + b), y),
                                 captured)
        a, b = (nn.NetVar(BATCHES[k][0].astype(np.float32)) for k in (0, 1))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i, (_, y) in enumerate(BATCHES):
                step(a, a if i >= 3 else b, y)
        results.append((np.array(a.g), np.array(b.g), layer.W.data.copy()))
    for u, v in zip(*results):
        assert np.array_equal(u, v)


@pytest.mark.parametrize("where", ["the optimizer", "a parameter group"])
def test_a_learning_rate_given_as_a_numpy_number_replays(where):
    # the optimizer makes its options Python floats at every step: not a change by the step
    def change(i, layer, opt):
        lr = np.float32(0.1 if i < 3 else 0.05)
        if where == "the optimizer":
            opt.lr = lr
        else:
            opt.param_groups[0]["lr"] = lr
    step = same_as_eager(lambda z: z, change, min_replays=5)
    assert step.records == 1, step


COLLECTIONS = 0


def _count_collections(phase, info):
    global COLLECTIONS
    COLLECTIONS += 1


def test_a_garbage_collection_during_a_recording_is_no_code_of_the_steps():
    # a collection's callbacks may run amid any step; the recording collects none (gc off)
    import gc
    threshold = gc.get_threshold()
    gc.callbacks.append(_count_collections)
    gc.set_threshold(1)             # a collection at every allocation while enabled
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            step = same_as_eager(lambda z: z, lambda i, layer, opt: None, min_replays=6)
    finally:
        gc.callbacks.remove(_count_collections)
        gc.set_threshold(*threshold)
    assert step.records == 1, step


# ------------------------------------------------------------------ a third round

def test_a_parameter_group_added_between_calls_records_again():
    # guard: each optimizer's parameters, group by group, are the recording's (stale)
    def change(i, layer, opt):
        if i == 3:          # the bias joins the training (fine-tuning unfreezes a layer)
            opt.add_param_group({"params": [layer.b], "lr": 0.05})
    def scenario(captured):
        nn.seed(0)
        layer = nn.layers.Linear(4, 3)
        opt = nn.GD([layer.W], lr=0.1)
        step = training_step(layer, opt, captured)
        losses = []
        for i, (x, y) in enumerate(BATCHES):
            change(i, layer, opt)
            losses.append(np.array(step(x, y).data))
        return losses, [p.data.copy() for p in layer.vars], step
    eager, captured = scenario(False), scenario(True)
    assert all(np.array_equal(a, b) for a, b in zip(eager[0] + eager[1], captured[0] + captured[1]))
    # (also recorded: the bias's gradient, outside the optimizer, adds up until it joins)
    assert captured[2].replays >= 3, captured[2]


def test_a_gradient_read_as_zeros_between_calls_runs_that_call_eagerly():
    # reading p.g of a parameter without a gradient makes zeros that are no gradient (AdamW
    # skips the parameter); a replay cannot tell them apart from a gradient of zeros
    def scenario(captured):
        nn.seed(0)
        model = nn.Module()
        model.body, model.unused = nn.layers.Linear(4, 3), nn.layers.Linear(3, 3)
        opt = nn.AdamW(model.vars, lr=0.01, weight_decay=0.1)
        step = training_step(model.body, opt, captured)
        for i, (x, y) in enumerate(BATCHES * 2):
            step(x, y)
            if i % 4 == 3:
                [np.linalg.norm(p.g) for p in model.vars]       # logging the norms
        return [p.data.copy() for p in model.vars], [s.get("t") for s in opt.state], step
    eager, captured = scenario(False), scenario(True)
    assert all(np.array_equal(a, b) for a, b in zip(eager[0], captured[0]))
    assert eager[1] == captured[1]
    # the unused layer keeps the zeros its read made: from the first logging on, eager
    assert captured[2].replays >= 3, captured[2]


def test_a_learning_rate_the_step_reads_itself_records_again_when_it_changes():
    # guard: an optimizer's attributes named by the step's code (the rate read live by its
    # own step() needs none)
    def scenario(captured):
        _, opt, step = gd_step(lambda layer, opt, x, y: nn.SoftmaxCELoss(layer(x), y)
                               + nn.Sum(layer.W * layer.W) * opt.lr, captured)
        losses = []
        for i, (x, y) in enumerate(BATCHES):
            opt.lr = 0.1 if i < 3 else 0.5
            losses.append(np.array(step(x, y).data))
        return losses, step
    eager, _ = scenario(False)
    losses, step = scenario(True)
    assert all(np.array_equal(a, b) for a, b in zip(eager, losses))
    assert step.records == 2, step


class Section:
    pass


nested = Config()
nested.loss = Section()
nested.loss.temperature = 1.0
SECTION, KEY = "loss", "temperature"
PIPELINE = {"double": lambda z: z * 2.0, "shift": lambda z: z + 1.0}
QUEUE = collections.deque([1.0])


def _reorder(i, layer=None, opt=None):
    wanted = ["double", "shift"] if i < 3 else ["shift", "double"]
    for name in wanted:
        PIPELINE[name] = PIPELINE.pop(name)


def _through_pipeline(z):
    for transform in PIPELINE.values():
        z = transform(z)
    return z


def _kw_scaled(z, *, factor=1.0):
    return z * factor


def _set_kwdefault(i, layer=None, opt=None):
    _kw_scaled.__kwdefaults__["factor"] = 1.0 if i < 3 else 3.0


def _set_queue(i, layer=None, opt=None):
    QUEUE[0] = 1.0 if i < 3 else 3.0


def _set_context_scale(i, layer=None, opt=None):
    SCALE_VAR.set(1.0 if i < 3 else 3.0)


MORE = {
    "a section looked up by names in strings": (
        lambda z: z / getattr(getattr(nested, SECTION), KEY), changing(nested.loss, KEY)),
    "a dict reordered in place": (_through_pipeline, _reorder),
    "a deque": (lambda z: z * QUEUE[0], _set_queue),
    "a keyword-only default replaced": (_kw_scaled, _set_kwdefault),
    "a context variable": (lambda z: z * SCALE_VAR.get(), _set_context_scale),
}


@pytest.mark.parametrize("case", list(MORE))
def test_more_settings_record_again_when_they_change(case):
    # guards: objects read dynamically are compared with the objects they hold; a dict's
    # order; deques, arrays and bytearrays by contents; keyword-only defaults
    records_again_when_changed(*MORE[case])


def test_a_captured_step_called_from_several_threads_gives_each_eagers_result():
    # a replay's buffers are the recording's: one thread replays, the others run eagerly
    import threading
    nn.seed(0)
    model = nn.layers.Sequential(nn.layers.Linear(64, 256), nn.Tanh, nn.layers.Linear(256, 10))

    def predict(x):
        return nn.Softmax(model(x))
    captured = nn.capture(predict)
    inputs = [np.random.default_rng(k).standard_normal((64, 64)).astype(np.float32)
              for k in range(8)]
    with nn.no_grad():
        expected = [predict(x).data for x in inputs]
        captured(inputs[0]), captured(inputs[1])        # recorded, checked: replays follow
    wrong = []

    def work(k):           # (the products release the GIL: threads switch amid a replay)
        for _ in range(40):
            with nn.no_grad():
                if not np.array_equal(captured(inputs[k]).data, expected[k]):
                    wrong.append(k)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not wrong and captured.replays > 0, captured


def test_an_array_subclass_input_runs_eagerly():
    # a masked array copied into a buffer would lose its mask: such inputs are not captured
    nn.seed(0)
    layer = nn.layers.Linear(4, 3)

    def predict(x):
        return nn.Sum(layer(nn.constant(x.filled(0.0) if hasattr(x, "filled") else x)))
    captured = nn.capture(predict)
    x = np.ma.masked_array(BATCHES[0][0].astype(np.float32), mask=BATCHES[0][0] > 1)
    with pytest.warns(UserWarning, match="subclass"):
        assert np.array_equal(captured(x).data, predict(x).data)


log = __import__("logging").getLogger("nnkit.tests.capture")


def _by_name(settings):
    return getattr(settings, NAME)


SCALE_VAR = __import__("contextvars").ContextVar("scale", default=1.0)


@pytest.mark.parametrize("extra", ["logging", "copy", "json", "a helper reading by name",
                                   "a context variable"])
def test_a_step_that_logs_or_copies_a_settings_object_replays(extra):
    # standard-library code the step calls is not read as the step's; objects met while the
    # step runs are compared with themselves (not shifted against others); a built-in method
    # made anew at each reading is compared by equality
    import copy
    import json
    settings = Config()
    settings.scale = 1.0
    call = {"logging": lambda: log.debug("step"), "copy": lambda: copy.copy(settings),
            "json": lambda: json.dumps(vars(settings)),
            "a helper reading by name": lambda: _by_name(settings),
            "a context variable": lambda: SCALE_VAR.get()}[extra]

    def scale(z):
        call()
        return z
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step = same_as_eager(scale, lambda i, layer, opt: None, min_replays=6)
    assert step.records == 1, step


# ------------------------------------------------------------------ a fourth round

ONE_HOT = np.eye(3)
ONE_HOT_NODE = nn.constant(np.eye(3))


def test_a_plain_table_indexed_by_an_input_is_refused_not_replayed_stale():
    # ONE_HOT[y], np.take(ONE_HOT, y): NumPy indexes a plain array without asking the index,
    # so no recording sees the gather; an input no recorded operation reads is refused. A
    # node kept outside the step is the step's state: indexing it is recorded
    order = np.argsort([y[0] for _, y in BATCHES], kind="stable")    # batches in class order
    batches = [(BATCHES[k][0], np.sort(BATCHES[k][1])) for k in order]

    def scenario(captured, gather):
        layer, _, step = gd_step(
            lambda layer, opt, x, y: nn.Mean((nn.Softmax(layer(x)) - gather(y)) ** 2), captured)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            losses = [np.array(step(x, y).data) for x, y in batches]
        return losses, layer.W.data.copy(), step, caught
    for gather, replays in ((lambda y: nn.constant(ONE_HOT[y]), 0),
                            (lambda y: nn.constant(np.take(ONE_HOT, y, axis=0)), 0),
                            (lambda y: ONE_HOT_NODE[y], len(batches) - 1)):
        eager, captured = scenario(False, gather), scenario(True, gather)
        assert all(np.array_equal(a, b) for a, b in zip(eager[0], captured[0]))
        assert np.array_equal(eager[1], captured[1])
        assert captured[2].replays == replays, captured[2]
        assert (replays == 0) == any("read by no operation" in str(w.message)
                                     for w in captured[3])


def test_out_given_by_position_is_recorded():
    def summed(layer, opt, x, y):
        column = np.empty(4)
        np.sum(x, 0, None, column)          # out= by position
        return nn.SoftmaxCELoss(layer(x * column), y)

    def scenario(captured):
        _, _, step = gd_step(summed, captured)
        batches = [BATCHES[0]] * 2 + BATCHES[1:]        # the first replay's check sees no change
        return [np.array(step(x, y).data) for x, y in batches], step
    eager, (losses, step) = scenario(False)[0], scenario(True)
    assert all(np.array_equal(a, b) for a, b in zip(eager, losses))
    assert step.replays >= 6, step


def test_a_node_computed_by_an_op_as_an_input():
    # without a graph (no_grad features): captured; with one: refused (back() would go on
    # into the caller's graph), with a warning saying so
    nn.seed(0)
    layer = nn.layers.Linear(4, 3)

    def predict(x):
        return nn.Softmax(layer(x))
    captured = nn.capture(predict)
    for x, _ in BATCHES[:4]:
        with nn.no_grad():
            features = nn.constant(x.astype(np.float32)) * 2.0
        assert np.array_equal(captured(features).data, predict(features).data)
    assert captured.replays >= 2, captured
    source = nn.NetVar(BATCHES[0][0].astype(np.float32))
    with pytest.warns(UserWarning, match="computed by an op"):
        assert np.array_equal(nn.capture(predict)(source * 2.0).data,
                              predict(source * 2.0).data)


def test_a_row_count_that_follows_the_data_records_again():
    # np.compress writes into a buffer of the recorded shape: another count records again
    def scenario(captured):
        _, _, step = gd_step(lambda layer, opt, x, keep: nn.Mean(
            layer(np.compress(keep, x, axis=0).astype(np.float32)) ** 2), captured, outputs=2)
        return [np.array(step(x, x[:, 0] > 0).data) for x, _ in BATCHES + BATCHES], step
    eager, (losses, step) = scenario(False)[0], scenario(True)
    assert all(np.array_equal(a, b) for a, b in zip(eager, losses))
    assert step.records >= 2, step           # (the kept rows differ from batch to batch)


NOISE_OF_ITS_OWN = np.random.default_rng(3)


def test_after_a_first_replay_that_differed_the_modifiers_hold_eagers_record():
    # the check against eager restores what the modifiers recorded (ClipGradNorm's norm)
    norms = []
    for captured in (False, True):
        NOISE_OF_ITS_OWN.bit_generator.state = np.random.default_rng(3).bit_generator.state
        clip = nn.ClipGradNorm(0.5)

        def loss_of(layer, opt, x, y):
            return nn.SoftmaxCELoss(layer(x + NOISE_OF_ITS_OWN.standard_normal(x.shape)), y)
        layer, opt, step = gd_step(loss_of, captured)
        opt.add_modifier(clip)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # (the first replay differs: eager from then on)
            for x, y in BATCHES[:3]:
                step(x, y)
                norms.append(clip.last_norm)
    assert norms[:3] == norms[3:]


# ------------------------------------------------------------------ a fifth round

def test_a_step_that_reads_the_gradient_of_a_parameter_without_one_runs_eagerly():
    # p.g of a parameter the step did not reach makes zeros its optimizer skips: the
    # recording's own call skips them too, and the step then runs eagerly
    def run(captured):
        nn.seed(0)
        used, unused = nn.layers.Linear(4, 3), nn.layers.Linear(4, 3)
        params = used.vars + unused.vars
        opt = nn.AdamW(params, lr=0.1)

        def step(x):
            loss = nn.Sum(used(x) ** 2)
            loss.back()
            for p in params:
                p.g[...] *= 0.5
            opt.step()
            return loss
        step = nn.capture(step) if captured else step
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for x, _ in BATCHES[:3]:
                step(x.astype(np.float32))
        return [p.data.copy() for p in params], [s.get("t") for s in opt.state], caught
    eager, captured = run(False), run(True)
    assert all(np.array_equal(a, b) for a, b in zip(eager[0], captured[0]))
    assert eager[1] == captured[1]
    assert any("reads .g" in str(w.message) for w in captured[2])


class Named:
    def __init__(self, scale):
        self.scale = scale


FIRST, SECOND = Named(1.0), Named(1.0)
REGISTRY = {"a": Named(1.0)}


def _apply(z, settings):
    return z * settings.scale


def _get_settings():
    return REGISTRY["a"]


@dataclasses.dataclass
class DataSettings:
    scale: float = 1.0


DATA_SETTINGS = DataSettings()


def _counted(z):
    _counted.calls += 1
    return z * (2.0 if _counted.calls % 4 == 0 else 1.0)


_counted.calls = 0
USER_DICT = collections.UserDict(scale=1.0)
PROXIED = {"scale": 1.0}
PROXY = types.MappingProxyType(PROXIED)

FIFTH = {
    "a helper's second call, with another object": (
        lambda z: _apply(_apply(z, FIRST), SECOND), changing(SECOND, "scale")),
    "settings a function returns": (lambda z: z * _get_settings().scale,
                                    changing(REGISTRY["a"], "scale")),
    "a dataclass read with asdict": (lambda z: z * dataclasses.asdict(DATA_SETTINGS)["scale"],
                                     changing(DATA_SETTINGS, "scale")),
    "a UserDict": (lambda z: z * USER_DICT["scale"], changing(USER_DICT, "scale")),
    "a mapping proxy": (lambda z: z * PROXY["scale"], changing(PROXIED, "scale")),
}


@pytest.mark.parametrize("case", list(FIFTH))
def test_a_fifth_round_of_settings_records_again_when_they_change(case):
    # guards: a function's arguments at each of its calls and what it returns are read with
    # its names and its caller's; a dataclass is compared field by field; mappings by items
    records_again_when_changed(*FIFTH[case])


def test_a_counter_kept_on_a_function_the_step_calls_runs_the_step_eagerly():
    # the step changes the function's attribute: a replay would not (refused, eager)
    def scenario(captured):
        _counted.calls = 0
        _, _, step = gd_step(lambda layer, opt, x, y: nn.SoftmaxCELoss(_counted(layer(x)), y),
                             captured)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return [np.array(step(x, y).data) for x, y in BATCHES], step
    eager, _ = scenario(False)
    losses, step = scenario(True)
    assert all(np.array_equal(a, b) for a, b in zip(eager, losses))
    assert step.replays == 0, step


# ------------------------------------------------------------------ a sixth round

class Plainly(nn.Module):
    def __init__(self):
        self.inner = nn.layers.Linear(4, 3)

    def forward(self, x):
        return self.inner(x)


def _doubled_forward(self, x):
    return self.inner(x) * 2.0


class SafeCE(nn.CELoss):
    eps = 1e-12


def test_a_forward_replaced_on_the_class_records_again():
    # guard: a Module's class and its class's forward are compared with the rest of it
    original = Plainly.forward

    def scenario(captured):
        Plainly.forward = original
        nn.seed(0)
        model = Plainly()
        step = training_step(model, nn.GD(model.vars, lr=0.1), captured)
        losses = []
        for i, (x, y) in enumerate(BATCHES):
            Plainly.forward = original if i < 3 else _doubled_forward
            losses.append(np.array(step(x, y).data))
        return losses, step
    step = alike(scenario, lambda: setattr(Plainly, "forward", original))
    assert step.records == 2, step


def test_a_number_an_op_class_keeps_records_again_when_it_changes():
    # guard: the numbers the op classes a recording met keep (nnkit's code reads them)
    def loss_of(layer, opt, x, y):
        return SafeCE(nn.Softmax(layer(x)), nn.constant(np.eye(3)[y]))

    def scenario(captured):
        SafeCE.eps = 1e-12
        _, _, step = gd_step(loss_of, captured)
        losses = []
        for i, (x, y) in enumerate(BATCHES):
            SafeCE.eps = 1e-12 if i < 3 else 0.3
            losses.append(np.array(step(x, y).data))
        return losses, step
    step = alike(scenario, lambda: setattr(SafeCE, "eps", 1e-12))
    assert step.records == 2, step


def test_an_input_in_another_memory_order_is_another_signature():
    # the bits of a sum follow the layout: a BatchNorm's statistics of an F-ordered batch
    def scenario(captured):
        nn.seed(0)
        norm, layer = nn.layers.BatchNorm(4), nn.layers.Linear(4, 3)
        opt = nn.GD(norm.vars + layer.vars, lr=0.1)
        step = training_step(lambda x: layer(norm(x)), opt, captured)
        for i, (x, y) in enumerate(BATCHES):
            x = np.asfortranarray(x.astype(np.float32)) if i >= 3 else x.astype(np.float32)
            step(x, y)
        return [norm.stats.running_mean.copy()] + [p.data.copy() for p in opt.params], step
    eager, _ = scenario(False)
    state, step = scenario(True)
    assert all(np.array_equal(a, b) for a, b in zip(eager, state))
    assert len(step.schedules) == 2, step


def test_an_error_state_set_between_calls_is_the_replays_as_eager():
    # an op's own np.errstate is replayed over the state a replay finds, as eager's is
    nn.seed(0)
    layer = nn.layers.Linear(4, 3)

    def predict(x):
        return nn.GELU(layer(x) * 1e3)          # GELU's exp underflows for large negatives
    captured = nn.capture(predict)
    x = BATCHES[0][0].astype(np.float32)
    for _ in range(3):
        captured(x)
    with np.errstate(under="raise"):
        with pytest.raises(FloatingPointError):
            predict(x)
        with pytest.raises(FloatingPointError):
            captured(x)


# ------------------------------------------------------------------ a seventh round

OBJECTS = np.array([Named(1.0)], dtype=object)
SHARED = np.array([1.0])
VIEW = memoryview(SHARED)
SEVENTH = {
    "a settings object in an object array": (lambda z: z / OBJECTS[0].scale,
                                             changing(OBJECTS[0], "scale")),
    "a memoryview": (lambda z: z * VIEW[0], changing(SHARED, 0)),
}


@pytest.mark.parametrize("case", list(SEVENTH))
def test_a_seventh_round_of_settings_records_again_when_they_change(case):
    # guards: the objects an object array holds are read as a list's; a memoryview's bytes
    records_again_when_changed(*SEVENTH[case])
