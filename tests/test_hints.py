"""PyTorch's spellings, reached for on nodes, Modules, optimizers, op constructors and nnkit
itself, raise an error naming nnkit's (one table: nnkit.hints.PYTORCH); the traps a PyTorch
user cannot guess (a replaced parameter, data of another float dtype) are refused or made
right."""
import inspect

import numpy as np
import pytest

import nnkit as nn
from nnkit.hints import PYTORCH, _NoInput
from nnkit.optim.base import Optimizer


@pytest.fixture
def y():
    return nn.NetVar(np.arange(6.0).reshape(2, 3))


class Residual(nn.Module):
    def __init__(self):
        self.fc = nn.layers.Linear(3, 3, seed=0)

    def forward(self, x):
        return x + self.fc(x)

    @property
    def broken(self):
        return self.fc.missing_attribute     # an AttributeError inside a property


# ----------------------------------------------------------------------------- Modules

@pytest.mark.parametrize("name", sorted(PYTORCH["module"]))
def test_a_module_answers_pytorchs_names_with_nnkits(name):
    assert not hasattr(nn.Module, name), f"Module defines {name}: drop it from the table"
    for model in (nn.layers.Linear(3, 2), Residual(), nn.layers.Sequential(nn.ReLU)):
        with pytest.raises(AttributeError) as caught:
            getattr(model, name)
        assert str(caught.value) == (f"{type(model).__name__} has no attribute {name!r}; in "
                                     f"nnkit: {PYTORCH['module'][name]}")


def test_the_module_hints_name_the_right_spellings():
    model = Residual()
    with pytest.raises(AttributeError, match=r"in nnkit: vars \(a property"):
        model.parameters()
    with pytest.raises(AttributeError, match=r"named_vars\(\)"):
        model.named_parameters()
    with pytest.raises(AttributeError, match=r"nn.eval_mode\(\)"):
        model.eval()
    with pytest.raises(AttributeError, match=r"in nnkit: state\(\)"):
        model.state_dict()
    with pytest.raises(AttributeError, match=r"in nnkit: load_state\(state\)"):
        model.load_state_dict({})
    with pytest.raises(AttributeError, match=r"in nnkit: to_gpu\(\)"):
        model.cuda()
    assert model.vars and model.named_vars() and model.state()     # nnkit's own spellings


def test_other_missing_attributes_keep_pythons_error():
    model = Residual()
    with pytest.raises(AttributeError, match="^'Residual' object has no attribute 'nothing'$"):
        model.nothing
    assert not hasattr(model, "nothing") and getattr(model, "nothing", 1) == 1
    # a property failing inside shows its own error, not one about the property's name
    with pytest.raises(AttributeError, match="'Linear' object has no attribute "
                                             "'missing_attribute'"):
        model.broken


def test_a_property_with_a_pytorch_name_failing_inside_shows_its_own_error():
    # a Module's own `training` property (a PyTorch name) whose body raised AttributeError was
    # answered "has no attribute 'training'; in nnkit: ...": false, and the real error hidden
    class Flagged(Residual):
        @property
        def training(self):
            return self.fc.missing_flag
    with pytest.raises(AttributeError, match="'Linear' object has no attribute 'missing_flag'"):
        Flagged().training


# ----------------------------------------------------------------------------- nnkit itself

@pytest.mark.parametrize("name", sorted(PYTORCH["nnkit"]))
def test_nnkit_answers_pytorchs_names_with_its_own(name):
    assert name not in vars(nn), f"nnkit has {name}: drop it from the table"
    with pytest.raises(AttributeError, match=f"^module 'nnkit' has no attribute '{name}'; in "
                                             "nnkit: "):
        getattr(nn, name)


def test_the_namespace_hints_name_names_that_exist():
    assert "nn.SoftmaxCELoss" in PYTORCH["nnkit"]["CrossEntropyLoss"]
    for spelling in PYTORCH["nnkit"].values():
        first = spelling.split()[0].split("(")[0].rstrip(",")
        if first.startswith("nn."):
            target = nn
            for part in first[3:].split("."):
                target = getattr(target, part)      # raises if the spelling names nothing
    assert nn.no_grad is nn.no_grad                 # torch.no_grad's spelling is the same
    with pytest.raises(AttributeError, match="^module 'nnkit' has no attribute 'nothing'$"):
        nn.nothing


