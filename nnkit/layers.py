"""Layers: Modules that own the parameters of one op and call it (``nn.layers.Linear``, ...).

    import nnkit as nn
    model = nn.layers.Sequential(nn.layers.Linear(4, 8, seed=0), nn.ReLU,
                                 nn.layers.Linear(8, 2, seed=1))
    y = model(x)                  # x (B, 4) → y (B, 2)
    model.named_vars()            # {'layers.0.W': …, 'layers.0.b': …, 'layers.2.W': …, …}

Each layer is a ``Module``: its parameters are attributes (listed by ``vars``, saved by
``state()``, moved by ``to_gpu()``), and ``forward`` calls the op of its family (``Multiply``
and ``Add``, ``Conv2D``, ``BatchNorm``, ``LayerNorm``, ``Embedding``, ``RNN``/``LSTM``/``GRU``,
``Dropout``, ``Attention``) and returns the op's node: the math lives in the op alone. A layer
keeps no graph. ``MultiHeadAttention`` wraps the fused ``Attention`` op in its projections and
``TransformerEncoderLayer`` is built from layers; ``positional_encoding`` and ``mean_over_time``
are the functions that go with them.

Parameters get ``nnkit.dtype`` when the layer is built (``nn.set_dtype(numpy.float64)`` first
for a gradcheck). A 1-D parameter (a bias, γ, β) is a NetVar and so a (1, n) row, nnkit's row
convention; the ops broadcast it. Random initialisation draws from ``seed``: None uses nnkit's
global generator (``nnkit.seed``), an int a fresh generator, a ``numpy.random.Generator`` itself.
To initialise otherwise, assign a parameter: ``layer.W = nn.he(4, 8)``.

Errors name the layer (``layers.Linear``), the argument and the shapes. A constructor checks
every argument before it draws a number, so a refused layer leaves nnkit's generator as it was;
``forward`` checks x against the layer's sizes before the op runs.

PyTorch equivalents, with PyTorch's weights written in nnkit's layout: ``Linear``: W =
weight.T, b = bias; ``Conv2D``: W = weight, b = bias; ``BatchNorm`` (``BatchNorm1d``/``2d``, the
same momentum convention): gamma = weight, beta = bias, ``stats.running_mean`` /
``running_var``; ``LayerNorm``: gamma = weight, beta = bias; ``Embedding``: table = weight;
``RNN``/``LSTM``/``GRU``: see the recurrent ops (W = weight_ih_l0.T, R = weight_hh_l0.T);
``MultiHeadAttention``: Wq, Wk, Wv = the row blocks of in_proj_weight, each transposed, bq, bk,
bv = in_proj_bias split in three, Wo = out_proj.weight.T, bo = out_proj.bias;
``TransformerEncoderLayer``: PyTorch's with ``norm_first=True`` and the tanh GELU, same names.
"""

__all__ = ['Linear', 'Conv2D', 'BatchNorm', 'LayerNorm', 'Embedding', 'RNN', 'LSTM', 'GRU',
           'Dropout', 'MultiHeadAttention', 'TransformerEncoderLayer', 'positional_encoding',
           'mean_over_time', 'Sequential']
import numpy

from . import backend, checks, ops
from .core import NetOp, NetVar
from .dtypes import get_dtype
from .init import glorot_uniform, recurrent_weights
from .module import Module


def _node(x):
    """An input as a node: a NetVar as it is, anything else a NetVar that needs no gradient
    (the dtype policy and the row convention apply, as for ``FFN``)."""
    return x if isinstance(x, NetVar) else NetVar(x, requires_grad=False)


def _check_features(layer, x, axis, expected, layout):
    """Refuse x unless its axis ``axis`` holds ``expected`` values (``layout`` names x's form)."""
    shape = tuple(x.shape)
    if len(shape) < (axis + 1 if axis >= 0 else -axis) or shape[axis] != expected:
        raise ValueError(f"{layer}: x of shape {shape} must be {layout} with {expected} "
                         f"{'on its last axis' if axis == -1 else f'on axis {axis}'}")


