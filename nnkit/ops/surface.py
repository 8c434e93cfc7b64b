"""NetVar's surface: the operators and methods that make ``a + b``, ``x @ w``, ``x.sum(axis)``,
``x.T``, ``x[i]`` and ``x > 0`` work, in one table.

Every entry builds the op of the same name (``x.sum(1)`` is ``Sum(x, 1)``), with one exception
written once, below: the fast path of ``+ − × ÷``. Comparisons give boolean constants (no
gradient), usable as masks and with ``Where``. The methods take ``**keywords`` only to answer
PyTorch's spellings (``dim=``, ``keepdim=``) with nnkit's; PyTorch's attribute names
(``backward``, ``grad``, ...) raise AttributeError naming nnkit's. NumPy's operators with an array
on the left (``a + x``, ``a @ x``, ``a < x``) are the node's own; NumPy's functions and ufuncs
given a node that requires a gradient (``np.sum(w)``, ``np.dot(a, w)``, ``np.exp(x)``), which
would drop the gradient, and ``2.0 ** x`` raise TypeError naming nnkit's spelling.
"""
import operator

import numpy

from ..core import NetVar, constant, link
from ..specialize import own_code
from ..hints import PYTORCH
from .activation import LogSoftmax, ReLU, Sigmoid, SoftMax, Tanh
from .arithmetic import Add, Div, Exp, Log, Mul, Multiply, Neg, Pow, RDiv, RSub, Sub, kept
from .indexing import Broadcast, Flatten, GetItem
from .math import Abs, Clip, Cos, Sin, Sqrt
from .reduce import ArgMax, LogSumExp, Max, Mean, Min, Norm, Sum, Var
from .shape import AsType, Reshape, Transpose, keyword_error

__all__ = []

_ndarray = numpy.ndarray


# ----------------------------------------------------------------------------- operators

def _operator(cls):
    """``a + b`` (and − × ÷, and their swapped twins) for a node ``a``: the node ``cls(a, b)``
    would make, built here.

    The one place where a built-in op does not run its constructor. These operators are the ops
    a chain of tiny steps is made of, and the frames of ``cls(a, b)`` and ``super()`` would be a
    large part of such an op's cost; so the node is made with ``object.__new__`` and filled in
    by ``core.link``, ``NetOp.__init__``'s bookkeeping with a fixed argument list (the one
    place that uses it). A plain operand is kept as the op's ``constant``, as the constructor
    keeps it (``kept``). Anything else, or operands whose data do not combine, go to the
    constructor, which converts them or raises the error naming the op. Each operator runs
    its own copy of ``apply`` and ``link`` (``own_code``): each copy builds nodes of one
    class.
    """
    new, function, fill = object.__new__, cls.function, own_code(link)

    def apply(a, b):
        if type(b) is _ndarray and b.dtype.kind == "f":
            c = b                   # a float array is kept as it is (``kept``): tested first
        elif isinstance(b, NetVar):
            try:
                y = function(a._data, b._data)
            except (ValueError, TypeError):
                return cls(a, b)
            return fill(new(cls), y, a, b)
        else:
            c = kept(a, b)
            if c is None:
                return cls(a, b)
        try:
            y = function(a._data, c)
        except (ValueError, TypeError):
            return cls(a, b)
        node = new(cls)
        node.constant = c
        return fill(node, y, a)

    return own_code(apply)


def _comparison(function):
    """``x < y`` and the like: a boolean constant (``y`` a node, a number or an array)."""
    def compare(a, b):
        values = function(a._data, b._data if isinstance(b, NetVar) else b)
        return constant(values, dtype=bool)
    compare.__name__ = compare.__qualname__ = f"__{function.__name__}__"
    return compare


# ----------------------------------------------------------------------------- methods

def _reduction(name, op, hint=""):
    """``x.name(axis=None, keepdims=False)`` builds ``op(x, axis, keepdims)``."""
    def method(x, axis=None, keepdims=False, **keywords):
        if keywords:
            raise keyword_error(name, keywords, hint)
        return op(x, axis, keepdims)
    method.__name__ = method.__qualname__ = name
    return method


