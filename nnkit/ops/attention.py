"""Attention: scaled dot-product attention as one node.

Notation: queries q (..., Tq, d), keys k (..., Tk, d), values v (..., Tk, dv), output y
(..., Tq, dv), upstream gradient g; the leading axes "..." (batch, heads) broadcast as in
NumPy. Like the fused recurrent ops, ``Attention`` is one node for the whole computation: it
keeps the attention weights (..., Tq, Tk) for its backward pass and nothing else (not the
scores, not the softmax's intermediates), and ``nn.draw`` shows it as one box. The masks it
takes come from comparisons or ``nnkit.sequence_mask``.
"""

__all__ = ['Attention']
import math

import numpy

from .. import backend, checks
from ..core import NetOp, NetVar, constant
from .activation import SoftMax, boolean_mask, softmax
from .arithmetic import Multiply, swap_last


def _node(op, name, value):
    if isinstance(value, NetVar):
        return value
    if not hasattr(value, "shape"):
        raise TypeError(f"{op}: {name} must be a NetVar or an array, got {type(value).__name__}")
    return constant(value)


class Attention(NetOp):
    """Scaled dot-product attention, one node: PyTorch's ``scaled_dot_product_attention``
    with a boolean mask.

    s = scale · q·kᵀ                     (..., Tq, Tk);  scale = 1/√d unless given
    a = softmax(s) over the keys          the weights; a = 0 where a key is masked out
    y = a·v                               (..., Tq, dv)
    da = g·vᵀ,   ds = a · (da − Σ_keys da·a)
    dq = scale · ds·k,   dk = scale · dsᵀ·q,   dv = aᵀ·g

    q (..., Tq, d), k (..., Tk, d), v (..., Tk, dv): NetVars or arrays (constants), leading axes
    broadcast (each input's gradient is summed back to its shape). ``mask``: booleans (a NetVar
    or an array) broadcastable to (..., Tq, Tk), True = attend (query i may use key j);
    ``sequence_mask(lengths, Tk, time_major=False)[:, None, :]`` masks the padded keys of a
    (B, T, d) batch. ``causal=True`` forbids every key after the query's position (key j > query
    i, both counted from the start), together with ``mask`` when both are given. A query with no
    key left gets y = 0 and passes no gradient, as in PyTorch's ``scaled_dot_product_attention``
    since 2.5 (a plain softmax of a row of −inf, and PyTorch's SDPA before 2.5, give NaN).
    ``op.weights`` holds a, the only array the node keeps besides its value. Errors name the
    argument and the shapes.
    """
    __slots__ = ("weights", "scale")

    def __init__(self, q, k, v, mask=None, causal=False, scale=None):
        q, k, v = _node("Attention", "q", q), _node("Attention", "k", k), _node("Attention", "v", v)
        qd, kd, vd = q._data, k._data, v._data
        shapes = f"q of shape {tuple(qd.shape)}, k of shape {tuple(kd.shape)} and v of shape " \
                 f"{tuple(vd.shape)}"
        xp = backend.array_module(qd)
        if backend.array_module(kd) is not xp or backend.array_module(vd) is not xp:
            backend.check_same_device("Attention", qd, kd, vd)
        if min(qd.ndim, kd.ndim, vd.ndim) < 2:
            raise ValueError(f"Attention: {shapes}: each must have at least two axes, (..., Tq, "
                             "d), (..., Tk, d) and (..., Tk, dv)")
        if qd.shape[-1] != kd.shape[-1]:
            raise ValueError(f"Attention: {shapes}: q and k must have one size d on their last "
                             "axis")
        if kd.shape[-2] != vd.shape[-2]:
            raise ValueError(f"Attention: {shapes}: k and v must hold one number of keys Tk "
                             "(their second-to-last axis)")
        if kd.shape[-2] == 0 or qd.shape[-1] == 0:
            raise ValueError(f"Attention: {shapes}: there must be at least one key (Tk > 0) "
                             "and d > 0")
        try:
            batch = numpy.broadcast_shapes(qd.shape[:-2], kd.shape[:-2], vd.shape[:-2])
        except ValueError:
            raise ValueError(f"Attention: {shapes}: their leading axes do not broadcast "
                             "together") from None
        causal = checks.flag("Attention", "causal", causal)
        Tq, Tk = qd.shape[-2], kd.shape[-2]
        self.scale = scale = (1 / math.sqrt(qd.shape[-1]) if scale is None
                              else checks.in_range("Attention", "scale", scale))
        keep = xp.tri(Tq, Tk, dtype=bool) if causal else None
        if mask is not None:
            scores = batch + (Tq, Tk)
            mask = boolean_mask("Attention", mask, scores, f"the scores (..., Tq, Tk) = "
                                f"{scores} of {shapes}", xp)
            keep = mask if keep is None else keep & mask

        # the scale on q, the smaller: one pass fewer over the scores; always in float16, where
        # q·k may overflow (65504) while the scaled scores fit
        if qd.shape[-1] < Tk or qd.dtype == numpy.float16:
            s = (qd * scale) @ xp.swapaxes(kd, -1, -2)
        else:
            s = qd @ xp.swapaxes(kd, -1, -2)
            s *= scale
        if keep is not None and keep.ndim > 2:
            # a mask with leading axes that only v has (q, k shared by a batch of values)
            target = numpy.broadcast_shapes(s.shape, keep.shape)
            if target != s.shape:
                s = xp.broadcast_to(s, target).copy()
        self.weights = a = softmax(s, -1, keep, overwrite=True)      # in the scores' buffer
        super().__init__(a @ vd, q, k, v)

    def _back(self, q, k, v):
        xp = backend.array_module(self._g)
        g, a = self._g, self.weights
        if v.requires_grad:
            v.accumulate(xp.swapaxes(a, -1, -2) @ g)
        if q.requires_grad or k.requires_grad:
            ds = g @ xp.swapaxes(v._data, -1, -2)                    # da
            ds -= xp.einsum("...ij,...ij->...i", ds, a)[..., None]     # Σ_keys da·a
            ds *= a
            if q.requires_grad:
                dq = ds @ k._data
                dq *= self.scale
                q.accumulate(dq)
            if k.requires_grad:
                dk = xp.swapaxes(ds, -1, -2) @ q._data
                dk *= self.scale
                k.accumulate(dk)

    def _grads(self, g, q, k, v):
        # _back's formulas on nodes, with the weights a recomputed as a node of q and k (the
        # stored array would drop their derivatives). The node keeps no mask: the weights are
        # exactly 0 where it masks a key, and a weight that underflowed to 0 has derivatives
        # that underflow too, so "weight ≠ 0" is the mask.
        s = Multiply(q, swap_last(k)) * self.scale
        if s.shape != self.weights.shape:           # broadcast by a mask (see __init__)
            s = s.broadcast_to(self.weights.shape)
        a = SoftMax(s, -1, self.weights != 0)
        dv = Multiply(swap_last(a), g) if v.requires_grad else None
        if not (q.requires_grad or k.requires_grad):
            return None, None, dv
        da = Multiply(g, swap_last(v))
        ds = a * (da - (da * a).sum(-1, keepdims=True)) * self.scale
        dq = Multiply(ds, k) if q.requires_grad else None
        dk = Multiply(swap_last(ds), q) if k.requires_grad else None
        return dq, dk, dv
