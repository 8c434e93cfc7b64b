"""Indexing and joins: GetItem (x[...]), Concat, Stack, Split, Flatten, Pad, Broadcast.

These ops move or copy elements without changing them, so each backward puts g back where the
element came from. Notation: input x (inputs x₁…xₖ for joins), output y, upstream gradient g.
"""

__all__ = ['GetItem', 'Concat', 'Stack', 'Split', 'Flatten', 'Pad', 'Broadcast']
from numbers import Integral

import numpy

from .. import backend, checks
from ..core import NetOp, NetVar, Output, constant
from ..hints import AppliedOp
from .shape import Reshape, keyword_error, normalize_axis


def scatter_add(target, index, values):
    """``target[index] += values`` where repeated indices accumulate (in place)."""
    xp = backend.array_module(target)
    if xp is numpy:
        numpy.add.at(target, index, values)
    else:
        import cupyx
        cupyx.scatter_add(target, index, values)
    return target


def _index_part(part, xp):
    """One component of an index, with NetVars replaced by their integer or boolean data."""
    if isinstance(part, NetVar):
        part = part._data
        if part.dtype.kind not in "biu":
            raise IndexError(f"GetItem: an index NetVar must hold integers or booleans, "
                             f"got dtype {part.dtype} (build it with dtype=int, or "
                             "dtype=bool for a mask)")
    if isinstance(part, (list, tuple)) and not part:
        part = xp.zeros(0, dtype=numpy.intp)    # x[[]] selects nothing, as in NumPy
    elif isinstance(part, (list, tuple)) or (hasattr(part, "dtype") and getattr(part, "ndim", 0)):
        part = xp.asarray(part)     # lists, and index arrays moved to the data's device
    return part


def _is_integer_array(part):
    return hasattr(part, "dtype") and getattr(part, "ndim", 0) > 0 and part.dtype.kind in "iu"


class GetItem(NetOp):
    """Elements of x selected as NumPy's ``x[index]`` does (``x[index]`` builds it).

    y = x[index]
    dx = zeros like x, then dx[index] += g   (scatter-add: a repeated index gets the sum of
         its gradients, e.g. x[[0, 0, 1]] gives row 0 twice its share)
    index: ints, slices (negative steps too), None / newaxis, Ellipsis, integer arrays or lists,
    boolean masks, or a tuple of these; NetVars of integer or boolean dtype are used as their data.
    """
    __slots__ = ("key", "repeats")
    kept_arrays = ("key",)

    def __init__(self, x, index):
        xp = backend.array_module(x._data)
        if isinstance(index, tuple):
            index = tuple(_index_part(part, xp) for part in index)
        else:
            index = _index_part(index, xp)
        try:
            y = x._data[index]
        except IndexError as error:
            raise IndexError(f"GetItem: cannot index x of shape {tuple(x.shape)} with "
                             f"{_describe_index(index)}: {error}") from None
        parts = index if isinstance(index, tuple) else (index,)
        self.key = index
        self.repeats = any(_is_integer_array(part) for part in parts)
        super().__init__(y, x)

    def _back(self, x):
        xp = backend.array_module(x._data)
        dx = xp.zeros_like(x._data)
        if self.repeats:
            scatter_add(dx, self.key, self._g)
        else:                   # slices and masks select each element at most once
            dx[self.key] = self._g
        x.accumulate(dx)

    def _grads(self, g, x):
        return (_Scatter(g, self.key, self.repeats, x),)


class _Scatter(NetOp):
    """GetItem's gradient as a node, for ``grad(create_graph=True)``: g put back where
    ``x[key]`` took its elements from, into zeros of x's shape.

    y = zeros like x, then y[key] += g   (repeated indices accumulate)
    dg = dy[key]   (a GetItem: both ops are linear, each the other's backward)
    """
    __slots__ = ("key", "repeats")
    kept_arrays = ("key",)

    def __init__(self, g, key, repeats, x):
        self.key, self.repeats = key, repeats
        xp = backend.array_module(g._data)
        y = xp.zeros(x._data.shape, dtype=g._data.dtype)
        if repeats:
            scatter_add(y, key, g._data)
        else:
            y[key] = g._data
        super().__init__(y, g)

    def _back(self, g):
        g.accumulate(self._g[self.key])

    def _grads(self, gy, g):
        return (GetItem(gy, self.key),)


