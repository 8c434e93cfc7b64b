"""Classification losses: gradchecks, hand-computed values, upstream gradients, masks, weights
and PyTorch parity."""
import re

import numpy as np
import pytest

import nnkit as nn
from tests.conftest import var64
from tests.ops.helpers import (assert_honours_the_upstream_gradient, assert_matches_pytorch,
                               assert_same_hvp)


def test_ce_loss_gradcheck_and_finite_at_zero(rng):
    p = nn.SoftMax(var64(rng, 3, 4))
    t = nn.SoftMax(var64(rng, 3, 4))
    assert nn.CELoss(p, t).item() == pytest.approx(-(t.data * np.log(p.data)).sum() / 3)
    nn.gradcheck(lambda z, s: nn.CELoss(nn.SoftMax(z), nn.SoftMax(s)),
                 var64(rng, 3, 4), var64(rng, 3, 4))
    p0 = nn.NetVar(np.array([[0.0, 1.0]]))
    zero = nn.CELoss(p0, np.array([[1.0, 0.0]]))
    assert np.isfinite(zero.item())
    assert zero.item() == pytest.approx(-np.log(1e-12))     # p = 0 is read as ε = 1e-12
    zero.back()
    np.testing.assert_allclose(p0.g, [[-1e12, 0.0]])
    assert p.shape == t.shape


@pytest.mark.parametrize("loss", [nn.CELoss, nn.SoftmaxCELoss])
def test_losses_honour_the_upstream_gradient(loss, rng):
    p = nn.NetVar(rng.random((3, 4)) * 0.9 + 0.05)
    assert_honours_the_upstream_gradient(lambda: loss(p, np.eye(4)[[0, 2, 1]]), p)


@pytest.mark.parametrize("shape", [(5, 4), (1, 3), (3, 2, 4)])
def test_softmax_ce_gradcheck_indices_and_probabilities(shape, rng):
    z = var64(rng, *shape)
    labels = rng.integers(0, shape[-1], size=shape[:-1])
    nn.gradcheck(lambda v: nn.SoftmaxCELoss(v, labels), z)
    probs = rng.random(shape)
    probs /= probs.sum(-1, keepdims=True)
    nn.gradcheck(lambda v, t: nn.SoftmaxCELoss(v, t), z, nn.constant(probs))
    target = nn.NetVar(probs)
    nn.gradcheck(lambda v, t: nn.SoftmaxCELoss(v, t), z, target)


