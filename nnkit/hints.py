"""nnkit's spelling of what PyTorch users reach for, in one table, and the answers of the ops
called the way PyTorch builds its modules (``AppliedOp``, ``no_input``, ``not_a_node``).

The table is read only once a lookup or a call has already failed (a Module's or nnkit's
``__getattr__``, which Python calls only when the normal lookup found nothing; a refused
keyword; a node property that exists only to answer), so it costs the normal path nothing.
docs/pytorch.md shows the same equivalences side by side, with their exact arithmetic.

Nothing here imports the rest of nnkit: every layer of the package may use it.
"""
import inspect

import numpy

__all__ = ["PYTORCH", "spelling", "keyword_hint", "AppliedOp", "no_input", "not_a_node"]

# PyTorch's name -> nnkit's spelling, by where the name is reached for.
PYTORCH = {
    # attributes of a node (NetVar): each is a property that raises AttributeError naming
    # nnkit's spelling (ops/surface.py), so hasattr() is False
    "node": {
        "backward": "back()", "grad": ".g (assign .g = None or call reset() to clear it)",
        "zero_grad": "reset()", "zero_": "reset() for the gradient",
        "requires_grad_": "requires_grad = True", "cpu": "to_cpu()", "cuda": "to_gpu()",
        "to": "to_gpu() / to_cpu()", "view": "reshape()", "permute": "transpose()",
        "dim": "ndim", "numel": "size", "grad_fn": "parents", "is_leaf": "not parents",
        "size()": ".shape (and x.shape[d] for x.size(d))",
    },
    # attributes of a Module (a model or a layer), answered by Module.__getattr__
    "module": {
        "parameters": "vars (a property, the list of trainable parameters: model.vars)",
        "named_parameters": "named_vars() (a dict of dotted name -> parameter)",
        "state_dict": "state() (a dict of dotted name -> NumPy array)",
        "load_state_dict": "load_state(state)",
        "eval": "a mode, not a model's flag: with nn.eval_mode(): ...",
        "train": "a mode, not a model's flag: training is the default; inside an "
                 "nn.eval_mode() block, with nn.train_mode(): ...",
        "training": "nn.is_training() (a mode of the whole program, not of one model)",
        "zero_grad": "the optimizer's step(), which resets the gradients it used (or "
                     "optimizer.reset())",
        "cuda": "to_gpu()", "cpu": "to_cpu()",
        "to": "to_gpu() / to_cpu() (a dtype is chosen before building: nn.set_dtype)",
        "double": "nn.set_dtype('float64') before building the model",
        "float": "nn.set_dtype('float32') before building the model",
        "half": "nn.set_dtype('float16') before building the model",
        "children": "members() ((name, value) of each attribute; tree() shows the model)",
        "named_children": "members() ((name, value) of each attribute; tree() shows the model)",
        "modules": "tree() (a picture of every submodule) or members()",
        "named_modules": "tree() (a picture of every submodule) or members()",
        "register_buffer": "a class attribute buffers naming the attributes (see Module)",
        "register_parameter": "assigning the NetVar to an attribute: self.name = w",
        "add_module": "assigning the Module to an attribute: self.name = layer",
        "requires_grad_": "p.requires_grad = False on each parameter to freeze (see Module)",
    },
    # keywords of the op constructors and the node methods
    "keyword": {
        "dim": "axis", "keepdim": "keepdims", "start_dim": "start", "end_dim": "end",
        "unbiased": "ddof", "correction": "ddof",
    },
    # keywords of the optimizers' constructors
    "optimizer": {
        "betas": "momentum=β1, rms=β2 (e.g. nn.Adam(params, lr, momentum=0.9, rms=0.98))",
        "alpha": "rms= (RMSProp's moving-average factor)",
        "weight_decay": "nn.AdamW(..., weight_decay=) for decoupled decay, or "
                        "modifiers=[nn.L2Decay(rate)] for PyTorch's (coupled) weight_decay",
        "nesterov": "nn.Nesterov(params, lr, momentum) (PyTorch's SGD(nesterov=True))",
        "dampening": "nothing: GD's momentum is an average already, m = β·m + (1 − β)·g "
                     "(docs/pytorch.md gives PyTorch's SGD momentum exactly)",
        "amsgrad": "nothing: AMSGrad is not implemented",
        "maximize": "nothing: minimise the negated objective",
        "centered": "nothing: centered RMSProp is not implemented",
        "lr_decay": "a schedule (nn.ExponentialLR, nn.StepLR, ...)",
        "initial_accumulator_value": "nothing: AdaGrad's sum starts at zero",
    },
    # names of the nnkit namespace, answered by nnkit.__getattr__
    "nnkit": {
        "CrossEntropyLoss": "nn.SoftmaxCELoss (softmax cross-entropy on logits, the mean)",
        "BCEWithLogitsLoss": "nn.SigmoidCELoss (on logits, the mean)",
        "Linear": "nn.layers.Linear", "Sequential": "nn.layers.Sequential",
        "MultiheadAttention": "nn.layers.MultiHeadAttention",
        "TransformerEncoderLayer": "nn.layers.TransformerEncoderLayer",
        "Tensor": "nn.NetVar", "tensor": "nn.NetVar", "Parameter": "nn.NetVar",
        "from_numpy": "nn.NetVar",
        "SGD": "nn.GD, whose momentum is an average of the gradient, not SGD's sum: "
               "SGD(lr, momentum=β) is nn.GD(lr=lr / (1 − β), momentum=β)",
        "RMSprop": "nn.RMSProp", "Adagrad": "nn.AdaGrad", "LeakyReLU": "nn.LReLU",
        "Hardtanh": "nn.HardTanh",
        "SmoothL1Loss": "nn.HuberLoss(p, t, d) / d for beta=d (docs/pytorch.md: reductions)",
        "inference_mode": "nn.no_grad", "set_grad_enabled": "nn.no_grad() / nn.enable_grad()",
        "manual_seed": "nn.seed", "cat": "nn.Concat", "stack": "nn.Stack", "where": "nn.Where",
        "matmul": "nn.Multiply (or a @ b)", "functional": "the ops themselves (nn.ReLU(x), ...)",
    },
}


