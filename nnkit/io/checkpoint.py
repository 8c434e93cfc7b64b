"""``save`` and ``load``: a model's parameters and buffers, an optimizer's state and extra data
to and from one checkpoint file (the format: nnkit.io's docstring)."""
import json
import os
from collections import namedtuple

import numpy

from .. import backend
from ..core import NetOp
from ..distributed import rank, size
from .fileformat import (FORMAT, META_KEY, VERSION, CheckpointError, _atomic_write,
                         _check_arrays, _check_keys, _few, _plain, _read, _Reader,
                         _saved_arrays, _Writer)
from .model import _got, _has_topology, _rebuild_refusal, check_model
from .topology import (_check_topology, _encode_topology, _file_names, _rebuild,
                       _topology_constants)


Checkpoint = namedtuple("Checkpoint", "model extra")
Checkpoint.__doc__ = """What ``load`` returns: the model (given or rebuilt) and the ``extra`` data."""


def save(path, model, optimizer=None, extra=None, *, schedule=None, trainer=None, rng=True):
    """Write ``model``'s parameters and buffers (and ``optimizer``'s state, and ``extra``) to
    ``path``, one ``.npz``; returns path.

    ``model``: any Module (nested modules, an FFN, a SequenceModel, BatchNormStates inside:
    their running statistics are buffers and saved), or a dict or list, nested as you like, of
    parameters and Modules; arrays are named by ``named_vars()`` / ``named_buffers()`` (see the
    module's docstring). An FFN's topology is saved too, so ``load`` can rebuild it.
    ``optimizer``: an nnkit optimizer over parameters of the model (``model.vars``); its
    options and per-parameter state are saved by parameter name. ``extra`` is any JSON-able
    data (epoch, metrics, ...): dicts with string keys, lists, strings, numbers (NumPy numbers
    become Python numbers; tuples come back as lists).

    What resuming a training needs besides (``load`` restores each when given the same
    keyword; see docs/resuming.md): ``schedule``, a learning-rate schedule (its count and base
    rates); ``trainer``, a Trainer (its epoch, steps and History); ``rng``, nnkit's random
    generator (dropout masks, shuffles): True (the default) stores this process's state
    (``nnkit.get_rng_state()``), False none, and a list of states one per rank
    (``nnkit.distributed.rng_states()``, called on every rank) every rank's, for a
    data-parallel job saved by one rank.

    The write is atomic. Everything is checked before the file is written, so a refused save
    leaves an existing checkpoint as it was: TypeError for a model, a part of a model or
    ``extra`` that cannot be stored (naming where it is and what it is), ValueError for an
    optimizer that updates a parameter the model does not hold (its state would be restored
    without its value).
    """
    target = _file_path(path, "save")
    if target.endswith(os.sep) or os.path.isdir(target):
        raise IsADirectoryError(f"save: '{target}' is a folder (or ends with '{os.sep}'); give "
                                "a file name")
    model_ = check_model(model, "save")
    _check_keys(extra, "extra")
    writer = _Writer()
    meta = {"format": FORMAT, "version": VERSION,
            "model": {"type": type(model).__name__, "why": _rebuild_refusal(model)},
            "params": [{"name": name, "array": writer.add(p._data),
                        **({} if p.requires_grad else {"constant": True}),
                        **({"bias": True} if getattr(p, "is_bias", False) else {})}
                       for name, p in model_.params.items()],
            "buffers": [{"name": name, "array": writer.add(array)}
                        for name, array in model_.buffers.items()],
            "topology": _encode_topology(model, model_, writer) if _has_topology(model)
            else None,
            "optimizer": None, "extra": _plain(extra)}
    if optimizer is not None:
        meta["optimizer"] = _encode_optimizer(optimizer, model_.params, writer)
    meta.update(_encode_resume(schedule, trainer, rng))
    try:
        text = json.dumps(meta)
    except (TypeError, ValueError) as error:
        raise TypeError(f"save: extra (or an option) is not JSON-able: {error}") from None
    writer.arrays[META_KEY] = numpy.frombuffer(text.encode("utf-8"), dtype=numpy.uint8)
    _atomic_write(target, writer.arrays)
    return path


