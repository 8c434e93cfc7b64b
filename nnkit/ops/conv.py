"""Convolution and pooling on NCHW data: Conv2D, MaxPool2D, AvgPool2D.

Each op visits its kh·kw kernel offsets (i, j) once: the offset's strided slice of the input
holds that kernel element's input for every output position at once. Conv2D copies those slices
into one im2col matrix and runs one matrix product; its backward runs two products and adds
the columns back with kh·kw slice additions (col2im). Pools reduce over the same slices.
Notation: input x (N, C, H, W), kernel w (O, C, kh, kw), bias b (O), output y
(N, O, H', W'), upstream gradient g; s the stride, p the padding.
"""

__all__ = ['Conv2D', 'MaxPool2D', 'AvgPool2D']
import collections

import numpy

from .. import backend, checks
from ..core import NetOp, NetVar, constant
from ..hints import AppliedOp


def _pair(op, name, value, minimum):
    """An int or a pair of ints (tuple or list), each at least ``minimum``, as a pair.

    TypeError for anything but ints (a bool or a float included), ValueError for a pair of
    another length or a value below ``minimum``.
    """
    pair = (value, value) if checks.is_integer(value) else \
        tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if not all(checks.is_integer(v) for v in pair):
        raise TypeError(f"{op}: {name} must be an int or a pair of ints ≥ {minimum}, got "
                        f"{value!r}")
    if len(pair) != 2 or not all(v >= minimum for v in pair):
        raise ValueError(f"{op}: {name} must be an int or a pair of ints ≥ {minimum}, got "
                         f"{value!r}")
    return int(pair[0]), int(pair[1])


def _node(value, like=None):
    """An array or list operand as a constant node, as the arithmetic ops take them: integers
    in the dtype of ``like`` (a node operand beside it), when there is one."""
    return value if value is None or isinstance(value, NetVar) else constant(value, like)


def _check_nchw(op, x):
    if x._data.ndim != 4:
        raise ValueError(f"{op}: x must be (N, C, H, W), got shape {tuple(x.shape)}")
    if 0 in x._data.shape[:2]:
        raise ValueError(f"{op}: x of shape {tuple(x.shape)} has no sample or no channel")


def _pad(xd, padding, fill=0):
    """xd with padding = (ph, pw) cells of ``fill`` on each side of its last two axes."""
    ph, pw = padding
    if not (ph or pw):
        return xd
    xp = backend.array_module(xd)
    return xp.pad(xd, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=fill)


def _crop(dx, padding):
    """The gradient of the padded input cut back to the input's shape."""
    ph, pw = padding
    Hp, Wp = dx.shape[-2:]
    return dx[..., ph:Hp - ph, pw:Wp - pw]


def _offsets(op, shape, kernel, stride):
    """(H', W') and, for each kernel offset (i, j), the slice of x that feeds it."""
    H, W = shape[-2:]
    (kh, kw), (sh, sw) = kernel, stride
    if H < kh or W < kw:
        raise ValueError(f"{op}: a {kh}×{kw} window does not fit an input of spatial size "
                         f"{H}×{W} (after padding)")
    Ho, Wo = (H - kh) // sh + 1, (W - kw) // sw + 1
    slices = [(i, j, (Ellipsis, slice(i, i + sh * (Ho - 1) + 1, sh),
                      slice(j, j + sw * (Wo - 1) + 1, sw)))
              for i in range(kh) for j in range(kw)]
    return (Ho, Wo), slices


