"""The Trainer's hook: ``DataParallel``."""
import numpy

from .. import backend, checks
from . import connection
from .collectives import _combined, allreduce_grads, broadcast_vars
from .connection import _communicator, rank, size
from .packing import _collect


class DataParallel:
    """Data-parallel training with ``nn.Trainer``: ``hooks=[dist.DataParallel(model)]``.

    ``model``: what is trained (a Module, or a list or dict of parameters and Modules): its
    buffers are broadcast with the parameters and averaged over the ranks after every epoch;
    None: the optimizer's parameters only. ``average``: True (default) gives each step the
    gradient of the mean loss over the whole batch, each rank's gradient weighted by its
    batch's rows or valid positions (``trainer.batch_weight``, see the package docstring);
    False sums the gradients, for a loss each rank divides by the global batch size (or a
    summed loss); its epoch values pair the ranks' batches by position, so give every rank
    shards of the same validation batches. Every rank calls ``fit`` alike (the same epochs,
    ``val`` given or not): ranks that do not raise ValueError together.

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

    def same_fit(self, epochs, validated):
        """Every rank must call fit alike (the epoch to reach, validation or not): else each
        rank would wait in another collective. ValueError on every rank when they differ."""
        comm = _communicator()
        if comm.Get_size() == 1:
            return
        everyone = comm.allgather((int(epochs), bool(validated)))
        if len(set(everyone)) > 1:
            raise ValueError("DataParallel: the ranks called fit differently (the epoch to "
                             f"reach and whether val was given, by rank: {everyone}); every "
                             "rank must call fit with the same epochs and val given alike")

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
                        weight=trainer.batch_weight if self.average else None, allow_empty=True)

    def agree(self, *flags):
        """For each flag, whether it is true on any rank (one call for all of them)."""
        comm = _communicator()
        values = numpy.array(flags, dtype=numpy.int32)
        if comm.Get_size() > 1:
            comm.Allreduce(connection._MPI.IN_PLACE, values, op=connection._MPI.MAX)
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
        comm.Allreduce(connection._MPI.IN_PLACE, values, op=connection._MPI.SUM)
        for position, metric in enumerate(metrics):
            metric.total, metric.count = float(values[2 * position]), \
                float(values[2 * position + 1])
        return tuple(values[2 * len(metrics):].tolist())

    def sum_epoch(self, loss_metric, records, metrics, *numbers):
        """The epoch's loss, ``metrics`` and ``numbers`` summed over the ranks, in place (see
        ``sum_metrics``); ``records`` holds this rank's ``(loss, weight)`` of each batch.

        ``average``: each rank's loss is the mean over its shard, so the sums of totals and
        weights give the mean over every rank's rows (one call for everything).
        ``average=False``: each rank's loss is its share of the batch's (divided by the global
        batch size), so batch b's loss is the sum of the ranks' shares, weighed by its global
        size Σ_r n_r,b (one all-gather of the records more: the ranks may hold different numbers
        of validation batches)."""
        if self.average:
            return self.sum_metrics([loss_metric, *metrics], *numbers)
        self._sum_shares(loss_metric, records)
        return self.sum_metrics(list(metrics), *numbers)

    def _sum_shares(self, loss_metric, records):
        comm = _communicator()
        everyone = [records] if comm.Get_size() == 1 else comm.allgather(records)
        total = count = 0.0
        for b in range(max(map(len, everyone))):
            shares = [entries[b] for entries in everyone if b < len(entries)]
            weight = sum(n for _, n in shares)
            if weight:
                total += sum(value for value, _ in shares) * weight
            count += weight
        loss_metric.total, loss_metric.count = total, count

    def average_buffers(self, weight, total):
        """Average the model's float buffers (BatchNorm's running statistics, computed by each
        rank on its shards) over the ranks, in place, each rank weighed by ``weight`` (the
        rows it trained on this epoch) out of ``total`` (every rank's: the epoch's summed
        count; an even mean when it is 0).

        Not a synchronized BatchNorm: each rank normalized its batches with its shard's
        statistics, and the spread between the shards' means is not in the averaged variance;
        with momentum 1 and equal shards the running mean is the whole batch's."""
        if self.model is None or size() == 1:
            return
        share = weight / total if total else 1 / size()
        comm = _communicator()
        for array, owner in _collect("DataParallel", self.model, buffers=True):
            if owner is None and array.dtype.kind == "f":      # (few and small: one call each)
                array[...] = _combined(comm, array * share, False)

    def on_fit_end(self, trainer):
        """Every rank takes rank 0's values (SaveBest may have restored the best there)."""
        self.synchronize(trainer.optimizer, self._targets(trainer))
