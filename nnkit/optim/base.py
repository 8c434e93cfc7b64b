"""The Optimizer base: parameters (in groups), hyperparameters, modifiers and ``step()``."""

__all__ = ['Optimizer']
import functools
import math
import weakref

import numpy

from .. import backend, checks
from ..arraylike import gradient_only_read
from ..core import NetVar
from ..hints import keyword_hint, spelling
from ..module import Module, parameters_of, watch_replacements
from . import flat, saving

_ndarray = numpy.ndarray


# Whether p's gradient is the zeros that reading ``p.g`` made, untouched since: no gradient,
# as for a node that has none.
_read_zeros = gradient_only_read


@functools.lru_cache(maxsize=None)
def _rounds_to_0_below(dtype):
    """A bound under which a positive number may round to 0 in ``dtype`` (none above it)."""
    return float(numpy.finfo(dtype).smallest_subnormal) if dtype.kind == "f" else 0.0


# an eps from this up rounds to 0 in no float dtype (float16's least subnormal, the largest)
_ROUNDS_TO_0_IN_NONE = max(_rounds_to_0_below(numpy.dtype(kind)) for kind in (
    numpy.float16, numpy.float32, numpy.float64, numpy.longdouble))


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

    An optimizer whose ``_update`` treats each element alone declares ``elementwise = True``:
    ``step()`` then updates runs of small parameters of one group and dtype as one flat array
    (``optim/flat.py``: far fewer NumPy calls, the same bits); their state arrays are views
    into the run's flat arrays.

    ``state_dict()`` / ``load_state_dict()`` save and restore the options and each
    parameter's state (arrays and plain numbers); the state arrays live on the parameter's
    device, and follow it at the next ``step()`` when it moves (``to_gpu()``/``to_cpu()``).

    Errors: the parameters must be distinct leaf NetVars of a float dtype that require a
    gradient, and at least one (an empty list is always a model whose parameters were not
    found); a parameter listed twice, also in two groups, is refused (TypeError for a wrong
    type, ValueError for the rest). Options must be real numbers: ``lr`` finite and >= 0,
    ``eps`` finite and > 0 (and not 0 in a parameter's dtype: 1e-8 is 0 in float16, refused
    at ``step()``), ``weight_decay`` finite and >= 0, momentum-like options in [0, 1).
    They are checked wherever they are set (constructor, groups, ``load_state_dict``,
    schedules) and again at each ``step()``, which catches ``opt.lr = ...`` or
    ``group["lr"] = ...`` assigned directly. ``step()`` first checks every gradient (after
    each gradient modifier too): an array of the parameter's type, shape and a float dtype,
    or it raises ValueError naming the parameter and both shapes. A refused call changes
    nothing: no parameter, gradient, option or state.

    A replaced parameter is not trained: an optimizer holds its parameters by identity (as
    PyTorch's does), so after ``model.fc.W = NetVar(...)`` it would go on updating the old
    NetVar, which the model no longer uses. Where nnkit can see it, it refuses: replacing a
    Module attribute that holds one of this optimizer's parameters (the NetVar itself, or a
    submodule holding it) makes the next ``step()`` raise, naming the attribute. It cannot
    see a parameter replaced inside a list or dict, or a model that is not a Module (the
    optimizer is given the parameters, never the model): after such a change, build the
    optimizer again over ``model.vars``. Assigning into a parameter (``p.data = ...``,
    ``model.load_state(...)``) keeps it and needs nothing.

    PyTorch's keywords (``betas=``, ``nesterov=``, ...) and ``Adam(model)`` raise a TypeError
    naming nnkit's spelling (``hints.PYTORCH["optimizer"]``).
    """
    options = ("lr",)      # the constructor's hyperparameters, in order
    unit_interval = ()     # those of them that must lie in [0, 1)
    state_arrays = None    # a parameter's state arrays (None: not checked by load_state_dict)
    state_counts = ()      # a parameter's step counts (ints >= 1)
    state_squares = ()     # state arrays of running squares (never negative)

    elementwise = False    # _update treats each element alone: small parameters update together
    _replaced = None       # [(where, owner, attribute, parameters)] replaced: step() refuses

    def __new__(cls, *args, **keywords):
        """PyTorch's spellings, refused before the arguments are bound: a model given for its
        parameters, and the keywords of ``hints.PYTORCH["optimizer"]`` this optimizer does not
        take (``betas=``: nnkit's ``momentum=`` and ``rms=``)."""
        params = args[0] if args else keywords.get("params")
        if isinstance(params, Module):
            raise TypeError(f"{cls.__name__}: params is the model ({type(params).__name__}); "
                            f"pass its parameters: {cls.__name__}(model.vars, ...)")
        for name in keywords:
            if name not in cls.options and spelling("optimizer", name) is not None:
                raise keyword_hint(f"{cls.__name__}()", name, "optimizer")
        return super().__new__(cls)

    def __init__(self, params, lr=0.1, modifiers=()):
        """Subclasses set their other options as attributes before calling this (the
        article's ``super().__init__(params)`` takes lr = 0.1, as GD does)."""
        name = type(self).__name__
        self.lr = lr
        self.param_groups = []
        self.params = []
        self.state = []
        self._check_options({key: getattr(self, key) for key in self.options}, name)
        if isinstance(params, NetVar):
            raise TypeError(f"{name}: params must be a list of NetVars, got one "
                            f"NetVar ({params._describe()}); write [w]")
        entries = list(params)
        if entries and all(isinstance(entry, dict) for entry in entries):
            for group in entries:
                self.add_param_group(group)
        else:
            self.add_param_group({"params": entries})
        if not self.params:
            raise ValueError(f"{name}: got an empty parameter list, so step() would train "
                             "nothing; pass the model's parameters (e.g. net.vars)")
        if hasattr(modifiers, "modify_gradients") or hasattr(modifiers, "modify_weights"):
            raise TypeError(f"{name}: modifiers must be a list, got one modifier "
                            f"({modifiers!r}); write [modifier]")
        self.modifiers = []
        for modifier in modifiers:
            self.add_modifier(modifier)
        watch_replacements(self)

    def parameters_replaced(self, old, where, owner=None, attribute=None):
        """Told by a Module that its attribute ``where`` (``owner.attribute``) no longer holds
        the NetVars ``old``: the next ``step()`` refuses if this optimizer updates one of them,
        unless the attribute holds them again by then (assigned back)."""
        held = {id(p) for p in self.params}
        lost = [p for p in old if id(p) in held]
        if lost:
            owner = None if owner is None else weakref.ref(owner)
            self._replaced = (self._replaced or []) + [(where, owner, attribute, lost)]

    def _still_replaced(self):
        """The replacements whose attribute does not hold its parameters again, or None."""
        def assigned_back(owner, attribute, lost):
            value = None if owner is None or owner() is None else \
                vars(owner()).get(attribute)
            now = {id(p) for p in parameters_of(value)}
            return all(id(p) in now for p in lost)

        return [entry for entry in self._replaced if not assigned_back(*entry[1:])] or None

    # -- groups and options
    def add_param_group(self, group):
        """Add ``{"params": [...], option: value, ...}``: parameters with their own options.

        Everything is checked before the group is added: a refused group adds nothing."""
        name = type(self).__name__
        if not isinstance(group, dict) or "params" not in group:
            raise TypeError(f"{name}: a parameter group is a dict with a 'params' list, "
                            f"got {type(group).__name__}")
        overrides = {key: value for key, value in group.items() if key != "params"}
        self._check_group(overrides, len(self.param_groups), name)
        params = group["params"]
        if isinstance(params, NetVar):
            raise TypeError(f"{name}: a group's params must be a list of NetVars, got one "
                            f"NetVar ({params._describe()}); write [w]")
        params = list(params)
        known = {id(p) for p in self.params}
        for position, p in enumerate(params, start=len(self.params)):
            if not isinstance(p, NetVar):
                raise TypeError(f"{name}: parameter {position} is a "
                                f"{type(p).__name__}, not a NetVar")
            if p.dtype.kind != "f":
                raise TypeError(f"{name}: parameter {position} has dtype "
                                f"{p.dtype}; parameters must be float arrays")
            if p.parents:
                raise TypeError(f"{name}: parameter {position} ({p._describe()}) is computed by "
                                "an op; optimize the leaf NetVars it is computed from")
            if not p.requires_grad:
                raise ValueError(f"{name}: parameter {position} ({p._describe()}) does not "
                                 "require a gradient (a constant), so it would never be "
                                 "updated; leave it out or make it with requires_grad=True")
            if id(p) in known:
                raise ValueError(f"{name}: parameter {position} ({p._describe()}) is listed "
                                 "twice")
            known.add(id(p))
        self.params.extend(params)
        self.state.extend({} for _ in params)
        self.param_groups.append({"params": params, **overrides})

    def _check_group(self, overrides, index, where):
        self._check_known(overrides, index, where)
        self._check_options(overrides, where, f" in parameter group {index}")

    def _check_known(self, keys, index, where):
        unknown = sorted(set(keys) - set(self.options))
        if unknown:
            raise ValueError(f"{where}: unknown option(s) {unknown} in parameter group "
                             f"{index}; options are {list(self.options)}")

    def _check_all_options(self, where):
        """Check every option, the optimizer's and each group's (``step()`` runs this: it
        catches ``opt.lr = ...`` or ``group["lr"] = ...`` assigned directly), then make those
        given as NumPy floats (``lr=np.float32(0.01)``) Python floats, as a checkpoint stores
        them: arithmetic with a NumPy float32 scalar rounds to float32, so a resumed run would
        otherwise differ from an uninterrupted one. A float passing its rule's test needs no
        more; any other value goes on to the full check (``_check_options``)."""
        holders = [(vars(self), self.options, "")]
        for index, group in enumerate(self.param_groups):
            if len(group) > 1:
                overrides = [key for key in group if key != "params"]
                self._check_known(overrides, index, where)
                holders.append((group, overrides, f" in parameter group {index}"))
        numpy_floats = []
        for holder, keys, group in holders:
            for key in keys:
                value = holder[key] if key in holder else getattr(self, key)
                if type(value) is float and value != math.inf:
                    rule = _UNIT_INTERVAL if key in self.unit_interval else _RULES.get(key)
                    if rule is None or rule[0](value):
                        continue
                self._check_options({key: value}, where, group)
                if isinstance(value, numpy.generic) and value.dtype.kind == "f" and \
                        key in holder:
                    numpy_floats.append((holder, key))
        for holder, key in numpy_floats:
            holder[key] = float(holder[key])

    def _check_options(self, options, where, group=""):
        """Raise for an option value out of range (TypeError for one that is not a number).

        step() runs this for every option: a float passing its rule's test needs no more, and
        only another value goes on to the full check (``checks.in_range``)."""
        for key, value in options.items():
            rule = _UNIT_INTERVAL if key in self.unit_interval else _RULES.get(key)
            if rule is not None and not (type(value) is float and rule[0](value)
                                         and value != math.inf):
                what = "learning rate" if key == "lr" else key
                checks.in_range(where, what + group, value, **rule[1])

    @property
    def learnRate(self):
        return self.lr

    @learnRate.setter
    def learnRate(self, value):
        self._check_options({"lr": value}, type(self).__name__)
        self.lr = value

    # -- modifiers
    def add_modifier(self, modifier):
        """Attach a gradient or weight modifier (see ``nnkit.optim.modifiers``); returns it.

        Refused: an object that is not a modifier, one attached already, one whose
        ``params`` selection names a NetVar this optimizer does not update (it would silently
        do nothing for it), and one whose ``check_params(params, owner)`` raises for the
        optimizer's parameters."""
        name = type(self).__name__
        if not hasattr(modifier, "modify_gradients") and not hasattr(modifier, "modify_weights"):
            raise TypeError(f"{name}: {modifier!r} is not a modifier "
                            "(it has neither modify_gradients nor modify_weights)")
        if any(modifier is other for other in self.modifiers):
            raise ValueError(f"{name}: {modifier!r} is attached already")
        held = {id(p) for p in self.params}
        for p in getattr(modifier, "params", None) or ():
            if id(p) not in held:
                raise ValueError(f"{name}: {type(modifier).__name__} applies to "
                                 f"{p._describe()}, which this optimizer does not update")
        if callable(getattr(modifier, "check_params", None)):
            modifier.check_params(self.params, name)      # e.g. MaxNorm on a 4-D kernel
        self.modifiers.append(modifier)
        return modifier

    def remove_modifier(self, modifier):
        for position, other in enumerate(self.modifiers):
            if other is modifier:
                del self.modifiers[position]
                return
        raise ValueError(f"{type(self).__name__}.remove_modifier: {modifier!r} is not attached")

    # -- the step
    def step(self):
        """Modify the gradients, update each parameter from its gradient, constrain the
        weights, then reset the gradients. Options and gradients are checked first."""
        where = f"{type(self).__name__}.step()"
        if self._replaced is not None:
            self._replaced = self._still_replaced()
        if self._replaced is not None:
            raise RuntimeError(
                f"{where}: {self._replaced[0][0]} was assigned a new value after this optimizer "
                "was built, so it would go on training the parameter the model no longer uses; "
                f"build the optimizer again over the model's vars (to change a parameter's "
                "values and keep it, assign its data: p.data = ...); nothing was updated")
        self._check_all_options(where)
        pending = []            # (position, parameter, group) of the parameters with a gradient
        position, params = 0, self.params
        for group in self.param_groups:
            for p in group["params"]:
                if position == len(params) or p is not params[position]:
                    raise self._regrouped(where)
                if p._g is not None and not _read_zeros(p):
                    pending.append((position, p, group))
                position += 1
        if position != len(params):
            raise self._regrouped(where)
        if not pending:
            raise RuntimeError(f"{where}: no parameter has a gradient; call back() on the loss "
                               "before step()")
        params = [p for _, p, _ in pending]
        grads = [p._g for p in params]
        self._check_gradients(pending, grads, where, "")
        self._check_state_shapes(pending, where)
        self._check_eps(pending, where)
        # what the modifiers record (ClipGradNorm.last_norm) is put back if a later one refuses
        records = [(modifier.__dict__, dict(modifier.__dict__)) for modifier in self.modifiers
                   if hasattr(modifier, "__dict__")]
        try:
            for modifier in self.modifiers:
                if hasattr(modifier, "modify_gradients"):
                    grads = list(modifier.modify_gradients(params, grads))
                    label = type(modifier).__name__
                    if len(grads) != len(params):
                        raise ValueError(f"{where}: modifier {label} returned {len(grads)} "
                                         f"gradients for {len(params)} parameters")
                    self._check_gradients(pending, grads, where, f" returned by {label}")
                    # in the parameter's dtype, as the .g setter takes it (a float16 gradient
                    # made Adam compute a float64 parameter's whole update in float16)
                    grads = [g if g is None or g.dtype == p._data.dtype else
                             g.astype(p._data.dtype) for p, g in zip(params, grads)]
        except BaseException:
            for attributes, record in records:
                attributes.clear()
                attributes.update(record)
            raise
        items = []              # (position, parameter, group, gradient), frozen ones left out
        for (position, p, group), g in zip(pending, grads):
            p.reset()                           # (the zeros a read made are not kept alive)
            if g is not None:
                if self.state[position]:
                    _follow(p, self.state[position])
                items.append((position, p, group, g))
        updated = []
        defaults = current = None
        try:
            for run in flat.runs(self, items):  # small parameters together (optim/flat.py)
                position, p, group, g = run[0]
                if group is not current:
                    defaults = self._enter(group, defaults)
                    current = group
                if len(run) == 1:
                    self._update(p, g, self.state[position])
                else:
                    flat.update(self, run)
                updated += [item[1] for item in run]
        finally:
            self._restore(defaults)
        for modifier in self.modifiers:
            if hasattr(modifier, "modify_weights"):
                modifier.modify_weights(updated)
        for p in updated:
            p.mark_edited()

    @staticmethod
    def _regrouped(where):
        """The error of a step whose groups no longer hold the parameters it was given, in
        order (state is kept by position: each would be updated with another's)."""
        return RuntimeError(
            f"{where}: the parameters of param_groups are no longer those it was given (one "
            "added to or removed from a group's 'params' list by hand), so each would be "
            "updated with another's state; add parameters with add_param_group(...), or "
            "build the optimizer again; nothing was updated")

    @staticmethod
    def _check_gradients(pending, grads, where, source):
        """Each gradient must be an array of its parameter's type, device, shape and a float
        dtype: an op's ``_back`` that forgot to sum a broadcast gradient leaves a wrong shape,
        which an in-place update would broadcast over the parameter silently."""
        for (position, p, _), g in zip(pending, grads):
            if g is None:
                continue
            data = p._data
            if type(g) is type(data) and g.shape == data.shape and g.dtype.kind == "f" and (
                    type(g) is _ndarray or g.device == data.device) and (
                    type(data) is not _ndarray or data.flags.writeable):
                continue
            if type(data) is _ndarray and not data.flags.writeable:
                raise ValueError(f"{where}: parameter {position} ({p._describe()}) holds a "
                                 "read-only array (e.g. from np.load(..., mmap_mode='r') or "
                                 "np.broadcast_to), which the update cannot change; give it a "
                                 "copy: p.data = p.data.copy(); nothing was updated")
            if not backend.is_array(g):
                found = f"is a {type(g).__name__}, not an array"
            elif backend.device_of(g) != backend.device_of(data):
                found = (f"is on {backend.device_of(g)}, the parameter on "
                         f"{backend.device_of(data)}")
            elif type(g) is not type(data):
                found = f"is a {type(g).__name__}, the parameter's data a {type(data).__name__}"
            elif g.shape != data.shape:
                found = f"has shape {g.shape}; it must have the parameter's shape {data.shape}"
            else:
                found = f"has dtype {g.dtype}; a gradient must be a float array"
            raise ValueError(f"{where}: the gradient of parameter {position} ({p._describe()})"
                             f"{source} {found}; nothing was updated")

    def _check_eps(self, pending, where):
        """An eps that rounds to 0 in a parameter's dtype (1e-8 in float16) makes the update of
        an element whose gradient is 0 be 0/0 = NaN: refused before any update."""
        if "eps" not in self.options:
            return
        smallest = min(group.get("eps", self.eps) for group in self.param_groups)
        if smallest >= _ROUNDS_TO_0_IN_NONE or smallest >= max(
                _rounds_to_0_below(dtype) for dtype in {p._data.dtype for _, p, _ in pending}):
            return          # (the default 1e-8 is 0 in float16 only: the dtypes at hand tell)
        for position, p, group in pending:
            eps = group.get("eps", self.eps)
            dtype = p._data.dtype
            if eps < _rounds_to_0_below(dtype) and numpy.asarray(eps, dtype=dtype) == 0:
                least = float(numpy.finfo(dtype).smallest_subnormal)
                raise ValueError(
                    f"{where}: eps {eps:g} is 0 in {dtype}, the dtype of parameter {position} "
                    f"({p._describe()}), so an element whose gradient is 0 would become NaN; "
                    f"give eps >= {least:.2g} (e.g. 1e-4 for float16); nothing was updated")

    def _check_state_shapes(self, pending, where):
        """A parameter whose data was given another shape (``p.data = ...``) no longer fits
        its state arrays: refused before any update (the update would fail midway)."""
        for position, p, _ in pending:
            shape = p._data.shape
            for key, value in self.state[position].items():
                # (at every step: a count passes on its type, a NumPy array without is_array)
                array = type(value) is _ndarray or (type(value) is not int
                                                    and backend.is_array(value))
                if array and value.shape != shape:
                    raise ValueError(
                        f"{where}: state '{key}' of parameter {position} ({p._describe()}) has "
                        f"shape {tuple(value.shape)}, the parameter's data now {p.shape}; "
                        f"forget the old state with optimizer.state[{position}] = {{}}; "
                        "nothing was updated")

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

    # -- saving and restoring (optim/saving.py)
    def state_dict(self):
        """The optimizer as plain data: its type, options, group options and per-parameter
        state (copies of the arrays, and JSON-able numbers): a snapshot, which later steps do
        not change."""
        return saving.state_dict(self)

    def load_state_dict(self, saved):
        """Restore what ``state_dict()`` returned (arrays may be NumPy or CuPy; they are copied
        in the parameter's dtype); every entry is checked before anything is changed, and a
        mismatch raises ValueError saying which."""
        saving.load_state_dict(self, saved)

    def check_state_dict(self, saved):
        """Raise ValueError when ``saved`` does not fit this optimizer's parameters, or holds
        an option out of range (the rules of the constructor) or a malformed state."""
        saving.check_state_dict(self, saved)


_RULES = {      # option -> (the fast test, the same rule as checks.in_range's bounds)
    "lr": (lambda value: value >= 0, {"low": 0}),
    "eps": (lambda value: value > 0, {"low": 0, "low_open": True}),
    "weight_decay": (lambda value: value >= 0, {"low": 0}),
}
_UNIT_INTERVAL = (lambda value: 0 <= value < 1, {"low": 0, "high": 1, "high_open": True})


def _follow(p, state):
    """Move ``state``'s arrays to ``p``'s device when ``p`` moved (``to_gpu``/``to_cpu``).

    It runs at every step, so an array of the parameter's own type (on its GPU, for CuPy)
    passes on that comparison alone; only other entries get the full device check."""
    data = p._data
    kind = type(data)
    for key, value in state.items():
        if type(value) is kind and (kind is _ndarray or value.device == data.device):
            continue
        if backend.is_array(value):
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