class Conv2D(NetOp, metaclass=AppliedOp):
    """2-D convolution (cross-correlation, as PyTorch's ``conv2d``) of NCHW data.

    y[n, o, r, c] = b[o] + Σ_{k, i, j} w[o, k, i, j] · x̃[n, k, s·r + i, s·c + j]
        x̃ = x padded with p zeros on each side;  H' = (H + 2p − kh) // s + 1 (likewise W')
    as matrices (im2col): X = columns of x̃'s windows (C·kh·kw, N·H'·W'), Y = W·X + b
    dW = G·Xᵀ,   db = Σ_{n, r, c} g,   dX = Wᵀ·G, added back window by window (col2im)
    w is (O, C, kh, kw) with O, kh, kw ≥ 1; b is (O,), (1, O) or None; stride and padding are
    an int or a (vertical, horizontal) pair.
    Second derivatives: dx and dw are ops of their own, linear in g and in w (or x).
    """
    module_call = "layer"     # nn.Conv2D(16) names nn.layers.Conv2D (hints.AppliedOp)
    __slots__ = ("padding", "slices", "padded_shape", "cols")

    def __init__(self, x, w, b=None, stride=1, padding=0):
        like = next((v for v in (x, w, b) if isinstance(v, NetVar)), None)
        x, w, b = _node(x, like), _node(w, like), _node(b, like)
        _check_nchw("Conv2D", x)
        xd, wd = x._data, w._data
        if wd.ndim != 4 or 0 in wd.shape:
            raise ValueError(f"Conv2D: w must be (C_out, C_in, kh, kw) with no zero size, got "
                             f"shape {tuple(wd.shape)}")
        if wd.shape[1] != xd.shape[1]:
            raise ValueError(f"Conv2D: w of shape {tuple(wd.shape)} expects {wd.shape[1]} input "
                             f"channels, x of shape {tuple(xd.shape)} has {xd.shape[1]}")
        O = wd.shape[0]
        if b is not None and tuple(b.shape) not in ((O,), (1, O)):
            raise ValueError(f"Conv2D: b of shape {tuple(b.shape)} must be ({O},) or (1, {O}): "
                             f"one value for each of the {O} output channels")
        stride = _pair("Conv2D", "stride", stride, 1)
        self.padding = _pair("Conv2D", "padding", padding, 0)
        xp = backend.array_module(xd)
        xd = _pad(xd, self.padding)
        N, C, _, _ = xd.shape
        (Ho, Wo), self.slices = _offsets("Conv2D", xd.shape, wd.shape[2:], stride)
        self.padded_shape = xd.shape
        cols = xp.empty((C,) + wd.shape[2:] + (N, Ho, Wo), dtype=xd.dtype)
        for i, j, window in self.slices:
            cols[:, i, j] = xd[window].transpose(1, 0, 2, 3)
        self.cols = cols.reshape(-1, N * Ho * Wo)
        y = (wd.reshape(O, -1) @ self.cols).reshape(O, N, Ho, Wo)
        if b is not None:
            y += b._data.reshape(O, 1, 1, 1)
        y = xp.ascontiguousarray(y.transpose(1, 0, 2, 3))
        super().__init__(y, *((x, w) if b is None else (x, w, b)))

    def _back(self, x, w, b=None):
        O = w._data.shape[0]
        G = self._g.transpose(1, 0, 2, 3).reshape(O, -1)
        if w.requires_grad:
            w.accumulate((G @ self.cols.T).reshape(w._data.shape))
        if b is not None and b.requires_grad:
            b.accumulate(self._g.sum(axis=(0, 2, 3)).reshape(b._data.shape))
        if x.requires_grad:
            xp = backend.array_module(self._g)
            N, C, _, _ = self.padded_shape
            dcols = (w._data.reshape(O, -1).T @ G).reshape((C,) + w._data.shape[2:] + (N,)
                                                             + self._g.shape[2:])
            dx = xp.zeros(self.padded_shape, dtype=self._g.dtype)
            for i, j, window in self.slices:
                dx[window] += dcols[:, i, j].transpose(1, 0, 2, 3)
            x.accumulate(_crop(dx, self.padding))

    def _grads(self, g, x, w, b=None):
        # y is bilinear in (x, w): each gradient is a linear op of g and the other input, and
        # those ops' gradients are Conv2D and each other (_ConvInput, _ConvWeight below).
        geo = _geometry(self)
        dx = _ConvInput(g, w, geo) if x.requires_grad else None
        dw = _ConvWeight(x, g, w._data.shape[2:], geo) if w.requires_grad else None
        if b is None:
            return dx, dw
        db = g.sum((0, 2, 3)).reshape(b.shape) if b.requires_grad else None
        return dx, dw, db


