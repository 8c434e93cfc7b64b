"""Saving and loading parameters and optimizer state (.npz + JSON, never pickle or eval).

    nn.save("model.npz", net, optimizer=opt, extra={"epoch": 7})
    net = nn.load("model.npz").model                  # rebuild an FFN from the file
    nn.load("model.npz", net, optimizer=opt)           # or restore into existing objects

One ``.npz`` file holds every array (host copies, so a checkpoint written from GPU data loads
in a NumPy-only session) and, under the key ``__nnkit__``, a JSON description: format version,
each parameter's name, shape and dtype, the optimizer's type, options and per-parameter state
(numbers inline, arrays by key), the ``extra`` data and, for an FFN, its topology as plain data:
op names with arguments that are parameter references, constants (arrays by key) or numbers.
Loading maps op names through a registry of nnkit's public op classes (``ops=`` adds your own)
and reads with ``numpy.load(..., allow_pickle=False)``.

The model is an ``FFN`` (parameters named ``"<entry>.<Op>.<argument>"``, e.g. ``"0.Multiply.1"``;
an FFN inside an FFN adds its entry: ``"2.FFN.0.Multiply.1"``; a parameter used in several
entries is stored once, under its first name, and stays shared when rebuilt), a dict
name → NetVar, or a list of NetVars (named ``"0"``, ``"1"``, ...).

io knows no model class: a model saved with its topology implements a small protocol. It has
``topology``, a list of ``(op, *args)`` entries where ``(model,)`` holds another such model, and
``vars``, its trainable parameters; its class registers with ``saved_with_topology``, which
also names the class ``load`` rebuilds a topology with (``cls(*entries)``). ``nnkit.nets.ffn``
registers FFN, so io sits below the networks: nets import io, io imports no net.

Safety: ``save`` writes a temporary file in the target's directory and renames it over the
target (``os.replace``), so a crash mid-save leaves the previous checkpoint intact. ``load``
reads and checks everything (file integrity, names, shapes, dtypes, topology, optimizer state)
before assigning anything: on any mismatch it raises ``CheckpointError`` naming what differs,
and the in-memory model and optimizer are unchanged.
"""

__all__ = ['save', 'load', 'Checkpoint', 'CheckpointError']
import json
import os
import tempfile
from collections import namedtuple

import numpy

from . import backend, ops
from .core import NetOp, NetVar

FORMAT = "nnkit-checkpoint"
VERSION = 1
META_KEY = "__nnkit__"

Checkpoint = namedtuple("Checkpoint", "model extra")
Checkpoint.__doc__ = """What ``load`` returns: the model (given or rebuilt) and the ``extra`` data."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not match the model or optimizer."""


_topology_model = None      # the class registered by saved_with_topology (FFN)


def saved_with_topology(cls):
    """Class decorator: save ``cls``'s models with their topology, rebuild them on load.

    ``cls`` has ``topology`` (a list of ``(op, *args)`` entries; ``(model,)`` is a model of
    ``cls`` inside) and ``vars`` (its trainable parameters, which are the NetVar arguments of
    its entries), and ``cls(*entries)`` builds one. One class holds this role; nnkit's FFN does.
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


# ----------------------------------------------------------------------------- save

def save(path, model, optimizer=None, extra=None):
    """Write ``model``'s parameters (and ``optimizer``'s state, and ``extra``) to ``path``.

    ``extra`` is any JSON-able data (epoch, metrics, ...): dicts with string keys, lists,
    strings, numbers (NumPy numbers become Python numbers; tuples come back as lists). The
    write is atomic. Returns path. Everything is checked before the file is written, so a
    refused save leaves an existing checkpoint as it was: TypeError for a model, topology
    entry or ``extra`` that cannot be stored, ValueError for an optimizer that updates a
    parameter the model does not hold (its state would be restored without its value).
    """
    writer = _Writer()
    params = _named_params(model, "save")
    _check_keys(extra, "extra")
    meta = {"format": FORMAT, "version": VERSION,
            "params": [{"name": name, "array": writer.add(p._data)}
                       for name, p in params.items()],
            "topology": _encode_topology(model, params, writer)
            if _has_topology(model) else None,
            "optimizer": None, "extra": _plain(extra)}
    if optimizer is not None:
        names = {id(p): name for name, p in params.items()}
        for position, p in enumerate(optimizer.params):
            if id(p) not in names:
                raise ValueError(f"save: the optimizer updates parameter {position} "
                                 f"({p._describe()}), which is not in the model; save the "
                                 "model that holds every parameter the optimizer updates")
        state = optimizer.state_dict()
        meta["optimizer"] = {
            "type": state["type"], "sizes": state["sizes"],
            "options": _plain(state["options"]), "groups": _plain(state["groups"]),
            "param_names": [names[id(p)] for p in optimizer.params],
            "state": [{key: {"array": writer.add(value)} if backend.is_array(value) else _plain(value)
                       for key, value in entry.items()} for entry in state["state"]]}
    try:
        text = json.dumps(meta)
    except (TypeError, ValueError) as error:
        raise TypeError(f"save: extra (or an option) is not JSON-able: {error}") from None
    writer.arrays[META_KEY] = numpy.frombuffer(text.encode("utf-8"), dtype=numpy.uint8)
    _atomic_write(os.fspath(path), writer.arrays)
    return path


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

    def add(self, array):
        key = f"a{len(self.arrays)}"
        self.arrays[key] = numpy.asarray(backend.to_cpu(array))
        return {"key": key, "shape": list(array.shape), "dtype": str(array.dtype)}


def _plain(value):
    """Options and numbers as JSON types (NumPy scalars become Python numbers)."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, numpy.generic):
        return value.item()
    return value


