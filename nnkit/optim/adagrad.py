"""AdaGrad."""

__all__ = ['AdaGrad']
from .. import backend
from .base import Optimizer, _zeros_state


class AdaGrad(Optimizer):
    """AdaGrad: per-element steps shrinking with the sum of all past squared gradients.

    s = s + g²
    p = p − lr · g / (√s + eps)
    s starts at zero. Equals PyTorch's ``Adagrad`` (no lr decay, zero initial accumulator).
    """
    options = ("lr", "eps")
    elementwise = True
    state_arrays = ("s",)
    state_squares = ("s",)

    def __init__(self, params, lr=0.01, eps=1e-10, modifiers=()):
        self.eps = eps
        super().__init__(params, lr, modifiers)

    def _update(self, p, g, state):
        xp = backend.array_module(p._data)
        s = _zeros_state(state, "s", p._data)
        s += g * g
        denom = xp.sqrt(s)
        denom += self.eps
        p._data -= self.lr * (g / denom)
