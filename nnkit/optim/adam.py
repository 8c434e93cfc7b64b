"""Adam, with bias correction."""

__all__ = ['Adam']
from .. import backend
from .base import Optimizer


class Adam(Optimizer):
    """Adam: moving averages of the gradient and its square, bias-corrected.

    m = β1·m + (1 − β1)·g          v = β2·v + (1 − β2)·g²
    m̂ = m / (1 − β1ᵗ)              v̂ = v / (1 − β2ᵗ)
    p = p − lr · m̂ / (√v̂ + eps)
    ``momentum`` is β1, ``rms`` is β2; t counts this parameter's updates. With momentum 0 it
    becomes RMSProp (with bias correction).
    """
    options = ("lr", "momentum", "rms", "eps")
    unit_interval = ("momentum", "rms")
    elementwise = True
    state_arrays = ("m", "v")
    state_counts = ("t",)
    state_squares = ("v",)

    def __init__(self, params, lr=0.001, momentum=0.9, rms=0.999, eps=1e-8, modifiers=()):
        self.momentum = momentum
        self.rms = rms
        self.eps = eps
        super().__init__(params, lr, modifiers)

    def _update(self, p, g, state):
        xp = backend.array_module(p._data)
        if "m" not in state:
            state["m"] = xp.zeros_like(p._data)
            state["v"] = xp.zeros_like(p._data)
            state["t"] = 0
        b1, b2 = self.momentum, self.rms
        m, v = state["m"], state["v"]
        state["t"] += 1
        t = state["t"]
        # In place through one temporary: the update allocates no other array of p's size.
        tmp = g * (1 - b1)
        m *= b1
        m += tmp
        xp.multiply(g, g, out=tmp)
        tmp *= 1 - b2
        v *= b2
        v += tmp
        root_c2 = (1 - b2 ** t) ** 0.5
        xp.sqrt(v, out=tmp)
        if tmp.dtype.itemsize > 2:   # √v̂ + eps = (√v + eps·√c2) / √c2,  c2 = 1 − β2ᵗ: one
            tmp += self.eps * root_c2                       # operation less
            xp.divide(m, tmp, out=tmp)
            tmp *= self.lr * root_c2 / (1 - b1 ** t)
        else:                        # float16, where eps·√c2 underflows for eps from 6e-8 to
            tmp /= root_c2           # 2e-6 (eps itself does not): √v̂ + eps as written
            tmp += self.eps
            xp.divide(m, tmp, out=tmp)
            tmp *= self.lr / (1 - b1 ** t)
        p._data -= tmp