def spelling(where, name):
    """nnkit's spelling of PyTorch's ``name`` reached for on ``where`` (a key of PYTORCH), or
    None."""
    return PYTORCH[where].get(name)


def keyword_hint(caller, name, where="keyword", hint=""):
    """The TypeError for ``caller`` given a keyword ``name`` it does not take, with nnkit's
    spelling when the table has one."""
    ours = PYTORCH[where].get(name)
    if ours is None:
        return TypeError(f"{caller} got an unexpected keyword argument {name!r}{hint}")
    if where == "keyword":
        return TypeError(f"{caller}: nnkit spells the {ours} argument {ours}=, not "
                         f"{name}={hint}")
    return TypeError(f"{caller} got an unexpected keyword argument {name!r}; in nnkit: {ours}")


# ----------------------------------------------------------------------------- ops vs layers

_NUMBERS = (int, float, numpy.number)   # (concrete classes: numbers.Number's check is slower)


class AppliedOp(type):
    """The metaclass of the ops whose names PyTorch gives to modules that are built first and
    called later: an op that shares its name with a layer (``nn.Conv2D`` and
    ``nn.layers.Conv2D``), the pools, ``Flatten``, ``CosineSimilarity`` and the losses. Called
    the way such a module is built, without its input (``nn.Flatten()``, ``nn.MSELoss()``,
    ``nn.Dropout(p=0.5)``) or, but for a loss, with only numbers as positional arguments
    (``nn.Conv2D(1, 8, 3)``, ``nn.MaxPool2D(2)``), the op raises a TypeError saying how nnkit
    writes it, before Python binds the arguments (so ``nn.LSTM(4, 8)`` does not fail on
    missing ones). Given to an op class in its header::

        class Conv2D(NetOp, metaclass=AppliedOp):
            module_call = "layer"

    ``module_call`` picks the answer: "layer" names the layer of the same name
    (``nn.layers.Conv2D``), "loss" says that the call with the prediction and the target is the
    loss node, "op" (the default) shows the op's arguments and, for ``nn.layers.Sequential``,
    a function. A metaclass, not ``__new__``: unpickling a node calls ``__new__`` with no
    arguments, exactly as ``nn.Dropout()`` would. An op's input is a node or an array, so a
    normal call passes on one isinstance. (The activations, whose calls are too frequent for
    this, answer with ``no_input`` and ``not_a_node`` instead.)
    """
    module_call = "op"

    def __call__(cls, *args, **keywords):
        if not args or isinstance(args[0], _NUMBERS):
            refused = _module_call(cls, args, keywords)
            if refused is not None:
                raise refused
        return type.__call__(cls, *args, **keywords)

    @property
    def __signature__(cls):
        """The op's signature, its ``__init__``'s (not ``__call__``'s *args, **keywords)."""
        signature = inspect.signature(cls.__init__)
        return signature.replace(parameters=list(signature.parameters.values())[1:])


