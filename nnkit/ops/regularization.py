"""Regularisation: Dropout, L2Reg.

Dropout follows the library's one train/eval switch: ``nnkit.train_mode(False)`` (or
``nnkit.eval_mode()``) as a context, read with ``nnkit.is_training()``; training is the default.
Notation: input x, output y, upstream gradient g.
"""

__all__ = ['Dropout', 'L2Reg']
from .. import backend, checks
from ..core import NetOp, NetVar
from ..hints import AppliedOp
from ..modes import is_training


class Dropout(NetOp, metaclass=AppliedOp):
    """Inverted dropout: zero each element with probability p, scale the rest by 1/(1 − p).

    training:   m = [u ≥ p] / (1 − p),  u uniform in [0, 1) from nnkit's seeded generator
                y = x · m,   dx = g · m
    evaluation (``with nnkit.eval_mode():``) or p = 0:   y = x,  dx = g
    p must be in [0, 1). The expected value of y equals x, so nothing changes at evaluation.
    """
    module_call = "layer"     # nn.Dropout(16) names nn.layers.Dropout (hints.AppliedOp)
    __slots__ = ("mask",)

    def __init__(self, x, p=0.5):
        p = checks.in_range("Dropout", "p", p, 0, 1, high_open=True)
        self.mask = None
        y = x._data
        if p > 0 and is_training():
            xp = backend.array_module(y)
            keep = backend.rng(xp).random(y.shape) >= p
            self.mask = keep.astype(y.dtype) / y.dtype.type(1 - p)
            y = y * self.mask
        super().__init__(y, x)

    def _back(self, x):
        x.accumulate_same_shape(self._g if self.mask is None else self._g * self.mask)

    def _grads(self, g, x):
        # the stored mask is a constant: the same units stay dropped to every order
        return (g if self.mask is None else g * self.mask,)


class L2Reg(NetOp):
    """A loss plus an L2 penalty on parameters (weight decay written into the loss).

    y = loss + r / (2B) · Σ_W ‖W‖²      (‖W‖² the sum of squares of every element of W)
    dloss = g,   dW = g · r · W / B
    B is ``batch_size`` (default 1): give the batch's rows to make r a per-sample rate, as in
    Σ(loss per row) / B + r/(2B)·Σ‖W‖². ``loss`` must hold one value; ``params`` is a list of
    NetVars (e.g. ``net.vars``); ``r`` a finite number ≥ 0.
    """
    __slots__ = ("scale",)

    def __init__(self, loss, params, r, batch_size=1):
        if not isinstance(loss, NetVar):
            raise TypeError(f"L2Reg: loss must be a NetVar, got {type(loss).__name__}")
        if loss._data.size != 1:
            raise ValueError(f"L2Reg: loss must hold one value, got shape {tuple(loss.shape)}")
        if isinstance(params, NetVar):
            params = [params]
        try:
            params = list(params)
        except TypeError:
            raise TypeError(f"L2Reg: params must be a list of NetVars, got "
                            f"{type(params).__name__}") from None
        if not all(isinstance(w, NetVar) for w in params):
            raise TypeError("L2Reg: params must be a list of NetVars")
        r = checks.in_range("L2Reg", "the rate r", r, 0)
        if not (checks.is_integer(batch_size) and batch_size > 0):
            raise ValueError(f"L2Reg: batch_size must be a positive int, got {batch_size!r}")
        self.scale = r / batch_size
        # Σ‖W‖² stays on the data's device: a float() here would read it back at every step.
        penalty = sum((w._data * w._data).sum() for w in params)
        xp = backend.array_module(loss._data)
        super().__init__(loss._data + xp.asarray(self.scale / 2 * penalty,
                                                 dtype=loss._data.dtype), loss, *params)

    def _back(self, loss, *params):
        loss.accumulate(self._g)
        g = self._g.reshape(())
        for w in params:
            if w.requires_grad:
                w.accumulate(g * self.scale * w._data)

    def _grads(self, g, loss, *params):
        g0 = g.reshape(())
        return (g,) + tuple(g0 * self.scale * w if w.requires_grad else None for w in params)
