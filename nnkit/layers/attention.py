"""Attention layers: MultiHeadAttention over the fused Attention op, the pre-norm
TransformerEncoderLayer built from layers, and the functions that go with them
(``positional_encoding``, padding-aware ``mean_over_time``)."""

__all__ = ['MultiHeadAttention', 'TransformerEncoderLayer', 'positional_encoding',
           'mean_over_time']
import numpy

from .. import backend, checks, ops
from ..dtypes import get_dtype
from ..init import glorot_uniform
from ..module import Module
from .basic import LayerNorm, Linear
from .common import _lengths_mask, _node, _row, _shape_of


# ----------------------------------------------------------------------------- attention

def positional_encoding(T, dim, dtype=None):
    """The sinusoidal position encodings of the original Transformer ("Attention is all you
    need", section 3.5): a (T, dim) NumPy array of nnkit's dtype (or ``dtype``).

        PE[t, 2i]     = sin(t / 10000^(2i / dim))
        PE[t, 2i + 1] = cos(t / 10000^(2i / dim))       t = 0..T−1,  i = 0..⌈dim/2⌉−1

    (an odd ``dim`` ends with a sine column). Add it to time-major (T, B, dim) data as
    ``x + nn.positional_encoding(T, dim)[:, None, :]`` (a constant: it needs no gradient); on a
    GPU move it once with ``nn.backend.to_gpu``. T ≥ 0 and dim ≥ 1 are ints.
    """
    T = checks.count("positional_encoding", "T", T, 0)
    dim = checks.count("positional_encoding", "dim", dim, 1)
    t = numpy.arange(T, dtype=numpy.float64)[:, None]
    rates = 10000.0 ** (-numpy.arange(0, dim, 2, dtype=numpy.float64) / dim)    # 2i / dim
    angles = t * rates                                                          # (T, ⌈dim/2⌉)
    pe = numpy.empty((T, dim), dtype=numpy.float64)
    pe[:, 0::2] = numpy.sin(angles)
    pe[:, 1::2] = numpy.cos(angles[:, :dim // 2])
    return pe.astype(get_dtype() if dtype is None else dtype)


def mean_over_time(x, lengths=None):
    """The mean over the valid steps of each sequence of a padded time-major batch: padding-
    aware mean pooling, (T, B, F) → (B, F).

        y[b] = Σ_{t < lengths[b]} x[t, b] / lengths[b]

    ``lengths`` (B,) as for the recurrent layers (a list, an array or a NetVar; None: every
    sequence has all T steps, a plain mean over axis 0). Built from ops as Σ_t x̃ · w with the
    constant weights w[t, b] = [t < lengths[b]] / lengths[b] and x̃ = x at valid steps, 0 at
    padded ones (a Where), so the gradient at a padded step is exactly 0 and whatever the
    padding holds (a huge value, inf or NaN) never reaches y. A sequence of length 0 gives
    zeros. x is a NetVar or an array; errors name ``layers.mean_over_time``.
    """
    x = _node(x)
    if x.ndim != 3:
        raise ValueError(f"layers.mean_over_time: x of shape {tuple(x.shape)} must be (T, B, F), "
                         "time-major")
    T, B = x.shape[0], x.shape[1]
    if lengths is None:
        return ops.Mean(x, axis=0)
    mask = _lengths_mask("layers.mean_over_time", lengths, T, B)
    xp = backend.array_module(x._data)
    counts = numpy.maximum(mask.sum(axis=0), 1)                       # (B,): 0 stays 0 below
    weights = (mask / counts).astype(x.dtype)[:, :, None]             # (T, B, 1)
    valid = ops.Where(xp.asarray(mask[:, :, None] > 0), x, 0.0)       # 0 · NaN would be NaN
    return ops.Sum(valid * xp.asarray(weights), axis=0)


def _dim_and_heads(layer, dim, heads):
    """``dim`` and ``heads`` checked: positive ints, ``heads`` dividing ``dim``."""
    dim = checks.count(layer, "dim", dim, 1)
    heads = checks.count(layer, "heads", heads, 1)
    if dim % heads:
        raise ValueError(f"{layer}: heads ({heads}) must divide dim ({dim}): each head works on "
                         "dim / heads features")
    return dim, heads


class MultiHeadAttention(Module):
    """Multi-head scaled dot-product attention on time-major sequences, PyTorch's
    ``nn.MultiheadAttention`` (``batch_first=False``) in nnkit's row convention.

    ``MultiHeadAttention(dim, heads, bias=True, seed=None)``: ``heads`` must divide ``dim``;
    each head works on dh = dim / heads features (head h on columns h·dh … (h+1)·dh − 1).
    Parameters: ``Wq``, ``Wk``, ``Wv``, ``Wo`` (dim, dim), Glorot-uniform, and the bias rows
    ``bq``, ``bk``, ``bv``, ``bo`` (1, dim), zeros (None with ``bias=False``).

        Q = q·Wq + bq,  K = k·Wk + bk,  V = v·Wv + bv    (T·B, dim) rows, split into heads
        O = Attention(Q, K, V, mask, causal)              softmax(Q·Kᵀ/√dh) · V, each head
        y = concat_heads(O)·Wo + bo                       (Tq, B, dim)

    ``mha(x, lengths=None, causal=False)``: self-attention, q = k = v = x (T, B, dim);
    ``lengths`` (B,) masks the keys past each sequence's length (a list, an array or a
    NetVar, as for the recurrent layers; may be given second, ``mha(x, lengths)``).
    ``mha(q, k, v, key_lengths=None, causal=False)``: cross-attention, q (Tq, B, dim), k and v
    (Tk, B, dim); ``key_lengths`` (B,) masks k's and v's padding. ``causal=True`` forbids each
    query the keys after its own position. Returns the (Tq, B, dim) node.

    The attention itself is one ``Attention`` node on (B·heads, T, dh) blocks (sequence b's
    head h at b·heads + h): it keeps the attention weights and nothing else for backward, and
    ``nn.draw`` shows it as one box. The projections, the head split and the merge are
    ``Multiply``/``Add``/``Reshape``/``Transpose`` nodes. Only keys are masked: the outputs at
    padded query steps are computed (from the valid keys) and are to be ignored
    (``mean_over_time`` leaves them out); a query with no key left (a length of 0) gets y = bo.
    As in PyTorch, ``bk`` cannot change y (it adds the same q·bk to every score of a query, and
    the softmax ignores that): its gradient is 0.

    PyTorch ``nn.MultiheadAttention(dim, heads, bias=bias)`` with PyTorch's weights written in
    nnkit's layout: ``in_proj_weight`` is the three (dim, dim) blocks [Wqᵀ; Wkᵀ; Wvᵀ] stacked
    by rows, so Wq = in_proj_weight[:dim].T, Wk = in_proj_weight[dim:2·dim].T, Wv =
    in_proj_weight[2·dim:].T; ``in_proj_bias`` is [bq, bk, bv] (bq = in_proj_bias[:dim], ...);
    Wo = out_proj.weight.T, bo = out_proj.bias. Its masks are the other way round (True =
    ignore): ``key_padding_mask = ~nn.sequence_mask(lengths, T, time_major=False)``, causal
    ``attn_mask = torch.triu(torch.ones(Tq, Tk, dtype=torch.bool), 1)``. (PyTorch gives NaN
    for a query with no key left; nnkit gives bo.)
    """

    def __init__(self, dim, heads, bias=True, seed=None):
        layer = "layers.MultiHeadAttention"
        dim, heads = _dim_and_heads(layer, dim, heads)
        bias = checks.flag(layer, "bias", bias)
        generator = backend.as_generator(seed, layer)
        self.dim, self.heads = dim, heads
        self.Wq = glorot_uniform(dim, dim, seed=generator)
        self.Wk = glorot_uniform(dim, dim, seed=generator)
        self.Wv = glorot_uniform(dim, dim, seed=generator)
        self.Wo = glorot_uniform(dim, dim, seed=generator)
        self.bq, self.bk, self.bv, self.bo = (
            (_row(numpy.zeros(dim)) for _ in range(4)) if bias else (None,) * 4)

    def forward(self, q, *kv, lengths=None, key_lengths=None, causal=False):
        """Self-attention ``mha(x, lengths=None, causal=False)`` or cross-attention
        ``mha(q, k, v, key_lengths=None, causal=False)``: the (Tq, B, dim) node."""
        layer = "layers.MultiHeadAttention"
        if kv and isinstance(kv[-1], (bool, numpy.bool_)):
            raise TypeError(f"{layer}: give causal by name, mha(x, lengths, causal=True) (a "
                            f"boolean input {1 + len(kv)} would be read as a key or lengths)")
        if len(kv) == 1 and lengths is None and len(_shape_of(kv[0])) != 3:
            kv, lengths = (), kv[0]               # mha(x, lengths), as an RNN layer is called
        if len(kv) not in (0, 2):
            raise TypeError(f"{layer}: call mha(x, lengths=None, causal=False) for self-attention "
                            f"or mha(q, k, v, key_lengths=None, causal=False) for cross-attention; "
                            f"got {1 + len(kv)} inputs")
        causal = checks.flag(layer, "causal", causal)
        q = _node(q, self.Wq, layer)
        if kv:
            if lengths is not None:
                raise TypeError(f"{layer}: cross-attention masks the keys with key_lengths=, "
                                "not lengths=")
            k, v = _node(kv[0], self.Wk, layer), _node(kv[1], self.Wv, layer)
            self._check(q, "q", "(Tq, B, dim)")
            self._check(k, "k", "(Tk, B, dim)")
            self._check(v, "v", "(Tk, B, dim)")
            if k.shape[:2] != v.shape[:2] or k.shape[1] != q.shape[1]:
                raise ValueError(f"{layer}: q of shape {tuple(q.shape)}, k of shape "
                                 f"{tuple(k.shape)} and v of shape {tuple(v.shape)} must be "
                                 "(Tq, B, dim), (Tk, B, dim) and (Tk, B, dim)")
            lengths = key_lengths
        else:
            if key_lengths is not None:
                raise TypeError(f"{layer}: self-attention masks the keys with lengths=; "
                                "key_lengths= is for mha(q, k, v)")
            self._check(q, "x", "(T, B, dim)")
            k = v = q
        Tq, Tk, B = q.shape[0], k.shape[0], k.shape[1]
        heads, dh = self.heads, self.dim // self.heads
        mask = None
        if lengths is not None:     # (B·heads, 1, Tk): each head's row of queries sees it
            keys = _lengths_mask(layer, lengths, Tk, B).T
            mask = backend.array_module(q._data).asarray(
                numpy.repeat(keys, heads, axis=0)[:, None, :])
        rows = {}               # each input once as (T·B, dim) rows (x once in self-attention)
        Q, K, V = (self._project(rows, x, W, b) for x, W, b in
                   ((q, self.Wq, self.bq), (k, self.Wk, self.bk), (v, self.Wv, self.bv)))
        o = ops.Attention(Q, K, V, mask=mask, causal=causal)        # (B·heads, Tq, dh)
        o = ops.Transpose(ops.Reshape(o, (B, heads, Tq, dh)), (2, 0, 1, 3))
        o = ops.Reshape(o, (Tq * B, self.dim))                      # heads side by side
        return ops.Reshape(self._affine(o, self.Wo, self.bo), (Tq, B, self.dim))

    def _check(self, x, name, layout):
        if x.ndim != 3 or x.shape[2] != self.dim:
            raise ValueError(f"layers.MultiHeadAttention: {name} of shape {tuple(x.shape)} must "
                             f"be {layout}, time-major, with dim = {self.dim}")

    @staticmethod
    def _affine(x, W, b):
        y = ops.Multiply(x, W)
        return y if b is None else ops.Add(y, b)

    def _project(self, rows, x, W, b):
        """x·W + b split into heads: (T, B, dim) → (B·heads, T, dh), sequence b's head h at
        b·heads + h.

        The product runs on x as (T·B, dim) rows: one matrix product, where (T, B, dim) @
        (dim, dim) would be T products of B rows (1.5× slower in NumPy, forward and backward).
        The last Reshape merges (B, heads) without a copy: the attention's products read each
        head's (T, dh) block as a strided view (copying the blocks out first made a W10 step
        no faster: dim 64, 4 heads, T 64, B 32)."""
        T, B = x.shape[0], x.shape[1]
        heads, dh = self.heads, self.dim // self.heads
        if id(x) not in rows:
            rows[id(x)] = ops.Reshape(x, (T * B, self.dim))
        y = ops.Transpose(ops.Reshape(self._affine(rows[id(x)], W, b), (T, B, heads, dh)),
                          (1, 2, 0, 3))
        return ops.Reshape(y, (B * heads, T, dh))

    def extra_repr(self):
        return f"{self.dim}, heads={self.heads}" + ("" if self.bo is not None else ", bias=False")


class TransformerEncoderLayer(Module):
    """A pre-norm Transformer encoder layer on time-major sequences:

        h = x + Dropout(MHA(LayerNorm₁(x)))
        y = h + Dropout(W₂·Dropout(GELU(W₁·LayerNorm₂(h) + b₁)) + b₂)

    ``TransformerEncoderLayer(dim, heads, hidden, dropout=0.0, seed=None)``: ``self_attn`` a
    ``MultiHeadAttention(dim, heads)``, ``linear1`` a ``Linear(dim, hidden)`` and ``linear2`` a
    ``Linear(hidden, dim)`` (all drawn from ``seed``), ``norm1`` and ``norm2`` ``LayerNorm(dim)``
    (eps 1e-5); ``dropout`` in [0, 1) at the three places above (none at 0, nor under
    ``nn.eval_mode()``). GELU is nnkit's ``GELU`` op, the tanh approximation
    ½x(1 + tanh(√(2/π)(x + 0.044715x³))) (GPT-2's and BERT's; differs from the exact
    x·Φ(x) by less than 5e-4).
    ``layer(x, lengths=None, causal=False)``: x (T, B, dim), ``lengths`` (B,) masks the padded
    keys; returns (T, B, dim). As in ``MultiHeadAttention``, the outputs at padded steps are to
    be ignored.

    PyTorch ``nn.TransformerEncoderLayer(dim, heads, hidden, dropout, norm_first=True,
    activation=lambda x: torch.nn.functional.gelu(x, approximate='tanh'))`` has the same
    submodule names and weights (``self_attn`` as ``MultiHeadAttention`` documents, ``linear1``,
    ``linear2`` as ``Linear``, ``norm1``, ``norm2`` as ``LayerNorm``); called with
    ``src_key_padding_mask = ~nn.sequence_mask(lengths, T, time_major=False)`` it gives the same
    values (PyTorch also drops attention weights, which nnkit does not: equal at dropout 0).
    """

    def __init__(self, dim, heads, hidden, dropout=0.0, seed=None):
        layer = "layers.TransformerEncoderLayer"
        dim, heads = _dim_and_heads(layer, dim, heads)
        hidden = checks.count(layer, "hidden", hidden, 1)
        self.dropout = checks.in_range(layer, "dropout", dropout, 0, 1, high_open=True)
        generator = backend.as_generator(seed, layer)
        self.dim, self.heads, self.hidden = dim, heads, hidden
        self.norm1 = LayerNorm(dim)
        self.self_attn = MultiHeadAttention(dim, heads, seed=generator)
        self.norm2 = LayerNorm(dim)
        self.linear1 = Linear(dim, hidden, seed=generator)
        self.linear2 = Linear(hidden, dim, seed=generator)

    def _drop(self, x):
        return ops.Dropout(x, self.dropout) if self.dropout else x

    def forward(self, x, lengths=None, causal=False):
        """y (T, B, dim) for x (T, B, dim)."""
        x = _node(x)
        if x.ndim != 3 or x.shape[2] != self.dim:
            raise ValueError(f"layers.TransformerEncoderLayer: x of shape {tuple(x.shape)} must "
                             f"be (T, B, dim), time-major, with dim = {self.dim}")
        T, B = x.shape[0], x.shape[1]
        h = x + self._drop(self.self_attn(self.norm1(x), lengths=lengths, causal=causal))
        # the feed-forward on (T·B, dim) rows: one matrix product per Linear, not T of B rows
        f = self.norm2(ops.Reshape(h, (T * B, self.dim)))
        f = self.linear2(self._drop(ops.GELU(self.linear1(f))))
        return h + ops.Reshape(self._drop(f), (T, B, self.dim))

    def extra_repr(self):
        return (f"{self.dim}, heads={self.heads}, hidden={self.hidden}"
                + (f", dropout={self.dropout}" if self.dropout else ""))
