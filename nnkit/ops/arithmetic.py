"""Arithmetic: matrix product, elementwise + − × ÷, negation, powers, exp and log.

Elementwise ops broadcast as NumPy does and sum each gradient back to its input's shape.
These ops call ``core._link(self, value, a, b)`` rather than ``super().__init__(value, a, b)``:
the same bookkeeping without the super() lookup and the ``*parents`` call, together ~0.2 µs, a
tenth of a tiny op's whole budget. The operators + − × ÷ go further and build the node without
its constructor (``_operator``, at the end of this file). The four elementwise constructors
compute directly when both operands are nodes (no helper call); ``_binary`` converts plain
operands and words the errors.
The hot op classes declare ``__slots__`` (empty, or their one constant): a node then carries no
``__dict__``, which makes it smaller and ~60 ns faster to build.
A ``_back`` tests ``requires_grad`` before computing or passing a parent's gradient: constants
(a bias-free operand, a scalar) then cost no call and no array at all, and the gradient goes in
with ``_accumulate``, which does not test it again. The one-input ops (−x, powers, exp, log)
use ``_accumulate_elementwise``: their input needs the gradient and has its shape.
Notation: inputs a, b (x, w for the matrix product), output y, upstream gradient g.
"""

__all__ = ['Multiply', 'Add', 'Sub', 'Mul', 'Div', 'Neg', 'Pow', 'Exp', 'Log']
import operator

from .. import backend, checks
from ..core import NetOp, NetVar, _link, constant


def _nodes(a, b):
    """Turn a plain number or array operand into a constant of the other operand's dtype."""
    if not isinstance(a, NetVar):
        a = constant(a, b if isinstance(b, NetVar) else None)
    if not isinstance(b, NetVar):
        b = constant(b, a)
    return a, b


def _binary(op, function, a, b):
    """``(a, b, function(a, b))`` on the operands' data, as nodes, with errors naming the op.

    The slow path of + − × ÷: plain operands, and the errors of the direct computation.
    """
    if not isinstance(a, NetVar) or not isinstance(b, NetVar):
        a, b = _nodes(a, b)
    try:
        return a, b, function(a._data, b._data)
    except ValueError:
        raise ValueError(f"{op}: cannot broadcast {tuple(a.shape)} with {tuple(b.shape)}") \
            from None
    except TypeError:
        backend.check_same_device(op, a._data, b._data)
        raise


class Multiply(NetOp):
    """Matrix product (a layer's weights).

    y = x @ w
    dx = g @ wᵀ
    dw = xᵀ @ g
    x is (..., B, F) and w is (F, H) (or a stack of them); y is (..., B, H).
    """
    __slots__ = ()

    def __init__(self, x, w):
        x, w = _nodes(x, w)
        xd, wd = x._data, w._data
        if xd.ndim < 2 or wd.ndim < 2:
            raise ValueError(f"Multiply: operands must be at least 2-D, got {tuple(xd.shape)} "
                             f"and {tuple(wd.shape)}")
        try:
            y = xd @ wd
        except ValueError:
            raise ValueError(f"Multiply: cannot multiply {tuple(xd.shape)} by "
                             f"{tuple(wd.shape)}") from None
        except TypeError:
            backend.check_same_device("Multiply", xd, wd)
            raise
        _link(self, y, x, w)

    def _back(self, x, w):
        g = self._g
        xd, wd = x._data, w._data
        if x.requires_grad:
            x._accumulate(g @ (wd.T if wd.ndim == 2 else wd.swapaxes(-1, -2)))
        if w.requires_grad:
            if xd.ndim == 2:
                w._accumulate(xd.T @ g)
            elif wd.ndim == 2:      # (..., B, F) @ (F, H): sum over every leading axis at once
                w._accumulate(xd.reshape(-1, xd.shape[-1]).T @ g.reshape(-1, g.shape[-1]))
            else:
                w._accumulate(xd.swapaxes(-1, -2) @ g)


class Add(NetOp):
    """Elementwise sum (e.g. adding a bias), with broadcasting.

    y = a + b
    da = g,  db = g   (each summed over the axes it was broadcast along)
    """
    __slots__ = ()

    def __init__(self, a, b):
        try:
            y = a._data + b._data
        except (AttributeError, ValueError, TypeError):   # a plain operand, or the op's error
            a, b, y = _binary("Add", operator.add, a, b)
        _link(self, y, a, b)

    def _back(self, a, b):
        g = self._g
        if a.requires_grad:
            a._accumulate(g)
        if b.requires_grad:
            b._accumulate(g)


class Sub(NetOp):
    """Elementwise difference, with broadcasting.

    y = a − b
    da = g,  db = −g
    """
    __slots__ = ()

    def __init__(self, a, b):
        try:
            y = a._data - b._data
        except (AttributeError, ValueError, TypeError):   # a plain operand, or the op's error
            a, b, y = _binary("Sub", operator.sub, a, b)
        _link(self, y, a, b)

    def _back(self, a, b):
        if a.requires_grad:
            a._accumulate(self._g)
        if b.requires_grad:
            b._accumulate(-self._g)


