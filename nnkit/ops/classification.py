"""Classification losses: on probabilities, logits, class indices and distributions.

Each loss returns a (1, 1) node and scales its gradient by the upstream gradient g; they share
``Loss`` and the target and mask helpers of ``loss``. Notation: probabilities p, logits z,
target t; the class axis is the last one, so B = number of rows = size / C (a 1-D array is one
row of C classes); class indices run over C classes.

Values that cannot be what an argument says it is are refused with a ValueError rather than
turned into a loss: probabilities outside [0, 1], log-probabilities above 0, class indices
outside [0, C). The checks read the values, so on CuPy data they run only inside
``nnkit.detect_anomaly()`` (a read from the GPU at every step would cost more than the loss).
Empty inputs are refused.
"""

__all__ = ['CELoss', 'SoftmaxCELoss', 'SigmoidCELoss', 'NLLLoss', 'KLDivLoss']
import numpy

from .. import backend, checks, core
from ..core import NetVar, constant
from ..dtypes import wide
from .activation import LogSoftmax, Sigmoid, sigmoid
from .loss import (Loss, _check_range, _pair, _same_positions, _scalar, _total, _upstream,
                   _upstream_node, _valid_mask)
from .math import Where
from .shape import narrowed, widened


class CELoss(Loss):
    """Cross-entropy of probabilities p against target distributions t.

    y = −Σ t · ln max(p, ε) / B        (ε = 1e-12 keeps p = 0 finite; the only clipping)
    dp = −g · t / max(p, ε) / B,  dt = −g · ln max(p, ε) / B
    p and t have one shape (..., C), B = size / C. For logits use SoftmaxCELoss, which is exact
    and stable: a p or t outside [0, 1] raises ValueError (on CuPy inside detect_anomaly()).
    float16 computes max(p, ε) and its logarithm in float32 (ε is 0 in float16).
    """
    __slots__ = ("pc", "B")
    eps = 1e-12

    def __init__(self, p, t):
        p, t = _pair("CELoss", p, t)
        pd = p._data
        _check_range("CELoss", "prediction", pd, 0, 1,
                     "; CELoss takes probabilities; for logits use SoftmaxCELoss")
        _check_range("CELoss", "target", t._data, 0, 1, " (targets are probabilities)")
        xp = backend.array_module(pd)
        self.pc = xp.maximum(wide(pd), self.eps)     # float16: ε in float32 (0 in float16)
        self.B = self.denominator = pd.size // pd.shape[-1] if pd.ndim else 1
        value = -(t._data * xp.log(self.pc)).sum() / self.B
        super().__init__(_scalar(value, xp).astype(pd.dtype, copy=False), p, t)

    def _back(self, p, t):
        g = _upstream(self)
        if p.requires_grad:
            p.accumulate(-g * t._data / self.pc / self.B)
        if t.requires_grad:
            t.accumulate(-g * backend.array_module(self.pc).log(self.pc) / self.B)

    def _composite(self, p, t):
        # ln max(p, ε) as a node whose derivative is dp's 1 / max(p, ε) everywhere: ln p where
        # p ≥ ε, and below ε the line ln ε + (p − p₀)/ε through the same value (a clamp, with
        # derivative 0 below ε, disagreed with back() there). Its second derivative is that of
        # dp: −1/p² above ε, 0 below.
        xp = backend.array_module(self.pc)
        pw, tw = widened(p), widened(t)     # float16: ε and 1/ε in float32, as the forward pass
        above = (pw._data >= self.eps).astype(pw.dtype)
        line = pw / self.eps + (xp.log(self.eps) - pw._data / self.eps)
        logs = (pw * above + (1 - above)).log() * above + line * (1 - above)
        return narrowed((-(tw * logs).sum() / self.B).reshape(1, 1), self._data.dtype)


