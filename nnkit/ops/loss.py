"""Regression losses, the ``Loss`` base class and ``sequence_mask``, the boolean mask of the
valid steps of padded sequences that the sequence losses, SoftMax and Attention take.

Each loss returns a (1, 1) node and scales its gradient by the upstream gradient g. The losses
on class scores (probabilities, logits, class indices, distributions) are in ``classification``.

Notation: prediction p, target t, B = number of rows: for an array of shape (..., n) its
size / n (shape[0] for a matrix); 1-D data (B,) holds B rows of one value, exactly as (B, 1)
does, and a 0-d array is one row. Prediction and target must have the same shape: they are
never broadcast. A target may be a NetVar or a plain array; it gets a gradient only when it is
a NetVar that requires one. Empty inputs are refused (a mean over no values has none).
"""

__all__ = ['Loss', 'L1Loss', 'L2Loss', 'HuberLoss', 'MSELoss', 'sequence_mask']
import numpy

from .. import backend, checks, core
from ..core import NetOp, NetVar, constant
from ..dtypes import wide, wide_sum
from ..hints import AppliedOp
from .math import Where
from .shape import widened


class Loss(NetOp, metaclass=AppliedOp):
    """Base class of the losses: marks the extra arguments as targets, not parameters.

    ``FFN.vars`` never lists the arguments of a Loss entry. A loss that is a weighted mean may
    set ``denominator``, the total weight it divides by (B rows, Σ wᵢ of the class-index
    losses, the valid positions of a masked MSELoss): the Trainer weighs the batch by it in
    the epoch's mean and across ranks, in ``evaluate`` too (no_grad() records no parents).

    A loss called as a module is built (``nn.MSELoss()``, ``nn.HuberLoss(d=0.5)``: no
    prediction) says that the call with the prediction and the target is the loss node
    (``hints.AppliedOp``).
    """
    __slots__ = ("denominator",)
    module_call = "loss"


def _pair(op, p, t):
    """(p, t) as NetVars of one shape on one device, p holding at least one value."""
    if not isinstance(p, NetVar):
        p = constant(p)
    t = constant(t, p) if not isinstance(t, NetVar) else t
    if type(t._data) is not type(p._data):      # e.g. NumPy and CuPy: name both devices
        backend.check_same_device(op, p._data, t._data)
    if t._data.shape != p._data.shape:
        hint = ("; reshape one of them (shapes are never broadcast)"
                if t._data.size == p._data.size else "")
        raise ValueError(f"{op}: prediction of shape {tuple(p.shape)} and target of shape "
                         f"{tuple(t.shape)} differ{hint}")
    if p._data.size == 0:
        raise ValueError(f"{op}: prediction of shape {tuple(p.shape)} has no values")
    return p, t


def _check_range(op, what, data, low=-numpy.inf, high=numpy.inf, hint=""):
    """Refuse values of ``data`` outside [low, high] (a NaN shows in the loss anyway).

    Reading the values back from a GPU would cost a device-to-host copy at every step, so CuPy
    data is checked only inside ``nnkit.detect_anomaly()``.
    """
    if hasattr(data, "__cuda_array_interface__") and not core.anomaly_mode():
        return
    xp = backend.array_module(data)
    if (low > -numpy.inf and xp.min(data) < low) or (high < numpy.inf and xp.max(data) > high):
        raise ValueError(f"{op}: {what} of shape {tuple(data.shape)}: values in "
                         f"[{float(xp.nanmin(data)):.4g}, {float(xp.nanmax(data)):.4g}] lie "
                         f"outside [{low:g}, {high:g}]{hint}")


def _rows(shape):
    """B, the number of rows of a non-empty array of ``shape`` (see the module docstring)."""
    if len(shape) < 2:
        return shape[0] if shape else 1
    n = 1
    for d in shape[:-1]:
        n *= d
    return n


