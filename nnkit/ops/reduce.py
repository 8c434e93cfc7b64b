"""Reductions: sums, means, extremes, log-sum-exp, variance, the L2 norm and the cosine
similarity over axes.

Notation: input x, output y, upstream gradient g; "expand(g)" puts back the reduced axes so
that g broadcasts against x.
``axis`` is an int or a tuple of ints (negative ones count from the end) or None for every
axis; ``axis=()`` reduces over no axis, as in NumPy (PyTorch reads an empty dim as every axis).
The NetVar methods (``x.sum(axis, keepdims)``...) refuse PyTorch's ``dim=`` and ``keepdim=``
with nnkit's spelling.
"""

__all__ = ['Sum', 'Mean', 'Max', 'Min', 'LogSumExp', 'Var', 'Norm', 'CosineSimilarity', 'ArgMax']
import numpy

from .. import backend, checks
from ..core import NetOp
from ..dtypes import wide, wide_sum
from ..hints import AppliedOp
from .arithmetic import _nodes
from .shape import keyword_error, narrowed, normalize_axes, normalize_axis, widened


def reduced_axes(op, x, axis, keepdims):
    """``(axes, keepdims)`` of a reduction of x: the axes a sorted tuple of non-negative axes
    (every axis when ``axis`` is None), keepdims a bool; errors name the op and x's shape.

    keepdims must be a bool: ``x.sum(0, 1)`` would otherwise sum axis 0 alone and keep it.
    """
    ndim = x._data.ndim
    if keepdims is not False and keepdims is not True and not isinstance(keepdims, numpy.bool_):
        raise TypeError(f"{op}: keepdims must be True or False, got {keepdims!r} (to reduce "
                        "several axes give them as a tuple: axis=(0, 1))")
    if axis is None:
        return tuple(range(ndim)), bool(keepdims)
    axes = normalize_axes(op, axis, ndim, f"an input of {ndim} dimensions, x of shape "
                          f"{tuple(x.shape)}", expected="an int, a tuple of ints or None")
    if len(set(axes)) != len(axes):
        raise ValueError(f"{op}: repeated axis in {axis} for x of shape {tuple(x.shape)}")
    return tuple(sorted(axes)), bool(keepdims)


def expand_reduced(g, axes, keepdims, shape):
    """Broadcast the gradient of a reduction back to the input's ``shape``."""
    xp = backend.array_module(g)
    if not keepdims:
        g = g.reshape(tuple(1 if i in axes else n for i, n in enumerate(shape)))
    return xp.broadcast_to(g, shape)


class Sum(NetOp):
    """Sum over ``axis`` (all axes when None), as ``numpy.sum`` (float16 accumulated in float32).

    y = Σ_axis x
    dx = expand(g)   (g copied along the summed axes)
    """
    __slots__ = ("axes", "keepdims")

    def __init__(self, x, axis=None, keepdims=False, **keywords):
        if keywords:        # PyTorch's dim= and the like, answered with nnkit's spelling
            raise keyword_error(type(self).__name__, keywords)
        self.axes, self.keepdims = reduced_axes("Sum", x, axis, keepdims)
        xp = backend.array_module(x._data)
        # (float16 accumulated in float32, as PyTorch does: along a strided axis NumPy adds
        # in float16, where 2048 + 1 = 2048)
        y = xp.asarray(wide_sum(x._data, axis=self.axes, keepdims=self.keepdims))
        super().__init__(y.astype(numpy.float16) if x._data.dtype == numpy.float16 else y, x)

    def _back(self, x):
        x.accumulate(_spread(self, self._g, x))

    def _grads(self, g, x):
        return (spread(self, g, x),)


class Mean(NetOp):
    """Mean over ``axis`` (all axes when None), as ``numpy.mean``.

    y = Σ_axis x / n     (n: number of elements averaged)
    dx = expand(g) / n
    """
    __slots__ = ("axes", "keepdims")

    def __init__(self, x, axis=None, keepdims=False, **keywords):
        if keywords:        # PyTorch's dim= and the like, answered with nnkit's spelling
            raise keyword_error(type(self).__name__, keywords)
        self.axes, self.keepdims = reduced_axes("Mean", x, axis, keepdims)
        _check_not_empty("Mean", x, self.axes)
        xp = backend.array_module(x._data)
        super().__init__(xp.asarray(x._data.mean(axis=self.axes, keepdims=self.keepdims)), x)

    def _back(self, x):
        # (float16: divided in float32, where a count above 65504 is not inf)
        x.accumulate(_spread(self, wide(self._g) / _count(x._data.shape, self.axes), x))

    def _grads(self, g, x):
        return (spread(self, widened(g), x) / _count(x._data.shape, self.axes),)


