"""Initializers: functions returning parameter NetVars of a given shape.

Every initializer takes the shape (``he(64, 128)`` or ``he((64, 128))``) and ``seed``: None
uses nnkit's global generator (``nnkit.seed(n)``), an int makes a fresh generator, a
``numpy.random.Generator`` is used as it is. Values have ``nnkit.dtype``; a 1-D shape ``(n,)``
gives a row ``(1, n)`` (biases). Errors name the initializer: TypeError for a size that is
not an int (a float, a bool) or a seed that is not None, an int or a Generator; ValueError for
a size below 1, a negative seed, or a non-finite ``std``, ``mean``, ``low``, ``high`` or
``gain``.

Fan conventions for the row-oriented layout, where ``x @ w`` maps rows of inputs to outputs:

- 2-D weight ``(in, out)``: fan_in = in = shape[0], fan_out = out = shape[1];
- 1-D ``(n,)``: fan_in = fan_out = n;
- ≥ 3-D convolution kernel ``(out_channels, in_channels, *kernel)``: with k = ∏ kernel,
  fan_in = in_channels · k and fan_out = out_channels · k.

| initializer | distribution |
|---|---|
| ``gaussian(std=0.01, mean=0)`` | N(mean, std²) |
| ``uniform(low=-0.05, high=0.05)`` | U(low, high) |
| ``glorot_uniform`` (= ``glorot``) | U(±√(6 / (fan_in + fan_out))) |
| ``glorot_normal`` | N(0, 2 / (fan_in + fan_out)) |
| ``he_normal`` (= ``he``) | N(0, 2 / fan_in), for ReLU layers |
| ``he_uniform`` | U(±√(6 / fan_in)) |
| ``lecun_normal`` | N(0, 1 / fan_in), for SELU / tanh layers |
| ``lecun_uniform`` | U(±√(3 / fan_in)) |
| ``orthogonal(gain=1)`` | gain · a random (semi-)orthogonal matrix |
| ``identity(gain=1)`` | gain · I (ones on the diagonal of a 2-D shape) |
| ``rand2`` | U(±√(3 / mean(shape))), the article's |
| ``zeros`` | 0 |

``recurrent_weights(cell, inputs, hidden)`` makes the three parameters ``(W, R, b)`` of a fused
recurrent op (``RNN``, ``LSTM``, ``GRU``) at once.
"""

__all__ = ['rand2', 'gaussian', 'uniform', 'glorot', 'glorot_uniform', 'glorot_normal', 'he',
           'he_normal', 'he_uniform', 'lecun_normal', 'lecun_uniform', 'orthogonal', 'identity',
           'zeros', 'recurrent_weights']
import math

import numpy

from . import backend, checks
from .core import NetVar
from .dtypes import get_dtype
from .ops.recurrent import CELLS


def _shape(shape, owner):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    if not all(checks.is_integer(n) for n in shape):
        raise TypeError(f"{owner}: shape must be positive integers, got {shape}")
    shape = tuple(int(n) for n in shape)
    if not shape or any(n <= 0 for n in shape):
        raise ValueError(f"{owner}: shape must be positive integers, got {shape}")
    return shape


def _fans(shape):
    """(fan_in, fan_out) of a weight of ``shape`` (see the module docstring)."""
    if len(shape) == 1:
        return shape[0], shape[0]
    if len(shape) == 2:
        return shape[0], shape[1]
    kernel = math.prod(shape[2:])
    return shape[1] * kernel, shape[0] * kernel


def _param(values, name=None, owner="nnkit.init"):
    """``values`` as a parameter of nnkit's dtype; refused when that dtype cannot hold them (a
    finite mean or gain that overflows float16 or float32 gave inf weights silently)."""
    with numpy.errstate(over="ignore"):
        data = values.astype(get_dtype())
    if not numpy.isfinite(data).all():
        raise ValueError(f"{owner}: the values drawn do not fit {data.dtype} (largest "
                         f"{numpy.abs(values).max():.3g}); give smaller ones or another dtype")
    return NetVar(data, name=name)


def _normal(shape, std, seed, owner, mean=0.0):
    return _param(backend.as_generator(seed, owner).normal(mean, std, shape), owner=owner)


def _uniform(shape, limit, seed, owner):
    return _param(backend.as_generator(seed, owner).uniform(-limit, limit, shape), owner=owner)


def rand2(*shape, seed=None):
    """Uniform in ±√(3 / mean(shape)), as in the article (Glorot-like variance 1/mean(shape))."""
    shape = _shape(shape, "rand2")
    return _uniform(shape, math.sqrt(3.0 / (sum(shape) / len(shape))), seed, "rand2")


def gaussian(*shape, std=0.01, mean=0.0, seed=None):
    """Normal N(mean, std²)."""
    checks.in_range("gaussian", "std", std, 0)
    checks.in_range("gaussian", "mean", mean)
    return _normal(_shape(shape, "gaussian"), std, seed, "gaussian", mean)


def uniform(*shape, low=-0.05, high=0.05, seed=None):
    """Uniform U(low, high)."""
    if not checks.in_range("uniform", "low", low) <= checks.in_range("uniform", "high", high):
        raise ValueError(f"uniform: low must be <= high, got {low} > {high}")
    generator = backend.as_generator(seed, "uniform")
    return _param(generator.uniform(low, high, _shape(shape, "uniform")))


