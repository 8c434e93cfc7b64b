"""Checkpoints: parameters, buffers and optimizer state in one .npz (+ JSON; never pickle or eval).

    nn.save("model.npz", model, optimizer=opt, extra={"epoch": 7})
    nn.load("model.npz", model, optimizer=opt)       # restore into the existing objects
    net = nn.load("model.npz").model                  # or rebuild an FFN from the file

What ``model`` may be (for ``save`` and ``load`` alike):

- any ``nn.Module``, nested as deep as you like: an FFN, a SequenceModel, your own subclass
  holding modules, parameters, BatchNormStates and lists or dicts of them. Its parameters and
  buffers are stored under the dotted names of ``named_vars()`` and ``named_buffers()``
  (``blocks.0.fc.W``, ``bn.running_mean``). An FFN names by place, ``topology.<entry>.<argument>``:
  ``topology.0.1`` is the W of ``(Multiply, W)``, and the running statistics of
  ``(BatchNorm, gamma, beta, state)`` at entry 3 are ``topology.3.3.running_mean`` and
  ``topology.3.3.running_var``; an FFN inside an FFN adds its place (``topology.0.0.topology.0.1``);
- a dict, list or tuple, nested as you like, of parameters (leaf NetVars that require a
  gradient) and Modules, named by keys and indices: ``{"enc": {"w": w}, "layers": [block]}``
  stores ``enc.w`` and ``layers.0.<the block's names>``. Anything else in it (a constant, a
  number, None) is refused, naming where it is and what it is.

A parameter reachable under several names (a shared weight) is stored once, under its first
name, as ``named_vars()`` lists it; ``load`` assigns into the existing objects, so what is
shared in the model stays shared. A BatchNormState's ``num_batches_tracked``, ``momentum`` and
``eps`` are settings, not buffers: they are restored only when an FFN is rebuilt.

The file (format version 2). One ``.npz`` holds every array (host copies, so a checkpoint
written from GPU data loads in a NumPy-only session) and, under the key ``__nnkit__``, a UTF-8
JSON description: ``format`` and ``version``; ``model``, the saved object's type and, when
``load`` cannot rebuild it without a model, why; ``params`` and ``buffers``, each name with its
array's key, shape and dtype; ``optimizer``, its type, options, group options and sizes, the
names of the parameters it updates in its order (so its per-parameter state maps to the model
by name, whatever order the optimizer lists them in) and that state (numbers inline, arrays by
key); ``extra``; and for an FFN its ``topology`` as plain data: op names with arguments that are
parameter references, BatchNormStates (features, momentum, eps, batches seen, the names of its
two buffers), constants (arrays by key) or numbers. An entry that cannot be described as data (a
function, a Module other than an FFN, an argument of another type) keeps its label and the
reason, with ``args`` null: saving works, rebuilding refuses. Loading maps op names through a
registry of nnkit's public op classes (``ops=`` adds your own) and reads with
``numpy.load(..., allow_pickle=False)``.

Version 1 files (nnkit before Modules) still load. Version 1 had no buffers and named an FFN's
parameters ``<entry>.<Op>.<argument>`` (``0.Multiply.1``; ``2.FFN.0.Multiply.1`` inside a nested
FFN): loading one into an FFN maps those names onto the model's parameters, and dicts and lists
were named as they are now. Rebuilding works as for version 2.

Without a model, ``load`` rebuilds an FFN from its topology (BatchNormStates included, shared
weights and states still shared), and returns what was saved from a dict or list of parameters
as one flat dict of dotted name → NetVar. Any other model (a Module that is not an FFN, an FFN
with an entry that is not data, a dict holding a Module) cannot be rebuilt from data: ``load``
raises CheckpointError naming it; give the model to load into.

io knows no model class: a model saved with its topology implements a small protocol. It is a
Module with ``topology``, a list of ``(op, *args)`` entries where ``(model,)`` holds another
such model; its class registers with ``saved_with_topology``, which also names the class
``load`` rebuilds a topology with (``cls(*entries)``). ``nnkit.nets.ffn`` registers FFN, so io
sits below the networks: nets import io, io imports no net. ``check_model(model, where)`` lists
and checks a model as ``save`` does (``SaveBest`` uses it to refuse a model when it is built).

Safety: ``save`` checks everything first (a refused save leaves an existing file as it was),
then writes a temporary file in the target's directory and renames it over the target
(``os.replace``), so a crash mid-save leaves the previous checkpoint intact. ``load`` reads and
checks everything (file integrity, every name, shape and dtype of parameters and buffers, the
topology, the optimizer's state) before assigning anything: on any mismatch it raises
``CheckpointError`` naming the first difference, and the model's parameters, buffers and
gradients and the optimizer are unchanged.
"""

