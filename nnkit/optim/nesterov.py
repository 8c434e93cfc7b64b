"""Nesterov momentum."""

__all__ = ['Nesterov']
from .base import Optimizer, _zeros_state


class Nesterov(Optimizer):
    """Gradient descent with Nesterov momentum (the step looks ahead along the velocity).

    v = μ·v + g
    p = p − lr·(g + μ·v)
    ``momentum`` is μ ∈ [0, 1); v starts at zero. This is PyTorch's ``SGD(nesterov=True)``
    with no dampening.
    """
    options = ("lr", "momentum")
    unit_interval = ("momentum",)
    elementwise = True
    state_arrays = ("v",)

    def __init__(self, params, lr=0.01, momentum=0.9, modifiers=()):
        self.momentum = momentum
        super().__init__(params, lr, modifiers)

    def _update(self, p, g, state):
        v = _zeros_state(state, "v", p._data)
        mu = self.momentum
        v *= mu
        v += g
        p._data -= self.lr * (g + mu * v)
