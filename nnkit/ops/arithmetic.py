"""Arithmetic: matrix product, elementwise + − × ÷, negation, powers, exp and log.

Elementwise ops broadcast as NumPy does and sum each gradient back to its input's shape.
A plain operand of + − × ÷ (a Python number or a NumPy float array) stays with the op as its
``constant`` (``c - x`` and ``c / x`` build RSub and RDiv, the operands swapped); other plain
operands become constant nodes of the other operand's dtype.
Notation: inputs a, b (x, w for the matrix product), output y, upstream gradient g.
"""

__all__ = ['Multiply', 'Add', 'Sub', 'Mul', 'Div', 'RSub', 'RDiv', 'Neg', 'Pow', 'Exp', 'Log']
import operator

import numpy

from .. import backend, checks
from ..core import NetOp, NetVar, constant

_ndarray = numpy.ndarray


def _nodes(a, b):
    """Turn a plain number or array operand into a constant of the other operand's dtype."""
    if not isinstance(a, NetVar):
        a = constant(a, b if isinstance(b, NetVar) else None)
    if not isinstance(b, NetVar):
        b = constant(b, a)
    return a, b


def _binary(op, function, a, b, swapped=False):
    """``(a, b, function(a, b))``: the operands as nodes and the value computed from their
    data, with errors naming the op."""
    if not isinstance(a, NetVar) or not isinstance(b, NetVar):
        a, b = _nodes(a, b)
    return a, b, _compute(op, function, a._data, b._data, swapped)


def _compute(op, function, a, b, swapped=False):
    """``function(a, b)`` on arrays (or a number ``b``), with errors naming the op and the
    shapes in the order the user wrote them (``b`` first for ``swapped`` ops: c − x, c / x)."""
    try:
        return function(a, b)
    except ValueError:
        first, second = (b, a) if swapped else (a, b)
        raise ValueError(f"{op}: cannot broadcast {tuple(getattr(first, 'shape', ()))} with "
                         f"{tuple(getattr(second, 'shape', ()))}") from None
    except TypeError:
        backend.check_same_device(op, *((b, a) if swapped else (a, b)))
        raise


def kept(a, b):
    """The plain operand ``b`` as + − × ÷ keep it beside the node ``a``; None when ``b`` is not
    plain (then it becomes a constant node).

    A NumPy float array is kept as it is. A Python number is kept as a 0-d array of ``a``'s dtype
    when that is a NumPy float dtype: the very number NumPy 2 computes with (it casts a Python
    number to the array's dtype), which NumPy combines with an array at the cost of an array
    operand instead of nearly twice that, in the forward pass and again in ``_back``.
    """
    kind = type(b)
    if kind is _ndarray:
        return b if b.dtype.kind == "f" else None
    if kind is float or kind is int:
        data = a._data
        if isinstance(data, _ndarray) and data.dtype.kind == "f":
            return numpy.asarray(b, data.dtype)
        return b
    return None


class _Elementwise(NetOp):
    """+ − × ÷: the value of ``function(a, b)``, broadcast as NumPy does.

    A plain second operand (a number or a NumPy float array, see ``kept``) stays with the op as
    ``constant``: it needs no gradient, so the node has one parent, ``a``, and no constant node
    is made for it.
    """
    __slots__ = ("constant",)
    kept_arrays = ("constant",)
    function = None
    swapped = False           # True for RSub and RDiv: the value is function(b, a)

    def __init__(self, a, b):
        op = type(self).__name__
        c = kept(a, b) if isinstance(a, NetVar) else None
        if c is not None:
            self.constant = c
            super().__init__(_compute(op, self.function, a._data, c, self.swapped), a)
        else:
            a, b, y = _binary(op, self.function, a, b, self.swapped)
            super().__init__(y, a, b)


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
            y = _product(xd, wd)
        except ValueError:
            raise ValueError(f"Multiply: cannot multiply {tuple(xd.shape)} by "
                             f"{tuple(wd.shape)}") from None
        except TypeError:
            backend.check_same_device("Multiply", xd, wd)
            raise
        super().__init__(y, x, w)

    def _back(self, x, w):
        if x.requires_grad:
            x.accumulate(_product(self._g, w._data.swapaxes(-1, -2)))
        if w.requires_grad:
            if x._data.ndim > 2 and w._data.ndim == 2:
                # (..., B, F) @ (F, H): one product over every row of every leading axis
                w.accumulate(x._data.reshape(-1, x._data.shape[-1]).T
                             @ self._g.reshape(-1, self._g.shape[-1]))
            else:
                w.accumulate(x._data.swapaxes(-1, -2) @ self._g)

    def _grads(self, g, x, w):
        return Multiply(g, swap_last(w)), Multiply(swap_last(x), g)


def _product(a, b):
    """``a @ b``; a C-ordered stack of rows (..., B, F) times one matrix (F, H) as one 2-D
    product over every row: one BLAS call, 15-20 % faster than NumPy's call per matrix of the
    stack at (64, 32, 64) @ (64, 64)."""
    if a.ndim > 2 and b.ndim == 2 and a.flags.c_contiguous:
        return (a.reshape(-1, a.shape[-1]) @ b).reshape(a.shape[:-1] + b.shape[-1:])
    return a @ b


