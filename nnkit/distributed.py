"""Data-parallel training over MPI (mpi4py): one process per model copy, gradients averaged.

    import nnkit.distributed as dist

    model = ...                                   # built alike (or not: rank 0's values win)
    trainer = nn.Trainer(step, nn.Adam(model.vars), hooks=[dist.DataParallel(model)])
    trainer.fit(lambda: nn.minibatches(seqs, targets, 64, shard=True), epochs=10)

Run it with ``mpiexec -n 4 python train.py`` (``srun python train.py`` under Slurm). Every
process (a rank) holds a copy of the model and computes the gradient of its shard of each batch;
the gradients are summed over the ranks in one all-reduce per dtype, and every copy takes the
same step. Without MPI, or when not started by an MPI launcher, the same script runs as one
process: ``size()`` is 1, ``rank()`` 0, and every collective returns at once.

The functions, for a hand-written loop:

- ``rank()``, ``size()``, ``barrier()``;
- ``broadcast_vars(params, root=0)``: every rank takes root's parameter values (and a
  Module's buffers);
- ``allreduce_grads(params, average=True, weight=None)``: the gradients summed (or averaged)
  over the ranks, packed into one contiguous buffer per dtype and reduced in one call each;
- ``allreduce(value, op="sum")`` and ``broadcast(value, root=0)``: numbers and arrays, for
  metrics;
- ``shard(sequence_or_count)``: this rank's contiguous, balanced share.

**Loss normalisation.** Every nnkit loss is a mean over its batch. Rank k's shard has n_k of
the batch's B = Σ n_k rows (or valid positions), so its loss L_k is a mean over n_k and the loss
of the whole batch is L = Σ_k (n_k / B) · L_k: its gradient is Σ_k n_k · ∇L_k / Σ_k n_k.
``allreduce_grads(params, weight=n_k)`` computes exactly that (``DataParallel`` passes each
batch's rows, or ``mask.sum()``), so N ranks give the gradient of one process on the whole
batch, uneven shards included. Without ``weight`` the ranks count alike (right for equal
shards); ``average=False`` sums, for a loss each rank already divides by the global B.

**Communication.** mpi4py is imported the first time a function here is called; MPI's world
communicator is then used for the life of the process. Over several processes an uncaught
exception on any rank, before its first collective too, prints its traceback and aborts the
whole job (``MPI_Abort``), so no rank waits forever in a collective for a rank that died. A launcher that started several processes
(``PMI_SIZE``, ``OMPI_COMM_WORLD_SIZE``) while mpi4py cannot be imported, or reports another
number of processes (mpi4py built for another MPI than the ``mpiexec`` used), raises
RuntimeError instead of training N unrelated copies.

**GPU (CuPy).** Gradients on the GPU are packed into one device buffer per dtype. When the MPI is
CUDA-aware (say so with the environment variable ``NNKIT_MPI_CUDA_AWARE=1``: Open MPI or
MVAPICH built with CUDA, MPICH with ``MPIR_CVAR_ENABLE_GPU=1``), MPI reduces that device buffer
directly; otherwise the buffer makes one copy to the host and one back per step. Either way the
step synchronises with the GPU once, since MPI needs the gradients complete. float16 data is
reduced in float32.
"""

__all__ = ['rank', 'size', 'barrier', 'broadcast_vars', 'allreduce_grads', 'allreduce',
           'broadcast', 'shard', 'DataParallel']
import collections.abc
import os
import sys
import zlib

import numpy

from . import backend, checks
from .core import NetVar
from .module import Module

_world = None      # the communicator, found on first use: mpi4py's COMM_WORLD, or _Alone()
_MPI = None        # the mpi4py.MPI module when MPI is in use
_LAUNCHERS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")
_hooked = False    # whether sys.excepthook aborts the job
_buffers = {}      # (device, dtype) -> (ids of the parameters, their gradient buffer)


class _Alone:
    """The world of a process without MPI: one rank. Collectives never reach it (size 1
    returns before communicating)."""

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 1

    def Barrier(self):
        pass


def _communicator():
    global _world
    if _world is None:
        _world = _connect(os.environ)
    return _world


