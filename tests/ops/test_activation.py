import numpy as np
import pytest

import nnkit as nn
from tests.conftest import var64
from tests.ops.helpers import assert_matches_pytorch


@pytest.mark.parametrize("op", [nn.ReLU, nn.LReLU, nn.Sigmoid, nn.Tanh, nn.SoftMax])
@pytest.mark.parametrize("shape", [(1, 5), (4, 3), (2, 3, 4)])
def test_activation_gradcheck(op, shape, rng):
    x = var64(rng, *shape)
    nn.gradcheck(op, x)


def test_lrelu_slope(rng):
    x = nn.NetVar(np.array([[-2.0, 3.0]]))
    y = nn.LReLU(x, 0.1)
    np.testing.assert_allclose(y.data, [[-0.2, 3.0]])
    y.back()
    np.testing.assert_allclose(x.g, [[0.1, 1.0]])
    nn.gradcheck(lambda v: nn.LReLU(v, 0.2), var64(rng, 3, 3))


def test_sigmoid_and_tanh_are_stable_for_large_inputs():
    x = nn.NetVar(np.array([[-1000.0, -100.0, 0.0, 100.0, 1000.0]]))
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        s = nn.Sigmoid(x)
        t = nn.Tanh(x)
        (s.sum() + t.sum()).back()
    np.testing.assert_allclose(s.data, [[0.0, 3.7200759760208356e-44, 0.5, 1.0, 1.0]])
    np.testing.assert_allclose(t.data, [[-1.0, -1.0, 0.0, 1.0, 1.0]])
    assert np.isfinite(x.g).all()


def test_softmax_uses_the_full_jacobian(rng):
    x = var64(rng, 2, 4)
    y = nn.SoftMax(x)
    seed = rng.standard_normal((2, 4))
    y.back(seed)
    for row in range(2):
        s = y.data[row]
        jacobian = np.diag(s) - np.outer(s, s)
        np.testing.assert_allclose(x.g[row], jacobian.T @ seed[row])
    np.testing.assert_allclose(y.data.sum(axis=-1), 1.0)
    assert nn.Softmax is nn.SoftMax


def test_softmax_large_logits_are_stable():
    y = nn.SoftMax(nn.NetVar(np.array([[1000.0, 1000.0, -1000.0]])))
    np.testing.assert_allclose(y.data, [[0.5, 0.5, 0.0]])


NEW_ACTIVATIONS = [nn.LogSoftmax, nn.ELU, nn.SELU, nn.Softplus, nn.GELU, nn.SiLU, nn.HardTanh]


@pytest.mark.parametrize("op", NEW_ACTIVATIONS)
@pytest.mark.parametrize("shape", [(1, 5), (4, 3), (2, 3, 4)])
def test_new_activation_gradcheck(op, shape, rng):
    x = var64(rng, *shape)
    if op is nn.HardTanh:      # keep finite differences away from the kinks at ±1
        x.data[np.abs(np.abs(x.data) - 1) < 1e-3] += 0.01
    nn.gradcheck(op, x)


def test_activation_options_gradcheck(rng):
    x = var64(rng, 3, 4)
    nn.gradcheck(lambda v: nn.ELU(v, alpha=0.5), x)
    nn.gradcheck(lambda v: nn.HardTanh(v, -0.5, 2.0), x)
    assert nn.Swish is nn.SiLU
    with pytest.raises(ValueError, match=r"HardTanh: lo \(1\) must be below hi \(0\)"):
        nn.HardTanh(x, 1, 0)


def test_new_activations_match_pytorch(torch, rng):
    import torch.nn.functional as F
    data = rng.standard_normal((4, 6)) * 3
    data[0, :2] = [1.0, -1.0]           # HardTanh at its bounds
    cases = [(nn.LogSoftmax, lambda t: F.log_softmax(t, dim=-1)),
             (nn.ELU, F.elu), (lambda v: nn.ELU(v, 0.3), lambda t: F.elu(t, 0.3)),
             (nn.SELU, F.selu), (nn.Softplus, F.softplus),
             (nn.GELU, lambda t: F.gelu(t, approximate="tanh")), (nn.SiLU, F.silu),
             (nn.HardTanh, F.hardtanh),
             (lambda v: nn.HardTanh(v, -0.5, 2.0), lambda t: F.hardtanh(t, -0.5, 2.0))]
    for op, reference in cases:
        assert_matches_pytorch(torch, op, reference, data, rng=rng, rtol=1e-12, atol=1e-12)


def test_softplus_and_log_softmax_are_stable_for_large_inputs():
    x = nn.NetVar(np.array([[-1000.0, -100.0, 0.0, 100.0, 1000.0]]))
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        s = nn.Softplus(x)
        ls = nn.LogSoftmax(x)
        e = nn.ELU(x)
        (s.sum() + ls.sum() + e.sum() + nn.SiLU(x).sum() + nn.GELU(x).sum()).back()
    np.testing.assert_allclose(s.data, [[0.0, 3.7200759760208356e-44, np.log(2), 100, 1000]])
    np.testing.assert_allclose(ls.data, [[-2000, -1100, -1000, -900, 0]])
    assert np.isfinite(x.g).all()


def test_new_activations_keep_float32(rng):
    x = nn.NetVar(rng.standard_normal((3, 4)).astype(np.float32))
    for op in NEW_ACTIVATIONS:
        x.reset()
        y = op(x)
        y.back()
        assert y.dtype == np.float32 and x.g.dtype == np.float32, op.__name__