def test_softmax_ce_fused_gradient_and_stability():
    z = nn.NetVar(np.array([[1000.0, 0.0, -1000.0], [0.0, 0.0, 0.0]]))
    loss = nn.SoftmaxCELoss(z, np.array([0, 2]))
    assert loss.item() == pytest.approx(np.log(3) / 2)
    loss.back()
    softmax = np.array([[1.0, 0.0, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    onehot = np.array([[1.0, 0, 0], [0, 0, 1.0]])
    np.testing.assert_allclose(z.g, (softmax - onehot) / 2, atol=1e-12)


def test_softmax_ce_accepts_row_promoted_labels():
    z = nn.NetVar(np.zeros((3, 2)))
    labels = nn.NetVar([0, 1, 1], dtype=int)
    assert nn.SoftmaxCELoss(z, labels).item() == pytest.approx(np.log(2))


def test_softmax_ce_errors():
    z = nn.NetVar(np.zeros((3, 4)))
    with pytest.raises(ValueError, match="class index 7 is out of range for 4 classes"):
        nn.SoftmaxCELoss(z, np.array([0, 7, 1]))
    for negative in (-1, np.iinfo(np.int64).min):      # read as unsigned: both ends at once
        with pytest.raises(ValueError, match=f"class index {negative} is out of range"):
            nn.SoftmaxCELoss(z, np.array([0, negative, 1]))
        with pytest.raises(ValueError, match=f"class index {negative} is out of range"):
            nn.SoftmaxCELoss(z, np.array([0, negative, 1]), mask=np.ones(3, bool))
    with pytest.raises(ValueError, match=r"class indices of shape \(2,\)"):
        nn.SoftmaxCELoss(z, np.array([0, 1]))
    with pytest.raises(ValueError, match="integer dtype"):
        nn.SoftmaxCELoss(z, np.array([0.0, 1.0, 2.0]))


def test_softmax_ce_mask_and_lengths_average_valid_positions(rng):
    T, B, C = 4, 3, 5
    z = var64(rng, T, B, C)
    labels = rng.integers(0, C, size=(T, B))
    lengths = np.array([4, 1, 2])
    mask = np.arange(T)[:, None] < lengths[None, :]
    masked = nn.SoftmaxCELoss(z, labels, lengths=lengths)
    # reference: mean over the valid positions only
    zd = z.data - z.data.max(-1, keepdims=True)
    logp = zd - np.log(np.exp(zd).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp, labels[..., None], -1)[..., 0]
    assert masked.item() == pytest.approx(-(picked * mask).sum() / mask.sum())
    assert nn.SoftmaxCELoss(z, labels, mask=mask).item() == pytest.approx(masked.item())
    masked.back()
    assert np.all(z.g[~mask] == 0)
    nn.gradcheck(lambda v: nn.SoftmaxCELoss(v, labels, lengths=lengths), z)


def test_softmax_ce_matches_pytorch(torch, rng):
    import torch.nn.functional as F
    N, C = 7, 5
    z = rng.standard_normal((N, C))
    labels = rng.integers(0, C, size=N)
    labels[2] = -100
    weight = rng.random(C) + 0.5
    cases = [dict(), dict(weight=weight), dict(ignore_index=-100, weight=weight)]
    for options in cases:
        lab = labels if "ignore_index" in options else np.where(labels < 0, 0, labels)
        kwargs = {k: torch.tensor(v) if k == "weight" else v for k, v in options.items()}
        assert_matches_pytorch(torch, lambda a: nn.SoftmaxCELoss(a, lab, **options),
                               lambda a: F.cross_entropy(a, torch.tensor(lab), **kwargs), z,
                               rng=rng, rtol=1e-10, grad_rtol=1e-7, grad_atol=1e-12)
    probs = rng.random((N, C))
    probs /= probs.sum(1, keepdims=True)
    assert_matches_pytorch(torch, lambda a, t: nn.SoftmaxCELoss(a, t, weight=weight),
                           lambda a, t: F.cross_entropy(a, t, weight=torch.tensor(weight)),
                           z, probs, rng=rng, rtol=1e-10, grad_rtol=1e-7, grad_atol=1e-12)


@pytest.mark.parametrize("shape", [(4, 3), (1, 5), (2, 3, 2)])
def test_sigmoid_ce_gradcheck(shape, rng):
    z = var64(rng, *shape)
    t = nn.NetVar(rng.random(shape))
    nn.gradcheck(nn.SigmoidCELoss, z, t)
    weight = rng.random(shape[-1:]) + 0.5
    nn.gradcheck(lambda a, b: nn.SigmoidCELoss(a, b, weight=weight), z, t)


def test_sigmoid_ce_is_stable_for_large_logits():
    z = nn.NetVar(np.array([[-1000.0, -150.0, 0.0, 150.0, 1000.0]]))
    t = np.array([[0.0, 1.0, 1.0, 0.0, 1.0]])
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        loss = nn.SigmoidCELoss(z, t)
        loss.back()
    assert loss.item() == pytest.approx((150 + np.log(2) + 150) / 5)
    np.testing.assert_allclose(z.g, [[0, -0.2, -0.1, 0.2, 0]], atol=1e-15)
    nn.gradcheck(lambda v: nn.SigmoidCELoss(v, t), nn.NetVar(np.array([[-120.0, -101.0, 0.5,
                                                                        101.0, 130.0]])))
    with pytest.raises(ValueError, match=r"SigmoidCELoss: weight of shape \(3,\) does not"):
        nn.SigmoidCELoss(z, t, weight=np.ones(3))


@pytest.mark.parametrize("shape", [(5, 4), (1, 3), (3, 2, 4)])
def test_nll_loss_gradcheck_and_equals_softmax_ce(shape, rng):
    z = var64(rng, *shape)
    labels = rng.integers(0, shape[-1], size=shape[:-1])
    weight = rng.random(shape[-1]) + 0.5
    nn.gradcheck(lambda v: nn.NLLLoss(nn.LogSoftmax(v), labels, weight=weight), z)
    for options in (dict(), dict(weight=weight)):
        fused = nn.SoftmaxCELoss(z, labels, **options).item()
        assert nn.NLLLoss(nn.LogSoftmax(z), labels, **options).item() == pytest.approx(fused)
    if len(shape) == 3:
        lengths = np.array([2, 1])[: shape[1]]
        assert nn.NLLLoss(nn.LogSoftmax(z), labels, lengths=lengths).item() == pytest.approx(
            nn.SoftmaxCELoss(z, labels, lengths=lengths).item())


def test_nll_loss_repeated_and_ignored_targets():
    logp = nn.NetVar(np.log(np.array([[0.5, 0.5], [0.25, 0.75], [0.9, 0.1]])))
    loss = nn.NLLLoss(logp, np.array([1, 1, 0]), ignore_index=0)
    assert loss.item() == pytest.approx(-(np.log(0.5) + np.log(0.75)) / 2)
    loss.back()
    np.testing.assert_allclose(logp.g, [[0, -0.5], [0, -0.5], [0, 0]])
    with pytest.raises(ValueError, match="NLLLoss: class index 2 is out of range for 2 classes"):
        nn.NLLLoss(logp, np.array([0, 2, 1]))
    with pytest.raises(ValueError, match="NLLLoss: targets must be class indices"):
        nn.NLLLoss(logp, np.array([0.0, 1.0, 1.0]))


def test_class_index_losses_pick_each_positions_target_in_any_memory_layout(rng):
    # log-probabilities in a transposed (non-contiguous) array of (T, B, C) layout: the picked
    # entries and the gradient land at [t, b, label[t, b]], whatever the memory order
    T, B, C = 3, 4, 5
    stored = np.log(rng.dirichlet(np.ones(C), size=(B, T))).transpose(1, 0, 2)    # (T, B, C)
    assert not stored.flags.c_contiguous
    labels = rng.integers(0, C, size=(T, B))
    expected = -np.mean([stored[t, b, labels[t, b]] for t in range(T) for b in range(B)])
    logp = nn.NetVar(stored)
    loss = nn.NLLLoss(logp, labels)
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    loss.back()
    onehot = np.zeros((T, B, C))
    for t in range(T):
        for b in range(B):
            onehot[t, b, labels[t, b]] = 1
    np.testing.assert_allclose(logp.g, -onehot / (T * B), rtol=0, atol=1e-15)
    z = nn.NetVar(stored * 3.0)            # logits: softmax(3·logp) against the same labels
    loss = nn.SoftmaxCELoss(z, labels)
    shifted = 3.0 * stored - np.log(np.exp(3.0 * stored).sum(-1, keepdims=True))
    assert loss.item() == pytest.approx(
        -np.mean([shifted[t, b, labels[t, b]] for t in range(T) for b in range(B)]), rel=1e-12)
    loss.back()
    np.testing.assert_allclose(z.g, (np.exp(shifted) - onehot) / (T * B), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("reduction", ["batchmean", "mean", "sum"])
@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 2)])
def test_kl_div_gradcheck(reduction, shape, rng):
    x = nn.NetVar(np.log(rng.dirichlet(np.ones(shape[-1]), size=shape[:-1])))
    p = nn.NetVar(rng.dirichlet(np.ones(shape[-1]), size=shape[:-1]))
    nn.gradcheck(lambda a, b: nn.KLDivLoss(a, b, reduction), x, p)


def test_kl_div_is_zero_for_equal_distributions_and_skips_zero_targets():
    p = np.array([[0.2, 0.8, 0.0], [0.5, 0.25, 0.25]])
    x = nn.NetVar(np.log(np.where(p > 0, p, 0.3)))
    loss = nn.KLDivLoss(x, p)
    assert loss.item() == pytest.approx(0.0, abs=1e-15)
    loss.back()
    np.testing.assert_allclose(x.g, -p / 2)
    with pytest.raises(ValueError, match="KLDivLoss: reduction must be one of"):
        nn.KLDivLoss(x, p, reduction="none")


def test_logit_and_distribution_losses_honour_the_upstream_gradient(rng):
    z = nn.NetVar(np.log(rng.dirichlet(np.ones(4), size=3)))      # log-probabilities
    cases = [lambda: nn.SigmoidCELoss(z, rng_t), lambda: nn.NLLLoss(z, np.array([0, 3, 1])),
             lambda: nn.KLDivLoss(z, rng_t)]
    rng_t = rng.random((3, 4))
    for make in cases:
        assert_honours_the_upstream_gradient(make, z)


@pytest.mark.filterwarnings("ignore:reduction. 'mean' divides:UserWarning")
def test_sigmoid_nll_kl_match_pytorch(torch, rng):
    import torch.nn.functional as F
    N, C = 6, 4
    z = rng.standard_normal((N, C)) * 3
    probs = rng.random((N, C))
    labels = rng.integers(0, C, size=N)
    labels[[1, 4]] = 2
    weight = rng.random(C) + 0.5
    logq = np.log(rng.dirichlet(np.ones(C), size=N))
    target = rng.dirichlet(np.ones(C), size=N)

    def compare(ours, theirs, *arrays):
        assert_matches_pytorch(torch, ours, theirs, *arrays, rng=rng, rtol=1e-10,
                               grad_rtol=1e-9, grad_atol=1e-12)

    compare(nn.SigmoidCELoss, F.binary_cross_entropy_with_logits, z, probs)
    compare(lambda a, t: nn.SigmoidCELoss(a, t, weight=weight),
            lambda a, t: F.binary_cross_entropy_with_logits(a, t, weight=torch.tensor(weight)),
            z, probs)
    for options in (dict(), dict(weight=weight), dict(weight=weight, ignore_index=2),
                    dict(ignore_index=2)):
        torch_options = {k: torch.tensor(v) if k == "weight" else v for k, v in options.items()}
        compare(lambda a: nn.NLLLoss(a, labels, **options),
                lambda a: F.nll_loss(a, torch.tensor(labels), **torch_options), logq)
    for reduction in ("batchmean", "mean", "sum"):
        compare(lambda a, p: nn.KLDivLoss(a, p, reduction),
                lambda a, p: F.kl_div(a, p, reduction=reduction), logq, target)


@pytest.mark.parametrize("reduction", ["batchmean", "mean", "sum"])
@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 2), (1, 5)])
def test_kl_div_log_target_gradcheck(reduction, shape, rng):
    x = nn.NetVar(np.log(rng.dirichlet(np.ones(shape[-1]), size=shape[:-1])))
    lp = nn.NetVar(np.log(rng.dirichlet(np.ones(shape[-1]), size=shape[:-1])))
    nn.gradcheck(lambda a, b: nn.KLDivLoss(a, b, reduction, log_target=True), x, lp)