def _module_call(cls, args, keywords):
    """The TypeError for the op class ``cls`` called as a module is built, or None when the
    call gives the op its input (a loss of two plain numbers is a loss)."""
    parameters = list(inspect.signature(cls).parameters.values())
    if args:
        if cls.module_call == "loss" or not all(isinstance(a, _NUMBERS) for a in args):
            return None
    elif parameters[0].name in keywords:       # the input given by name: nn.Dropout(x=h)
        return None
    name = cls.__name__
    given = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in keywords.items())])
    call = f"nn.{name}({given})"
    if cls.module_call == "layer":
        return TypeError(f"{call} calls the op {name}, which is applied to nodes, "
                         f"nn.{name}{_arguments(parameters)}; the layer is "
                         f"nn.layers.{name}({given or '...'})")
    if cls.module_call == "loss":
        return TypeError(f"{call} calls the loss {name}, an op applied to the prediction and "
                         f"the target: nn.{name}{_arguments(parameters)} is the loss node "
                         f"(loss = nn.{name}(prediction, target); loss.back()), with no loss "
                         "object to build first")
    return TypeError(f"{call} calls the op {name}, which is applied to nodes, "
                     f"nn.{name}{_arguments(parameters)}{_as_function(cls, args, keywords)}")


def _arguments(parameters):
    """``(x, size, stride=None)``: an op's parameters as its docs write them (a required input
    by its name, ``**keywords`` left out)."""
    shown = []
    for p in parameters:
        if p.kind is p.VAR_KEYWORD:
            continue
        required = p.default is p.empty or isinstance(p.default, _NoInput)
        shown.append(("*" if p.kind is p.VAR_POSITIONAL else "") + p.name if required
                     else f"{p.name}={p.default!r}")
    return f"({', '.join(shown)})"


def _as_function(cls, args, keywords):
    """``; in nn.layers.Sequential, ... lambda x: nn.Op(x, <the arguments given>)``, when the
    op takes them after its input; else nothing."""
    try:
        inspect.signature(cls).bind(None, *args, **keywords)
    except TypeError:
        return ""
    given = "".join([*(f", {a!r}" for a in args),
                     *(f", {k}={v!r}" for k, v in keywords.items())])
    return (f"; in nn.layers.Sequential, write it as a function: "
            f"lambda x: nn.{cls.__name__}(x{given})")


def not_a_node(cls, x, *others):
    """The TypeError for the activation op ``cls`` given ``x``, not a node, as its input; its
    other arguments ``others``, in order, as the op received them (``nn.LReLU(0.2)`` gives it
    x = 0.2 and s = 0.01). A number, a string or None in x is an argument of the activation
    written where the node goes (``nn.LReLU(0.2)``, ``nn.HardTanh(0.0, 6.0)``): the error shows
    the op's arguments and the function to put in ``nn.layers.Sequential``. Raised in each
    activation's constructor where reading ``x._data`` failed: a ``try`` costs nothing on the
    normal path, where ``__new__`` or a metaclass would cost a call on every op."""
    name = cls.__name__
    parameters = list(inspect.signature(cls).parameters.values())
    if not isinstance(x, (*_NUMBERS, str, type(None))):
        return TypeError(f"{name}: x must be a node (a NetVar), got {type(x).__name__}; "
                         f"nn.{name}(nn.NetVar(x)) for an array")
    given = [x, *others]
    later = [p for p in parameters[1:] if p.kind is p.POSITIONAL_OR_KEYWORD]
    while len(given) > 1 and len(given) - 1 <= len(later) \
            and _same(given[-1], later[len(given) - 2].default):
        given.pop()             # an argument left at its default was (most likely) not given
    shown = ", ".join(map(repr, given))
    if len(given) > len(later):         # nn.ReLU(True): nothing after x to take it
        advice = f"pass the class, nn.{name}"
    else:
        advice = f"write it as a function: lambda x: nn.{name}(x, {shown})"
    return TypeError(f"nn.{name}({shown}) calls the op {name}, which is applied to nodes, "
                     f"nn.{name}{_arguments(parameters)}; in nn.layers.Sequential, {advice}")


def _same(value, default):
    try:
        return type(value) is type(default) and bool(value == default)
    except (TypeError, ValueError):
        return False


class _NoInput:
    """The default of an activation op's input: ``nn.ReLU()`` (as in ``Sequential(nn.ReLU())``)
    reaches the op's first use of ``x``, which raises naming the class to pass instead."""
    __slots__ = ("op",)

    def __init__(self, op):
        self.op = op

    def __getattr__(self, name):
        raise TypeError(f"{self.op}() was called without its input: the op is applied to a "
                        f"node, nn.{self.op}(x); as a layer (e.g. in nn.layers.Sequential) "
                        f"pass the class nn.{self.op}, not nn.{self.op}()")

    def __repr__(self):
        return "<required>"


def no_input(op):
    """The default of the input of the activation op ``op`` (see ``_NoInput``)."""
    return _NoInput(op)
