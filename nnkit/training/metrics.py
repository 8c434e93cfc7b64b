"""Metrics: accumulators of minibatch results, weighted by minibatch size (and mask).

Each metric has ``update(...)`` (add one minibatch), ``value`` (the mean so far, NaN before
any update) and ``reset()``. Because every minibatch is weighted by its number of samples (or
of valid positions under a mask), the value over an epoch equals the value computed on the
whole data set at once. Inputs may be NetVars, NumPy or CuPy arrays; the totals are Python
floats.

Sequences are time-major ``(T, B, ...)``; ``mask`` is ``(T, B)`` (1 for a valid step, 0 for
padding), as made by ``nnkit.sequence_mask``.
"""

__all__ = ['Metric', 'Accuracy', 'MeanLoss', 'MSE']
import copy
import math

import numpy

from .. import backend, checks
from ..core import NetVar
from ..nodecopy import attributes


def _host(x, name, owner):
    """``x`` as a NumPy array of numbers; anything else is a TypeError naming ``name``."""
    data = x._data if isinstance(x, NetVar) else x
    array = None
    if data is not None:
        try:
            array = numpy.asarray(backend.to_cpu(data) if hasattr(data, "shape") else data)
        except Exception:
            pass
    if array is None or array.dtype.kind not in "biuf":
        given = type(x).__name__ + ("" if array is None else f" of dtype {array.dtype}")
        raise TypeError(f"{owner}: {name} must be a NetVar or an array of numbers, got {given}")
    return array


def _integral(a):
    return a.dtype.kind in "biu" or bool(numpy.all(a == numpy.round(a)))


def _one_hot(t, mask=None):
    """Whether ``t`` (..., C) reads as one-hot (or probability) rows: in [0, 1], each sums to
    1; with a ``mask`` over its rows, only the rows it keeps (padding rows may be 0)."""
    if mask is not None and numpy.ndim(mask) == t.ndim - 1:
        t = t[numpy.broadcast_to(numpy.asarray(mask) != 0, t.shape[:-1])]
    return t.size == 0 or bool(t.min() >= 0 and t.max() <= 1
                               and numpy.allclose(t.sum(axis=-1), 1))


