"""Trainer hooks: the ``Hook`` base, the ``History`` every Trainer keeps, and the ready-made
hooks (progress bar, early stopping, best-model checkpoints, NaN guard, learning-rate schedules,
loss curves). See ``nnkit.training.trainer`` for the training protocol they plug into.
"""

__all__ = ['Hook', 'History', 'ProgressBar', 'EarlyStopping', 'SaveBest', 'StopOnNaN',
           'LRSchedule', 'PlotHistory']
import copy
import math
import os
import time

from .. import backend, checks
from ..io import check_model
from ..optim.base import Optimizer
from ..optim.schedules import Best, ReduceOnPlateau
from .metrics import MeanLoss


class Hook:
    """Base of the trainer hooks. Override any callback; each receives the trainer first.

    - ``on_fit_start(trainer)``: before the first epoch.
    - ``on_epoch_start(trainer)``: ``trainer.epoch`` is the epoch number (from 1),
      ``trainer.batches_per_epoch`` the number of batches when known (else None).
    - ``on_before_step(trainer, loss)``: after ``loss.back()``, before ``optimizer.step()``;
      calling ``trainer.stop(reason)`` here skips the update and ends training.
    - ``on_batch_end(trainer, logs)``: after the update; ``logs = {"loss", "size"}``.
    - ``on_epoch_end(trainer, logs)``: after validation; ``logs`` are the epoch's logs.
    - ``on_fit_end(trainer)``: after the last epoch (also after a stop).

    ``trainer.stop(reason)`` ends training after the current batch or epoch; the reason is
    printed and kept in ``trainer.stop_reason``. ``trainer.steps`` counts optimizer updates;
    ``trainer.val`` is the fit's validation data (None without). An error raised in
    ``on_fit_start`` stops ``fit`` before anything trains: the place to check a configuration.
    """

    def on_fit_start(self, trainer):
        pass

    def on_epoch_start(self, trainer):
        pass

    def on_before_step(self, trainer, loss):
        pass

    def on_batch_end(self, trainer, logs):
        pass

    def on_epoch_end(self, trainer, logs):
        pass

    def on_fit_end(self, trainer):
        pass


class History(Hook, dict):
    """Per-epoch logs as a dict of lists: ``history["val_loss"][k]`` is the value of epoch
    ``history["epoch"][k]``. Every list has one entry per logged epoch: an entry an epoch did
    not log (``val_*`` in a fit without validation data, before or after fits with it) is None.

    Every Trainer has one (``trainer.history``), called before the other hooks, so their
    ``on_epoch_end`` already sees the current epoch.
    """

    def on_epoch_end(self, trainer, logs):
        logged = len(next(iter(self.values()), ()))         # epochs logged before this one
        for key, value in logs.items():
            self.setdefault(key, [None] * logged).append(value)
        for key, values in self.items():
            if len(values) == logged:                       # not in this epoch's logs
                values.append(None)


def _metric_name(owner, metric):
    if not isinstance(metric, str):
        raise TypeError(f"{owner}: metric must be the name of an epoch log entry such as "
                        f"'val_loss', got {type(metric).__name__} {metric!r}")
    return metric


def _check_validated(owner, trainer, metric):
    """Refuse, before training, a ``val_*`` metric in a fit without validation data."""
    if metric.startswith("val_") and trainer.val is None:
        raise ValueError(f"{owner}: monitors '{metric}', but fit() has no validation data; "
                         "pass fit(..., val=...) or monitor a training entry such as 'loss'")


def _metric_value(owner, logs, metric):
    """``logs[metric]``; a missing entry is a ValueError listing the entries there are."""
    if metric not in logs:
        raise ValueError(f"{owner}: no '{metric}' in the epoch logs; available: "
                         f"{sorted(logs)} (val_* entries need fit(..., val=...))")
    return logs[metric]


