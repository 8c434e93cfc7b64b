"""PyTorch's spellings, reached for on nodes, Modules, optimizers, op constructors and nnkit
itself, raise an error naming nnkit's (one table: nnkit.hints.PYTORCH); the traps a PyTorch
user cannot guess (a replaced parameter, data of another float dtype) are refused or made
right."""
import inspect

import numpy as np
import pytest

import nnkit as nn
from nnkit.hints import PYTORCH, AppliedOp, _NoInput
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


@pytest.mark.parametrize("name", activations())
def test_an_activation_given_a_number_names_its_arguments(name):
    name = getattr(nn, name).__name__
    with pytest.raises(TypeError, match=rf"^nn.{name}\(0.5\) calls the op {name}, which is "
                                        rf"applied to nodes, nn.{name}\(x[,)].*; in "
                                        r"nn.layers.Sequential, (write it as a function: "
                                        rf"lambda x: nn.{name}\(x, 0.5\)|pass the class, "
                                        rf"nn.{name})$"):
        getattr(nn, name)(0.5)


@pytest.mark.parametrize("call, function", [
    ("nn.LReLU(0.2)", "lambda x: nn.LReLU(x, 0.2)"),
    ("nn.ELU(0.5)", "lambda x: nn.ELU(x, 0.5)"),
    ("nn.Softmax(0)", "lambda x: nn.SoftMax(x, 0)"),
    ("nn.HardTanh(0.0, 6.0)", "lambda x: nn.HardTanh(x, 0.0, 6.0)"),
    ("nn.HardTanh(-2.0, 1.0)", "lambda x: nn.HardTanh(x, -2.0, 1.0)"),
])
def test_the_function_an_activation_error_gives_runs_in_a_sequential(call, function):
    with pytest.raises(TypeError) as caught:
        eval(call)
    assert str(caught.value).endswith(f"write it as a function: {function}")
    x = np.linspace(-8, 8, 12).reshape(2, 6)
    net = nn.layers.Sequential(nn.layers.Linear(6, 6, seed=0), eval(function))
    expected = eval(function)(nn.layers.Linear(6, 6, seed=0)(x))
    np.testing.assert_array_equal(net(x).data, expected.data)


def test_an_activation_without_arguments_to_take_a_number_says_to_pass_the_class():
    with pytest.raises(TypeError, match=r"^nn.ReLU\(True\) calls the op ReLU, which is applied "
                                        r"to nodes, nn.ReLU\(x\); in nn.layers.Sequential, pass "
                                        r"the class, nn.ReLU$"):
        nn.ReLU(True)
    with pytest.raises(TypeError, match=r"^nn.GELU\('tanh'\) calls the op GELU.*nn.GELU\(x\);"):
        nn.GELU("tanh")
    with pytest.raises(TypeError, match=r"^nn.SELU\(1.0\) calls the op SELU, .*nn.SELU\(x\);"):
        nn.SELU(1.0)
    with pytest.raises(TypeError, match=r"^Tanh: x must be a node \(a NetVar\), got ndarray; "
                                        r"nn.Tanh\(nn.NetVar\(x\)\) for an array$"):
        nn.Tanh(np.ones(3))


def ops_built_as_modules():
    return sorted(name for name in nn.__all__ if isinstance(getattr(nn, name), AppliedOp))


def test_the_ops_built_as_modules_are_found():
    assert {"Conv2D", "Dropout", "LSTM", "MaxPool2D", "AvgPool2D", "Flatten", "CosineSimilarity",
            "MSELoss", "SoftmaxCELoss", "HuberLoss", "KLDivLoss"} <= set(ops_built_as_modules())


@pytest.mark.parametrize("name", ops_built_as_modules())
def test_an_op_built_as_a_module_without_its_input_says_how_to_write_it(name):
    op = getattr(nn, name)
    with pytest.raises(TypeError, match=rf"^nn.{name}\(\) calls the (op|loss) {name}, "):
        op()
    with pytest.raises(TypeError, match=rf"^nn.{name}\(reduction='sum'\) calls the "):
        op(reduction="sum")                     # a keyword of the module, not of the op
    assert str(inspect.signature(op)).startswith(    # the op's own, not (*args, **keywords)
        f"({list(inspect.signature(op.__init__).parameters)[1]}")


