"""The rules for gradient arrays, which the engine applies at every contribution.

``unbroadcast`` sums a gradient back to the shape of an input that was broadcast (ops may call
it; ``accumulate`` does). The rest is the engine's: a contribution conformed to its node (shape
and dtype), the owned copy a node adds into in place, and a gradient a user hands in
(``node.g = value``, ``back(value)``) checked against the node; and the gradients of a set of
nodes held and put back around a pass that must leave them as they were.
"""
import numbers

import numpy

from . import backend
from .dtypes import wide_sum

__all__ = ["unbroadcast"]


def unbroadcast(g, shape):
    """Sum the gradient ``g`` over the axes along which an input of ``shape`` was broadcast.

    A ``g`` that lacks leading axes of length 1 gets them; one that cannot have come from
    broadcasting an input of ``shape`` (it has fewer elements, say) is refused, never spread.
    """
    if g.shape == shape:
        return g
    extra = g.ndim - len(shape)
    if extra < 0:
        g = g.reshape((1,) * -extra + g.shape)
        extra = 0
    axes = tuple(range(extra)) + tuple(
        extra + i for i, n in enumerate(shape) if n == 1 and g.shape[extra + i] != 1)
    if axes:
        g = _summed(g, axes)
    if extra:
        g = g.reshape(g.shape[extra:])
    if g.shape != shape:
        raise ValueError(f"gradient of shape {g.shape} cannot be summed back to shape {shape}")
    return g


BLAS_FLOATS = (numpy.dtype(numpy.float32), numpy.dtype(numpy.float64))   # BLAS sums them


def _summed(g, axes):
    """``g`` summed over ``axes``, kept. Over every axis but the last (a bias's gradient) of a
    C-ordered float32 or float64 NumPy array, as one vector-matrix product ``ones @ g``: 2-4×
    faster than NumPy's sum down the rows ((2048, 64): 49 -> 12 µs), rounded as BLAS rounds
    it (within a few ulps of NumPy's). float16 is summed in float32: summed in float16, 2,048
    rows of a bias's gradient came out 3 % off."""
    if axes == tuple(range(g.ndim - 1)) and isinstance(g, numpy.ndarray) and g.ndim > 1 and \
            g.dtype in BLAS_FLOATS and g.flags.c_contiguous:
        n = g.shape[-1]
        rows = g.size // n if n else 0
        return (numpy.ones(rows, g.dtype) @ g.reshape(rows, n)).reshape((1,) * len(axes) + (n,))
    return wide_sum(g, axis=axes, keepdims=True).astype(g.dtype, copy=False)


def conform(g, node):
    """``g`` as a gradient of ``node``: summed over broadcast axes, in the node's dtype."""
    shape = node._data.shape
    if g.shape != shape:
        try:
            g = unbroadcast(g, shape)
        except ValueError:
            raise ValueError(f"accumulate(): a gradient of shape {tuple(g.shape)} cannot be "
                             f"summed back to {node._describe()}: an op's _back handed its "
                             "input a gradient of the wrong shape") from None
    if g.dtype != node._data.dtype:
        if node._data.dtype.kind not in "fc":
            raise TypeError(f"back(): a gradient reached {node._describe()}, which holds "
                            f"{node._data.dtype} data: integers and booleans have no gradient "
                            "(its requires_grad was set by hand?); give the node a float dtype")
        if g.dtype.kind == "c" and node._data.dtype.kind != "c":
            raise TypeError(f"back(): a complex gradient reached {node._describe()}, which is "
                            "real: nnkit computes with complex numbers but does not "
                            "differentiate through them (its real part would be a wrong "
                            "gradient); keep complex values out of what you differentiate")
        g = g.astype(node._data.dtype)
    return g


def owned_copy(g, data):
    """A copy of the gradient ``g`` that a node may add into in place: an array of ``data``'s
    dtype. (NumPy gives a 0-d result as a scalar, which ``+=`` would rebind, not update.)"""
    if isinstance(g, numpy.generic):
        return numpy.array(g, dtype=data.dtype)
    return g.astype(data.dtype)          # astype copies


def gradient_from_user(value, node, where):
    """A gradient a user gives for ``node`` (``node.g = value``, ``back(value)``): a number fills
    the node's shape, an array (or list) of the node's shape is taken in its dtype; anything else
    is refused, the message starting with ``where``."""
    data = node._data
    if hasattr(value, "requires_grad"):       # a node: its data
        value = value._data
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return backend.array_module(data).full(data.shape, value, dtype=data.dtype)
    if isinstance(value, (list, tuple)):
        value = numpy.asarray(value)
    if not (hasattr(value, "shape") and hasattr(value, "dtype")) or value.dtype.kind not in "iuf":
        kind = getattr(value, "dtype", type(value).__name__)
        raise TypeError(f"{where}: assign a number, None or an array of shape "
                        f"{tuple(data.shape)}, not {kind}")
    backend.check_same_device(where, data, value)
    if value.shape != data.shape:
        raise ValueError(f"{where}: the gradient must have the node's shape "
                         f"{tuple(data.shape)}, got {tuple(value.shape)}")
    return value.astype(data.dtype, copy=False)


def hold_gradients(nodes):
    """The gradients of ``nodes`` as they are, for ``restore_gradients``: ``grad()``,
    ``trace_back()`` and ``gradcheck`` run a pass and then put every ``.g`` back."""
    return [(node, node._g, node._g is not None and node._gshared) for node in nodes]


def restore_gradients(held):
    """Put back the gradients ``hold_gradients`` took."""
    for node, g, shared in held:
        node._g = g
        node._gshared = shared


def gradient_copy(node):
    """``node``'s gradient as an array the caller may keep (zeros when it has none)."""
    if node._g is None:
        return backend.array_module(node._data).zeros_like(node._data)
    return owned_copy(node._g, node._data) if node._gshared else node._g


def seed_gradient(g, node, where):
    """The seed of a pass from ``node`` (``back(g)``, ``grad(..., g)``): ones when ``g`` is None,
    else ``g`` checked as ``gradient_from_user`` checks it, never the caller's own array (an
    op's ``_back`` may add into the gradient it is handed). ``where`` names the seed in errors:
    a string, or a function that returns it (called only when there is a ``g`` to check)."""
    if g is None:
        return backend.array_module(node._data).ones_like(node._data)
    seed = gradient_from_user(g, node, where() if callable(where) else where)
    if seed is g or seed is getattr(g, "_data", None):
        seed = seed.copy()
    return seed
