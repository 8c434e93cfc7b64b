"""Gradient and weight modifiers that attach to an optimizer.

``opt.add_modifier(ClipGradNorm(5.0))`` or ``GD(params, modifiers=[...])``. Inside
``opt.step()`` they run in this order:

1. gradient modifiers (``ClipValue``, ``ClipGradNorm``, ``L1Decay``, ``L2Decay``, ``Freeze``),
   in the order they were attached, on the gradients of the parameters about to be updated;
2. the optimizer's update;
3. weight modifiers (``MaxNorm``), in the order they were attached, on the updated weights.

Each modifier takes ``params=``: the parameters it applies to (all of the optimizer's by
default). A gradient modifier returns new arrays and never edits a gradient in place. A user
modifier is a class with ``modify_gradients(params, grads) -> grads`` (a list, ``None`` to skip
a parameter's update) and/or ``modify_weights(params)`` (edits ``p.data`` in place).
The list a gradient modifier returns is checked before any update: one gradient per
parameter, each of its parameter's shape.

Errors: thresholds (``limit``, ``max_norm``) must be > 0 (inf clips nothing), rates finite and
> 0; an empty ``params`` and, when attached, a parameter the optimizer does not update are
refused (ValueError), as is attaching the same modifier twice.
"""

__all__ = ['Modifier', 'ClipValue', 'ClipGradNorm', 'L1Decay', 'L2Decay', 'Freeze', 'MaxNorm']

import math

from .. import backend, checks
from ..core import NetVar
from ..dtypes import wide


class Modifier:
    """Base: holds the optional ``params`` selection (None: every parameter).

    An empty selection is refused (it would silently apply to nothing), and so is attaching
    a modifier whose selection names a NetVar the optimizer does not update.
    """

    def __init__(self, params=None):
        if params is not None:
            name = type(self).__name__
            if isinstance(params, NetVar):
                raise TypeError(f"{name}: params must be a list of NetVars, got one NetVar "
                                f"({params._describe()}); write [w]")
            params = list(params)
            if not params:
                raise ValueError(f"{name}: params is empty, so it would apply to nothing; "
                                 "leave it out to apply to every parameter")
            for position, p in enumerate(params):
                if not isinstance(p, NetVar):
                    raise TypeError(f"{name}: parameter {position} is a {type(p).__name__}, "
                                    "not a NetVar")
        self.params = params
        self._ids = None if params is None else {id(p) for p in params}

    def applies(self, p):
        return self._ids is None or id(p) in self._ids

    def __repr__(self):
        fields = ", ".join(f"{key}={value!r}" for key, value in vars(self).items()
                           if not key.startswith("_") and key != "params")
        if self.params is not None:
            fields += f", params=[{len(self.params)} NetVars]"
        return f"{type(self).__name__}({fields})"


class ClipValue(Modifier):
    """Clip every gradient element into [−limit, limit]:  g = min(max(g, −limit), limit)."""

    def __init__(self, limit, params=None):
        super().__init__(params)
        self.limit = checks.in_range("ClipValue", "limit", limit, 0, low_open=True, finite=False)

    def modify_gradients(self, params, grads):
        return [backend.array_module(g).clip(g, -self.limit, self.limit)
                if g is not None and self.applies(p) else g
                for p, g in zip(params, grads)]


class ClipGradNorm(Modifier):
    """Rescale the gradients together when their global L2 norm exceeds ``max_norm``.

    n = √(Σ over the selected parameters of Σ g²)
    g = g · max_norm / (n + 1e-6)   when n > max_norm, otherwise unchanged
    (as PyTorch's ``clip_grad_norm_``). ``last_norm`` holds n of the latest step, for logging.
    n and the factor stay on the gradients' device (g · min(1, max_norm / (n + 1e-6)), with
    no host read in the step); reading ``last_norm`` brings n to the host. ``max_norm=inf``
    only measures n (the gradients are left as they are). n is summed in float64 from squares
    taken in float32 or wider (float16's overflow at |g| > 256). As in PyTorch, a NaN gradient
    makes n and every clipped gradient NaN, and an infinite one makes n infinite, its own
    infinite entries NaN and every other gradient 0; ``detect_anomaly()`` names the op that
    produced it.
    """

    def __init__(self, max_norm, params=None):
        super().__init__(params)
        self.max_norm = checks.in_range("ClipGradNorm", "max_norm", max_norm, 0,
                                        low_open=True, finite=False)
        self._norm = None

    @property
    def last_norm(self):
        norm = self._norm
        return norm if norm is None or isinstance(norm, float) else float(backend.to_cpu(norm))

    def modify_gradients(self, params, grads):
        chosen = [i for i, (p, g) in enumerate(zip(params, grads))
                  if g is not None and self.applies(p)]
        if not chosen:
            self._norm = 0.0
            return grads
        xp = backend.array_module(grads[chosen[0]])
        squares = (wide(grads[i]) for i in chosen)    # float16 squares overflow at |g| > 256
        self._norm = xp.sqrt(sum((g * g).sum(dtype=xp.float64) for g in squares))
        if self.max_norm == math.inf:       # inf / inf would be NaN for an infinite norm
            return grads
        scale = xp.minimum(1.0, self.max_norm / (self._norm + 1e-6))
        grads = list(grads)
        for i in chosen:
            grads[i] = grads[i] * scale.astype(grads[i].dtype)
        return grads


