"""The collectives: ``broadcast_vars``, ``allreduce_grads``, ``allreduce``, ``broadcast`` and
``shard``, with the in-place reduction and broadcast of one buffer (directly on the GPU when the
MPI is CUDA-aware, else through the host).
"""
import collections.abc
import zlib

import numpy

from .. import backend, checks
from ..core import NetVar
from ..module import walk
from . import connection
from .connection import _communicator, _cuda_aware
from .packing import (_buffer_dtype, _collect, _empty, _flat_copy, _gradient_buffer, _groups,
                      _shorten, _signature)


def _check_same_everywhere(where, comm, text, what):
    """Raise ValueError on every rank unless every rank gives the same ``text``."""
    code = zlib.crc32(text.encode())
    low_high = numpy.array([-code, code], dtype=numpy.int64)
    comm.Allreduce(connection._MPI.IN_PLACE, low_high, op=connection._MPI.MAX)
    if -low_high[0] == low_high[1]:
        return
    texts = comm.allgather(text)
    other = next(r for r, t in enumerate(texts) if t != texts[0])
    raise ValueError(f"{where}: the ranks hold different {what}: rank 0 has "
                     f"{_shorten(texts[0])}, rank {other} has {_shorten(texts[other])}; every "
                     "rank must build the same model")


def _through_mpi(buffer, call):
    """``call(array)`` (an MPI call that reads and writes the array in place) on ``buffer``: a
    NumPy buffer directly, a CuPy one directly when the MPI is CUDA-aware (after its stream has
    finished: MPI reads the memory, not the stream), else through one host copy each way.
    Returns the buffer that holds the result (a CuPy buffer that went through the host is a new
    array)."""
    if isinstance(buffer, numpy.ndarray):
        call(buffer)
        return buffer
    if _cuda_aware():
        backend.array_module(buffer).cuda.get_current_stream().synchronize()
        call(buffer)
        return buffer
    host = backend.to_cpu(buffer)
    call(host)
    return backend.to_gpu(host, buffer.device.id)


def _allreduce_in_place(comm, buffer, op):
    """``buffer`` reduced over the ranks with the MPI op ``op`` (see ``_through_mpi``)."""
    return _through_mpi(buffer, lambda array: comm.Allreduce(connection._MPI.IN_PLACE, array,
                                                             op=op))


def _broadcast_in_place(comm, buffer, root):
    """``buffer`` as root has it, on every rank (bytes: any dtype; see ``_through_mpi``)."""
    return _through_mpi(buffer, lambda array: comm.Bcast(array.view(numpy.uint8), root=root))


def _check_root(where, root, comm):
    root = checks.count(where, "root", root)
    if root >= comm.Get_size():
        raise ValueError(f"{where}: root must be a rank, 0 … {comm.Get_size() - 1}, got {root}")
    return root


def broadcast_vars(params, root=0):
    """Give every rank root's values of ``params``: call it on every rank, e.g. once the model
    is built, so that every copy starts alike.

    ``params``: a Module (its parameters and buffers, such as BatchNorm's running statistics),
    or a list or dict of parameters (NetVars) and Modules. The values are written in place (a
    parameter keeps its identity, an optimizer over it keeps working); one broadcast per
    dtype. Every rank must hold the same shapes and dtypes: otherwise every rank raises
    ValueError naming the difference. No-op in one process.
    """
    where = "broadcast_vars"
    found = _collect(where, params, buffers=True)
    comm = _communicator()
    root = _check_root(where, root, comm)
    if comm.Get_size() == 1:
        return
    arrays = [array for array, _ in found]
    _check_same_everywhere(where, comm, _signature(arrays), "parameters (shapes or dtypes)")
    mine = comm.Get_rank() == root
    for positions in _groups(arrays):
        first = arrays[positions[0]]
        sizes = [arrays[k].size for k in positions]
        buffer = _empty(first, sum(sizes), first.dtype)
        offset = 0
        for k, count in zip(positions, sizes):
            if mine:
                buffer[offset:offset + count] = arrays[k].reshape(-1)
            offset += count
        buffer = _broadcast_in_place(comm, buffer, root)
        if mine:
            continue
        offset = 0
        for k, count in zip(positions, sizes):
            array, owner = found[k]
            array[...] = buffer[offset:offset + count].reshape(array.shape)
            offset += count
            if owner is not None:
                owner.mark_edited()