class ProgressBar(Hook):
    """A tqdm bar per epoch: batches done, running loss and samples/s live; one line per epoch
    (with its validation results) in a terminal or notebook. Needs ``tqdm``."""

    def __init__(self, file=None):
        try:
            from tqdm.auto import tqdm
        except ImportError:
            raise ImportError("ProgressBar needs tqdm: pip install tqdm (or nnkit[examples])"
                              ) from None
        self._tqdm = tqdm
        self.file = file
        self.bar = None

    def on_epoch_start(self, trainer):
        self.bar = self._tqdm(total=trainer.batches_per_epoch, unit="batch", leave=True,
                              desc=f"epoch {trainer.epoch}/{trainer.epochs}", file=self.file)
        self._loss, self._samples, self._started = MeanLoss(), 0, time.perf_counter()

    def on_batch_end(self, trainer, logs):
        self._loss.update(logs["loss"], logs["size"])
        self._samples += logs["size"]
        rate = self._samples / max(time.perf_counter() - self._started, 1e-9)
        self.bar.set_postfix_str(f"loss={self._loss.value:.4f}, {rate:,.0f} samples/s",
                                 refresh=False)
        self.bar.update(1)

    def on_epoch_end(self, trainer, logs):
        rate = logs["samples"] / max(logs["time"], 1e-9)
        shown = ", ".join(f"{key}={value:.4f}" for key, value in logs.items()
                          if key not in ("epoch", "lr", "samples", "time"))
        self.bar.set_postfix_str(f"{shown}, {rate:,.0f} samples/s", refresh=False)
        self._close()

    def on_fit_end(self, trainer):
        self._close()

    def _close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class EarlyStopping(Hook):
    """Stop when ``metric`` has not improved for ``patience`` epochs.

    ``mode="min"`` for losses, ``"max"`` for accuracies; an improvement must exceed
    ``min_delta``. ``best`` and ``best_epoch`` hold the best value and its epoch. Each fit starts
    afresh (as a new patience): a second ``fit`` is not stopped by the first one's count. A
    ``val_*`` metric in a fit without validation data is refused before training; a metric
    missing from the logs raises ValueError at the first epoch's end.
    """

    def __init__(self, metric="val_loss", patience=5, mode="min", min_delta=0.0):
        self.metric = _metric_name("EarlyStopping", metric)
        self.patience = checks.count("EarlyStopping", "patience", patience, 1)
        self.monitor = Best(mode, min_delta, "EarlyStopping")
        self.best_epoch = None
        self._fresh = False

    @property
    def best(self):
        return self.monitor.best

    def on_fit_start(self, trainer):
        _check_validated("EarlyStopping", trainer, self.metric)
        self._fresh = True        # reset at the first epoch's end: a refused fit changes nothing

    def on_epoch_end(self, trainer, logs):
        value = _metric_value("EarlyStopping", logs, self.metric)
        if self._fresh:
            self.monitor = Best(self.monitor.mode, self.monitor.min_delta, "EarlyStopping")
            self.best_epoch = None
            self._fresh = False
        if self.monitor.update(value):
            self.best_epoch = trainer.epoch
        elif self.monitor.bad >= self.patience:
            trainer.stop(f"EarlyStopping: {self.metric} has not improved for "
                         f"{self.monitor.bad} epochs (best {self.best:.6g} at epoch "
                         f"{self.best_epoch})")


