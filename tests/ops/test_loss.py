"""Regression losses and masks: gradchecks, hand-computed values, upstream gradients."""
import re

import numpy as np
import pytest

import nnkit as nn
from tests.conftest import var64
from tests.ops.helpers import assert_honours_the_upstream_gradient, assert_same_hvp


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


# -- a batch of scalars (B,) is B rows of one value, as (B, 1)

REGRESSION = [nn.L1Loss, nn.L2Loss, nn.HuberLoss, nn.MSELoss]


@pytest.mark.parametrize("loss", REGRESSION)
def test_a_batch_of_scalars_counts_each_value_as_a_row(loss, rng):
    B = 64
    q = nn.NetVar(rng.standard_normal((B, 3)))
    a = rng.integers(0, 3, size=B)
    target = rng.standard_normal(B)
    flat = loss(q[np.arange(B), a], target)                       # q[...] has shape (B,)
    flat.back()
    flat_grad = q.g.copy()
    q.reset()
    column = loss(nn.Reshape(q[np.arange(B), a], B, 1), target.reshape(B, 1))
    column.back()
    assert flat.item() == pytest.approx(column.item(), rel=1e-12)
    np.testing.assert_allclose(q.g, flat_grad, rtol=1e-12)
    r = q.data[np.arange(B), a] - target
    expected = {nn.L1Loss: np.abs(r).mean(), nn.L2Loss: (r * r).mean() / 2,
                nn.MSELoss: (r * r).mean(),
                nn.HuberLoss: np.where(np.abs(r) <= 1, r * r / 2, np.abs(r) - 0.5).mean()}
    assert flat.item() == pytest.approx(expected[loss], rel=1e-12)


@pytest.mark.parametrize("loss", REGRESSION)
def test_regression_losses_gradcheck_on_a_batch_of_scalars_and_on_0d(loss, rng):
    q, t = var64(rng, 5, 3), var64(rng, 1, 5)
    a = rng.integers(0, 3, size=5)
    nn.gradcheck(lambda v, w: loss(v[np.arange(5), a], nn.Reshape(w, 5)), q, t)
    nn.gradcheck(lambda v, w: loss(v[1, 2], w[0, 3]), q, t)           # 0-d: one row
    scalar = loss(q[1, 2], t[0, 3]).item()
    assert scalar == pytest.approx(loss(nn.Reshape(q[1, 2], 1, 1),
                                        nn.Reshape(t[0, 3], 1, 1)).item(), rel=1e-12)


def test_a_batch_of_scalars_matches_pytorch(torch, rng):
    import torch.nn.functional as F
    B = 8
    q, a, t = rng.standard_normal((B, 3)), rng.integers(0, 3, size=B), 2 * rng.standard_normal(B)
    cases = [(nn.L1Loss, F.l1_loss), (nn.MSELoss, F.mse_loss),
             (nn.L2Loss, lambda p, s: F.mse_loss(p, s) / 2),
             (lambda p, s: nn.HuberLoss(p, s, d=0.7), lambda p, s: F.huber_loss(p, s, delta=0.7))]
    for ours, theirs in cases:
        qv, tv = nn.NetVar(q), nn.NetVar(t)                           # tv is a (1, B) row
        qt, tt = torch.tensor(q, requires_grad=True), torch.tensor(t, requires_grad=True)
        value = ours(qv[np.arange(B), a], nn.Reshape(tv, B))
        reference = theirs(qt[torch.arange(B), torch.tensor(a)], tt)
        value.back(np.full((1, 1), 1.5))
        reference.backward(torch.tensor(1.5, dtype=torch.float64))
        assert value.item() == pytest.approx(reference.item(), rel=1e-12)
        np.testing.assert_allclose(qv.g, qt.grad.numpy(), rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(tv.g.reshape(B), tt.grad.numpy(), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("loss", REGRESSION)
def test_a_batch_of_scalars_is_never_broadcast_against_a_column(loss):
    p = nn.Reshape(nn.NetVar(np.zeros(4)), 4)
    name = loss.__name__
    with pytest.raises(ValueError, match=rf"{name}: prediction of shape \(4,\) and target of "
                                         r"shape \(4, 1\) differ"):
        loss(p, np.zeros((4, 1)))
    with pytest.raises(ValueError, match=rf"{name}: prediction of shape \(4, 1\) and target of "
                                         r"shape \(4,\) differ"):
        loss(nn.NetVar(np.zeros((4, 1))), np.zeros(4))


@pytest.mark.parametrize("loss", REGRESSION)
@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (0,)])
def test_an_empty_batch_is_refused(loss, shape):
    name = loss.__name__
    with pytest.raises(ValueError, match=rf"{name}: prediction of shape {re.escape(str(shape))}"
                                         " has no values"):
        loss(nn.constant(np.zeros(shape)), np.zeros(shape))


