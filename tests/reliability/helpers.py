"""Shared pieces of the reliability tests: the hypothesis settings and exact-shape leaves."""
import numpy as np
from hypothesis import HealthCheck, settings

import nnkit as nn

# Deterministic and fast: the same examples on every run, no per-example deadline.
PROPERTY = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


def leaf(array, requires_grad=True):
    """A float64 leaf holding ``array`` with exactly its shape (no promotion of 0-d/1-d to rows)."""
    node = nn.constant(np.asarray(array, dtype=np.float64))
    node.requires_grad = requires_grad
    return node


def sum_to_shape(g, shape):
    """Reference for broadcast-summing: add ``g`` up over every axis ``shape`` was broadcast on."""
    g = np.asarray(g)
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    for axis, n in enumerate(shape):
        if n == 1 and g.shape[axis] != 1:
            g = g.sum(axis=axis, keepdims=True)
    return g


def snapshot(nodes):
    """Copies of the data and gradient state of ``nodes``, to show a failed call changed nothing."""
    return [(n.data.copy(), None if n._g is None else n._g.copy(), getattr(n, "_version", 0)) for n in nodes]


def assert_unchanged(nodes, before):
    for node, (data, g, version) in zip(nodes, before):
        np.testing.assert_array_equal(node.data, data)
        assert getattr(node, "_version", 0) == version
        if g is None:
            assert node._g is None
        else:
            np.testing.assert_array_equal(node._g, g)
