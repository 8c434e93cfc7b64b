"""Checkpoints as safetensors files: ``nn.save("model.safetensors", model)`` and ``nn.load``.

A safetensors file is the field's exchange format for weights: an 8-byte little-endian header
length n, n bytes of JSON (``{name: {"dtype", "shape", "data_offsets"}, "__metadata__": {str:
str}}``, padded with spaces to a multiple of 8), then every tensor's raw little-endian bytes, in
one block without holes. Reading it runs no code. nnkit writes and reads it itself
(``write_safetensors``, ``read_safetensors``); the ``safetensors`` package is not needed, and
the files load with ``safetensors.numpy.load_file`` and ``safetensors.torch.load_file``.

What a checkpoint holds is the ``.npz`` checkpoint's, in this container:

- each parameter, constant and buffer under its dotted name, as ``nn.save`` names it
  (``blocks.0.fc.W``, ``bn.stats.running_mean``, ``topology.0.1`` for an FFN);
- the optimizer's per-parameter state under ``__optimizer__.<parameter name>.<key>``
  (``__optimizer__.fc.W.m``) and any other array of the description (an FFN's topology
  constants) under ``__nnkit__.<key>``;
- in ``__metadata__["nnkit"]``, the JSON description the ``.npz`` keeps under ``__nnkit__``
  (format and version, the model's type, every name with its shape and dtype, the optimizer's
  options and state, ``extra``, an FFN's topology), each array referenced by its tensor name;
- in ``__metadata__["nnkit_crc32"]``, the CRC-32 of that description and of the data, which
  ``read_safetensors`` checks (the format has no checksum, the .npz's zip has one).

So ``save`` and ``load`` take what the ``.npz`` path takes (a Module, an FFN, a dict or list of
parameters; ``optimizer``, ``extra``, ``ops``), give the same guarantees (an atomic write;
everything checked before anything is assigned; an FFN rebuilt without a model) and raise the
same errors. They go through that path: ``save`` lets it describe the model into a temporary
``.npz`` in a private temporary folder and rewrites it as safetensors; ``load`` checks the
file, rewrites it as a temporary ``.npz`` and lets that path check and assign. One
description and one set of checks serve both formats.

A file without nnkit's description (written by ``safetensors.numpy.save_file`` or
``safetensors.torch.save_file`` from a dict named as nnkit names the model) loads into a given
model: its tensors must be exactly the model's parameters, constants and buffers. (A PyTorch
model's state dict is named by PyTorch: ``nn.load_torch_state(model,
nn.read_safetensors(path))`` maps it.)

Dtypes: F64, F32, F16, the integers I8 … I64 and U8 … U64, and BOOL round-trip bit for bit.
BF16 is read as float32, exactly (every bfloat16 is a float32 whose low 16 bits are zero);
nnkit does not write it. Other dtypes (the 8-bit floats, complex) are refused naming the tensor.

A file is refused (``CheckpointError``, nothing changed) when it is truncated, has a header
longer than 100 MB or than the file, a header that is not a JSON object of well-formed
entries, a tensor name twice, an unknown dtype, a tensor whose bytes are not its shape times
its dtype's size, offsets outside the data, overlapping or leaving a hole, or bytes after the
last tensor, or (a file nnkit wrote) when its description or data do not match its checksum.
A file another library wrote has no checksum: a changed data byte in it cannot be seen.
"""
import json
import os
import tempfile
import zlib

import numpy

from .. import backend
from ..dtypes import native
from .checkpoint import _file_path
from .checkpoint import load as _load_npz
from .checkpoint import save as _save_npz
from .fileformat import FORMAT, META_KEY, VERSION, CheckpointError, _atomic_write
from .model import check_model

__all__ = ['read_safetensors', 'write_safetensors']

MAX_HEADER = 100_000_000        # bytes; the safetensors package's own limit
OPTIMIZER_PREFIX = "__optimizer__."
OTHER_PREFIX = "__nnkit__."
CHECKSUM_KEY = "nnkit_crc32"

# safetensors dtype name -> NumPy dtype (little-endian)
_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
           "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?"}
_NAMES = {numpy.dtype(code).newbyteorder("=") if code[0] == "<" else numpy.dtype(code): name
          for name, code in _DTYPES.items()}


# ----------------------------------------------------------------------------- the format

