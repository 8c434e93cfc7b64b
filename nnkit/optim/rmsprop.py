"""RMSProp."""

__all__ = ['RMSProp']
from .. import backend
from .base import Optimizer, _zeros_state


class RMSProp(Optimizer):
    """RMSProp: divide the gradient by a moving root mean square of its recent values.

    v = ρ·v + (1 − ρ)·g²
    p = p − lr · g / (√v + eps)
    ``rms`` is ρ ∈ [0, 1); v starts at zero (no bias correction; ``Adam(momentum=0)`` is
    the bias-corrected variant). Equals PyTorch's ``RMSprop`` with ``alpha=rms``.
    """
    options = ("lr", "rms", "eps")
    unit_interval = ("rms",)
    elementwise = True
    state_arrays = ("v",)
    state_squares = ("v",)

    def __init__(self, params, lr=0.01, rms=0.99, eps=1e-8, modifiers=()):
        self.rms = rms
        self.eps = eps
        super().__init__(params, lr, modifiers)

    def _update(self, p, g, state):
        xp = backend.array_module(p._data)
        v = _zeros_state(state, "v", p._data)
        rho = self.rms
        v *= rho
        v += (1 - rho) * (g * g)
        denom = xp.sqrt(v)
        denom += self.eps
        p._data -= self.lr * (g / denom)
