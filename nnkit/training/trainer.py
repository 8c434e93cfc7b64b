"""The Trainer: an optional loop over the define-by-run graph (its hooks: ``nnkit.training.hooks``).

    def step(batch):                      # builds the graph for one minibatch
        x, y = batch
        z = model(nn.NetVar(x, requires_grad=False))
        return nn.SoftmaxCELoss(z, y), z, y          # or just the loss node

    trainer = nn.Trainer(step, nn.Adam(params), hooks=[nn.ProgressBar(),
                         nn.EarlyStopping("val_loss", patience=5)],
                         metrics={"accuracy": nn.Accuracy()})
    history = trainer.fit(train_batches, epochs=50, val=val_batches)

For each training batch the trainer calls ``step_fn(batch)``, resets the optimizer's gradients,
calls ``loss.back()``, the hooks' ``on_before_step``, then ``optimizer.step()``: every step starts
from zero gradients (a step that raises after ``back()`` leaves its gradients in ``.g``, to
inspect, and the next step does not add them to its own). ``step_fn`` returns the loss node, or
``(loss, predictions, targets)`` or ``(loss, predictions, targets, mask)``: then the metrics
are updated with ``(predictions, targets[, mask])`` (before ``back()``, so that a batch the
metrics refuse changes no parameter) and the epoch's mean loss weights each
batch by its number of positions (predictions' rows, or ``mask.sum()``); with the loss alone
the weight is the length of the batch's first array. Validation batches go through the same
``step_fn`` under ``no_grad()`` and ``eval_mode()``. Batches are a list (any re-iterable) or a
function returning a fresh iterable each epoch (e.g. a reshuffling generator); a one-shot
iterator (a generator, ``iter(...)``, ``nn.minibatches(...)``) is refused for more than one
epoch before anything trains.

Each epoch's logs hold ``epoch``, ``loss``, every metric, ``val_loss`` and ``val_<metric>``
with validation data, ``lr`` (the rate of the epoch's last update), ``samples`` (the rows,
or valid positions, trained on, whatever weights the loss gives them: an int, summed over
the ranks under DataParallel) and ``time``
(seconds). ``fit`` returns
``trainer.history`` (a ``History``: dict of lists of those logs).

Over several processes, ``hooks=[nnkit.distributed.DataParallel(model)]`` makes the Trainer
all-reduce the gradients before each step, sum the epoch's loss and metrics over the ranks, run
the output hooks (``ProgressBar``, ``SaveBest``, ``PlotHistory``, any hook with
``root_only = True``) on rank 0 only and stop every rank together; ``DataParallel``'s docstring
says where each happens. ``trainer.batch_weight`` is the current batch's weight in the epoch's
mean, which weights each rank's gradient: the loss's own ``denominator`` (every nnkit loss
states what it divides by: its rows or positions; for the class-index losses the total weight
Σ wᵢ of the positions they count, after class weights, ``ignore_index`` and masks; a masked
MSELoss its valid positions), else ``mask.sum()`` when step_fn returns a mask, else the
batch's ``weight`` attribute (``minibatches`` sets it: sequences, or valid steps, padding left
out), else the positions of the predictions (all axes but the last; a Loss's own prediction
when step_fn returns none), else the rows of the batch's first item (of a tuple or list; the
first value of a dict; the rows of a slice), and 1 for a batch whose size cannot be read (such
batches count equally).

The epochs train in the current train mode: ``train_mode`` unless fit is called inside
``eval_mode()`` (then Dropout is off and BatchNorm uses its running statistics while training).
"""

__all__ = ['Trainer']
import collections.abc
import copy
import math
import sys
import time

import numpy

from .. import backend, checks
from ..core import NetVar, collect
from ..distributed import DataParallel
from ..modes import eval_mode, no_grad
from .hooks import History, Hook, PlotHistory, ProgressBar, SaveBest  # noqa: F401  (Hook too)
from ..ops.loss import Loss
from ..replay.schedule import LossValue
from .metrics import MeanLoss, held, update_all

_CALLBACKS = ("on_fit_start", "on_epoch_start", "on_before_step", "on_batch_end",
              "on_epoch_end", "on_fit_end")