def write_safetensors(path, tensors, metadata=None):
    """Write ``tensors`` (dict name → array: NumPy, CuPy or a NetVar's data) to ``path`` as one
    safetensors file, atomically (a temporary file renamed over ``path``); returns path.

    ``metadata`` is a dict of str → str (the format allows nothing else), stored as the
    header's ``__metadata__``. Everything is checked before the file is written: a name that is
    not a non-empty str (or is ``__metadata__``), an array of a dtype the format has no name
    for (TypeError naming it) or metadata that is not str → str.
    """
    _write(_file_path(path, "write_safetensors"), tensors, metadata)
    return path


def _write(target, tensors, metadata, checksum=False, where="write_safetensors"):
    """``write_safetensors``; with ``checksum``, ``__metadata__`` also holds ``CHECKSUM_KEY``,
    the CRC-32 of the nnkit description and every data byte (see ``_checksum``). ``where``
    names the caller in errors (``save`` for a checkpoint)."""
    if not isinstance(tensors, dict):
        raise TypeError(f"{where}: tensors must be a dict name -> array, got "
                        f"{type(tensors).__name__}")
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, dict) or not all(
            isinstance(key, str) and isinstance(value, str) for key, value in metadata.items()):
        raise TypeError(f"{where}: metadata must be a dict of str -> str (the "
                        "format's __metadata__ holds nothing else)")
    header, blocks, offset = {}, [], 0
    for name, array in tensors.items():
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise TypeError(f"{where}: the tensor name {name!r} is not a non-empty "
                            "str other than '__metadata__'")
        if not backend.is_array(array):
            raise TypeError(f"{where}: tensor '{name}' is a {type(array).__name__}, "
                            "not an array")
        host = numpy.asarray(backend.to_cpu(array))
        dtype = _NAMES.get(native(host.dtype))
        if dtype is None:
            raise TypeError(f"{where}: tensor '{name}' has dtype {host.dtype}, which "
                            f"safetensors has no name for (it stores {', '.join(_DTYPES)})")
        data = numpy.ascontiguousarray(host, dtype=host.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(host.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blocks.append(data)
        offset += len(data)
    if checksum:
        metadata = {**metadata, CHECKSUM_KEY: _checksum(metadata.get("nnkit", ""), blocks)}
    if metadata:
        header["__metadata__"] = dict(metadata)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)          # the data starts 8-byte aligned

    def write(file):
        file.write(len(text).to_bytes(8, "little"))
        file.write(text)
        for data in blocks:
            file.write(data)

    _atomic_write(target, write)


def _checksum(description, blocks):
    """The CRC-32 (8 hex digits) of nnkit's description and the data: safetensors has no
    checksum of its own (the .npz's zip has one per array), and a flipped data byte or a
    changed ``extra`` would otherwise load as a silently different model. Every other header
    field is checked by the structure checks or against the description."""
    crc = zlib.crc32(description.encode("utf-8"))
    for block in blocks:
        crc = zlib.crc32(block, crc)
    return f"{crc:08x}"


def read_safetensors(path):
    """Read a safetensors file: returns ``(tensors, metadata)``, a dict name → NumPy array (in
    the file's order) and the header's ``__metadata__`` (a dict str → str; {} when absent).

    Every byte is checked before anything is returned (see the module's docstring for what is
    refused: ``CheckpointError`` naming the file and the fault; ``FileNotFoundError`` for a
    missing file). BF16 tensors come back as float32, exactly.
    """
    path = _file_path(path, "read_safetensors")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"read_safetensors: no file at '{path}'")
    with open(path, "rb") as file:
        content = file.read()

    def refuse(fault):
        raise CheckpointError(f"read_safetensors: '{path}' is not a valid safetensors file: "
                              f"{fault}")

    if len(content) < 8:
        refuse(f"it holds {len(content)} bytes, fewer than the 8 of the header length")
    length = int.from_bytes(content[:8], "little")
    if length > MAX_HEADER:
        refuse(f"its header length {length} is over the limit of {MAX_HEADER} bytes")
    if 8 + length > len(content):
        refuse(f"its header length {length} is more than the {len(content) - 8} bytes after it "
               "(truncated?)")

    def unique(pairs):
        keys = [key for key, _ in pairs]
        twice = next((key for key in keys if keys.count(key) > 1), None)
        if twice is not None:
            refuse(f"its header names '{twice}' twice")
        return dict(pairs)

    try:
        header = json.loads(content[8:8 + length].decode("utf-8"), object_pairs_hook=unique)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        refuse(f"its header is not UTF-8 JSON ({error})")
    if not isinstance(header, dict):
        refuse("its header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(
            isinstance(key, str) and isinstance(value, str) for key, value in metadata.items()):
        refuse("its __metadata__ is not an object of strings")
    data = memoryview(content)[8 + length:]
    spans, dtypes = [], {}
    for name, entry in header.items():
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            refuse(f"the entry of '{name}' is not {{dtype, shape, data_offsets}}")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in _DTYPES and dtype != "BF16":
            refuse(f"tensor '{name}' has dtype {dtype!r}; nnkit reads "
                   f"{', '.join(_DTYPES)} and BF16")
        if not isinstance(shape, list) or not all(
                type(size) is int and size >= 0 for size in shape):
            refuse(f"tensor '{name}' has shape {shape!r}, not a list of sizes")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(
                type(at) is int for at in offsets) and 0 <= offsets[0] <= offsets[1]):
            refuse(f"tensor '{name}' has data_offsets {offsets!r}, not [begin, end] with "
                   "0 <= begin <= end")
        itemsize = 2 if dtype == "BF16" else numpy.dtype(_DTYPES[dtype]).itemsize
        expected = int(numpy.prod(shape, dtype=object)) * itemsize
        if offsets[1] - offsets[0] != expected:
            refuse(f"tensor '{name}' is {dtype} {tuple(shape)}, {expected} bytes, but its "
                   f"data_offsets {offsets} span {offsets[1] - offsets[0]}")
        if offsets[1] > len(data):
            refuse(f"tensor '{name}' ends at byte {offsets[1]} of a data block of "
                   f"{len(data)} bytes (truncated?)")
        spans.append((offsets[0], offsets[1], name))
        dtypes[name] = dtype
    end = 0
    for begin, stop, name in sorted(spans):
        if begin != end:
            refuse(f"tensor '{name}' starts at byte {begin}, " + (
                "inside another tensor's bytes (overlapping offsets)" if begin < end else
                f"leaving a hole after byte {end}"))
        end = stop
    if end != len(data):
        refuse(f"{len(data) - end} bytes follow the last tensor")
    if CHECKSUM_KEY in metadata and _checksum(metadata.get("nnkit", ""), [data]) \
            != metadata[CHECKSUM_KEY]:
        refuse("its data or nnkit description does not match its checksum (corrupted)")
    tensors = {}
    for name, entry in header.items():
        begin, stop = entry["data_offsets"]
        raw = data[begin:stop]
        if dtypes[name] == "BF16":      # the high half of a float32: widen exactly
            bits = numpy.frombuffer(raw, dtype="<u2").astype(numpy.uint32) << 16
            array = bits.view(numpy.float32)
        else:
            array = numpy.frombuffer(raw, dtype=_DTYPES[dtypes[name]])
            array = array.astype(array.dtype.newbyteorder("="))    # a writable native copy
        tensors[name] = array.reshape(entry["shape"])
    return tensors, dict(metadata)


