"""Activations: elementwise nonlinearities and the row-wise softmax.

Notation: input x, output y, upstream gradient g; [c] is 1 where c holds, else 0.
"""

__all__ = ['ReLU', 'LReLU', 'Sigmoid', 'Tanh', 'SoftMax', 'Softmax']
from .. import backend
from ..core import NetOp, NetVar


class ReLU(NetOp):
    """Rectified linear unit.

    y = max(x, 0)
    dx = g · [x > 0]
    """

    def __init__(self, x):
        xp = backend.array_module(x._data)
        super().__init__(xp.maximum(x._data, 0), x)

    def _back(self, x):
        x.accumulate(self._g * (x._data > 0))


class LReLU(NetOp):
    """Leaky ReLU with slope s for negative inputs.

    y = x if x > 0 else s · x
    dx = g if x > 0 else s · g
    """

    def __init__(self, x, s=0.01):
        self.s = s
        xp = backend.array_module(x._data)
        super().__init__(xp.where(x._data > 0, x._data, x._data * s), x)

    def _back(self, x):
        xp = backend.array_module(x._data)
        g = self._g
        x.accumulate(xp.where(x._data > 0, g, g * self.s))


class Sigmoid(NetOp):
    """Logistic sigmoid, computed without overflow for any |x|.

    y = 1 / (1 + e^−x)
    dx = g · y · (1 − y)
    """

    def __init__(self, x):
        xp = backend.array_module(x._data)
        e = xp.exp(-xp.abs(x._data))            # in (0, 1]: never overflows
        super().__init__(xp.where(x._data >= 0, 1 / (1 + e), e / (1 + e)), x)

    def _back(self, x):
        y = self._data
        x.accumulate(self._g * (y * (1 - y)))


class Tanh(NetOp):
    """Hyperbolic tangent.

    y = tanh(x)
    dx = g · (1 − y²)
    """

    def __init__(self, x):
        super().__init__(backend.array_module(x._data).tanh(x._data), x)

    def _back(self, x):
        y = self._data
        x.accumulate(self._g * (1 - y * y))


class SoftMax(NetOp):
    """Softmax over the last axis (each row sums to 1), shifted by the row max for stability.

    y = e^(x − max x) / Σ e^(x − max x)
    dx = y · (g − Σ g·y)      (the full Jacobian-vector product, sums over the last axis)
    """

    def __init__(self, x):
        xp = backend.array_module(x._data)
        e = xp.exp(x._data - x._data.max(axis=-1, keepdims=True))
        super().__init__(e / e.sum(axis=-1, keepdims=True), x)

    def _back(self, x):
        y = self._data
        g = self._g
        x.accumulate(y * (g - (g * y).sum(axis=-1, keepdims=True)))


Softmax = SoftMax

NetVar.relu = lambda x: ReLU(x)
NetVar.sigmoid = lambda x: Sigmoid(x)
NetVar.tanh = lambda x: Tanh(x)
NetVar.softmax = lambda x: SoftMax(x)
