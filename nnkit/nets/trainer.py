"""The Trainer: an optional loop over the define-by-run graph (its hooks: ``nnkit.nets.hooks``).

    def step(batch):                      # builds the graph for one minibatch
        x, y = batch
        z = model(nn.NetVar(x, requires_grad=False))
        return nn.SoftmaxCELoss(z, y), z, y          # or just the loss node

    trainer = nn.Trainer(step, nn.Adam(params), hooks=[nn.ProgressBar(),
                         nn.EarlyStopping("val_loss", patience=5)],
                         metrics={"accuracy": nn.Accuracy()})
    history = trainer.fit(train_batches, epochs=50, val=val_batches)

For each training batch the trainer calls ``step_fn(batch)``, ``loss.back()``, the hooks'
``on_before_step``, then ``optimizer.step()``. ``step_fn`` returns the loss node, or
``(loss, predictions, targets)`` or ``(loss, predictions, targets, mask)``: then the metrics
are updated with ``(predictions, targets[, mask])`` and the epoch's mean loss weights each
batch by its number of positions (predictions' rows, or ``mask.sum()``); with the loss alone
the weight is the length of the batch's first array. Validation batches go through the same
``step_fn`` under ``no_grad()`` and ``eval_mode()``. Batches are a list (any re-iterable) or a
function returning a fresh iterable each epoch (e.g. a reshuffling generator).

Each epoch's logs hold ``epoch``, ``loss``, every metric, ``val_loss`` and ``val_<metric>``
with validation data, ``lr``, ``samples`` and ``time`` (seconds). ``fit`` returns
``trainer.history`` (a ``History``: dict of lists of those logs).
"""

__all__ = ['Trainer']
import copy
import math
import sys
import time

from .. import backend
from ..core import NetVar, eval_mode, no_grad
from .hooks import History, Hook  # noqa: F401  (Hook: the hooks' base, importable from here too)
from .metrics import MeanLoss


