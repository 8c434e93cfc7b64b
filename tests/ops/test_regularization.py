"""Dropout (train/eval switch, seeded masks, scaling) and L2Reg (value, gradients, upstream g)."""
import numpy as np
import pytest

import nnkit as nn
from tests.conftest import var64
from tests.ops.helpers import assert_same_hvp


@pytest.mark.parametrize("shape", [(4, 5), (1, 7), (2, 3, 4)])
@pytest.mark.parametrize("p", [0.2, 0.5])
def test_dropout_gradcheck_with_a_fixed_mask(shape, p, rng):
    x = var64(rng, *shape)
    nn.seed(3)
    y = nn.Dropout(x, p)
    mask = y.mask
    assert set(np.unique(mask)) <= {0.0, 1 / (1 - p)}
    np.testing.assert_allclose(y.data, x.data * mask)

    def same_mask(v):           # gradcheck re-runs f: replay the same seed for the same mask
        nn.seed(3)
        return nn.Dropout(v, p)
    nn.gradcheck(same_mask, x)


def test_dropout_scales_to_keep_the_mean_and_is_seeded():
    x = nn.NetVar(np.ones((200, 500)))
    nn.seed(0)
    y = nn.Dropout(x, 0.3)
    assert abs(float((y.data == 0).mean()) - 0.3) < 0.01
    assert abs(float(y.data.mean()) - 1.0) < 0.02
    nn.seed(0)
    np.testing.assert_array_equal(nn.Dropout(x, 0.3).data, y.data)
    y.back()
    np.testing.assert_array_equal(x.g, y.data)          # dx = g · m with g = 1 and x = 1


def test_dropout_is_identity_in_evaluation_and_for_p_zero(rng):
    x = var64(rng, 3, 4)
    with nn.eval_mode():
        assert not nn.is_training()
        y = nn.Dropout(x, 0.9)
        np.testing.assert_array_equal(y.data, x.data)
        y.back()
        np.testing.assert_array_equal(x.g, 1)
    assert nn.is_training()
    with nn.train_mode(False):
        np.testing.assert_array_equal(nn.Dropout(x, 0.5).data, x.data)
    np.testing.assert_array_equal(nn.Dropout(x, 0.0).data, x.data)
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError, match=r"Dropout: p must be in \[0, 1\)"):
            nn.Dropout(x, bad)


def test_dropout_keeps_float32():
    x = nn.NetVar(np.ones((3, 4), dtype=np.float32))
    y = nn.Dropout(x, 0.5)
    y.back()
    assert y.dtype == np.float32 and x.g.dtype == np.float32


@pytest.mark.parametrize("batch_size", [1, 4])
def test_l2reg_value_and_gradcheck(batch_size, rng):
    w1, w2, x = var64(rng, 3, 2), var64(rng, 2), var64(rng, 4, 3)
    r = 0.3

    def f(a, b, inputs):
        return nn.L2Reg((inputs @ a + b).sum(), [a, b], r, batch_size)
    y = f(w1, w2, x)
    base = (x.data @ w1.data + w2.data).sum()
    penalty = (w1.data ** 2).sum() + (w2.data ** 2).sum()
    assert y.item() == pytest.approx(base + r / (2 * batch_size) * penalty)
    nn.gradcheck(f, w1, w2, x)


def test_l2reg_honours_the_upstream_gradient(rng):
    w = var64(rng, 3, 3)
    loss = (w * 2.0).sum()
    (nn.L2Reg(loss, [w], 0.5) * 3.0).back()
    np.testing.assert_allclose(w.g, 3 * (2 + 0.5 * w.data))


def test_l2reg_errors(rng):
    w = var64(rng, 2, 2)
    with pytest.raises(ValueError, match=r"L2Reg: loss must hold one value, got shape \(2, 2\)"):
        nn.L2Reg(w, [w], 0.1)
    with pytest.raises(ValueError, match="L2Reg: the rate r must be >= 0, got -1"):
        nn.L2Reg(w.sum(), [w], -1)
    with pytest.raises(ValueError, match="L2Reg: batch_size must be a positive int"):
        nn.L2Reg(w.sum(), [w], 0.1, batch_size=0)


@pytest.mark.parametrize("p,error,message", [
    ("0.5", TypeError, r"Dropout: p must be a number, got str"),
    (None, TypeError, r"Dropout: p must be a number, got NoneType"),
    (True, TypeError, r"Dropout: p must be a number, got bool"),
    (np.array([0.5]), TypeError, r"Dropout: p must be a number, got ndarray"),
    (float("nan"), ValueError, r"Dropout: p must be finite, got nan"),
])
def test_dropout_p_must_be_a_number_in_range(p, error, message, rng):
    x = var64(rng, 3, 4)
    for mode in (True, False):                      # refused in evaluation too
        with nn.train_mode(mode), pytest.raises(error, match=message):
            nn.Dropout(x, p)


def test_l2reg_refuses_bad_arguments(rng):
    w = var64(rng, 2, 2)
    loss = w.sum()
    with pytest.raises(ValueError, match=r"L2Reg: the rate r must be finite, got inf"):
        nn.L2Reg(loss, [w], float("inf"))
    with pytest.raises(ValueError, match=r"L2Reg: the rate r must be finite, got nan"):
        nn.L2Reg(loss, [w], float("nan"))
    with pytest.raises(TypeError, match=r"L2Reg: the rate r must be a number, got str"):
        nn.L2Reg(loss, [w], "0.1")
    with pytest.raises(TypeError, match=r"L2Reg: params must be a list of NetVars, got int"):
        nn.L2Reg(loss, 3, 0.1)
    with pytest.raises(TypeError, match=r"L2Reg: loss must be a NetVar, got float"):
        nn.L2Reg(1.0, [w], 0.1)
    with pytest.raises(ValueError, match=r"L2Reg: batch_size must be a positive int, got True"):
        nn.L2Reg(loss, [w], 0.1, batch_size=True)


# ----------------------------------------------------------------------------- Second derivatives
# Hessian-vector products (grad(create_graph=True)) against PyTorch's double backward in float64.

def test_hvp_through_dropout_uses_its_stored_mask(torch, rng):
    nn.seed(3)
    x = nn.NetVar(rng.standard_normal((4, 5)))
    mask = nn.Dropout(x, 0.4).mask                  # the mask a Dropout node keeps
    assert (mask == 0).any()

    def ours(x, w):
        nn.seed(3)      # the same draw, so the same mask
        return (nn.Sigmoid(nn.Dropout(x * w, 0.4)) * w).sum()

    def theirs(x, w):
        return (torch.sigmoid(x * w * torch.tensor(mask)) * w).sum()

    assert_same_hvp(ours, theirs, [x.data, rng.standard_normal((1, 5))], rng)


def test_hvp_of_l2_regularisation(torch, rng):
    F = torch.nn.functional

    def ours(x, w, v):
        loss = nn.Softplus(nn.Multiply(x, w)).sum()
        return nn.L2Reg(loss, [w, v], 0.3, batch_size=2) * nn.Sigmoid(v).sum()

    def theirs(x, w, v):
        loss = F.softplus(x @ w).sum()
        return (loss + 0.3 / 4 * ((w * w).sum() + (v * v).sum())) * torch.sigmoid(v).sum()

    assert_same_hvp(ours, theirs, [rng.standard_normal((2, 3)), rng.standard_normal((3, 2)),
                                   rng.standard_normal((1, 2))], rng)
