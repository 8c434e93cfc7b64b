"""The recurrent layers: RNN, LSTM and GRU over time-major (T, B, F) data with lengths."""

__all__ = ['RNN', 'LSTM', 'GRU']
from .. import backend, checks, ops
from ..init import recurrent_weights
from ..module import Module
from .common import _check_features, _node, described


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
            raise TypeError(f"{layer}: state must be {self.state_form}, each a NetVar or an "
                            f"array of shape (B, H) or (1, H); got {described(state)}")
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
        x = _node(x, self.W, f"layers.{type(self).__name__}")
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
