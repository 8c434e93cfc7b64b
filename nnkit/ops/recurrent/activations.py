"""The one table of the recurrent layers' activations: ``ACTIVATIONS``.

The fused ops apply an activation in place to each step's pre-activations and differentiate it
through its output y; the cells build it from the op of the same name. One entry per name
holds both, so the two never disagree on what a name means.
"""
from typing import Callable, NamedTuple, Optional

from ... import backend
from ..activation import ReLU, Sigmoid, Tanh, sigmoid


class Activation(NamedTuple):
    """An activation as the recurrent layers use it."""
    apply: Callable              # a ← f(a), in place on an array
    derivative: Optional[Callable]   # f′ written with the output y = f(a); None for the identity
    op: Optional[type]           # the op a cell builds (None: the identity)


def sigmoid_(a):
    """a ← σ(a) in place, with the activation op's stable σ (no overflow, no cancellation)."""
    a[...] = sigmoid(a, backend.array_module(a))


def tanh_(a):
    backend.array_module(a).tanh(a, out=a)


def relu_(a):
    backend.array_module(a).maximum(a, 0, out=a)


def _identity(a):
    pass


ACTIVATIONS = {
    'tanh': Activation(tanh_, lambda y: 1 - y * y, Tanh),
    'sigmoid': Activation(sigmoid_, lambda y: y * (1 - y), Sigmoid),
    'relu': Activation(relu_, lambda y: y > 0, ReLU),
    'linear': Activation(_identity, None, None),
}