__all__ = ['save', 'load', 'Checkpoint', 'CheckpointError']
import json
import os
import tempfile
from collections import namedtuple

import numpy

from . import backend, ops
from .core import NetOp, NetVar
from .module import Module
from .ops.normalization import BatchNormState

FORMAT = "nnkit-checkpoint"
VERSION = 2
READABLE = (1, 2)           # the versions load reads
META_KEY = "__nnkit__"

Checkpoint = namedtuple("Checkpoint", "model extra")
Checkpoint.__doc__ = """What ``load`` returns: the model (given or rebuilt) and the ``extra`` data."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not match the model or optimizer."""


_topology_model = None      # the class registered by saved_with_topology (FFN)


def saved_with_topology(cls):
    """Class decorator: save ``cls``'s models with their topology, rebuild them on load.

    ``cls`` is a Module with ``topology`` (a list of ``(op, *args)`` entries; ``(model,)`` is a
    model of ``cls`` inside) whose parameters are the NetVar arguments of its entries, and
    ``cls(*entries)`` builds one. One class holds this role; nnkit's FFN does.
    """
    global _topology_model
    _topology_model = cls
    return cls


def _has_topology(value):
    return _topology_model is not None and isinstance(value, _topology_model)


def _op_registry():
    """Public op name -> class, from nnkit.ops (first name wins for aliases)."""
    registry = {}
    for name in ops.__all__:
        op = getattr(ops, name)
        if isinstance(op, type) and issubclass(op, NetOp):
            registry.setdefault(name, op)
    return registry


# ----------------------------------------------------------------------------- the model

_Model = namedtuple("_Model", "root params buffers")
_KINDS = ("a Module (an FFN, a SequenceModel, your own nn.Module), or a dict or list of "
          "parameters (NetVars) and Modules")


class _Collection(Module):
    """A dict, list or tuple of parameters and Modules seen as a Module: its members are the
    items, named by key or index, so the names, the checks and the assignment are Module's."""

    def __init__(self, value):
        self.value = value

    def members(self):
        items = self.value.items() if isinstance(self.value, dict) else enumerate(self.value)
        return [(str(key), item) for key, item in items]


def check_model(model, where="save"):
    """The parameters and buffers ``save`` would store for ``model``, by name.

    Returns ``(root, params, buffers)``: a Module to assign through (``model`` itself, or the
    dict or list seen as one), dotted name -> NetVar and dotted name -> array. Raises TypeError
    (ValueError for a model that cannot list its parameters, such as an FFN inside itself),
    starting with ``where`` and naming what was given, for a model that cannot be saved.
    """
    try:
        if isinstance(model, Module):
            root = model
        elif isinstance(model, (dict, list, tuple)):
            _check_collection(model, where)
            root = _Collection(model)
        else:
            hint = "; write [w] or {'w': w}" if isinstance(model, NetVar) else ""
            raise TypeError(f"{where}: the model must be {_KINDS}, got {_got(model)}{hint}")
        return _Model(root, root.named_vars(), root.named_buffers())
    except (TypeError, ValueError) as error:
        if str(error).startswith(f"{where}:"):
            raise
        raise (TypeError if isinstance(error, TypeError) else ValueError)(
            f"{where}: {error}") from None


def _got(value):
    """A value as an error shows it: its type, and a short repr."""
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"{type(value).__name__} {shown}"


