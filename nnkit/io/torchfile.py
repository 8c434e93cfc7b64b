"""Reading ``torch.save(model.state_dict())`` files without PyTorch and without running code
from them.

Since PyTorch 1.6, ``torch.save`` writes a zip archive: ``<name>/data.pkl``, a pickle of the
object, whose tensors refer by key to raw storages ``<name>/data/<key>`` (the bytes of each
storage, in the byte order ``<name>/byteorder`` names, little-endian when absent). A pickle
can name any class and call it; ``read_torch_file`` unpickles with an allow-list of what a
state dict needs, and refuses anything else naming it:

- ``collections.OrderedDict`` (the state dict, and a tensor's empty backward hooks);
- ``torch._utils._rebuild_tensor_v2`` (a tensor: storage, offset, size, stride), read here as
  a NumPy array copied out of its storage, and ``torch._utils._rebuild_parameter`` (a
  Parameter: its tensor);
- the storage classes ``torch.DoubleStorage``, ``FloatStorage``, ``HalfStorage``,
  ``BFloat16Storage``, ``LongStorage``, ``IntStorage``, ``ShortStorage``, ``CharStorage``,
  ``ByteStorage`` and ``BoolStorage``, as NumPy dtypes (``BFloat16`` widened to float32,
  exactly).

Plain pickle data (dicts, lists, tuples, strings, numbers) passes, so a dict of state dicts
(``{"model": ..., "epoch": 3}``) reads too. Each tensor's offset, size and stride are checked
against its storage before a byte is read; a storage whose bytes are not its element count
times its dtype's size, a missing storage, a truncated archive or the format of PyTorch before
1.6 are refused (``CheckpointError``).
"""
import collections
import io
import os
import pickle
import zipfile

import numpy

from .checkpoint import _file_path
from .fileformat import CheckpointError

__all__ = ['read_torch_file']

# torch's storage class name -> the NumPy dtype its bytes hold
_STORAGES = {"DoubleStorage": "f8", "FloatStorage": "f4", "HalfStorage": "f2",
             "BFloat16Storage": "bf16", "LongStorage": "i8", "IntStorage": "i4",
             "ShortStorage": "i2", "CharStorage": "i1", "ByteStorage": "u1",
             "BoolStorage": "?"}


class _StorageType:
    """What ``torch.<X>Storage`` unpickles as: the dtype of the storage's bytes."""

    def __init__(self, name):
        self.name, self.code = name, _STORAGES[name]


def _rebuild_parameter(data, requires_grad, backward_hooks, *rest):
    return data