class Mul(NetOp):
    """Elementwise product, with broadcasting.

    y = a · b
    da = g · b,  db = g · a
    """
    __slots__ = ()

    def __init__(self, a, b):
        try:
            y = a._data * b._data
        except (AttributeError, ValueError, TypeError):   # a plain operand, or the op's error
            a, b, y = _binary("Mul", operator.mul, a, b)
        _link(self, y, a, b)

    def _back(self, a, b):
        g = self._g
        if a.requires_grad:
            a._accumulate(g * b._data)
        if b.requires_grad:
            b._accumulate(g * a._data)


class Div(NetOp):
    """Elementwise quotient, with broadcasting (division by zero gives ±inf or NaN, as NumPy).

    y = a / b
    da = g / b,  db = −g · y / b
    """
    __slots__ = ()

    def __init__(self, a, b):
        try:
            y = a._data / b._data
        except (AttributeError, ValueError, TypeError):   # a plain operand, or the op's error
            a, b, y = _binary("Div", operator.truediv, a, b)
        _link(self, y, a, b)

    def _back(self, a, b):
        g_over_b = self._g / b._data
        if a.requires_grad:
            a._accumulate(g_over_b)
        if b.requires_grad:
            b._accumulate(-g_over_b * self._data)


class Neg(NetOp):
    """Negation.

    y = −x
    dx = −g
    """
    __slots__ = ()

    def __init__(self, x):
        _link(self, -x._data, x)

    def _back(self, x):
        x._accumulate_elementwise(-self._g)


class Pow(NetOp):
    """Power with a constant exponent p.

    y = x ** p
    dx = g · p · x ** (p − 1)
    """
    __slots__ = ("p",)

    def __init__(self, x, p):
        if isinstance(p, NetVar):
            raise TypeError("Pow: the exponent must be a constant number, not a NetVar")
        self.p = p = checks.in_range("Pow", "the exponent", p)
        _link(self, x._data ** (int(p) if p == int(p) else p), x)

    def _back(self, x):
        p = self.p
        if p == 2.0:
            x._accumulate_elementwise(self._g * (2 * x._data))
        else:
            x._accumulate_elementwise(self._g * (p * x._data ** (p - 1)))


class Exp(NetOp):
    """Exponential.

    y = eˣ
    dx = g · y
    """
    __slots__ = ()

    def __init__(self, x):
        _link(self, backend.array_module(x._data).exp(x._data), x)

    def _back(self, x):
        x._accumulate_elementwise(self._g * self._data)


class Log(NetOp):
    """Natural logarithm (log 0 = −inf and log of a negative number = NaN, as NumPy).

    y = ln x
    dx = g / x
    """
    __slots__ = ()

    def __init__(self, x):
        _link(self, backend.array_module(x._data).log(x._data), x)

    def _back(self, x):
        x._accumulate_elementwise(self._g / x._data)


def _operator(cls, function):
    """``a + b`` (and − × ÷) on a node: ``cls(a, b)``, built without running its constructor.

    When both operands are nodes whose data combine, the node is made with ``object.__new__``
    and filled in by ``_link``: the same node the constructor makes, two Python frames
    cheaper (~0.15 µs, the largest part of a tiny op's forward overhead). Anything else
    (a plain number or array, or operands that do not combine) goes to the constructor,
    which converts the operand or raises the error that names the op.
    """
    new = object.__new__

    def apply(a, b):
        try:
            y = function(a._data, b._data)
        except (AttributeError, ValueError, TypeError):
            return cls(a, b)
        return _link(new(cls), y, a, b)

    apply.__name__ = apply.__qualname__ = f"__{function.__name__}__"
    return apply


def _install_operators():
    """Give NetVar its operators: + − * / @ ** and unary −."""
    NetVar.__add__ = _operator(Add, operator.add)
    NetVar.__radd__ = lambda a, b: Add(b, a)
    NetVar.__sub__ = _operator(Sub, operator.sub)
    NetVar.__rsub__ = lambda a, b: Sub(b, a)
    NetVar.__mul__ = _operator(Mul, operator.mul)
    NetVar.__rmul__ = lambda a, b: Mul(b, a)
    NetVar.__truediv__ = _operator(Div, operator.truediv)
    NetVar.__rtruediv__ = lambda a, b: Div(b, a)
    NetVar.__matmul__ = lambda a, b: Multiply(a, b)
    NetVar.__rmatmul__ = lambda a, b: Multiply(b, a)
    NetVar.__pow__ = lambda a, p: Pow(a, p)
    NetVar.__neg__ = lambda a: Neg(a)
    NetVar.exp = lambda a: Exp(a)
    NetVar.log = lambda a: Log(a)


_install_operators()
