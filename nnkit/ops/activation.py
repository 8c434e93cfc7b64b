"""Activations: elementwise nonlinearities and the softmax along an axis.

Notation: input x, output y, upstream gradient g; [c] is 1 where c holds, else 0.
Each op but SoftMax and LogSoftmax is elementwise; every dx has x's shape and dtype, so it goes
in with ``accumulate_same_shape``.

Also the array helpers that Attention shares with SoftMax: ``boolean_mask`` (a mask argument
checked and moved to the data's device) and ``softmax`` (the masked softmax of an array).

Each op's x defaults to a placeholder (``hints.no_input``) that costs nothing when x is given:
``nn.ReLU()``, PyTorch's way of making a layer, then says to pass the class ``nn.ReLU``. An
argument written where x goes (``nn.LReLU(0.2)``) fails the first read of ``x._data``, whose
``try`` (free when nothing is raised) turns it into ``hints.not_a_node``'s TypeError: the op's
arguments, and the function to put in ``nn.layers.Sequential``.
"""

__all__ = ['ReLU', 'LReLU', 'Sigmoid', 'Tanh', 'SoftMax', 'Softmax', 'LogSoftmax', 'ELU', 'SELU',
           'Softplus', 'GELU', 'SiLU', 'Swish', 'HardTanh']
import numpy

from .. import backend, checks
from ..core import NetOp, NetVar
from ..dtypes import wide, wide_sum
from ..hints import no_input, not_a_node
from .math import Where, last_sum
from .shape import keyword_error, narrowed, normalize_axis, widened


def _max(op, x, axis):
    """The max of the array x along ``axis`` (kept), with an error naming the op when that axis
    is empty."""
    try:
        return x.max(axis=axis, keepdims=True)
    except (ValueError, TypeError):
        raise _max_refused(op, x, axis) from None


def _max_refused(op, x, axis):
    """The error for a max that NumPy refused: the axis is not one of x's (the default -1 is
    checked only here, when NumPy refuses it), or it is empty."""
    axis = _axis(op, axis, x)
    where = "last axis" if axis == x.ndim - 1 else f"axis {axis}"
    return ValueError(f"{op}: x of shape {tuple(x.shape)} has an empty {where}")


def _axis(op, axis, x):
    """``axis`` as a non-negative axis of x, or refused naming the op."""
    return normalize_axis(op, axis, x.ndim, f"x of shape {tuple(x.shape)}")


def boolean_mask(op, mask, shape, what, xp):
    """``mask`` (a NetVar or an array of booleans, True = keep) as an array of ``xp`` (NumPy or
    CuPy) that broadcasts to ``shape`` without enlarging it; ``what`` names the array it masks in
    the errors (e.g. "x of shape (2, 3)").

    TypeError for a mask that is not boolean (a 0/1 float mask is ambiguous: compare it, e.g.
    ``mask > 0``); ValueError for one that does not broadcast to ``shape``. A NumPy mask for CuPy
    data is moved to the device; a CuPy mask for NumPy data is refused.
    """
    data = mask._data if isinstance(mask, NetVar) else mask
    if not (hasattr(data, "shape") and hasattr(data, "dtype")):
        data = numpy.asarray(data)
    if data.dtype != bool:
        hint = ""
        if isinstance(mask, NetVar):
            hint = ("; a NetVar made from a boolean array holds floats (nnkit's dtype policy): "
                    "pass the boolean array itself, or NetVar(mask, dtype=bool)")
        raise TypeError(f"{op}: mask of shape {tuple(data.shape)} and dtype {data.dtype} must "
                        f"be boolean (True = keep); compare a 0/1 mask to get one (mask > 0), "
                        f"or build it with nnkit.sequence_mask{hint}")
    if backend.array_module(data) is not xp:
        if xp is numpy:
            raise ValueError(f"{op}: mask of shape {tuple(data.shape)} lives on "
                             f"{backend.device_of(data)} and the data on cpu; build the mask "
                             "where the data is")
        data = xp.asarray(data)
    try:
        fits = numpy.broadcast_shapes(tuple(data.shape), tuple(shape)) == tuple(shape)
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"{op}: mask of shape {tuple(data.shape)} does not broadcast to "
                         f"{what}")
    return data