class _Pool(NetOp, metaclass=AppliedOp):
    """Shared by the pools: the window geometry on the input padded with ``fill``, and the
    gradient added back window by window then cropped to x's shape. ``nn.MaxPool2D(2)``, the
    pool built as a module, says to apply it to a node (hints.AppliedOp)."""
    __slots__ = ("padding", "padded_shape", "slices", "geometry")

    def _windows(self, x, size, stride, padding, fill):
        op = type(self).__name__
        _check_nchw(op, x)
        kernel = _pair(op, "size", size, 1)
        stride = kernel if stride is None else _pair(op, "stride", stride, 1)
        self.padding = _pair(op, "padding", padding, 0)
        if any(2 * p > k for p, k in zip(self.padding, kernel)):
            raise ValueError(f"{op}: padding {self.padding} must be at most half the "
                             f"{kernel[0]}×{kernel[1]} window on each axis")
        xd = _pad(x._data, self.padding, fill)
        self.padded_shape = xd.shape
        (Ho, Wo), self.slices = _offsets(op, xd.shape, kernel, stride)
        self.geometry = kernel, stride, (Ho, Wo)
        return [xd[window] for _, _, window in self.slices]

    def _add_back(self, x, patch_grads):
        """Add each window's gradient (patch_grads yields one per slice) into x's gradient."""
        xp = backend.array_module(self._g)
        dx = xp.zeros(self.padded_shape, dtype=self._g.dtype)
        for (_, _, window), grad in zip(self.slices, patch_grads):
            dx[window] += grad
        x.accumulate(_crop(dx, self.padding))


class MaxPool2D(_Pool):
    """Max pooling over kh×kw windows (stride defaults to the window), as PyTorch's
    ``max_pool2d``.

    y[n, c, r, q] = max_{i, j} x̃[n, c, s·r + i, s·q + j]
        x̃ = x padded with p cells of −∞ on each side (a padded cell never wins);
        H' = (H + 2p − kh) // s + 1 (likewise W')
    dx = g routed to the arg-max of each window (the first one, row by row, when several
         elements tie, as PyTorch); overlapping windows add their gradients; nothing reaches
         the padding
    size, stride and padding are an int or a (vertical, horizontal) pair; padding is at most
    half the window on each axis; windows that would run past the padded edge are dropped.
    Second derivatives: dx is an op of g alone (the routing is constant), so ∂²y/∂x² = 0.
    """
    __slots__ = ("arg",)

    def __init__(self, x, size, stride=None, padding=0):
        x = _node(x)
        patches = self._windows(x, size, stride, padding, -numpy.inf)
        xp = backend.array_module(x._data)
        stacked = xp.stack(patches)
        y = stacked.max(axis=0)
        if any(self.padding):
            # the first real cell that holds the max (NaN counts as the max, as in argmax): a
            # padded cell (−∞) ties with a window whose real cells are all −∞, and must not win
            inside = _pad(xp.ones(x._data.shape, dtype=bool), self.padding, False)
            hit = xp.stack([inside[window] for _, _, window in self.slices])
            hit &= (stacked == y) | xp.isnan(stacked)
            self.arg = hit.argmax(axis=0)
        else:
            self.arg = stacked.argmax(axis=0)
        super().__init__(y, x)

    def _back(self, x):
        # each window's g goes to its arg-max alone: where(), as g · [arg = k] would make an
        # infinite or NaN g NaN at the other cells of the window (∞ · 0)
        xp = backend.array_module(self._g)
        self._add_back(x, (xp.where(self.arg == k, self._g, 0)
                           for k in range(len(self.slices))))

    def _grads(self, g, x):
        # dx is g routed by the arg-max, a constant routing (y is piecewise linear in x)
        return (_WindowSpread(g, _geometry(self),
                              [self.arg == k for k in range(len(self.slices))]),)