@pytest.mark.parametrize("loss", REGRESSION)
def test_arrays_are_taken_as_constant_predictions(loss):
    p, t = np.array([[1.0, 2.0]]), np.array([[0.5, 2.0]])
    assert loss(p, t).item() == pytest.approx(loss(nn.NetVar(p), t).item())


@pytest.mark.parametrize("d,error,message", [
    (np.inf, ValueError, "HuberLoss: the threshold d must be finite, got inf"),
    (np.nan, ValueError, "HuberLoss: the threshold d must be finite, got nan"),
    (0, ValueError, "HuberLoss: the threshold d must be > 0, got 0"),
    ("1", TypeError, "HuberLoss: the threshold d must be a number, got str"),
    (None, TypeError, "HuberLoss: the threshold d must be a number, got NoneType")])
def test_huber_threshold_must_be_a_positive_finite_number(d, error, message):
    p = nn.NetVar(np.ones((2, 2)))
    with pytest.raises(error, match=re.escape(message)):
        nn.HuberLoss(p, np.zeros((2, 2)), d=d)


def test_mse_mask_in_another_layout_is_refused(rng):
    T, B, F = 3, 2, 4
    p, t = var64(rng, T, B, F), var64(rng, T, B, F)
    batch_first = np.ones((B, T), dtype=bool)
    batch_first[1, 2] = False
    with pytest.raises(ValueError, match=r"MSELoss: mask of shape \(2, 3\) does not match the "
                                         r"positions \(3, 2\)"):
        nn.MSELoss(p, t, mask=batch_first)
    with pytest.raises(ValueError, match=r"MSELoss: mask of shape \(6,\) does not match"):
        nn.MSELoss(p, t, mask=batch_first.T.reshape(-1))
    column = np.ones((T, B))[..., None]                    # (T, B, 1): the same positions
    assert nn.MSELoss(p, t, mask=column[..., 0]).item() == pytest.approx(
        nn.MSELoss(p, t).item())


def test_mse_mask_values_are_0_or_1(rng):
    p, t = var64(rng, 4, 2), var64(rng, 4, 2)
    with pytest.raises(ValueError, match=r"MSELoss: mask must hold 0/1 or booleans, got 0.5"):
        nn.MSELoss(p, t, mask=np.array([1.0, 0.5, 1.0, 0.0]))
    np.testing.assert_allclose(nn.MSELoss(p, t, mask=np.array([1.0, 1.0, 1.0, 0.0])).item(),
                               ((p.data - t.data)[:3] ** 2).mean())


@pytest.mark.parametrize("lengths,message", [
    (np.array([3, 4]), r"MSELoss: lengths must be integers in \[0, 3\] \(the steps\), got 4"),
    (np.array([3, -1]), r"MSELoss: lengths must be integers in \[0, 3\] \(the steps\), got -1"),
    (np.array([2.5, 1.0]), r"MSELoss: lengths must be integers in \[0, 3\] \(the steps\), "
                           r"got 2.5")])
def test_mse_lengths_outside_the_steps_are_refused(lengths, message, rng):
    p, t = var64(rng, 3, 2, 4), var64(rng, 3, 2, 4)
    with pytest.raises(ValueError, match=message):
        nn.MSELoss(p, t, lengths=lengths)
    as_floats = nn.MSELoss(p, t, lengths=nn.NetVar([3, 1]))      # float32 holding integers
    assert as_floats.item() == pytest.approx(nn.MSELoss(p, t, lengths=np.array([3, 1])).item())


class _DeviceArray(np.ndarray):
    """Stands for a GPU array (it has ``__cuda_array_interface__``): reading it would cost a
    copy. (A subclass of numpy.ndarray by itself is host data: nn.capture records with one.)"""
    __cuda_array_interface__ = {}


def test_value_checks_read_device_data_only_inside_detect_anomaly():
    from nnkit.ops.loss import _check_range
    logits = np.array([[2.0, -1.0]]).view(_DeviceArray)
    _check_range("CELoss", "prediction", logits, 0, 1)        # the normal path reads nothing
    with nn.detect_anomaly(), pytest.raises(ValueError, match=r"CELoss: prediction of shape "
                                                              r"\(1, 2\): values in \[-1, 2\]"):
        _check_range("CELoss", "prediction", logits, 0, 1)
    with pytest.raises(ValueError, match=r"outside \[-inf, 0\]"):
        _check_range("NLLLoss", "log-probabilities", np.array([0.5]), high=0)
    _check_range("CELoss", "prediction", np.array([0.0, np.nan, 1.0]), 0, 1)   # NaN shows anyway