def softmax(x, axis=-1, mask=None, overwrite=False):
    """The softmax of the array ``x`` along ``axis``, shifted by the max for stability.

    Where the boolean ``mask`` (broadcastable to x) is False the result is exactly 0 (for finite
    x there: −inf is added, so a NaN or +inf under the mask still shows as NaN), and a slice with
    nothing kept is all 0 (not 0/0 = NaN). With ``overwrite=True`` x's own buffer
    becomes the result (Attention computes its weights in its scores' buffer).
    """
    xp = backend.array_module(x)
    if mask is not None:
        # −inf added where the mask is False (a bias of the mask's shape, broadcast: five times
        # cheaper than writing through a broadcast mask), as PyTorch's attention adds its mask
        bias = xp.where(mask, 0.0, -numpy.inf)
        if x.dtype.kind == "f":
            bias = bias.astype(x.dtype, copy=False)
        if overwrite:
            x += bias
        else:
            x = x + bias
            overwrite = True
    top = x.max(axis=axis, keepdims=True)
    if mask is not None:
        top[top == -xp.inf] = 0         # nothing kept: −inf − (−inf) would be NaN
    e = xp.subtract(x, top, out=x) if overwrite else x - top
    xp.exp(e, out=e)
    total = _sum(e, axis)
    if mask is not None:
        total[total == 0] = 1           # nothing kept: 0 / 1 = 0, not 0 / 0
    e /= total
    return e


def _sum(a, axis):
    """Σ over ``axis``, kept; over the last axis through BLAS (``math.last_sum``); float16 in
    float32 (``dtypes.wide_sum``: a long axis summed in float16 stops growing at 2048)."""
    return last_sum(a) if axis in (-1, a.ndim - 1) else wide_sum(a, axis=axis, keepdims=True)


def _summed_like(a, axis):
    """Σ over ``axis``, kept, in ``a``'s dtype (float16 accumulated in float32)."""
    return wide_sum(a, axis=axis, keepdims=True).astype(a.dtype, copy=False)


def sigmoid(x, xp):
    """σ(x) = 1 / (1 + e^−x) of an array, without overflow for any |x|."""
    e = xp.exp(-xp.abs(x))          # in (0, 1]: never overflows
    return xp.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _where(condition, x):
    """The 0/1 array of ``condition`` in x's dtype: which branch of a piecewise op is taken, a
    constant in ``_grads`` (its derivative is 0 almost everywhere)."""
    return condition.astype(x._data.dtype)


class ReLU(NetOp):
    """Rectified linear unit.

    y = max(x, 0)
    dx = g · [x > 0]
    """
    __slots__ = ()

    def __init__(self, x=no_input("ReLU")):
        try:
            xp = backend.array_module(x._data)
        except AttributeError:      # nn.ReLU(True): an argument where the node goes
            raise not_a_node(ReLU, x) from None
        super().__init__(xp.maximum(x._data, 0), x)

    def _back(self, x):
        x.accumulate_same_shape(self._g * (x._data > 0))

    def _grads(self, g, x):
        return (g * _where(x._data > 0, x),)


class LReLU(NetOp):
    """Leaky ReLU with slope s for negative inputs.

    y = x if x > 0 else s · x
    dx = g if x > 0 else s · g
    """
    __slots__ = ("s",)

    def __init__(self, x=no_input("LReLU"), s=0.01):
        try:
            xp = backend.array_module(x._data)
        except AttributeError:      # nn.LReLU(0.2): an argument where the node goes
            raise not_a_node(LReLU, x, s) from None
        self.s = s = checks.in_range("LReLU", "the slope s", s)
        super().__init__(xp.where(x._data > 0, x._data, x._data * s), x)

    def _back(self, x):
        xp = backend.array_module(x._data)
        x.accumulate_same_shape(xp.where(x._data > 0, self._g, self._g * self.s))

    def _grads(self, g, x):
        xp = backend.array_module(x._data)
        return (g * xp.where(x._data > 0, 1, self.s).astype(x._data.dtype),)


