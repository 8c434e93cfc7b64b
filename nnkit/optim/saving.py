"""An optimizer as plain data: ``state_dict``, ``load_state_dict`` and the check of a saved
state (``Optimizer``'s methods of those names call these)."""
import numpy

from .. import backend, checks


def state_dict(optimizer):
    """The optimizer as plain data: its type, options, group options and per-parameter
    state (copies of the arrays, and JSON-able numbers): a snapshot, which later steps do
    not change."""
    return {
        "type": type(optimizer).__name__,
        "options": {key: getattr(optimizer, key) for key in optimizer.options},
        "groups": [{key: value for key, value in group.items() if key != "params"}
                   for group in optimizer.param_groups],
        "sizes": [len(group["params"]) for group in optimizer.param_groups],
        "state": [{key: value.copy() if backend.is_array(value) else value
                   for key, value in state.items()} for state in optimizer.state],
    }


def load_state_dict(optimizer, saved):
    """Restore what ``state_dict()`` returned (arrays may be NumPy or CuPy; they are copied
    in the parameter's dtype); every entry is checked before anything is changed, and a
    mismatch raises ValueError saying which."""
    check_state_dict(optimizer, saved)
    for key, value in saved["options"].items():
        setattr(optimizer, key, value)
    for group, options in zip(optimizer.param_groups, saved["groups"]):
        params = group["params"]
        group.clear()
        group.update(params=params, **options)
    for position, (p, state) in enumerate(zip(optimizer.params, saved["state"])):
        xp = backend.array_module(p._data)
        optimizer.state[position] = {
            key: xp.array(value, dtype=p._data.dtype) if backend.is_array(value) else value
            for key, value in state.items()}


def check_state_dict(optimizer, saved):
    """Raise ValueError when ``saved`` does not fit this optimizer's parameters, or holds
    an option out of range (the rules of the constructor) or a malformed state."""
    name = type(optimizer).__name__
    where = f"{name}.load_state_dict"
    if not isinstance(saved, dict):
        raise TypeError(f"{where}: expects the dict state_dict() returns, got "
                        f"{type(saved).__name__}")
    for key in ("type", "options", "groups", "sizes", "state"):
        if key not in saved:
            raise ValueError(f"{where}: the state is missing '{key}'")
    if saved["type"] != name:
        raise ValueError(f"{where}: the state is of a {saved['type']} optimizer")
    for key, kind, items in (("options", dict, None), ("sizes", (list, tuple), int),
                             ("groups", (list, tuple), dict), ("state", (list, tuple), dict)):
        value = saved[key]
        if not isinstance(value, kind) or items is not None and not all(
                isinstance(item, items) for item in value):
            raise ValueError(f"{where}: the state's '{key}' is malformed (got "
                             f"{type(value).__name__} {value!r:.60})")
    sizes = [len(group["params"]) for group in optimizer.param_groups]
    if list(saved["sizes"]) != sizes:
        raise ValueError(f"{where}: saved parameter groups have sizes "
                         f"{saved['sizes']}, this optimizer's are {sizes}")
    unknown = sorted(set(saved["options"]) - set(optimizer.options))
    if unknown:
        raise ValueError(f"{where}: unknown option(s) {unknown}; options are "
                         f"{list(optimizer.options)}")
    optimizer._check_options(saved["options"], where)
    if len(saved["groups"]) != len(optimizer.param_groups):
        raise ValueError(f"{where}: the state has {len(saved['groups'])} parameter groups' "
                         f"options, this optimizer has {len(optimizer.param_groups)} groups")
    for index, options in enumerate(saved["groups"]):
        optimizer._check_group(options, index, where)
    if len(saved["state"]) != len(optimizer.params):
        raise ValueError(f"{where}: the state holds a list of {len(saved['state'])} "
                         f"parameter states, this optimizer has {len(optimizer.params)} "
                         "parameters")
    expected = None if optimizer.state_arrays is None else \
        sorted((*optimizer.state_arrays, *optimizer.state_counts))
    for position, (p, state) in enumerate(zip(optimizer.params, saved["state"])):
        if expected is not None and state and sorted(state) != expected:
            raise ValueError(f"{where}: state of parameter {position} has keys "
                             f"{sorted(state)}, expected {expected} (or none)")
        for key, value in state.items():
            if key in optimizer.state_counts:
                if not (checks.is_integer(value) and value >= 1):
                    raise ValueError(f"{where}: state '{key}' of parameter {position} must "
                                     f"be an int >= 1, got {value!r}")
            elif backend.is_array(value):
                if value.dtype.kind != "f":
                    raise ValueError(f"{where}: state '{key}' of parameter {position} must "
                                     f"be a float array, got dtype {value.dtype}")
                if tuple(value.shape) != p.shape:
                    raise ValueError(f"{where}: state '{key}' of parameter {position} has "
                                     f"shape {tuple(value.shape)}, the parameter has shape "
                                     f"{p.shape}")
                xp = backend.array_module(value)
                with numpy.errstate(over="ignore"):   # as load_state_dict will cast it
                    value = value.astype(p._data.dtype)
                if not bool(xp.isfinite(value).all()):
                    raise ValueError(f"{where}: state '{key}' of parameter {position} holds "
                                     "values that are not finite (NaN or inf)")
                if key in optimizer.state_squares and bool((value < 0).any()):
                    raise ValueError(f"{where}: state '{key}' of parameter {position} is a "
                                     "running square and holds negative values")
            elif key in (optimizer.state_arrays or ()):
                raise ValueError(f"{where}: state '{key}' of parameter {position} must be "
                                 f"an array, got {type(value).__name__}")