def test_pools_and_flatten_built_as_modules_give_the_function_to_write():
    x = nn.NetVar(np.arange(32.0).reshape(1, 2, 4, 4))
    for call, function in [("nn.MaxPool2D(2)", "lambda x: nn.MaxPool2D(x, 2)"),
                           ("nn.AvgPool2D(2, stride=1)", "lambda x: nn.AvgPool2D(x, 2, stride=1)"),
                           ("nn.Flatten()", "lambda x: nn.Flatten(x)"),
                           ("nn.Flatten(0)", "lambda x: nn.Flatten(x, 0)")]:
        name = call[3:call.index("(")]
        with pytest.raises(TypeError) as caught:
            eval(call)
        assert str(caught.value).startswith(f"{call} calls the op {name}, which is applied to "
                                            f"nodes, nn.{name}(x, ")
        assert str(caught.value).endswith(f"in nn.layers.Sequential, write it as a function: "
                                          f"{function}")
        assert nn.layers.Sequential(eval(function))(x).shape == eval(function)(x).shape
    with pytest.raises(TypeError, match=r"^nn.MaxPool2D\(kernel_size=2\) calls the op MaxPool2D, "
                                        r"which is applied to nodes, nn.MaxPool2D\(x, size, "
                                        r"stride=None, padding=0\)$"):
        nn.MaxPool2D(kernel_size=2)
    with pytest.raises(TypeError, match=r"^nn.CosineSimilarity\(dim=1\) calls the op "
                                        r"CosineSimilarity, which is applied to nodes, "
                                        r"nn.CosineSimilarity\(a, b, axis=-1, eps=1e-08\)$"):
        nn.CosineSimilarity(dim=1)


def test_a_loss_built_as_a_module_says_the_call_is_the_loss_node(y):
    with pytest.raises(TypeError, match=r"^nn.MSELoss\(\) calls the loss MSELoss, an op applied "
                                        r"to the prediction and the target: nn.MSELoss\(p, t, "
                                        r"mask=None, lengths=None\) is the loss node \(loss = "
                                        r"nn.MSELoss\(prediction, target\); loss.back\(\)\), "
                                        r"with no loss object to build first$"):
        nn.MSELoss()
    with pytest.raises(TypeError, match=r"^nn.HuberLoss\(delta=0.5\) calls the loss HuberLoss.*"
                                        r"nn.HuberLoss\(p, t, d=1.0\) is the loss node"):
        nn.HuberLoss(delta=0.5)
    with pytest.raises(TypeError, match=r"^nn.SoftmaxCELoss\(\) calls the loss SoftmaxCELoss"):
        nn.SoftmaxCELoss()
    # the losses' own calls, by position, by name, of plain numbers, pass
    assert nn.MSELoss(p=y, t=np.zeros((2, 3))).item() == nn.MSELoss(y, np.zeros((2, 3))).item()
    assert nn.MSELoss(2.0, 3.0).item() == 1.0
    assert nn.Dropout(x=y, p=0.0) is not None and nn.Flatten(x=y).shape == (2, 3)


def test_an_op_built_as_a_module_still_pickles(y):
    # unpickling calls __new__ with no arguments, as nn.Dropout() would: the call of the class,
    # not __new__, is what is checked
    import pickle
    for node in (nn.Dropout(y, 0.5), nn.MSELoss(y, np.ones((2, 3))), nn.Flatten(y),
                 nn.MaxPool2D(nn.NetVar(np.ones((1, 1, 2, 2))), 2)):
        thawed = pickle.loads(pickle.dumps(node))
        assert type(thawed) is type(node)
        np.testing.assert_array_equal(thawed.data, node.data)


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