class Sigmoid(NetOp):
    """Logistic sigmoid, computed without overflow for any |x|.

    y = 1 / (1 + e^−x)
    dx = g · y · (1 − y)
    """
    __slots__ = ()

    def __init__(self, x=no_input("Sigmoid")):
        try:
            xd = x._data
        except AttributeError:      # nn.Sigmoid(True): an argument where the node goes
            raise not_a_node(Sigmoid, x) from None
        super().__init__(sigmoid(xd, backend.array_module(xd)), x)

    def _back(self, x):
        x.accumulate_same_shape(self._g * self._data * (1 - self._data))

    def _grads(self, g, x):
        return (g * (self * (1 - self)),)


class Tanh(NetOp):
    """Hyperbolic tangent.

    y = tanh(x)
    dx = g · (1 − y²) = g − g·y·y
    """
    __slots__ = ()

    def __init__(self, x=no_input("Tanh")):
        try:
            xd = x._data
        except AttributeError:      # nn.Tanh(True): an argument where the node goes
            raise not_a_node(Tanh, x) from None
        super().__init__(backend.array_module(xd).tanh(xd), x)

    def _back(self, x):
        # The second form: with no Python number in it, NumPy skips converting one, which on
        # a tiny array costs more than the arithmetic (Tanh is the most used activation).
        x.accumulate_same_shape(self._g - self._g * self._data * self._data)

    def _grads(self, g, x):
        return (g - g * (self * self),)


def _softmax_options(op, xd, axis, mask, xp):
    """``(axis, mask)`` of SoftMax and LogSoftmax, checked against the data ``xd`` (errors name
    ``op``): the mask as a boolean array of ``xp`` (or None)."""
    axis = _axis(op, axis, xd)
    if mask is not None:
        mask = boolean_mask(op, mask, xd.shape, f"x of shape {tuple(xd.shape)}", xp)
    return axis, mask


class SoftMax(NetOp):
    """Softmax along ``axis`` (the last by default), shifted by the max for stability: each
    slice along the axis sums to 1.

    y = e^(x − max x) / Σ e^(x − max x)     (max and Σ along the axis, over the kept entries)
    dx = y · (g·m − Σ g·m·y)                 (the full Jacobian-vector product)
    ``mask``: booleans broadcastable to x's shape, True = keep (m = 1 there, 0 elsewhere; m = 1
    everywhere without a mask). A masked entry gets y = 0 exactly and dx = 0 (x must be finite
    there: −inf is added to it, as PyTorch's attention adds its mask); a slice with nothing kept
    gives y = 0 and dx = 0 (not NaN), so its gradient is zero.
    """
    __slots__ = ("axis", "mask")
    kept_arrays = ("mask",)

    def __init__(self, x=no_input("SoftMax"), axis=-1, mask=None, **keywords):
        if keywords:        # PyTorch's dim= and the like, answered with nnkit's spelling
            raise keyword_error(type(self).__name__, keywords)
        try:
            xd = x._data
        except AttributeError:      # nn.SoftMax(1): an argument where the node goes
            raise not_a_node(SoftMax, x, axis, mask) from None
        xp = backend.array_module(xd)
        if axis != -1 or mask is not None:     # _max checks the default axis, when it fails
            axis, mask = _softmax_options("SoftMax", xd, axis, mask, xp)
        self.axis, self.mask = axis, mask
        if mask is None:
            try:                # _max inline: a call is a visible part of a tiny softmax's cost
                top = xd.max(axis=axis, keepdims=True)
            except (ValueError, TypeError):
                raise _max_refused("SoftMax", xd, axis) from None
            y = xp.exp(xd - top)
            y /= _sum(y, axis)
        else:
            if xd.shape[axis] == 0:
                raise _max_refused("SoftMax", xd, axis)
            y = softmax(xd, axis, mask)
        super().__init__(y, x)

    def _back(self, x):
        g = self._g
        if self.mask is not None:       # a masked y is the constant 0: its g reaches nothing
            g = backend.array_module(g).where(self.mask, g, 0)
        x.accumulate_same_shape(self._data * (g - _summed_like(g * self._data, self.axis)))

    def _grads(self, g, x):
        if self.mask is not None:       # as in _back: not g · m, which is NaN for an infinite g
            g = Where(self.mask, g, 0.0)
        return (self * (g - (g * self).sum(self.axis, keepdims=True)),)