def _pair(layer, name, value, low):
    """An int or a (vertical, horizontal) pair of ints, each >= ``low``, as a pair."""
    pair = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    if len(pair) != 2:
        raise ValueError(f"{layer}: {name} must be an int or a pair of ints, got {value!r}")
    return tuple(checks.count(layer, name, v, low) for v in pair)


def _row(values):
    """A 1-D parameter of nnkit's dtype (a (1, n) row)."""
    return NetVar(numpy.asarray(values, dtype=get_dtype()))


# ----------------------------------------------------------------------------- affine, conv

class Linear(Module):
    """Affine layer: y = x @ W + b (``Add(Multiply(x, W), b)``).

    ``Linear(inputs, outputs, bias=True, seed=None)``. W is (inputs, outputs), Glorot-uniform:
    U(±√(6 / (inputs + outputs))) as ``nn.glorot_uniform``; b is zeros of shape (1, outputs), a
    row added to every row of x, or None with ``bias=False``.
    x is (..., B, inputs) (a 1-D input is a (1, inputs) row), y is (..., B, outputs).
    PyTorch ``nn.Linear``: weight = Wᵀ (its weight is (outputs, inputs)), bias = b[0].
    """

    def __init__(self, inputs, outputs, bias=True, seed=None):
        inputs = checks.count("layers.Linear", "inputs", inputs, 1)
        outputs = checks.count("layers.Linear", "outputs", outputs, 1)
        bias = checks.flag("layers.Linear", "bias", bias)
        generator = backend.as_generator(seed, "layers.Linear")
        self.inputs, self.outputs = inputs, outputs
        self.W = glorot_uniform(inputs, outputs, seed=generator)
        self.b = _row(numpy.zeros(outputs)) if bias else None

    def forward(self, x):
        """y (..., B, outputs) for x (..., B, inputs)."""
        x = _node(x)
        _check_features("layers.Linear", x, -1, self.inputs, "(..., B, inputs)")
        y = ops.Multiply(x, self.W)
        return y if self.b is None else y + self.b       # the Add node, by the operator

    def extra_repr(self):
        return f"{self.inputs}, {self.outputs}" + ("" if self.b is not None else ", bias=False")


class Conv2D(Module):
    """2-D convolution layer on NCHW data: y = ``Conv2D(x, W, b, stride, padding)``.

    ``Conv2D(in_channels, out_channels, size, stride=1, padding=0, bias=True, seed=None)``;
    ``size`` (the kernel's kh, kw) and ``stride`` are an int or a (vertical, horizontal) pair of
    ints ≥ 1, ``padding`` ints ≥ 0 (zeros on each side). W is (out_channels, in_channels, kh,
    kw), Glorot-uniform with the convolution fans (fan_in = in_channels·kh·kw, fan_out =
    out_channels·kh·kw); b is zeros of shape (1, out_channels), or None with ``bias=False``.
    x is (N, in_channels, H, W), y (N, out_channels, H', W') with H' = (H + 2p − kh) // s + 1
    (likewise W'). PyTorch ``nn.Conv2d``: weight = W, bias = b[0].
    """

    def __init__(self, in_channels, out_channels, size, stride=1, padding=0, bias=True,
                 seed=None):
        in_channels = checks.count("layers.Conv2D", "in_channels", in_channels, 1)
        out_channels = checks.count("layers.Conv2D", "out_channels", out_channels, 1)
        size = _pair("layers.Conv2D", "size", size, 1)
        stride = _pair("layers.Conv2D", "stride", stride, 1)
        padding = _pair("layers.Conv2D", "padding", padding, 0)
        bias = checks.flag("layers.Conv2D", "bias", bias)
        generator = backend.as_generator(seed, "layers.Conv2D")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.size, self.stride, self.padding = size, stride, padding
        self.W = glorot_uniform(out_channels, in_channels, *size, seed=generator)
        self.b = _row(numpy.zeros(out_channels)) if bias else None

    def forward(self, x):
        """y (N, out_channels, H', W') for x (N, in_channels, H, W)."""
        x = _node(x)
        if x.ndim != 4:
            raise ValueError(f"layers.Conv2D: x of shape {tuple(x.shape)} must be (N, C, H, W) "
                             f"with C = {self.in_channels}")
        _check_features("layers.Conv2D", x, 1, self.in_channels, "(N, C, H, W)")
        return ops.Conv2D(x, self.W, self.b, stride=self.stride, padding=self.padding)

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, size={self.size}, "
                f"stride={self.stride}, padding={self.padding}"
                + ("" if self.b is not None else ", bias=False"))