def _named_params(model, caller):
    """name -> NetVar for an FFN, a dict or a list of parameters."""
    if _has_topology(model):
        named, trainable, seen = {}, {id(p) for p in model.vars}, set()
        _name_ffn_params(model, "", caller, named, trainable, seen)
        return named
    if isinstance(model, dict):
        named = dict(model)
    elif isinstance(model, (list, tuple)):
        named = {str(i): p for i, p in enumerate(model)}
    else:
        raise TypeError(f"{caller}: the model must be an FFN, a dict name -> NetVar or a list "
                        f"of NetVars, got {type(model).__name__}")
    for name, p in named.items():
        if not isinstance(p, NetVar):
            raise TypeError(f"{caller}: parameter '{name}' is a {type(p).__name__}, "
                            "not a NetVar")
    return named


def _name_ffn_params(net, prefix, caller, named, trainable, seen):
    """Name each trainable parameter of ``net`` (and of the FFNs inside) at its first use."""
    for position, entry in enumerate(net.topology):
        label = _op_name(entry[0], position, caller)
        if _has_topology(entry[0]):
            _name_ffn_params(entry[0], f"{prefix}{position}.{label}.", caller, named, trainable,
                             seen)
            continue
        for argument, value in enumerate(entry[1:], start=1):
            if id(value) in trainable and id(value) not in seen:
                seen.add(id(value))
                named[f"{prefix}{position}.{label}.{argument}"] = value


def _op_name(op, position, caller):
    """The name an op class is stored under: its public nnkit name, or its class name for a
    user op (loading it then needs ``ops={name: cls}``); "FFN" for an FFN inside."""
    if _has_topology(op):
        return type(op).__name__
    registry = _op_registry()
    for name, cls in registry.items():
        if cls is op:
            return name
    label = getattr(op, "__name__", type(op).__name__)
    if not (isinstance(op, type) and issubclass(op, NetOp)) or label in registry:
        raise TypeError(f"{caller}: FFN topology entry {position} uses {label}, which is not "
                        "an nnkit op class (or shadows one's name); save the parameters "
                        "(net.vars) instead")
    return label