def _scalar(value, xp, dtype=None):
    """The loss's (1, 1) value, in ``dtype``: the inputs' own (a float16 loss sums in float32)."""
    value = xp.asarray(value).reshape(1, 1)
    return value if dtype is None else value.astype(dtype, copy=False)


def _total(a):
    """Σ a, in float32 for float16 ``a`` (``dtypes.wide_sum``). A float16 loss sums and divides
    in float32 and gives float16, as PyTorch's half losses do: a count above 65504 too (inf in
    float16) made the loss or its gradient 0."""
    return wide_sum(a)


def _upstream(loss):
    """The upstream gradient as a 0-d array, so that it broadcasts without changing shapes (in
    float32 for a float16 loss: ``_total``)."""
    return wide(loss._g.reshape(()))


def _upstream_node(g):
    """``_upstream`` for the node ``g`` of ``_grads``."""
    return widened(g).reshape(())


def _residual(p, t):
    """p − t, in float32 for float16 data (``_total``)."""
    return wide(p._data) - wide(t._data)


def _opposite(dp, t):
    """(dp, −dp): the gradients of a loss of p − t, −dp only when the target needs one."""
    return dp, (-dp if t.requires_grad else None)


class L1Loss(Loss):
    """Sum of absolute errors over B rows.

    y = Σ |p − t| / B
    dp = g · sign(p − t) / B,  dt = −dp
    """
    __slots__ = ("r", "B")

    def __init__(self, p, t):
        p, t = _pair("L1Loss", p, t)
        xp = backend.array_module(p._data)
        self.r = _residual(p, t)
        self.B = self.denominator = _rows(p._data.shape)
        super().__init__(_scalar(_total(xp.abs(self.r)) / self.B, xp, p._data.dtype), p, t)

    def _back(self, p, t):
        dp = _upstream(self) * backend.array_module(self.r).sign(self.r) / self.B
        p.accumulate(dp)
        if t.requires_grad:
            t.accumulate(-dp)

    def _grads(self, g, p, t):
        # sign(p − t) is constant almost everywhere: an array
        return _opposite(_upstream_node(g) * (backend.array_module(self.r).sign(self.r) / self.B),
                         t)


class L2Loss(Loss):
    """Half the sum of squared errors over B rows.

    y = Σ (p − t)² / 2B
    dp = g · (p − t) / B,  dt = −dp
    """
    __slots__ = ("r", "B")

    def __init__(self, p, t):
        p, t = _pair("L2Loss", p, t)
        xp = backend.array_module(p._data)
        self.r = _residual(p, t)
        self.B = self.denominator = _rows(p._data.shape)
        super().__init__(_scalar(_total(self.r * self.r) / (2 * self.B), xp, p._data.dtype),
                         p, t)

    def _back(self, p, t):
        dp = _upstream(self) * self.r / self.B
        p.accumulate(dp)
        if t.requires_grad:
            t.accumulate(-dp)

    def _grads(self, g, p, t):
        return _opposite(_upstream_node(g) * (p - t) / self.B, t)


class HuberLoss(Loss):
    """Huber loss with threshold d: quadratic near zero, linear beyond d.

    huber_d(r) = r²/2 if |r| ≤ d else d·(|r| − d/2),   r = p − t
    y = Σ huber_d(r) / B
    dp = g · clip(r, −d, d) / B,  dt = −dp
    """
    __slots__ = ("d", "r", "B")

    def __init__(self, p, t, d=1.0):
        d = checks.in_range("HuberLoss", "the threshold d", d, 0, low_open=True)
        p, t = _pair("HuberLoss", p, t)
        xp = backend.array_module(p._data)
        self.d = d
        self.r = _residual(p, t)
        self.B = self.denominator = _rows(p._data.shape)
        a = xp.abs(self.r)
        value = _total(xp.where(a <= d, 0.5 * self.r * self.r, d * (a - 0.5 * d))) / self.B
        super().__init__(_scalar(value, xp, p._data.dtype), p, t)

    def _back(self, p, t):
        xp = backend.array_module(self.r)
        dp = _upstream(self) * xp.clip(self.r, -self.d, self.d) / self.B
        p.accumulate(dp)
        if t.requires_grad:
            t.accumulate(-dp)

    def _grads(self, g, p, t):
        # clip(r, −d, d) = r inside [−d, d], ±d outside: which piece is constant (arrays)
        xp = backend.array_module(self.r)
        inside = xp.abs(self.r) <= self.d
        outside = xp.where(inside, 0, xp.clip(self.r, -self.d, self.d))
        return _opposite(_upstream_node(g) * ((p - t) * inside.astype(self.r.dtype) + outside)
                         / self.B, t)