Softmax = SoftMax


class LogSoftmax(NetOp):
    """Log of the softmax along ``axis`` (the last by default), computed stably (no log of a
    rounded 0).

    y = x − max x − ln Σ e^(x − max x)     (max and Σ along the axis, over the kept entries)
    dx = g·m − e^y · Σ g·m
    ``mask``: booleans broadcastable to x's shape, True = keep (m as in SoftMax). A masked entry
    gets y = −inf and dx = 0; a slice with nothing kept is −inf everywhere and its dx is 0 (no
    NaN in the value's finite entries or in any gradient).
    """
    __slots__ = ("axis", "mask")
    kept_arrays = ("mask",)

    def __init__(self, x=no_input("LogSoftmax"), axis=-1, mask=None, **keywords):
        if keywords:        # PyTorch's dim= and the like, answered with nnkit's spelling
            raise keyword_error(type(self).__name__, keywords)
        try:
            xd = x._data
        except AttributeError:      # nn.LogSoftmax(1): an argument where the node goes
            raise not_a_node(LogSoftmax, x, axis, mask) from None
        xp = backend.array_module(xd)
        if axis != -1 or mask is not None:     # _max checks the default axis, when it fails
            axis, mask = _softmax_options("LogSoftmax", xd, axis, mask, xp)
        self.axis, self.mask = axis, mask
        if mask is None:
            try:                # _max inline, as in SoftMax
                y = xd.max(axis=axis, keepdims=True)
            except (ValueError, TypeError):
                raise _max_refused("LogSoftmax", xd, axis) from None
            y = xd - y
            total = _sum(xp.exp(y), axis)
        else:
            y = xp.where(mask, xd, -xp.inf)
            top = _max("LogSoftmax", y, axis)
            top[top == -xp.inf] = 0             # nothing kept: −inf − (−inf) would be NaN
            y -= top
            total = _sum(xp.exp(y), axis)
            total[total == 0] = 1               # nothing kept: ln 1 = 0, and y stays −inf
        try:
            y -= xp.log(total)                  # in place: y is a fresh float array...
        except TypeError:                       # ...unless x holds integers (ArgMax's output)
            y = y - xp.log(total)
        super().__init__(y, x)

    def _back(self, x):
        xp = backend.array_module(self._data)
        g = self._g
        if self.mask is not None:       # a masked y is the constant −inf: its g reaches nothing
            g = xp.where(self.mask, g, 0)
        x.accumulate_same_shape(g - xp.exp(self._data) * _summed_like(g, self.axis))

    def _grads(self, g, x):
        if self.mask is not None:       # as in _back: not g · m, which is NaN for an infinite g
            g = Where(self.mask, g, 0.0)
        # e^y is the softmax (exactly 0 under the mask), as a node: its own derivative counts
        return (g - self.exp() * g.sum(self.axis, keepdims=True),)