# ----------------------------------------------------------------------------- nodes

def test_node_hints_come_from_the_table(y):
    for name, spelling in PYTORCH["node"].items():
        if name.isidentifier():
            with pytest.raises(AttributeError) as caught:
                getattr(y, name)
            assert str(caught.value).endswith(f"has no attribute '{name}': nnkit spells it "
                                              f"{spelling}")
    with pytest.raises(AttributeError, match=r"nnkit spells it back\(\)"):
        y.backward()


def test_size_is_numpys_and_size_call_names_shape(y):
    assert y.size == 6 and isinstance(y.size, int) and y.size + 1 == 7 and repr(y.size) == "6"
    with pytest.raises(TypeError, match=r"size is an int in nnkit \(here 6.*x\.shape"):
        y.size()
    with pytest.raises(TypeError, match=r"x\.shape\[d\] for x\.size\(d\)"):
        y.size(0)


# ----------------------------------------------------------------------------- op constructors

def ops_with_an_axis():
    for name in nn.__all__:
        op = getattr(nn, name)
        if callable(op) and (isinstance(op, type) and issubclass(op, nn.NetOp)
                             or inspect.isfunction(op) and op.__module__.startswith("nnkit.ops")):
            parameters = inspect.signature(op).parameters
            if "axis" in parameters or "start" in parameters:
                yield name


@pytest.mark.parametrize("name", sorted(ops_with_an_axis()))
def test_dim_on_an_op_class_names_its_axis(name, y):
    op = getattr(nn, name)
    name = op.__name__                          # an alias's errors name the op (Softmax)
    parameters = inspect.signature(op).parameters
    required = [p.name for p in parameters.values()
                if p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD]
    args = [[y, y] if p == "xs" else 2 if p == "sections" else y for p in required]
    ours, theirs = ("start", "start_dim") if "start" in parameters else ("axis", "dim")
    with pytest.raises(TypeError, match=f"^{name}\\(\\): nnkit spells the {ours} argument "
                                        f"{ours}=, not {theirs}="):
        op(*args, **{theirs: 0})


def test_the_ops_with_an_axis_are_found():
    assert {"SoftMax", "LogSoftmax", "Sum", "Mean", "Max", "Concat", "Split",
            "Flatten"} <= set(ops_with_an_axis())


def test_softmax_dim_keepdim_and_unbiased(y):
    with pytest.raises(TypeError, match=r"^SoftMax\(\): nnkit spells the axis argument axis="):
        nn.Softmax(y, dim=-1)
    with pytest.raises(TypeError, match="keepdims="):
        nn.Sum(y, 0, keepdim=True)
    with pytest.raises(TypeError, match=r"ddof=, not unbiased= \(ddof=1 for the unbiased"):
        nn.Var(y, 0, unbiased=True)
    with pytest.raises(TypeError, match=r"^Sum\(\) got an unexpected keyword argument 'foo'$"):
        nn.Sum(y, foo=1)
    assert nn.Softmax(y, axis=0).shape == (2, 3)


def activations():
    return sorted(name for name in nn.__all__ if isinstance(getattr(nn, name), type)
                  and issubclass(getattr(nn, name), nn.NetOp)
                  and isinstance(inspect.signature(getattr(nn, name)).parameters.get(
                      "x", inspect.Parameter("x", 1)).default, _NoInput))


@pytest.mark.parametrize("name", activations())
def test_an_activation_called_without_input_says_to_pass_the_class(name):
    name = getattr(nn, name).__name__           # an alias's errors name the op (Swish)
    with pytest.raises(TypeError, match=f"pass the class nn.{name}, not nn.{name}\\(\\)"):
        getattr(nn, name)()


def test_sequential_of_an_activation_instance_says_to_pass_the_class():
    assert {"ReLU", "Tanh", "Sigmoid", "GELU", "SoftMax", "SELU"} <= set(activations())
    with pytest.raises(TypeError, match=r"^ReLU\(\) was called without its input: .* pass the "
                                        r"class nn.ReLU, not nn.ReLU\(\)$"):
        nn.layers.Sequential(nn.layers.Linear(2, 3), nn.ReLU())
    net = nn.layers.Sequential(nn.layers.Linear(2, 3, seed=0), nn.ReLU)
    assert (net(np.ones((1, 2))).data >= 0).all()