def _holds_buffers(value):
    names = getattr(type(value), "buffers", ())
    return not isinstance(value, type) and bool(names) and isinstance(names, tuple)


def _join(prefix, name):
    return f"{prefix}.{name}" if prefix else name


def _check_collection(model, where):
    """Refuse what a dict or list to save must not hold, and two objects under one name."""
    claimed = {}                # name -> (id of the object, where it is)

    def claim(name, value, place):
        other = claimed.setdefault(name, (id(value), place))
        if other[0] != id(value):
            raise TypeError(f"{where}: {other[1]} and {place} would both be saved as "
                            f"'{name}'; rename a key")

    def visit(value, name, place, inside):
        if isinstance(value, NetVar):
            if value.parents or not value.requires_grad:
                what = ("is computed by an op" if value.parents else
                        "does not require a gradient (a constant)")
                raise TypeError(f"{where}: {place} is a NetVar that {what}; a checkpoint holds "
                                "parameters (leaf NetVars that require a gradient) and buffers")
            claim(name, value, place)
        elif isinstance(value, Module):
            for inner, p in value.named_vars().items():
                claim(_join(name, inner), p, place)
            for inner, array in value.named_buffers().items():
                claim(_join(name, inner), array, place)
        elif _holds_buffers(value):
            for attribute in type(value).buffers:
                if backend.is_array(getattr(value, attribute, None)):
                    claim(_join(name, attribute), getattr(value, attribute), place)
        elif isinstance(value, (dict, list, tuple)):
            if id(value) in inside:
                raise ValueError(f"{where}: {place} contains itself")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                visit(item, _join(name, str(key)), f"{place}[{key!r}]", inside | {id(value)})
        else:
            raise TypeError(f"{where}: {place} is {_got(value)}, not a parameter (a NetVar), "
                            "a Module, or a dict or list of them")

    visit(model, "", "model", frozenset())


def _rebuild_refusal(model):
    """Why ``load`` cannot rebuild ``model`` without it (None when it can): only an FFN and
    dicts and lists of parameters are rebuilt from data."""
    if _has_topology(model):
        return None             # each topology entry says for itself
    if isinstance(model, Module):
        return f"the model is a {type(model).__name__}"

    def find(value, place):
        if isinstance(value, (dict, list, tuple)):
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                found = find(item, f"{place}[{key!r}]")
                if found:
                    return found
        elif not isinstance(value, NetVar):
            return f"{place} is a {type(value).__name__}"
        return None

    return find(model, "model")


# ----------------------------------------------------------------------------- save

