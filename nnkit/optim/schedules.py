"""Learning-rate schedules usable with any optimizer.

A schedule owns a counter t (starting at 0) and sets the optimizer's ``lr`` (and the ``lr`` of
every parameter group that has its own) to base · factor(t), where base is the value at
construction. It applies factor(0) at construction; each ``step()`` advances t by one.
``state_dict()`` holds t and the bases, so a schedule resumed with ``load_state_dict`` computes
from the first run's bases even when it was built on an optimizer whose state (a decayed lr)
was loaded first.

When to call ``step()``: a schedule counts whatever you count. Call it once per epoch (after
the epoch's updates) for epoch-based schedules such as ``StepLR(opt, 30)``, or once per
optimizer step (after ``opt.step()``) for step-based ones such as ``LinearWarmup(opt, 500)``
or ``CosineLR`` over the total number of updates. ``ReduceOnPlateau.step(metric)`` is called
once per epoch with a validation metric. In the Trainer, the ``LRSchedule`` hook does this
(``every="epoch"`` or ``every="step"``).

Arguments are checked when a schedule is made: real numbers, finite (a NaN or infinite
``gamma`` is refused), counts such as ``step_size`` ints (2.5 is refused, not rounded).
"""

__all__ = ['Schedule', 'StepLR', 'ExponentialLR', 'CosineLR', 'LinearWarmup', 'ReduceOnPlateau',
           'Best']
import math

from .. import checks


class Best:
    """Tracks the best value of a metric: ``update(value)`` returns True when it improved.

    ``mode="min"``: improved means value < best − min_delta; ``"max"``: value > best + min_delta.
    Used by ReduceOnPlateau, EarlyStopping and SaveBest. Non-finite values never improve.
    A value that is not a number (a string, an array of several elements) raises TypeError.
    """

    def __init__(self, mode="min", min_delta=0.0, owner="Best"):
        if mode not in ("min", "max"):
            raise ValueError(f"{owner}: mode must be 'min' or 'max', got {mode!r}")
        self.owner = owner
        self.mode = mode
        self.min_delta = checks.in_range(owner, "min_delta", min_delta, 0)
        self.best = None
        self.bad = 0          # updates since the last improvement

    def update(self, value):
        value = _metric(f"{self.owner}.update", value)
        if not math.isfinite(value):
            improved = False
        elif self.best is None:
            improved = True
        elif self.mode == "min":
            improved = value < self.best - self.min_delta
        else:
            improved = value > self.best + self.min_delta
        if improved:
            self.best = value
            self.bad = 0
        else:
            self.bad += 1
        return improved

    def state_dict(self):
        return {"best": self.best, "bad": self.bad}

    def check_state_dict(self, state, where):
        """Raise for a saved best that is not None or a finite number, or a bad count < 0."""
        if state["best"] is not None:
            checks.in_range(where, "best", state["best"])
        checks.count(where, "bad", state["bad"])

    def load_state_dict(self, state):
        self.check_state_dict(state, f"{self.owner}.load_state_dict")
        self.best, self.bad = state["best"], state["bad"]