def test_positions_that_do_not_count_count_for_nothing_even_when_not_finite():
    # an ignored or masked position got index 0 and share 0, and ±inf · 0 made the loss NaN
    z = np.random.default_rng(0).standard_normal((3, 4))
    keep = np.array([False, True, True, True])
    logp = nn.LogSoftmax(nn.NetVar(z), mask=keep)          # −inf in column 0
    torch = pytest.importorskip("torch")
    expected = torch.nn.functional.nll_loss(torch.tensor(logp.data), torch.tensor([1, -100, 3]))
    ignored = nn.NLLLoss(logp, np.array([1, -100, 3]), ignore_index=-100)
    np.testing.assert_allclose(ignored.item(), expected.item(), rtol=1e-12)
    masked = nn.NLLLoss(logp, np.array([1, 0, 3]), mask=np.array([True, False, True]))
    np.testing.assert_allclose(masked.item(), expected.item(), rtol=1e-12)
    wild = z.copy()
    wild[1] = np.inf                                       # garbage in a masked row
    x = nn.NetVar(wild)
    loss = nn.SoftmaxCELoss(x, np.array([1, 2, 3]), mask=np.array([True, False, True]))
    loss.back()
    clean = nn.NetVar(z[[0, 2]])
    nn.SoftmaxCELoss(clean, np.array([1, 3])).back()
    np.testing.assert_allclose(loss.item(), nn.SoftmaxCELoss(nn.NetVar(z[[0, 2]]),
                                                             np.array([1, 3])).item())
    np.testing.assert_allclose(x.g[[0, 2]], clean.g, rtol=1e-12)
    assert (x.g[1] == 0).all()
    p = np.zeros((3, 2, 1))
    t = np.full((3, 2, 1), np.nan)
    t[:2, 0] = 1.0
    t[0, 1] = 2.0                                          # lengths 2 and 1, NaN padding
    np.testing.assert_allclose(nn.MSELoss(nn.NetVar(p), t, lengths=[2, 1]).item(), 2.0)
    mse = nn.MSE().update(p, t, mask=np.array([[1, 1], [1, 0], [0, 0]]))
    np.testing.assert_allclose(mse.value, 2.0)


def test_mse_where_the_mask_keeps_nothing_is_nan_with_a_zero_gradient():
    # 0/0 = NaN as in PyTorch, but the gradient 2·m·(p − t)/N is 0, not 0/0
    p = nn.NetVar(np.ones((3, 2, 1)))
    y = nn.MSELoss(p, np.zeros((3, 2, 1)), lengths=np.array([0, 0]))
    y.back()
    assert np.isnan(y.item())
    np.testing.assert_array_equal(p.g, np.zeros((3, 2, 1)))
    (first,) = nn.grad(nn.MSELoss(p, np.zeros((3, 2, 1)), lengths=np.array([0, 0])), [p],
                       create_graph=True)
    np.testing.assert_array_equal(first.data, np.zeros((3, 2, 1)))


def test_a_masked_mse_states_its_valid_positions():
    # the Trainer weighs a batch by them: the epoch's value is then the mean over every valid
    # element (a mask in the loss alone made it weigh padding as well); unmasked, the rows
    p = nn.NetVar(np.ones((3, 2, 2)))
    assert float(nn.MSELoss(p, np.zeros((3, 2, 2)), lengths=np.array([3, 1])).denominator) == 4
    assert nn.MSELoss(p, np.zeros((3, 2, 2))).denominator == 6


# ----------------------------------------------------------------------------- Second derivatives
# Hessian-vector products (grad(create_graph=True)) against PyTorch's double backward in float64,
# with targets that need gradients and lengths.

def test_hvp_of_the_regression_losses_with_targets_that_need_gradients(torch, rng):
    F = torch.nn.functional
    lengths = np.array([3, 1])
    valid = torch.tensor(np.arange(3)[:, None] < lengths[None, :], dtype=torch.float64)[..., None]

    def ours(p, t):
        a, b = p * p, nn.Tanh(t)
        return (nn.L1Loss(a, b) * nn.L2Loss(a, b) + nn.HuberLoss(a * t, b, 0.5) ** 2
                + nn.MSELoss(a, b, lengths=lengths) * nn.MSELoss(b, a))

    def theirs(p, t):
        a, b = p * p, torch.tanh(t)
        B = 6           # rows of (3, 2, 2)
        mse = ((a - b) ** 2 * valid).sum() / (valid.sum() * 2)
        l1 = ((a - b) * torch.sign(a - b)).sum()   # |a − b| (PyTorch's abs: seconds at first)
        return (l1 / B * ((a - b) ** 2).sum() / (2 * B)
                + (F.huber_loss(a * t, b, delta=0.5, reduction="sum") / B) ** 2
                + mse * F.mse_loss(b, a))

    assert_same_hvp(ours, theirs, [rng.standard_normal((3, 2, 2)),
                                   rng.standard_normal((3, 2, 2))], rng)