def _encode_topology(net, params, writer):
    ids = {id(p): name for name, p in params.items()}

    def encode(value, position):
        if isinstance(value, NetVar):
            if id(value) in ids:
                return {"param": ids[id(value)]}
            return {"const": writer.add(value._data), "requires_grad": value.requires_grad}
        if backend.is_array(value):
            return {"array": writer.add(value)}
        if isinstance(value, tuple):
            return {"tuple": [encode(item, position) for item in value]}
        if isinstance(value, list):
            return {"list": [encode(item, position) for item in value]}
        if isinstance(value, numpy.generic):
            return value.item()
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise TypeError(f"save: FFN topology entry {position} has an argument of type "
                        f"{type(value).__name__}, which cannot be stored as data")

    def entries(net):
        return [{"ffn": entries(entry[0])} if _has_topology(entry[0]) else
                {"op": _op_name(entry[0], position, "save"),
                 "args": [encode(value, position) for value in entry[1:]]}
                for position, entry in enumerate(net.topology)]

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

    With ``model`` (FFN, dict or list, as saved) its parameters are checked against the file
    and then overwritten in place (each keeps its device). Without it, the model is rebuilt:
    an FFN when the file has a topology, otherwise a dict name -> NetVar. ``optimizer`` (over
    the model's parameters) gets its saved options and state. ``ops`` maps extra op names to
    classes for user ops in a topology. Raises ``FileNotFoundError`` for a missing file and
    ``CheckpointError`` for a corrupted, truncated or mismatching one; nothing is changed then.
    """
    path = os.fspath(path)
    params = None if model is None else _named_params(model, "load")
    if ops is not None:
        if not isinstance(ops, dict):
            raise TypeError(f"load: ops must be a dict name -> op class, got "
                            f"{type(ops).__name__}")
        for name, op in ops.items():
            if not (isinstance(op, type) and issubclass(op, NetOp)):
                raise TypeError(f"load: ops[{name!r}] is {type(op).__name__} "
                                f"{getattr(op, '__name__', op)}, not an op class")
    arrays, meta = _read(path)
    try:
        source = _Reader(path, arrays)
        saved = {entry["name"]: source.get(entry["array"], f"parameter '{entry['name']}'")
                 for entry in meta["params"]}
        if model is None:
            if optimizer is not None:
                raise CheckpointError(f"load: '{path}': give the model whose parameters the "
                                      "optimizer updates")
            return Checkpoint(_rebuild(path, meta, saved, source, ops), meta.get("extra"))
        _check_params(path, params, saved)
        if _has_topology(model) and meta.get("topology") is not None:
            _check_topology(path, model, meta["topology"])
        state = _optimizer_state(path, meta, source, optimizer, params) if optimizer else None
    except (KeyError, TypeError, AttributeError, IndexError) as error:
        raise CheckpointError(f"load: '{path}' is corrupted: its description is malformed "
                              f"({type(error).__name__}: {error})") from None
    values = {name: backend.array_module(p._data).array(saved[name])   # every copy made first
              for name, p in params.items()}
    for name, p in params.items():      # everything checked: now assign
        p.data = values[name]
        p.reset()
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
    if meta.get("version") != VERSION:
        raise CheckpointError(f"load: '{path}' has format version {meta.get('version')}; "
                              f"this nnkit reads version {VERSION}")
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


def _check_params(path, params, saved):
    missing = [name for name in params if name not in saved]
    unexpected = [name for name in saved if name not in params]
    if missing or unexpected:
        raise CheckpointError(f"load: '{path}' does not match the model: parameters missing "
                              f"from the file {missing}, in the file but not in the model "
                              f"{unexpected}")
    for name, p in params.items():
        array = saved[name]
        if array.shape != p.shape or array.dtype != p.dtype:
            raise CheckpointError(f"load: '{path}' does not match the model: parameter "
                                  f"'{name}' is {array.dtype} {array.shape} in the file, "
                                  f"{p.dtype} {p.shape} in the model")


def _check_topology(path, net, topology):
    def mine(net):
        return [{"FFN": mine(entry[0])} if _has_topology(entry[0])
                else _op_name(entry[0], position, "load")
                for position, entry in enumerate(net.topology)]

    def theirs(topology):
        return [{"FFN": theirs(entry["ffn"])} if "ffn" in entry else entry["op"]
                for entry in topology]

    if mine(net) != theirs(topology):
        raise CheckpointError(f"load: '{path}' holds an FFN with ops {theirs(topology)}; the "
                              f"model has {mine(net)}")


def _optimizer_state(path, meta, source, optimizer, params):
    saved = meta.get("optimizer")
    if saved is None:
        raise CheckpointError(f"load: '{path}' has no optimizer state")
    names = {id(p): name for name, p in params.items()}
    mine = [names.get(id(p)) for p in optimizer.params]
    if mine != saved["param_names"]:
        raise CheckpointError(f"load: '{path}': the saved optimizer updated parameters "
                              f"{saved['param_names']}, this one updates {mine}")
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


def _rebuild(path, meta, saved, source, extra_ops):
    params = {name: NetVar(array.copy()) for name, array in saved.items()}
    if meta.get("topology") is None:
        return params
    registry = {**_op_registry(), **(extra_ops or {})}

    def decode(value):
        if not isinstance(value, dict):
            return value
        if "param" in value:
            return params[value["param"]]
        if "const" in value:
            return NetVar(source.get(value["const"], "a topology constant").copy(),
                          requires_grad=value["requires_grad"])
        if "array" in value:
            return source.get(value["array"], "a topology array").copy()
        if "tuple" in value:
            return tuple(decode(item) for item in value["tuple"])
        return [decode(item) for item in value["list"]]

    def build(entries):
        topology = []
        for position, entry in enumerate(entries):
            if "ffn" in entry:
                topology.append((build(entry["ffn"]),))
                continue
            op = registry.get(entry["op"])
            if op is None:
                raise CheckpointError(f"load: '{path}': FFN topology entry {position} uses op "
                                      f"'{entry['op']}', which is not registered; pass "
                                      f"ops={{'{entry['op']}': YourOp}}")
            try:
                topology.append((op, *[decode(value) for value in entry["args"]]))
            except (KeyError, TypeError) as error:
                raise CheckpointError(f"load: '{path}' is corrupted: FFN topology entry "
                                      f"{position}: {error!r}") from None
        return _topology_model(*topology)

    return build(meta["topology"])
