"""nnkit's spelling of what PyTorch users reach for, in one table, and the rule for the ops
that share a name with a layer.

The table is read only once a lookup or a call has already failed (a Module's or nnkit's
``__getattr__``, which Python calls only when the normal lookup found nothing; a refused
keyword; a node property that exists only to answer), so it costs the normal path nothing.
docs/pytorch.md shows the same equivalences side by side, with their exact arithmetic.

Nothing here imports the rest of nnkit: every layer of the package may use it.
"""
import numpy

__all__ = ["PYTORCH", "spelling", "keyword_hint", "refuse_layer_calls", "no_input"]

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


def refuse_layer_calls(name):
    """``__new__`` for an op that shares its name with a layer (``nn.Conv2D`` and
    ``nn.layers.Conv2D``): the op called the way its layer is (only numbers as positional
    arguments, ``nn.Conv2D(1, 8, 3)``, ``nn.Dropout(0.5)``) raises a TypeError naming the layer,
    before anything else happens (before Python binds the arguments, so ``nn.LSTM(4, 8)``
    does not fail on missing ones). Applied with one line in the op's class::

        __new__ = refuse_layer_calls("Conv2D")

    An op's first argument is a node or an array, so a normal call passes on one isinstance.
    """
    def __new__(cls, *args, **keywords):
        if args and isinstance(args[0], _NUMBERS) and all(isinstance(a, _NUMBERS) for a in args):
            given = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in keywords.items())])
            raise TypeError(f"nn.{name}({given}) calls the op {name}, which is applied to "
                            f"nodes; the layer is nn.layers.{name}({given})")
        return object.__new__(cls)
    __new__.layer = name        # what tests/test_structure.py checks the rule by
    return __new__


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
