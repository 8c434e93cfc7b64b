"""The checks the fused recurrent ops and their cells share: shapes of weights and states,
``lengths``; errors name the op, the argument and the shapes."""
import numpy

from ... import backend
from ...core import NetVar, constant


def _shape(array):
    return tuple(array.shape)


def _node(value, op, argument):
    if value is None or isinstance(value, NetVar):
        return value
    if not hasattr(value, "shape"):
        raise TypeError(f"{op}: {argument} must be a NetVar or an array, got "
                        f"{type(value).__name__}")
    return constant(value)


def _lengths(op, lengths, T, B):
    """``lengths`` as a host int64 array (B,), every value in 1..T.

    Integers, in any order; whole floats pass (``NetVar(lengths)`` holds floats), booleans do
    not.
    """
    if lengths is None:
        return numpy.full(B, T, dtype=numpy.int64)
    if isinstance(lengths, NetVar):
        lengths = lengths._data
    values = numpy.asarray(backend.to_cpu(lengths) if hasattr(lengths, "shape") else lengths)
    if values.size != B or (values.ndim > 1 and max(values.shape) != values.size):
        raise ValueError(f"{op}: lengths of shape {_shape(values)} must be (B,) = ({B},) for "
                         f"x with {B} sequences")
    values = values.reshape(B)
    if values.dtype.kind not in "iuf":
        raise TypeError(f"{op}: lengths must be integers, got {values.dtype} values "
                        f"{values.tolist()[:8]}")
    if values.dtype.kind == "f" and not numpy.all(numpy.isfinite(values) &
                                                  (values == numpy.round(values))):
        raise ValueError(f"{op}: lengths must be integers, got {values.dtype} values "
                         f"{values.tolist()[:8]}")
    values = values.astype(numpy.int64)
    if B and (values.min() < 1 or values.max() > T):
        raise ValueError(f"{op}: lengths must lie in 1..T = 1..{T} (x has shape "
                         f"(T, B, F) with T = {T}), got min {values.min()} and max "
                         f"{values.max()}")
    return values


def _check_weights(op, k, x, W, R, b, two_biases=False):
    """The shapes of W (F, k·H), R (H, k·H) and b for x whose last axis is F; returns H.

    b is (k·H,) or (1, k·H), or (2, k·H) = [b_i; b_h] with ``two_biases`` (the GRU). Shared by
    the fused ops and the cells; errors name the op, the argument and the shapes.
    """
    x, W, R, b = (_shape(v) for v in (x, W, R, b))
    if len(R) != 2 or R[1] != k * R[0]:
        raise ValueError(f"{op}: R of shape {R} must be (H, {k}·H)")
    H = R[0]
    if W != (x[-1], k * H):
        raise ValueError(f"{op}: W of shape {W} must be (F, {k}·H) = ({x[-1]}, {k * H}) "
                         f"for x of shape {x} and R of shape {R}")
    allowed = ((2, k * H),) if two_biases else ((k * H,), (1, k * H))
    if b not in allowed:
        raise ValueError(f"{op}: b of shape {b} must be "
                         f"{' or '.join(str(s) for s in allowed)} for H = {H}")
    return H


def _check_state(op, argument, state, B, H):
    """A state (h or c) of shape (B, H) or (1, H); None passes."""
    if state is not None and _shape(state) not in ((B, H), (1, H)):
        hint = (" (PyTorch's (num_layers, B, H) state: drop its first axis)"
                if _shape(state)[1:] in ((B, H), (1, H)) else "")
        raise ValueError(f"{op}: {argument} of shape {_shape(state)} must be (B, H) = "
                         f"({B}, {H}) or (1, {H}){hint}")


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
