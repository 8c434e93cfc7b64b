"""Initializers: functions returning parameter NetVars of a given shape.

Shapes follow the row-oriented layout: a weight is (fan_in, fan_out) = (inputs, outputs).
Every initializer takes ``seed``: None uses nnkit's global generator (``nnkit.seed(n)``), an
int makes a fresh generator, a ``numpy.random.Generator`` is used as it is. Values have
``nnkit.dtype``.
"""

__all__ = ['rand2', 'glorot', 'he', 'zeros']
import math

import numpy

from . import backend
from .core import NetVar, get_dtype


def _shape(shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    shape = tuple(int(n) for n in shape)
    if not shape or any(n <= 0 for n in shape):
        raise ValueError(f"initializer: shape must be positive integers, got {shape}")
    return shape


def _fans(shape):
    """fan_in = shape[0] (rows are inputs), fan_out = shape[-1]."""
    return shape[0], shape[-1]


def _param(values, name=None):
    return NetVar(values.astype(get_dtype()), name=name)


def rand2(*shape, seed=None):
    """Uniform in ±√(3 / mean(shape)), as in the article (Glorot-like variance 1/mean(shape))."""
    shape = _shape(shape)
    limit = math.sqrt(3.0 / (sum(shape) / len(shape)))
    return _param(backend.as_generator(seed).uniform(-limit, limit, shape))


def glorot(*shape, seed=None):
    """Glorot/Xavier uniform: U(±√(6 / (fan_in + fan_out)))."""
    shape = _shape(shape)
    fan_in, fan_out = _fans(shape)
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    return _param(backend.as_generator(seed).uniform(-limit, limit, shape))


def he(*shape, seed=None):
    """He/Kaiming normal for ReLU layers: N(0, 2 / fan_in)."""
    shape = _shape(shape)
    fan_in, _ = _fans(shape)
    return _param(backend.as_generator(seed).normal(0.0, math.sqrt(2.0 / fan_in), shape))


def zeros(*shape, seed=None):
    """All zeros (biases). ``seed`` is accepted for a uniform signature and unused."""
    shape = _shape(shape)
    return _param(numpy.zeros(shape))