def test_kl_div_log_target_equals_the_probability_form(rng):
    x = nn.NetVar(np.log(rng.dirichlet(np.ones(4), size=3)))
    p = nn.NetVar(rng.dirichlet(np.ones(4), size=3))
    lp = nn.NetVar(np.log(p.data))
    from_p, from_lp = nn.KLDivLoss(x, p), nn.KLDivLoss(x, lp, log_target=True)
    assert from_lp.item() == pytest.approx(from_p.item(), rel=1e-13)
    from_p.back()
    dx = x.g.copy()
    x.reset()
    from_lp.back()
    np.testing.assert_allclose(x.g, dx, rtol=1e-13)
    np.testing.assert_allclose(lp.g, p.g * p.data, rtol=1e-13)     # dlp = dp · dp/dlp
    assert nn.KLDivLoss(x, lp.data, log_target=True).item() == from_lp.item()   # a plain array
    assert_honours_the_upstream_gradient(lambda: nn.KLDivLoss(x, lp, "sum", log_target=True), lp)


@pytest.mark.filterwarnings("ignore:reduction. 'mean' divides:UserWarning")
def test_kl_div_log_target_matches_pytorch(torch, rng):
    import torch.nn.functional as F
    N, C = 5, 4
    logq = np.log(rng.dirichlet(np.ones(C), size=N))
    logp = np.log(rng.dirichlet(np.ones(C), size=N))
    logp[0, 1] = -40.0                                  # a nearly impossible class
    for reduction in ("batchmean", "mean", "sum"):
        assert_matches_pytorch(
            torch, lambda a, b: nn.KLDivLoss(a, b, reduction, log_target=True),
            lambda a, b: F.kl_div(a, b, reduction=reduction, log_target=True), logq, logp,
            rng=rng, rtol=1e-12)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_kl_div_log_target_minus_infinity_gives_nan_as_pytorch(torch):
    import torch.nn.functional as F
    x = nn.NetVar(np.array([[-1.0, -2.0, -0.5]]))
    lp = nn.NetVar(np.array([[-np.inf, -0.5, -1.0]]))
    loss = nn.KLDivLoss(x, lp, "sum", log_target=True)
    loss.back()
    xt = torch.tensor(x.data, requires_grad=True)
    lpt = torch.tensor(lp.data, requires_grad=True)
    reference = F.kl_div(xt, lpt, reduction="sum", log_target=True)
    reference.backward()
    assert np.isnan(loss.item()) and torch.isnan(reference).item()
    np.testing.assert_array_equal(x.g, xt.grad.numpy())              # NaN-free: −exp(−inf) = −0
    np.testing.assert_array_equal(lp.g, lpt.grad.numpy())            # NaN at the −inf entry
    assert np.isnan(lp.g[0, 0]) and np.isfinite(lp.g[0, 1:]).all()


