"""The Optimizer base: parameters (in groups), hyperparameters, modifiers and ``step()``."""

__all__ = ['Optimizer']
import numpy

from .. import backend
from ..core import NetVar

_ndarray = numpy.ndarray


class Optimizer:
    """Base of the optimizers: ``step()`` updates every parameter that has a gradient, then
    resets its gradient (as in the article, so the next ``back()`` starts from zero).

    Parameters without a gradient (not reached by the last ``back()``) are left untouched;
    a step in which no parameter has a gradient raises, since that is always a missing
    ``back()``. ``lr`` is the learning rate (``learnRate`` is accepted as an alias).

    Parameter groups (the one mechanism for per-parameter options): ``params`` is either
    a list of NetVars, or a list of dicts ``{"params": [...], option: value, ...}`` whose
    options override the optimizer's own for those parameters, e.g. no decay on biases::

        AdamW([{"params": weights}, {"params": biases, "weight_decay": 0.0}], lr=1e-3)

    While a group's parameters are updated its options are the optimizer's attributes, so
    ``_update(p, g, state)`` always reads ``self.lr``, ``self.momentum``, ...

    Modifiers (``modifiers=[...]`` or ``add_modifier``) run inside ``step()`` in this order:
    every gradient modifier, in the order attached (clipping, decay, freezing), then the
    update, then every weight modifier, in the order attached (norm constraints).

    ``state_dict()`` / ``load_state_dict()`` save and restore the options and each
    parameter's state (arrays and plain numbers); the state arrays live on the parameter's
    device, and follow it at the next ``step()`` when it moves (``to_gpu()``/``to_cpu()``).
    """
    options = ("lr",)      # the constructor's hyperparameters, in order
    unit_interval = ()     # those of them that must lie in [0, 1)

    def __init__(self, params, lr, modifiers=()):
        """Subclasses set their other options as attributes before calling this."""
        self.lr = lr
        self.param_groups = []
        self.params = []
        self.state = []
        self._check_options({key: getattr(self, key) for key in self.options})
        if isinstance(params, NetVar):
            raise TypeError(f"{type(self).__name__}: params must be a list of NetVars, got one "
                            f"NetVar ({params._describe()}); write [w]")
        entries = list(params)
        if entries and all(isinstance(entry, dict) for entry in entries):
            for group in entries:
                self.add_param_group(group)
        else:
            self.add_param_group({"params": entries})
        self.modifiers = []
        for modifier in modifiers:
            self.add_modifier(modifier)

    # -- groups and options
    def add_param_group(self, group):
        """Add ``{"params": [...], option: value, ...}``: parameters with their own options."""
        name = type(self).__name__
        if not isinstance(group, dict) or "params" not in group:
            raise TypeError(f"{name}: a parameter group is a dict with a 'params' list, "
                            f"got {type(group).__name__}")
        overrides = {key: value for key, value in group.items() if key != "params"}
        unknown = sorted(set(overrides) - set(self.options))
        if unknown:
            raise ValueError(f"{name}: unknown option(s) {unknown} in parameter group "
                             f"{len(self.param_groups)}; options are {list(self.options)}")
        self._check_options(overrides)
        params = list(group["params"])
        known = {id(p) for p in self.params}
        for p in params:
            position = len(self.params)
            if not isinstance(p, NetVar):
                raise TypeError(f"{name}: parameter {position} is a "
                                f"{type(p).__name__}, not a NetVar")
            if p.dtype.kind != "f":
                raise TypeError(f"{name}: parameter {position} has dtype "
                                f"{p.dtype}; parameters must be float arrays")
            if p.parents:
                raise TypeError(f"{name}: parameter {position} ({p._describe()}) is computed by "
                                "an op; optimize the leaf NetVars it is computed from")
            if id(p) in known:
                raise ValueError(f"{name}: parameter {position} ({p._describe()}) is listed "
                                 "twice")
            known.add(id(p))
            self.params.append(p)
            self.state.append({})
        self.param_groups.append({"params": params, **overrides})

    def _check_options(self, options):
        """Raise for an option value out of range (subclasses add their own checks)."""
        for key in ("lr", "eps", "weight_decay"):
            if key in options and not options[key] >= 0:
                what = "learning rate" if key == "lr" else key
                raise ValueError(f"{type(self).__name__}: {what} must be >= 0, "
                                 f"got {options[key]}")
        for key in self.unit_interval:
            if key in options and not 0 <= options[key] < 1:
                raise ValueError(f"{type(self).__name__}: {key} must be in [0, 1), "
                                 f"got {options[key]}")

    @property
    def learnRate(self):
        return self.lr

    @learnRate.setter
    def learnRate(self, value):
        self.lr = value

    # -- modifiers
    def add_modifier(self, modifier):
        """Attach a gradient or weight modifier (see ``nnkit.optim.modifiers``); returns it."""
        if not hasattr(modifier, "modify_gradients") and not hasattr(modifier, "modify_weights"):
            raise TypeError(f"{type(self).__name__}: {modifier!r} is not a modifier "
                            "(it has neither modify_gradients nor modify_weights)")
        self.modifiers.append(modifier)
        return modifier

    def remove_modifier(self, modifier):
        self.modifiers.remove(modifier)

    # -- the step
    def step(self):
        """Modify the gradients, update each parameter from its gradient, constrain the
        weights, then reset the gradients."""
        pending = [(p, state, group) for group, pairs in self._grouped()
                   for p, state in pairs if p._g is not None]
        if not pending:
            if self.params:
                raise RuntimeError(f"{type(self).__name__}.step(): no parameter has a "
                                   "gradient; call back() on the loss before step()")
            return
        grads = [p._g for p, _, _ in pending]
        for modifier in self.modifiers:
            if hasattr(modifier, "modify_gradients"):
                grads = modifier.modify_gradients([p for p, _, _ in pending], grads)
        updated = []
        defaults = current = None
        try:
            for (p, state, group), g in zip(pending, grads):
                p._g = None
                if g is None:           # a frozen parameter
                    continue
                if group is not current:
                    defaults = self._enter(group, defaults)
                    current = group
                if state:
                    _follow(p, state)
                self._update(p, g, state)
                updated.append(p)
        finally:
            self._restore(defaults)
        for modifier in self.modifiers:
            if hasattr(modifier, "modify_weights"):
                modifier.modify_weights(updated)
        for p in updated:
            p.mark_edited()

    def _grouped(self):
        position = 0
        for group in self.param_groups:
            count = len(group["params"])
            yield group, zip(self.params[position:position + count],
                             self.state[position:position + count])
            position += count

    def _enter(self, group, defaults):
        """Make ``group``'s options the optimizer's attributes; returns the defaults to restore."""
        self._restore(defaults)
        overrides = {key: value for key, value in group.items() if key != "params"}
        if not overrides:
            return None
        saved = {key: getattr(self, key) for key in overrides}
        self.__dict__.update(overrides)
        return saved

    def _restore(self, defaults):
        if defaults:
            self.__dict__.update(defaults)

    def reset(self):
        """Forget every parameter's gradient without updating."""
        for p in self.params:
            p.reset()

    zero_grad = reset

    def _update(self, p, g, state):
        raise NotImplementedError

    # -- saving and restoring
    def state_dict(self):
        """The optimizer as plain data: its type, options, group options and per-parameter
        state (arrays, as they are, and JSON-able numbers)."""
        return {
            "type": type(self).__name__,
            "options": {key: getattr(self, key) for key in self.options},
            "groups": [{key: value for key, value in group.items() if key != "params"}
                       for group in self.param_groups],
            "sizes": [len(group["params"]) for group in self.param_groups],
            "state": [dict(state) for state in self.state],
        }

    def load_state_dict(self, saved):
        """Restore what ``state_dict()`` returned (arrays may be NumPy or CuPy); every entry is
        checked before anything is changed, and a mismatch raises ValueError saying which."""
        self.check_state_dict(saved)
        for key, value in saved["options"].items():
            setattr(self, key, value)
        for group, options in zip(self.param_groups, saved["groups"]):
            params = group["params"]
            group.clear()
            group.update(params=params, **options)
        for position, (p, state) in enumerate(zip(self.params, saved["state"])):
            xp = backend.array_module(p._data)
            self.state[position] = {
                key: xp.array(value, dtype=value.dtype) if _is_array(value) else value
                for key, value in state.items()}

    def check_state_dict(self, saved):
        """Raise ValueError when ``saved`` does not fit this optimizer's parameters."""
        name = type(self).__name__
        if saved.get("type") != name:
            raise ValueError(f"{name}.load_state_dict: the state is of a {saved.get('type')} "
                             "optimizer")
        sizes = [len(group["params"]) for group in self.param_groups]
        if list(saved.get("sizes", ())) != sizes:
            raise ValueError(f"{name}.load_state_dict: saved parameter groups have sizes "
                             f"{saved.get('sizes')}, this optimizer's are {sizes}")
        for key in saved["options"]:
            if key not in self.options:
                raise ValueError(f"{name}.load_state_dict: unknown option '{key}'")
        for position, (p, state) in enumerate(zip(self.params, saved["state"])):
            for key, value in state.items():
                if _is_array(value) and tuple(value.shape) != p.shape:
                    raise ValueError(f"{name}.load_state_dict: state '{key}' of parameter "
                                     f"{position} has shape {tuple(value.shape)}, the "
                                     f"parameter has shape {p.shape}")


def _follow(p, state):
    """Move ``state``'s arrays to ``p``'s device when ``p`` moved (``to_gpu``/``to_cpu``).

    It runs at every step, so an array of the parameter's own type (on its GPU, for CuPy)
    passes on that comparison alone; only other entries get the full device check."""
    data = p._data
    kind = type(data)
    for key, value in state.items():
        if type(value) is kind and (kind is _ndarray or value.device == data.device):
            continue
        if _is_array(value):
            device = backend.device_of(data)
            if backend.device_of(value) != device:
                state[key] = backend.to_cpu(value) if device == "cpu" \
                    else backend.to_gpu(value, data.device.id)


def _zeros_state(state, key, data):
    """``state[key]``, made as zeros like ``data`` (the parameter's array) on first use."""
    array = state.get(key)
    if array is None:
        array = state[key] = backend.array_module(data).zeros_like(data)
    return array


def _is_array(value):
    return hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(
        value, numpy.generic)