def allreduce_grads(params, average=True, weight=None, allow_empty=False):
    """Sum (``average=False``) or average the gradients of ``params`` over the ranks, in place:
    call it on every rank after ``back()`` and before ``optimizer.step()``.

    ``params``: a Module or a list or dict of parameters and Modules (their ``vars``).
    The gradients are packed into one contiguous buffer per dtype, each scaled by its rank's
    share on the way, and reduced in one MPI call per dtype. A parameter without a gradient on
    some rank contributes zeros there; one without a gradient on every rank keeps none (the
    optimizer skips it, as in one process). The gradients become views of that buffer, which
    the next call for the same parameters reuses (a fresh buffer of megabytes every step costs
    page faults): copy a gradient to keep it past the next call. Should the MPI call itself
    fail, the gradients are gone (each is let go once packed; see the code).

    ``weight``: this rank's weight, a number >= 0: the result is Σ_k w_k · g_k / Σ_k w_k with
    ``average`` (Σ w_k comes from one small all-reduce first), Σ_k w_k · g_k without. Give the
    rows (or valid positions) of this rank's shard, and the average is the gradient of the mean
    loss over the whole batch however unevenly it was cut (see the package docstring); None
    counts every rank once. When ``average`` and every rank's weight is 0, raises ValueError
    on every rank, or with ``allow_empty=True`` (a batch that counts for nothing, such as one
    whose every target is ignored: ``DataParallel`` passes it) sets every gradient to 0, as
    the mean loss over nothing has. No-op in one process otherwise.

    The ranks must hold the same parameter values (``broadcast_vars`` once the model is built;
    ``DataParallel`` does it when fit starts): averaged gradients applied to different weights
    would train a different model on each rank. The first call, and then every
    ``check_parameters_every()``-th (100 by default), compares a checksum of every parameter
    over the ranks (the sum of its bytes read as integers, and one small all-reduce) and
    raises ValueError on every rank, naming the first parameter that differs, before any
    gradient is changed.
    """
    where = "allreduce_grads"
    checks.flag(where, "average", average)
    if weight is not None:
        weight = checks.in_range(where, "weight", weight, 0)
    given, params = params, [owner for _, owner in _collect(where, params, buffers=False)]
    comm = _communicator()
    ranks = comm.Get_size()
    if ranks > 1:
        _check_parameters_alike(where, comm, params, given)
    mine = 1.0 if weight is None else weight
    scale = mine
    if average:
        total = float(ranks) if weight is None else weight if ranks == 1 else \
            _combined(comm, numpy.array(float(weight)), True)
        if total == 0:
            if not checks.flag(where, "allow_empty", allow_empty):
                raise ValueError(f"{where}: every rank gave weight 0, so there is no average; "
                                 "give each rank's number of rows (or valid positions)")
            for p in params:
                if p._g is not None:
                    p.g = 0
            return
        scale = mine / total
    if ranks == 1:
        return
    for positions in _groups([p.data for p in params]):
        members = [params[k] for k in positions]
        first = members[0].data
        xp = backend.array_module(first)
        sizes = [p.size for p in members]
        count = sum(sizes)
        buffer = _gradient_buffer(first, _buffer_dtype(first.dtype), members, count)
        # [scaled gradients ..., has-a-gradient flags]. Each gradient is let go once it is
        # packed: freed before MPI mallocs and frees a temporary buffer of the same size, its
        # memory serves that buffer; freed after it, the free space at the top of the heap grew
        # past glibc's trim threshold and was given back to the system, to be faulted in again
        # by the next step (~3,700 page faults, a quarter of a 2-process W3 step).
        flags = numpy.zeros(len(members), dtype=buffer.dtype)
        offset = 0
        for k, (p, size_) in enumerate(zip(members, sizes)):
            view = buffer[offset:offset + size_]
            offset += size_
            if p._g is None:
                view[...] = 0
                continue
            if scale == 0:          # a rank whose shard counts for nothing (its loss may be
                view[...] = 0       # 0/0 = NaN): zeros, not NaN · 0
            elif scale == 1:
                view[...] = p._g.reshape(-1)
            else:
                xp.multiply(p._g.reshape(-1), scale, out=view)
            flags[k] = 1
            p.reset()
        buffer[count:] = flags if xp is numpy else backend.to_gpu(flags, first.device.id)
        buffer = _allreduce_in_place(comm, buffer, connection._MPI.SUM)
        flags = backend.to_cpu(buffer[count:])             # read on the host
        offset = 0
        for p, size_, flag in zip(members, sizes, flags):
            if flag:                 # (the setter takes the view as it is, cast to p's dtype)
                p.g = buffer[offset:offset + size_].reshape(p.shape)
            offset += size_