def _metric(where, value):
    """``value`` as a float (a number, or an array or NetVar of one element)."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{where}: metric must be a number, got {type(value).__name__} "
                        f"{value!r}")
    if hasattr(value, "item") and getattr(value, "size", 1) == 1:
        value = value.item()
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{where}: metric must be a number, got {type(value).__name__}") from None


class Schedule:
    """Base: ``factor(t)`` gives the multiplier of the base learning rates at count t.

    Every change is checked before it is made: a factor that is not finite and >= 0 (from a
    subclass), a parameter group added to the optimizer after the schedule was built (its lr
    would silently not follow) or a malformed saved state raise, and leave the count and the
    learning rates as they were.
    """

    def __init__(self, optimizer):
        if not hasattr(optimizer, "lr") or not hasattr(optimizer, "param_groups"):
            raise TypeError(f"{type(self).__name__}: expects an nnkit optimizer, got "
                            f"{type(optimizer).__name__}")
        self.optimizer = optimizer
        self.base = optimizer.lr
        self.group_bases = [group.get("lr") for group in optimizer.param_groups]
        self.t = 0
        self._apply()

    def factor(self, t):
        raise NotImplementedError

    def step(self):
        """Advance the count by one and set the new learning rate; returns it."""
        self.set_factor(self._factor(self.t + 1))
        self.t += 1
        return self.optimizer.lr

    def _apply(self):
        self.set_factor(self._factor(self.t))
        return self.optimizer.lr

    def _factor(self, t):
        """``factor(t)``, with an overflow (γ^t for a large t) named as this schedule's."""
        try:
            return self.factor(t)
        except OverflowError:
            raise ValueError(f"{type(self).__name__}: the factor of the base learning rate "
                             f"overflows at count {t}") from None

    def _check_groups(self):
        groups = len(self.optimizer.param_groups)
        if groups != len(self.group_bases):
            raise ValueError(f"{type(self).__name__}: the optimizer has {groups} parameter "
                             f"groups, the schedule was built for {len(self.group_bases)}; "
                             "build the schedule after adding every group")

    def set_factor(self, factor):
        """Set every learning rate to its base times ``factor`` (finite and >= 0)."""
        self._check_groups()
        self._check_factor(factor)
        self.optimizer.lr = self.base * factor
        for group, base in zip(self.optimizer.param_groups, self.group_bases):
            if base is not None:
                group["lr"] = base * factor

    def _check_factor(self, factor):
        if not (checks.is_number(factor) and 0 <= factor < math.inf):
            raise ValueError(f"{type(self).__name__}: the factor of the base learning rate "
                             f"must be finite and >= 0, got {factor}")

    def state_dict(self):
        """The count t and the base learning rates: plain data (``nnkit.save(...,
        schedule=...)`` stores it with a checkpoint)."""
        return {"t": self.t, "base": self.base, "group_bases": list(self.group_bases)}

    def check_state_dict(self, state):
        """Raise (TypeError or ValueError naming what is wrong) unless ``load_state_dict``
        would take ``state``; changes nothing (``nnkit.load`` checks a saved schedule with it
        before it assigns anything)."""
        self._checked(state)

    def _bases(self, state, where):
        """The saved ``(base, group_bases)``, checked (the current ones for a state saved
        without them)."""
        if "base" not in state:
            return self.base, self.group_bases
        base = checks.in_range(where, "base", state["base"], 0)
        groups = state.get("group_bases")
        if not isinstance(groups, (list, tuple)) or len(groups) != len(self.group_bases):
            raise ValueError(f"{where}: group_bases must list one base per parameter group "
                             f"({len(self.group_bases)}), got {groups!r}")
        return base, [None if b is None else checks.in_range(where, "group_bases", b, 0)
                      for b in groups]

    def _restore_bases(self, base, group_bases):
        for schedule in (self, getattr(self, "then", None)):
            if schedule is not None:
                schedule.base, schedule.group_bases = base, list(group_bases)

    def _saved(self, state, *keys):
        """The name for errors of ``load_state_dict``, once ``state`` is known to have ``keys``."""
        where = f"{type(self).__name__}.load_state_dict"
        if not isinstance(state, dict):
            raise TypeError(f"{where}: expects the dict state_dict() returns, got "
                            f"{type(state).__name__}")
        missing = [key for key in keys if key not in state]
        if missing:
            raise ValueError(f"{where}: the state is missing {missing}")
        return where

    def _checked(self, state):
        """``(t, bases, factor)`` of a saved ``state``, checked (see ``check_state_dict``)."""
        where = self._saved(state, "t")
        t = checks.count(where, "t", state["t"])
        bases = self._bases(state, where)
        self._check_groups()
        kept = self.base, self.group_bases
        self._restore_bases(*bases)            # (a factor may read the base: CosineLR's)
        try:
            factor = self._factor(t)
        finally:
            self._restore_bases(*kept)
        self._check_factor(factor)
        return t, bases, factor

    def load_state_dict(self, state):
        t, bases, factor = self._checked(state)
        self._restore_bases(*bases)
        self.set_factor(factor)
        self.t = t