class SaveBest(Hook):
    """Save a checkpoint (``nnkit.save``) to ``path`` whenever ``metric`` improves.

    ``model`` is what to save: anything ``nn.save`` takes (a Module, nested or not, such as an
    FFN or a SequenceModel, with its buffers; a dict or list of parameters and Modules); the
    optimizer's parameters by default. ``optimizer=True`` also saves the optimizer's state. The
    checkpoint's extra data holds the epoch and the metric. ``restore=True`` loads the best
    parameters back at the end of fit (and the buffers, such as BatchNorm's running
    statistics, when ``model`` is given: the optimizer's parameters hold none).

    The best value carries over from one fit to the next, as the file does (``restore`` then
    loads the best of every fit so far): for a fit on other data, give a new SaveBest.
    A model that cannot be saved is refused here, when the hook is built (TypeError naming what
    was given and where); with ``optimizer=True``, a model that does not hold every parameter
    the optimizer updates is refused when fit starts, and so is, without ``model``, an
    optimizer's parameter frozen since (``requires_grad = False``: give ``model``). The folder of ``path`` must exist and be
    writable when fit starts (checked before training). The write is atomic: a failed save
    leaves the previous checkpoint whole, and the hook's best value and epoch as they were.
    """

    def __init__(self, path, metric="val_loss", mode="min", model=None, optimizer=False,
                 restore=False):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"SaveBest: path must be a str or a path, got "
                            f"{type(path).__name__} {path!r}")
        if model is not None:
            check_model(model, "SaveBest")
        self.path, self.metric, self.model = path, _metric_name("SaveBest", metric), model
        self.save_optimizer = checks.flag("SaveBest", "optimizer", optimizer)
        self.restore = checks.flag("SaveBest", "restore", restore)
        self.monitor = Best(mode, 0.0, "SaveBest")
        self.best_epoch = None

    def on_fit_start(self, trainer):
        _check_validated("SaveBest", trainer, self.metric)
        path = os.path.abspath(os.fspath(self.path))
        folder = os.path.dirname(path)
        if os.path.isdir(path) or os.fsdecode(os.fspath(self.path)).endswith(os.sep):
            raise ValueError(f"SaveBest: path '{path}' is a folder; give a file name")
        if not os.path.isdir(folder):
            raise ValueError(f"SaveBest: the folder '{folder}' of path '{path}' does not exist")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError(f"SaveBest: the folder '{folder}' of path '{path}' is not "
                                  "writable")
        if self.model is None:          # the optimizer's parameters: trainable ones only
            for position, p in enumerate(trainer.optimizer.params):
                if not p.requires_grad:
                    raise ValueError(
                        f"SaveBest: the optimizer's parameter {position} ({p._describe()}) "
                        "does not require a gradient (frozen after the optimizer was built), "
                        "and a checkpoint of the optimizer's parameters holds trainable ones "
                        "only; give SaveBest the model (model=...), which saves frozen weights "
                        "as constants")
        if self.save_optimizer and self.model is not None:
            held = {id(p) for p in check_model(self.model, "SaveBest").params.values()}
            for position, p in enumerate(trainer.optimizer.params):
                if id(p) not in held:
                    raise ValueError(f"SaveBest: the optimizer updates parameter {position} "
                                     f"({p._describe()}), which the model does not hold; give "
                                     "the model that holds every parameter the optimizer "
                                     "updates, or optimizer=False")

    def on_epoch_end(self, trainer, logs):
        from ..io import save
        value = _metric_value("SaveBest", logs, self.metric)
        if copy.copy(self.monitor).update(value):     # the hook changes once the file is saved
            save(self.path, self.model if self.model is not None else trainer.params,
                 optimizer=trainer.optimizer if self.save_optimizer else None,
                 extra={"epoch": trainer.epoch, self.metric: float(value)})
            self.best_epoch = trainer.epoch
        self.monitor.update(value)

    def on_fit_end(self, trainer):
        if self.restore and self.best_epoch is not None:
            from ..io import load
            load(self.path, self.model if self.model is not None else trainer.params,
                 optimizer=trainer.optimizer if self.save_optimizer else None)


class StopOnNaN(Hook):
    """Stop before an update that would spread a NaN or Inf into the parameters.

    Checks, after ``back()`` and before ``step()``, the loss, then each parameter's value and
    gradient in the optimizer's order; the message names the first non-finite one. A batch
    that counts for nothing (``trainer.batch_weight`` 0: every target ignored, on this rank
    under DataParallel) has the loss 0/0 = NaN with a zero gradient: its loss is not checked.
    """

    def on_before_step(self, trainer, loss):
        where = f"at epoch {trainer.epoch}, batch {trainer.batch + 1}"
        value = loss.item()
        if not math.isfinite(value) and trainer.batch_weight != 0:
            trainer.stop(f"StopOnNaN: the loss is {value} {where}; parameters not updated")
            return
        for position, p in enumerate(trainer.params):
            for what, array in (("value", p._data), ("gradient", p._g)):
                if array is not None and not bool(backend.array_module(array).isfinite(
                        array).all()):
                    label = f" '{p.name}'" if p.name else ""
                    trainer.stop(f"StopOnNaN: the {what} of parameter {position}{label} of "
                                 f"shape {p.shape} is not finite {where}; parameters not "
                                 "updated")
                    return


