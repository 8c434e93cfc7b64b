"""Elementwise math beyond arithmetic: Sqrt, Abs, Clip, Where, Maximum, Minimum, Sin, Cos.

Binary ops broadcast as NumPy does and sum each gradient back to its input's shape; the
elementwise one-input ops hand dx (x's shape and dtype) over with ``accumulate_same_shape``.
Notation: input x (a, b for two inputs), output y, upstream gradient g; [c] is 1 where c holds.
"""

__all__ = ['Sqrt', 'Abs', 'Clip', 'Where', 'Maximum', 'Minimum', 'Sin', 'Cos']
import numpy

from .. import backend, core
from ..core import NetOp, NetVar
from ..dtypes import wide_sum
from ..gradients import BLAS_FLOATS
from ..modes import is_grad_enabled
from .arithmetic import _nodes


def last_sum(a):
    """Σ over the last axis, kept (shape (..., 1)); float16 in float32 (``dtypes.wide_sum``).
    NumPy's sum along a short last axis runs a loop per row, 6× slower than a matrix-vector
    product at (8192, 64) (attention's softmax, LayerNorm), so a C-ordered float32 or float64
    NumPy array is summed as ``a @ ones``, rounded as BLAS rounds a dot product (within a few
    ulps of NumPy's pairwise sum)."""
    n = a.shape[-1] if a.ndim else 0
    if not isinstance(a, numpy.ndarray) or a.dtype not in BLAS_FLOATS or a.ndim < 2 or n < 2 \
            or not a.flags.c_contiguous:
        return wide_sum(a, axis=-1, keepdims=True)
    return (a.reshape(-1, n) @ numpy.ones(n, a.dtype)).reshape(a.shape[:-1] + (1,))


def last_dot(a, b):
    """Σ a·b over the last axis, kept (shape (..., 1)), in one pass without an array of a's
    size (einsum); float16 in float32, as ``last_sum``."""
    wide = {"dtype": numpy.float32} if a.dtype == numpy.float16 else {}
    return backend.array_module(a).einsum("...i,...i->...", a, b, **wide)[..., None]


class Sqrt(NetOp):
    """Square root (√0 has an infinite gradient and negative x gives NaN, as NumPy).

    y = √x
    dx = g / (2y)
    """
    __slots__ = ()

    def __init__(self, x):
        super().__init__(backend.array_module(x._data).sqrt(x._data), x)

    def _back(self, x):
        x.accumulate_same_shape(self._g / (2 * self._data))

    def _grads(self, g, x):
        return (g / (self * 2),)


class Abs(NetOp):
    """Absolute value (``abs(x)``, ``x.abs()``).

    y = |x|
    dx = g · sign(x)    (the subgradient 0 at x = 0)
    """
    __slots__ = ()

    def __init__(self, x):
        super().__init__(backend.array_module(x._data).abs(x._data), x)

    def _back(self, x):
        x.accumulate_same_shape(self._g * backend.array_module(x._data).sign(x._data))

    def _grads(self, g, x):
        return (g * backend.array_module(x._data).sign(x._data),)   # sign: constant a.e.


class Clip(NetOp):
    """x limited to [lo, hi] (``x.clip(lo, hi)``); either bound may be None.

    y = min(max(x, lo), hi)
    dx = g · [lo ≤ x ≤ hi]   (0 outside the range; the bounds themselves pass g, as PyTorch's
         clamp)
    The bounds are constants: numbers, arrays or nodes that need no gradient, broadcast against
    x (a node that requires one is refused: ``Maximum``/``Minimum`` differentiate a bound). A
    bound holding NaN or a lower bound above the upper one raises ValueError (for bounds on
    the GPU only inside detect_anomaly(): checking them there would read them back at every
    call).
    """
    __slots__ = ("lo", "hi")
    kept_arrays = ("lo", "hi")

    def __init__(self, x, lo=None, hi=None):
        if lo is None and hi is None:
            raise ValueError("Clip: give at least one bound (lo or hi)")
        xp = backend.array_module(x._data)
        self.lo = None if lo is None else _bound("lo", lo, x, xp)
        self.hi = None if hi is None else _bound("hi", hi, x, xp)
        low, high = _on_host(lo), _on_host(hi)
        if low is not None and high is not None and (low > high).any():
            raise ValueError(f"Clip: the lower bound {lo} exceeds the upper bound {hi}")
        y = x._data
        if lo is not None:
            y = xp.maximum(y, self.lo)
        if hi is not None:
            y = xp.minimum(y, self.hi)
        super().__init__(y, x)

    def _back(self, x):
        inside = True
        if self.lo is not None:
            inside = x._data >= self.lo
        if self.hi is not None:
            inside = inside & (x._data <= self.hi)
        x.accumulate(self._g * inside)

    def _grads(self, g, x):
        inside = x._data == self._data      # lo ≤ x ≤ hi exactly where y = x; constant a.e.
        return (g * inside.astype(x._data.dtype),)


def _on_host(bound):
    """A bound as a NumPy array to validate, or None when there is none to check: no bound, or
    a bound on the GPU outside detect_anomaly() (reading it back would cost a copy per call)."""
    bound = bound.data if isinstance(bound, NetVar) else bound
    if bound is None:
        return None
    if hasattr(bound, "__cuda_array_interface__"):
        return backend.to_cpu(bound) if core.anomaly_mode() else None
    return numpy.asarray(bound)