def _class_weight(op, weight, C, dtype, xp):
    """Per-class weights as a (C,) array of ``dtype`` (None stays None)."""
    if weight is None:
        return None
    weight = xp.asarray(weight.data if isinstance(weight, NetVar) else weight, dtype=dtype)
    if weight.size != C or not _same_positions(weight.shape, (C,)):
        raise ValueError(f"{op}: weight of shape {tuple(weight.shape)} needs {C} entries, one "
                         f"per class")
    return weight.reshape(C)


def _counted(values, shares, xp):
    """``values`` with 0 where the share is 0 (ignored, masked or weightless positions): such a
    position counts for nothing even when its value is ±inf (a masked log-probability), where
    value · 0 would be NaN."""
    return xp.where(shares != 0, values, 0)


def _shares(w, total, xp):
    """``w / total`` in w's dtype, the share of each position in a weighted mean, and zeros when
    nothing counts (total 0): the mean is then 0/0 = NaN (``_nan_if_empty``), as in PyTorch,
    but its gradient is 0, as PyTorch's is (0/0 shares made every parameter NaN after one step
    on a batch of padding or ignored targets)."""
    if xp is numpy:                 # on the host: the total itself decides (one division)
        return (w / total).astype(w.dtype, copy=False) if total != 0 else numpy.zeros_like(w)
    counts = total != 0             # on a device: no read back to the host
    return xp.where(counts, w / xp.where(counts, total, 1), 0).astype(w.dtype, copy=False)


def _nan_if_empty(value, total, xp):
    """The mean ``value``, NaN when nothing counts (total 0), as PyTorch's mean over nothing."""
    if xp is numpy:
        return value if total != 0 else numpy.full_like(value, numpy.nan)
    return xp.where(total != 0, value, xp.nan)


def _flat_positions(idx, C, xp):
    """Where the targets ``idx`` of M positions sit in a C-ordered (M, C) array read flat:
    i·C + tᵢ. One index array reads and writes them 2.5-3x faster than the pair (rows, idx)."""
    return xp.arange(0, idx.size * C, C) + idx


def _index_shares(op, what, td, zd, valid, weight, ignore_index):
    """Class-index targets over M positions of C classes: (index per position, its share, the
    total weight Σ w).

    The share of position i is wᵢ / Σ w with wᵢ = weight[tᵢ] · mᵢ · [tᵢ ≠ ignore_index], so a
    weighted mean is Σ shareᵢ · valueᵢ (PyTorch's weighted mean; 0/0 = NaN when nothing counts).
    Ignored and masked positions get index 0 and share 0. The indices must lay out the
    positions as ``zd`` does (e.g. (T, B) for (T, B, C), never (B, T)).
    """
    xp = backend.array_module(zd)
    C = zd.shape[-1]
    M = zd.size // C
    if td.size != M or not _same_positions(td.shape, zd.shape[:-1]):
        hint = ""
        if tuple(td.shape) == tuple(zd.shape):
            hint = (f"; integer targets are class indices of shape {tuple(zd.shape[:-1])}, "
                    "give one-hot or probability targets as floats")
        raise ValueError(f"{op}: class indices of shape {tuple(td.shape)} do "
                         f"not match {what} of shape {tuple(zd.shape)}{hint}")
    idx = td.reshape(M).astype(numpy.int64, copy=False)
    every = valid is None and ignore_index is None      # every position counts
    keep = xp.ones(M, dtype=bool) if valid is None else valid
    if ignore_index is not None:
        keep = keep & (idx != ignore_index)
    if xp is numpy or core.anomaly_mode():
        # (read as unsigned, a negative index is 2⁶³ or more: one comparison finds both ends)
        bad = idx.view(numpy.uint64) >= C if every else keep & ((idx < 0) | (idx >= C))
        if bad.any():
            raise ValueError(f"{op}: class index {int(idx[bad][0])} is out of "
                             f"range for {C} classes")
    if not every:
        idx = xp.where(keep, idx, 0)
    w = keep.astype(zd.dtype)
    if weight is not None:
        # (not weight[idx]: a plain array indexed with the labels hides the labels from a
        # recording, while take_along_axis hands them to NumPy's dispatch: nn.capture)
        w = w * xp.take_along_axis(weight, idx, axis=0)
    total = _total(w)
    return idx, _shares(w, total, xp), total


