"""Reductions: sums and means over axes.

Notation: input x, output y, upstream gradient g; "expand(g)" puts back the reduced axes so
that g broadcasts against x.
"""

__all__ = ['Sum', 'Mean']
from .. import backend
from ..core import NetOp, NetVar


def normalize_axis(op, axis, ndim):
    """``axis`` as a sorted tuple of non-negative axes (None: every axis); errors name the op."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    result = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise ValueError(f"{op}: axis {a} is out of range for an input of {ndim} dimensions")
        result.append(a % ndim)
    if len(set(result)) != len(result):
        raise ValueError(f"{op}: repeated axis in {axis}")
    return tuple(sorted(result))


def expand_reduced(g, axes, keepdims, shape):
    """Broadcast the gradient of a reduction back to the input's ``shape``."""
    xp = backend.array_module(g)
    if not keepdims:
        g = g.reshape(tuple(1 if i in axes else n for i, n in enumerate(shape)))
    return xp.broadcast_to(g, shape)


class Sum(NetOp):
    """Sum over ``axis`` (all axes when None), as ``numpy.sum``.

    y = Σ_axis x
    dx = expand(g)   (g copied along the summed axes)
    """

    def __init__(self, x, axis=None, keepdims=False):
        self.axes = normalize_axis("Sum", axis, x._data.ndim)
        self.keepdims = keepdims
        xp = backend.array_module(x._data)
        super().__init__(xp.asarray(x._data.sum(axis=self.axes, keepdims=keepdims)), x)

    def _back(self, x):
        x.accumulate(expand_reduced(self._g, self.axes, self.keepdims, x._data.shape))


class Mean(NetOp):
    """Mean over ``axis`` (all axes when None), as ``numpy.mean``.

    y = Σ_axis x / n     (n: number of elements averaged)
    dx = expand(g) / n
    """

    def __init__(self, x, axis=None, keepdims=False):
        self.axes = normalize_axis("Mean", axis, x._data.ndim)
        self.keepdims = keepdims
        xp = backend.array_module(x._data)
        super().__init__(xp.asarray(x._data.mean(axis=self.axes, keepdims=keepdims)), x)

    def _back(self, x):
        shape = x._data.shape
        n = 1
        for a in self.axes:
            n *= shape[a]
        x.accumulate(expand_reduced(self._g / n, self.axes, self.keepdims, shape))


NetVar.sum = lambda x, axis=None, keepdims=False: Sum(x, axis, keepdims)
NetVar.mean = lambda x, axis=None, keepdims=False: Mean(x, axis, keepdims)