class _Unpickler(pickle.Unpickler):
    """An Unpickler that builds only the allow-listed classes (the module's docstring) and
    reads each storage from the archive, once."""

    def __init__(self, file, archive, prefix, path, byteorder):
        super().__init__(file)
        self.archive, self.prefix, self.path, self.byteorder = archive, prefix, path, byteorder
        self.storages = {}

    def find_class(self, module, name):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return self.rebuild_tensor
        if (module, name) == ("torch._utils", "_rebuild_parameter"):
            return _rebuild_parameter
        if module == "torch" and name in _STORAGES:
            return _StorageType(name)
        hint = ("; save model.state_dict(), not the model"
                if module.startswith("torch.nn") else "")
        raise CheckpointError(f"read_torch_file: '{self.path}' asks for {module}.{name}, which "
                              f"is not one of the classes a state dict needs (read: "
                              f"OrderedDict, tensors, parameters, storages){hint}")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType) and isinstance(pid[2], str)
                and type(pid[4]) is int and pid[4] >= 0):
            raise CheckpointError(f"read_torch_file: '{self.path}' refers to {pid!r}, not "
                                  "to a storage ('storage', type, key, location, size)")
        kind, key, count = pid[1], pid[2], pid[4]
        if key not in self.storages:
            record = f"{self.prefix}data/{key}"
            try:
                size = self.archive.getinfo(record).file_size
            except KeyError:
                raise CheckpointError(f"read_torch_file: '{self.path}' has no storage "
                                      f"'{record}'") from None
            itemsize = 2 if kind.code == "bf16" else numpy.dtype(kind.code).itemsize
            if size != count * itemsize:        # checked before a byte is inflated
                raise CheckpointError(f"read_torch_file: '{self.path}': storage '{record}' "
                                      f"holds {size} bytes, not {count} "
                                      f"{kind.name} elements of {itemsize} bytes")
            raw = self.archive.read(record)
            order = "<" if self.byteorder == "little" else ">"
            if kind.code == "bf16":      # the high half of a float32: widen exactly
                bits = numpy.frombuffer(raw, dtype=order + "u2").astype(numpy.uint32) << 16
                storage = bits.view(numpy.float32)
            else:
                storage = numpy.frombuffer(raw, dtype=numpy.dtype(kind.code).newbyteorder(
                    order if numpy.dtype(kind.code).itemsize > 1 else "|"))
                storage = storage.astype(storage.dtype.newbyteorder("="), copy=False)
            self.storages[key] = (storage, kind.name)
        return self.storages[key]

    def rebuild_tensor(self, storage, offset, size, stride, requires_grad=False,
                       backward_hooks=None, metadata=None):
        """The tensor as a NumPy array: its elements copied out of the storage."""
        if not (isinstance(storage, tuple) and len(storage) == 2
                and isinstance(storage[0], numpy.ndarray)):
            raise CheckpointError(f"read_torch_file: '{self.path}': a tensor's storage is a "
                                  f"{type(storage).__name__}, not a storage")
        array, kind = storage
        sizes_ok = isinstance(size, tuple) and isinstance(stride, tuple) and \
            len(size) == len(stride) and all(type(n) is int and n >= 0 for n in size) and \
            all(type(n) is int and n >= 0 for n in stride) and type(offset) is int and offset >= 0
        if not sizes_ok:
            raise CheckpointError(f"read_torch_file: '{self.path}': a tensor has size {size!r}, "
                                  f"stride {stride!r} and offset {offset!r}, not sizes")
        if 0 not in size:
            last = offset + sum((n - 1) * step for n, step in zip(size, stride))
            if last >= len(array):
                raise CheckpointError(f"read_torch_file: '{self.path}': a tensor of size "
                                      f"{size} (stride {stride}, offset {offset}) reaches "
                                      f"element {last} of a {kind} of {len(array)}")
            view = numpy.lib.stride_tricks.as_strided(
                array[offset:], shape=size,
                strides=tuple(step * array.itemsize for step in stride), writeable=False)
            return numpy.array(view)
        return numpy.zeros(size, dtype=array.dtype)


def read_torch_file(path):
    """What ``torch.save`` wrote to ``path`` (a state dict: a dict name → NumPy array), read
    without PyTorch and building only the allow-listed classes (see the module's docstring).

    Tensors come back as NumPy arrays of their dtype (bfloat16 as float32, exactly), each its
    own copy; an ``OrderedDict`` as a dict. Raises ``FileNotFoundError`` for a missing file and
    ``CheckpointError`` for anything else: not a zip archive (PyTorch before 1.6 wrote another
    format: load and save it again with a newer PyTorch), a class outside the allow-list
    (named), a missing or short storage, a tensor outside its storage.
    """
    path = _file_path(path, "read_torch_file")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"read_torch_file: no file at '{path}'")
    try:
        if not zipfile.is_zipfile(path):
            raise CheckpointError(f"read_torch_file: '{path}' is not a zip archive as "
                                  "torch.save writes since PyTorch 1.6; a file of an older "
                                  "PyTorch must be loaded and saved again with a newer one")
        with zipfile.ZipFile(path) as archive:
            return _plain_dicts(_read_archive(archive, path))
    except CheckpointError:
        raise
    except Exception as error:          # a truncated or tampered archive or pickle
        raise CheckpointError(f"read_torch_file: '{path}' is truncated or corrupted "
                              f"({type(error).__name__}: {error})") from None


def _read_archive(archive, path):
    pickles = [name for name in archive.namelist() if name.endswith("/data.pkl")
               and name.count("/") == 1]
    if len(pickles) != 1:
        raise CheckpointError(f"read_torch_file: '{path}' is a zip archive but not one "
                              "torch.save wrote (no single <name>/data.pkl)")
    prefix = pickles[0][:-len("data.pkl")]
    try:
        byteorder = archive.read(prefix + "byteorder").decode("ascii").strip()
    except KeyError:
        byteorder = "little"     # written before PyTorch recorded it: little-endian
    if byteorder not in ("little", "big"):
        raise CheckpointError(f"read_torch_file: '{path}' names the byte order {byteorder!r}")
    # read whole, so that the zip's CRC-32 of the pickle is checked before it is unpickled
    program = io.BytesIO(archive.read(pickles[0]))
    return _Unpickler(program, archive, prefix, path, byteorder).load()


def _plain_dicts(value):
    """OrderedDicts as dicts (the state dict's ``_metadata`` attribute is PyTorch's own)."""
    if isinstance(value, dict):
        return {key: _plain_dicts(item) for key, item in value.items()}
    return value