def _launched_size(environ):
    """``(processes, variable)`` when an MPI launcher's environment says how many processes it
    started, else ``(None, None)``."""
    for variable in _LAUNCHERS:
        value = environ.get(variable, "")
        if value.isdigit():
            return int(value), variable
    return None, None


def _connect(environ):
    """MPI's world communicator, or ``_Alone()`` without MPI; refuses a launch that MPI does not
    see (see the module docstring)."""
    global _MPI
    expected, variable = _launched_size(environ)
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError, OSError) as error:    # (no mpi4py, or no MPI library)
        if expected is not None and expected > 1:
            raise RuntimeError(
                f"nnkit.distributed: started as one of {expected} processes ({variable}="
                f"{expected}) but mpi4py cannot be used ({type(error).__name__}: {error}); "
                "install it with `pip install nnkit[mpi]` or `pip install mpi4py`") from error
        return _Alone()
    comm = MPI.COMM_WORLD
    if expected is not None and comm.Get_size() != expected:
        raise RuntimeError(
            f"nnkit.distributed: the launcher started {expected} processes ({variable}="
            f"{expected}) but MPI sees {comm.Get_size()}: mpi4py uses another MPI than the "
            f"mpiexec that started them (mpi4py's: {MPI.Get_library_version().splitlines()[0]})"
            "; run the mpiexec of that MPI")
    _MPI = MPI
    if comm.Get_size() > 1:
        _abort_on_uncaught_exception()
    return comm