def _softmax(op):
    """``x.softmax(axis=-1, mask=None)`` builds ``op(x, axis, mask)`` (SoftMax or LogSoftmax)."""
    name = "softmax" if op is SoftMax else "log_softmax"

    def method(x, axis=-1, mask=None, **keywords):
        if keywords:
            raise keyword_error(name, keywords)
        return op(x, axis, mask)
    method.__name__ = method.__qualname__ = name
    return method


def _var(x, axis=None, keepdims=False, ddof=0, **keywords):
    if keywords:
        raise keyword_error("var", keywords, " (ddof=1 for the unbiased estimate)")
    return Var(x, axis, keepdims, ddof)


def _reshape(x, *shape, **keywords):
    if keywords:
        raise keyword_error("reshape", keywords)
    return Reshape(x, *shape)


def _transpose(x, *axes, **keywords):
    if keywords:
        raise keyword_error("transpose", keywords, "; give the new order of every axis, e.g. "
                            "x.transpose(1, 0, 2)")
    if not axes:
        return Transpose(x)
    return Transpose(x, axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list))
                     else axes)


def _flatten(x, start=1, end=-1, **keywords):
    if keywords:
        raise keyword_error("flatten", keywords)
    return Flatten(x, start, end)


def _expand(x, *shape, **keywords):
    if keywords:
        raise keyword_error("expand", keywords)
    return Broadcast(x, shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list))
                     else shape)


def _rpow(x, c):
    """``c ** x``: refused naming the way to write it (Python's own error named only the types)."""
    if numpy.ndim(c):
        base, log = "c", "np.log(c)"
    else:
        base = repr(int(c) if isinstance(c, (int, numpy.integer)) else float(c))
        log = f"math.log({base})"
    raise TypeError(f"{base} ** x: {x._describe()} as an exponent: nnkit's Pow raises a node to "
                    f"a constant power; write a constant to the power of x as (x * {log}).exp()")


_NO_ORDER = ("; nnkit's norm is always the L2 norm, and its first argument is the axis, not "
             "PyTorch's or NumPy's order p")


# PyTorch's attribute names (hints.PYTORCH["node"]), answered with nnkit's. Each is a property that
# raises AttributeError on reading and on assignment (so hasattr() is False). Not __getattr__: a
# class that defines it makes every attribute access of its instances slower, the engine's
# included.
def _spelled_differently(name, spelling):
    def refuse(self, value=None):
        raise AttributeError(f"{type(self).__name__} has no attribute '{name}': "
                             f"nnkit spells it {spelling}")
    return property(refuse, refuse)


# NumPy's functions given a node computed on its values and returned an array, so the gradient
# was lost without a word (np.dot(a, w), np.concatenate, np.where, np.clip), or failed inside the
# node's own method (np.sum(w) passes out= to w.sum); its ufuncs failed naming neither function
# nor cure (np.exp(x): "operand 'NetVar' does not support ufuncs"). Given a node that requires a
# gradient both are refused, naming nnkit's spelling, except those whose result is nothing to
# differentiate (comparisons, shapes, indices, saving); given constants only, they compute on the
# values as before. np.asarray(x) gives the values, on purpose. The operators' ufuncs (a + x with
# an array a) are the node's operators (_OPERATOR_UFUNCS).
_NUMPY_SPELLINGS = {
    "sum": "x.sum(axis)", "mean": "x.mean(axis)", "max": "x.max(axis)", "amax": "x.max(axis)",
    "min": "x.min(axis)", "amin": "x.min(axis)", "var": "x.var(axis, ddof=0)",
    "std": "x.var(axis).sqrt()", "norm": "x.norm(axis)", "dot": "a @ b (nn.Multiply)",
    "matmul": "a @ b (nn.Multiply)", "einsum": "nn.Einsum", "concatenate": "nn.Concat(xs, axis)",
    "stack": "nn.Stack(xs, axis)", "split": "nn.Split(x, sections, axis)",
    "where": "nn.Where(cond, a, b)", "clip": "x.clip(lo, hi)", "reshape": "x.reshape(...)",
    "ravel": "x.reshape(-1)", "transpose": "x.T or x.transpose(...)",
    "broadcast_to": "x.broadcast_to(shape)", "pad": "nn.Pad(x, pad_width)",
    # ufuncs, and a ufunc's method after a dot (np.add.reduce)
    "exp": "x.exp()", "log": "x.log()", "sqrt": "x.sqrt()", "sin": "x.sin()", "cos": "x.cos()",
    "tanh": "x.tanh() (nn.Tanh)", "absolute": "abs(x)", "fabs": "abs(x)",
    "maximum": "nn.Maximum(a, b)", "fmax": "nn.Maximum(a, b)", "minimum": "nn.Minimum(a, b)",
    "fmin": "nn.Minimum(a, b)", "square": "x * x", "reciprocal": "1 / x", "log1p": "(1 + x).log()",
    "expm1": "x.exp() - 1", "add.reduce": "x.sum(axis)", "maximum.reduce": "x.max(axis)",
    "minimum.reduce": "x.min(axis)",
    **{name: f"a = a {sign} x (a new node; a {sign}= x writes into the array a)" for name, sign in
       (("add", "+"), ("subtract", "-"), ("multiply", "*"), ("divide", "/"))},
}
_VALUES_ONLY = {"shape", "ndim", "size", "allclose", "isclose", "array_equal", "array_equiv",
                "argmax", "argmin", "argsort", "array2string", "array_repr", "array_str",
                "save", "savez", "savez_compressed", "savetxt",
                "isnan", "isinf", "isfinite", "signbit"}
