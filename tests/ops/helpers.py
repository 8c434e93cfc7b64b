"""Checks shared by the op tests: PyTorch as the oracle, scaling by the upstream gradient, second
derivatives against PyTorch's double backward, and random masks."""
import numpy as np

import nnkit as nn


def assert_matches_pytorch(torch, ours, theirs, *arrays, rng, rtol=1e-7, atol=0.0,
                           grad_rtol=None, grad_atol=None):
    """Run ``ours`` on NetVars and ``theirs`` on tensors of the same float64 ``arrays``.

    One random seed gradient (from ``rng``) goes back through both; the values (and their shape,
    unless PyTorch's result is a scalar) and every input's gradient must agree, the gradients
    within ``grad_rtol`` / ``grad_atol`` (the value tolerances when not given). Returns the nodes.
    """
    nodes = [nn.NetVar(a) for a in arrays]
    tensors = [torch.tensor(a, requires_grad=True) for a in arrays]
    value, reference = ours(*nodes), theirs(*tensors)
    expected = reference.detach().numpy()
    if expected.ndim:
        assert value.shape == expected.shape
    seed = rng.standard_normal(expected.shape)
    value.back(seed.reshape(value.shape))
    reference.backward(torch.tensor(seed))
    np.testing.assert_allclose(value.data.reshape(expected.shape), expected, rtol=rtol, atol=atol)
    grad_rtol = rtol if grad_rtol is None else grad_rtol
    grad_atol = atol if grad_atol is None else grad_atol
    for node, tensor in zip(nodes, tensors):       # 1-D arrays are (1, n) rows in nnkit
        np.testing.assert_allclose(node.g, tensor.grad.numpy().reshape(node.g.shape),
                                   rtol=grad_rtol, atol=grad_atol)
    return nodes


def assert_honours_the_upstream_gradient(make, node):
    """``make()`` builds a node from ``node``; backpropagating 3·make() must give ``node`` three
    times the gradient that make() alone gives it."""
    node.reset()
    make().back()
    once = node.g.copy()
    node.reset()
    (make() * 3.0).back()
    np.testing.assert_allclose(node.g, 3 * once)


def hessian_vector_products(ours, theirs, arrays, directions):
    """H·v for each input, of the scalar ``ours(*nodes)`` (through ``nn.grad(create_graph=True)``)
    and of ``theirs(*tensors)`` summed (through PyTorch's double backward), as (nnkit's list,
    PyTorch's list) of NumPy arrays, for float64 ``arrays`` and one direction v per array."""
    import torch
    nodes = [nn.NetVar(a) for a in arrays]
    tensors = [torch.tensor(a, requires_grad=True) for a in arrays]
    first = nn.grad(ours(*nodes), nodes, create_graph=True)
    inner = sum((g * v).sum() for g, v in zip(first, directions))
    mine = nn.grad(inner, nodes)
    reference = torch.autograd.grad(theirs(*tensors).sum(), tensors, create_graph=True)
    inner = sum((g * torch.tensor(v)).sum() for g, v in zip(reference, directions))
    expected = torch.autograd.grad(inner, tensors, allow_unused=True)
    expected = [np.zeros_like(a) if e is None else e.numpy() for a, e in zip(arrays, expected)]
    return mine, expected


def assert_same_hvp(ours, theirs, arrays, rng):
    """nnkit's and PyTorch's H·v agree for random directions, to 1e-9 (1-D inputs are (1, n)
    rows in nnkit); every input's H·v must be non-zero, a term a bug would change."""
    directions = [rng.standard_normal(np.shape(a)) for a in arrays]
    mine, expected = hessian_vector_products(ours, theirs, arrays, directions)
    for m, e in zip(mine, expected):
        assert np.abs(e).max() > 1e-3
        np.testing.assert_allclose(m.reshape(e.shape), e, rtol=1e-9, atol=1e-12)


def keep_mask(rng, shape, p=0.6):
    """A random boolean mask of ``shape`` (True = keep, with probability ``p``)."""
    return rng.random(shape) < p