class SoftmaxCELoss(Loss):
    """Softmax cross-entropy on logits z, equal to PyTorch's ``cross_entropy`` (mean).

    z is (N, C) or (T, B, C); t holds class indices (N,) / (T, B) or probabilities shaped like z.
    log p = z − logsumexp(z)           (stable: computed from z − max z)
    class indices:  y = −Σᵢ wᵢ · log p[i, tᵢ] / Σᵢ wᵢ,   wᵢ = weight[tᵢ] · mᵢ
    probabilities:  y = −Σᵢ mᵢ Σ_c weight_c · t_ic · log p_ic / Σᵢ mᵢ
    dz = g · (softmax(z) − onehot(t)) · wᵢ / Σ w  (indices; the fused gradient, = (softmax − t)/N
         without weights or masks)
    Options: ``weight`` (C,) per-class weights; ``ignore_index`` drops positions whose target
    is that index (indices only); ``mask`` over the positions (N,) / (T, B) or ``lengths`` (B,)
    for time-major batches, so that only valid positions count (mᵢ = 0 elsewhere). When every
    position is ignored the mean is 0/0 = NaN and the gradient 0, as in PyTorch. Class indices
    must lay out the positions as z does ((B, T) labels for (T, B, C) logits are refused);
    probability targets must lie in [0, 1] (checked on CuPy inside detect_anomaly()).
    """
    __slots__ = ("indices", "idx", "at", "coef", "tw", "logp", "weight", "shielded")

    def __init__(self, z, t, mask=None, lengths=None, weight=None, ignore_index=None):
        if not isinstance(z, NetVar):
            z = constant(z)
        zd = z._data
        xp = backend.array_module(zd)
        _check_classes("SoftmaxCELoss", "logits", zd)
        C = zd.shape[-1]
        lead = zd.shape[:-1]
        M = zd.size // C
        td = t._data if isinstance(t, NetVar) else xp.asarray(t)
        z2 = zd.reshape(M, C)
        shifted = z2 - z2.max(axis=1, keepdims=True)
        logp = shifted - xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))
        valid = _valid_mask("SoftmaxCELoss", lead, mask, lengths, xp)
        valid = None if valid is None else valid.reshape(M)
        weight = _class_weight("SoftmaxCELoss", weight, C, zd.dtype, xp)
        self.indices = td.dtype.kind in "iub"
        self.shielded = valid is not None or ignore_index is not None or weight is not None
        if self.indices:
            self.idx, self.coef, self.denominator = _index_shares(
                "SoftmaxCELoss", "logits", td, zd, valid, weight, ignore_index)
            self.at = _flat_positions(self.idx, C, xp)
            picked = logp.reshape(-1)[self.at]
            if self.shielded:                           # (else no share is 0)
                picked = _counted(picked, self.coef, xp)
            value = -(picked * self.coef).sum()
        else:
            if ignore_index is not None:
                raise ValueError("SoftmaxCELoss: ignore_index needs class-index targets")
            if td.shape != zd.shape:
                raise ValueError(f"SoftmaxCELoss: target probabilities of shape "
                                 f"{tuple(td.shape)} do not match logits of shape "
                                 f"{tuple(zd.shape)} (class indices need an integer dtype, "
                                 "e.g. NetVar(labels, dtype=int))")
            _check_range("SoftmaxCELoss", "target probabilities", td, 0, 1)
            tw = td.reshape(M, C).astype(zd.dtype, copy=False)
            if weight is not None:
                tw = tw * weight
            keep = xp.ones(M, dtype=zd.dtype) if valid is None else valid.astype(zd.dtype)
            self.denominator = _total(keep)
            self.coef = _shares(keep, self.denominator, xp)
            self.tw = tw
            value = -(_counted((tw * logp).sum(axis=1), self.coef, xp) * self.coef).sum()
        value = _nan_if_empty(value, self.denominator, xp)
        self.logp = logp
        self.weight = weight
        parents = (z, t) if isinstance(t, NetVar) else (z,)
        super().__init__(_scalar(value, xp).astype(zd.dtype, copy=False), *parents)

    def _back(self, z, t=None):
        xp = backend.array_module(self.logp)
        g = _upstream(self)
        M, C = self.logp.shape
        coef = (g * self.coef)[:, None]
        if z.requires_grad:
            softmax = xp.exp(self.logp)
            if self.indices:
                dz = softmax
                dz.reshape(-1)[self.at] -= 1
                dz *= coef
            else:
                dz = (softmax * self.tw.sum(axis=1, keepdims=True) - self.tw) * coef
            if self.shielded:           # a position that does not count gets 0, even from inf
                dz = xp.where(coef != 0, dz, 0)
            z.accumulate(dz.reshape(z._data.shape))
        if t is not None and t.requires_grad and not self.indices:
            dt = -self.logp * coef
            if self.weight is not None:
                dt = dt * self.weight
            t.accumulate(dt.reshape(t._data.shape))

    def _composite(self, z, t=None):
        M, C = self.logp.shape
        z2 = z.reshape(M, C)
        if self.shielded:       # a position that does not count gets 0, even from NaN or inf
            z2 = Where((self.coef != 0)[:, None], z2, 0.0)
        logp = LogSoftmax(z2)
        if self.indices:
            # −Σᵢ shareᵢ · log p[i, tᵢ] as a product with the constant array of the shares
            xp = backend.array_module(self.logp)
            shares = xp.zeros((M, C), dtype=self.logp.dtype)
            shares.reshape(-1)[self.at] = self.coef
            value = -(logp * shares).sum()
        else:
            tw = self.tw                # a constant unless t is a node that needs a gradient
            if t is not None and t.requires_grad:
                tw = t.reshape(M, C) if self.weight is None else t.reshape(M, C) * self.weight
            value = -((tw * logp).sum(1) * self.coef).sum()
        return value.reshape(1, 1)


