"""float16 nodes: ops that square or cube their input compute in float32 and give float16, so
values above √65504 ≈ 256 (float16's largest number is 65504) neither overflow to inf nor make
NaN gradients where the result fits in float16."""
import numpy as np
import pytest

import nnkit as nn


def _value_and_grad(build, *arrays):
    nodes = [nn.NetVar(a) for a in arrays]
    y = build(*nodes)
    y.sum().back()
    return y.data, [node.g for node in nodes]


def _like(x, values):
    """A constant in x's dtype (an unequal weight for each output in the summed loss)."""
    return nn.NetVar(np.array(values, dtype=x.data.dtype), requires_grad=False)


CASES = {
    "Norm": (lambda x: nn.Norm(x, axis=1), [np.array([[300.0, 400.0], [3.0, -4.0]])]),
    "CosineSimilarity": (lambda a, b: nn.CosineSimilarity(a, b),
                         [np.array([[300.0, 400.0], [0.5, 2.0]]),
                          np.array([[400.0, -300.0], [280.0, 120.0]])]),
    # |x − x̄| = 320: its square overflows; the variance (25600) fits
    "Var": (lambda x: nn.Var(x, axis=1) * _like(x, [[1.0], [-2.0]]),
            [np.array([[400.0, 0.0, 0.0, 0.0, 0.0], [1.0, 2.0, -1.0, 0.5, 3.0]])]),
    "GELU": (nn.GELU, [np.array([[-300.0, -50.0, -3.0, 0.5, 3.0, 50.0, 300.0]])]),
    # σ ≈ 400: σ² overflows; x̂ and 1/σ fit
    "LayerNorm": (lambda x, g: nn.LayerNorm(x, g) * _like(x, [1.0, -2.0, 0.5, 3.0]),
                  [np.array([[300.0, -500.0, 120.0, 700.0], [1.0, 2.0, -1.0, 0.5]]),
                   np.array([1.5, 0.5, 1.0, 2.0])]),
    "BatchNorm": (lambda x, g: nn.BatchNorm(x, g, None, nn.BatchNormState(2))
                  * _like(x, [[1.0, -2.0], [0.5, 3.0], [2.0, 1.0]]),
                  [np.array([[300.0, 1.0], [-500.0, 2.0], [700.0, -1.0]]),
                   np.array([1.5, 0.5])]),
}


@pytest.mark.parametrize("name", CASES)
def test_float16_ops_that_square_their_input_stay_finite_and_right(name):
    build, arrays = CASES[name]
    expected, expected_grads = _value_and_grad(build, *arrays)            # float64
    with np.errstate(over="raise", invalid="raise"):        # no overflow on the way
        value, grads = _value_and_grad(build, *[a.astype(np.float16) for a in arrays])
    assert value.dtype == np.float16 and all(g.dtype == np.float16 for g in grads)
    np.testing.assert_allclose(value.astype(np.float64), expected, rtol=2e-3, atol=1e-3)
    for g, e in zip(grads, expected_grads):
        np.testing.assert_allclose(g.astype(np.float64), e, rtol=5e-3, atol=1e-4)


@pytest.mark.parametrize("name", CASES)
def test_float16_gradients_from_create_graph_equal_backs(name):
    # the rules grad(create_graph=True) differentiates squared in float16 for CosineSimilarity,
    # LayerNorm and BatchNorm (inf or 0 where back() was right); they compute in float32 too
    build, arrays = CASES[name]
    value, grads = _value_and_grad(build, *[a.astype(np.float16) for a in arrays])
    nodes = [nn.NetVar(a.astype(np.float16)) for a in arrays]
    with np.errstate(over="raise", invalid="raise"):
        found = nn.grad(build(*nodes).sum(), nodes, create_graph=True)
    for g, e in zip(found, grads):
        assert g.dtype == np.float16
        np.testing.assert_allclose(g.data.astype(np.float64), e.astype(np.float64),
                                   rtol=1e-2, atol=1e-4)


def test_astype_casts_the_value_and_the_gradient_back():
    x = nn.NetVar(np.array([[1.5, -2.0, 300.0]], np.float16))
    y = x.astype(np.float32)
    assert y.dtype == np.float32
    (y * y).sum().back()                 # 2x: 600 fits float16, x² in float32 would not
    assert x.g.dtype == np.float16
    np.testing.assert_array_equal(x.g, [[3.0, -4.0, 600.0]])
    (first,) = nn.grad((x.astype(np.float32) * x.astype(np.float32)).sum(), [x],
                       create_graph=True)
    assert first.dtype == np.float16
    np.testing.assert_array_equal(first.data, x.g)
    with pytest.raises(TypeError, match="AsType: dtype must be a float dtype, got int64"):
        x.astype(np.int64)


def test_celoss_of_float16_differentiates_twice_in_float32():
    # its rule for grad(create_graph=True) divided by eps = 1e-12, which is 0 in float16
    p = nn.NetVar(np.array([[0.0, 0.3, 0.7]], np.float16))
    t = np.array([[0.0, 1.0, 0.0]], np.float16)
    nn.CELoss(p, t).back()
    (first,) = nn.grad(nn.CELoss(p, t), [p], create_graph=True)
    assert first.dtype == np.float16 and np.isfinite(first.data).all()
    np.testing.assert_array_equal(first.data, p.g)