_check_every = 100      # see check_parameters_every
_calls = 0              # allreduce_grads calls over several processes so far


def check_parameters_every(calls=None):
    """How often ``allreduce_grads`` compares the ranks' parameters: at its first call, then
    every ``calls``-th (100 by default; 1: every call; 0: never). Returns the setting (the new
    one when ``calls`` is given). Set it alike on every rank: the check is a collective.

    A check costs one pass over every parameter and two small all-reduces: about 2 ms for the
    7.5 MB of W9's MLP, against a 40 ms step, so 0.02 ms per step at every 100th."""
    global _check_every
    if calls is not None:
        _check_every = checks.count("check_parameters_every", "calls", calls)
    return _check_every


def _check_parameters_alike(where, comm, params, given):
    """Raise ValueError on every rank when the ranks' parameters differ (see
    ``allreduce_grads``): at the first call, then every ``_check_every``-th."""
    global _calls
    _calls += 1
    if _check_every == 0 or (_calls - 1) % _check_every:
        return
    arrays = [p.data for p in params]
    _check_same_everywhere(where, comm, _signature(arrays), "parameters (shapes or dtypes)")
    sums = [_checksum(a) for a in arrays]
    # each 64-bit sum as two 32-bit halves: an int64 and its negation hold either exactly
    codes = numpy.array([half for value in sums for half in divmod(value, 2 ** 32)],
                        dtype=numpy.int64)
    low_high = numpy.concatenate([-codes, codes])
    comm.Allreduce(connection._MPI.IN_PLACE, low_high, op=connection._MPI.MAX)
    differ = numpy.unique(
        numpy.flatnonzero(-low_high[:len(codes)] != low_high[len(codes):]) // 2)
    if len(differ) == 0:
        return
    first = int(differ[0])
    values = comm.allgather(sums[first])
    other = next(r for r, code in enumerate(values) if code != values[0])
    p = params[first]
    raise ValueError(f"{where}: the ranks hold different values of parameter {first} "
                     f"({_parameter_name(given, p)}, {p.dtype} {p.shape}): rank {other}'s "
                     f"differs from rank 0's ({len(differ)} of {len(params)} parameters "
                     "differ); averaged gradients would train a different model on each rank. "
                     "Give every rank rank 0's values once the model is built: "
                     "dist.broadcast_vars(model) (DataParallel does it when fit starts)")


def _checksum(array):
    """The sum of ``array``'s bytes read as unsigned words of its item size, modulo 2**64:
    any change of one element changes it (a swap of two does not). Computed where the array lives (on a GPU, one number comes back); about 5 times
    cheaper than a CRC of the bytes on the host."""
    xp = backend.array_module(array)
    words = xp.ascontiguousarray(array).reshape(-1).view(f"u{min(array.dtype.itemsize, 8)}")
    return int(words.sum(dtype=numpy.uint64))


def _parameter_name(params, p):
    """The name of parameter ``p`` in ``params`` (a Module, or a list or dict of parameters and
    Modules, as ``allreduce_grads`` takes) as the one walk gives it, or its description."""
    found = next((name for name, kind, value in walk(params, "allreduce_grads", label="params")
                  if value is p), None)
    return f"'{found}'" if found else p._describe()


def _value_array(where, value):
    """``(array, was_number)`` for a number, an array or a NetVar (its data)."""
    if isinstance(value, NetVar):
        value = value.data
    if checks.is_number(value):
        kind = numpy.int64 if checks.is_integer(value) else numpy.float64
        return numpy.array(value, dtype=kind), True
    if backend.is_array(value) and value.dtype.kind in "iuf":
        return value, False
    kind = getattr(value, "dtype", type(value).__name__)
    raise TypeError(f"{where}: value must be a number or an array of numbers, got {kind}")


_OPS = {"sum": "SUM", "mean": "SUM", "max": "MAX", "min": "MIN"}


def _agreed(where, comm, array, number):
    """``array`` once every rank is known to give the same shape and dtype (one small
    all-gather): MPI would combine the bytes of an int64 with those of a float64, or cut a
    longer array. Numbers of different kinds (an int 0 here, a float there) are float64 on
    every rank; other differences raise ValueError, on every rank."""
    if comm.Get_size() == 1:
        return array
    seen = comm.allgather((array.dtype.str, tuple(array.shape), number))
    if len(set(seen)) == 1:
        return array
    if all(entry[2] for entry in seen):
        return array.astype(numpy.float64)
    ranks = "; ".join(f"rank {r}: {'a number' if n else 'an array'} of dtype {numpy.dtype(d)} "
                      f"and shape {s}" for r, (d, s, n) in enumerate(seen))
    raise ValueError(f"{where}: every rank must give the same shape and dtype; {ranks}")


def allreduce(value, op="sum"):
    """``value`` combined over the ranks: ``op`` is "sum" (default), "mean", "max" or "min".

    ``value``: a number (returns a Python number: an int sums to an int, "mean" gives a
    float) or a NumPy or CuPy array of numbers, or a NetVar (its data); an array comes back
    as a new array of its shape and dtype (float for "mean" of integers), on its device.
    Every rank must give the same shape and dtype (checked: ValueError on every rank; numbers of
    different kinds, 0 here and 2.5 there, are summed as floats). E.g. the accuracy over every
    rank's test shard: ``allreduce(correct) / allreduce(len(shard))``. In one process: the value
    itself (a copy).
    """
    where = "allreduce"
    if op not in _OPS:
        raise ValueError(f"{where}: op must be one of {', '.join(map(repr, _OPS))}, got {op!r}")
    array, number = _value_array(where, value)
    comm = _communicator()
    return _combined(comm, _agreed(where, comm, array, number), number, op)


def _combined(comm, array, number, op="sum"):
    """``allreduce`` once the ranks are known to agree: nnkit's own calls (a float weight each
    step, its buffers) skip the agreement's all-gather."""
    result = _flat_copy(array, _buffer_dtype(array.dtype))
    if comm.Get_size() > 1:
        result = _allreduce_in_place(comm, result, getattr(connection._MPI, _OPS[op]))
    result = result.reshape(array.shape)
    if op == "mean":
        result = result / comm.Get_size()
    if op != "mean" or array.dtype.kind == "f":
        result = result.astype(array.dtype, copy=False)
    return result.item() if number else result


def broadcast(value, root=0):
    """Root's ``value`` on every rank (a number or an array of numbers, as ``allreduce``).

    Every rank gives a value of the same shape and dtype (the others' contents are ignored).
    """
    where = "broadcast"
    array, number = _value_array(where, value)
    comm = _communicator()
    root = _check_root(where, root, comm)
    array = _agreed(where, comm, array, number)
    result = _flat_copy(array, array.dtype)
    if comm.Get_size() > 1:
        result = _broadcast_in_place(comm, result, root)
    result = result.reshape(array.shape)
    return result.item() if number else result


def rng_states():
    """Every rank's random generator state (``nnkit.get_rng_state()``), as a list by rank, on
    every rank: call it on every rank (it is a collective), and give it to ``nnkit.save(...,
    rng=...)`` on the rank that saves, so that ``nnkit.load(..., rng=True)`` on every rank
    gives each its own stream back (its dropout masks; the shuffles of ``minibatches(...,
    shard=True)`` are rank 0's). In one process: ``[nnkit.get_rng_state()]``.
    """
    comm = _communicator()
    state = backend.get_rng_state()
    return [state] if comm.Get_size() == 1 else comm.allgather(state)


def _bounds(n, rank, size):
    """``(start, stop)`` of rank's share of n items: contiguous, the first n % size ranks one
    longer."""
    base, extra = divmod(n, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def shard(sequence_or_count):
    """This rank's share of a sequence, or of ``range(count)``: contiguous, balanced (lengths
    differ by at most one, the lower ranks longer) and the same on every call.

    ``shard(10)`` on 3 ranks is ``range(0, 4)``, ``range(4, 7)``, ``range(7, 10)``;
    ``shard(rows)`` is ``rows[start:stop]`` (a list, tuple, NumPy array, ...). In one process:
    everything.
    """
    comm = _communicator()
    here = comm.Get_rank(), comm.Get_size()
    if checks.is_integer(sequence_or_count):
        count = checks.count("shard", "count", sequence_or_count)
        return range(*_bounds(count, *here))
    if isinstance(sequence_or_count, (str, bytes, collections.abc.Mapping)) or not (
            hasattr(sequence_or_count, "__len__") and hasattr(sequence_or_count, "__getitem__")):
        raise TypeError(f"shard: give a count or a sequence (list, tuple, array), got "
                        f"{type(sequence_or_count).__name__}")
    start, stop = _bounds(len(sequence_or_count), *here)
    return sequence_or_count[start:stop]