_LOG_KEYS = ("epoch", "loss", "lr", "samples", "time")
_ROOT_ONLY = (ProgressBar, SaveBest, PlotHistory)    # with DataParallel: rank 0 runs them alone
_END = object()                                      # no batch left


class Trainer:
    """``Trainer(step_fn, optimizer, hooks=(), metrics=None)``; ``fit(train_batches, epochs,
    val=None)`` trains and returns the History. See the module docstring for the protocol.

    ``hooks`` is a list of hook instances (``Hook`` subclasses, or objects with ``on_*``
    callbacks), each at most once, and at most one ``DataParallel`` (kept as
    ``trainer.parallel``, not in ``trainer.hooks``). ``metrics`` maps names to metric accumulators
    (``{"accuracy": nn.Accuracy()}``); a copy is used for validation; a name may not be one of
    the epoch logs' own keys (``epoch``, ``loss``, ``lr``, ``samples``, ``time``, ``val_*``).
    ``evaluate(batches)`` returns ``{"loss": ..., <metric>: ...}`` computed under
    ``no_grad()`` and ``eval_mode()``. A refused argument raises at once (TypeError for a
    wrong kind, ValueError for a wrong value), before any parameter is updated.
    """

    def __init__(self, step_fn, optimizer, hooks=(), metrics=None):
        if not callable(step_fn):
            raise TypeError(f"Trainer: step_fn must be callable, got {type(step_fn).__name__}")
        if isinstance(optimizer, type):
            raise TypeError(f"Trainer: optimizer is the class {optimizer.__name__}; pass an "
                            f"instance: {optimizer.__name__}(params, ...)")
        if not all(hasattr(optimizer, name) for name in ("step", "reset", "params", "lr")):
            # (a schedule has step() too: it would change the rate and train nothing)
            raise TypeError(f"Trainer: optimizer must be an nnkit optimizer, got "
                            f"{type(optimizer).__name__}")
        hooks = _checked_hooks(hooks)
        metrics = _checked_metrics(metrics)
        self.step_fn = step_fn
        self.optimizer = optimizer
        self.history = next((h for h in hooks if isinstance(h, History)), None)
        if self.history is None:      # (not ``or``: an empty History is a falsy dict)
            self.history = History()
        parallel = [h for h in hooks if isinstance(h, DataParallel)]
        if len(parallel) > 1:
            raise ValueError(f"Trainer: hooks hold {len(parallel)} DataParallel hooks; give one")
        self.parallel = parallel[0] if parallel else None
        self.hooks = [self.history] + [h for h in hooks
                                       if h is not self.history and h is not self.parallel]
        self._running = self.hooks      # the hooks this process runs (rank 0 only: all)
        self.metrics = metrics
        self._val_metrics = {name: copy.deepcopy(m) for name, m in self.metrics.items()}
        self.epoch = 0
        self.steps = 0
        self.batch = 0
        self.epochs = 0
        self.batches_per_epoch = None
        self.logs = {}
        self.stop_reason = None
        self.val = None
        self.batch_weight = None

    @property
    def params(self):
        return self.optimizer.params

    def state_dict(self):
        """What resuming needs of the trainer, as plain data: the epochs and steps trained
        and the History (``nnkit.save(..., trainer=...)`` stores it with a checkpoint, and
        ``nnkit.load(..., trainer=...)`` gives it back, so that the next ``fit`` continues
        the numbering and the History)."""
        return {"epoch": self.epoch, "steps": self.steps,
                "history": {key: list(values) for key, values in self.history.items()}}

    def check_state_dict(self, state):
        """Raise (TypeError or ValueError naming what is wrong) unless ``load_state_dict``
        would take ``state``; changes nothing."""
        where = "Trainer.load_state_dict"
        if not isinstance(state, dict):
            raise TypeError(f"{where}: expects the dict state_dict() returns, got "
                            f"{type(state).__name__}")
        missing = [key for key in ("epoch", "steps", "history") if key not in state]
        if missing:
            raise ValueError(f"{where}: the state is missing {missing}")
        checks.count(where, "epoch", state["epoch"])
        checks.count(where, "steps", state["steps"])
        history = state["history"]
        if not isinstance(history, dict) or not all(
                isinstance(key, str) and isinstance(values, list)
                for key, values in history.items()):
            raise TypeError(f"{where}: history must be a dict of name -> list of values, got "
                            f"{type(history).__name__}")
        lengths = {key: len(values) for key, values in history.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"{where}: every list of the history holds one entry per epoch "
                             f"logged; got the lengths {lengths}")

    def load_state_dict(self, state):
        """Take the epochs, steps and History of ``state`` (see ``state_dict``), checked
        first: a refused state changes nothing."""
        self.check_state_dict(state)
        self.epoch, self.steps = state["epoch"], state["steps"]
        self.history.clear()
        self.history.update({key: list(values) for key, values in state["history"].items()})

    def stop(self, reason):
        """Ask the trainer to stop (see ``Hook``); ``reason`` is printed once."""
        if self.stop_reason is None:
            self.stop_reason = reason
            if self.parallel is None or self.parallel.is_root:
                print(reason, file=sys.stderr)

    def _stopping(self):
        """Whether to stop; with DataParallel, whether any rank stopped (then every rank
        takes the reason of the lowest such rank)."""
        if self.parallel is None:
            return self.stop_reason is not None
        if not self.parallel.agree(self.stop_reason is not None)[0]:
            return False
        self._adopt_stop()
        return True

    def _adopt_stop(self):
        """Every rank takes the stop reason of the lowest rank that stopped (rank 0 prints it
        unless it was its own, printed already)."""
        where, reason = self.parallel.first(self.stop_reason)
        agreed = reason if where == self.parallel.root else f"rank {where}: {reason}"
        if self.stop_reason is None:
            self.stop(agreed)
        self.stop_reason = agreed

    def _next_batch(self, iterator):
        """The next batch, or ``_END``; with DataParallel the ranks first agree that each has
        one and that none stopped in ``on_batch_end`` (then ``_END`` for all)."""
        batch = next(iterator, _END)
        if self.parallel is None:
            return batch
        stopped, some, missing = self.parallel.agree(self.stop_reason is not None,
                                                     batch is not _END, batch is _END)
        if stopped:
            self._adopt_stop()
            return _END
        if some and missing:
            where, count = self.parallel.first(self.batch if batch is _END else None)
            raise ValueError(f"Trainer.fit: rank {where} ran out of batches after {count} in "
                             f"epoch {self.epoch} while other ranks have more; with "
                             "DataParallel every rank needs the same number of batches (cut "
                             "every batch into shards: nn.minibatches(..., shard=True) or "
                             "dist.shard)")
        return batch

    def _call(self, callback, *args):
        for hook in self._running:
            method = getattr(hook, callback, None)
            if method is not None:
                method(self, *args)

    def fit(self, train_batches, epochs=1, val=None):
        """Train for ``epochs`` more epochs (or until a hook stops); returns the History.

        ``trainer.val`` holds ``val`` (hooks read it). An epoch that raises, or is stopped,
        before its first update does not count: ``trainer.epoch`` stays at the last epoch
        trained, and the next fit's first epoch takes its number.
        """
        epochs = checks.count("Trainer.fit", "epochs", epochs, 1)
        _check_batches("Trainer.fit", "train_batches", train_batches, epochs)
        if val is not None:
            _check_batches("Trainer.fit", "val", val, epochs)
        if self.parallel is not None:           # before any other collective of the fit
            self.parallel.same_fit(self.epoch + epochs, val is not None)
        # An empty list is refused before training (it would be after the first epoch); with
        # DataParallel, one rank's share of a sharded validation set may be empty, but not
        # every rank's (the ranks agree on it here).
        for name, batches in (("train_batches", train_batches), ("val", val)):
            empty = isinstance(batches, collections.abc.Sized) and len(batches) == 0
            if name == "val" and val is not None and self.parallel is not None:
                empty = not self.parallel.agree(not empty)[0]
            if empty and (name == "train_batches" or val is not None):
                raise ValueError(f"Trainer.fit: {name} holds no batches"
                                 + (" on any rank" if name == "val" and self.parallel else ""))
        kept = self.stop_reason, self.val, self.epochs
        self.stop_reason = None
        self.val = val
        self.epochs = self.epoch + epochs
        self._running = self.hooks
        try:                    # a hook refusing the fit leaves the trainer as it was
            if self.parallel is not None:
                self.parallel.on_fit_start(self)
                if not self.parallel.is_root:
                    self._running = [hook for hook in self.hooks if not (
                        isinstance(hook, _ROOT_ONLY) or getattr(hook, "root_only", False))]
            self._call("on_fit_start")
        except BaseException:
            self.stop_reason, self.val, self.epochs = kept
            raise
        for _ in range(epochs):
            self.epoch += 1
            steps = self.steps
            try:
                logs = self._train_epoch(_fresh(train_batches))
            except BaseException:
                if self.steps == steps:       # nothing trained: the epoch did not happen
                    self.epoch -= 1
                raise
            if logs is None:      # stopped mid-epoch (before its first update: it did not happen)
                if self.steps == steps:
                    self.epoch -= 1
                break
            if val is not None:
                logs.update({f"val_{key}": value for key, value in
                             self.evaluate(val).items()})
            self.logs = logs
            self._call("on_epoch_end", logs)
            if self._stopping():
                break
        self._call("on_fit_end")
        if self.parallel is not None:
            self.parallel.on_fit_end(self)
        return self.history

    def _train_epoch(self, batches):
        self.batches_per_epoch = len(batches) if hasattr(batches, "__len__") else None
        self._call("on_epoch_start")
        started = time.perf_counter()
        loss_metric = MeanLoss()
        samples = 0                     # rows (or valid positions), whatever the loss weighs
        records = []                    # (loss, weight) of each step, for DataParallel
        for metric in self.metrics.values():
            metric.reset()
        self.batch = 0
        batches = iter(batches)
        while (batch := self._next_batch(batches)) is not _END:
            loss, predictions, targets, mask = _unpack(self.step_fn(batch), self.metrics)
            size = self.batch_weight = _positions(batch, loss, predictions, mask,
                                                  parallel=self.parallel is not None)
            samples += _positions(batch, loss, predictions, mask, weighed=False)
            value = loss.item()
            update_all(self.metrics, predictions, targets, mask)
            # Each step starts from zero gradients, as zero_grad() in a PyTorch loop: a
            # gradient left by a back() outside the Trainer, or by a step that raised before
            # its update (kept for inspection), would otherwise be added to this one.
            self.optimizer.reset()
            loss.back()
            if self.parallel is not None:        # first: hooks and modifiers see the sum
                self.parallel.on_before_step(self, loss)
            self._call("on_before_step", loss)
            if self._stopping():
                self.optimizer.reset()
                return None
            rate = self.optimizer.lr        # what this update uses (a schedule may step after)
            self.optimizer.step()
            self.steps += 1
            self.batch += 1
            loss_metric.update(value, size)
            records.append((value, size))
            self._call("on_batch_end", {"loss": value, "size": size})
            # (with DataParallel the ranks agree on a stop here at the next _next_batch)
            if self.parallel is None and self.stop_reason is not None:
                return None
        if self.stop_reason is not None:        # agreed in _next_batch
            return None
        if self.batch == 0:
            raise ValueError(f"Trainer.fit: train_batches gave no batches in epoch {self.epoch}; "
                             "pass a list or a function returning a fresh iterable")
        if self.parallel is not None:          # (buffers weighed by rows, not loss weights)
            everyone, = self.parallel.sum_epoch(loss_metric, records, self.metrics.values(),
                                                samples)
            self.parallel.average_buffers(samples, everyone)
            samples = int(everyone)         # (summed as floats: every rank's count is an int)
        return {"epoch": self.epoch, "loss": loss_metric.value,
                **{name: metric.value for name, metric in self.metrics.items()},
                "lr": rate, "samples": samples,
                "time": time.perf_counter() - started}

    def evaluate(self, batches):
        """Mean loss and metrics over ``batches`` under no_grad() and eval_mode().

        Raises ValueError when ``batches`` gives no batch (e.g. an iterator already used).
        """
        _check_batches("Trainer.evaluate", "batches", batches, 1)
        loss_metric = MeanLoss()
        records = []
        for metric in self._val_metrics.values():
            metric.reset()
        count = 0
        with no_grad(), eval_mode():
            for batch in _fresh(batches):
                loss, predictions, targets, mask = _unpack(self.step_fn(batch),
                                                           self._val_metrics)
                records.append((loss.item(), _positions(batch, loss, predictions, mask)))
                loss_metric.update(*records[-1])
                update_all(self._val_metrics, predictions, targets, mask)
                count += 1
        if self.parallel is not None:      # (a rank may have no batch of a sharded set)
            count, = self.parallel.sum_epoch(loss_metric, records, self._val_metrics.values(),
                                             count)
        if count == 0:
            raise ValueError("Trainer.evaluate: the validation batches gave no batches (an "
                             "iterator already used?); pass a list or a function returning "
                             "a fresh iterable")
        return {"loss": loss_metric.value,
                **{name: metric.value for name, metric in self._val_metrics.items()}}