class AvgPool2D(_Pool):
    """Average pooling over kh×kw windows (stride defaults to the window), as PyTorch's
    ``avg_pool2d``.

    y[n, c, r, q] = Σ_{i, j} x̃[n, c, s·r + i, s·q + j] / d[r, q]
        x̃ = x padded with p zeros on each side;  H' = (H + 2p − kh) // s + 1 (likewise W')
        d = kh·kw (count_include_pad=True), or the number of cells of window (r, q) that lie
        in x, not in the padding (count_include_pad=False)
    dx = g / d added to every element of its window (the padding's share is dropped)
    size, stride and padding are an int or a (vertical, horizontal) pair; padding is at most
    half the window on each axis.
    """
    __slots__ = ("divisor",)

    def __init__(self, x, size, stride=None, padding=0, count_include_pad=True):
        checks.flag("AvgPool2D", "count_include_pad", count_include_pad)
        x = _node(x)
        patches = self._windows(x, size, stride, padding, 0)
        y = patches[0].copy()
        for patch in patches[1:]:
            y += patch
        if count_include_pad or not any(self.padding):
            self.divisor = len(patches)
        else:
            self.divisor = self._real_counts(backend.array_module(y), y.dtype, x._data.shape)
        super().__init__(y / self.divisor, x)

    def _real_counts(self, xp, dtype, shape):
        """(H', W'): how many cells of each window lie inside x (not in the padding)."""
        kernel, stride, out = self.geometry
        counts = []
        for k, s, p, n, size in zip(kernel, stride, self.padding, out, shape[-2:]):
            start = xp.arange(n) * s - p
            counts.append(xp.minimum(start + k, size) - xp.maximum(start, 0))
        return (counts[0][:, None] * counts[1][None, :]).astype(dtype)

    def _back(self, x):
        share = self._g / self.divisor
        self._add_back(x, (share for _ in self.slices))

    def _grads(self, g, x):
        return (_WindowSpread(g, _geometry(self), [1 / self.divisor] * len(self.slices)),)


# ----------------------------------------------------------------------------- second order
# The backward passes as ops, for grad(create_graph=True). Each is linear in each of its
# inputs, and the gradients of each are again these ops (or Conv2D), so every order works.
# ``geo`` is the forward op's window geometry, which they share.

_Geometry = collections.namedtuple("_Geometry", "padding slices padded_shape stride out")


