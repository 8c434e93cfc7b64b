"""What every layer shares: its input as a node, checks of its sizes, its 1-D parameters, and
the mask of a batch's sequence lengths."""
import numpy

from .. import backend, checks, ops
from ..core import NetVar
from ..dtypes import get_dtype


def _node(x, like=None, layer=None):
    """An input as a node: a NetVar as it is, anything else a NetVar that needs no gradient
    (the dtype policy and the row convention apply, as for ``FFN``).

    Given ``like`` (a parameter of ``layer``), float input of another float dtype is not left
    to promote the layer's computation (float64 data through a float32 model would compute
    it all in float64, silently). Data is cast to the parameter's dtype: NumPy data, and a
    node computed by no op (a leaf, even one that needs a gradient, as the input of a
    gradient penalty: its gradient comes back in its own dtype). A node computed by ops of
    another dtype, part of a model that mixes float dtypes, is refused naming both dtypes
    (cast it where it is made, ``x.astype(...)``, or build every layer in one dtype)."""
    x = x if isinstance(x, NetVar) else NetVar(x, requires_grad=False)
    if like is None:
        return x
    dtype, mine = x._data.dtype, like._data.dtype
    if dtype == mine or dtype.kind != "f" or mine.kind != "f":
        return x
    if x.parents:
        raise TypeError(f"{layer}: x has dtype {dtype}, computed by {type(x).__name__}, and the "
                        f"layer's parameters are {mine}; cast x where it is made "
                        f"(x.astype('{mine}')) or build every layer in one dtype")
    return ops.AsType(x, mine)


def described(value):
    """What a user gave, for an error: its type and shape, or its items' types."""
    if hasattr(value, "shape"):
        return f"a single {type(value).__name__} of shape {tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of " + ", ".join(
            type(item).__name__ for item in value)
    return f"{type(value).__name__} {value!r}"


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