def _file_path(path, where):
    """``path`` (a str, bytes or path object) as a str; TypeError naming ``where`` else."""
    try:
        return os.fsdecode(os.fspath(path))
    except TypeError:
        raise TypeError(f"{where}: path must be a str or a path, got {type(path).__name__} "
                        f"{path!r}") from None


def _check_optimizer(optimizer, where):
    if not (callable(getattr(optimizer, "state_dict", None)) and hasattr(optimizer, "params")
            and callable(getattr(optimizer, "load_state_dict", None))):
        raise TypeError(f"{where}: optimizer must be an nnkit optimizer, got {_got(optimizer)}")


def _encode_optimizer(optimizer, params, writer):
    _check_optimizer(optimizer, "save")
    names = {id(p): name for name, p in params.items()}
    for position, p in enumerate(optimizer.params):
        if id(p) not in names:
            raise ValueError(f"save: the optimizer updates parameter {position} "
                             f"({p._describe()}), which is not in the model; save the "
                             "model that holds every parameter the optimizer updates")
    state = optimizer.state_dict()
    return {"type": state["type"], "sizes": state["sizes"],
            "options": _plain(state["options"]), "groups": _plain(state["groups"]),
            "param_names": [names[id(p)] for p in optimizer.params],
            "state": [{key: {"array": writer.add(value)} if backend.is_array(value)
                       else _plain(value) for key, value in entry.items()}
                      for entry in state["state"]]}