# -- values that cannot be what the argument says are refused, not turned into a loss

def test_ce_loss_on_logits_is_refused_and_points_to_softmax_ce(rng):
    logits = nn.NetVar(rng.standard_normal((4, 3)) * 3)
    onehot = np.eye(3)[[0, 1, 2, 0]]
    with pytest.raises(ValueError, match=r"CELoss: prediction of shape \(4, 3\): values in "
                                         r"\[-?[\d.]+, [\d.]+\] lie outside \[0, 1\]; CELoss "
                                         r"takes probabilities; for logits use SoftmaxCELoss"):
        nn.CELoss(logits, onehot)
    with pytest.raises(ValueError, match="CELoss: prediction .* outside"):       # above 1 alone
        nn.CELoss(nn.NetVar(np.array([[0.2, 1.5]])), np.array([[0.0, 1.0]]))
    for bad in ([[-0.5, 1.5]], [[2.0, 0.0]]):
        with pytest.raises(ValueError, match=r"CELoss: target of shape \(1, 2\): .* outside "
                                             r"\[0, 1\] \(targets are probabilities\)"):
            nn.CELoss(nn.NetVar(np.array([[0.3, 0.7]])), np.array(bad))
    edges = nn.CELoss(nn.NetVar(np.array([[0.0, 1.0]])), np.array([[0.0, 1.0]]))
    assert edges.item() == 0.0                                   # 0 and 1 themselves are fine


