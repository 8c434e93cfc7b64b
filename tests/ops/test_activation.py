import numpy as np
import pytest

import nnkit as nn
from tests.conftest import var64


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
