"""The layers of one op each, and the chain of layers: Linear, Conv2D, BatchNorm, LayerNorm,
Embedding, Dropout, Sequential."""

__all__ = ['Linear', 'Conv2D', 'BatchNorm', 'LayerNorm', 'Embedding', 'Dropout', 'Sequential']
import numpy

from .. import backend, checks, ops
from ..core import NetOp, NetVar
from ..dtypes import get_dtype
from ..init import glorot_uniform
from ..module import Module
from ..ops.embedding import padding_row
from .common import _check_features, _node, _pair, _row


# ----------------------------------------------------------------------------- affine, conv

class Linear(Module):
    """Affine layer: y = x @ W + b (``Add(Multiply(x, W), b)``).

    ``Linear(inputs, outputs, bias=True, seed=None)``. W is (inputs, outputs), Glorot-uniform:
    U(±√(6 / (inputs + outputs))) as ``nn.glorot_uniform``; b is zeros of shape (1, outputs), a
    row added to every row of x, or None with ``bias=False``.
    x is (..., B, inputs) (a 1-D input is a (1, inputs) row), y is (..., B, outputs).
    PyTorch ``nn.Linear``: weight = Wᵀ (its weight is (outputs, inputs)), bias = b[0].
    """

    def __init__(self, inputs, outputs, bias=True, seed=None):
        inputs = checks.count("layers.Linear", "inputs", inputs, 1)
        outputs = checks.count("layers.Linear", "outputs", outputs, 1)
        bias = checks.flag("layers.Linear", "bias", bias)
        generator = backend.as_generator(seed, "layers.Linear")
        self.inputs, self.outputs = inputs, outputs
        self.W = glorot_uniform(inputs, outputs, seed=generator)
        self.b = _row(numpy.zeros(outputs)) if bias else None

    def forward(self, x):
        """y (..., B, outputs) for x (..., B, inputs)."""
        x = _node(x, self.W, "layers.Linear")
        _check_features("layers.Linear", x, -1, self.inputs, "(..., B, inputs)")
        y = ops.Multiply(x, self.W)
        return y if self.b is None else y + self.b       # the Add node, by the operator

    def extra_repr(self):
        return f"{self.inputs}, {self.outputs}" + ("" if self.b is not None else ", bias=False")


class Conv2D(Module):
    """2-D convolution layer on NCHW data: y = ``Conv2D(x, W, b, stride, padding)``.

    ``Conv2D(in_channels, out_channels, size, stride=1, padding=0, bias=True, seed=None)``;
    ``size`` (the kernel's kh, kw) and ``stride`` are an int or a (vertical, horizontal) pair of
    ints ≥ 1, ``padding`` ints ≥ 0 (zeros on each side). W is (out_channels, in_channels, kh,
    kw), Glorot-uniform with the convolution fans (fan_in = in_channels·kh·kw, fan_out =
    out_channels·kh·kw); b is zeros of shape (1, out_channels), or None with ``bias=False``.
    x is (N, in_channels, H, W), y (N, out_channels, H', W') with H' = (H + 2p − kh) // s + 1
    (likewise W'). PyTorch ``nn.Conv2d``: weight = W, bias = b[0].
    """

    def __init__(self, in_channels, out_channels, size, stride=1, padding=0, bias=True,
                 seed=None):
        in_channels = checks.count("layers.Conv2D", "in_channels", in_channels, 1)
        out_channels = checks.count("layers.Conv2D", "out_channels", out_channels, 1)
        size = _pair("layers.Conv2D", "size", size, 1)
        stride = _pair("layers.Conv2D", "stride", stride, 1)
        padding = _pair("layers.Conv2D", "padding", padding, 0)
        bias = checks.flag("layers.Conv2D", "bias", bias)
        generator = backend.as_generator(seed, "layers.Conv2D")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.size, self.stride, self.padding = size, stride, padding
        self.W = glorot_uniform(out_channels, in_channels, *size, seed=generator)
        self.b = _row(numpy.zeros(out_channels)) if bias else None

    def forward(self, x):
        """y (N, out_channels, H', W') for x (N, in_channels, H, W)."""
        x = _node(x, self.W, "layers.Conv2D")
        if x.ndim != 4:
            raise ValueError(f"layers.Conv2D: x of shape {tuple(x.shape)} must be (N, C, H, W) "
                             f"with C = {self.in_channels}")
        _check_features("layers.Conv2D", x, 1, self.in_channels, "(N, C, H, W)")
        return ops.Conv2D(x, self.W, self.b, stride=self.stride, padding=self.padding)

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, size={self.size}, "
                f"stride={self.stride}, padding={self.padding}"
                + ("" if self.b is not None else ", bias=False"))