def _checked_hooks(hooks):
    """``hooks`` as a list, each a hook instance given once; refused with its position."""
    if hooks is None:
        return []
    if isinstance(hooks, (Hook, str)) or any(hasattr(hooks, name) for name in _CALLBACKS) \
            or not isinstance(hooks, collections.abc.Iterable):
        raise TypeError(f"Trainer: hooks must be a list of hooks, got {type(hooks).__name__}; "
                        "put a single hook in a list: hooks=[...]")
    hooks = list(hooks)
    for position, hook in enumerate(hooks):
        if isinstance(hook, type):
            raise TypeError(f"Trainer: hooks[{position}] is the class {hook.__name__}; pass an "
                            f"instance: {hook.__name__}(...)")
        if not (isinstance(hook, Hook) or any(callable(getattr(hook, name, None))
                                              for name in _CALLBACKS)):
            raise TypeError(f"Trainer: hooks[{position}] must be a hook (a Hook or an object "
                            f"with on_* callbacks), got {type(hook).__name__} {hook!r}")
        first = next(k for k, other in enumerate(hooks) if other is hook)
        if first != position:
            raise ValueError(f"Trainer: hooks[{position}] is the same {type(hook).__name__} "
                             f"as hooks[{first}]; its callbacks would run twice")
    return hooks


