"""GD and Adam against their formulas (and PyTorch's Adam when installed)."""
import numpy as np
import pytest

import nnkit as nn


def _quadratic_grads(p):
    """Gradient of Σ p² / 2 + Σ p³ / 3 at p (so it changes from step to step)."""
    return p + p * p


def _run(optimizer_cls, steps=10, **kwargs):
    start = np.array([[0.5, -1.0, 2.0]])
    p = nn.NetVar(start.copy())
    opt = optimizer_cls([p], **kwargs)
    for _ in range(steps):
        loss = (p * p).sum() * 0.5 + (p ** 3).sum() * (1 / 3)
        loss.back()
        opt.step()
    return start, p


def test_gd_momentum_formula():
    start, p = _run(nn.GD, lr=0.1, momentum=0.9)
    ref, m = start.copy(), np.zeros_like(start)
    for _ in range(10):
        m = 0.9 * m + 0.1 * _quadratic_grads(ref)
        ref = ref - 0.1 * m
    np.testing.assert_allclose(p.data, ref, rtol=1e-12)


def test_gd_without_momentum_is_plain_descent():
    start, p = _run(nn.GD, lr=0.05, momentum=0.0)
    ref = start.copy()
    for _ in range(10):
        ref = ref - 0.05 * _quadratic_grads(ref)
    np.testing.assert_allclose(p.data, ref, rtol=1e-12)


def test_adam_formula():
    start, p = _run(nn.Adam, lr=0.01, momentum=0.8, rms=0.99, eps=1e-6)
    ref, m, v = start.copy(), 0.0, 0.0
    for t in range(1, 11):
        g = _quadratic_grads(ref)
        m = 0.8 * m + 0.2 * g
        v = 0.99 * v + 0.01 * g * g
        ref = ref - 0.01 * (m / (1 - 0.8 ** t)) / (np.sqrt(v / (1 - 0.99 ** t)) + 1e-6)
    np.testing.assert_allclose(p.data, ref, rtol=1e-12)


def test_adam_matches_pytorch(torch):
    start, p = _run(nn.Adam, lr=0.01)
    q = torch.tensor(start, requires_grad=True)
    opt = torch.optim.Adam([q], lr=0.01, betas=(0.9, 0.999), eps=1e-8)
    for _ in range(10):
        opt.zero_grad()
        loss = (q * q).sum() * 0.5 + (q ** 3).sum() / 3
        loss.backward()
        opt.step()
    np.testing.assert_allclose(p.data, q.detach().numpy(), rtol=1e-10)


def test_step_resets_gradients_and_learnrate_alias():
    p = nn.NetVar(np.ones((1, 2)))
    opt = nn.GD([p])
    assert opt.learnRate == 0.1
    opt.learnRate = 0.5
    assert opt.lr == 0.5
    (p * p).sum().back()
    opt.step()
    np.testing.assert_array_equal(p.g, np.zeros((1, 2)))


def test_step_without_any_gradient_is_an_error():
    p = nn.NetVar(np.ones((1, 2)))
    with pytest.raises(RuntimeError, match="no parameter has a gradient"):
        nn.Adam([p]).step()


def test_parameters_without_gradient_are_left_alone():
    a, b = nn.NetVar(np.ones((1, 2))), nn.NetVar(np.ones((1, 2)))
    (a * a).sum().back()
    nn.GD([a, b], momentum=0.0).step()
    np.testing.assert_array_equal(b.data, np.ones((1, 2)))
    np.testing.assert_allclose(a.data, np.ones((1, 2)) - 0.2)


def test_bad_parameters_are_rejected():
    with pytest.raises(TypeError, match="parameter 1 is a ndarray"):
        nn.GD([nn.NetVar([1.0]), np.ones(2)])
    with pytest.raises(ValueError, match="momentum"):
        nn.GD([nn.NetVar([1.0])], momentum=1.0)
