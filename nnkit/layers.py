"""Layers: Modules that own the parameters of one op and call it (``nn.layers.Linear``, ...).

    import nnkit as nn
    model = nn.layers.Sequential(nn.layers.Linear(4, 8, seed=0), nn.ReLU,
                                 nn.layers.Linear(8, 2, seed=1))
    y = model(x)                  # x (B, 4) → y (B, 2)
    model.named_vars()            # {'layers.0.W': …, 'layers.0.b': …, 'layers.2.W': …, …}

Each layer is a ``Module``: its parameters are attributes (listed by ``vars``, saved by
``state()``, moved by ``to_gpu()``), and ``forward`` calls the op of its family (``Multiply``
and ``Add``, ``Conv2D``, ``BatchNorm``, ``LayerNorm``, ``Embedding``, ``RNN``/``LSTM``/``GRU``,
``Dropout``) and returns the op's node: the math lives in the op alone. A layer keeps no graph.

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
``RNN``/``LSTM``/``GRU``: see the recurrent ops (W = weight_ih_l0.T, R = weight_hh_l0.T).
"""

__all__ = ['Linear', 'Conv2D', 'BatchNorm', 'LayerNorm', 'Embedding', 'RNN', 'LSTM', 'GRU',
           'Dropout', 'Sequential']
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
        return y if self.b is None else ops.Add(y, self.b)

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