def test_ce_loss_counts_rows_over_the_class_axis(rng):
    p = rng.dirichlet(np.ones(4), size=3)
    t = np.eye(4)[[0, 3, 1]]
    per_row = -(t * np.log(p)).sum(axis=1)
    assert nn.CELoss(nn.NetVar(p), t).item() == pytest.approx(per_row.mean())
    one = nn.CELoss(nn.Reshape(nn.NetVar(p[:1]), 4), t[0])          # 1-D: one distribution
    assert one.item() == pytest.approx(per_row[0])


def test_probability_targets_outside_0_1_are_refused(rng):
    z = nn.NetVar(rng.standard_normal((2, 3)))
    bad = np.array([[1.5, -0.5, 0.0], [0.0, 1.0, 0.0]])
    with pytest.raises(ValueError, match=r"SigmoidCELoss: target of shape \(2, 3\): values in "
                                         r"\[-0.5, 1.5\] lie outside \[0, 1\]"):
        nn.SigmoidCELoss(z, bad)
    with pytest.raises(ValueError, match=r"SoftmaxCELoss: target probabilities of shape "
                                         r"\(2, 3\): values in \[-0.5, 1.5\] lie outside"):
        nn.SoftmaxCELoss(z, bad)


def test_nll_loss_on_logits_is_refused(rng):
    z = nn.NetVar(rng.standard_normal((3, 4)) + 1)
    labels = np.array([0, 3, 1])
    with pytest.raises(ValueError, match=r"NLLLoss: log-probabilities of shape \(3, 4\): .* lie "
                                         r"outside \[-inf, 0\]; apply LogSoftmax"):
        nn.NLLLoss(z, labels)
    assert np.isfinite(nn.NLLLoss(nn.LogSoftmax(z), labels).item())


def test_kl_div_refuses_probabilities_as_input_and_targets_out_of_range(rng):
    q, p = rng.dirichlet(np.ones(3), size=2), rng.dirichlet(np.ones(3), size=2)
    with pytest.raises(ValueError, match=r"KLDivLoss: input x \(log-probabilities\) of shape "
                                         r"\(2, 3\): .* outside \[-inf, 0\]; apply LogSoftmax"):
        nn.KLDivLoss(nn.NetVar(q), p)                    # probabilities where ln q belongs
    with pytest.raises(ValueError, match=r"KLDivLoss: target \(probabilities\) of shape \(2, 3\)"
                                         r": .* outside \[0, 1\]; give log-probabilities with "
                                         r"log_target=True"):
        nn.KLDivLoss(nn.NetVar(np.log(q)), np.log(p))
    with pytest.raises(ValueError, match=r"KLDivLoss: target \(probabilities\) .* \[-0.2, 1.2\]"):
        nn.KLDivLoss(nn.NetVar(np.log(q)), np.array([[1.2, -0.2, 0.0], [0.5, 0.5, 0.0]]))
    with pytest.raises(ValueError, match=r"KLDivLoss: target \(log-probabilities with "
                                         r"log_target=True\) of shape \(2, 3\)"):
        nn.KLDivLoss(nn.NetVar(np.log(q)), p + 0.5, log_target=True)
    for flag in ("False", 1, None):
        with pytest.raises(TypeError, match="KLDivLoss: log_target must be True or False"):
            nn.KLDivLoss(nn.NetVar(np.log(q)), p, log_target=flag)
    with pytest.raises(ValueError, match="KLDivLoss: reduction must be one of"):
        nn.KLDivLoss(nn.NetVar(np.log(q)), p, reduction=["sum"])


