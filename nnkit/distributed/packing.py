"""What the collectives move and how it is packed: the arrays of parameters and Modules, grouped
by device and dtype into contiguous 1-D buffers, and the gradient buffer kept from one step to
the next.
"""
import numpy

from .. import backend
from ..module import walk

_buffers = {}      # (device, dtype) -> (ids of the parameters, their gradient buffer)


def _collect(where, params, buffers):
    """``(array, owner)`` for every parameter (owner: its NetVar) and, with ``buffers``, every
    constant (owner: its NetVar) and buffer (owner None) of ``params``, each once, in a
    deterministic order (the walk's: the same on every rank for the same model).

    ``params``: a NetVar, a Module, or a list, tuple or dict of them; refused otherwise, with
    the walk's errors (naming ``where`` and the place, ``params[0]``).
    """
    return [(getattr(*value), None) if kind == "buffer" else (value.data, value)
            for _, kind, value in walk(params, where, label="params")
            if kind == "var" or buffers and kind in ("constant", "buffer")]


def _buffer_dtype(dtype):
    """The dtype an array is reduced in: float16 in float32 (not every MPI sums float16)."""
    return numpy.dtype(numpy.float32) if dtype == numpy.float16 else numpy.dtype(dtype)


def _groups(arrays):
    """Positions of ``arrays`` grouped by device and dtype, in order of first appearance (the
    same on every rank for the same model)."""
    groups = {}
    for position, array in enumerate(arrays):
        groups.setdefault((backend.device_of(array), array.dtype.str), []).append(position)
    return list(groups.values())


def _flat_copy(array, dtype):
    """A contiguous 1-D copy of ``array`` in ``dtype``, on its device."""
    if isinstance(array, numpy.ndarray):
        return numpy.array(array, dtype=dtype).reshape(-1)
    with array.device:
        return backend.array_module(array).array(array, dtype=dtype).reshape(-1)


def _empty(like, count, dtype):
    """A new 1-D array of ``count`` elements on the device of the array ``like``."""
    if isinstance(like, numpy.ndarray):
        return numpy.empty(count, dtype)
    with like.device:
        return backend.array_module(like).empty(count, dtype)


def _signature(arrays):
    return ";".join(f"{backend.array_module(a).__name__}:{a.dtype.str}:{tuple(a.shape)}"
                    for a in arrays)


def _shorten(text, limit=200):
    return text if len(text) <= limit else text[:limit] + " …"


def _gradient_buffer(like, dtype, members, count):
    """An array of ``count`` + one flag per parameter on the device of ``like``: the one of the
    last call for the same parameters when there is one, else a new one (kept for the next)."""
    key, ids = (backend.device_of(like), dtype.str), tuple(id(p) for p in members)
    kept = _buffers.get(key)
    if kept is not None and kept[0] == ids and kept[1].size == count + len(members):
        return kept[1]
    buffer = _empty(like, count + len(members), dtype)
    _buffers[key] = (ids, buffer)
    return buffer