@pytest.mark.parametrize("make,error,message", [
    (lambda x: nn.LReLU(x, "0.1"), TypeError, r"LReLU: the slope s must be a number, got str"),
    (lambda x: nn.LReLU(x, True), TypeError, r"LReLU: the slope s must be a number, got bool"),
    (lambda x: nn.LReLU(x, np.array([0.1])), TypeError,
     r"LReLU: the slope s must be a number, got ndarray"),
    (lambda x: nn.LReLU(x, float("nan")), ValueError, r"LReLU: the slope s must be finite"),
    (lambda x: nn.ELU(x, "1"), TypeError, r"ELU: alpha must be a number, got str"),
    (lambda x: nn.ELU(x, float("inf")), ValueError, r"ELU: alpha must be finite, got inf"),
    (lambda x: nn.HardTanh(x, "-1"), TypeError, r"HardTanh: lo must be a number, got str"),
    (lambda x: nn.HardTanh(x, -1.0, None), TypeError, r"HardTanh: hi must be a number, got "
                                                      r"NoneType"),
    (lambda x: nn.HardTanh(x, float("nan"), 1.0), ValueError,
     r"HardTanh: lo \(nan\) must be below hi \(1\)"),
    (lambda x: nn.HardTanh(x, -1.0, float("nan")), ValueError,
     r"HardTanh: lo \(-1\) must be below hi \(nan\)"),
    (lambda x: nn.HardTanh(x, np.zeros(4), 1.0), TypeError,
     r"HardTanh: lo must be a number, got ndarray"),
])
def test_activation_hyperparameters_must_be_numbers(make, error, message, rng):
    with pytest.raises(error, match=message):
        make(var64(rng, 3, 4))


def test_activation_hyperparameters_accept_numpy_numbers(rng):
    x = var64(rng, 3, 4)
    np.testing.assert_allclose(nn.LReLU(x, np.float32(0.25)).data, nn.LReLU(x, 0.25).data)
    np.testing.assert_allclose(nn.HardTanh(x, np.int64(-1), np.float64(0.5)).data,
                               np.clip(x.data, -1, 0.5))
    np.testing.assert_allclose(nn.HardTanh(x, -np.inf, 0.5).data, np.minimum(x.data, 0.5))


def test_saturated_sigmoid_gates_and_elu_gradients_keep_their_digits():
    # the fused ops computed σ(a) as (1 + tanh(a/2)) / 2 and ELU's gradient as g · (y + α):
    # both cancel for very negative inputs (0 at a = −20 in float32, 44 % off at −17)
    a = np.array([[-10.0, -17.0, -20.0, -40.0]], dtype=np.float32)
    exact = 1 / (1 + np.exp(-a.astype(np.float64)))
    y = nn.RNN(nn.NetVar(a.reshape(4, 1, 1)), nn.NetVar(np.ones((1, 1), np.float32)),
               nn.NetVar(np.zeros((1, 1), np.float32)), nn.NetVar(np.zeros((1, 1), np.float32)),
               activation="sigmoid")
    np.testing.assert_allclose(y.data.reshape(1, 4), exact, rtol=1e-6)
    x = nn.NetVar(a)
    nn.ELU(x).sum().back()
    np.testing.assert_allclose(x.g, np.exp(a.astype(np.float64)), rtol=1e-6)
    s = nn.NetVar(a)
    nn.SELU(s).sum().back()
    np.testing.assert_allclose(s.g, 1.0507009873554805 * 1.6732632423543772
                               * np.exp(a.astype(np.float64)), rtol=1e-6)


@pytest.mark.parametrize("op, slope", [(nn.ELU, 1.0), (nn.SELU, 1.0507009873554805)])
def test_elu_at_infinity_has_its_slope_to_second_order(op, slope):
    # the rule for grad(create_graph=True) took e^(x · 0) for x > 0: e^(inf · 0) = NaN
    x = nn.NetVar(np.array([[np.inf, 1.0, -np.inf]]))
    (first,) = nn.grad(op(x).sum(), [x], create_graph=True)
    np.testing.assert_array_equal(first.data, [[slope, slope, 0.0]])
    (second,) = nn.grad(first.sum(), [x])
    np.testing.assert_array_equal(second, [[0.0, 0.0, 0.0]])


def test_gelu_of_a_0d_node_and_its_gradient():
    # GELU computes in place in arrays it makes with out=: an operator on a 0-d array would
    # give a NumPy scalar, which cannot be written in place
    x = nn.NetVar(np.array([[0.7, -0.2]]))
    s = x.sum()
    assert s.shape == ()
    y = nn.GELU(s)
    y.back()
    c, k, v = np.sqrt(2 / np.pi), 0.044715, 0.5
    t = np.tanh(c * (v + k * v ** 3))
    np.testing.assert_allclose(y.data, 0.5 * v * (1 + t), rtol=1e-14)
    slope = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * c * (1 + 3 * k * v * v)
    np.testing.assert_allclose(x.g, [[slope, slope]], rtol=1e-14)


def test_gelu_gradient_is_the_derivative_across_its_range(rng):
    # the hand-derived slope against a central difference, float64, far out on both sides
    x = np.concatenate([np.linspace(-8, 8, 41), [-30.0, 30.0, 0.0]])[None, :]
    node = nn.NetVar(x.copy())
    nn.GELU(node).back()
    h = 1e-6
    numeric = (nn.GELU(nn.NetVar(x + h)).data - nn.GELU(nn.NetVar(x - h)).data) / (2 * h)
    np.testing.assert_allclose(node.g, numeric, rtol=1e-7, atol=1e-9)
