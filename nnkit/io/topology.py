"""An FFN's topology as plain data: ``_encode_topology`` describes its entries (op names from
the registry of nnkit's public op classes, arguments as parameter references, BatchNormStates,
constants and numbers), ``_rebuild`` builds an FFN back from that description,
``_check_topology`` compares a model's ops and data arguments with a file's, and
``_file_names`` maps version 1 parameter names (``<entry>.<Op>.<argument>``) onto a model's."""
import functools

import numpy

from .. import backend, checks, ops
from ..core import NetOp, NetVar
from ..module import Module, former_names
from ..ops.loss import Loss
from ..ops.normalization import BatchNormState
from .fileformat import CheckpointError, _plain
from .model import _has_topology, _topology_class


@functools.cache
def _op_registry():
    """Public op name -> class, from nnkit.ops (first name wins for aliases); made once, read
    only."""
    registry = {}
    for name in ops.__all__:
        op = getattr(ops, name)
        if isinstance(op, type) and issubclass(op, NetOp):
            registry.setdefault(name, op)
    return registry


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


def _file_names(model, params, version, saved):
    """Model name -> the name the file uses for that parameter: the same in version 2, or the
    name it had before its class renamed it (``nnkit.module.former_names``: a SequenceModel's
    ``rnn.W`` was its ``W``) where the file, whose parameters are ``saved``, holds that one; in
    version 1, an FFN's parameters were ``<entry>.<Op>.<argument>`` at their first use."""
    former = former_names(model)
    names = {name: former[name] if name not in saved and former.get(name) in saved else name
             for name in params}
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


def _check_topology(path, net, topology, source):
    """The model's ops must be the file's, and so must the arguments that are plain data (an
    array, a number: not parameters, so load does not set them, and a model keeping its own
    would compute another function than the file's)."""
    def mine(net):
        return [{"FFN": mine(entry[0])} if _has_topology(entry[0]) else _op_label(entry[0])[0]
                for entry in net.topology]

    def theirs(topology):
        return [{"FFN": theirs(entry["ffn"])} if "ffn" in entry else entry["op"]
                for entry in topology]

    if mine(net) != theirs(topology):
        raise CheckpointError(f"load: '{path}' holds an FFN with ops {theirs(topology)}; the "
                              f"model has {mine(net)}")

    def same(value, saved):
        if isinstance(saved, dict) and "array" in saved:
            return _same_values(value, source.get(saved["array"], "a topology array"))
        if isinstance(saved, dict) and ("tuple" in saved or "list" in saved):
            items = saved.get("tuple", saved.get("list"))
            if not isinstance(value, (tuple, list)):        # an array for a list of numbers
                return not any(isinstance(item, dict) for item in items) and \
                    _same_values(value, items)
            return len(value) == len(items) and all(same(v, s) for v, s in zip(value, items))
        if isinstance(saved, dict):         # a parameter, constant or BatchNormState:
            return True                     # checked with the arrays
        return _same_values(value, saved)

    def compare(net, entries, where):
        for position, (entry, saved) in enumerate(zip(net.topology, entries)):
            if "ffn" in saved:
                compare(entry[0], saved["ffn"], f"{where}{position}.")
                continue
            for argument, (value, data) in enumerate(zip(entry[1:], saved["args"] or []),
                                                     start=1):
                if not same(value, data):
                    raise CheckpointError(
                        f"load: '{path}': FFN topology entry {where}{position} "
                        f"({saved['op']}) argument {argument} is {_shown(value)} in the model "
                        "but another value in the file; it is data, not a parameter, so load "
                        "does not set it: build the model with the file's value, or rebuild "
                        "it from the file (nn.load(path).model)")

    compare(net, topology, "")


def _same_values(value, saved):
    """Whether a model's data argument holds the file's values: numbers and arrays compared in
    the lower precision of the two (the slope 0.2 and float32(0.2), a mean as float64 or as
    the file's float32 are the same; a number the file holds that float32 represents exactly
    is taken as float32), NaN equal to NaN; anything else with ==."""
    try:
        mine = numpy.asarray(backend.to_cpu(value) if backend.is_array(value) else value)
        theirs = numpy.asarray(saved)
    except (TypeError, ValueError):
        return False
    if mine.shape != theirs.shape:
        return False
    if theirs.dtype == numpy.float64 and numpy.array_equal(
            theirs.astype(numpy.float32), theirs, equal_nan=True):
        theirs = theirs.astype(numpy.float32)   # the file keeps a float32 number as a float
    if mine.dtype.kind in "biuf" and theirs.dtype.kind in "biuf":
        floats = [d for d in (mine.dtype, theirs.dtype) if d.kind == "f"]
        common = min(floats, key=lambda d: d.itemsize) if floats else \
            numpy.result_type(mine, theirs)
        return numpy.array_equal(mine.astype(common), theirs.astype(common),
                                 equal_nan=common.kind == "f")
    return mine.dtype == theirs.dtype and bool(numpy.all(mine == theirs))