class LRSchedule(Hook):
    """Drive a learning-rate schedule: ``every="epoch"`` (after each epoch) or ``"step"``
    (after each update). A ``ReduceOnPlateau`` gets ``logs[metric]`` (default ``val_loss``,
    or ``loss`` without validation data) each epoch; ``metric`` is for it only.

    ``schedule`` is a schedule instance (``nn.StepLR(optimizer, 10)``, or any object with
    ``step()``), not an optimizer; when fit starts, a schedule's ``optimizer`` must be the
    trainer's (a schedule of another optimizer would leave the trained one's rate unchanged).
    """

    def __init__(self, schedule, every="epoch", metric=None):
        if isinstance(schedule, type):
            raise TypeError(f"LRSchedule: schedule is the class {schedule.__name__}; pass an "
                            f"instance: {schedule.__name__}(optimizer, ...)")
        if isinstance(schedule, Optimizer):
            raise TypeError(f"LRSchedule: schedule must be a learning-rate schedule, got the "
                            f"optimizer {type(schedule).__name__}; wrap it, e.g. "
                            "LRSchedule(nn.StepLR(optimizer, 10))")
        if not callable(getattr(schedule, "step", None)):
            raise TypeError(f"LRSchedule: schedule must be a learning-rate schedule (with "
                            f"step()), got {type(schedule).__name__} {schedule!r}")
        if every not in ("epoch", "step"):
            raise ValueError(f"LRSchedule: every must be 'epoch' or 'step', got {every!r}")
        if every == "step" and isinstance(schedule, ReduceOnPlateau):
            raise ValueError("LRSchedule: ReduceOnPlateau steps once per epoch")
        if metric is not None:
            if not isinstance(schedule, ReduceOnPlateau):
                raise ValueError(f"LRSchedule: metric is read by ReduceOnPlateau only, not by "
                                 f"{type(schedule).__name__}; leave it out")
            _metric_name("LRSchedule", metric)
        self.schedule, self.every, self.metric = schedule, every, metric

    def on_fit_start(self, trainer):
        driven = getattr(self.schedule, "optimizer", trainer.optimizer)
        if driven is not trainer.optimizer:
            raise ValueError(f"LRSchedule: the schedule drives another optimizer "
                             f"({type(driven).__name__}) than the trainer's "
                             f"({type(trainer.optimizer).__name__}); build the schedule on "
                             "the trainer's optimizer")
        if self.metric is not None:
            _check_validated("LRSchedule", trainer, self.metric)

    def on_batch_end(self, trainer, logs):
        if self.every == "step":
            self.schedule.step()

    def on_epoch_end(self, trainer, logs):
        if self.every != "epoch":
            return
        if isinstance(self.schedule, ReduceOnPlateau):
            metric = self.metric or ("val_loss" if "val_loss" in logs else "loss")
            self.schedule.step(_metric_value("LRSchedule", logs, metric))
        else:
            self.schedule.step()


class PlotHistory(Hook):
    """Plot the loss curves (and other metrics, in a second panel) at the end of fit.

    ``path``: save the figure there (no window opens); None shows it with pyplot.
    ``every_epoch=True`` redraws the file after each epoch (it needs a ``path``). Needs
    ``matplotlib``.
    """

    def __init__(self, path=None, every_epoch=False):
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"PlotHistory: path must be None, a str or a path, got "
                            f"{type(path).__name__} {path!r}")
        if checks.flag("PlotHistory", "every_epoch", every_epoch) and path is None:
            raise ValueError("PlotHistory: every_epoch=True redraws a file; give a path")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ImportError("PlotHistory needs matplotlib: pip install matplotlib "
                              "(or nnkit[examples])") from None
        self.path, self.every_epoch = path, every_epoch

    def on_epoch_end(self, trainer, logs):
        if self.every_epoch and self.path is not None:
            self.plot(trainer.history)

    def on_fit_end(self, trainer):
        if trainer.history:
            self.plot(trainer.history)

    def plot(self, history):
        skip = {"epoch", "lr", "samples", "time"}
        losses = [key for key in history if "loss" in key]
        others = [key for key in history if key not in skip and key not in losses]
        if self.path is None:
            import matplotlib.pyplot as plt
            figure = plt.figure(figsize=(10 if others else 5, 4))
        else:
            from matplotlib.figure import Figure
            figure = Figure(figsize=(10 if others else 5, 4))
        panels = [keys for keys in (losses, others) if keys]
        for position, keys in enumerate(panels, start=1):
            axes = figure.add_subplot(1, len(panels), position)
            for key in keys:
                points = [(epoch, value) for epoch, value in zip(history["epoch"], history[key])
                          if value is not None]
                axes.plot([epoch for epoch, _ in points], [value for _, value in points],
                          label=key)
            axes.set_xlabel("epoch")
            axes.legend()
        figure.tight_layout()
        if self.path is None:
            import matplotlib.pyplot as plt
            plt.show()
        else:
            figure.savefig(self.path)