# ----------------------------------------------------------------------------- normalisation

class BatchNorm(Module):
    """Batch normalisation layer: y = γ · x̂ + β per feature on axis 1 (``BatchNorm`` op).

    ``BatchNorm(features, momentum=0.1, eps=1e-5)``: momentum in [0, 1], eps > 0. ``gamma``
    (ones) and ``beta`` (zeros) are (1, features) rows; ``stats`` is a ``BatchNormState`` whose
    running mean and variance are buffers, ``stats.running_mean`` and ``stats.running_var``
    (saved by ``state()``, moved by ``to_gpu()``, never trained). In training (the default) x is
    normalised with its batch's statistics and ``stats`` is updated; under ``nn.eval_mode()``
    the running statistics are used and nothing changes. x is (B, features) or (B, features,
    H, W) (any (B, features, ...)). PyTorch ``nn.BatchNorm1d`` / ``nn.BatchNorm2d`` (the same
    momentum convention): weight = gamma[0], bias = beta[0].
    """

    def __init__(self, features, momentum=0.1, eps=1e-5):
        features = checks.count("layers.BatchNorm", "features", features, 1)
        checks.in_range("layers.BatchNorm", "momentum", momentum, 0, 1)
        checks.in_range("layers.BatchNorm", "eps", eps, 0, low_open=True)
        self.features = features
        self.gamma = _row(numpy.ones(features))
        self.beta = _row(numpy.zeros(features))
        self.stats = ops.BatchNormState(features, momentum, eps)

    def forward(self, x):
        """y with x's shape, (B, features, ...)."""
        x = _node(x, self.gamma, "layers.BatchNorm")
        _check_features("layers.BatchNorm", x, 1, self.features, "(B, features, ...)")
        return ops.BatchNorm(x, self.gamma, self.beta, self.stats)

    def extra_repr(self):
        return f"{self.features}, momentum={self.stats.momentum}, eps={self.stats.eps}"


class LayerNorm(Module):
    """Layer normalisation over the last axis: y = γ · x̂ + β (``LayerNorm`` op), each row on
    its own, the same in training and evaluation.

    ``LayerNorm(features, eps=1e-5)``: eps > 0. ``gamma`` (ones) and ``beta`` (zeros) are
    (1, features) rows. x is (..., features), y has x's shape. PyTorch ``nn.LayerNorm``:
    weight = gamma[0], bias = beta[0].
    """

    def __init__(self, features, eps=1e-5):
        features = checks.count("layers.LayerNorm", "features", features, 1)
        self.eps = checks.in_range("layers.LayerNorm", "eps", eps, 0, low_open=True)
        self.features = features
        self.gamma = _row(numpy.ones(features))
        self.beta = _row(numpy.zeros(features))

    def forward(self, x):
        """y with x's shape, (..., features)."""
        x = _node(x, self.gamma, "layers.LayerNorm")
        _check_features("layers.LayerNorm", x, -1, self.features, "(..., features)")
        return ops.LayerNorm(x, self.gamma, self.beta, eps=self.eps)

    def extra_repr(self):
        return f"{self.features}, eps={self.eps}"


# ----------------------------------------------------------------------------- embedding