def _geometry(op):
    """The window geometry of a Conv2D or pool node (not the node itself: its buffers stay
    free), with the stride and (H', W') read off the slice of kernel offset (0, 0)."""
    _, _, (_, rows, cols) = op.slices[0]
    stride = rows.step, cols.step
    out = tuple((s.stop - s.start - 1) // s.step + 1 for s in (rows, cols))
    return _Geometry(op.padding, op.slices, op.padded_shape, stride, out)


def _columns(xd, kernel, geo):
    """im2col of x padded as geo's input: (C·kh·kw, N·H'·W'), as Conv2D builds it."""
    xd = _pad(xd, geo.padding)
    N, C = xd.shape[:2]
    Ho, Wo = geo.out
    cols = backend.array_module(xd).empty((C,) + tuple(kernel) + (N, Ho, Wo), dtype=xd.dtype)
    for i, j, window in geo.slices:
        cols[:, i, j] = xd[window].transpose(1, 0, 2, 3)
    return cols.reshape(-1, N * Ho * Wo)


def _conv(xd, wd, geo):
    """Conv2D's value without a bias."""
    O, N = wd.shape[0], xd.shape[0]
    y = wd.reshape(O, -1) @ _columns(xd, wd.shape[2:], geo)
    Ho, Wo = geo.out
    return backend.array_module(y).ascontiguousarray(
        y.reshape(O, N, Ho, Wo).transpose(1, 0, 2, 3))


def _conv_input(gd, wd, geo):
    """Conv2D's input gradient: Wᵀ·G added back window by window (col2im), cropped."""
    O = wd.shape[0]
    N, C = geo.padded_shape[:2]
    dcols = (wd.reshape(O, -1).T @ gd.transpose(1, 0, 2, 3).reshape(O, -1)).reshape(
        (C,) + wd.shape[2:] + (N,) + gd.shape[2:])
    dx = backend.array_module(gd).zeros(geo.padded_shape, dtype=gd.dtype)
    for i, j, window in geo.slices:
        dx[window] += dcols[:, i, j].transpose(1, 0, 2, 3)
    return _crop(dx, geo.padding)


def _conv_weight(xd, gd, kernel, geo):
    """Conv2D's kernel gradient: G·Xᵀ, X the columns of x."""
    O = gd.shape[1]
    dw = gd.transpose(1, 0, 2, 3).reshape(O, -1) @ _columns(xd, kernel, geo).T
    return dw.reshape((O, xd.shape[1]) + tuple(kernel))


class _ConvInput(NetOp):
    """Conv2D's input gradient dx as an op of (g, w). As ⟨u, dx⟩ = ⟨g, conv(u, w)⟩, an
    upstream gradient u gives g conv(u, w) and w the kernel gradient of conv(u, ·) at g."""
    __slots__ = ("geo",)

    def __init__(self, g, w, geo):
        self.geo = geo
        super().__init__(_conv_input(g._data, w._data, geo), g, w)

    def _back(self, g, w):
        if g.requires_grad:
            g.accumulate(_conv(self._g, w._data, self.geo))
        if w.requires_grad:
            w.accumulate(_conv_weight(self._g, g._data, w._data.shape[2:], self.geo))

    def _grads(self, u, g, w):
        dg = Conv2D(u, w, stride=self.geo.stride, padding=self.geo.padding) \
            if g.requires_grad else None
        dw = _ConvWeight(u, g, w._data.shape[2:], self.geo) if w.requires_grad else None
        return dg, dw


class _ConvWeight(NetOp):
    """Conv2D's kernel gradient dw as an op of (x, g). As ⟨u, dw⟩ = ⟨g, conv(x, u)⟩, an
    upstream gradient u gives x the input gradient of conv(·, u) at g and g conv(x, u)."""
    __slots__ = ("geo",)

    def __init__(self, x, g, kernel, geo):
        self.geo = geo
        super().__init__(_conv_weight(x._data, g._data, kernel, geo), x, g)

    def _back(self, x, g):
        if x.requires_grad:
            x.accumulate(_conv_input(g._data, self._g, self.geo))
        if g.requires_grad:
            g.accumulate(_conv(x._data, self._g, self.geo))

    def _grads(self, u, x, g):
        dx = _ConvInput(g, u, self.geo) if x.requires_grad else None
        dg = Conv2D(x, u, stride=self.geo.stride, padding=self.geo.padding) \
            if g.requires_grad else None
        return dx, dg


def _weighted(weight, a):
    """weight · a, for a boolean weight (the max's arg-max indicator) a where(): ∞ or NaN
    times a False stays 0."""
    if getattr(weight, "dtype", None) == bool:
        return backend.array_module(a).where(weight, a, 0)
    return weight * a


def _window_sum(xd, geo, weights):
    """Σ_k weights[k] · x̃[window k], x̃ = x padded with zeros: a pool's y for constant weights
    (1/d for the average, the arg-max indicator for the maximum)."""
    xd = _pad(xd, geo.padding)
    y = None
    for (_, _, window), weight in zip(geo.slices, weights):
        part = _weighted(weight, xd[window])
        y = part if y is None else y + part
    return y


def _spread(gd, geo, weights):
    """The adjoint of ``_window_sum``: weights[k] · g added to window k, cropped to x."""
    dx = backend.array_module(gd).zeros(geo.padded_shape, dtype=gd.dtype)
    for (_, _, window), weight in zip(geo.slices, weights):
        dx[window] += _weighted(weight, gd)
    return _crop(dx, geo.padding)


class _WindowSpread(NetOp):
    """A pool's input gradient as an op of g (``_spread``); its gradient is ``_WindowSum``."""
    __slots__ = ("geo", "weights")

    def __init__(self, g, geo, weights):
        self.geo, self.weights = geo, weights
        super().__init__(_spread(g._data, geo, weights), g)

    def _back(self, g):
        g.accumulate(_window_sum(self._g, self.geo, self.weights))

    def _grads(self, u, g):
        return (_WindowSum(u, self.geo, self.weights),)


class _WindowSum(NetOp):
    """``_window_sum`` as an op; its gradient is ``_WindowSpread``."""
    __slots__ = ("geo", "weights")

    def __init__(self, x, geo, weights):
        self.geo, self.weights = geo, weights
        super().__init__(_window_sum(x._data, geo, weights), x)

    def _back(self, x):
        x.accumulate(_spread(self._g, self.geo, self.weights))

    def _grads(self, u, x):
        return (_WindowSpread(u, self.geo, self.weights),)
