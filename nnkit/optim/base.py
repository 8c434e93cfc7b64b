"""The Optimizer base: a list of parameters, a learning rate and ``step()``."""

__all__ = ['Optimizer']
from ..core import NetVar


class Optimizer:
    """Base of the optimizers: ``step()`` updates every parameter that has a gradient, then
    resets its gradient (as in the article, so the next ``back()`` starts from zero).

    Parameters without a gradient (not reached by the last ``back()``) are left untouched;
    a step in which no parameter has a gradient raises, since that is always a missing
    ``back()``. ``lr`` is the learning rate (``learnRate`` is accepted as an alias).
    """

    def __init__(self, params, lr):
        self.params = list(params)
        for position, p in enumerate(self.params):
            if not isinstance(p, NetVar):
                raise TypeError(f"{type(self).__name__}: parameter {position} is a "
                                f"{type(p).__name__}, not a NetVar")
            if p.dtype.kind != "f":
                raise TypeError(f"{type(self).__name__}: parameter {position} has dtype "
                                f"{p.dtype}; parameters must be float arrays")
        if not lr >= 0:
            raise ValueError(f"{type(self).__name__}: learning rate must be >= 0, got {lr}")
        self.lr = lr
        self.state = [dict() for _ in self.params]

    @property
    def learnRate(self):
        return self.lr

    @learnRate.setter
    def learnRate(self, value):
        self.lr = value

    def step(self):
        """Update each parameter from its gradient, then reset the gradient."""
        updated = False
        for p, state in zip(self.params, self.state):
            g = p._g
            if g is None:
                continue
            self._update(p, g, state)
            p.mark_edited()
            p._g = None
            updated = True
        if not updated and self.params:
            raise RuntimeError(f"{type(self).__name__}.step(): no parameter has a gradient; "
                               "call back() on the loss before step()")

    def reset(self):
        """Forget every parameter's gradient without updating."""
        for p in self.params:
            p.reset()

    zero_grad = reset

    def _update(self, p, g, state):
        raise NotImplementedError