def load(path, model=None, optimizer=None, ops=None, *, schedule=None, trainer=None,
         rng=False):
    """Read a checkpoint; returns ``Checkpoint(model, extra)``.

    With ``model`` (whatever ``save`` takes: a Module, nested or not, an FFN, a dict or list
    of parameters and Modules) every parameter and buffer of the model must be in the file
    under its name with the same shape and dtype, and the file must hold nothing else; then
    they are overwritten in place (each keeps its identity and device, so shared weights stay
    shared and an optimizer over ``model.vars`` keeps working; gradients are forgotten). An FFN
    must also have the saved ops, and the same data arguments (arrays and numbers in its
    topology, such as a normalisation mean or a slope: they are not parameters, so load does
    not set them). ``optimizer`` (over the model's parameters, listed in the
    order the saved one listed them, which is checked by parameter name: another order or
    another set is refused) gets its saved options and state.

    Without ``model``, the model is rebuilt: an FFN from its topology (BatchNormStates
    included), or a flat dict dotted name -> NetVar for parameters saved from a dict or list;
    any other model cannot be rebuilt from data and is refused (CheckpointError naming it).
    ``ops`` maps extra op names to classes for user ops in a topology.

    To resume a training exactly, give what ``save`` stored besides: ``schedule`` gets its
    count and base rates (after the optimizer its options), ``trainer`` its epoch, steps and
    History, and ``rng=True`` sets nnkit's random generator to the saved state (this rank's,
    for a file that holds every rank's). ``rng`` is False by default: loading weights, to
    evaluate or to fine-tune, leaves the program's random stream alone. Each raises
    CheckpointError, before anything is changed, when the file does not hold it (older files,
    ``rng=False`` at save), or holds one that does not fit (another kind of schedule, another
    number of ranks).

    Version 1 files (before Modules) load too. Raises ``FileNotFoundError`` for a missing file
    and ``CheckpointError`` for a corrupted, truncated or mismatching one, naming the first
    difference; nothing is changed then (parameters, buffers, gradients, optimizer).
    """
    path = _file_path(path, "load")
    target = None if model is None else check_model(model, "load")
    if optimizer is not None:
        _check_optimizer(optimizer, "load")
    if ops is not None:
        if not isinstance(ops, dict):
            raise TypeError(f"load: ops must be a dict name -> op class, got "
                            f"{type(ops).__name__}")
        for name, op in ops.items():
            if not (isinstance(op, type) and issubclass(op, NetOp)):
                raise TypeError(f"load: ops[{name!r}] is {type(op).__name__} "
                                f"{getattr(op, '__name__', op)}, not an op class")
    _check_resume_arguments(schedule, trainer, rng)
    arrays, meta = _read(path)
    version = meta["version"]
    try:
        resume = _resume_state(path, meta, schedule, trainer, rng)
        source = _Reader(path, arrays)
        params = _saved_arrays(path, meta["params"], "parameter", source)
        buffers = _saved_arrays(path, meta["buffers"], "buffer", source) if version >= 2 else {}
        if model is None:
            if optimizer is not None:
                raise CheckpointError(f"load: '{path}': give the model whose parameters the "
                                      "optimizer updates")
            rebuilt = _rebuild(path, meta, params, buffers, source, ops)
            _restore(resume)
            return Checkpoint(rebuilt, meta.get("extra"))
        names = _file_names(target.root, target.params, version, params)   # model -> file name
        if _has_topology(model) and meta.get("topology") is not None:
            # an FFN's constants that an older file holds only in its topology
            kept = _topology_constants(meta["topology"])
            for name in target.root.named_constants():
                if names[name] not in params and name in kept:
                    params[names[name]] = source.get(kept[name], f"topology constant '{name}'")
        _check_arrays(path, "parameter", {names[name]: p._data
                                          for name, p in target.params.items()}, params)
        _check_arrays(path, "buffer", target.buffers, buffers)
        if _has_topology(model) and meta.get("topology") is not None:
            _check_topology(path, model, meta["topology"], source)
        state = None if optimizer is None else _optimizer_state(
            path, meta, source, optimizer,
            {id(p): names[name] for name, p in target.params.items()})
    except (KeyError, TypeError, AttributeError, IndexError) as error:
        raise CheckpointError(f"load: '{path}' is corrupted: its description is malformed "
                              f"({type(error).__name__}: {error})") from None
    values = {name: params[names[name]] for name in target.params}    # everything checked:
    values.update(buffers)                                            # now assign
    try:                # (it checks every array, a buffer's values too, before it assigns)
        target.root.load_state(values)
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"load: '{path}' does not fit the model: {error}") from None
    if state is not None:
        optimizer.load_state_dict(state)
    _restore(resume)
    return Checkpoint(model, meta.get("extra"))


def _optimizer_state(path, meta, source, optimizer, names):
    saved = meta.get("optimizer")
    if saved is None:
        raise CheckpointError(f"load: '{path}' has no optimizer state")
    mine = [names.get(id(p)) for p in optimizer.params]
    theirs = list(saved["param_names"])
    if mine != theirs:
        position = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b),
                        min(len(mine), len(theirs)))

        def which(listed):
            if position >= len(listed):
                return "none"
            return "one the model does not hold" if listed[position] is None else \
                f"'{listed[position]}'"

        first = f"parameter {position}: {which(theirs)} in the file, {which(mine)} in this one"
        raise CheckpointError(f"load: '{path}': the saved optimizer updated parameters "
                              f"{_few(theirs)}, this one updates {_few(mine)} ({first})")
    state = {"type": saved["type"], "sizes": saved["sizes"], "options": saved["options"],
             "groups": saved["groups"],
             "state": [{key: source.get(value["array"], f"optimizer state '{key}' of "
                                        f"parameter {position}")
                        if isinstance(value, dict) else value for key, value in entry.items()}
                       for position, entry in enumerate(saved["state"])]}
    try:
        optimizer.check_state_dict(state)
    except ValueError as error:
        raise CheckpointError(f"load: '{path}': {error}") from None
    return state


# ----------------------------------------------------------------------------- resuming
# The schedule, the trainer and the random generator: plain data in the JSON description
# (keys "schedule", "trainer" and "rng", absent from older files), checked with the objects'
# own check_state_dict before anything is assigned.