class ELU(NetOp):
    """Exponential linear unit with scale α for negative inputs.

    y = x if x > 0 else α · (eˣ − 1)
    dx = g if x > 0 else g · α · eˣ    (= g · (y + α), which cancels to 0 for x < −17 in
                                        float32)
    """
    __slots__ = ("alpha",)
    scale = 1.0       # λ of SELU

    def __init__(self, x=no_input("ELU"), alpha=1.0):
        try:
            xp = backend.array_module(x._data)
        except AttributeError:      # nn.ELU(1.0): an argument where the node goes
            raise not_a_node(ELU, x, alpha) from None
        self.alpha = alpha = checks.in_range("ELU", "alpha", alpha)
        negative = alpha * xp.expm1(xp.minimum(x._data, 0))     # no overflow for large x
        super().__init__(self.scale * xp.where(x._data > 0, x._data, negative), x)

    def _back(self, x):
        xp = backend.array_module(x._data)
        below = self.scale * self.alpha * xp.exp(xp.minimum(x._data, 0))
        x.accumulate_same_shape(self._g * xp.where(x._data > 0, self.scale, below))

    def _grads(self, g, x):
        # dy/dx = λ for x > 0, λα·eˣ below (eˣ of x where x ≤ 0 and of 0 elsewhere: neither
        # overflow nor x = inf times 0)
        positive = _where(x._data > 0, x)
        below = Where(x._data > 0, 0.0, x).exp() * (self.scale * self.alpha)
        return (g * (below * (1 - positive) + self.scale * positive),)


class SELU(ELU):
    """Scaled ELU with the self-normalising constants λ ≈ 1.0507, α ≈ 1.6733.

    y = λ · (x if x > 0 else α · (eˣ − 1))
    dx = g · λ if x > 0 else g · λα · eˣ
    """
    __slots__ = ()
    scale = 1.0507009873554804934193349852946

    def __init__(self, x=no_input("SELU")):
        try:
            x._data             # read here: ELU's error would name ELU and its alpha
        except AttributeError:      # nn.SELU(True): an argument where the node goes
            raise not_a_node(SELU, x) from None
        super().__init__(x, alpha=1.6732632423543772848170429916717)


class Softplus(NetOp):
    """Smooth ReLU, computed without overflow for any |x|.

    y = ln(1 + eˣ) = max(x, 0) + ln(1 + e^−|x|)
    dx = g · σ(x)
    """
    __slots__ = ()

    def __init__(self, x=no_input("Softplus")):
        try:
            xp = backend.array_module(x._data)
        except AttributeError:      # nn.Softplus(1.0): an argument where the node goes
            raise not_a_node(Softplus, x) from None
        super().__init__(xp.maximum(x._data, 0) + xp.log1p(xp.exp(-xp.abs(x._data))), x)

    def _back(self, x):
        x.accumulate_same_shape(self._g * sigmoid(x._data, backend.array_module(x._data)))

    def _grads(self, g, x):
        return (g * Sigmoid(x),)