class Trainer:
    """``Trainer(step_fn, optimizer, hooks=(), metrics=None)``; ``fit(train_batches, epochs,
    val=None)`` trains and returns the History. See the module docstring for the protocol.

    ``metrics`` maps names to metric accumulators (``{"accuracy": nn.Accuracy()}``); a copy
    is used for validation. ``evaluate(batches)`` returns ``{"loss": ..., <metric>: ...}``
    computed under ``no_grad()`` and ``eval_mode()``.
    """

    def __init__(self, step_fn, optimizer, hooks=(), metrics=None):
        if not callable(step_fn):
            raise TypeError(f"Trainer: step_fn must be callable, got {type(step_fn).__name__}")
        if not hasattr(optimizer, "step"):
            raise TypeError(f"Trainer: optimizer must be an nnkit optimizer, got "
                            f"{type(optimizer).__name__}")
        self.step_fn = step_fn
        self.optimizer = optimizer
        hooks = list(hooks)
        self.history = next((h for h in hooks if isinstance(h, History)), None)
        if self.history is None:      # (not ``or``: an empty History is a falsy dict)
            self.history = History()
        self.hooks = [self.history] + [h for h in hooks if h is not self.history]
        self.metrics = dict(metrics or {})
        self._val_metrics = {name: copy.deepcopy(m) for name, m in self.metrics.items()}
        self.epoch = 0
        self.steps = 0
        self.batch = 0
        self.epochs = 0
        self.batches_per_epoch = None
        self.logs = {}
        self.stop_reason = None

    @property
    def params(self):
        return self.optimizer.params

    def stop(self, reason):
        """Ask the trainer to stop (see ``Hook``); ``reason`` is printed once."""
        if self.stop_reason is None:
            self.stop_reason = reason
            print(reason, file=sys.stderr)

    def _call(self, callback, *args):
        for hook in self.hooks:
            method = getattr(hook, callback, None)
            if method is not None:
                method(self, *args)

    def fit(self, train_batches, epochs=1, val=None):
        """Train for ``epochs`` more epochs (or until a hook stops); returns the History."""
        if not (isinstance(epochs, int) and epochs >= 1):
            raise ValueError(f"Trainer.fit: epochs must be a positive integer, got {epochs!r}")
        self.stop_reason = None
        self.epochs = self.epoch + epochs
        self._call("on_fit_start")
        for _ in range(epochs):
            self.epoch += 1
            logs = self._train_epoch(_fresh(train_batches, "train_batches", self.epoch))
            if logs is None:      # stopped mid-epoch
                break
            if val is not None:
                logs.update({f"val_{key}": value for key, value in
                             self.evaluate(val).items()})
            self.logs = logs
            self._call("on_epoch_end", logs)
            if self.stop_reason is not None:
                break
        self._call("on_fit_end")
        return self.history

    def _train_epoch(self, batches):
        self.batches_per_epoch = len(batches) if hasattr(batches, "__len__") else None
        self._call("on_epoch_start")
        started = time.perf_counter()
        loss_metric = MeanLoss()
        for metric in self.metrics.values():
            metric.reset()
        self.batch = 0
        for batch in batches:
            loss, predictions, targets, mask = _unpack(self.step_fn(batch))
            loss.back()
            self._call("on_before_step", loss)
            if self.stop_reason is not None:
                self.optimizer.reset()
                return None
            self.optimizer.step()
            self.steps += 1
            self.batch += 1
            size = _positions(batch, predictions, mask)
            value = loss.item()
            loss_metric.update(value, size)
            _update_metrics(self.metrics, predictions, targets, mask)
            self._call("on_batch_end", {"loss": value, "size": size})
            if self.stop_reason is not None:
                return None
        if self.batch == 0:
            raise ValueError(f"Trainer.fit: train_batches gave no batches in epoch {self.epoch}; "
                             "pass a list or a function returning a fresh iterable")
        return {"epoch": self.epoch, "loss": loss_metric.value,
                **{name: metric.value for name, metric in self.metrics.items()},
                "lr": self.optimizer.lr, "samples": loss_metric.count,
                "time": time.perf_counter() - started}

    def evaluate(self, batches):
        """Mean loss and metrics over ``batches`` under no_grad() and eval_mode()."""
        loss_metric = MeanLoss()
        for metric in self._val_metrics.values():
            metric.reset()
        with no_grad(), eval_mode():
            for batch in _fresh(batches, "val", self.epoch):
                loss, predictions, targets, mask = _unpack(self.step_fn(batch))
                loss_metric.update(loss.item(), _positions(batch, predictions, mask))
                _update_metrics(self._val_metrics, predictions, targets, mask)
        return {"loss": loss_metric.value,
                **{name: metric.value for name, metric in self._val_metrics.items()}}


def _fresh(batches, name, epoch):
    if callable(batches):
        return batches()
    if iter(batches) is batches and epoch > 1:
        raise TypeError(f"Trainer.fit: {name} is an iterator, which is exhausted after one "
                        "epoch; pass a list or a function returning a fresh iterable")
    return batches


def _unpack(result):
    parts = tuple(result) if isinstance(result, (tuple, list)) else (result,)
    loss = parts[0] if parts else None
    if not isinstance(loss, NetVar) or loss.size != 1 or len(parts) not in (1, 3, 4):
        raise TypeError("Trainer: step_fn must return the loss node (a one-element NetVar) or "
                        f"(loss, predictions, targets[, mask]); got {type(result).__name__} "
                        f"of {len(parts)} item(s)")
    return parts + (None,) * (4 - len(parts))


def _positions(batch, predictions, mask):
    """The weight of a batch in the epoch's mean loss."""
    if mask is not None:
        return float(backend.to_cpu((mask._data if isinstance(mask, NetVar) else mask).sum()))
    if predictions is not None:
        shape = predictions.shape
        return math.prod(shape[:-1]) if len(shape) >= 2 else math.prod(shape)
    first = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
    return len(first) if hasattr(first, "__len__") else 1


def _update_metrics(metrics, predictions, targets, mask):
    if not metrics:
        return
    if predictions is None:
        raise ValueError("Trainer: metrics need step_fn to return (loss, predictions, targets)")
    for metric in metrics.values():
        if mask is None:
            metric.update(predictions, targets)
        else:
            metric.update(predictions, targets, mask=mask)