def _abort_on_uncaught_exception():
    """Make an uncaught exception print its traceback and then end every rank (MPI_Abort).

    Without it the other ranks wait forever in their next collective for this one. Installed
    once: when this module is imported under a launcher of several processes (so that a rank
    failing before its first collective is covered too), else when MPI is found with several.
    """
    global _hooked
    if _hooked:
        return
    _hooked = True
    previous = sys.excepthook

    def abort(kind, value, traceback):
        previous(kind, value, traceback)
        try:
            comm = _communicator()
        except Exception:              # no usable MPI: nothing to abort
            return
        if comm.Get_size() > 1:
            print(f"nnkit.distributed: rank {comm.Get_rank()} of {comm.Get_size()} stopped on "
                  f"{kind.__name__}; aborting every rank (MPI_Abort)", file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
            comm.Abort(1)

    sys.excepthook = abort


if (_launched_size(os.environ)[0] or 0) > 1:
    _abort_on_uncaught_exception()


def _cuda_aware():
    return os.environ.get("NNKIT_MPI_CUDA_AWARE", "").lower() in ("1", "true", "yes")


def rank():
    """This process's number, 0 … size() − 1 (0 without MPI)."""
    return _communicator().Get_rank()


def size():
    """The number of processes (1 without MPI)."""
    return _communicator().Get_size()


def barrier():
    """Wait until every rank has called ``barrier()``."""
    _communicator().Barrier()


# ----------------------------------------------------------------------------- what to move

def _collect(where, params, buffers):
    """``(array, owner)`` for every parameter (owner: its NetVar) and, with ``buffers``, every
    buffer of the Modules given (owner None), each once, in a deterministic order.

    ``params``: a Module, or a list, tuple or dict of NetVars and Modules. Refused: anything
    else, naming where it is.
    """
    found, seen = [], set()

    def add(array, owner):
        key = id(owner if owner is not None else array)
        if key not in seen:
            seen.add(key)
            found.append((array, owner))

    def visit(value, label):
        if isinstance(value, NetVar):
            if value.parents:
                raise TypeError(f"{where}: {label} ({value._describe()}) is computed by an op; "
                                "give the parameters (leaf NetVars) or the model")
            add(value.data, value)
        elif isinstance(value, Module):
            for p in value.vars:
                add(p.data, p)
            if buffers:
                for array in value.named_buffers().values():
                    add(array, None)
        elif isinstance(value, collections.abc.Mapping):
            for key, item in value.items():
                visit(item, f"{label}[{key!r}]")
        elif isinstance(value, (list, tuple)):
            for position, item in enumerate(value):
                visit(item, f"{label}[{position}]")
        else:
            raise TypeError(f"{where}: {label} must be a NetVar, a Module, or a list or dict of "
                            f"them, got {type(value).__name__}")

    visit(params, "params")
    return found


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


def _check_same_everywhere(where, comm, text, what):
    """Raise ValueError on every rank unless every rank gives the same ``text``."""
    code = zlib.crc32(text.encode())
    low_high = numpy.array([-code, code], dtype=numpy.int64)
    comm.Allreduce(_MPI.IN_PLACE, low_high, op=_MPI.MAX)
    if -low_high[0] == low_high[1]:
        return
    texts = comm.allgather(text)
    other = next(r for r, t in enumerate(texts) if t != texts[0])
    raise ValueError(f"{where}: the ranks hold different {what}: rank 0 has "
                     f"{_shorten(texts[0])}, rank {other} has {_shorten(texts[other])}; every "
                     "rank must build the same model")


def _shorten(text, limit=200):
    return text if len(text) <= limit else text[:limit] + " …"


# ----------------------------------------------------------------------------- collectives

def _allreduce_in_place(comm, buffer, op):
    """``buffer`` reduced over the ranks with the MPI op ``op``; a NumPy buffer in place, a CuPy
    one directly when the MPI is CUDA-aware, else through one host copy each way. Returns the
    reduced buffer (a CuPy buffer that went through the host is a new array)."""
    if isinstance(buffer, numpy.ndarray):
        comm.Allreduce(_MPI.IN_PLACE, buffer, op=op)
        return buffer
    xp = backend.array_module(buffer)
    if _cuda_aware():
        xp.cuda.get_current_stream().synchronize()      # MPI reads the memory, not the stream
        comm.Allreduce(_MPI.IN_PLACE, buffer, op=op)
        return buffer
    host = backend.to_cpu(buffer)                        # one copy to the host ...
    comm.Allreduce(_MPI.IN_PLACE, host, op=op)
    return backend.to_gpu(host, buffer.device.id)        # ... and one back


def _broadcast_in_place(comm, buffer, root):
    """``buffer`` as root has it, on every rank (bytes: any dtype); returns it (see
    ``_allreduce_in_place`` for CuPy)."""
    if isinstance(buffer, numpy.ndarray):
        comm.Bcast(buffer.view(numpy.uint8), root=root)
        return buffer
    xp = backend.array_module(buffer)
    if _cuda_aware():
        xp.cuda.get_current_stream().synchronize()
        comm.Bcast(buffer.view(numpy.uint8), root=root)
        return buffer
    host = backend.to_cpu(buffer)
    comm.Bcast(host.view(numpy.uint8), root=root)
    return backend.to_gpu(host, buffer.device.id)


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


def allreduce_grads(params, average=True, weight=None):
    """Sum (``average=False``) or average the gradients of ``params`` over the ranks, in place:
    call it on every rank after ``back()`` and before ``optimizer.step()``.

    ``params``: a Module or a list or dict of parameters and Modules (their ``vars``).
    The gradients are packed into one contiguous buffer per dtype, each scaled by its rank's
    share on the way, and reduced in one MPI call per dtype. A parameter without a gradient on
    some rank contributes zeros there; one without a gradient on every rank keeps none (the
    optimizer skips it, as in one process). The gradients become views of that buffer, which
    the next call for the same parameters reuses (a fresh buffer of megabytes every step costs
    page faults): copy a gradient to keep it past the next call.

    ``weight``: this rank's weight, a number >= 0: the result is Σ_k w_k · g_k / Σ_k w_k with
    ``average`` (Σ w_k comes from one small all-reduce first), Σ_k w_k · g_k without. Give the
    rows (or valid positions) of this rank's shard, and the average is the gradient of the mean
    loss over the whole batch however unevenly it was cut (see the module docstring); None
    counts every rank once. Raises ValueError, on every rank, when ``average`` and every
    rank's weight is 0. No-op in one process.
    """
    where = "allreduce_grads"
    checks.flag(where, "average", average)
    if weight is not None:
        weight = checks.in_range(where, "weight", weight, 0)
    params = [owner for _, owner in _collect(where, params, buffers=False)]
    comm = _communicator()
    ranks = comm.Get_size()
    mine = 1.0 if weight is None else weight
    scale = mine
    if average:
        total = float(ranks) if weight is None else weight if ranks == 1 else allreduce(weight)
        if total == 0:
            raise ValueError(f"{where}: every rank gave weight 0, so there is no average; give "
                             "each rank's number of rows (or valid positions)")
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
        offset = 0                      # [scaled gradients ..., has-a-gradient flags]
        for p, size_ in zip(members, sizes):
            g, view = p._g, buffer[offset:offset + size_]
            if g is None:
                view[...] = 0
            elif scale == 1:
                view[...] = g.reshape(-1)
            else:
                xp.multiply(g.reshape(-1), scale, out=view)
            offset += size_
        flags = numpy.array([p._g is not None for p in members], dtype=buffer.dtype)
        buffer[count:] = flags if xp is numpy else backend.to_gpu(flags, first.device.id)
        buffer = _allreduce_in_place(comm, buffer, _MPI.SUM)
        flags = backend.to_cpu(buffer[count:])             # read on the host
        offset = 0
        for p, size_, flag in zip(members, sizes, flags):
            if flag:                 # (the setter takes the view as it is, cast to p's dtype)
                p.g = buffer[offset:offset + size_].reshape(p.shape)
            offset += size_


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


def allreduce(value, op="sum"):
    """``value`` combined over the ranks: ``op`` is "sum" (default), "mean", "max" or "min".

    ``value``: a number (returns a Python number: an int sums to an int, "mean" gives a
    float) or a NumPy or CuPy array of numbers, or a NetVar (its data); an array comes back
    as a new array of its shape and dtype (float for "mean" of integers), on its device.
    Every rank must give the same shape and dtype. E.g. the accuracy over every rank's test
    shard: ``allreduce(correct) / allreduce(len(shard))``. In one process: the value itself
    (a copy).
    """
    where = "allreduce"
    if op not in _OPS:
        raise ValueError(f"{where}: op must be one of {', '.join(map(repr, _OPS))}, got {op!r}")
    array, number = _value_array(where, value)
    result = _flat_copy(array, _buffer_dtype(array.dtype))
    comm = _communicator()
    if comm.Get_size() > 1:
        result = _allreduce_in_place(comm, result, getattr(_MPI, _OPS[op]))
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
    result = _flat_copy(array, array.dtype)
    if comm.Get_size() > 1:
        result = _broadcast_in_place(comm, result, root)
    result = result.reshape(array.shape)
    return result.item() if number else result


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


# ----------------------------------------------------------------------------- the Trainer's hook

class DataParallel:
    """Data-parallel training with ``nn.Trainer``: ``hooks=[dist.DataParallel(model)]``.

    ``model``: what is trained (a Module, or a list or dict of parameters and Modules): its
    buffers are broadcast with the parameters and averaged over the ranks after every epoch;
    None: the optimizer's parameters only. ``average``: True (default) gives each step the
    gradient of the mean loss over the whole batch, each rank's gradient weighted by its
    batch's rows or valid positions (``trainer.batch_weight``, see the module docstring);
    False sums the gradients, for a loss each rank divides by the global batch size.

    The Trainer knows this hook and calls it at fixed places, wherever it is in ``hooks``:

    - fit start, before the other hooks: every rank checks that it holds the same parameters,
      then takes rank 0's parameters, buffers and optimizer state (so ranks may be seeded
      differently, e.g. ``nn.seed(seed + dist.rank())`` for their own dropout masks);
    - each batch: the ranks agree that every one has a batch (different numbers of batches
      raise ValueError on every rank instead of leaving one waiting); after ``back()`` and
      before the hooks' ``on_before_step`` the gradients are all-reduced, so hooks and the
      optimizer's modifiers (gradient clipping) see the global gradient; when a hook on any
      rank stops training (``StopOnNaN``), every rank stops at the same step;
    - epoch end: the loss, the metrics and ``samples`` are summed over the ranks, training and
      validation alike, so every rank has the same logs and ``EarlyStopping`` decides alike;
    - only rank 0 runs ``ProgressBar``, ``SaveBest`` and ``PlotHistory`` (and any hook with
      ``root_only = True``) and prints the stop reason;
    - fit end, after the other hooks: every rank takes rank 0's parameters, buffers and
      optimizer state again (``SaveBest(restore=True)`` restored them there).

    Every rank must call ``fit`` (and ``evaluate``) alike. In one process it changes nothing.
    The metrics must be nnkit's (``total`` and ``count``), refused otherwise when fit starts.
    """

    root = 0

    def __init__(self, model=None, average=True):
        if model is not None:
            _collect("DataParallel", model, buffers=True)
        self.model = model
        self.average = checks.flag("DataParallel", "average", average)

    @property
    def is_root(self):
        """Whether this process is rank 0 (writes checkpoints, prints, plots)."""
        return rank() == self.root

    def _targets(self, trainer):
        return trainer.params if self.model is None else [self.model, trainer.params]

    def on_fit_start(self, trainer):
        """Check the metrics and the ranks' parameters; take rank 0's values."""
        for name, metric in trainer.metrics.items():
            if not all(checks.is_number(getattr(metric, key, None)) for key in ("total", "count")):
                raise TypeError(f"DataParallel: metrics[{name!r}] ({type(metric).__name__}) has "
                                "no numeric total and count to sum over the ranks; use an nnkit "
                                "Metric (a subclass of nn.Metric)")
        self.synchronize(trainer.optimizer, self._targets(trainer))

    def synchronize(self, optimizer, params):
        """Every rank takes rank 0's ``params`` (see ``broadcast_vars``) and optimizer state."""
        broadcast_vars(params, root=self.root)
        comm = _communicator()
        if comm.Get_size() == 1:
            return
        state = None
        if comm.Get_rank() == self.root:
            state = optimizer.state_dict()
            state["state"] = [{key: backend.to_cpu(value) if backend.is_array(value) else value
                               for key, value in entry.items()} for entry in state["state"]]
        state = comm.bcast(state, root=self.root)
        if comm.Get_rank() != self.root:
            optimizer.load_state_dict(state)

    def on_before_step(self, trainer, loss):
        """All-reduce the gradients, weighted by each rank's ``trainer.batch_weight``."""
        allreduce_grads(trainer.params, average=self.average,
                        weight=trainer.batch_weight if self.average else None)

    def agree(self, *flags):
        """For each flag, whether it is true on any rank (one call for all of them)."""
        comm = _communicator()
        values = numpy.array(flags, dtype=numpy.int32)
        if comm.Get_size() > 1:
            comm.Allreduce(_MPI.IN_PLACE, values, op=_MPI.MAX)
        return tuple(bool(v) for v in values)

    def first(self, value):
        """``(rank, value)`` of the lowest rank whose ``value`` is not None, ``(None, None)``
        when there is none (every rank calls it and gets the same answer)."""
        comm = _communicator()
        values = [value] if comm.Get_size() == 1 else comm.allgather(value)
        return next(((r, v) for r, v in enumerate(values) if v is not None), (None, None))

    def sum_metrics(self, metrics, *numbers):
        """Sum ``total`` and ``count`` of each metric over the ranks, in place, and the
        ``numbers``, in one call; returns the summed numbers."""
        comm = _communicator()
        if comm.Get_size() == 1:
            return numbers
        values = numpy.array([x for m in metrics for x in (m.total, m.count)] + list(numbers),
                             dtype=numpy.float64)
        comm.Allreduce(_MPI.IN_PLACE, values, op=_MPI.SUM)
        for position, metric in enumerate(metrics):
            metric.total, metric.count = float(values[2 * position]), \
                float(values[2 * position + 1])
        return tuple(values[2 * len(metrics):].tolist())

    def average_buffers(self):
        """Average the model's float buffers (BatchNorm's running statistics, computed by each
        rank on its shards) over the ranks, in place."""
        if self.model is None or size() == 1:
            return
        for array, owner in _collect("DataParallel", self.model, buffers=True):
            if owner is None and array.dtype.kind == "f":      # (few and small: one call each)
                array[...] = allreduce(array, "mean")

    def on_fit_end(self, trainer):
        """Every rank takes rank 0's values (SaveBest may have restored the best there)."""
        self.synchronize(trainer.optimizer, self._targets(trainer))