class Embedding(Module):
    """A (V, D) table of trainable rows, looked up by integer index (``Embedding`` op).

    ``Embedding(V, D, padding_idx=None, seed=None)``. ``table`` is (V, D), standard normal as
    PyTorch's ``nn.Embedding``; ``padding_idx`` (an integer in [−V, V), negative counting from
    the end; kept in [0, V)) names a row that starts at zero and is never trained. Called on
    integer indices of any shape (an integer array, list or ``NetVar(ids, dtype=int)``) it
    returns their rows, shape indices.shape + (D,). PyTorch ``nn.Embedding``: weight = table.
    """

    def __init__(self, V, D, padding_idx=None, seed=None):
        V = checks.count("layers.Embedding", "V", V, 1)
        D = checks.count("layers.Embedding", "D", D, 1)
        if padding_idx is not None:
            padding_idx = padding_row(padding_idx, V, "layers.Embedding")
        generator = backend.as_generator(seed, "layers.Embedding")
        self.V, self.D, self.padding_idx = V, D, padding_idx
        table = generator.standard_normal((V, D)).astype(get_dtype())
        if padding_idx is not None:
            table[padding_idx] = 0
        self.table = NetVar(table)

    def forward(self, indices):
        """The rows of ``table`` for ``indices``: shape indices.shape + (D,)."""
        return ops.Embedding(indices, self.table, self.padding_idx)

    def extra_repr(self):
        return f"{self.V}, {self.D}" + ("" if self.padding_idx is None
                                        else f", padding_idx={self.padding_idx}")


# ----------------------------------------------------------------------------- dropout

class Dropout(Module):
    """Inverted dropout (the ``Dropout`` op): in training each element is zeroed with
    probability p and the rest scaled by 1/(1 − p); under ``nn.eval_mode()`` y = x.

    ``Dropout(p=0.5)``: p in [0, 1). No parameters; the mask is drawn from nnkit's global
    generator (``nnkit.seed``). y has x's shape.
    """

    def __init__(self, p=0.5):
        self.p = checks.in_range("layers.Dropout", "p", p, 0, 1, high_open=True)

    def forward(self, x):
        """y with x's shape."""
        return ops.Dropout(_node(x), self.p)

    def extra_repr(self):
        return f"p={self.p}"


# ----------------------------------------------------------------------------- containers

class Sequential(Module):
    """A chain: ``Sequential(a, b, c)(x)`` is ``c(b(a(x)))``.

    Each entry is a Module (a layer, an FFN, another Sequential), an op class of one input
    (``nn.ReLU``) or any function of a node that returns a node (``lambda x: x * 2``). The
    entries are the list ``layers``, so the parameters of entry i are named ``layers.<i>.<name>``
    (``layers.0.W``); entries without parameters keep their place in the numbering.
    ``len(model)``, ``model[i]`` (``model[1:]`` is a Sequential of those entries, sharing
    them) and ``for entry in model`` see the entries. An entry that is not callable, or a class
    that is not an op (``nn.layers.Linear`` unbuilt), is refused with TypeError naming its place.
    A Module used inside a function entry (a residual ``lambda v: v + block(v)``) is not an
    entry: its parameters are not listed, trained or saved; write a Module holding it instead.
    """

    def __init__(self, *entries):
        for position, entry in enumerate(entries):
            if isinstance(entry, type) and not issubclass(entry, NetOp) or not callable(entry):
                raise TypeError(f"layers.Sequential: entry {position} ({entry!r}) is not a "
                                "Module, an op class or a function")
        self.layers = list(entries)

    def forward(self, x):
        """Each entry applied in turn, starting from x; the last result. An error names the
        entry that raised it; an entry that returns anything but a node is refused (an array
        would pass on as a constant, cutting the gradient of every entry before it)."""
        for position, entry in enumerate(self.layers):
            try:
                x = entry(x)
            except (TypeError, ValueError) as error:
                raise type(error)(f"layers.Sequential: entry {position} "
                                  f"({getattr(entry, '__name__', type(entry).__name__)}): "
                                  f"{error}") from None
            if not isinstance(x, NetVar):
                raise TypeError(f"layers.Sequential: entry {position} returned a "
                                f"{type(x).__name__}, not a node (a NetVar)")
        return x

    def __len__(self):
        return len(self.layers)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return Sequential(*self.layers[index])
        return self.layers[index]

    def __iter__(self):
        return iter(self.layers)

    def tree(self):
        """One line per entry (a Module's own lines indented; a function by its name)."""
        lines = ["Sequential("]
        for position, entry in enumerate(self.layers):
            if isinstance(entry, Module):
                inner = entry.tree()
                lines.append(f"  (layers.{position}): {inner[0]}")
                lines.extend("  " + line for line in inner[1:])
            else:
                lines.append(f"  (layers.{position}): "
                             f"{getattr(entry, '__name__', type(entry).__name__)}")
        return lines + [")"]
