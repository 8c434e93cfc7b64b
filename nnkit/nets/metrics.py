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
import math

import numpy

from .. import backend
from ..core import NetVar


def _host(x, name, owner):
    if x is None:
        return None
    if isinstance(x, NetVar):
        x = x._data
    if isinstance(x, (int, float, list, tuple)):
        return numpy.asarray(x)
    try:
        return numpy.asarray(backend.to_cpu(x))
    except Exception:
        raise TypeError(f"{owner}: {name} must be a NetVar or an array, got "
                        f"{type(x).__name__}") from None


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
        weight = _host(mask, "mask", type(self).__name__).astype(numpy.float64)
        if weight.shape != values.shape[:weight.ndim]:
            raise ValueError(f"{type(self).__name__}: mask of shape {weight.shape} does not "
                             f"match the leading axes of the data of shape {values.shape}")
        per_position = values.size // weight.size if weight.size else 0
        weight = weight.reshape(weight.shape + (1,) * (values.ndim - weight.ndim))
        self.total += float((values * weight).sum())
        self.count += float(weight.sum()) * per_position
        return self

    def __repr__(self):
        return f"{type(self).__name__}(value={self.value:.6g}, count={self.count:g})"


class Accuracy(Metric):
    """Fraction of correct class predictions.

    ``update(predictions, targets, mask=None)``: ``predictions`` are scores ``(..., C)``
    (probabilities or logits; the class is the argmax over the last axis) or class indices of
    the same shape as ``targets``; ``targets`` are class indices ``(...)`` or one-hot
    ``(..., C)``. Each valid position counts once (weight 1, or its mask value).
    """

    def update(self, predictions, targets, mask=None):
        p = _host(predictions, "predictions", "Accuracy")
        t = _host(targets, "targets", "Accuracy")
        if p.shape == t.shape and p.ndim >= 2 and p.shape[-1] > 1:
            p, t = p.argmax(axis=-1), t.argmax(axis=-1)       # scores and one-hot targets
        elif p.shape[:-1] == t.shape:
            p = p.argmax(axis=-1)
        elif p.shape != t.shape:
            raise ValueError(f"Accuracy: predictions of shape {p.shape} do not match "
                             f"targets of shape {t.shape}")
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
        n = float(n)
        if not n >= 0:
            raise ValueError(f"MeanLoss: n must be >= 0, got {n}")
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
