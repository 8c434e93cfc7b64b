"""Learning-rate schedules usable with any optimizer.

A schedule owns a counter t (starting at 0) and sets the optimizer's ``lr`` (and the ``lr`` of
every parameter group that has its own) to base · factor(t), where base is the value at
construction. It applies factor(0) at construction; each ``step()`` advances t by one.

When to call ``step()``: a schedule counts whatever you count. Call it once per epoch (after
the epoch's updates) for epoch-based schedules such as ``StepLR(opt, 30)``, or once per
optimizer step (after ``opt.step()``) for step-based ones such as ``LinearWarmup(opt, 500)``
or ``CosineLR`` over the total number of updates. ``ReduceOnPlateau.step(metric)`` is called
once per epoch with a validation metric. In the Trainer, the ``LRSchedule`` hook does this
(``every="epoch"`` or ``every="step"``).
"""

__all__ = ['Schedule', 'StepLR', 'ExponentialLR', 'CosineLR', 'LinearWarmup', 'ReduceOnPlateau',
           'Best']
import math


class Best:
    """Tracks the best value of a metric: ``update(value)`` returns True when it improved.

    ``mode="min"``: improved means value < best − min_delta; ``"max"``: value > best + min_delta.
    Used by ReduceOnPlateau, EarlyStopping and SaveBest. Non-finite values never improve.
    """

    def __init__(self, mode="min", min_delta=0.0, owner="Best"):
        if mode not in ("min", "max"):
            raise ValueError(f"{owner}: mode must be 'min' or 'max', got {mode!r}")
        if not min_delta >= 0:
            raise ValueError(f"{owner}: min_delta must be >= 0, got {min_delta}")
        self.mode = mode
        self.min_delta = min_delta
        self.best = None
        self.bad = 0          # updates since the last improvement

    def update(self, value):
        value = float(value)
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

    def load_state_dict(self, state):
        self.best, self.bad = state["best"], state["bad"]


class Schedule:
    """Base: ``factor(t)`` gives the multiplier of the base learning rates at count t."""

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
        self.t += 1
        return self._apply()

    def _apply(self):
        self.set_factor(self.factor(self.t))
        return self.optimizer.lr

    def set_factor(self, factor):
        self.optimizer.lr = self.base * factor
        for group, base in zip(self.optimizer.param_groups, self.group_bases):
            if base is not None:
                group["lr"] = base * factor

    def state_dict(self):
        return {"t": self.t}

    def load_state_dict(self, state):
        self.t = state["t"]
        self._apply()


def _check(owner, name, value, low, high=math.inf):
    if not low <= value <= high:
        raise ValueError(f"{owner}: {name} must be in [{low}, {high}], got {value}")
    return value


class StepLR(Schedule):
    """lr = base · γ^⌊t / step_size⌋: multiply by ``gamma`` every ``step_size`` calls."""

    def __init__(self, optimizer, step_size, gamma=0.1):
        self.step_size = int(_check("StepLR", "step_size", step_size, 1))
        self.gamma = _check("StepLR", "gamma", gamma, 0)
        super().__init__(optimizer)

    def factor(self, t):
        return self.gamma ** (t // self.step_size)


class ExponentialLR(Schedule):
    """lr = base · γ^t."""

    def __init__(self, optimizer, gamma):
        self.gamma = _check("ExponentialLR", "gamma", gamma, 0)
        super().__init__(optimizer)

    def factor(self, t):
        return self.gamma ** t


class CosineLR(Schedule):
    """Cosine annealing from base to ``min_lr`` over ``total`` calls, then ``min_lr``.

    lr = min_lr + (base − min_lr) · (1 + cos(π · min(t, total) / total)) / 2
    ``min_lr`` applies to the optimizer's lr; groups with their own lr keep the same ratio.
    """

    def __init__(self, optimizer, total, min_lr=0.0):
        self.total = int(_check("CosineLR", "total", total, 1))
        self.min_lr = _check("CosineLR", "min_lr", min_lr, 0)
        super().__init__(optimizer)

    def factor(self, t):
        ratio = self.min_lr / self.base if self.base else 0.0
        return ratio + (1 - ratio) * (1 + math.cos(math.pi * min(t, self.total) / self.total)) / 2


class LinearWarmup(Schedule):
    """Ramp the learning rate up linearly over ``warmup`` calls, then hand over to ``then``.

    lr = base · (start + (1 − start) · t / warmup)   for t < warmup
    lr = base · then.factor(t − warmup)               afterwards (base when ``then`` is None)
    ``then`` is another schedule built on the same optimizer (e.g. ``CosineLR``); it is driven
    by this one, so call only the warm-up's ``step()``.
    """

    def __init__(self, optimizer, warmup, start=0.0, then=None):
        self.warmup = int(_check("LinearWarmup", "warmup", warmup, 1))
        self.start = _check("LinearWarmup", "start", start, 0, 1)
        if then is not None and then.optimizer is not optimizer:
            raise ValueError("LinearWarmup: `then` must schedule the same optimizer")
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
    than ``patience`` calls, lr = max(lr · factor, min_lr) and the count of bad calls restarts.
    """

    def __init__(self, optimizer, factor=0.1, patience=10, mode="min", min_delta=0.0,
                 min_lr=0.0):
        self.reduce_by = _check("ReduceOnPlateau", "factor", factor, 0, 1)
        self.patience = int(_check("ReduceOnPlateau", "patience", patience, 0))
        self.min_lr = _check("ReduceOnPlateau", "min_lr", min_lr, 0)
        self.monitor = Best(mode, min_delta, "ReduceOnPlateau")
        self.scale = 1.0
        super().__init__(optimizer)

    def factor(self, t):
        return self.scale

    def step(self, metric):
        """Record this epoch's metric; reduce the learning rate on a plateau. Returns lr."""
        self.t += 1
        self.monitor.update(metric)
        if self.monitor.bad > self.patience:
            floor = self.min_lr / self.base if self.base else 0.0
            self.scale = max(self.scale * self.reduce_by, floor)
            self.monitor.bad = 0
        return self._apply()

    def state_dict(self):
        return {"t": self.t, "scale": self.scale, **self.monitor.state_dict()}

    def load_state_dict(self, state):
        self.scale = state["scale"]
        self.monitor.load_state_dict(state)
        super().load_state_dict(state)