class SigmoidCELoss(Loss):
    """Binary cross-entropy on logits z against targets t in [0, 1], stable for any |z|.

    Equal to PyTorch's ``binary_cross_entropy_with_logits`` (mean over all N elements).
    ℓ = max(z, 0) − z·t + ln(1 + e^−|z|)       (= −t·ln σ(z) − (1 − t)·ln(1 − σ(z)))
    y = Σ w·ℓ / N
    dz = g · w · (σ(z) − t) / N,  dt = −g · w · z / N
    ``weight`` (optional) broadcasts against z and rescales each element's term. A t outside
    [0, 1] raises ValueError (on CuPy inside detect_anomaly()).
    """
    __slots__ = ("w", "N")

    def __init__(self, z, t, weight=None):
        z, t = _pair("SigmoidCELoss", z, t)
        _check_range("SigmoidCELoss", "target", t._data, 0, 1, " (targets are probabilities)")
        zd = z._data
        xp = backend.array_module(zd)
        self.w = None
        if weight is not None:
            try:
                self.w = xp.asarray(weight.data if isinstance(weight, NetVar) else weight,
                                    dtype=zd.dtype)
            except (TypeError, ValueError):
                raise TypeError(f"SigmoidCELoss: weight must be a number or an array, got "
                                f"{type(weight).__name__}") from None
            try:
                shape = numpy.broadcast_shapes(self.w.shape, zd.shape)
            except ValueError:
                shape = None
            if shape != zd.shape:
                raise ValueError(f"SigmoidCELoss: weight of shape {tuple(self.w.shape)} does "
                                 f"not broadcast to logits of shape {tuple(zd.shape)}")
        loss = xp.maximum(zd, 0) - zd * t._data + xp.log1p(xp.exp(-xp.abs(zd)))
        if self.w is not None:
            loss = loss * self.w
        self.N = self.denominator = zd.size
        super().__init__(_scalar(_total(loss) / self.N, xp, zd.dtype), z, t)

    def _back(self, z, t):
        xp = backend.array_module(z._data)
        scale = _upstream(self) / self.N
        if self.w is not None:
            scale = scale * self.w
        if z.requires_grad:
            z.accumulate(scale * (sigmoid(z._data, xp) - t._data))
        if t.requires_grad:
            t.accumulate(-scale * z._data)

    def _grads(self, g, z, t):
        scale = _upstream_node(g) / self.N
        if self.w is not None:
            scale = scale * self.w
        return (scale * (Sigmoid(z) - t) if z.requires_grad else None,
                -scale * z if t.requires_grad else None)