# ----------------------------------------------------------------------------- optimizers

def optimizers():
    return sorted(name for name in nn.__all__ if isinstance(getattr(nn, name), type)
                  and issubclass(getattr(nn, name), Optimizer)
                  and getattr(nn, name) is not Optimizer)


@pytest.mark.parametrize("name", optimizers())
def test_an_optimizer_given_the_model_names_model_vars(name):
    model = nn.layers.Linear(3, 2)
    with pytest.raises(TypeError, match=rf"^{name}: params is the model \(Linear\); pass its "
                                        rf"parameters: {name}\(model.vars, ...\)$"):
        getattr(nn, name)(model)
    with pytest.raises(TypeError, match="params is the model"):
        getattr(nn, name)(params=model)


@pytest.mark.parametrize("name", optimizers())
def test_an_optimizer_answers_pytorchs_keywords(name):
    cls = getattr(nn, name)
    params = nn.layers.Linear(3, 2).vars
    for keyword, spelling in PYTORCH["optimizer"].items():
        if keyword in cls.options:
            continue
        with pytest.raises(TypeError) as caught:
            cls(params, **{keyword: 0.5})
        assert str(caught.value) == (f"{name}() got an unexpected keyword argument "
                                     f"{keyword!r}; in nnkit: {spelling}")


def test_adam_betas_and_the_pytorch_names_that_exist():
    params = nn.layers.Linear(3, 2).vars
    with pytest.raises(TypeError, match=r"momentum=β1, rms=β2"):
        nn.Adam(params, betas=(0.9, 0.98))
    assert nn.AdamW(params, weight_decay=0.1).weight_decay == 0.1
    opt = nn.Adam(params, lr=1e-3, momentum=0.9, rms=0.98)
    assert opt.param_groups[0]["params"] == params          # PyTorch's names that nnkit has
    opt.zero_grad()
    assert opt.state_dict()["type"] == "Adam"


# ----------------------------------------------------------------------------- a replaced parameter

def one_step(model, optimizer):
    model(np.ones((4, 3))).sum().back()
    optimizer.step()


def test_a_replaced_parameter_makes_the_next_step_refuse():
    model = Residual()
    opt = nn.Adam(model.vars, lr=0.1)
    one_step(model, opt)
    old = model.fc.W
    model.fc.W = nn.NetVar(np.zeros((3, 3), np.float32))
    before = [p.data.copy() for p in opt.params]
    with pytest.raises(RuntimeError, match=r"^Adam.step\(\): Linear.W was assigned a new value "
                                           r"after this optimizer was built.*nothing was "
                                           r"updated$"):
        one_step(model, opt)
    assert all((p.data == b).all() for p, b in zip(opt.params, before))
    assert old is opt.params[0]
    fresh = nn.Adam(model.vars, lr=0.1)          # the remedy: an optimizer over the new vars
    one_step(model, fresh)
    assert not (model.fc.W.data == 0).all()


def test_a_replaced_submodule_makes_the_next_step_refuse():
    model = Residual()
    opt = nn.GD(model.vars, lr=0.1)
    model.fc = nn.layers.Linear(3, 3, seed=1)
    with pytest.raises(RuntimeError, match=r"Residual.fc was assigned a new value"):
        one_step(model, opt)



def test_a_parameter_assigned_back_trains_on():
    # evaluating with other weights (averaged ones) and putting the trained ones back made
    # every later step refuse, as if the model no longer used them
    model = Residual()
    opt = nn.Adam(model.vars, lr=0.1)
    one_step(model, opt)
    trained, layer = model.fc.W, model.fc
    model.fc.W = nn.NetVar(np.zeros((3, 3), np.float32))
    model.fc.W = nn.NetVar(np.ones((3, 3), np.float32))
    model.fc.W = trained
    model.fc = nn.layers.Linear(3, 3, seed=1)
    model.fc = layer
    before = trained.data.copy()
    one_step(model, opt)
    assert not (trained.data == before).all()
    model.fc.W = nn.NetVar(np.zeros((3, 3), np.float32))      # and not back: refused
    with pytest.raises(RuntimeError, match=r"Linear.W was assigned a new value"):
        one_step(model, opt)