class GELU(NetOp):
    """Gaussian error linear unit, tanh approximation (PyTorch's ``gelu(approximate='tanh')``).

    y = ½ x (1 + tanh u),   u = c · (x + k x³),   c = √(2/π), k = 0.044715
    computed as y = x · s = x / (1 + e),  s = σ(2u) = ½(1 + tanh u),  e = exp(−2u) (the same
    function; an exponential costs half a tanh, and nothing cancels where 1 + tanh u would), and
    dx = g · s · (1 + x · (1 − s) · 2c (1 + 3k x²)),   1 − s = 1 / (1 + 1/e) (nothing cancels)
    """
    __slots__ = ("e",)
    c = 0.7978845608028654        # √(2/π)
    k = 0.044715

    def __init__(self, x=no_input("GELU")):
        try:
            xp = backend.array_module(x._data)
        except AttributeError:      # nn.GELU('tanh'): an argument where the node goes
            raise not_a_node(GELU, x) from None
        xd = wide(x._data)      # float16 x³ overflows at |x| > 40, x² (backward) at |x| > 256
        # In place, in the two arrays the op keeps (e and y): on an FFN's activations each
        # fresh temporary is megabytes, whose pages the allocator maps anew at every call.
        # (Each array is made with out=: an operator on a 0-d array gives a scalar.)
        e = xp.multiply(xd, xd, out=xp.empty_like(xd))
        e *= -2 * self.c * self.k
        e -= 2 * self.c
        e *= xd                             # −2u
        with numpy.errstate(over="ignore"):     # x ≪ 0: e = inf, y = x / inf = −0
            self.e = xp.exp(e, out=e)
        y = xp.add(e, 1, out=xp.empty_like(e))
        y = xp.divide(xd, y, out=y)
        super().__init__(y.astype(x._data.dtype, copy=False), x)

    def _back(self, x):
        xp = backend.array_module(x._data)
        xd, e = wide(x._data), self.e
        # slope = s · (1 + x·(1 − s)·2c(1 + 3k x²)), s = 1 / (1 + e), in two arrays (on an
        # FFN's activations each fresh one is megabytes of pages mapped anew)
        other = xp.multiply(xd, xd, out=xp.empty_like(e))
        other *= 6 * self.c * self.k
        other += 2 * self.c
        other *= xd
        with numpy.errstate(divide="ignore"):   # x ≫ 0: e = 0, 1/e = inf, 1 − s = 0
            slope = xp.divide(1, e, out=xp.empty_like(e))
        slope += 1
        slope = xp.divide(1, slope, out=slope)  # 1 − s
        slope *= other
        slope += 1
        s = xp.add(e, 1, out=other)
        slope /= s                              # · s = / (1 + e)
        if slope.dtype != x._data.dtype:         # float16: the slope computed in float32
            slope = slope.astype(x._data.dtype)
        slope *= self._g
        x.accumulate_same_shape(slope)

    def _grads(self, g, x):
        xw = widened(x)             # float16: x³ in float32, as the forward pass
        t = Tanh((xw + xw * xw * xw * self.k) * self.c)     # t as a node, not the stored array
        slope = 0.5 * (1 + t) + 0.5 * xw * (1 - t * t) * self.c * (1 + 3 * self.k * xw * xw)
        return (g * narrowed(slope, x._data.dtype),)


class SiLU(NetOp):
    """Sigmoid-weighted linear unit, also called swish (``Swish`` is the same op).

    y = x · s,   s = σ(x)
    dx = g · s · (1 + x · (1 − s))
    """
    __slots__ = ("s",)

    def __init__(self, x=no_input("SiLU")):
        try:
            xd = x._data
        except AttributeError:      # nn.SiLU(True): an argument where the node goes
            raise not_a_node(SiLU, x) from None
        self.s = sigmoid(xd, backend.array_module(xd))
        super().__init__(x._data * self.s, x)

    def _back(self, x):
        x.accumulate_same_shape(self._g * (self.s * (1 + x._data * (1 - self.s))))

    def _grads(self, g, x):
        s = Sigmoid(x)                                  # s as a node, not the stored array
        return (g * (s * (1 + x * (1 - s))),)


Swish = SiLU


class HardTanh(NetOp):
    """x clipped to [lo, hi] (default [−1, 1]), a piecewise-linear tanh.

    y = min(max(x, lo), hi)
    dx = g · [lo < x < hi]   (0 at and beyond the bounds, as PyTorch's hardtanh)
    lo and hi are numbers (±inf allowed) with lo < hi.
    """
    __slots__ = ("lo", "hi")
    kept_arrays = ("lo", "hi")

    def __init__(self, x=no_input("HardTanh"), lo=-1.0, hi=1.0):
        try:
            xd = x._data
        except AttributeError:      # nn.HardTanh(0.0, 6.0): an argument where the node goes
            raise not_a_node(HardTanh, x, lo, hi) from None
        lo, hi = checks.number("HardTanh", "lo", lo), checks.number("HardTanh", "hi", hi)
        if not lo < hi:
            raise ValueError(f"HardTanh: lo ({lo:g}) must be below hi ({hi:g})")
        self.lo, self.hi = lo, hi
        super().__init__(backend.array_module(xd).clip(xd, lo, hi), x)

    def _back(self, x):
        x.accumulate_same_shape(self._g * ((x._data > self.lo) & (x._data < self.hi)))

    def _grads(self, g, x):
        return (g * _where((x._data > self.lo) & (x._data < self.hi), x),)