def test_range_checks_run_on_the_gpu_only_inside_detect_anomaly(backend, rng):
    logits = backend.var64(rng, 3, 4)
    logits.data[0, 0] = 2.5
    onehot = backend.array(np.eye(4)[[0, 1, 2]])
    labels = backend.array([0, 4, 1], dtype=np.int64)              # 4: out of range
    calls = [lambda: nn.CELoss(logits, onehot), lambda: nn.NLLLoss(logits, backend.array(
        [0, 1, 2], dtype=np.int64)), lambda: nn.SoftmaxCELoss(logits, labels)]
    for call in calls:
        if backend.gpu:                     # the normal GPU path reads nothing back
            call()
        else:
            with pytest.raises(ValueError):
                call()
        with nn.detect_anomaly(), pytest.raises(ValueError, match="outside|out of range"):
            call()


@pytest.mark.parametrize("make", [
    lambda: nn.CELoss(nn.NetVar(np.zeros((0, 3))), np.zeros((0, 3))),
    lambda: nn.SoftmaxCELoss(nn.NetVar(np.zeros((0, 3))), np.zeros(0, dtype=int)),
    lambda: nn.SoftmaxCELoss(nn.NetVar(np.zeros((0, 3))), np.zeros((0, 3))),
    lambda: nn.NLLLoss(nn.NetVar(np.zeros((0, 3))), np.zeros(0, dtype=int)),
    lambda: nn.SigmoidCELoss(nn.NetVar(np.zeros((0, 3))), np.zeros((0, 3))),
    lambda: nn.KLDivLoss(nn.NetVar(np.zeros((0, 3))), np.zeros((0, 3)), "sum")],
    ids=["CELoss", "SoftmaxCELoss-indices", "SoftmaxCELoss-probabilities", "NLLLoss",
         "SigmoidCELoss", "KLDivLoss"])
def test_an_empty_batch_is_refused(make):
    with pytest.raises(ValueError, match=r"Loss: .*shape \(0, 3\).* (has no values|have no rows)"):
        make()


def test_class_indices_in_another_layout_are_refused(rng):
    T, B, C = 3, 2, 4
    z = var64(rng, T, B, C)
    labels = rng.integers(0, C, size=(T, B))
    for loss in (nn.SoftmaxCELoss, lambda v, t: nn.NLLLoss(nn.LogSoftmax(v), t)):
        with pytest.raises(ValueError, match=r"class indices of shape \(2, 3\) do not match "
                                             r"(logits|log-probabilities) of shape \(3, 2, 4\)"):
            loss(z, labels.T)                                  # batch-first labels
        with pytest.raises(ValueError, match=r"class indices of shape \(6,\) do not match"):
            loss(z, labels.reshape(-1))
    z2 = var64(rng, 3, C)
    row = nn.NetVar(labels[:, 0], dtype=int)                   # a (1, 3) row of labels
    assert nn.SoftmaxCELoss(z2, row).item() == pytest.approx(
        nn.SoftmaxCELoss(z2, labels[:, 0]).item())


def test_class_weight_must_hold_one_entry_per_class(rng):
    z = var64(rng, 3, 4)
    labels = np.array([0, 3, 1])
    for bad in (np.ones((2, 2)), np.ones(3), np.ones(5)):
        with pytest.raises(ValueError, match=rf"SoftmaxCELoss: weight of shape "
                                             rf"{re.escape(str(bad.shape))} needs 4 entries, "
                                             r"one per class"):
            nn.SoftmaxCELoss(z, labels, weight=bad)
    weight = rng.random(4) + 0.5
    expected = nn.SoftmaxCELoss(z, labels, weight=weight).item()
    for same in (nn.NetVar(weight), weight.reshape(4, 1)):
        assert nn.SoftmaxCELoss(z, labels, weight=same).item() == pytest.approx(expected)


def test_sigmoid_ce_weight_must_be_numeric(rng):
    z = var64(rng, 2, 3)
    with pytest.raises(TypeError, match="SigmoidCELoss: weight must be a number or an array, "
                                        "got str"):
        nn.SigmoidCELoss(z, rng.random((2, 3)), weight="heavy")


def test_integer_one_hot_targets_are_explained():
    z = nn.NetVar(np.zeros((4, 3)))
    with pytest.raises(ValueError, match=r"SoftmaxCELoss: class indices of shape \(4, 3\) .*"
                                         r"class indices of shape \(4,\), give one-hot or "
                                         "probability targets as floats"):
        nn.SoftmaxCELoss(z, np.eye(3, dtype=int)[[0, 1, 2, 0]])


NOTHING_COUNTS = [
    ("ignored", lambda z: nn.SoftmaxCELoss(z, np.array([-100, -100]), ignore_index=-100)),
    ("masked", lambda z: nn.SoftmaxCELoss(z, np.array([0, 1]), mask=np.array([0, 0]))),
    ("zero class weights", lambda z: nn.SoftmaxCELoss(z, np.array([0, 1]),
                                                      weight=np.array([0.0, 0.0, 1.0]))),
    ("probabilities, masked", lambda z: nn.SoftmaxCELoss(
        z, np.full((2, 3), 1 / 3), mask=np.array([0, 0]))),
    ("NLLLoss ignored", lambda z: nn.NLLLoss(nn.LogSoftmax(z), np.array([-100, -100]),
                                             ignore_index=-100)),
]