def _checked_metrics(metrics):
    """``metrics`` as a new dict of name -> metric instance; refused naming the entry."""
    if metrics is None:
        return {}
    if not isinstance(metrics, collections.abc.Mapping):
        raise TypeError("Trainer: metrics must be a dict of name: metric, e.g. "
                        f"{{'accuracy': nn.Accuracy()}}, got {type(metrics).__name__}")
    for name, metric in metrics.items():
        if not isinstance(name, str):
            raise TypeError(f"Trainer: metric names must be strings, got {name!r}")
        if name in _LOG_KEYS or name.startswith("val_"):
            raise ValueError(f"Trainer: metric name {name!r} would overwrite the epoch logs' "
                             f"own entry; {', '.join(_LOG_KEYS)} and val_* are taken")
        if isinstance(metric, type):
            raise TypeError(f"Trainer: metrics[{name!r}] is the class {metric.__name__}; pass "
                            f"an instance: {metric.__name__}(...)")
        # (value looked up on the class: a property may raise while the metric is empty)
        if not (callable(getattr(metric, "update", None))
                and callable(getattr(metric, "reset", None)) and (
                    hasattr(type(metric), "value") or "value" in getattr(metric, "__dict__", ()))):
            raise TypeError(f"Trainer: metrics[{name!r}] must be a metric (update, reset, "
                            f"value), got {type(metric).__name__} {metric!r}")
        try:        # (what a batch another metric refuses puts back: metrics.update_all)
            held(metric)
        except Exception as error:
            raise TypeError(f"Trainer: metrics[{name!r}] cannot be copied ({type(error).__name__}: "
                            f"{error}), which the Trainer does to put it back when another "
                            "metric refuses a batch") from None
    return dict(metrics)