def _bound(name, value, x, xp):
    """A bound as an array of x's dtype; refuses what is not a number or array, NaN, and a
    node that needs a gradient while gradients are recorded (a constant bound never gives it
    one)."""
    if isinstance(value, NetVar) and value.requires_grad and is_grad_enabled():
        which = "Maximum(x, lo)" if name == "lo" else "Minimum(x, hi)"
        raise ValueError(f"Clip: {name} ({value._describe()}) requires a gradient, but Clip's "
                         f"bounds are constants and get none; use nn.{which} to differentiate "
                         f"the bound, or give {name}.detach()")
    data = value.data if isinstance(value, NetVar) else value
    try:
        bound = xp.asarray(data, dtype=x._data.dtype)
    except (TypeError, ValueError):
        raise TypeError(f"Clip: {name} must be a number or an array, got "
                        f"{type(data).__name__}") from None
    host = _on_host(data)
    if host is not None and numpy.isnan(host.astype(float)).any():
        raise ValueError(f"Clip: {name} holds NaN")
    try:
        numpy.broadcast_shapes(bound.shape, x._data.shape)
    except ValueError:
        raise ValueError(f"Clip: {name} of shape {tuple(bound.shape)} does not broadcast against "
                         f"x of shape {tuple(x.shape)}") from None
    return bound


class Where(NetOp):
    """Choose elementwise between a and b, as ``numpy.where(cond, a, b)``.

    y = a where cond else b
    da = g · [cond],  db = g · [not cond]   (each summed back to its input's shape)
    cond is a boolean (or 0/1) array or NetVar and is not differentiated (other values raise
    ValueError; on the GPU inside detect_anomaly()); a and b may be nodes, numbers or arrays,
    and all three broadcast together.
    """
    __slots__ = ("cond",)
    kept_arrays = ("cond",)

    def __init__(self, cond, a, b):
        a, b = _nodes(a, b)
        xp = backend.array_module(a._data)
        cond = xp.asarray(cond._data if isinstance(cond, NetVar) else cond)
        if cond.dtype != bool and (xp is numpy or core.anomaly_mode()):
            bad = (cond != 0) & (cond != 1)
            if bad.any():
                raise ValueError(f"Where: cond must hold booleans or 0/1, got "
                                 f"{float(cond[bad].reshape(-1)[0]):g}")
        self.cond = cond if cond.dtype == bool else cond != 0
        try:
            y = xp.where(self.cond, a._data, b._data)
        except ValueError:
            raise ValueError(f"Where: cannot broadcast cond of shape {tuple(self.cond.shape)}, "
                             f"a of shape {tuple(a.shape)} and b of shape {tuple(b.shape)}") \
                from None
        super().__init__(y, a, b)

    def _back(self, a, b):
        xp = backend.array_module(self._g)
        if a.requires_grad:
            a.accumulate(xp.where(self.cond, self._g, 0))
        if b.requires_grad:
            b.accumulate(xp.where(self.cond, 0, self._g))

    def _grads(self, g, a, b):
        return (Where(self.cond, g, 0.0) if a.requires_grad else None,
                Where(self.cond, 0.0, g) if b.requires_grad else None)


class _Pick(NetOp):
    """Shared by Maximum and Minimum: the chosen input gets g, ties split it in halves."""
    __slots__ = ()
    pick = None

    def __init__(self, a, b):
        a, b = _nodes(a, b)
        xp = backend.array_module(a._data)
        try:
            y = getattr(xp, self.pick)(a._data, b._data)
        except ValueError:
            raise ValueError(f"{type(self).__name__}: cannot broadcast a of shape "
                             f"{tuple(a.shape)} with b of shape {tuple(b.shape)}") from None
        super().__init__(y, a, b)

    def _back(self, a, b):
        share = ((a._data == self._data).astype(self._g.dtype)           # [a = y] − ½[a = b]
                 - 0.5 * (a._data == b._data).astype(self._g.dtype))
        if a.requires_grad:
            a.accumulate(self._g * share)
        if b.requires_grad:
            b.accumulate(self._g * (1 - share))

    def _grads(self, g, a, b):
        dtype = g._data.dtype       # the shares are constant a.e.
        share = (a._data == self._data).astype(dtype) - 0.5 * (a._data == b._data).astype(dtype)
        return (g * share if a.requires_grad else None,
                g * (1 - share) if b.requires_grad else None)


class Maximum(_Pick):
    """Elementwise larger of two nodes, with broadcasting, as ``numpy.maximum``.

    y = max(a, b)
    da = g · ([a > b] + ½[a = b]),  db = g · ([b > a] + ½[a = b])   (ties split evenly)
    """
    __slots__ = ()
    pick = "maximum"


class Minimum(_Pick):
    """Elementwise smaller of two nodes, with broadcasting, as ``numpy.minimum``.

    y = min(a, b)
    da = g · ([a < b] + ½[a = b]),  db = g · ([b < a] + ½[a = b])   (ties split evenly)
    """
    __slots__ = ()
    pick = "minimum"


class Sin(NetOp):
    """Sine.

    y = sin x
    dx = g · cos x
    """
    __slots__ = ()

    def __init__(self, x):
        super().__init__(backend.array_module(x._data).sin(x._data), x)

    def _back(self, x):
        x.accumulate_same_shape(self._g * backend.array_module(x._data).cos(x._data))

    def _grads(self, g, x):
        return (g * Cos(x),)


class Cos(NetOp):
    """Cosine.

    y = cos x
    dx = −g · sin x
    """
    __slots__ = ()

    def __init__(self, x):
        super().__init__(backend.array_module(x._data).cos(x._data), x)

    def _back(self, x):
        x.accumulate_same_shape(-self._g * backend.array_module(x._data).sin(x._data))

    def _grads(self, g, x):
        return (-g * Sin(x),)
