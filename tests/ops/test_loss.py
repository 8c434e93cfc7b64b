"""Regression losses and masks: gradchecks, hand-computed values, upstream gradients."""
import numpy as np
import pytest

import nnkit as nn
from tests.conftest import var64
from tests.ops.helpers import assert_honours_the_upstream_gradient


def test_l1_l2_huber_values():
    p = nn.NetVar(np.array([[1.0, 2.0], [3.0, -1.0]]))
    t = np.array([[0.0, 2.0], [1.0, 2.0]])
    assert nn.L1Loss(p, t).item() == pytest.approx((1 + 0 + 2 + 3) / 2)
    assert nn.L2Loss(p, t).item() == pytest.approx((1 + 0 + 4 + 9) / 4)
    # huber_1: r = 1 -> 0.5, 0 -> 0, 2 -> 1.5, -3 -> 2.5
    assert nn.HuberLoss(p, t).item() == pytest.approx((0.5 + 0 + 1.5 + 2.5) / 2)
    assert nn.MSELoss(p, t).item() == pytest.approx((1 + 0 + 4 + 9) / 4)
    assert nn.L2Loss(p, t).shape == (1, 1)


@pytest.mark.parametrize("loss", [nn.L1Loss, nn.L2Loss, nn.HuberLoss, nn.MSELoss])
@pytest.mark.parametrize("shape", [(4, 3), (1, 5), (2, 3, 2)])
def test_regression_losses_gradcheck(loss, shape, rng):
    p, t = var64(rng, *shape), var64(rng, *shape)
    nn.gradcheck(loss, p, t)


def test_huber_threshold_gradcheck(rng):
    p, t = var64(rng, 4, 3), var64(rng, 4, 3)
    nn.gradcheck(lambda a, b: nn.HuberLoss(a, b, d=0.3), p, t)


@pytest.mark.parametrize("loss", [nn.L1Loss, nn.L2Loss, nn.HuberLoss, nn.MSELoss])
def test_losses_honour_the_upstream_gradient(loss, rng):
    p = nn.NetVar(np.abs(rng.standard_normal((3, 4))) + 0.1)
    assert_honours_the_upstream_gradient(lambda: loss(p, np.eye(4)[[0, 2, 1]]), p)


def test_loss_shape_mismatch_names_the_loss():
    with pytest.raises(ValueError, match=r"L2Loss: prediction of shape \(2, 3\) and target of "
                                         r"shape \(2, 2\) differ"):
        nn.L2Loss(nn.NetVar(np.ones((2, 3))), np.ones((2, 2)))


def test_mse_mask_normaliser(rng):
    T, B, F = 3, 2, 4
    p, t = var64(rng, T, B, F), var64(rng, T, B, F)
    lengths = np.array([3, 1])
    mask = (np.arange(T)[:, None] < lengths[None, :])
    expected = (((p.data - t.data) ** 2) * mask[..., None]).sum() / (mask.sum() * F)
    assert nn.MSELoss(p, t, lengths=lengths).item() == pytest.approx(expected)
    assert nn.MSELoss(p, t, mask=mask).item() == pytest.approx(expected)
    nn.gradcheck(lambda a, b: nn.MSELoss(a, b, mask=mask), p, t)
