"""Shape ops: reshape and transpose. They move elements without changing them.

Notation: input x, output y, upstream gradient g.
"""

__all__ = ['Reshape', 'Transpose']
import numpy

from ..core import NetOp, NetVar


class Reshape(NetOp):
    """Same elements, new shape (as ``numpy.reshape``; one dimension may be -1).

    y = reshape(x, shape)
    dx = reshape(g, x.shape)
    """

    def __init__(self, x, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        try:
            y = x._data.reshape(shape)
        except (ValueError, TypeError):
            raise ValueError(f"Reshape: cannot reshape {tuple(x.shape)} into {shape}") from None
        super().__init__(y, x)

    def _back(self, x):
        x.accumulate(self._g.reshape(x._data.shape))


class Transpose(NetOp):
    """Permute the axes (reverse them when ``axes`` is None), as ``numpy.transpose``.

    y = transpose(x, axes)
    dx = transpose(g, inverse(axes))
    """

    def __init__(self, x, axes=None):
        ndim = x._data.ndim
        if axes is None:
            axes = tuple(reversed(range(ndim)))
        axes = tuple(int(a) % ndim if ndim else int(a) for a in axes)
        if sorted(axes) != list(range(ndim)):
            raise ValueError(f"Transpose: axes {axes} are not a permutation of the "
                             f"{ndim} axes of {tuple(x.shape)}")
        self.axes = axes
        super().__init__(x._data.transpose(axes), x)

    def _back(self, x):
        x.accumulate(self._g.transpose(tuple(numpy.argsort(self.axes))))


NetVar.reshape = lambda x, *shape: Reshape(x, *shape)
NetVar.transpose = lambda x, *axes: Transpose(x, (axes[0] if len(axes) == 1 and
                                                   isinstance(axes[0], (tuple, list))
                                                   else axes) or None)
NetVar.T = property(lambda x: Transpose(x))