# ----------------------------------------------------------------------------- normalisation

class BatchNorm(Module):
    """Batch normalisation layer: y = γ · x̂ + β per feature on axis 1 (``BatchNorm`` op).

    ``BatchNorm(features, momentum=0.1, eps=1e-5)``: momentum in [0, 1], eps > 0. ``gamma``
    (ones) and ``beta`` (zeros) are (1, features) rows; ``stats`` is a ``BatchNormState`` whose
    running mean and variance are buffers, ``stats.running_mean`` and ``stats.running_var``
    (saved by ``state()``, moved by ``to_gpu()``, never trained). In training (the default) x is
    normalised with its batch's statistics and ``stats`` is updated; under ``nn.eval_mode()``
    the running statistics are used and nothing changes. x is (B, features) or (B, features,
    H, W) (any (B, features, ...)). PyTorch ``nn.BatchNorm1d`` / ``nn.BatchNorm2d`` (the same
    momentum convention): weight = gamma[0], bias = beta[0].
    """

    def __init__(self, features, momentum=0.1, eps=1e-5):
        features = checks.count("layers.BatchNorm", "features", features, 1)
        checks.in_range("layers.BatchNorm", "momentum", momentum, 0, 1)
        checks.in_range("layers.BatchNorm", "eps", eps, 0, low_open=True)
        self.features = features
        self.gamma = _row(numpy.ones(features))
        self.beta = _row(numpy.zeros(features))
        self.stats = ops.BatchNormState(features, momentum, eps)

    def forward(self, x):
        """y with x's shape, (B, features, ...)."""
        x = _node(x)
        _check_features("layers.BatchNorm", x, 1, self.features, "(B, features, ...)")
        return ops.BatchNorm(x, self.gamma, self.beta, self.stats)

    def extra_repr(self):
        return f"{self.features}, momentum={self.stats.momentum}, eps={self.stats.eps}"


class LayerNorm(Module):
    """Layer normalisation over the last axis: y = γ · x̂ + β (``LayerNorm`` op), each row on
    its own, the same in training and evaluation.

    ``LayerNorm(features, eps=1e-5)``: eps > 0. ``gamma`` (ones) and ``beta`` (zeros) are
    (1, features) rows. x is (..., features), y has x's shape. PyTorch ``nn.LayerNorm``:
    weight = gamma[0], bias = beta[0].
    """

    def __init__(self, features, eps=1e-5):
        features = checks.count("layers.LayerNorm", "features", features, 1)
        self.eps = checks.in_range("layers.LayerNorm", "eps", eps, 0, low_open=True)
        self.features = features
        self.gamma = _row(numpy.ones(features))
        self.beta = _row(numpy.zeros(features))

    def forward(self, x):
        """y with x's shape, (..., features)."""
        x = _node(x)
        _check_features("layers.LayerNorm", x, -1, self.features, "(..., features)")
        return ops.LayerNorm(x, self.gamma, self.beta, eps=self.eps)

    def extra_repr(self):
        return f"{self.features}, eps={self.eps}"


# ----------------------------------------------------------------------------- embedding

