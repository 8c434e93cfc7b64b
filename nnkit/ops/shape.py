"""Shape ops: reshape and transpose, which move elements without changing them, and astype,
which keeps them in place in another float dtype.

Also the checks the op files share for what users pass them: ``normalize_axes`` and
``normalize_axis`` for axis arguments, and ``keyword_error`` for the NetVar methods called with
PyTorch's keywords.
Notation: input x, output y, upstream gradient g.
"""

__all__ = ['Reshape', 'Transpose', 'AsType']
from numbers import Integral

import numpy

from ..core import NetOp
from ..hints import keyword_hint


def normalize_axes(op, axes, ndim, where, name="axis", expected="an int or a tuple of ints"):
    """``axes`` (an int, or a tuple or list of ints) as a tuple of axes in 0..ndim − 1, in the
    order given; a negative axis counts from the end, as in NumPy.

    ``where`` says what the axes index, for the messages (e.g. "x of shape (2, 3)"). TypeError
    for anything but ints, a bool included (True is an int in Python, but no axis); ValueError
    for an axis outside −ndim..ndim − 1. Repeats are the caller's to refuse or allow.
    """
    items = tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)
    result = []
    for a in items:
        if isinstance(a, bool) or not isinstance(a, Integral):
            raise TypeError(f"{op}: {name} must be {expected}, got {axes!r}")
        if not -ndim <= a < ndim:
            label = f"{name} {a}" if a is axes else f"axis {a} (in {name}={axes!r})"
            valid = f"axes run from {-ndim} to {ndim - 1}" if ndim else "it has no axis"
            raise ValueError(f"{op}: {label} is out of range for {where} ({valid})")
        result.append(int(a) % ndim)
    return tuple(result)


def normalize_axis(op, axis, ndim, where, name="axis"):
    """One axis (an int, not a tuple) as an int in 0..ndim − 1; see ``normalize_axes``."""
    if isinstance(axis, (tuple, list)):
        raise TypeError(f"{op}: {name} must be an int, got {axis!r}")
    return normalize_axes(op, axis, ndim, where, name, expected="an int")[0]


def keyword_error(method, keywords, hint=""):
    """The TypeError for a NetVar method or an op given keywords it does not take.

    They take ``**keywords`` only to word this error (they look at it only when it is not
    empty): PyTorch's ``dim=`` and ``keepdim=`` get nnkit's ``axis=`` and ``keepdims=``
    (``hints.PYTORCH["keyword"]``).
    """
    return keyword_hint(f"{method}()", next(iter(keywords)), hint=hint)


class Reshape(NetOp):
    """Same elements, new shape (as ``numpy.reshape``; one dimension may be -1).

    y = reshape(x, shape)
    dx = reshape(g, x.shape)
    """
    __slots__ = ()

    def __init__(self, x, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        try:
            y = x._data.reshape(shape)
        except TypeError:
            raise TypeError(f"Reshape: the shape must be ints, got {shape}") from None
        except ValueError:
            raise ValueError(f"Reshape: cannot reshape {tuple(x.shape)} into {shape}") from None
        super().__init__(y, x)

    def _back(self, x):
        x.accumulate(self._g.reshape(x._data.shape))

    def _grads(self, g, x):
        return (Reshape(g, x.shape),)


class Transpose(NetOp):
    """Permute the axes (reverse them when ``axes`` is None), as ``numpy.transpose``.

    y = transpose(x, axes)
    dx = transpose(g, inverse(axes))
    ``axes`` names every axis of x once, in its new order (negative ones count from the end).
    """
    __slots__ = ("axes",)

    def __init__(self, x, axes=None):
        ndim = x._data.ndim
        if axes is None:
            axes = tuple(reversed(range(ndim)))
        else:
            given = axes
            axes = normalize_axes("Transpose", axes, ndim, f"x of shape {tuple(x.shape)}", "axes")
            if sorted(axes) != list(range(ndim)):
                raise ValueError(f"Transpose: axes {given!r} are not a permutation of the {ndim} "
                                 f"axes of x of shape {tuple(x.shape)}; give every axis in its "
                                 "new order (PyTorch's transpose(dim0, dim1) swaps two axes: "
                                 "here name them all, e.g. (0, 2, 1))")
        self.axes = axes
        super().__init__(x._data.transpose(axes), x)

    def _back(self, x):
        x.accumulate(self._g.transpose(tuple(numpy.argsort(self.axes))))

    def _grads(self, g, x):
        return (Transpose(g, tuple(int(i) for i in numpy.argsort(self.axes))),)




class AsType(NetOp):
    """x in another float dtype (``x.astype(dtype)``): e.g. float16 computed in float32.

    y = x, rounded to ``dtype``
    dx = g, rounded to x's dtype
    ``dtype`` must be a float dtype (an integer result would have no gradient: take
    ``x.data.astype(int)``).
    """
    __slots__ = ()

    def __init__(self, x, dtype):
        try:
            dtype = numpy.dtype(dtype)
        except TypeError:
            raise TypeError(f"AsType: dtype must be a NumPy dtype, got {dtype!r}") from None
        if dtype.kind != "f":
            raise TypeError(f"AsType: dtype must be a float dtype, got {dtype} (an integer "
                            "value has no gradient: take x.data.astype(...))")
        super().__init__(x._data.astype(dtype), x)

    def _back(self, x):
        x.accumulate(self._g)           # accumulate takes it in x's dtype

    def _grads(self, g, x):
        return (AsType(g, x._data.dtype),)


def widened(x):
    """The node x as float32 when it is float16 (``dtypes.wide`` for nodes): the rules that
    ``grad(create_graph=True)`` differentiates compute in float32 where the forward pass
    does."""
    return AsType(x, numpy.float32) if x._data.dtype == numpy.float16 else x


def narrowed(y, dtype):
    """The node y back in ``dtype`` (the forward pass's output dtype) when it differs."""
    return y if y._data.dtype == dtype else AsType(y, dtype)