class L2Decay(Modifier):
    """L2 regularization added to the gradient:  g = g + λ·p  (the gradient of λ·Σp²/2).

    With GD this is classic weight decay; with Adam it is "coupled" decay (prefer ``AdamW``).
    """

    def __init__(self, rate, params=None):
        super().__init__(params)
        self.rate = checks.in_range("L2Decay", "rate", rate, 0, low_open=True)

    def modify_gradients(self, params, grads):
        return [g + self.rate * p._data if g is not None and self.applies(p) else g
                for p, g in zip(params, grads)]


class L1Decay(Modifier):
    """L1 regularization added to the gradient:  g = g + λ·sign(p)  (the gradient of λ·Σ|p|)."""

    def __init__(self, rate, params=None):
        super().__init__(params)
        self.rate = checks.in_range("L1Decay", "rate", rate, 0, low_open=True)

    def modify_gradients(self, params, grads):
        return [g + self.rate * backend.array_module(p._data).sign(p._data)
                if g is not None and self.applies(p) else g
                for p, g in zip(params, grads)]


class Freeze(Modifier):
    """Keep ``params`` fixed: their gradients are dropped (and reset) instead of applied."""

    def __init__(self, params):
        super().__init__(params)

    def modify_gradients(self, params, grads):
        return [None if self.applies(p) else g for p, g in zip(params, grads)]


class MaxNorm(Modifier):
    """Constrain the L2 norm of weight vectors after each update (a weight modifier).

    n = ‖w‖₂ along ``axis``;   w = w · max_norm / n   where n > max_norm
    In the (in, out) layout ``axis=0`` (the default) constrains each column, i.e. the incoming
    weights of each output unit; ``axis=1`` constrains each row. By default it applies to the
    weight matrices only: parameters with at least two rows that are no bias (biases, shape
    (1, n), are skipped, and those marked ``p.is_bias = True``: a GRU's (2, 3H) [b_i; b_h]);
    an optimizer with a weight of more than two axes (a Conv2D kernel) refuses it then, as its
    vectors along ``axis`` would not be the units' weights: give ``params`` (and ``axis``).
    ``axis`` (an int or a tuple of ints) is checked when the modifier is made, against each of
    ``params`` or, without them, against 2-D weights; a bad one would otherwise fail after the
    update.
    """

    def __init__(self, max_norm, axis=0, params=None):
        super().__init__(params)
        self.max_norm = checks.in_range("MaxNorm", "max_norm", max_norm, 0, low_open=True,
                                        finite=False)
        axes = axis if isinstance(axis, tuple) else (axis,)
        if not all(checks.is_integer(a) for a in axes):
            raise TypeError(f"MaxNorm: axis must be an int or a tuple of ints, got {axis!r}")
        # Checked here, not in the step, where the weights are already updated: without params,
        # against 2-D (every weight has at least two dimensions).
        for p in self.params or (None,):
            ndim = 2 if p is None else p.ndim
            for a in axes:
                if not -ndim <= a < ndim:
                    what = "a 2-D weight" if p is None else p._describe()
                    raise ValueError(f"MaxNorm: axis {a} is out of range for {what}")
        self.axis = axis

    def applies(self, p):
        if self._ids is None:
            return p.ndim >= 2 and p.shape[0] > 1 and not getattr(p, "is_bias", False)
        return id(p) in self._ids

    def check_params(self, params, owner):
        """Refuse, when attached without ``params``, an optimizer that updates a weight of
        more than two axes: along ``axis`` its vectors are no unit's weights (a Conv2D kernel
        (O, C, kh, kw) has its filters along axes (1, 2, 3))."""
        if self._ids is not None:
            return
        for p in params:
            if p.ndim > 2 and p.shape[0] > 1:
                raise ValueError(
                    f"{owner}: MaxNorm without params= would constrain {p._describe()} along "
                    f"axis {self.axis}, which for a weight of {p.ndim} axes is not each unit's "
                    "weight vector; give params= with the 2-D weights, and for a Conv2D "
                    "kernel's filters a second MaxNorm(max_norm, axis=(1, 2, 3), "
                    "params=[kernel])")

    def modify_weights(self, params):
        for p in params:
            if not self.applies(p):
                continue
            xp = backend.array_module(p._data)
            norms = xp.sqrt((p._data * p._data).sum(axis=self.axis, keepdims=True))
            p._data *= xp.minimum(1, self.max_norm / xp.maximum(norms, 1e-12)).astype(
                p._data.dtype)
