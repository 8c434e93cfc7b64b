"""Recurrent cells: one step of ``RNN``, ``LSTM`` or ``GRU`` built from ordinary ops.

A cell takes the step's input x (B, F) and the previous state(s) (B, H) with the fused op's
weights W (F, k·H), R (H, k·H) and b, and returns the new state(s) as ordinary nodes, so a
Python loop of cells is an unrolled recurrent layer (any control flow, any length, and the
same values and gradients as the fused op). Such a loop is also how the fused ops are
differentiated twice (``_unrolled``, at the end).
"""

__all__ = ['RNNCell', 'LSTMCell', 'GRUCell']
import numpy

from .activation import ReLU, Sigmoid, Tanh
from .arithmetic import Add, Mul, Multiply, Sub
from .indexing import Split, Stack
from .math import Where
from .recurrent import GRU, LSTM, _Recurrent, _check_state, _check_weights


def _check_cell(op, k, x, h, W, R, b, c=None, two_biases=False):
    """A cell's shapes: x (B, F); h, c (B, H) or (1, H); W (F, k·H); R (H, k·H); b (k·H,),
    (1, k·H) or, with ``two_biases`` (the GRU), (2, k·H). Errors name the cell, the argument
    and the shapes."""
    named = [("x", x), ("h", h), ("W", W), ("R", R), ("b", b)]
    if c is not None:
        named.append(("c", c))
    for name, value in named:
        if not hasattr(value, "shape"):
            raise TypeError(f"{op}: {name} must be a NetVar or an array, got "
                            f"{type(value).__name__}")
    if any(len(v.shape) != 2 for v in (x, h, W, R)):
        raise ValueError(f"{op}: x, h, W and R must be 2-D, got shapes {tuple(x.shape)}, "
                         f"{tuple(h.shape)}, {tuple(W.shape)} and {tuple(R.shape)}")
    H = _check_weights(op, k, x, W, R, b, two_biases)
    _check_state(op, "h", h, x.shape[0], H)
    _check_state(op, "c", c, x.shape[0], H)


_ACTIVATIONS = {'tanh': Tanh, 'sigmoid': Sigmoid, 'relu': ReLU, 'linear': None}


def _pre_activation(x, h, W, R, b):
    return Add(Add(Multiply(x, W), Multiply(h, R)), b)


def RNNCell(x, h, W, R, b, activation='tanh'):
    """One step of ``RNN`` from ordinary ops: y = f(x·W + h·R + b).

    x (B, F), h (B, H), W (F, H), R (H, H), b (H,) or (1, H); returns the (B, H) node y.
    """
    if activation not in _ACTIVATIONS:
        raise ValueError(f"RNNCell: activation must be one of {sorted(_ACTIVATIONS)}, got "
                         f"{activation!r}")
    _check_cell("RNNCell", 1, x, h, W, R, b)
    a = _pre_activation(x, h, W, R, b)
    return a if _ACTIVATIONS[activation] is None else _ACTIVATIONS[activation](a)


def LSTMCell(x, h, c, W, R, b):
    """One step of ``LSTM`` from ordinary ops; returns the nodes (h_t, c_t).

    [i f g o] = x·W + h·R + b;  c_t = σ(f)·c + σ(i)·tanh(g);  h_t = σ(o)·tanh(c_t)
    x (B, F), h and c (B, H), W (F, 4H), R (H, 4H), b (4H,) or (1, 4H).
    """
    _check_cell("LSTMCell", 4, x, h, W, R, b, c)
    i, f, g, o = Split(_pre_activation(x, h, W, R, b), 4, axis=-1)
    c_new = Add(Mul(Sigmoid(f), c), Mul(Sigmoid(i), Tanh(g)))
    return Mul(Sigmoid(o), Tanh(c_new)), c_new


def GRUCell(x, h, W, R, b):
    """One step of ``GRU`` from ordinary ops (PyTorch's convention); returns the node h_t.

    [a_r a_z a_n] = x·W + b[0],  [u_r u_z u_n] = h·R + b[1]
    r = σ(a_r + u_r),  z = σ(a_z + u_z),  n = tanh(a_n + r·u_n),  h_t = n + z·(h − n)
    x (B, F), h (B, H), W (F, 3H), R (H, 3H), b (2, 3H).
    """
    _check_cell("GRUCell", 3, x, h, W, R, b, two_biases=True)
    a_r, a_z, a_n = Split(Add(Multiply(x, W), b[0:1]), 3, axis=-1)
    u_r, u_z, u_n = Split(Add(Multiply(h, R), b[1:2]), 3, axis=-1)
    r, z = Sigmoid(Add(a_r, u_r)), Sigmoid(Add(a_z, u_z))
    n = Tanh(Add(a_n, Mul(r, u_n)))
    return Add(n, Mul(z, Sub(h, n)))


# ----------------------------------------------------------------------------- unrolled ops

def _unrolled(op, x, W, R, b, h0, c0=None):
    """The fused ``op`` (RNN, LSTM or GRU) rebuilt from its inputs as a loop of its cells:
    (outputs (T, B, H), final h, final c (None but for the LSTM)), the op's values.

    The fused ops' second derivatives go through it (their ``_composite``). As in the fused op,
    a sequence past its length keeps its state and outputs zeros: the cells run on every row and
    a constant mask keeps the new state of the running rows only. Padded inputs are zeroed
    first, so garbage there (NaN included) reaches no gradient, as in the fused op.
    """
    T = x.shape[0]
    lengths = op._sequence_lengths()
    if not op.dense:
        x = Where((numpy.arange(T)[:, None] < lengths)[:, :, None], x, 0.0)
    h, c = h0, c0
    outputs = []
    for t in range(T):
        if isinstance(op, LSTM):
            new_h, new_c = LSTMCell(x[t], h, c, W, R, b)
        elif isinstance(op, GRU):
            new_h, new_c = GRUCell(x[t], h, W, R, b), None
        else:
            new_h, new_c = RNNCell(x[t], h, W, R, b, op.activation), None
        if op.dense:
            h, c = new_h, new_c
            outputs.append(h)
            continue
        running = (t < lengths)[:, None]
        h = Where(running, new_h, h)
        c = None if c is None else Where(running, new_c, c)
        outputs.append(Where(running, new_h, 0.0))
    return Stack(outputs), h, c


# ops.recurrent sits below the cells and Stack, so the loop is attached here (as ops.surface
# attaches NetVar's methods).
_Recurrent._unrolled = _unrolled
