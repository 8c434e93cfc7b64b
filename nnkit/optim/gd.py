"""Gradient descent with momentum, as in the article."""

__all__ = ['GD']
from .. import backend
from .base import Optimizer, _zeros_state


class GD(Optimizer):
    """Gradient descent with momentum (an exponential moving average of the gradient).

    m = β·m + (1 − β)·g
    p = p − lr·m
    ``momentum`` is β ∈ [0, 1); with β = 0 this is plain gradient descent.
    """
    options = ("lr", "momentum")
    unit_interval = ("momentum",)
    elementwise = True
    state_arrays = ("m",)

    def __init__(self, params, lr=0.1, momentum=0.9, modifiers=()):
        self.momentum = momentum
        super().__init__(params, lr, modifiers)

    def _update(self, p, g, state):
        beta = self.momentum
        if beta == 0:
            p._data -= self.lr * g
            return
        m = _zeros_state(state, "m", p._data)
        tmp = g * (1 - beta)         # the one temporary, reused for the step
        m *= beta
        m += tmp
        backend.array_module(m).multiply(m, self.lr, out=tmp)
        p._data -= tmp