def test_a_submodule_the_walk_refuses_can_still_be_replaced():
    # with an optimizer alive, the assignment walked the old value for its parameters and
    # raised the walk's error: a part kept in a set could not even be removed
    model = Residual()
    opt = nn.GD(model.vars, lr=0.1)

    class InASet(nn.Module):
        def __init__(self):
            self.parts = {nn.layers.Linear(3, 3)}

    model.extra = InASet()
    model.extra = None
    model.extra = nn.FFN((nn.Multiply, model.fc.W * 2))       # a computed argument
    model.extra = None
    assert model.extra is None
    one_step(model, opt)
    layer = model.fc
    model.fc = InASet()                 # step() names the replacement, not the walk's error
    with pytest.raises(RuntimeError, match="Residual.fc was assigned a new value"):
        opt.step()
    model.fc = layer
    one_step(model, opt)

def test_what_keeps_the_parameters_trains_on():
    model = Residual()
    opt = nn.GD(model.vars, lr=0.1)
    other = nn.GD(nn.layers.Linear(3, 3).vars, lr=0.1)
    model.fc.W.data = np.ones((3, 3), np.float32)         # the same NetVar, new values
    model.load_state(model.state())
    model.fc.W = model.fc.W                                # the same object again
    model.note = nn.NetVar([1.0])                          # a new attribute replaces nothing
    model.fc.last = model(np.ones((1, 3)))                 # a graph kept, then replaced
    model.fc.last = None
    one_step(model, opt)
    model.fc.b = nn.NetVar(np.zeros((1, 3), np.float32))  # not a parameter of `other`
    assert other._replaced is None


def test_a_submodule_wrapped_around_its_parameters_trains_on():
    # the new value still holds the old one's parameters (the layer wrapped in a Sequential):
    # the model still uses them, so the optimizer must go on training them, not refuse
    model = Residual()
    opt = nn.GD(model.vars, lr=0.1)
    kept = list(opt.params)
    model.fc = nn.layers.Sequential(model.fc, nn.ReLU)
    one_step(model, opt)
    assert opt._replaced is None and model.vars == kept


# ----------------------------------------------------------------------------- float dtypes

@pytest.mark.parametrize("layer, shape", [
    (lambda: nn.layers.Linear(3, 2, seed=0), (4, 3)),
    (lambda: nn.layers.Conv2D(2, 3, 3, seed=0), (1, 2, 5, 5)),
    (lambda: nn.layers.BatchNorm(3), (4, 3)),
    (lambda: nn.layers.LayerNorm(3), (4, 3)),
    (lambda: nn.layers.LSTM(3, 2, seed=0), (5, 2, 3)),
    (lambda: nn.layers.MultiHeadAttention(4, 2, seed=0), (5, 2, 4)),
])
def test_float64_data_into_a_float32_layer_computes_in_float32(layer, shape):
    previous = nn.get_dtype()
    nn.set_dtype("float32")
    try:
        model = layer()
        x = np.random.default_rng(0).normal(size=shape)             # float64 NumPy data
        y = model(x)
        assert y.dtype == np.float32
        np.testing.assert_array_equal(y.data, model(x.astype(np.float32)).data)
        name = f"layers.{type(model).__name__}"
        with pytest.raises(TypeError, match=rf"^{name}: x has dtype float64, computed by Mul, "
                                            r"and the layer's parameters are float32"):
            model(nn.NetVar(x) * 2.0)
        assert model(nn.NetVar(x, requires_grad=False)).dtype == np.float32
        leaf = nn.NetVar(x)                       # an input that needs a gradient
        out = model(leaf)
        assert out.dtype == np.float32
        out.sum().back()
        assert leaf.g.dtype == np.float64 and leaf.g.any()
    finally:
        nn.set_dtype(previous)


def test_linear_float64_data_values_are_the_float32_computation():
    previous = nn.get_dtype()
    nn.set_dtype("float32")
    try:
        layer = nn.layers.Linear(3, 2, seed=0)
        x = np.random.default_rng(1).normal(size=(4, 3))
        y = layer(x)
        expected = x.astype(np.float32) @ layer.W.data + layer.b.data
        assert y.dtype == np.float32
        np.testing.assert_array_equal(y.data, expected)
        y.sum().back()
        assert layer.W.g.dtype == np.float32
    finally:
        nn.set_dtype(previous)