class NLLLoss(Loss):
    """Negative log-likelihood of class indices under log-probabilities (after LogSoftmax).

    Equal to PyTorch's ``nll_loss`` (mean) with the class axis last: logp is (N, C) or
    (T, B, C), t holds class indices (N,) / (T, B).
    y = −Σᵢ wᵢ · logp[i, tᵢ] / Σᵢ wᵢ,   wᵢ = weight[tᵢ] · mᵢ · [tᵢ ≠ ignore_index]
    dlogp[i, tᵢ] = −g · wᵢ / Σ w   (0 elsewhere)
    Options as SoftmaxCELoss: ``weight`` (C,), ``ignore_index`` (PyTorch's default is −100;
    here None ignores nothing), ``mask`` / ``lengths`` over the positions. When nothing counts
    the mean is 0/0 = NaN and the gradient 0, as in PyTorch. logp above 0 (not
    log-probabilities: e.g. logits) raises ValueError (on CuPy inside detect_anomaly()).
    """
    __slots__ = ("idx", "coef", "at")

    def __init__(self, logp, t, weight=None, ignore_index=None, mask=None, lengths=None):
        if not isinstance(logp, NetVar):
            logp = constant(logp)
        ld = logp._data
        xp = backend.array_module(ld)
        _check_classes("NLLLoss", "log-probabilities", ld)
        td = xp.asarray(t._data if isinstance(t, NetVar) else t)
        if td.dtype.kind not in "iu":
            raise ValueError(f"NLLLoss: targets must be class indices of an integer dtype, got "
                             f"{td.dtype} (e.g. NetVar(labels, dtype=int))")
        C = ld.shape[-1]
        valid = _valid_mask("NLLLoss", ld.shape[:-1], mask, lengths, xp)
        self.idx, self.coef, self.denominator = _index_shares(
            "NLLLoss", "log-probabilities", td, ld, None if valid is None else valid.reshape(-1),
            _class_weight("NLLLoss", weight, C, ld.dtype, xp), ignore_index)
        _check_range("NLLLoss", "log-probabilities", ld, high=0,
                     hint="; apply LogSoftmax to scores first, or use SoftmaxCELoss on logits")
        self.at = _flat_positions(self.idx, C, xp)
        picked = ld.reshape(-1)[self.at]
        value = _nan_if_empty(-(_counted(picked, self.coef, xp) * self.coef).sum(),
                              self.denominator, xp)
        super().__init__(_scalar(value, xp).astype(ld.dtype, copy=False), logp)

    def _back(self, logp):
        xp = backend.array_module(logp._data)
        d = xp.zeros(logp._data.shape, dtype=logp._data.dtype)
        d.reshape(-1)[self.at] = -_upstream(self) * self.coef
        logp.accumulate(d)

    def _grads(self, g, logp):
        # linear in logp: g times the constant array of the shares
        xp = backend.array_module(logp._data)
        d = xp.zeros(logp._data.shape, dtype=logp._data.dtype)
        d.reshape(-1)[self.at] = -self.coef
        return (g.reshape(()) * d,)


def _check_classes(op, what, data):
    """Refuse class scores without a class axis or without any value."""
    if data.ndim < 1 or data.shape[-1] == 0:
        raise ValueError(f"{op}: {what} need a class axis, got shape {tuple(data.shape)}")
    if data.size == 0:
        raise ValueError(f"{op}: {what} of shape {tuple(data.shape)} have no rows")