class Embedding(Module):
    """A (V, D) table of trainable rows, looked up by integer index (``Embedding`` op).

    ``Embedding(V, D, padding_idx=None, seed=None)``. ``table`` is (V, D), standard normal as
    PyTorch's ``nn.Embedding``; ``padding_idx`` (an integer in [−V, V), negative counting from
    the end; kept in [0, V)) names a row that starts at zero and is never trained. Called on
    integer indices of any shape (an integer array, list or ``NetVar(ids, dtype=int)``) it
    returns their rows, shape indices.shape + (D,). PyTorch ``nn.Embedding``: weight = table.
    """

    def __init__(self, V, D, padding_idx=None, seed=None):
        V = checks.count("layers.Embedding", "V", V, 1)
        D = checks.count("layers.Embedding", "D", D, 1)
        if padding_idx is not None:
            if not checks.is_integer(padding_idx):
                raise TypeError(f"layers.Embedding: padding_idx must be None or an integer in "
                                f"[{-V}, {V}) for a table of {V} rows, got {padding_idx!r}")
            if not -V <= padding_idx < V:
                raise ValueError(f"layers.Embedding: padding_idx {padding_idx} is out of range "
                                 f"[{-V}, {V}) for a table of {V} rows")
            padding_idx = int(padding_idx) % V
        generator = backend.as_generator(seed, "layers.Embedding")
        self.V, self.D, self.padding_idx = V, D, padding_idx
        table = generator.standard_normal((V, D)).astype(get_dtype())
        if padding_idx is not None:
            table[padding_idx] = 0
        self.table = NetVar(table)

    def forward(self, indices):
        """The rows of ``table`` for ``indices``: shape indices.shape + (D,)."""
        return ops.Embedding(indices, self.table, self.padding_idx)

    def extra_repr(self):
        return f"{self.V}, {self.D}" + ("" if self.padding_idx is None
                                        else f", padding_idx={self.padding_idx}")


# ----------------------------------------------------------------------------- recurrent

class _Recurrent(Module):
    """Shared by RNN, LSTM and GRU: the weights from ``recurrent_weights`` and the call."""
    cell = None     # 'rnn', 'lstm' or 'gru' (recurrent_weights' name)
    op = None       # the fused op
    state_form = "(h0,) or h0"     # what ``state`` is, for errors

    def _weights(self, inputs, hidden, seed, forget_bias=1.0):
        layer = f"layers.{type(self).__name__}"
        inputs = checks.count(layer, "inputs", inputs, 1)
        hidden = checks.count(layer, "hidden", hidden, 1)
        generator = backend.as_generator(seed, layer)
        self.inputs, self.hidden = inputs, hidden
        self.W, self.R, self.b = recurrent_weights(self.cell, inputs, hidden, forget_bias,
                                                   seed=generator)

    def _state(self, state):
        """``state`` as the tuple of initial states the op takes (h0, or h0 and c0)."""
        if state is None:
            return ()
        layer = f"layers.{type(self).__name__}"
        if self.op.states == 1 and hasattr(state, "shape"):
            state = (state,)              # a bare h0, as PyTorch's RNN and GRU take it
        if not isinstance(state, (tuple, list)) or not all(hasattr(s, "shape") for s in state):
            raise TypeError(f"{layer}: state must be {self.state_form}, each (B, H) or (1, H); "
                            f"got {type(state).__name__}")
        if len(state) != self.op.states:
            raise ValueError(f"{layer}: state must be {self.state_form}, each (B, H) or (1, H); "
                             f"got {len(state)} state(s) of shape(s) "
                             f"{', '.join(str(tuple(s.shape)) for s in state) or 'none'}")
        return tuple(state)

    def forward(self, x, lengths=None, state=None):
        """The op's node: y (T, B, H) for x (T, B, inputs), with ``.final`` (and an LSTM's
        ``.final_c``), each sequence's (B, H) state at its last step. ``lengths`` (B,) gives
        each sequence's length in 1..T (None: all T); ``state`` the initial state (None:
        zeros)."""
        x = _node(x)
        if x.ndim != 3:
            raise ValueError(f"layers.{type(self).__name__}: x of shape {tuple(x.shape)} must be "
                             f"(T, B, F), time-major, with F = {self.inputs}")
        _check_features(f"layers.{type(self).__name__}", x, 2, self.inputs, "(T, B, F)")
        return self._call(x, self._state(state), lengths)

    def _call(self, x, state, lengths):
        return self.op(x, self.W, self.R, self.b, *state, lengths=lengths)

    def extra_repr(self):
        return f"{self.inputs}, {self.hidden}"


