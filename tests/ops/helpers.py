"""Checks shared by the op tests: PyTorch as the oracle, and scaling by the upstream gradient."""
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