def sequence_mask(lengths, T, time_major=True):
    """The boolean mask of the valid steps of a padded batch of B sequences of T steps.

    mask[t, b] = t < lengths[b]     shape (T, B) (``time_major=True``, the default)
    mask[b, t] = t < lengths[b]     shape (B, T) (``time_major=False``)

    ``lengths`` (B,) holds each sequence's length, integers in 0..T: a list, a NumPy or CuPy
    array or a NetVar (a (1, B) row reads as (B,); whole floats pass, as a NetVar holds them).
    The mask lives on the device of ``lengths`` (NumPy for a list). True marks a step to keep:
    the sequence losses build it from their ``lengths=``, and SoftMax, LogSoftmax and Attention
    take it as ``mask``; e.g. the key-padding mask of batch-major (B, T, d) attention is
    ``sequence_mask(lengths, T, time_major=False)[:, None, :]`` (one row for every query).
    TypeError for lengths that are not numbers (booleans included) or a T that is not an int;
    ValueError for lengths outside 0..T, not whole, or not one axis of B values (the values are
    read on NumPy lengths, and on CuPy lengths inside ``nnkit.detect_anomaly()``).
    """
    T = checks.count("sequence_mask", "T", T)
    time_major = checks.flag("sequence_mask", "time_major", time_major)
    return _lengths_mask("sequence_mask", lengths, T, time_major)


def _lengths_mask(op, lengths, steps, time_major=True):
    """``sequence_mask`` with errors naming ``op``. The values are read on NumPy data, and on
    CuPy data inside ``nnkit.detect_anomaly()`` (reading them back would cost a copy)."""
    data = lengths._data if isinstance(lengths, NetVar) else lengths
    if not (hasattr(data, "shape") and hasattr(data, "dtype")):
        data = numpy.asarray(data)
    if data.dtype.kind not in "iuf":
        raise TypeError(f"{op}: lengths must be integers, got {data.dtype} values")
    if data.ndim > 1 and max(data.shape) != data.size:
        raise ValueError(f"{op}: lengths of shape {tuple(data.shape)} must be one axis (B,) of "
                         "sequence lengths")
    data = data.reshape(-1)
    xp = backend.array_module(data)
    if xp is numpy or core.anomaly_mode():
        bad = (data < 0) | (data > steps) | (data != xp.floor(data))
        if bad.any():
            raise ValueError(f"{op}: lengths must be integers in [0, {steps}] (the steps), "
                             f"got {float(data[bad][0]):g}")
    positions = xp.arange(steps)
    if time_major:
        return positions[:, None] < data[None, :]
    return data[:, None] > positions[None, :]


def _same_positions(shape, lead_shape):
    """True when an array of ``shape`` lays out the positions of ``lead_shape`` (up to axes of
    length 1, such as the (1, N) row a NetVar makes of N values): never a transposed layout."""
    return [d for d in shape if d != 1] == [d for d in lead_shape if d != 1]


