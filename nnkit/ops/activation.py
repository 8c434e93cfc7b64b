"""Activations: elementwise nonlinearities and the row-wise softmax.

Notation: input x, output y, upstream gradient g; [c] is 1 where c holds, else 0.
Each op but SoftMax and LogSoftmax is elementwise; every dx has x's shape and dtype, so it goes
in with ``accumulate_same_shape``.
"""

__all__ = ['ReLU', 'LReLU', 'Sigmoid', 'Tanh', 'SoftMax', 'Softmax', 'LogSoftmax', 'ELU', 'SELU',
           'Softplus', 'GELU', 'SiLU', 'Swish', 'HardTanh']
from .. import backend, checks
from ..core import NetOp


def _row_max(op, x):
    """The max over the last axis, with an error naming the op when that axis is empty."""
    try:
        return x._data.max(axis=-1, keepdims=True)
    except ValueError:
        raise ValueError(f"{op}: x of shape {tuple(x.shape)} has an empty last axis") from None


def sigmoid(x, xp):
    """σ(x) = 1 / (1 + e^−x) of an array, without overflow for any |x|."""
    e = xp.exp(-xp.abs(x))          # in (0, 1]: never overflows
    return xp.where(x >= 0, 1 / (1 + e), e / (1 + e))


class ReLU(NetOp):
    """Rectified linear unit.

    y = max(x, 0)
    dx = g · [x > 0]
    """
    __slots__ = ()

    def __init__(self, x):
        xp = backend.array_module(x._data)
        super().__init__(xp.maximum(x._data, 0), x)

    def _back(self, x):
        x.accumulate_same_shape(self._g * (x._data > 0))


class LReLU(NetOp):
    """Leaky ReLU with slope s for negative inputs.

    y = x if x > 0 else s · x
    dx = g if x > 0 else s · g
    """
    __slots__ = ("s",)

    def __init__(self, x, s=0.01):
        self.s = s = checks.in_range("LReLU", "the slope s", s)
        xp = backend.array_module(x._data)
        super().__init__(xp.where(x._data > 0, x._data, x._data * s), x)

    def _back(self, x):
        xp = backend.array_module(x._data)
        x.accumulate_same_shape(xp.where(x._data > 0, self._g, self._g * self.s))


class Sigmoid(NetOp):
    """Logistic sigmoid, computed without overflow for any |x|.

    y = 1 / (1 + e^−x)
    dx = g · y · (1 − y)
    """
    __slots__ = ()

    def __init__(self, x):
        super().__init__(sigmoid(x._data, backend.array_module(x._data)), x)

    def _back(self, x):
        x.accumulate_same_shape(self._g * self._data * (1 - self._data))


class Tanh(NetOp):
    """Hyperbolic tangent.

    y = tanh(x)
    dx = g · (1 − y²) = g − g·y·y
    """
    __slots__ = ()

    def __init__(self, x):
        super().__init__(backend.array_module(x._data).tanh(x._data), x)

    def _back(self, x):
        # The second form: with no Python number in it, NumPy skips converting one, which on
        # a tiny array costs more than the arithmetic (Tanh is the most used activation).
        x.accumulate_same_shape(self._g - self._g * self._data * self._data)


class SoftMax(NetOp):
    """Softmax over the last axis (each row sums to 1), shifted by the row max for stability.

    y = e^(x − max x) / Σ e^(x − max x)
    dx = y · (g − Σ g·y)      (the full Jacobian-vector product, sums over the last axis)
    """
    __slots__ = ()

    def __init__(self, x):
        xp = backend.array_module(x._data)
        e = xp.exp(x._data - _row_max("SoftMax", x))
        super().__init__(e / e.sum(axis=-1, keepdims=True), x)

    def _back(self, x):
        x.accumulate_same_shape(
            self._data * (self._g - (self._g * self._data).sum(axis=-1, keepdims=True)))


Softmax = SoftMax


class LogSoftmax(NetOp):
    """Log of the softmax over the last axis, computed stably (no log of a rounded 0).

    y = x − max x − ln Σ e^(x − max x)
    dx = g − e^y · Σ g    (sums over the last axis)
    """
    __slots__ = ()

    def __init__(self, x):
        xp = backend.array_module(x._data)
        shifted = x._data - _row_max("LogSoftmax", x)
        super().__init__(shifted - xp.log(xp.exp(shifted).sum(axis=-1, keepdims=True)), x)

    def _back(self, x):
        xp = backend.array_module(self._data)
        x.accumulate_same_shape(self._g - xp.exp(self._data) * self._g.sum(axis=-1, keepdims=True))