def _describe_index(index):
    parts = index if isinstance(index, tuple) else (index,)
    shown = [f"array of shape {tuple(p.shape)} and dtype {p.dtype}" if hasattr(p, "shape")
             and getattr(p, "ndim", 0) else repr(p) for p in parts]
    return "(" + ", ".join(shown) + ")" if isinstance(index, tuple) else shown[0]


def _join_inputs(op, xs):
    if isinstance(xs, NetVar) or not len(xs):
        raise TypeError(f"{op}: give a non-empty list of nodes, e.g. {op}([a, b], axis=0)")
    first = next((x for x in xs if isinstance(x, NetVar)), None)
    return [x if isinstance(x, NetVar) else constant(x, first) for x in xs]


def _check_axis(op, axis, ndim, shape):
    return normalize_axis(op, axis, ndim, f"inputs of shape {shape}")


class Concat(NetOp):
    """Join nodes along an existing axis, as ``numpy.concatenate``.

    y = [x₁, x₂, …, xₖ] along axis
    dxᵢ = the slice of g that xᵢ occupies
    Every input must have the same shape except along ``axis``.
    """
    __slots__ = ("axis", "ends")

    def __init__(self, xs, axis=0, **keywords):
        if keywords:        # PyTorch's dim= and the like, answered with nnkit's spelling
            raise keyword_error(type(self).__name__, keywords)
        xs = _join_inputs("Concat", xs)
        shape = tuple(xs[0].shape)
        self.axis = _check_axis("Concat", axis, len(shape), shape)
        for i, x in enumerate(xs[1:], 1):
            other = tuple(x.shape)
            if len(other) != len(shape) or any(a != b for k, (a, b) in
                                               enumerate(zip(shape, other)) if k != self.axis):
                raise ValueError(f"Concat: input {i} of shape {other} does not match input 0 of "
                                 f"shape {shape} outside axis {self.axis}")
        xp = backend.array_module(xs[0]._data)
        self.ends = numpy.cumsum([x.shape[self.axis] for x in xs])
        super().__init__(xp.concatenate([x._data for x in xs], axis=self.axis), *xs)

    def _back(self, *xs):
        xp = backend.array_module(self._g)
        for x, part in zip(xs, xp.split(self._g, self.ends[:-1].tolist(), axis=self.axis)):
            x.accumulate(part)

    def _grads(self, g, *xs):
        starts = [0] + self.ends[:-1].tolist()
        lead = (slice(None),) * self.axis
        return tuple(GetItem(g, lead + (slice(start, int(end)),)) if x.requires_grad else None
                     for x, start, end in zip(xs, starts, self.ends))


class Stack(NetOp):
    """Stack equal-shaped nodes along a new axis, as ``numpy.stack``.

    y[…, i, …] = xᵢ   (i along the new axis)
    dxᵢ = g[…, i, …]
    """
    __slots__ = ("axis",)

    def __init__(self, xs, axis=0, **keywords):
        if keywords:        # PyTorch's dim= and the like, answered with nnkit's spelling
            raise keyword_error(type(self).__name__, keywords)
        xs = _join_inputs("Stack", xs)
        shape = tuple(xs[0].shape)
        self.axis = _check_axis("Stack", axis, len(shape) + 1, shape)
        for i, x in enumerate(xs[1:], 1):
            if tuple(x.shape) != shape:
                raise ValueError(f"Stack: input {i} of shape {tuple(x.shape)} differs from input "
                                 f"0 of shape {shape}")
        xp = backend.array_module(xs[0]._data)
        super().__init__(xp.stack([x._data for x in xs], axis=self.axis), *xs)

    def _back(self, *xs):
        xp = backend.array_module(self._g)
        for i, x in enumerate(xs):
            x.accumulate(xp.take(self._g, i, axis=self.axis))

    def _grads(self, g, *xs):
        lead = (slice(None),) * self.axis
        return tuple(GetItem(g, lead + (i,)) if x.requires_grad else None
                     for i, x in enumerate(xs))


