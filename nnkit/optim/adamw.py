"""AdamW: Adam with decoupled weight decay."""

__all__ = ['AdamW']
from .adam import Adam


class AdamW(Adam):
    """Adam with decoupled weight decay: the weights shrink directly, not through g.

    p = p · (1 − lr·λ)
    then the Adam update of p with g (see ``Adam``).
    ``weight_decay`` is λ ≥ 0. Use a parameter group with ``weight_decay=0`` to exempt
    biases. Equals PyTorch's ``AdamW``.
    """
    options = ("lr", "momentum", "rms", "eps", "weight_decay")
    elementwise = True

    def __init__(self, params, lr=0.001, momentum=0.9, rms=0.999, eps=1e-8, weight_decay=0.01,
                 modifiers=()):
        self.weight_decay = weight_decay
        super().__init__(params, lr, momentum, rms, eps, modifiers)

    def _update(self, p, g, state):
        if self.weight_decay:
            p._data *= 1 - self.lr * self.weight_decay
        super()._update(p, g, state)
