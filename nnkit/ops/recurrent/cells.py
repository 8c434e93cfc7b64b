"""Recurrent cells: one step of ``RNN``, ``LSTM`` or ``GRU`` built from ordinary ops.

A cell takes the step's input x (B, F) and the previous state(s) (B, H) with the fused op's
weights W (F, k·H), R (H, k·H) and b, and returns the new state(s) as ordinary nodes, so a
Python loop of cells is an unrolled recurrent layer (any control flow, any length, and the
same values and gradients as the fused op). Such a loop is also how the fused ops are
differentiated twice (``registry.unrolled``).
"""

__all__ = ['RNNCell', 'LSTMCell', 'GRUCell']
from ..activation import Sigmoid, Tanh
from ..arithmetic import Add, Mul, Multiply, Sub
from ..indexing import Split
from .activations import ACTIVATIONS
from .validation import _check_cell


def _pre_activation(x, h, W, R, b):
    return Add(Add(Multiply(x, W), Multiply(h, R)), b)


def RNNCell(x, h, W, R, b, activation='tanh'):
    """One step of ``RNN`` from ordinary ops: y = f(x·W + h·R + b).

    x (B, F), h (B, H), W (F, H), R (H, H), b (H,) or (1, H); returns the (B, H) node y.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"RNNCell: activation must be one of {sorted(ACTIVATIONS)}, got "
                         f"{activation!r}")
    _check_cell("RNNCell", 1, x, h, W, R, b)
    a = _pre_activation(x, h, W, R, b)
    op = ACTIVATIONS[activation].op
    return a if op is None else op(a)


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