def _check_batches(owner, name, batches, epochs):
    """A list, a re-iterable or a callable; a one-shot iterator only for a single epoch."""
    if callable(batches):
        return
    if not isinstance(batches, collections.abc.Iterable):
        raise TypeError(f"{owner}: {name} must be a list of batches, a re-iterable or a "
                        f"function returning a fresh iterable, got {type(batches).__name__}")
    if epochs > 1 and isinstance(batches, collections.abc.Iterator):
        raise TypeError(f"{owner}: {name} is an iterator ({type(batches).__name__}), which "
                        f"is exhausted after one epoch; for {epochs} epochs pass a list or a "
                        "function returning a fresh iterable (e.g. lambda: nn.minibatches(...))")


def _fresh(batches):
    return batches() if callable(batches) else batches


def _unpack(result, metrics):
    """``(loss, predictions, targets, mask)`` from what step_fn returned, checked before use."""
    parts = tuple(result) if isinstance(result, (tuple, list)) else (result,)
    loss = parts[0] if parts else None
    if not isinstance(loss, NetVar) or loss.size != 1 or len(parts) not in (1, 3, 4):
        raise TypeError("Trainer: step_fn must return the loss node (a one-element NetVar) or "
                        f"(loss, predictions, targets[, mask]); got {_describe(result)}")
    loss, predictions, targets, mask = parts + (None,) * (4 - len(parts))
    if metrics and predictions is None:
        raise ValueError(f"Trainer: the metrics {sorted(metrics)} need step_fn to return "
                         "(loss, predictions, targets), got the loss only")
    for what, value in (("predictions", predictions), ("mask", mask)):
        if value is not None and not hasattr(value, "shape"):
            raise TypeError(f"Trainer: step_fn returned {what} of type "
                            f"{type(value).__name__}; give a NetVar or an array")
    return loss, predictions, targets, mask