class ELU(NetOp):
    """Exponential linear unit with scale α for negative inputs.

    y = x if x > 0 else α · (eˣ − 1)
    dx = g if x > 0 else g · (y + α)
    """
    __slots__ = ("alpha",)
    scale = 1.0       # λ of SELU

    def __init__(self, x, alpha=1.0):
        xp = backend.array_module(x._data)
        self.alpha = alpha = checks.in_range("ELU", "alpha", alpha)
        negative = alpha * xp.expm1(xp.minimum(x._data, 0))     # no overflow for large x
        super().__init__(self.scale * xp.where(x._data > 0, x._data, negative), x)

    def _back(self, x):
        xp = backend.array_module(x._data)
        x.accumulate_same_shape(xp.where(x._data > 0, self._g * self.scale,
                                         self._g * (self._data + self.scale * self.alpha)))


class SELU(ELU):
    """Scaled ELU with the self-normalising constants λ ≈ 1.0507, α ≈ 1.6733.

    y = λ · (x if x > 0 else α · (eˣ − 1))
    dx = g · λ if x > 0 else g · (y + λα)
    """
    __slots__ = ()
    scale = 1.0507009873554804934193349852946

    def __init__(self, x):
        super().__init__(x, alpha=1.6732632423543772848170429916717)


class Softplus(NetOp):
    """Smooth ReLU, computed without overflow for any |x|.

    y = ln(1 + eˣ) = max(x, 0) + ln(1 + e^−|x|)
    dx = g · σ(x)
    """
    __slots__ = ()

    def __init__(self, x):
        xp = backend.array_module(x._data)
        super().__init__(xp.maximum(x._data, 0) + xp.log1p(xp.exp(-xp.abs(x._data))), x)

    def _back(self, x):
        x.accumulate_same_shape(self._g * sigmoid(x._data, backend.array_module(x._data)))


class GELU(NetOp):
    """Gaussian error linear unit, tanh approximation (PyTorch's ``gelu(approximate='tanh')``).

    t = tanh(c · (x + k x³))
    y = ½ x (1 + t)
    dx = g · (½ (1 + t) + ½ x (1 − t²) · c · (1 + 3k x²))
    c = √(2/π), k = 0.044715
    """
    __slots__ = ("t",)
    c = 0.7978845608028654        # √(2/π)
    k = 0.044715

    def __init__(self, x):
        xp = backend.array_module(x._data)
        xd = x._data
        self.t = xp.tanh(self.c * (xd + self.k * xd * xd * xd))
        super().__init__(0.5 * xd * (1 + self.t), x)

    def _back(self, x):
        x.accumulate_same_shape(self._g * (0.5 * (1 + self.t) + 0.5 * x._data * (1 - self.t ** 2)
                                           * self.c * (1 + 3 * self.k * x._data ** 2)))


class SiLU(NetOp):
    """Sigmoid-weighted linear unit, also called swish (``Swish`` is the same op).

    y = x · s,   s = σ(x)
    dx = g · s · (1 + x · (1 − s))
    """
    __slots__ = ("s",)

    def __init__(self, x):
        self.s = sigmoid(x._data, backend.array_module(x._data))
        super().__init__(x._data * self.s, x)

    def _back(self, x):
        x.accumulate_same_shape(self._g * (self.s * (1 + x._data * (1 - self.s))))


Swish = SiLU


class HardTanh(NetOp):
    """x clipped to [lo, hi] (default [−1, 1]), a piecewise-linear tanh.

    y = min(max(x, lo), hi)
    dx = g · [lo < x < hi]   (0 at and beyond the bounds, as PyTorch's hardtanh)
    lo and hi are numbers (±inf allowed) with lo < hi.
    """
    __slots__ = ("lo", "hi")

    def __init__(self, x, lo=-1.0, hi=1.0):
        lo, hi = checks.number("HardTanh", "lo", lo), checks.number("HardTanh", "hi", hi)
        if not lo < hi:
            raise ValueError(f"HardTanh: lo ({lo:g}) must be below hi ({hi:g})")
        self.lo, self.hi = lo, hi
        super().__init__(backend.array_module(x._data).clip(x._data, lo, hi), x)

    def _back(self, x):
        x.accumulate_same_shape(self._g * ((x._data > self.lo) & (x._data < self.hi)))