# Means over more elements than float16 counts (its largest number is 65504): the sum overflowed
# to inf, or the count became inf, and the loss or its gradient came out inf, NaN or 0.
N = 70_000
_rng = np.random.default_rng(7)
_P, _T = _rng.random((N, 2)), _rng.random((N, 2))
_Q = _T / _T.sum(1, keepdims=True)
_LABELS = np.arange(N) % 2
MEANS = {
    "Mean": lambda p: nn.Mean(p),
    "Mean over rows": lambda p: nn.Mean(p, axis=0) * _like(p, [1.0, -2.0]),
    "L1Loss": lambda p: nn.L1Loss(p, _T.astype(p.data.dtype)),
    "L2Loss": lambda p: nn.L2Loss(p, _T.astype(p.data.dtype)),
    "HuberLoss": lambda p: nn.HuberLoss(p, 3 * _T.astype(p.data.dtype)),
    "MSELoss": lambda p: nn.MSELoss(p, _T.astype(p.data.dtype)),
    "MSELoss masked": lambda p: nn.MSELoss(p, _T.astype(p.data.dtype), mask=_LABELS < 5),
    "SigmoidCELoss": lambda p: nn.SigmoidCELoss(p, _T.astype(p.data.dtype)),
    "KLDivLoss": lambda p: nn.KLDivLoss(nn.LogSoftmax(p), _Q.astype(p.data.dtype)),
    "SoftmaxCELoss": lambda p: nn.SoftmaxCELoss(p, _LABELS),
    "NLLLoss": lambda p: nn.NLLLoss(nn.LogSoftmax(p), _LABELS),
}


@pytest.mark.parametrize("name", MEANS)
def test_a_float16_mean_over_more_elements_than_float16_counts(name):
    build = MEANS[name]
    expected, (expected_grad,) = _value_and_grad(build, _P)                # float64
    value, (grad,) = _value_and_grad(build, _P.astype(np.float16))
    assert value.dtype == np.float16 and grad.dtype == np.float16
    np.testing.assert_allclose(value.astype(np.float64), expected, rtol=2e-3)
    # each element's gradient is about 1/N = 1.4e-5, a float16 subnormal: compared in all
    total = np.abs(expected_grad).sum()
    assert abs(np.abs(grad.astype(np.float64)).sum() - total) < 5e-3 * total
    assert np.abs(grad.astype(np.float64) - expected_grad).sum() < 2e-2 * total
    node = nn.NetVar(_P.astype(np.float16))
    found, = nn.grad(build(node).sum(), [node], create_graph=True)
    assert found.dtype == np.float16
    assert np.abs(found.data.astype(np.float64) - grad).sum() < 2e-2 * total


def test_float16_counts_the_positions_of_a_class_index_loss():
    y = nn.SoftmaxCELoss(nn.NetVar(np.zeros((N, 2), np.float16)), _LABELS)
    assert y.denominator == N               # 70,000 weights of 1 summed to inf in float16


def test_layer_norm_of_float16_sums_its_rows_in_float32():
    """Its backward's row sums over 4,096 features of an upstream gradient of 10 and more pass
    65504: summed in float16 they were inf, and so was every gradient."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 4096))
    g = np.abs(rng.standard_normal((3, 4096))) * 30 + 10
    grads = []
    for dtype in (np.float64, np.float16):
        node = nn.NetVar(x.astype(dtype))
        nn.LayerNorm(node).back(g.astype(dtype))
        assert node.g.dtype == dtype
        grads.append(node.g.astype(np.float64))
    assert np.isfinite(grads[1]).all()
    np.testing.assert_allclose(grads[1], grads[0], atol=0.05 * np.abs(grads[0]).max())


_W = np.random.default_rng(1).standard_normal((5000, 3))      # weights along the long axis


def _weights(x, transpose=False):
    return nn.NetVar((_W.T if transpose else _W).astype(x.data.dtype), requires_grad=False)


LONG_AXIS = {       # a long axis summed in float16 (2048 + 1 = 2048) went wrong silently
    "SoftMax axis 0": lambda x: nn.SoftMax(x, axis=0) * _weights(x),
    "SoftMax axis -1": lambda x: nn.SoftMax(x.T, axis=-1) * _weights(x, True),
    "LogSoftmax axis 0": lambda x: nn.LogSoftmax(x, axis=0) * _weights(x),
    "LogSoftmax axis -1": lambda x: nn.LogSoftmax(x.T) * _weights(x, True),
    "LogSumExp axis 0": lambda x: nn.LogSumExp(x, axis=0) * _like(x, [1.0, -2.0, 0.5]),
    "Sum axis 0": lambda x: nn.Sum(x, axis=0) * _like(x, [1.0, -2.0, 0.5]),
}


@pytest.mark.parametrize("name", LONG_AXIS)
def test_float16_sums_over_a_long_axis_in_float32(name):
    # softmaxes along axis 0 of (5000, 3) summed to 1.7; LogSumExp gave 7.95 for 8.52
    x = np.random.default_rng(0).normal(0, 0.1, (5000, 3))
    expected, (expected_grad,) = _value_and_grad(LONG_AXIS[name], x)
    value, (grad,) = _value_and_grad(LONG_AXIS[name], x.astype(np.float16))
    assert value.dtype == grad.dtype == np.float16
    scale = np.abs(expected).max()
    np.testing.assert_allclose(value.astype(np.float64), expected, atol=4e-3 * scale)
    np.testing.assert_allclose(grad.astype(np.float64), expected_grad,
                               atol=4e-3 * np.abs(expected_grad).max())


def test_float16_attention_scales_before_its_scores_overflow():
    # q·k = 102,400 overflows float16, the scaled score 12,800 does not: NaN when d >= Tk
    q = np.full((1, 2, 64), 40.0)
    v = np.random.default_rng(0).standard_normal((1, 2, 3))
    expected = nn.Attention(nn.NetVar(q), nn.NetVar(q), nn.NetVar(v)).data
    found = nn.Attention(*(nn.NetVar(a.astype(np.float16)) for a in (q, q, v))).data
    assert found.dtype == np.float16
    np.testing.assert_allclose(found.astype(np.float64), expected, atol=2e-3)