def _check_not_empty(op, x, axes):
    """Raise when the reduction runs over no element at all (its value would be undefined)."""
    if _count(x._data.shape, axes) == 0:
        raise ValueError(f"{op}: x of shape {tuple(x.shape)} has no element along the "
                         f"reduced axes {axes}")


def _count(shape, axes):
    n = 1
    for a in axes:
        n *= shape[a]
    return n


def _spread(node, a, x):
    """An array shaped like the reduction ``node``'s output, broadcast back to x's shape."""
    return expand_reduced(a, node.axes, node.keepdims, x._data.shape)


def spread(node, g, x):
    """``_spread`` for a node ``g`` (in ``_grads``): the reduced axes put back, broadcast to x."""
    if not node.keepdims:
        g = g.reshape(tuple(1 if i in node.axes else n for i, n in enumerate(x.shape)))
    return g.broadcast_to(x.shape)


class _Extreme(NetOp):
    """Shared by Max and Min: the reduction and the tie-splitting backward."""
    __slots__ = ("axes", "keepdims")
    reduce = None

    def __init__(self, x, axis=None, keepdims=False, **keywords):
        if keywords:        # PyTorch's dim= and the like, answered with nnkit's spelling
            raise keyword_error(type(self).__name__, keywords)
        name = type(self).__name__
        self.axes, self.keepdims = reduced_axes(name, x, axis, keepdims)
        empty = [a for a in self.axes if x._data.shape[a] == 0]
        if empty:       # the extreme of no values (reducing other axes of an empty x is fine)
            raise ValueError(f"{name}: axis {empty[0]} of x of shape {tuple(x.shape)} has no "
                             "values to take the extreme of")
        xp = backend.array_module(x._data)
        super().__init__(xp.asarray(getattr(x._data, self.reduce)(axis=self.axes,
                                                                 keepdims=self.keepdims)), x)

    def _back(self, x):
        hit = (x._data == _spread(self, self._data, x)).astype(x._data.dtype)
        share = hit / hit.sum(axis=self.axes, keepdims=True)
        x.accumulate(share * _spread(self, self._g, x))

    def _grads(self, g, x):
        hit = (x._data == _spread(self, self._data, x)).astype(x._data.dtype)
        share = hit / hit.sum(axis=self.axes, keepdims=True)     # constant a.e.
        return (spread(self, g, x) * share,)


class Max(_Extreme):
    """Largest element over ``axis`` (all axes when None), as ``numpy.max`` (``x.max(axis)``).

    y = max_axis x
    dx = expand(g) · [x = y] / n_ties   (tied maxima split the gradient evenly; a unique
         maximum gets all of it)
    Unlike PyTorch's ``x.max(dim)``, y is the values alone, not a (values, indices) pair: take
    the indices with ``x.argmax(axis)`` (``x.max(1)[0]`` is the maximum of row 0).
    """
    __slots__ = ()
    reduce = "max"


class Min(_Extreme):
    """Smallest element over ``axis`` (all axes when None), as ``numpy.min`` (``x.min(axis)``).

    y = min_axis x
    dx = expand(g) · [x = y] / n_ties   (tied minima split the gradient evenly)
    """
    __slots__ = ()
    reduce = "min"


class LogSumExp(NetOp):
    """log Σ exp over ``axis`` (all axes when None), computed without overflow.

    y = m + ln Σ_axis e^(x − m),   m = max_axis x (taken as 0 where it is ±inf)
    dx = expand(g) · e^(x − y)     (the softmax over the reduced axes)
    """
    __slots__ = ("axes", "keepdims")

    def __init__(self, x, axis=None, keepdims=False, **keywords):
        if keywords:        # PyTorch's dim= and the like, answered with nnkit's spelling
            raise keyword_error(type(self).__name__, keywords)
        self.axes, self.keepdims = reduced_axes("LogSumExp", x, axis, keepdims)
        _check_not_empty("LogSumExp", x, self.axes)
        xp = backend.array_module(x._data)
        m = x._data.max(axis=self.axes, keepdims=True)
        m = xp.where(xp.isfinite(m), m, 0)
        y = xp.log(wide_sum(xp.exp(x._data - m), axis=self.axes, keepdims=True)) + m
        y = y.astype(x._data.dtype, copy=False)     # (float16: summed in float32)
        super().__init__(y if self.keepdims else y.squeeze(axis=self.axes), x)

    def _back(self, x):
        xp = backend.array_module(x._data)
        y = _spread(self, self._data, x)
        x.accumulate(_spread(self, self._g, x) * xp.exp(x._data - y))

    def _grads(self, g, x):
        return (spread(self, g, x) * (x - spread(self, self, x)).exp(),)