def _valid_mask(op, lead_shape, mask, lengths, xp):
    """The mask of valid positions over the leading (non-class) axes, or None for all.

    ``lengths`` must be integers in [0, T] and a mask must hold 0/1 or booleans (values checked
    on NumPy data, and on CuPy data inside ``nnkit.detect_anomaly()``).
    """
    if mask is not None and lengths is not None:
        raise ValueError(f"{op}: give either mask or lengths, not both")
    checked = xp is numpy or core.anomaly_mode()
    if lengths is not None:
        lengths = xp.asarray(lengths.data if isinstance(lengths, NetVar) else lengths)
        if len(lead_shape) != 2 or lengths.size != lead_shape[1]:
            raise ValueError(f"{op}: lengths of shape {tuple(lengths.shape)} need inputs of shape "
                             f"(T, B, ...) with B = {lengths.size}; got leading shape "
                             f"{tuple(lead_shape)}")
        return _lengths_mask(op, lengths, lead_shape[0])
    if mask is None:
        return None
    mask = xp.asarray(mask.data if isinstance(mask, NetVar) else mask)
    if mask.shape != tuple(lead_shape):
        if not _same_positions(mask.shape, lead_shape):
            raise ValueError(f"{op}: mask of shape {tuple(mask.shape)} does not match the "
                             f"positions {tuple(lead_shape)}")
        mask = mask.reshape(lead_shape)
    if mask.dtype != bool and checked:
        bad = (mask != 0) & (mask != 1)
        if bad.any():
            raise ValueError(f"{op}: mask must hold 0/1 or booleans, got "
                             f"{float(mask[bad].reshape(-1)[0]):g}")
    return mask != 0


class MSELoss(Loss):
    """Mean squared error over all elements (or over the valid ones of a mask).

    y = Σ m·(p − t)² / N        N = Σ m over all elements (m = 1 everywhere without a mask)
    dp = 2g · m · (p − t) / N,  dt = −dp
    ``mask`` has the leading shape of p (e.g. (T, B) for (T, B, F) data, broadcast over the
    features) or p's own shape; ``lengths`` (B,) builds the (T, B) mask of a time-major batch.
    A mask in another layout ((B, T) for (T, B, F) data) or with values other than 0/1 is
    refused, and so are lengths outside [0, T]. When the mask keeps nothing, the mean is the
    NaN of 0/0, as in PyTorch, and the gradient 0. ``denominator`` is the number of (valid)
    positions, N over the features (the Trainer weighs the batch by it).
    """
    __slots__ = ("r", "n", "m")

    def __init__(self, p, t, mask=None, lengths=None):
        p, t = _pair("MSELoss", p, t)
        xp = backend.array_module(p._data)
        r = _residual(p, t)
        self.m = None
        self.denominator = _rows(p._data.shape)     # positions, each of its features
        if mask is None and lengths is None:
            n = r.size
        else:
            shape = p._data.shape
            if lengths is not None:
                m = _valid_mask("MSELoss", shape[:2], mask, lengths, xp)
            else:
                md = xp.asarray(mask.data if isinstance(mask, NetVar) else mask)
                m = _valid_mask("MSELoss", shape[:md.ndim], md, None, xp)
            self.denominator = m.sum()      # the valid positions (N over their features)
            m = m.reshape(m.shape + (1,) * (len(shape) - m.ndim))
            m = xp.broadcast_to(m, shape).astype(r.dtype)
            r = xp.where(m != 0, r, 0)        # padding counts for nothing, NaN or inf included
            n = m.sum()
            self.m = m
        self.r = r
        # N for the gradient, 1 when nothing counts: r is 0 everywhere then, and so is the
        # gradient (0/0 made it NaN); the mean stays 0/0 = NaN
        self.n = n if self.m is None else xp.where(n != 0, n, 1)
        super().__init__(_scalar(_total(r * r) / n, xp, p._data.dtype), p, t)

    def _back(self, p, t):
        dp = _upstream(self) * 2 * self.r / self.n
        p.accumulate(dp)
        if t.requires_grad:
            t.accumulate(-dp)

    def _grads(self, g, p, t):
        r = p - t if self.m is None else Where(self.m != 0, p - t, 0.0)   # m is a constant
        return _opposite(_upstream_node(g) * r * (2 / self.n), t)