class RNN(_Recurrent):
    """Simple recurrent layer over time-major sequences: y_t = f(x_t·W + y_{t−1}·R + b) (the
    fused ``RNN`` op).

    ``RNN(inputs, hidden, activation='tanh', seed=None)``: f is 'tanh', 'relu', 'sigmoid' or
    'linear'. W (inputs, H), R (H, H) uniform in ±1/√H, b zeros (1, H) (``recurrent_weights``).
    ``layer(x, lengths=None, state=None)``: x (T, B, inputs); ``state`` is (h0,) or h0, (B, H) or
    (1, H); returns the op's node y (T, B, H), whose ``.final`` is each sequence's last state.
    PyTorch ``nn.RNN``: W = weight_ih_l0ᵀ, R = weight_hh_l0ᵀ, b = bias_ih_l0 + bias_hh_l0.
    """
    cell, op = 'rnn', ops.RNN

    def __init__(self, inputs, hidden, activation='tanh', seed=None):
        if activation not in ops.RNN.activations:
            raise ValueError(f"layers.RNN: activation must be one of "
                             f"{list(ops.RNN.activations)}, got {activation!r}")
        self._weights(inputs, hidden, seed)
        self.activation = activation

    def _call(self, x, state, lengths):
        return ops.RNN(x, self.W, self.R, self.b, *state, lengths=lengths,
                       activation=self.activation)

    def extra_repr(self):
        return f"{self.inputs}, {self.hidden}, activation={self.activation!r}"


class LSTM(_Recurrent):
    """Long short-term memory layer over time-major sequences (the fused ``LSTM`` op).

    ``LSTM(inputs, hidden, forget_bias=1.0, seed=None)``. W (inputs, 4H), R (H, 4H) uniform in
    ±1/√H; b (1, 4H) zeros but the forget gate's b[0, H:2H] = ``forget_bias`` (a finite number;
    1 lets the cell start by remembering). ``layer(x, lengths=None, state=None)``: x (T, B,
    inputs); ``state`` is (h0, c0), each (B, H) or (1, H); returns the op's node y (T, B, H),
    with ``.final`` and ``.final_c``. PyTorch ``nn.LSTM``: W = weight_ih_l0ᵀ, R =
    weight_hh_l0ᵀ, b = bias_ih_l0 + bias_hh_l0.
    """
    cell, op = 'lstm', ops.LSTM
    state_form = "(h0, c0)"

    def __init__(self, inputs, hidden, forget_bias=1.0, seed=None):
        checks.in_range("layers.LSTM", "forget_bias", forget_bias)
        self._weights(inputs, hidden, seed, forget_bias)


class GRU(_Recurrent):
    """Gated recurrent unit layer over time-major sequences (the fused ``GRU`` op, PyTorch's
    convention).

    ``GRU(inputs, hidden, seed=None)``. W (inputs, 3H), R (H, 3H) uniform in ±1/√H; b (2, 3H)
    zeros, the input and the recurrent biases [b_i; b_h]. ``layer(x, lengths=None,
    state=None)``: x (T, B, inputs); ``state`` is (h0,) or h0, (B, H) or (1, H); returns the
    op's node y (T, B, H), with ``.final``. PyTorch ``nn.GRU``: W = weight_ih_l0ᵀ, R =
    weight_hh_l0ᵀ, b = stack([bias_ih_l0, bias_hh_l0]).
    """
    cell, op = 'gru', ops.GRU

    def __init__(self, inputs, hidden, seed=None):
        self._weights(inputs, hidden, seed)


# ----------------------------------------------------------------------------- dropout

class Dropout(Module):
    """Inverted dropout (the ``Dropout`` op): in training each element is zeroed with
    probability p and the rest scaled by 1/(1 − p); under ``nn.eval_mode()`` y = x.

    ``Dropout(p=0.5)``: p in [0, 1). No parameters; the mask is drawn from nnkit's global
    generator (``nnkit.seed``). y has x's shape.
    """

    def __init__(self, p=0.5):
        self.p = checks.in_range("layers.Dropout", "p", p, 0, 1, high_open=True)

    def forward(self, x):
        """y with x's shape."""
        return ops.Dropout(_node(x), self.p)

    def extra_repr(self):
        return f"p={self.p}"


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
    sequence has all T steps, a plain mean over axis 0). Built from ops as Σ_t x · w with the
    constant weights w[t, b] = [t < lengths[b]] / lengths[b], so the gradient at a padded step is
    exactly 0 and whatever the padding holds (even a huge value) never reaches y. A sequence of
    length 0 gives zeros. x is a NetVar or an array; errors name ``layers.mean_over_time``.
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
    return ops.Sum(x * xp.asarray(weights), axis=0)