def _describe(result):
    if isinstance(result, (tuple, list)):
        return f"{type(result).__name__} of {len(result)} item(s): " + ", ".join(
            _describe(part) for part in result)
    if isinstance(result, NetVar):
        return f"NetVar of shape {result.shape}"
    return type(result).__name__


def _denominator(loss, parallel=False):
    """What the loss divided by: its own ``denominator`` (a ``LossValue``: a loss as a replay of
    nn.capture hands it out), or that of the one nnkit loss it was computed from (a loss plus a
    penalty); None when there is none. Several that divide by different totals: None, and
    refused under DataParallel, whose ranks' gradients no single weight would average."""
    if isinstance(loss, (Loss, LossValue)):
        return getattr(loss, "denominator", None)
    if not (isinstance(loss, NetVar) and loss._parents):
        return None
    totals = {float(backend.to_cpu(node.denominator)) for node in collect((loss,))
              if isinstance(node, Loss) and getattr(node, "denominator", None) is not None}
    if len(totals) > 1 and parallel:
        raise ValueError(
            f"DataParallel: the loss adds nnkit losses that divide by different totals "
            f"({', '.join(f'{total:g}' for total in sorted(totals))}), so no one weight averages "
            "the ranks' gradients as one process would; train on one of them, or return a mask "
            "of the positions that count with the loss")
    return totals.pop() if len(totals) == 1 else None


def _positions(batch, loss, predictions, mask, weighed=True, parallel=False):
    """The weight of a batch in the epoch's mean loss (``weighed=False``: its samples, the rows
    or valid positions, whatever weights the loss gives them)."""
    denominator = _denominator(loss, parallel) if weighed else None
    if denominator is not None:               # what the loss itself divided by (Σ wᵢ)
        return float(backend.to_cpu(denominator))
    if mask is not None:
        mask = backend.to_cpu(mask._data if isinstance(mask, NetVar) else mask)
        return float(mask.sum()) if weighed else int(numpy.count_nonzero(mask))
    if getattr(batch, "weight", None) is not None:        # minibatches' batches carry theirs
        return batch.weight
    if predictions is None and isinstance(loss, Loss) and loss._parents:
        predictions = loss._parents[0]        # the loss's own prediction: its rows are real
    if predictions is not None:               # (a slice past the data's end selects fewer)
        shape = predictions.shape
        return math.prod(shape[:-1]) if len(shape) >= 2 else math.prod(shape)
    first = batch
    if isinstance(batch, (tuple, list)) and batch:
        first = batch[0]
    elif isinstance(batch, dict) and batch:
        first = next(iter(batch.values()))                # {"x": X, "y": y}: X's rows
    if isinstance(first, slice) and first.stop is not None:
        return len(range(*first.indices(first.stop)))     # the rows a slice selects
    return len(first) if hasattr(first, "__len__") else 1