@pytest.mark.parametrize("case, loss", NOTHING_COUNTS, ids=[c for c, _ in NOTHING_COUNTS])
def test_a_loss_where_nothing_counts_is_nan_with_a_zero_gradient(case, loss):
    # the mean is 0/0 = NaN, as in PyTorch, and so is PyTorch's gradient 0: every share was
    # 0/0 = NaN here, and a batch of padding or ignored targets made every parameter NaN
    z = nn.NetVar(np.array([[1.0, 2.0, 0.5], [0.3, -1.0, 2.0]]))
    y = loss(z)
    with np.errstate(all="raise"):
        y.back()
    assert np.isnan(y.item())
    np.testing.assert_array_equal(z.g, np.zeros((2, 3)))
    assert float(y.denominator) == 0
    (first,) = nn.grad(loss(z), [z], create_graph=True)
    np.testing.assert_array_equal(first.data, np.zeros((2, 3)))


def test_a_batch_of_ignored_targets_leaves_the_trained_weights_finite():
    nn.seed(0)
    W = nn.NetVar(nn.rand2(4, 3))
    opt = nn.GD([W], lr=0.1)
    x = np.random.default_rng(0).standard_normal((6, 4))
    labels = np.array([0, 1, 2, 1, -100, -100])
    for rows in (slice(0, 4), slice(4, 6)):          # the second batch: all ignored
        nn.SoftmaxCELoss(nn.NetVar(x[rows]) @ W, labels[rows], ignore_index=-100).back()
        opt.step()
    assert np.isfinite(W.data).all()


def test_celoss_below_eps_differentiates_twice_as_back_does():
    # dp = −t / max(p, ε) at every p: the composite used for grad(create_graph=True) clamped
    # p below ε (derivative 0), so its first-order gradient there was 0, not −t/ε
    p = nn.NetVar(np.array([[0.0, 0.5, 0.5]]))
    t = nn.NetVar(np.array([[0.2, 0.3, 0.5]]))
    dp, dt = nn.grad(nn.CELoss(p, t), [p, t], create_graph=True)
    nn.CELoss(p, t).back()
    np.testing.assert_allclose(dp.data, p.g, rtol=1e-12)
    np.testing.assert_allclose(dt.data, t.g, rtol=1e-12)
    (second,) = nn.grad(dp.sum(), [p])          # d/dp of −t / max(p, ε): t/p², 0 below ε
    np.testing.assert_allclose(second, [[0.0, 0.3 / 0.25, 0.5 / 0.25]], rtol=1e-12)


@pytest.mark.parametrize("options", [{"mask": np.array([1, 0, 1])}, {"ignore_index": 1},
                                     {"mask": np.array([1, 0, 1]), "probabilities": True}])
def test_a_padding_row_of_nan_logits_gets_0_from_create_graph_too(options):
    # back() gave the row that does not count 0; grad(create_graph=True) gave it NaN (its
    # NaN log-probabilities times a share of 0), and a gradient penalty over it was NaN
    options = dict(options)
    targets = np.full((3, 3), 1 / 3) if options.pop("probabilities", False) else np.array([0, 1, 2])
    z0 = np.array([[1.0, 2.0, 0.5], [np.nan, np.inf, 0.0], [0.3, -1.0, 2.0]])
    z = nn.NetVar(z0.copy())
    nn.SoftmaxCELoss(z, targets, **options).back()
    (first,) = nn.grad(nn.SoftmaxCELoss(z, targets, **options), [z], create_graph=True)
    np.testing.assert_array_equal(first.data[1], 0.0)
    np.testing.assert_allclose(first.data, z.g, rtol=1e-12)
    (second,) = nn.grad((first * first).sum(), [z])
    assert np.isfinite(second).all() and (second[1] == 0).all()


def test_the_shares_of_a_weighted_mean_are_the_same_on_the_host_and_on_a_device():
    # the host path tests the total itself; the device path (CuPy) must not read it back, so
    # it uses where(): run it with NumPy's functions behind another module
    import types
    from nnkit.ops.classification import _nan_if_empty, _shares
    device = types.SimpleNamespace(where=np.where, nan=np.nan)
    for w in (np.array([1.0, 0.0, 3.0]), np.zeros(3)):
        total = w.sum()
        np.testing.assert_array_equal(_shares(w, total, np), _shares(w, total, device))
        value = np.asarray(1.5)
        np.testing.assert_array_equal(_nan_if_empty(value, total, np),
                                      _nan_if_empty(value, total, device))
    assert np.isnan(_nan_if_empty(np.asarray(0.0), np.asarray(0.0), device))