class StepLR(Schedule):
    """lr = base · γ^⌊t / step_size⌋: multiply by ``gamma`` every ``step_size`` calls."""

    def __init__(self, optimizer, step_size, gamma=0.1):
        self.step_size = checks.count("StepLR", "step_size", step_size, 1)
        self.gamma = checks.in_range("StepLR", "gamma", gamma, 0)
        super().__init__(optimizer)

    def factor(self, t):
        return self.gamma ** (t // self.step_size)


class ExponentialLR(Schedule):
    """lr = base · γ^t."""

    def __init__(self, optimizer, gamma):
        self.gamma = checks.in_range("ExponentialLR", "gamma", gamma, 0)
        super().__init__(optimizer)

    def factor(self, t):
        return self.gamma ** t


class CosineLR(Schedule):
    """Cosine annealing from base to ``min_lr`` over ``total`` calls, then ``min_lr``.

    lr = min_lr + (base − min_lr) · (1 + cos(π · min(t, total) / total)) / 2
    ``min_lr`` applies to the optimizer's lr; groups with their own lr keep the same ratio.
    """

    def __init__(self, optimizer, total, min_lr=0.0):
        self.total = checks.count("CosineLR", "total", total, 1)
        self.min_lr = checks.in_range("CosineLR", "min_lr", min_lr, 0)
        super().__init__(optimizer)

    def factor(self, t):
        ratio = self.min_lr / self.base if self.base else 0.0
        return ratio + (1 - ratio) * (1 + math.cos(math.pi * min(t, self.total) / self.total)) / 2


class LinearWarmup(Schedule):
    """Ramp the learning rate up linearly over ``warmup`` calls, then hand over to ``then``.

    lr = base · (start + (1 − start) · t / warmup)   for t < warmup
    lr = base · then.factor(t − warmup)               afterwards (base when ``then`` is None)
    ``then`` is another schedule built on the same optimizer (e.g. ``CosineLR``); it is driven
    by this one, so call only the warm-up's ``step()``. With ``start=0`` (the default) the first
    learning rate is 0: stepped per epoch, the first epoch trains nothing; give ``start > 0``
    (e.g. ``1 / warmup``) or step it per batch (``LRSchedule(..., every="step")``).
    """

    def __init__(self, optimizer, warmup, start=0.0, then=None):
        self.warmup = checks.count("LinearWarmup", "warmup", warmup, 1)
        self.start = checks.in_range("LinearWarmup", "start", start, 0, 1)
        if then is not None and not isinstance(then, Schedule):
            raise TypeError(f"LinearWarmup: then must be a schedule, got {type(then).__name__}")
        if then is not None and then.optimizer is not optimizer:
            raise ValueError("LinearWarmup: `then` must schedule the same optimizer")
        if then is not None:
            then._check_groups()        # before any learning rate is set
        self.then = then
        super().__init__(optimizer)
        if then is not None:
            self.base, self.group_bases = then.base, then.group_bases
            self._apply()

    def factor(self, t):
        if t < self.warmup:
            return self.start + (1 - self.start) * t / self.warmup
        return 1.0 if self.then is None else self.then.factor(t - self.warmup)


class ReduceOnPlateau(Schedule):
    """Multiply the learning rate by ``factor`` when a metric stops improving.

    ``step(metric)`` once per epoch: when the metric has not improved (see ``Best``) for more
    than ``patience`` calls, every learning rate (the optimizer's and each group's) becomes
    max(lr · factor, min_lr) and the count of bad calls restarts. A rate that starts below
    ``min_lr`` stays where it is (never raised).
    """

    def __init__(self, optimizer, factor=0.1, patience=10, mode="min", min_delta=0.0,
                 min_lr=0.0):
        self.reduce_by = checks.in_range("ReduceOnPlateau", "factor", factor, 0, 1,
                                         high_open=True)
        self.patience = checks.count("ReduceOnPlateau", "patience", patience)
        self.min_lr = checks.in_range("ReduceOnPlateau", "min_lr", min_lr, 0)
        self.monitor = Best(mode, min_delta, "ReduceOnPlateau")
        self.scale = 1.0
        super().__init__(optimizer)

    def factor(self, t):
        return self.scale

    def step(self, metric):
        """Record this epoch's metric; reduce the learning rate on a plateau. Returns lr.

        A NaN or infinite metric raises ValueError and changes nothing: it means the training
        diverged, which lowering the learning rate would hide."""
        value = _metric("ReduceOnPlateau.step", metric)
        if not math.isfinite(value):
            raise ValueError(f"ReduceOnPlateau.step: metric is {value}; the training has "
                             f"diverged (lr left at {self.optimizer.lr})")
        self._check_groups()
        self.t += 1
        self.monitor.update(value)
        if self.monitor.bad > self.patience:
            self.scale *= self.reduce_by
            self.monitor.bad = 0
        return self._apply()

    def set_factor(self, factor):
        """Every learning rate at its base times ``factor``, but not below ``min_lr`` (nor
        above its base)."""
        super().set_factor(factor)
        self.optimizer.lr = max(self.optimizer.lr, min(self.min_lr, self.base))
        for group, base in zip(self.optimizer.param_groups, self.group_bases):
            if base is not None:
                group["lr"] = max(group["lr"], min(self.min_lr, base))

    def state_dict(self):
        return {**super().state_dict(), "scale": self.scale, **self.monitor.state_dict()}

    def _checked(self, state):
        where = self._saved(state, "t", "scale", "best", "bad")
        t = checks.count(where, "t", state["t"])
        scale = checks.in_range(where, "scale", state["scale"], 0, 1)
        self.monitor.check_state_dict(state, where)
        bases = self._bases(state, where)
        self._check_groups()
        return t, bases, scale

    def load_state_dict(self, state):
        t, bases, scale = self._checked(state)
        self._restore_bases(*bases)
        self.set_factor(scale)
        self.t, self.scale = t, scale
        self.monitor.load_state_dict(state)