# NumPy's operator ufunc -> the node's operator and its reflected twin: NumPy hands `c + x` (an
# array c, a node x) to x.__array_ufunc__ as np.add(c, x), which hands it on to x.__radd__(c).
_OPERATOR_UFUNCS = {
    "add": ("__add__", "__radd__"), "subtract": ("__sub__", "__rsub__"),
    "multiply": ("__mul__", "__rmul__"), "divide": ("__truediv__", "__rtruediv__"),
    "matmul": ("__matmul__", "__rmatmul__"), "power": ("__pow__", "__rpow__"),
    "less": ("__lt__", "__gt__"), "less_equal": ("__le__", "__ge__"),
    "greater": ("__gt__", "__lt__"), "greater_equal": ("__ge__", "__le__"),
    "equal": ("__eq__", "__eq__"), "not_equal": ("__ne__", "__ne__"),
    "negative": ("__neg__",), "absolute": ("__abs__",),
}


def _values(item):
    """``item`` with each node (alone or in a list or tuple) replaced by its data."""
    if isinstance(item, NetVar):
        return item._data
    if type(item) in (list, tuple):
        return type(item)(_values(part) for part in item)
    return item


def _trained(item):
    """The first node in ``item`` (alone or in a list or tuple) that requires a gradient."""
    if isinstance(item, NetVar):
        return item if item.requires_grad else None
    if type(item) in (list, tuple):
        return next((node for node in map(_trained, item) if node is not None), None)
    return None


def _on_values(function, module, name, args, kwargs):
    """``function(*args, **kwargs)`` on the nodes' values, unless a node in them requires a
    gradient: then refused, naming ``module.name`` and nnkit's spelling."""
    node = None if name in _VALUES_ONLY else _trained([*args, *kwargs.values()])
    if node is None:
        return function(*_values(args), **{key: _values(value) for key, value in kwargs.items()})
    cure = (f"nnkit spells it {_NUMPY_SPELLINGS[name]}" if name in _NUMPY_SPELLINGS
            else "build it from nnkit's ops")
    raise TypeError(f"{module}.{name}(): {node._describe()} is a node, and NumPy would compute "
                    f"on its values and lose its gradient; {cure} (np.asarray(x) gives the values "
                    "alone)")


def _array_function(self, func, types, args, kwargs):
    return _on_values(func, func.__module__, func.__name__, args, kwargs)


def _array_ufunc(self, ufunc, method, *inputs, **kwargs):
    methods = _OPERATOR_UFUNCS.get(ufunc.__name__) if method == "__call__" else None
    if methods and not kwargs and len(inputs) == len(methods):
        if len(inputs) == 1:
            return getattr(inputs[0], methods[0])()
        c, x = inputs                     # np.add(c, x): c + x, or x + c when c is a node too
        return getattr(c, methods[0])(x) if isinstance(c, NetVar) else getattr(x, methods[1])(c)
    name = ufunc.__name__ if method == "__call__" else f"{ufunc.__name__}.{method}"
    return _on_values(getattr(ufunc, method), ufunc.__module__, name, inputs, kwargs)