def _shown(value):
    if backend.is_array(value):
        return f"an array of shape {tuple(value.shape)}"
    return repr(value) if len(repr(value)) <= 40 else f"a {type(value).__name__}"


def _topology_constants(topology):
    """Model name -> array reference of each constant NetVar argument the topology stores in
    place ("const"), named as the FFN names its members (``topology.<entry>.<argument>``, a
    nested FFN's under ``topology.<entry>.0.``); files written before constants were saved
    by name keep them only there."""
    registry = _op_registry()
    found = {}

    def visit(value, name):
        if isinstance(value, dict):
            if "const" in value:
                found.setdefault(name, value["const"])
            for kind in ("tuple", "list"):
                for index, item in enumerate(value.get(kind, ())):
                    visit(item, f"{name}.{index}")

    def walk(entries, prefix):
        for position, entry in enumerate(entries):
            if "ffn" in entry:
                walk(entry["ffn"], f"{prefix}topology.{position}.0.")
                continue
            op = registry.get(entry.get("op"))
            if entry.get("args") is None or isinstance(op, type) and issubclass(op, Loss):
                continue                # a Loss's targets are not members of the FFN
            for argument, value in enumerate(entry["args"], start=1):
                visit(value, f"{prefix}topology.{position}.{argument}")

    walk(topology, "")
    return found


def _leaf(array, requires_grad=True):
    """A new leaf holding a copy of ``array`` (its shape and dtype as they are): a parameter,
    or a constant of the topology (class indices stay integers)."""
    # (an integer array is a constant whatever the file says: older files flag no constants)
    p = NetVar(array.copy(), requires_grad=requires_grad and array.dtype.kind in "fc",
               dtype=array.dtype)
    if p.shape != array.shape:          # NetVar makes 1-D data a row
        p.data = array.copy()
    return p


def _rebuild(path, meta, saved, buffers, source, extra_ops):
    constants = {entry["name"] for entry in meta["params"] if entry.get("constant")}
    params = {name: _leaf(array, requires_grad=name not in constants)
              for name, array in saved.items()}
    for entry in meta["params"]:        # (NetVar.is_bias: a GRU's bias, which MaxNorm skips)
        if entry.get("bias") is True and entry["name"] in params:
            params[entry["name"]].is_bias = True
    if meta.get("topology") is None:
        why = (meta.get("model") or {}).get("why")
        if why is not None or buffers:
            raise CheckpointError(
                f"load: '{path}' cannot rebuild its model without it: {why or 'it has buffers'}"
                "; only an FFN and dicts or lists of parameters are rebuilt from a file; give "
                "the model to load into: nn.load(path, model)")
        return params
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
                try:                    # a negative or NaN variance: every output NaN
                    state.check_buffer(attribute, array, f"load: '{path}' is corrupted")
                except ValueError as error:
                    raise CheckpointError(str(error)) from None
                setattr(state, attribute, array.copy())
            batches = spec["batches"]
            if not (checks.is_integer(batches) and batches >= 0):
                raise CheckpointError(f"load: '{path}' is corrupted: a BatchNormState's count of "
                                      f"batches is {batches!r}, not an integer >= 0")
            state.num_batches_tracked = int(batches)
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
            return _leaf(source.get(value["const"], "a topology constant"),
                         value["requires_grad"])
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
        return _topology_class()(*topology)

    net = build(meta["topology"], "")
    placed = {**net.named_vars(), **net.named_constants()}
    if any(name in placed and placed[name] is not leaf for name, leaf in params.items()):
        raise CheckpointError(f"load: '{path}' is corrupted: its topology puts a parameter "
                              "where another's name says it is")
    trained, held = set(net.named_vars()), set(net.named_vars()) | set(net.named_constants())
    if meta["version"] >= 2 and not (trained <= set(saved) <= held
                                     and set(net.named_buffers()) == set(buffers)):
        raise CheckpointError(f"load: '{path}' is corrupted: its topology does not use the "
                              "parameters and buffers it lists")
    return net