# ----------------------------------------------------------------------------- Second derivatives
# Hessian-vector products (grad(create_graph=True)) against PyTorch's double backward in float64:
# class weights, lengths, probability targets that are nodes; a zero target under a masked
# log-softmax.

def test_hvp_of_softmax_cross_entropy_with_class_weights_and_lengths(torch, rng):
    F = torch.nn.functional
    labels = np.array([[0, 2, 1], [3, 3, 0]])
    weight = np.array([1.0, 2.0, 0.5, 1.5])
    lengths = np.array([2, 1, 2])

    def ours(z):
        return nn.SoftmaxCELoss(z * z, labels, lengths=lengths, weight=weight)

    def theirs(z):
        ignored = np.where(np.arange(2)[:, None] < lengths[None, :], labels, -100)
        return F.cross_entropy((z * z).reshape(6, 4), torch.tensor(ignored.reshape(6)),
                               weight=torch.tensor(weight), ignore_index=-100)

    assert_same_hvp(ours, theirs, [rng.standard_normal((2, 3, 4))], rng)


def test_hvp_of_softmax_cross_entropy_with_probability_targets_as_a_node(torch, rng):
    F = torch.nn.functional
    weight = np.array([1.0, 2.0, 0.5, 1.5])

    def ours(z, s):
        return nn.SoftmaxCELoss(z * s, nn.Softmax(s), weight=weight)

    def theirs(z, s):
        return F.cross_entropy(z * s, torch.softmax(s, -1), weight=torch.tensor(weight))

    assert_same_hvp(ours, theirs, [rng.standard_normal((3, 4)), rng.standard_normal((3, 4))],
                    rng)


def test_hvp_of_nll_ce_and_sigmoid_ce(torch, rng):
    F = torch.nn.functional
    labels = np.array([1, 0, 3])
    weight = np.array([[0.5, 1.0, 2.0, 1.5]])

    def ours(z, s):
        return (nn.NLLLoss(nn.LogSoftmax(z * s), labels, ignore_index=0)
                + nn.CELoss(nn.Softmax(z), nn.Softmax(s * s))
                + nn.SigmoidCELoss(z * s, nn.Sigmoid(s), weight=weight))

    def theirs(z, s):
        p, t = torch.softmax(z, -1), torch.softmax(s * s, -1)
        return (F.nll_loss(torch.log_softmax(z * s, -1), torch.tensor(labels), ignore_index=0)
                - (t * p.log()).sum() / 3
                + F.binary_cross_entropy_with_logits(z * s, torch.sigmoid(s),
                                                     weight=torch.tensor(weight)))

    assert_same_hvp(ours, theirs, [rng.standard_normal((3, 4)), rng.standard_normal((3, 4))],
                    rng)


@pytest.mark.parametrize("log_target", [False, True])
def test_hvp_of_kl_divergence(torch, rng, log_target):
    F = torch.nn.functional

    def ours(x, s):
        target = nn.LogSoftmax(s * x) if log_target else nn.Softmax(s * x)
        return nn.KLDivLoss(nn.LogSoftmax(x * x), target, log_target=log_target)

    def theirs(x, s):
        target = (torch.log_softmax if log_target else torch.softmax)(s * x, -1)
        return F.kl_div(torch.log_softmax(x * x, -1), target, reduction="batchmean",
                        log_target=log_target)

    assert_same_hvp(ours, theirs, [rng.standard_normal((3, 4)), rng.standard_normal((3, 4))],
                    rng)


def test_kl_divergence_where_the_target_is_zero_and_the_input_minus_infinity(rng):
    # a zero-probability class under a masked log-softmax: its term is 0, to every order
    keep = np.array([[True, True, False]] * 2)
    x, s = nn.NetVar(rng.standard_normal((2, 3))), nn.NetVar(rng.standard_normal((2, 3)))
    p = nn.Softmax(s, mask=keep)                    # exactly 0 in column 2
    with np.errstate(invalid="ignore"):             # the forward's 0·∞, discarded by its where
        loss = nn.KLDivLoss(nn.LogSoftmax(x, mask=keep), p)
    gx, gs = nn.grad(loss, [x, s], create_graph=True)
    hx, hs = nn.grad((gx * gs).sum(), [x, s])
    for array in (gx.data, gs.data, hx, hs):
        assert np.isfinite(array).all() and (array[:, 2] == 0).all()
    assert np.abs(hx[:, :2]).max() > 1e-3 and np.abs(hs[:, :2]).max() > 1e-3