# ----------------------------------------------------------------------------- checkpoints

def _references(meta):
    """``(place, reference)`` for every array reference ({"key", "shape", "dtype"}) of a
    description, ``place`` naming it: ("param", name), ("buffer", name), ("optimizer",
    parameter name, state key) or ("other",). ``extra`` is the user's data: never looked in."""
    found = []

    def visit(value, place):
        if isinstance(value, dict):
            if set(value) == {"key", "shape", "dtype"} and isinstance(value["key"], str):
                found.append((place, value))
                return
            for item in value.values():
                visit(item, place)
        elif isinstance(value, list):
            for item in value:
                visit(item, place)

    for kind in ("params", "buffers"):
        for entry in meta.get(kind) or ():
            visit(entry.get("array"), (kind[:-1], entry.get("name")))
    optimizer = meta.get("optimizer")
    if isinstance(optimizer, dict):
        names = optimizer.get("param_names") or []
        for position, entry in enumerate(optimizer.get("state") or ()):
            for key, value in (entry.items() if isinstance(entry, dict) else ()):
                name = names[position] if position < len(names) else position
                visit(value, ("optimizer", name, key))
    for key, value in meta.items():
        if key not in ("params", "buffers", "optimizer", "extra"):
            visit(value, ("other",))
    return found


def _tensor_name(place, reference):
    if place[0] in ("param", "buffer"):
        return place[1]
    if place[0] == "optimizer":
        return f"{OPTIMIZER_PREFIX}{place[1]}.{place[2]}"
    return f"{OTHER_PREFIX}{reference['key']}"