def save(path, model, optimizer=None, extra=None):
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

    The write is atomic. Everything is checked before the file is written, so a refused save
    leaves an existing checkpoint as it was: TypeError for a model, a part of a model or
    ``extra`` that cannot be stored (naming where it is and what it is), ValueError for an
    optimizer that updates a parameter the model does not hold (its state would be restored
    without its value).
    """
    model_ = check_model(model, "save")
    _check_keys(extra, "extra")
    writer = _Writer()
    meta = {"format": FORMAT, "version": VERSION,
            "model": {"type": type(model).__name__, "why": _rebuild_refusal(model)},
            "params": [{"name": name, "array": writer.add(p._data)}
                       for name, p in model_.params.items()],
            "buffers": [{"name": name, "array": writer.add(array)}
                        for name, array in model_.buffers.items()],
            "topology": _encode_topology(model, model_, writer) if _has_topology(model)
            else None,
            "optimizer": None, "extra": _plain(extra)}
    if optimizer is not None:
        meta["optimizer"] = _encode_optimizer(optimizer, model_.params, writer)
    try:
        text = json.dumps(meta)
    except (TypeError, ValueError) as error:
        raise TypeError(f"save: extra (or an option) is not JSON-able: {error}") from None
    writer.arrays[META_KEY] = numpy.frombuffer(text.encode("utf-8"), dtype=numpy.uint8)
    _atomic_write(os.fspath(path), writer.arrays)
    return path


def _encode_optimizer(optimizer, params, writer):
    if not (callable(getattr(optimizer, "state_dict", None)) and hasattr(optimizer, "params")):
        raise TypeError(f"save: optimizer must be an nnkit optimizer, got {_got(optimizer)}")
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


def _check_keys(value, where):
    """JSON turns a dict key 1 into "1": refuse keys that would not load as they were saved."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"save: {where} has the key {key!r} ({type(key).__name__}); "
                                f"JSON keys are strings, so it would load as '{key}'")
            _check_keys(item, f"{where}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for position, item in enumerate(value):
            _check_keys(item, f"{where}[{position}]")


class _Writer:
    """Collects host copies of arrays under short keys ("a0", "a1", ...) with their shapes."""

    def __init__(self):
        self.arrays = {}
        self.count = 0

    def add(self, array):
        key = f"a{self.count}"
        self.count += 1
        self.arrays[key] = numpy.asarray(backend.to_cpu(array))
        return {"key": key, "shape": list(array.shape), "dtype": str(array.dtype)}

    def forget_since(self, count):
        """Drop the arrays added after ``count`` were (an entry given up half-way)."""
        for number in range(count, self.count):
            self.arrays.pop(f"a{number}", None)


def _plain(value):
    """Options and numbers as JSON types (NumPy scalars become Python numbers)."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, numpy.generic):
        return value.item()
    return value


class _NotData(Exception):
    """An FFN argument that cannot be described as data."""


def _op_label(op):
    """``(label, why)`` for a topology entry's op: its public nnkit name (or class name, for a
    user op: rebuilding it needs ``ops={name: cls}``) and None, or a label and why it cannot be
    rebuilt from data (a Module other than an FFN, a function, a class named like an nnkit op)."""
    if isinstance(op, type) and issubclass(op, NetOp):
        registry = _op_registry()
        for name, cls in registry.items():
            if cls is op:
                return name, None
        if op.__name__ in registry:
            return op.__name__, (f"the op class {op.__module__}.{op.__qualname__}, which is "
                                 f"not nnkit's {op.__name__}")
        return op.__name__, None
    if isinstance(op, Module):
        return type(op).__name__, f"a {type(op).__name__} (a Module other than an FFN)"
    label = getattr(op, "__name__", type(op).__name__)
    return label, f"the function {label}"


def _encode_topology(net, model, writer):
    params = {id(p): name for name, p in model.params.items()}
    buffers = {}
    for name, array in model.buffers.items():
        buffers.setdefault(id(array), name)

    def encode(value):
        if isinstance(value, NetVar):
            if id(value) in params:
                return {"param": params[id(value)]}
            return {"const": writer.add(value._data), "requires_grad": value.requires_grad}
        if isinstance(value, BatchNormState):
            names = [buffers.get(id(getattr(value, attribute, None)))
                     for attribute in BatchNormState.buffers]
            if None in names:
                raise _NotData("a BatchNormState whose running statistics are not arrays")
            return {"batchnorm": {"features": value.features, "momentum": _plain(value.momentum),
                                  "eps": _plain(value.eps),
                                  "batches": int(value.num_batches_tracked),
                                  "running_mean": names[0], "running_var": names[1]}}
        if backend.is_array(value):
            return {"array": writer.add(value)}
        if isinstance(value, tuple):
            return {"tuple": [encode(item) for item in value]}
        if isinstance(value, list):
            return {"list": [encode(item) for item in value]}
        if isinstance(value, numpy.generic):
            return value.item()
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise _NotData(f"a {type(value).__name__}")

    def entry_data(entry):
        op, args = entry[0], entry[1:]
        if _has_topology(op):
            return {"ffn": entries(op)}
        label, why = _op_label(op)
        if why is None:
            count = writer.count
            try:
                return {"op": label, "args": [encode(value) for value in args]}
            except _NotData as error:
                writer.forget_since(count)
                why = f"{label} with an argument that is not data ({error})"
        return {"op": label, "args": None, "why": why}

    def entries(net):
        return [entry_data(entry) for entry in net.topology]

    return entries(net)


def _atomic_write(path, arrays):
    """Write the .npz to a temporary file next to ``path``, then rename it over ``path``."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"save: the directory '{directory}' does not exist")
    mode = os.stat(path).st_mode & 0o777 if os.path.exists(path) else 0o644
    handle, temporary = tempfile.mkstemp(dir=directory, suffix=".tmp",
                                         prefix="." + os.path.basename(path) + ".")
    try:
        with os.fdopen(handle, "wb") as file:
            numpy.savez(file, **arrays)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, mode)       # mkstemp makes it private (0600)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