class KLDivLoss(Loss):
    """Kullback-Leibler divergence KL(p ‖ q) from log-probabilities x = ln q to probabilities p.

    Equal to PyTorch's ``kl_div(x, p, reduction=..., log_target=...)``.
    log_target=False (p given as probabilities; the terms with p = 0 count as 0):
    y = Σ p · (ln p − x) / D,   D = x.shape[0] ("batchmean", the default: the KL per sample),
        the number of elements ("mean") or 1 ("sum")
    dx = −g · p / D,  dp = g · (ln p + 1 − x) / D  (0 where p = 0)
    log_target=True (the target given as log-probabilities lp = ln p):
    y = Σ exp(lp) · (lp − x) / D
    dx = −g · exp(lp) / D,  dlp = g · exp(lp) · (lp − x + 1) / D
    An lp of −inf gives y = NaN (and NaN in dlp there), as in PyTorch: give such targets as
    probabilities (log_target=False), where p = 0 counts as 0.
    ValueError (on CuPy inside detect_anomaly()) for an x or lp above 0 or a p outside [0, 1]:
    probabilities passed as x are the classic silent mistake. "sum" is nnkit's one summed loss:
    under ``DataParallel`` give ``average=False`` (the ranks' gradients summed, not averaged).
    """
    __slots__ = ("log_target", "logp", "prob", "D")
    reductions = ("batchmean", "mean", "sum")

    def __init__(self, x, p, reduction="batchmean", log_target=False):
        if not isinstance(reduction, str) or reduction not in self.reductions:
            raise ValueError(f"KLDivLoss: reduction must be one of {self.reductions}, got "
                             f"{reduction!r}")
        checks.flag("KLDivLoss", "log_target", log_target)
        x, p = _pair("KLDivLoss", x, p)
        xp = backend.array_module(x._data)
        pd = p._data
        _check_range("KLDivLoss", "input x (log-probabilities)", x._data, high=0,
                     hint="; apply LogSoftmax to scores first")
        if log_target:
            _check_range("KLDivLoss", "target (log-probabilities with log_target=True)", pd,
                         high=0)
        else:
            _check_range("KLDivLoss", "target (probabilities)", pd, 0, 1,
                         "; give log-probabilities with log_target=True")
        self.log_target = log_target
        if log_target:
            self.logp, self.prob = pd, xp.exp(pd)
            terms = self.prob * (pd - x._data)
        else:
            positive = pd > 0
            self.logp, self.prob = xp.where(positive, xp.log(xp.where(positive, pd, 1)), 0), pd
            terms = xp.where(positive, pd * (self.logp - x._data), 0)
        shape = x._data.shape
        self.D = self.denominator = {"batchmean": shape[0] if shape else 1,
                                     "mean": x._data.size, "sum": 1}[reduction]
        super().__init__(_scalar(_total(terms) / self.D, xp, x._data.dtype), x, p)

    def _back(self, x, p):
        scale = _upstream(self) / self.D
        if x.requires_grad:
            x.accumulate(-scale * self.prob)
        if p.requires_grad:
            dp = scale * (self.logp + 1 - x._data)
            if self.log_target:
                p.accumulate(self.prob * dp)
            else:
                p.accumulate(backend.array_module(dp).where(p._data > 0, dp, 0))

    def _composite(self, x, p):
        dtype = self._data.dtype
        x, p = widened(x), widened(p)       # float16: in float32, as the forward pass
        if self.log_target:
            terms = p.exp() * (p - x)
        else:
            # Where p = 0 the term is 0: ln 1 and x = 0 put there keep it (and its derivatives)
            # 0 and finite even for an x of −inf
            positive = p._data > 0
            terms = p * (Where(positive, p, 1.0).log() - Where(positive, x, 0.0))
        return narrowed((terms.sum() / self.D).reshape(1, 1), dtype)