_STATEFUL = ("state_dict", "check_state_dict", "load_state_dict")


def _check_stateful(value, what, where):
    if not all(callable(getattr(value, name, None)) for name in _STATEFUL):
        raise TypeError(f"{where}: {what} must be an nnkit {what} (with state_dict, "
                        f"check_state_dict and load_state_dict), got {_got(value)}")


def _encode_resume(schedule, trainer, rng):
    """The JSON entries of ``save``'s ``schedule``, ``trainer`` and ``rng`` (checked)."""
    meta = {}
    for what, value in (("schedule", schedule), ("trainer", trainer)):
        if value is not None:
            _check_stateful(value, what, "save")
            state = _plain(value.state_dict())
            _check_keys(state, what)
            meta[what] = {"type": type(value).__name__, "state": state}
    if isinstance(rng, (bool, numpy.bool_)):
        if rng:
            meta["rng"] = [backend.get_rng_state()]
    elif isinstance(rng, (list, tuple)) and rng:
        for position, state in enumerate(rng):
            backend.generator_from_state(state, f"save: rng[{position}]")
        meta["rng"] = [_plain(state) for state in rng]
    else:
        raise TypeError(f"save: rng must be True (this process's generator state), False or "
                        f"a list of every rank's (nnkit.distributed.rng_states()), got "
                        f"{_got(rng)}")
    return meta


def _check_resume_arguments(schedule, trainer, rng):
    """``load``'s ``schedule``, ``trainer`` and ``rng``, before the file is read."""
    for what, value in (("schedule", schedule), ("trainer", trainer)):
        if value is not None:
            _check_stateful(value, what, "load")
    if not isinstance(rng, (bool, numpy.bool_)):
        raise TypeError(f"load: rng must be True or False, got {_got(rng)}")


def _resume_state(path, meta, schedule, trainer, rng):
    """``([(object, state)], generator or None)``: what to restore, each checked against the
    file (CheckpointError naming what is missing or wrong)."""
    restore = []
    for what, value in (("schedule", schedule), ("trainer", trainer)):
        if value is None:
            continue
        saved = meta.get(what)
        if saved is None:
            raise CheckpointError(f"load: '{path}' has no {what} state (saved without "
                                  f"{what}=, or by an older nnkit)")
        if saved.get("type") != type(value).__name__:
            raise CheckpointError(f"load: '{path}' holds the state of a {saved.get('type')}, "
                                  f"not of a {type(value).__name__}")
        state = saved["state"]
        try:
            value.check_state_dict(state)
        except (TypeError, ValueError) as error:
            raise CheckpointError(f"load: '{path}': its {what} state does not fit: "
                                  f"{error}") from None
        restore.append((value, state))
    generator = None
    if rng:
        states = meta.get("rng")
        if states is None:
            raise CheckpointError(f"load: '{path}' has no random generator state (saved with "
                                  "rng=False, or by an older nnkit)")
        if not isinstance(states, list) or not states:
            raise CheckpointError(f"load: '{path}' is corrupted: its random generator states "
                                  f"are {type(states).__name__} {_few([states])}, not a list "
                                  "of one per rank")
        if len(states) != size():
            raise CheckpointError(
                f"load: '{path}' holds the random generator states of {len(states)} "
                f"process(es), this job has {size()}: each rank needs its own stream (save "
                "every rank's with rng=nnkit.distributed.rng_states())")
        try:
            generator = backend.generator_from_state(states[rank()], "load")
        except (TypeError, ValueError) as error:
            raise CheckpointError(f"load: '{path}': its random generator state is "
                                  f"corrupted: {error}") from None
    return restore, generator


def _restore(resume):
    """Assign what ``_resume_state`` checked (after the model and the optimizer: a schedule
    sets the optimizer's learning rates)."""
    restore, generator = resume
    for value, state in restore:
        value.load_state_dict(state)
    if generator is not None:
        backend.set_rng_state(generator.bit_generator.state)
