"""The checkpoint file: one .npz of arrays under short keys plus a JSON description under
``META_KEY``; written atomically (``_Writer``, ``_atomic_write``), read and checked before
anything is assigned (``_read``, ``_Reader``, ``_saved_arrays``, ``_check_arrays``)."""
import json
import os
import tempfile

import numpy

from .. import backend
from ..dtypes import native

FORMAT = "nnkit-checkpoint"
VERSION = 2
READABLE = (1, 2)           # the versions load reads
META_KEY = "__nnkit__"


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not match the model or optimizer."""


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


def _atomic_write(path, arrays):
    """Write the .npz to a temporary file next to ``path``, then rename it over ``path``.

    A symbolic link is followed (its target is replaced, the link stays); an existing file
    keeps its permissions, a new one gets those the umask allows, as ``open`` gives."""
    path = os.path.realpath(path)
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"save: the directory '{directory}' does not exist")
    if os.path.exists(path):
        mode = os.stat(path).st_mode & 0o777
    else:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    handle, temporary = tempfile.mkstemp(dir=directory, suffix=".tmp",
                                         prefix="." + os.path.basename(path) + ".")
    try:
        with os.fdopen(handle, "wb") as file:
            if callable(arrays):        # the writer of another format (safetensors)
                arrays(file)
            else:
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
    """Looks up arrays referenced by the JSON, checking they are there with the stated shape,
    and each referenced once (``save`` writes every array under a key of its own: a key named
    twice is a tampered file that would give one array to two parameters)."""

    def __init__(self, path, arrays):
        self.path, self.arrays = path, arrays
        self.used = set()

    def get(self, ref, what):
        key = ref.get("key")
        array = self.arrays.get(key)
        if array is None:
            raise CheckpointError(f"load: '{self.path}' is corrupted: the array of {what} "
                                  "is missing")
        if key in self.used:
            raise CheckpointError(f"load: '{self.path}' is corrupted: the array of {what} is "
                                  "also another entry's")
        self.used.add(key)
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
        # a buffer may come in another float dtype: it follows the data's at its next use; the
        # byte order is no difference (.safetensors stores little-endian, read native)
        same_dtype = native(other.dtype) == native(array.dtype) or (
            kind == "buffer" and other.dtype.kind == array.dtype.kind == "f")
        if tuple(other.shape) != tuple(array.shape) or not same_dtype:
            raise CheckpointError(f"load: '{path}' does not match the model: {kind} "
                                  f"'{name}' is {other.dtype} {tuple(other.shape)} in the file, "
                                  f"{array.dtype} {tuple(array.shape)} in the model")