class _ArrayUfunc:
    """``NetVar.__array_ufunc__``: ``_array_ufunc`` read from the class, None read from a node.
    NumPy reads it from the class (a special method) and calls it for ``np.exp(x)`` and ``a + x``.
    CuPy reads it from the node: None, or it would compute ``gpu_array + x`` itself, taking x
    for a number, instead of handing it to ``x.__radd__``."""

    def __get__(self, node, owner=None):
        return _array_ufunc if node is None else None


# ----------------------------------------------------------------------------- the table

_add, _sub, _mul, _div = _operator(Add), _operator(Sub), _operator(Mul), _operator(Div)

SURFACE = {
    # arithmetic (c + x is x + c, and c · x is x · c: the same numbers in IEEE arithmetic)
    "__add__": _add, "__radd__": _add, "__sub__": _sub, "__rsub__": _operator(RSub),
    "__mul__": _mul, "__rmul__": _mul, "__truediv__": _div, "__rtruediv__": _operator(RDiv),
    "__matmul__": lambda a, b: Multiply(a, b), "__rmatmul__": lambda a, b: Multiply(b, a),
    "__pow__": lambda a, p: Pow(a, p), "__rpow__": _rpow, "__neg__": lambda a: Neg(a),
    "__abs__": lambda x: Abs(x),
    # comparisons: boolean constants
    "__lt__": _comparison(operator.lt), "__le__": _comparison(operator.le),
    "__gt__": _comparison(operator.gt), "__ge__": _comparison(operator.ge),
    "__eq__": _comparison(operator.eq), "__ne__": _comparison(operator.ne),
    # elementwise functions
    "exp": lambda x: Exp(x), "log": lambda x: Log(x), "sqrt": lambda x: Sqrt(x),
    "abs": lambda x: Abs(x), "sin": lambda x: Sin(x), "cos": lambda x: Cos(x),
    "clip": lambda x, lo=None, hi=None: Clip(x, lo, hi),
    "relu": lambda x: ReLU(x), "sigmoid": lambda x: Sigmoid(x), "tanh": lambda x: Tanh(x),
    "softmax": _softmax(SoftMax), "log_softmax": _softmax(LogSoftmax),
    # reductions
    "sum": _reduction("sum", Sum), "mean": _reduction("mean", Mean),
    "max": _reduction("max", Max), "min": _reduction("min", Min),
    "logsumexp": _reduction("logsumexp", LogSumExp), "var": _var,
    "norm": _reduction("norm", Norm, _NO_ORDER), "argmax": _reduction("argmax", ArgMax),
    # shapes and indexing
    "reshape": _reshape, "transpose": _transpose, "T": property(lambda x: Transpose(x)),
    "astype": lambda x, dtype: AsType(x, dtype),
    "__getitem__": lambda x, index: GetItem(x, index), "flatten": _flatten,
    "expand": _expand, "broadcast_to": lambda x, shape: Broadcast(x, shape),
    # NumPy's functions (np.sum(w), np.dot(a, w), ...) and ufuncs (np.exp(x), a + x) given a node
    "__array_function__": _array_function, "__array_ufunc__": _ArrayUfunc(),
}

SURFACE.update({name: _spelled_differently(name, spelling)
                for name, spelling in PYTORCH["node"].items() if name.isidentifier()})


class _Size(int):
    """``x.size``: NumPy's number of elements, an int; calling it (PyTorch's ``x.size()``, the
    shape) raises naming nnkit's spelling."""
    __slots__ = ()

    def __call__(self, *args, **keywords):
        raise TypeError(f"size is an int in nnkit (here {int(self)}: the number of elements, "
                        f"as NumPy's), not a method; PyTorch's x.size() is nnkit's "
                        f"x{PYTORCH['node']['size()']}")


SURFACE["size"] = property(lambda x: _Size(x._data.size))

for _name, _entry in SURFACE.items():
    setattr(NetVar, _name, _entry)