class Split(NetOp):
    """Split x along ``axis`` into parts, as ``numpy.split``: one op with several outputs.

    ``sections`` is a number of equal parts, or the indices where the cuts go, sorted and in
    0..n (n the length of the axis). Cuts are not PyTorch's part sizes: ``[1, 3]`` on an axis of
    4 makes three parts, x[:1], x[1:3] and x[3:].
    yᵢ = x[…, startᵢ:endᵢ, …];  dx = [g₀, g₁, …] along axis (zeros for a part not used)
    ``Split(x, sections)`` returns the tuple of parts: the op node is part 0 and part k ≥ 1 is
    its output k (``core.Output``), whose gradient the engine hands to this op's ``_back``.
    """
    __slots__ = ("axis", "bounds")

    def __new__(cls, x=None, sections=None, axis=0, **keywords):    # (x None: unpickling)
        if keywords:            # PyTorch's dim= and the like, answered with nnkit's spelling
            raise keyword_error("Split", keywords)
        if x is None:
            return object.__new__(cls)
        shape = tuple(x.shape)
        axis = _check_axis("Split", axis, len(shape), shape)
        n = shape[axis]
        if checks.is_integer(sections):
            if sections <= 0 or n % sections:
                raise ValueError(f"Split: cannot split axis {axis} of length {n} of x of shape "
                                 f"{shape} into {sections} equal parts")
            cuts = [i * (n // sections) for i in range(1, sections)]
        else:
            cuts = list(sections) if isinstance(sections, (tuple, list, numpy.ndarray)) else [None]
            if not all(checks.is_integer(c) for c in cuts):
                raise TypeError(f"Split: sections must be a number of parts or a list of cut "
                                f"indices (ints), got {sections!r}")
            if any(not 0 <= c <= n for c in cuts) or cuts != sorted(cuts):
                raise ValueError(f"Split: the cuts {[int(c) for c in cuts]} must be sorted and "
                                 f"lie in 0..{n}, the length of axis {axis} of x of shape {shape}")
        x = x if isinstance(x, NetVar) else constant(x)
        op = object.__new__(cls)
        op.axis = axis
        op.bounds = [0] + [int(c) for c in cuts] + [n]
        parts = [x._data[op._slice(k)] for k in range(op.n_outputs)]
        NetOp.__init__(op, parts[0], x)
        return (op,) + tuple(Output(op, k, part) for k, part in enumerate(parts) if k)

    @property
    def n_outputs(self):
        return len(self.bounds) - 1

    def _slice(self, k):
        return (slice(None),) * self.axis + (slice(self.bounds[k], self.bounds[k + 1]),)

    def _back(self, x):
        handed = self.output_grads()
        gs = [self._g] + [handed.get(k) for k in range(1, self.n_outputs)]
        xp = backend.array_module(self._g)
        if all(g is not None for g in gs):
            x.accumulate(xp.concatenate(gs, axis=self.axis))
            return
        dx = xp.zeros(x._data.shape, dtype=self._data.dtype)
        for k, g in enumerate(gs):
            if g is not None:
                dx[self._slice(k)] = g
        x.accumulate(dx)

    def _grads(self, gs, x):
        if self.n_outputs == 1:         # one part: an op of one output is handed g itself
            return (gs,)
        parts = [g if g is not None else constant(
            backend.array_module(x._data).zeros(x._data[self._slice(k)].shape, x._data.dtype))
            for k, g in enumerate(gs)]
        return (Concat(parts, self.axis),)


class Flatten(Reshape, metaclass=AppliedOp):   # nn.Flatten() says to apply it to a node
    """Merge the axes ``start``…``end`` of x into one (``x.flatten()``).

    y = reshape(x, shape[:start] + (Π shape[start:end+1],) + shape[end+1:])
    dx = reshape(g, x.shape)
    The default start=1 keeps the first (batch) axis: (B, C, H, W) → (B, C·H·W). Use start=0 for
    a 1-D result.
    """
    __slots__ = ()

    def __init__(self, x, start=1, end=-1, **keywords):
        if keywords:        # PyTorch's dim= and the like, answered with nnkit's spelling
            raise keyword_error(type(self).__name__, keywords)
        shape = tuple(x.shape)
        ndim = len(shape)
        for name, axis in (("start", start), ("end", end)):
            if not checks.is_integer(axis):
                raise TypeError(f"Flatten: {name} must be an int, got {axis!r}")
        if not (-ndim <= start < ndim and -ndim <= end < ndim) or start % ndim > end % ndim:
            raise ValueError(f"Flatten: axes {start}..{end} do not span x of shape {shape}")
        start, end = int(start) % ndim, int(end) % ndim
        merged = 1
        for n in shape[start:end + 1]:
            merged *= n
        super().__init__(x, shape[:start] + (merged,) + shape[end + 1:])


def _pad_widths(pad_width, ndim, shape):
    given = numpy.asarray(pad_width, dtype=object)
    if not all(checks.is_integer(w) for w in given.flat):
        raise TypeError(f"Pad: pad_width must be ints, got {pad_width!r}")
    try:
        widths = numpy.broadcast_to(given.astype(numpy.int64), (ndim, 2))
    except ValueError:
        raise ValueError(f"Pad: pad_width {pad_width!r} does not fit x of shape {shape}; give "
                         "an int, a (before, after) pair or one pair per axis") from None
    if (widths < 0).any():
        raise ValueError(f"Pad: pad_width {pad_width!r} has a negative width")
    return [tuple(int(v) for v in row) for row in widths]


class Pad(NetOp):
    """Pad x with a constant, as ``numpy.pad(x, pad_width, constant_values=value)``.

    y = x surrounded by ``value``: (before, after) elements on each axis
    dx = g with the padding cut off
    pad_width: an int, one (before, after) pair for every axis, or one pair per axis.
    """
    __slots__ = ("widths",)

    def __init__(self, x, pad_width, value=0.0):
        shape = tuple(x.shape)
        if not shape:
            raise ValueError("Pad: x of shape () has no axis to pad")
        self.widths = _pad_widths(pad_width, len(shape), shape)
        xp = backend.array_module(x._data)
        super().__init__(xp.pad(x._data, self.widths, constant_values=value), x)

    def _back(self, x):
        inner = tuple(slice(before, n - after) for (before, after), n in
                      zip(self.widths, self._g.shape))
        x.accumulate(self._g[inner])

    def _grads(self, g, x):
        return (GetItem(g, tuple(slice(before, n - after) for (before, after), n in
                                 zip(self.widths, g.shape))),)


class Broadcast(NetOp):
    """x repeated along new or size-1 axes up to ``shape``, as ``numpy.broadcast_to``.

    y = broadcast(x, shape)
    dx = g summed over the broadcast axes
    """
    __slots__ = ()

    def __init__(self, x, shape):
        shape = (shape,) if isinstance(shape, Integral) else tuple(shape)
        xp = backend.array_module(x._data)
        try:
            y = xp.broadcast_to(x._data, shape)
        except TypeError:
            raise TypeError(f"Broadcast: the shape must be ints, got {shape}") from None
        except ValueError:
            raise ValueError(f"Broadcast: cannot broadcast x of shape {tuple(x.shape)} to "
                             f"{shape}") from None
        super().__init__(y, x)

    def _back(self, x):
        x.accumulate(self._g)

    def _grads(self, g, x):
        return (g,)