class Var(NetOp):
    """Variance over ``axis`` (all axes when None), as ``numpy.var`` (``x.var(axis)``).

    ddof=0 (the default) divides by n, as NumPy; ddof=1 gives the unbiased estimate (PyTorch's
    default, ``unbiased=True``). ddof is a number, not a bool.

    y = Σ_axis (x − x̄)² / (n − ddof),   x̄ = mean_axis x
    dx = expand(g) · 2 (x − x̄) / (n − ddof)
    """
    __slots__ = ("axes", "keepdims", "dof", "centred")

    def __init__(self, x, axis=None, keepdims=False, ddof=0, **keywords):
        if keywords:        # PyTorch's dim= and the like, answered with nnkit's spelling
            raise keyword_error(type(self).__name__, keywords,
                                " (ddof=1 for the unbiased estimate)")
        self.axes, self.keepdims = reduced_axes("Var", x, axis, keepdims)
        if not checks.is_number(ddof):
            raise TypeError(f"Var: ddof must be a number (1 for the unbiased estimate), got "
                            f"{ddof!r}")
        self.dof = _count(x._data.shape, self.axes) - ddof
        if not self.dof > 0:
            raise ValueError(f"Var: {_count(x._data.shape, self.axes)} values over axes "
                             f"{self.axes} of x of shape {tuple(x.shape)} leave no degrees of "
                             f"freedom with ddof={ddof}")
        xw = wide(x._data)          # float16 squares overflow at |x − x̄| > 256
        self.centred = xw - xw.mean(axis=self.axes, keepdims=True)
        y = backend.array_module(x._data).asarray(
            (self.centred * self.centred).sum(axis=self.axes, keepdims=self.keepdims) / self.dof)
        if xw is not x._data:       # float16 again (integers stay float, as NumPy's var)
            y = y.astype(x._data.dtype)
        super().__init__(y, x)

    def _back(self, x):
        x.accumulate(_spread(self, self._g, x) * (2 / self.dof) * self.centred)

    def _grads(self, g, x):
        centred = x - x.mean(axis=self.axes, keepdims=True)
        return (spread(self, g, x) * (2 / self.dof) * centred,)


class Norm(NetOp):
    """Euclidean (L2) norm over ``axis`` (all axes when None) (``x.norm(axis)``).

    The first argument after x is the axis, not the order p of PyTorch's ``x.norm(p)`` or
    NumPy's ``norm(x, ord)``: ``x.norm(1)`` is the L2 norm of each row, never an L1 norm.

    y = √(Σ_axis x²)
    dx = expand(g) · x / y,  and 0 where y = 0 (a safe subgradient: no NaN at x = 0; the
         second derivative there is 0 too)
    """
    __slots__ = ("axes", "keepdims")

    def __init__(self, x, axis=None, keepdims=False, **keywords):
        if keywords:        # PyTorch's dim= and the like, answered with nnkit's spelling
            raise keyword_error(type(self).__name__, keywords)
        self.axes, self.keepdims = reduced_axes("Norm", x, axis, keepdims)
        xp = backend.array_module(x._data)
        xw = wide(x._data)          # float16 squares overflow at |x| > 256
        y = xp.sqrt(xp.asarray((xw * xw).sum(axis=self.axes, keepdims=self.keepdims)))
        super().__init__(y.astype(x._data.dtype, copy=False), x)

    def _back(self, x):
        xp = backend.array_module(x._data)
        y = _spread(self, self._data, x)
        x.accumulate(_spread(self, self._g, x) * x._data / xp.where(y > 0, y, 1))

    def _grads(self, g, x):
        # Where y = 0 (x = 0 along the axes) dx is 0 and so is its derivative (PyTorch's is NaN):
        # x is masked there, and divided by 1 instead of y.
        y = spread(self, self, x)
        zero = (y._data == 0).astype(x._data.dtype)
        return (spread(self, g, x) * (x * (1 - zero)) / (y + zero),)