def _shape_of(value):
    """The shape of an array, a NetVar or a list (for errors and for telling inputs apart)."""
    return tuple(value.shape) if hasattr(value, "shape") else numpy.shape(value)


def _lengths_mask(layer, lengths, T, B):
    """The boolean (T, B) mask of ``lengths`` (``sequence_mask``), its errors naming ``layer``
    and its B checked against the data's, as a NumPy array."""
    try:
        mask = ops.sequence_mask(lengths, T)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{layer}: {error}") from None
    if mask.shape[1] != B:
        raise ValueError(f"{layer}: lengths of shape {_shape_of(lengths)} hold "
                         f"{mask.shape[1]} lengths for a batch of B = {B} sequences")
    return backend.to_cpu(mask)


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
        dim = checks.count(layer, "dim", dim, 1)
        heads = checks.count(layer, "heads", heads, 1)
        if dim % heads:
            raise ValueError(f"{layer}: heads ({heads}) must divide dim ({dim}): each head "
                             "works on dim / heads features")
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
        if len(kv) == 1 and lengths is None and len(_shape_of(kv[0])) != 3:
            kv, lengths = (), kv[0]               # mha(x, lengths), as an RNN layer is called
        if len(kv) not in (0, 2):
            raise TypeError(f"{layer}: call mha(x, lengths=None, causal=False) for self-attention "
                            f"or mha(q, k, v, key_lengths=None, causal=False) for cross-attention; "
                            f"got {1 + len(kv)} inputs")
        causal = checks.flag(layer, "causal", causal)
        q = _node(q)
        if kv:
            if lengths is not None:
                raise TypeError(f"{layer}: cross-attention masks the keys with key_lengths=, "
                                "not lengths=")
            k, v = _node(kv[0]), _node(kv[1])
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
        The last Reshape copies the heads into contiguous (T, dh) blocks: the attention's
        products on them run faster than on strided views, by more than the copy costs (a few
        percent of the layer's time forward and backward at dim 128, T 100)."""
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
        dim = checks.count(layer, "dim", dim, 1)
        heads = checks.count(layer, "heads", heads, 1)
        if dim % heads:
            raise ValueError(f"{layer}: heads ({heads}) must divide dim ({dim}): each head "
                             "works on dim / heads features")
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


# ----------------------------------------------------------------------------- containers

class Sequential(Module):
    """A chain: ``Sequential(a, b, c)(x)`` is ``c(b(a(x)))``.

    Each entry is a Module (a layer, an FFN, another Sequential), an op class of one input
    (``nn.ReLU``) or any function of a node that returns a node (``lambda x: x * 2``). The
    entries are the list ``layers``, so the parameters of entry i are named ``layers.<i>.<name>``
    (``layers.0.W``); entries without parameters keep their place in the numbering.
    ``len(model)``, ``model[i]`` (``model[1:]`` is a Sequential of those entries, sharing
    them) and ``for entry in model`` see the entries. An entry that is not callable, or a class
    that is not an op (``nn.layers.Linear`` unbuilt), is refused with TypeError naming its place.
    """

    def __init__(self, *entries):
        for position, entry in enumerate(entries):
            if isinstance(entry, type) and not issubclass(entry, NetOp) or not callable(entry):
                raise TypeError(f"layers.Sequential: entry {position} ({entry!r}) is not a "
                                "Module, an op class or a function")
        self.layers = list(entries)

    def forward(self, x):
        """Each entry applied in turn, starting from x; the last result."""
        for entry in self.layers:
            x = entry(x)
        return x

    def __len__(self):
        return len(self.layers)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return Sequential(*self.layers[index])
        return self.layers[index]

    def __iter__(self):
        return iter(self.layers)

    def tree(self):
        """One line per entry (a Module's own lines indented; a function by its name)."""
        lines = ["Sequential("]
        for position, entry in enumerate(self.layers):
            if isinstance(entry, Module):
                inner = entry.tree()
                lines.append(f"  (layers.{position}): {inner[0]}")
                lines.extend("  " + line for line in inner[1:])
            else:
                lines.append(f"  (layers.{position}): "
                             f"{getattr(entry, '__name__', type(entry).__name__)}")
        return lines + [")"]