# ----------------------------------------------------------------------------- load

def load(path, model=None, optimizer=None, ops=None):
    """Read a checkpoint; returns ``Checkpoint(model, extra)``.

    With ``model`` (whatever ``save`` takes: a Module, nested or not, an FFN, a dict or list
    of parameters and Modules) every parameter and buffer of the model must be in the file
    under its name with the same shape and dtype, and the file must hold nothing else; then
    they are overwritten in place (each keeps its identity and device, so shared weights stay
    shared and an optimizer over ``model.vars`` keeps working; gradients are forgotten). An FFN
    must also have the saved ops. ``optimizer`` (over the model's parameters, in any order: its
    state is matched by parameter name) gets its saved options and state.

    Without ``model``, the model is rebuilt: an FFN from its topology (BatchNormStates
    included), or a flat dict dotted name -> NetVar for parameters saved from a dict or list;
    any other model cannot be rebuilt from data and is refused (CheckpointError naming it).
    ``ops`` maps extra op names to classes for user ops in a topology.

    Version 1 files (before Modules) load too. Raises ``FileNotFoundError`` for a missing file
    and ``CheckpointError`` for a corrupted, truncated or mismatching one, naming the first
    difference; nothing is changed then (parameters, buffers, gradients, optimizer).
    """
    path = os.fspath(path)
    target = None if model is None else check_model(model, "load")
    if ops is not None:
        if not isinstance(ops, dict):
            raise TypeError(f"load: ops must be a dict name -> op class, got "
                            f"{type(ops).__name__}")
        for name, op in ops.items():
            if not (isinstance(op, type) and issubclass(op, NetOp)):
                raise TypeError(f"load: ops[{name!r}] is {type(op).__name__} "
                                f"{getattr(op, '__name__', op)}, not an op class")
    arrays, meta = _read(path)
    version = meta["version"]
    try:
        source = _Reader(path, arrays)
        params = _saved_arrays(path, meta["params"], "parameter", source)
        buffers = _saved_arrays(path, meta["buffers"], "buffer", source) if version >= 2 else {}
        if model is None:
            if optimizer is not None:
                raise CheckpointError(f"load: '{path}': give the model whose parameters the "
                                      "optimizer updates")
            return Checkpoint(_rebuild(path, meta, params, buffers, source, ops),
                              meta.get("extra"))
        names = _file_names(model, target.params, version)    # model name -> name in the file
        _check_arrays(path, "parameter", {names[name]: p._data
                                          for name, p in target.params.items()}, params)
        _check_arrays(path, "buffer", target.buffers, buffers)
        if _has_topology(model) and meta.get("topology") is not None:
            _check_topology(path, model, meta["topology"])
        state = None if optimizer is None else _optimizer_state(
            path, meta, source, optimizer,
            {id(p): names[name] for name, p in target.params.items()})
    except (KeyError, TypeError, AttributeError, IndexError) as error:
        raise CheckpointError(f"load: '{path}' is corrupted: its description is malformed "
                              f"({type(error).__name__}: {error})") from None
    values = {name: params[names[name]] for name in target.params}    # everything checked:
    values.update(buffers)                                            # now assign
    target.root.load_state(values)
    if state is not None:
        optimizer.load_state_dict(state)
    return Checkpoint(model, meta.get("extra"))