class Add(_Elementwise):
    """Elementwise sum (e.g. adding a bias), with broadcasting.

    y = a + b
    da = g,  db = g   (each summed over the axes it was broadcast along)
    """
    __slots__ = ()
    function = operator.add

    def _back(self, a, b=None):
        a.accumulate(self._g)
        if b is not None:
            b.accumulate(self._g)

    def _grads(self, g, a, b=None):
        return (g,) if b is None else (g, g)


class Sub(_Elementwise):
    """Elementwise difference, with broadcasting.

    y = a − b
    da = g,  db = −g
    """
    __slots__ = ()
    function = operator.sub

    def _back(self, a, b=None):
        a.accumulate(self._g)
        if b is not None and b.requires_grad:
            b.accumulate(-self._g)

    def _grads(self, g, a, b=None):
        return (g,) if b is None else (g, -g)


class Mul(_Elementwise):
    """Elementwise product, with broadcasting.

    y = a · b
    da = g · b,  db = g · a
    """
    __slots__ = ()
    function = operator.mul

    def _back(self, a, b=None):
        if a.requires_grad:
            a.accumulate(self._g * (self.constant if b is None else b._data))
        if b is not None and b.requires_grad:
            b.accumulate(self._g * a._data)

    def _grads(self, g, a, b=None):
        if b is None:
            return (g * self.constant,)
        return g * b, g * a


class Div(_Elementwise):
    """Elementwise quotient, with broadcasting (division by zero gives ±inf or NaN, as NumPy).

    y = a / b
    da = g / b,  db = −da · y
    """
    __slots__ = ()
    function = operator.truediv

    def _back(self, a, b=None):
        da = self._g / (self.constant if b is None else b._data)
        a.accumulate(da)
        if b is not None and b.requires_grad:
            b.accumulate(-da * self._data)

    def _grads(self, g, a, b=None):
        if b is None:
            return (g / self.constant,)
        da = g / b
        return da, -da * self


def _subtract_from(a, b):
    return b - a


def _divide_into(a, b):
    return b / a


class RSub(_Elementwise):
    """Elementwise difference, operands swapped: what ``c - x`` builds for a plain ``c``.

    y = b − a
    da = −g,  db = g
    """
    __slots__ = ()
    function = staticmethod(_subtract_from)
    swapped = True

    def _back(self, a, b=None):
        if a.requires_grad:
            a.accumulate(-self._g)
        if b is not None:
            b.accumulate(self._g)

    def _grads(self, g, a, b=None):
        return (-g,) if b is None else (-g, g)


class RDiv(_Elementwise):
    """Elementwise quotient, operands swapped: what ``c / x`` builds for a plain ``c``.

    y = b / a
    da = −g · y / a,  db = g / a
    """
    __slots__ = ()
    function = staticmethod(_divide_into)
    swapped = True

    def _back(self, a, b=None):
        db = self._g / a._data
        if a.requires_grad:
            a.accumulate(-db * self._data)
        if b is not None and b.requires_grad:
            b.accumulate(db)

    def _grads(self, g, a, b=None):
        db = g / a
        return (-db * self,) if b is None else (-db * self, db)


class Neg(NetOp):
    """Negation.

    y = −x
    dx = −g
    """
    __slots__ = ()

    def __init__(self, x):
        super().__init__(-x._data, x)

    def _back(self, x):
        x.accumulate_same_shape(-self._g)

    def _grads(self, g, x):
        return (-g,)


class Pow(NetOp):
    """Power with a constant exponent p.

    y = x ** p
    dx = g · p · x ** (p − 1)     (0 for p = 0, also at x = 0, where the formula is 0·∞)
    """
    __slots__ = ("p",)

    def __init__(self, x, p):
        if isinstance(p, NetVar):
            raise TypeError("Pow: the exponent must be a constant number, not a NetVar")
        self.p = p = checks.in_range("Pow", "the exponent", p)
        super().__init__(x._data ** (int(p) if p == int(p) else p), x)

    def _back(self, x):
        if self.p != 0:           # y = 1 for p = 0: nothing to hand back
            x.accumulate_same_shape(self._g * (self.p * x._data ** (self.p - 1)))

    def _grads(self, g, x):
        if self.p == 0:           # (each derivative lowers p by one and reaches 0: x³ → 6x → 6)
            return (None,)
        return (g * (Pow(x, self.p - 1) * self.p),)


class Exp(NetOp):
    """Exponential.

    y = eˣ
    dx = g · y
    """
    __slots__ = ()

    def __init__(self, x):
        super().__init__(backend.array_module(x._data).exp(x._data), x)

    def _back(self, x):
        x.accumulate_same_shape(self._g * self._data)

    def _grads(self, g, x):
        return (g * self,)


class Log(NetOp):
    """Natural logarithm (log 0 = −inf and log of a negative number = NaN, as NumPy).

    y = ln x
    dx = g / x
    """
    __slots__ = ()

    def __init__(self, x):
        super().__init__(backend.array_module(x._data).log(x._data), x)

    def _back(self, x):
        x.accumulate_same_shape(self._g / x._data)

    def _grads(self, g, x):
        return (g / x,)


def swap_last(x):
    """The node x with its last two axes swapped (a matrix transposed)."""
    axes = list(range(x.ndim))
    axes[-2:] = axes[:-3:-1]
    return x.transpose(*axes)