class Metric:
    """Base: a weighted sum and a total weight; ``value = total / count``."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.total = 0.0
        self.count = 0.0

    @property
    def value(self):
        return self.total / self.count if self.count else math.nan

    def _add(self, values, mask):
        """Add an array of per-element values; ``mask`` weights its leading axes."""
        if mask is None:
            self.total += float(values.sum())
            self.count += values.size
            return self
        owner = type(self).__name__
        weight = _host(mask, "mask", owner).astype(numpy.float64)
        if weight.shape != values.shape[:weight.ndim]:
            raise ValueError(f"{owner}: mask of shape {weight.shape} does not "
                             f"match the leading axes of the data of shape {values.shape}")
        if not numpy.all(weight >= 0):
            raise ValueError(f"{owner}: mask must hold weights >= 0 (1 valid, 0 padding), got "
                             f"min {weight.min()}")
        per_position = values.size // weight.size if weight.size else 0
        weight = weight.reshape(weight.shape + (1,) * (values.ndim - weight.ndim))
        self.total += float((numpy.where(weight != 0, values, 0) * weight).sum())   # (NaN padding)
        self.count += float(weight.sum()) * per_position
        return self

    def __repr__(self):
        return f"{type(self).__name__}(value={self.value:.6g}, count={self.count:g})"


class Accuracy(Metric):
    """Fraction of correct class predictions.

    ``update(predictions, targets, mask=None)``: ``predictions`` are scores ``(..., C)``
    (probabilities or logits; the class is the argmax over the last axis) or class indices of
    the same shape as ``targets``; ``targets`` are class indices ``(...)`` or one-hot
    ``(..., C)`` (rows in [0, 1] summing to 1). Each valid position counts once (weight 1, or
    its mask value). Predictions of integer or boolean dtype are always class indices, so
    ``(T, B)`` class indices with ``B == C`` are never read as one-hot rows.

    Raises ValueError rather than guess: for shapes that match neither reading, for one score
    per position (``(B, 1)``: threshold it, ``predictions > 0.5``, to give class indices), and
    for same-shape arrays that are neither class indices (whole numbers) nor scores with
    one-hot targets, and for whole-number float predictions beside integer targets whose rows
    look one-hot (both readings fit).
    """

    def update(self, predictions, targets, mask=None):
        p = _host(predictions, "predictions", "Accuracy")
        t = _host(targets, "targets", "Accuracy")
        if p.ndim >= 1 and p.shape[:-1] == t.shape:           # scores and class indices
            if p.shape[-1] < 2:
                raise ValueError(f"Accuracy: predictions of shape {p.shape} hold one score per "
                                 f"position for targets of shape {t.shape}; give C >= 2 class "
                                 "scores, or class indices (e.g. predictions > 0.5)")
            outside = (t < 0) | (t >= p.shape[-1])
            if mask is not None:
                outside &= numpy.broadcast_to(_host(mask, "mask", "Accuracy") != 0, t.shape)
            if outside.any():       # an ignore_index (-1, -100) counted as a wrong prediction
                raise ValueError(f"Accuracy: target class {t[outside].reshape(-1)[0].item()!r} is "
                                 f"outside the {p.shape[-1]} classes of the predictions; leave "
                                 "such positions (an ignore_index) out with mask=")
            p = p.argmax(axis=-1)
        elif p.shape != t.shape:
            raise ValueError(f"Accuracy: predictions of shape {p.shape} do not match "
                             f"targets of shape {t.shape}")
        elif p.dtype.kind not in "biu" and p.ndim >= 2 and p.shape[-1] > 1 and _one_hot(
                t, None if mask is None else _host(mask, "mask", "Accuracy")):
            if t.dtype.kind in "biu" and _integral(p):
                raise ValueError(f"Accuracy: predictions and targets of shape {p.shape} read both "
                                 "as class indices and as scores with one-hot targets; give "
                                 "class indices as integer arrays, one-hot targets as floats")
            p, t = p.argmax(axis=-1), t.argmax(axis=-1)       # scores and one-hot targets
        elif not (_integral(p) and _integral(t)):
            raise ValueError(f"Accuracy: predictions and targets of shape {p.shape} are neither "
                             "class indices (whole numbers) nor scores with one-hot targets; "
                             "give scores (..., C) with class indices (...)")
        return self._add((p == t).astype(numpy.float64), mask)


class MeanLoss(Metric):
    """Mean of per-batch losses weighted by batch size: Σ loss_k · n_k / Σ n_k.

    ``update(loss, n=1)``: ``loss`` is a number or a one-element NetVar/array holding the
    batch's *mean* loss, ``n`` its number of samples (for a masked sequence loss, the number
    of valid positions, e.g. ``mask.sum()``).
    """

    def update(self, loss, n=1):
        value = _host(loss, "loss", "MeanLoss")
        if value.size != 1:
            raise ValueError(f"MeanLoss: loss must hold one number, got shape {value.shape}")
        weight = _host(n, "n", "MeanLoss")
        if weight.size != 1:
            raise ValueError(f"MeanLoss: n must be one number, got shape {weight.shape}")
        n = checks.in_range("MeanLoss", "n", float(weight.reshape(())), 0)
        if n:                       # a batch of weight 0 counts for nothing, NaN (0/0) included
            self.total += float(value.reshape(())) * n
        self.count += n
        return self


class MSE(Metric):
    """Mean squared error over every (valid) element: Σ (p − t)² / number of elements.

    ``update(predictions, targets, mask=None)``: same shapes; ``mask`` covers the leading
    axes (``(T, B)`` for a ``(T, B, F)`` sequence) and each valid position counts F elements.
    """

    def update(self, predictions, targets, mask=None):
        p = _host(predictions, "predictions", "MSE").astype(numpy.float64)
        t = _host(targets, "targets", "MSE").astype(numpy.float64)
        if p.shape != t.shape:
            raise ValueError(f"MSE: predictions of shape {p.shape} and targets of shape "
                             f"{t.shape} differ")
        return self._add((p - t) ** 2, mask)


def update_all(metrics, predictions, targets, mask):
    """Update every metric of the dict ``metrics`` with the batch, or none: one refusing it puts
    back what the others hold (a batch counted by some metrics only would skew them; the
    Trainer's metrics are any objects with update, reset and value)."""
    kept = [(metric, held(metric)) for metric in metrics.values()]
    try:
        for metric in metrics.values():
            if mask is None:
                metric.update(predictions, targets)
            else:
                metric.update(predictions, targets, mask=mask)
    except BaseException:
        for metric, copy_ in kept:
            _put_back(metric, copy_)
        raise


def held(metric):
    """A deep copy of what ``metric`` holds, slots and dict (a metric inside it, arrays in a
    dict: any state an update changes), for ``update_all`` to put back."""
    return copy.deepcopy(dict(attributes(metric)))


def _put_back(metric, saved):
    for name in dict(attributes(metric)).keys() - saved.keys():   # made by the refused update
        delattr(metric, name)
    for name, value in saved.items():
        object.__setattr__(metric, name, value)