def _read(path):
    if not os.path.exists(path):
        raise FileNotFoundError(f"load: no checkpoint at '{path}'")
    try:
        with numpy.load(path, allow_pickle=False) as file:
            arrays = {key: file[key] for key in file.files}     # reads (and CRC-checks) all
        meta = json.loads(bytes(arrays.pop(META_KEY)).decode("utf-8"))
    except KeyError:
        raise CheckpointError(f"load: '{path}' is not an nnkit checkpoint (no {META_KEY} "
                              "entry)") from None
    except Exception as error:
        raise CheckpointError(f"load: '{path}' is truncated or corrupted "
                              f"({type(error).__name__}: {error})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"load: '{path}' is not an nnkit checkpoint")
    if meta.get("version") not in READABLE:
        raise CheckpointError(f"load: '{path}' has format version {meta.get('version')!r}; "
                              f"this nnkit reads versions {', '.join(map(str, READABLE))}")
    return arrays, meta


class _Reader:
    """Looks up arrays referenced by the JSON, checking they are there with the stated shape."""

    def __init__(self, path, arrays):
        self.path, self.arrays = path, arrays

    def get(self, ref, what):
        array = self.arrays.get(ref.get("key"))
        if array is None:
            raise CheckpointError(f"load: '{self.path}' is corrupted: the array of {what} "
                                  "is missing")
        if list(array.shape) != list(ref["shape"]) or str(array.dtype) != ref["dtype"]:
            raise CheckpointError(f"load: '{self.path}' is corrupted: {what} is described as "
                                  f"{ref['dtype']} {tuple(ref['shape'])} but stored as "
                                  f"{array.dtype} {array.shape}")
        return array


def _saved_arrays(path, entries, kind, source):
    """name -> array for the file's parameters or buffers; a name listed twice is corruption."""
    out = {}
    for entry in entries:
        name = entry["name"]
        if not isinstance(name, str) or name in out:
            raise CheckpointError(f"load: '{path}' is corrupted: the {kind} name {name!r} is "
                                  "not a string or is listed twice")
        out[name] = source.get(entry["array"], f"{kind} '{name}'")
    return out


def _file_names(model, params, version):
    """Model name -> the name the file uses for that parameter: the same in version 2; in
    version 1, an FFN's parameters were ``<entry>.<Op>.<argument>`` at their first use."""
    names = {name: name for name in params}
    if version >= 2 or not _has_topology(model):
        return names
    ids = {id(p): name for name, p in params.items()}
    seen = set()

    def visit(net, prefix):
        for position, entry in enumerate(net.topology):
            op = entry[0]
            if _has_topology(op):
                visit(op, f"{prefix}{position}.{type(op).__name__}.")
                continue
            label = _op_label(op)[0]
            for argument, value in enumerate(entry[1:], start=1):
                if id(value) in ids and id(value) not in seen:
                    seen.add(id(value))
                    names[ids[id(value)]] = f"{prefix}{position}.{label}.{argument}"

    visit(model, "")
    return names


def _few(names):
    shown = repr(names[:8])
    return shown if len(names) <= 8 else f"{shown[:-1]}, ... {len(names) - 8} more]"


def _check_arrays(path, kind, mine, saved):
    """The model's arrays (``mine``, by file name) against the file's: the same names, then
    the same shapes and dtypes (a buffer: any float dtype, as ``Module.load_state`` takes it);
    the error names the first difference."""
    missing = [name for name in mine if name not in saved]
    unexpected = [name for name in saved if name not in mine]
    if missing or unexpected:
        first = (f"the model's {kind} '{missing[0]}' is not in the file" if missing else
                 f"the file's {kind} '{unexpected[0]}' is not in the model")
        raise CheckpointError(f"load: '{path}' does not match the model: {first} ({kind}s "
                              f"missing from the file: {_few(missing)}; in the file but not in "
                              f"the model: {_few(unexpected)})")
    for name, array in mine.items():
        other = saved[name]
        # a buffer may come in another float dtype: it follows the data's at its next use
        same_dtype = other.dtype == array.dtype or (
            kind == "buffer" and other.dtype.kind == array.dtype.kind == "f")
        if tuple(other.shape) != tuple(array.shape) or not same_dtype:
            raise CheckpointError(f"load: '{path}' does not match the model: {kind} "
                                  f"'{name}' is {other.dtype} {tuple(other.shape)} in the file, "
                                  f"{array.dtype} {tuple(array.shape)} in the model")


def _check_topology(path, net, topology):
    def mine(net):
        return [{"FFN": mine(entry[0])} if _has_topology(entry[0]) else _op_label(entry[0])[0]
                for entry in net.topology]

    def theirs(topology):
        return [{"FFN": theirs(entry["ffn"])} if "ffn" in entry else entry["op"]
                for entry in topology]

    if mine(net) != theirs(topology):
        raise CheckpointError(f"load: '{path}' holds an FFN with ops {theirs(topology)}; the "
                              f"model has {mine(net)}")


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


def _parameter(array):
    """A new parameter holding a copy of ``array`` (its shape and dtype as they are)."""
    p = NetVar(array.copy(), dtype=array.dtype)
    if p.shape != array.shape:          # NetVar makes 1-D data a row
        p.data = array.copy()
    return p


def _rebuild(path, meta, saved, buffers, source, extra_ops):
    if meta.get("topology") is None:
        why = (meta.get("model") or {}).get("why")
        if why is not None or buffers:
            raise CheckpointError(
                f"load: '{path}' cannot rebuild its model without it: {why or 'it has buffers'}"
                "; only an FFN and dicts or lists of parameters are rebuilt from a file; give "
                "the model to load into: nn.load(path, model)")
        return {name: _parameter(array) for name, array in saved.items()}
    params = {name: _parameter(array) for name, array in saved.items()}
    registry = {**_op_registry(), **(extra_ops or {})}
    states = {}

    def batchnorm(spec):
        key = spec["running_mean"]
        if key not in states:
            try:
                state = BatchNormState(spec["features"], spec["momentum"], spec["eps"])
            except (TypeError, ValueError) as error:
                raise CheckpointError(f"load: '{path}' is corrupted: a BatchNormState: "
                                      f"{error}") from None
            for attribute in BatchNormState.buffers:
                array = buffers[spec[attribute]]
                if array.shape != (state.features,):
                    raise CheckpointError(f"load: '{path}' is corrupted: the {attribute} of a "
                                          f"BatchNormState of {state.features} features has "
                                          f"shape {array.shape}")
                setattr(state, attribute, array.copy())
            state.num_batches_tracked = int(spec["batches"])
            states[key] = state
        return states[key]

    def decode(value):
        if not isinstance(value, dict):
            return value
        if "param" in value:
            return params[value["param"]]
        if "batchnorm" in value:
            return batchnorm(value["batchnorm"])
        if "const" in value:
            return NetVar(source.get(value["const"], "a topology constant").copy(),
                          requires_grad=value["requires_grad"])
        if "array" in value:
            return source.get(value["array"], "a topology array").copy()
        if "tuple" in value:
            return tuple(decode(item) for item in value["tuple"])
        return [decode(item) for item in value["list"]]

    def build(entries, where):
        topology = []
        for position, entry in enumerate(entries):
            if "ffn" in entry:
                topology.append((build(entry["ffn"], f"{where}{position}."),))
                continue
            if entry.get("args") is None:
                raise CheckpointError(f"load: '{path}': FFN topology entry {where}{position} "
                                      f"is {entry.get('why')}, which cannot be rebuilt from "
                                      "the file; give the model to load into: "
                                      "nn.load(path, model)")
            op = registry.get(entry["op"])
            if op is None:
                raise CheckpointError(f"load: '{path}': FFN topology entry {where}{position} "
                                      f"uses op '{entry['op']}', which is not registered; pass "
                                      f"ops={{'{entry['op']}': YourOp}}")
            try:
                topology.append((op, *[decode(value) for value in entry["args"]]))
            except (KeyError, TypeError) as error:
                raise CheckpointError(f"load: '{path}' is corrupted: FFN topology entry "
                                      f"{where}{position}: {error!r}") from None
        return _topology_model(*topology)

    net = build(meta["topology"], "")
    if meta["version"] >= 2 and (set(net.named_vars()) != set(saved)
                                 or set(net.named_buffers()) != set(buffers)):
        raise CheckpointError(f"load: '{path}' is corrupted: its topology does not use the "
                              "parameters and buffers it lists")
    return net