def glorot_uniform(*shape, seed=None):
    """Glorot/Xavier uniform: U(±√(6 / (fan_in + fan_out)))."""
    shape = _shape(shape, "glorot_uniform")
    fan_in, fan_out = _fans(shape)
    return _uniform(shape, math.sqrt(6.0 / (fan_in + fan_out)), seed, "glorot_uniform")


def glorot_normal(*shape, seed=None):
    """Glorot/Xavier normal: N(0, 2 / (fan_in + fan_out))."""
    shape = _shape(shape, "glorot_normal")
    fan_in, fan_out = _fans(shape)
    return _normal(shape, math.sqrt(2.0 / (fan_in + fan_out)), seed, "glorot_normal")


def he_normal(*shape, seed=None):
    """He/Kaiming normal for ReLU layers: N(0, 2 / fan_in)."""
    shape = _shape(shape, "he_normal")
    return _normal(shape, math.sqrt(2.0 / _fans(shape)[0]), seed, "he_normal")


def he_uniform(*shape, seed=None):
    """He/Kaiming uniform for ReLU layers: U(±√(6 / fan_in)) (variance 2 / fan_in)."""
    shape = _shape(shape, "he_uniform")
    return _uniform(shape, math.sqrt(6.0 / _fans(shape)[0]), seed, "he_uniform")


def lecun_normal(*shape, seed=None):
    """LeCun normal: N(0, 1 / fan_in)."""
    shape = _shape(shape, "lecun_normal")
    return _normal(shape, math.sqrt(1.0 / _fans(shape)[0]), seed, "lecun_normal")


def lecun_uniform(*shape, seed=None):
    """LeCun uniform: U(±√(3 / fan_in)) (variance 1 / fan_in)."""
    shape = _shape(shape, "lecun_uniform")
    return _uniform(shape, math.sqrt(3.0 / _fans(shape)[0]), seed, "lecun_uniform")


glorot = glorot_uniform
he = he_normal


def orthogonal(*shape, gain=1.0, seed=None):
    """gain · Q, Q (semi-)orthogonal: the QR factor of a Gaussian matrix, signs fixed so that
    it is uniformly distributed. The shape is viewed as (shape[0], ∏ shape[1:]); its rows are
    orthonormal when shape[0] ≤ ∏ shape[1:], else its columns are."""
    shape = _shape(shape, "orthogonal")
    checks.in_range("orthogonal", "gain", gain)
    rows, cols = shape[0], math.prod(shape[1:])
    generator = backend.as_generator(seed, "orthogonal")
    a = generator.standard_normal((max(rows, cols), min(rows, cols)))
    q, r = numpy.linalg.qr(a)
    q *= numpy.where(numpy.diag(r) < 0, -1.0, 1.0)
    if rows < cols:
        q = q.T
    return _param(gain * q.reshape(shape), owner="orthogonal")


def identity(*shape, gain=1.0, seed=None):
    """gain · I: ones on the main diagonal of a 2-D (possibly rectangular) shape, zeros
    elsewhere (a residual or recurrent weight that starts as the identity map). ``seed`` is
    accepted for a uniform signature and unused."""
    shape = _shape(shape, "identity")
    checks.in_range("identity", "gain", gain)
    backend.as_generator(seed, "identity")
    if len(shape) != 2:
        raise ValueError(f"identity: needs a 2-D shape, got {shape}")
    return _param(gain * numpy.eye(*shape), owner="identity")


def zeros(*shape, seed=None):
    """All zeros (biases). ``seed`` is accepted for a uniform signature and unused."""
    backend.as_generator(seed, "zeros")
    return _param(numpy.zeros(_shape(shape, "zeros")))




def recurrent_weights(cell, inputs, hidden, forget_bias=1.0, seed=None):
    """Parameters ``(W, R, b)`` for ``RNN``, ``LSTM`` or ``GRU`` (``cell`` = 'rnn', 'lstm', 'gru').

    W (inputs, k·H) and R (H, k·H) uniform in ±1/√H; b zeros, shape (1, k·H) — (2, 3H) for the
    GRU — except the LSTM's forget-gate bias b[0, H:2H] = ``forget_bias`` (1 by default, so that
    the cell starts by remembering). ``seed``: None (nnkit's global generator), an int or a
    Generator; W is drawn before R.
    """
    if cell not in CELLS:
        raise ValueError(f"recurrent_weights: cell must be one of {sorted(CELLS)}, got "
                         f"{cell!r}")
    for name, size in (("inputs", inputs), ("hidden", hidden)):
        checks.count("recurrent_weights", name, size, 1)
    if not (checks.is_number(forget_bias) and math.isfinite(forget_bias)):
        raise ValueError(f"recurrent_weights: forget_bias must be a finite number, got "
                         f"{forget_bias!r}")
    generator = backend.as_generator(seed, "recurrent_weights")
    op = CELLS[cell].op
    k = op.gates
    limit = 1 / math.sqrt(hidden)
    W = _uniform((inputs, k * hidden), limit, generator, "recurrent_weights")
    R = _uniform((hidden, k * hidden), limit, generator, "recurrent_weights")
    b = numpy.zeros((2 if op.two_biases else 1, k * hidden))
    if cell == 'lstm':
        b[0, hidden:2 * hidden] = forget_bias
    b = _param(b, owner="recurrent_weights")
    b.is_bias = True        # (a GRU's is (2, 3H): MaxNorm leaves it alone)
    return W, R, b