class CosineSimilarity(NetOp, metaclass=AppliedOp):    # nn.CosineSimilarity(dim=1) too
    """Cosine of the angle between a and b along ``axis`` (not a loss: one value per vector).

    Equal to PyTorch's ``cosine_similarity(a, b, dim=axis, eps)`` (below eps the gradient is
    that of y as written here, where PyTorch's differs); for a loss use e.g.
    ``1 - CosineSimilarity(a, b).mean()``. a and b broadcast; y drops ``axis``.
    nₐ = max(‖a‖, eps),  n_b = max(‖b‖, eps)
    y = Σ_axis a·b / (nₐ · n_b)
    da = g · (b / (nₐ n_b) − y · a / nₐ² · [‖a‖ > eps]),  db likewise with a and b swapped
    (below eps the norm is the constant eps, so the gradient is that of y as computed)
    Second derivatives through a composite of Norm ops.
    """
    __slots__ = ("a", "b", "axis", "na", "nb", "eps", "denominator", "y")

    def __init__(self, a, b, axis=-1, eps=1e-8, **keywords):
        if keywords:        # PyTorch's dim= and the like, answered with nnkit's spelling
            raise keyword_error(type(self).__name__, keywords)
        a, b = _nodes(a, b)
        xp = backend.array_module(a._data)
        try:
            self.a, self.b = xp.broadcast_arrays(a._data, b._data)
        except ValueError:
            raise ValueError(f"CosineSimilarity: cannot broadcast a of shape {tuple(a.shape)} "
                             f"with b of shape {tuple(b.shape)}") from None
        self.axis = normalize_axis("CosineSimilarity", axis, self.a.ndim,
                                   f"a of shape {tuple(a.shape)} and b of shape "
                                   f"{tuple(b.shape)}")
        aw, bw = wide(self.a), wide(self.b)     # float16 squares overflow at |x| > 256
        self.na = xp.sqrt((aw * aw).sum(axis=self.axis, keepdims=True))
        self.nb = xp.sqrt((bw * bw).sum(axis=self.axis, keepdims=True))
        self.eps = eps
        self.denominator = xp.maximum(self.na, eps) * xp.maximum(self.nb, eps)
        self.y = (aw * bw).sum(axis=self.axis, keepdims=True) / self.denominator
        super().__init__(self.y.squeeze(axis=self.axis).astype(self.a.dtype, copy=False), a, b)

    def _back(self, a, b):
        xp = backend.array_module(self.y)
        g = xp.expand_dims(self._g, self.axis)
        for node, u, v, nu in ((a, self.a, self.b, self.na), (b, self.b, self.a, self.nb)):
            if node.requires_grad:
                radial = xp.where(nu > self.eps, self.y / xp.where(nu > 0, nu * nu, 1), 0)
                node.accumulate((g * (v / self.denominator - radial * u)).astype(u.dtype,
                                                                                 copy=False))

    def _composite(self, a, b):
        shape = self.a.shape        # a and b broadcast, so that the axis means the same in both
        a = a if a.shape == shape else a.broadcast_to(shape)
        b = b if b.shape == shape else b.broadcast_to(shape)
        a, b = widened(a), widened(b)          # float16: in float32, as the forward pass
        y = (a * b).sum(axis=self.axis, keepdims=True) / (self._clamped(a, self.na)
                                                          * self._clamped(b, self.nb))
        return narrowed(y.reshape(self.shape), self.a.dtype)

    def _clamped(self, u, norm):
        """max(‖u‖, eps) as a node; which of the two it is, is constant a.e."""
        above = (norm > self.eps).astype(norm.dtype)
        return Norm(u, self.axis, keepdims=True) * above + self.eps * (1 - above)


class ArgMax(NetOp):
    """Index of the largest element along ``axis`` (of the flattened x when None), as
    ``numpy.argmax`` (``x.argmax(axis)``).

    y = argmax_axis x   (integer data; not differentiable, so y never needs a gradient)
    Ties give the first maximum. Usable as an index: ``x[..., y]``, Embedding, losses.
    """
    __slots__ = ()

    def __init__(self, x, axis=None, keepdims=False, **keywords):
        if keywords:        # PyTorch's dim= and the like, answered with nnkit's spelling
            raise keyword_error(type(self).__name__, keywords)
        axes, keepdims = reduced_axes("ArgMax", x, axis, keepdims)
        if axis is not None:
            if len(axes) != 1:
                raise ValueError(f"ArgMax: give one axis, not {axis}")
            axis = axes[0]
        _check_not_empty("ArgMax", x, axes)
        xp = backend.array_module(x._data)
        super().__init__(xp.asarray(x._data.argmax(axis=axis, keepdims=keepdims)))
