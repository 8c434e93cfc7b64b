"""Convolution and pooling on NCHW data: Conv2D, MaxPool2D, AvgPool2D.

Each op visits its kh·kw kernel offsets (i, j) once: the offset's strided slice of the input
holds that kernel element's input for every output position at once. Conv2D copies those slices
into one im2col matrix and runs one matrix product; its backward runs two products and adds
the columns back with kh·kw slice additions (col2im). Pools reduce over the same slices.
Notation: input x (N, C, H, W), kernel w (O, C, kh, kw), bias b (O), output y
(N, O, H', W'), upstream gradient g; s the stride, p the padding.
"""

__all__ = ['Conv2D', 'MaxPool2D', 'AvgPool2D']
import numpy

from .. import backend
from ..core import NetOp


def _pair(op, name, value, minimum):
    """An int or a pair of ints, each at least ``minimum``, as a pair."""
    pair = (value, value) if isinstance(value, (int, numpy.integer)) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, (int, numpy.integer)) and v >= minimum
                                 for v in pair):
        raise ValueError(f"{op}: {name} must be an int or a pair of ints ≥ {minimum}, got "
                         f"{value!r}")
    return int(pair[0]), int(pair[1])


def _check_nchw(op, x):
    if x._data.ndim != 4:
        raise ValueError(f"{op}: x must be (N, C, H, W), got shape {tuple(x.shape)}")
    if 0 in x._data.shape[:2]:
        raise ValueError(f"{op}: x of shape {tuple(x.shape)} has no sample or no channel")


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


class Conv2D(NetOp):
    """2-D convolution (cross-correlation, as PyTorch's ``conv2d``) of NCHW data.

    y[n, o, r, c] = b[o] + Σ_{k, i, j} w[o, k, i, j] · x̃[n, k, s·r + i, s·c + j]
        x̃ = x padded with p zeros on each side;  H' = (H + 2p − kh) // s + 1 (likewise W')
    as matrices (im2col): X = columns of x̃'s windows (C·kh·kw, N·H'·W'), Y = W·X + b
    dW = G·Xᵀ,   db = Σ_{n, r, c} g,   dX = Wᵀ·G, added back window by window (col2im)
    w is (O, C, kh, kw); b holds O values or is None; stride and padding are an int or a
    (vertical, horizontal) pair.
    """

    def __init__(self, x, w, b=None, stride=1, padding=0):
        _check_nchw("Conv2D", x)
        xd, wd = x._data, w._data
        if wd.ndim != 4:
            raise ValueError(f"Conv2D: w must be (C_out, C_in, kh, kw), got shape "
                             f"{tuple(wd.shape)}")
        if wd.shape[1] != xd.shape[1]:
            raise ValueError(f"Conv2D: w of shape {tuple(wd.shape)} expects {wd.shape[1]} input "
                             f"channels, x of shape {tuple(xd.shape)} has {xd.shape[1]}")
        O = wd.shape[0]
        if b is not None and b._data.size != O:
            raise ValueError(f"Conv2D: b of shape {tuple(b.shape)} does not hold one value for "
                             f"each of the {O} output channels")
        stride = _pair("Conv2D", "stride", stride, 1)
        self.padding = ph, pw = _pair("Conv2D", "padding", padding, 0)
        xp = backend.array_module(xd)
        if ph or pw:
            xd = xp.pad(xd, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
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
        g = self._g
        wd = w._data
        O = wd.shape[0]
        g2 = g.transpose(1, 0, 2, 3).reshape(O, -1)
        if w.requires_grad:
            w.accumulate((g2 @ self.cols.T).reshape(wd.shape))
        if b is not None and b.requires_grad:
            b.accumulate(g.sum(axis=(0, 2, 3)).reshape(b._data.shape))
        if x.requires_grad:
            xp = backend.array_module(g)
            N, C, Hp, Wp = self.padded_shape
            dcols = (wd.reshape(O, -1).T @ g2).reshape((C,) + wd.shape[2:] + (N,) + g.shape[2:])
            dx = xp.zeros(self.padded_shape, dtype=g.dtype)
            for i, j, window in self.slices:
                dx[window] += dcols[:, i, j].transpose(1, 0, 2, 3)
            ph, pw = self.padding
            x.accumulate(dx[:, :, ph:Hp - ph, pw:Wp - pw])


class _Pool(NetOp):
    """Shared by the pools: the window geometry."""

    def _windows(self, x, size, stride):
        op = type(self).__name__
        _check_nchw(op, x)
        kernel = _pair(op, "size", size, 1)
        stride = kernel if stride is None else _pair(op, "stride", stride, 1)
        _, self.slices = _offsets(op, x._data.shape, kernel, stride)
        return [x._data[window] for _, _, window in self.slices]


class MaxPool2D(_Pool):
    """Max pooling over size×size windows (stride defaults to size), as PyTorch's
    ``max_pool2d``.

    y[n, c, r, q] = max_{i, j} x[n, c, s·r + i, s·q + j]
    dx = g routed to the arg-max of each window (the first one, row by row, when several
         elements tie, as PyTorch); overlapping windows add their gradients
    size and stride are an int or a (vertical, horizontal) pair; windows that would run past
    the edge are dropped (H' = (H − kh) // s + 1).
    """

    def __init__(self, x, size, stride=None):
        patches = self._windows(x, size, stride)
        xp = backend.array_module(x._data)
        stacked = xp.stack(patches)
        self.arg = stacked.argmax(axis=0)
        super().__init__(stacked.max(axis=0), x)

    def _back(self, x):
        xp = backend.array_module(self._g)
        dx = xp.zeros_like(x._data)
        for k, (_, _, window) in enumerate(self.slices):
            dx[window] += self._g * (self.arg == k)
        x.accumulate(dx)


class AvgPool2D(_Pool):
    """Average pooling over size×size windows (stride defaults to size), as PyTorch's
    ``avg_pool2d``.

    y[n, c, r, q] = Σ_{i, j} x[n, c, s·r + i, s·q + j] / (kh·kw)
    dx = g / (kh·kw) added to every element of its window
    size and stride are an int or a (vertical, horizontal) pair.
    """

    def __init__(self, x, size, stride=None):
        patches = self._windows(x, size, stride)
        y = patches[0].copy()
        for patch in patches[1:]:
            y += patch
        super().__init__(y / len(patches), x)

    def _back(self, x):
        xp = backend.array_module(self._g)
        dx = xp.zeros_like(x._data)
        share = self._g / len(self.slices)
        for _, _, window in self.slices:
            dx[window] += share
        x.accumulate(dx)