def save(path, model, optimizer=None, extra=None, **resume):
    """``nn.save`` for a ``.safetensors`` path (see the module's docstring): the ``.npz``
    checkpoint's description and checks, in the safetensors container; returns path.
    ``resume`` (``schedule``, ``trainer``, ``rng``) as for the ``.npz``."""
    target = _file_path(path, "save")
    if target.endswith(os.sep) or os.path.isdir(target):
        raise IsADirectoryError(f"save: '{target}' is a folder (or ends with '{os.sep}'); give "
                                "a file name")
    with tempfile.TemporaryDirectory() as folder:
        staged = os.path.join(folder, "checkpoint.npz")
        _save_npz(staged, model, optimizer=optimizer, extra=extra, **resume)   # checks all
        with numpy.load(staged, allow_pickle=False) as file:
            arrays = {key: file[key] for key in file.files}
    meta = json.loads(bytes(arrays.pop(META_KEY)).decode("utf-8"))
    tensors = {}
    for place, reference in _references(meta):
        name = _tensor_name(place, reference)
        if name in tensors:
            raise TypeError(f"save: two arrays would be stored as the tensor '{name}' (a model "
                            f"name starting with '{OPTIMIZER_PREFIX}' or '{OTHER_PREFIX}'?); "
                            "rename one")
        tensors[name] = arrays[reference["key"]]
        reference["key"] = name
        reference["dtype"] = str(native(tensors[name].dtype))   # stored little-endian, read native
    _write(target, tensors, {"nnkit": json.dumps(meta)}, checksum=True, where="save")
    return path


def load(path, model=None, optimizer=None, ops=None, **resume):
    """``nn.load`` for a ``.safetensors`` path (see the module's docstring); returns
    ``Checkpoint(model, extra)``. A file without nnkit's description needs ``model`` and
    holds no optimizer state."""
    path = _file_path(path, "load")
    tensors, metadata = read_safetensors(path)
    if "nnkit" in metadata:
        try:
            meta = json.loads(metadata["nnkit"])
            references = _references(meta)
        except (ValueError, AttributeError, TypeError) as error:
            raise CheckpointError(f"load: '{path}' is corrupted: its nnkit description is "
                                  f"malformed ({type(error).__name__}: {error})") from None
    else:
        meta, references = _foreign_description(path, tensors, model, optimizer)
    arrays, used = {}, set()
    for number, (_, reference) in enumerate(references):
        name = reference["key"]
        if name not in tensors:
            raise CheckpointError(f"load: '{path}' is corrupted: its description names the "
                                  f"tensor '{name}', which the file does not hold")
        if name in used:
            raise CheckpointError(f"load: '{path}' is corrupted: its description names the "
                                  f"tensor '{name}' twice (one array for two entries)")
        arrays[f"a{number}"] = tensors[name]
        reference["key"] = f"a{number}"
        used.add(name)
    unused = [name for name in tensors if name not in used]
    if unused:
        raise CheckpointError(f"load: '{path}' is corrupted: the tensor '{unused[0]}' is in no "
                              "entry of its nnkit description")
    arrays[META_KEY] = numpy.frombuffer(json.dumps(meta).encode("utf-8"), dtype=numpy.uint8)
    with tempfile.TemporaryDirectory() as folder:
        staged = os.path.join(folder, "checkpoint.npz")
        numpy.savez(staged, **arrays)       # a scratch file: no rename, no fsync needed
        try:
            return _load_npz(staged, model, optimizer=optimizer, ops=ops, **resume)
        except CheckpointError as error:    # name the file the user gave
            raise CheckpointError(str(error).replace(staged, path)) from None


def _foreign_description(path, tensors, model, optimizer):
    """The description of a file another library wrote: its tensors named as the model's
    parameters, constants and buffers (the ``.npz`` path then checks that they are)."""
    if model is None:
        raise CheckpointError(f"load: '{path}' has no nnkit description (it was written by "
                              "another library): give the model to load it into")
    if optimizer is not None:
        raise CheckpointError(f"load: '{path}' has no nnkit description, so no optimizer "
                              "state")
    buffers = check_model(model, "load").buffers
    meta = {"format": FORMAT, "version": VERSION,
            "model": {"type": type(model).__name__, "why": "the file was written by another "
                      "library"},
            "params": [], "buffers": [], "topology": None, "optimizer": None, "extra": None}
    for name, array in tensors.items():
        kind = "buffers" if name in buffers else "params"
        meta[kind].append({"name": name, "array": {"key": name, "shape": list(array.shape),
                                                   "dtype": str(array.dtype)}})
    return meta, _references(meta)
