"""Second derivatives of the activations, losses and regularisers (``grad(create_graph=True)``),
against PyTorch's double backward in float64.

test_gradgradcheck_every_op checks each op alone against finite differences; these check
Hessian-vector products against PyTorch (class weights, lengths, masks, probability targets
that are nodes), a fully masked softmax slice (zero, finite second derivatives), (1, 1) and
0-d nodes, a node read by three consumers and a third derivative.
"""
import numpy as np
import pytest

import nnkit as nn
from tests.ops.helpers import assert_same_hvp

torch = pytest.importorskip("torch")
F = torch.nn.functional


# ----------------------------------------------------------------------------- activations

def test_hvp_of_the_smooth_activations(rng):
    def ours(x, w):
        return (nn.GELU(x) * w + nn.SiLU(x * w) + nn.ELU(x, 0.7) * w + nn.SELU(x - w)
                + nn.Softplus(x) * nn.Sigmoid(w) + nn.Tanh(x * w) * x).sum()

    def theirs(x, w):
        return (F.gelu(x, approximate="tanh") * w + F.silu(x * w) + F.elu(x, 0.7) * w
                + F.selu(x - w) + F.softplus(x) * torch.sigmoid(w) + torch.tanh(x * w) * x).sum()

    assert_same_hvp(ours, theirs, [rng.standard_normal((3, 4)) * 2, rng.standard_normal((1, 4))],
                    rng)


def test_hvp_of_the_piecewise_activations_keeps_the_mixed_terms(rng):
    # Their own second derivatives are 0; multiplied by w the mixed terms ∂²/∂x∂w are not
    def ours(x, w):
        return ((nn.ReLU(x) + nn.LReLU(x, 0.1) + nn.HardTanh(x, -0.8, 0.6)) * w * w).sum()

    def theirs(x, w):
        return ((F.relu(x) + F.leaky_relu(x, 0.1) + F.hardtanh(x, -0.8, 0.6)) * w * w).sum()

    assert_same_hvp(ours, theirs, [rng.standard_normal((3, 4)), rng.standard_normal((3, 1))],
                    rng)


def test_hvp_of_softmax_and_log_softmax_along_an_axis(rng):
    def ours(x, w):
        return (nn.SoftMax(x, axis=1) * w).sum() + (nn.LogSoftmax(x * w, axis=-1) ** 2).sum()

    def theirs(x, w):
        return (torch.softmax(x, dim=1) * w).sum() + (torch.log_softmax(x * w, dim=-1) ** 2).sum()

    assert_same_hvp(ours, theirs, [rng.standard_normal((2, 3, 4)), rng.standard_normal((3, 4))],
                    rng)


KEEP = np.array([[True, False, True, True],
                 [True, True, False, True],
                 [False, True, True, True]])


def test_hvp_of_masked_softmax_and_log_softmax(rng):
    # every row keeps something here, so PyTorch's −inf filling is finite to compare with
    def ours(x, w):
        y = nn.SoftMax(x, mask=KEEP)
        logp = nn.Where(KEEP, nn.LogSoftmax(x * w, mask=KEEP), 0.0)
        return (y * y * w).sum() + (logp * logp).sum()

    def theirs(x, w):
        keep = torch.tensor(KEEP)
        y = torch.softmax(x.masked_fill(~keep, -np.inf), dim=-1)
        logp = torch.where(keep, torch.log_softmax((x * w).masked_fill(~keep, -np.inf), -1), 0.0)
        return (y * y * w).sum() + (logp * logp).sum()

    assert_same_hvp(ours, theirs, [rng.standard_normal((3, 4)), rng.standard_normal((3, 4))],
                    rng)


@pytest.mark.parametrize("op", ["SoftMax", "LogSoftmax"])
def test_a_fully_masked_slice_has_zero_finite_second_derivatives(rng, op):
    keep = np.array([[True, False, True], [True, False, False]])     # column 1 keeps nothing
    x, w = nn.NetVar(rng.standard_normal((2, 3))), nn.NetVar(rng.standard_normal((2, 3)))
    y = getattr(nn, op)(x * w, axis=0, mask=keep)
    loss = (nn.Where(keep, y, 0.0) ** 2 * w).sum()
    gx, gw = nn.grad(loss, [x, w], create_graph=True)
    hx, hw = nn.grad((gx * gx).sum() + (gw * gw).sum(), [x, w])
    for first, second in [(gx.data, hx), (gw.data, hw)]:
        assert np.isfinite(first).all() and np.isfinite(second).all()
        # nothing of column 1 reaches the loss, whichever order
        assert (first[:, 1] == 0).all() and (second[:, 1] == 0).all()
    assert np.abs(hx[:, [0, 2]]).max() > 1e-3      # the other columns do have second derivatives


@pytest.mark.parametrize("op", ["SoftMax", "LogSoftmax"])
def test_an_upstream_gradient_under_the_mask_reaches_nothing(rng, op):
    # as in _back: a masked output is a constant (0 or −inf), whatever gradient it is handed
    x = nn.NetVar(rng.standard_normal((3, 4)))
    seed = nn.NetVar(rng.standard_normal((3, 4)))      # nonzero under the mask too
    y = getattr(nn, op)(x * x, mask=KEEP)
    expected, = nn.grad(y, [x], g=seed.data)
    gx, = nn.grad(y, [x], g=seed, create_graph=True)
    np.testing.assert_allclose(gx.data, expected, rtol=1e-12)
    gseed, = nn.grad((gx * gx).sum(), [seed])
    assert (gseed[~KEEP] == 0).all() and (gseed[KEEP] != 0).all()


@pytest.mark.parametrize("op", ["SoftMax", "LogSoftmax"])
def test_an_infinite_upstream_gradient_under_the_mask_reaches_nothing(rng, op):
    # √y at a masked y = 0 hands it an infinite gradient (exp of −y at y = −inf likewise): the
    # first-order rule drops it; the create_graph rule must too, not multiply it by 0 (NaN,
    # spread over the slice by the sum)
    x = nn.NetVar(rng.standard_normal((3, 4)))
    seed = np.where(KEEP, rng.standard_normal((3, 4)), np.inf)
    y = getattr(nn, op)(x * x, mask=KEEP)
    expected, = nn.grad(y, [x], g=seed)
    assert np.isfinite(expected).all()
    with np.errstate(invalid="ignore"):
        gx, = nn.grad(y, [x], g=nn.NetVar(seed), create_graph=True)
    np.testing.assert_allclose(gx.data, expected, rtol=1e-12)


def test_third_derivatives_through_rules_written_with_the_output(rng):
    # Sigmoid's and Tanh's rules use y itself: each derivative is differentiable again
    x = nn.NetVar(rng.standard_normal((1, 1)))
    t = torch.tensor(x.data, requires_grad=True)
    for ours, theirs in [(nn.Sigmoid, torch.sigmoid), (nn.Tanh, torch.tanh),
                         (nn.SoftMax, lambda v: torch.softmax(v, -1))]:
        mine, ref = ours(x * x * 3.0), theirs(t * t * 3.0)
        for _ in range(3):
            mine, = nn.grad(mine, [x], create_graph=True)
            ref, = torch.autograd.grad(ref.sum(), t, create_graph=True)
            np.testing.assert_allclose(mine.data, ref.detach().numpy(), rtol=1e-9, atol=1e-12)
        assert mine.shape == (1, 1)


def test_zero_dimensional_nodes():
    x = nn.NetVar(np.array([[0.7]]))
    x0 = x.reshape(())                              # a NetVar holds (1, 1): reshape to 0-d
    t = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    mine = nn.GELU(x0) * nn.SiLU(x0) + nn.Softplus(x0 * x0) + nn.ELU(x0 - 1.0)
    ref = F.gelu(t, approximate="tanh") * F.silu(t) + F.softplus(t * t) + F.elu(t - 1.0)
    assert mine.shape == ()
    g0, = nn.grad(mine, [x0], create_graph=True)
    assert g0.shape == ()
    h, = nn.grad(g0, [x])
    expected, = torch.autograd.grad(torch.autograd.grad(ref, t, create_graph=True)[0], t)
    assert h.shape == (1, 1) and abs(expected.item()) > 1e-3
    np.testing.assert_allclose(h.reshape(()), expected.item(), rtol=1e-9)


def test_a_node_read_by_three_consumers(rng):
    def ours(x):
        h = nn.Tanh(x)
        return (nn.Sigmoid(h) + nn.Softplus(h) * h + nn.SoftMax(h, axis=0)).sum()

    def theirs(x):
        h = torch.tanh(x)
        return (torch.sigmoid(h) + F.softplus(h) * h + torch.softmax(h, dim=0)).sum()

    assert_same_hvp(ours, theirs, [rng.standard_normal((3, 2))], rng)


# ----------------------------------------------------------------------------- losses

def test_hvp_of_the_regression_losses_with_targets_that_need_gradients(rng):
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


def test_hvp_of_softmax_cross_entropy_with_class_weights_and_lengths(rng):
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


def test_hvp_of_softmax_cross_entropy_with_probability_targets_as_a_node(rng):
    weight = np.array([1.0, 2.0, 0.5, 1.5])

    def ours(z, s):
        return nn.SoftmaxCELoss(z * s, nn.Softmax(s), weight=weight)

    def theirs(z, s):
        return F.cross_entropy(z * s, torch.softmax(s, -1), weight=torch.tensor(weight))

    assert_same_hvp(ours, theirs, [rng.standard_normal((3, 4)), rng.standard_normal((3, 4))],
                    rng)


def test_hvp_of_nll_ce_and_sigmoid_ce(rng):
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
def test_hvp_of_kl_divergence(rng, log_target):
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


# ----------------------------------------------------------------------------- regularisation

def test_hvp_through_dropout_uses_its_stored_mask(rng):
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


def test_hvp_of_l2_regularisation(rng):
    def ours(x, w, v):
        loss = nn.Softplus(nn.Multiply(x, w)).sum()
        return nn.L2Reg(loss, [w, v], 0.3, batch_size=2) * nn.Sigmoid(v).sum()

    def theirs(x, w, v):
        loss = F.softplus(x @ w).sum()
        return (loss + 0.3 / 4 * ((w * w).sum() + (v * v).sum())) * torch.sigmoid(v).sum()

    assert_same_hvp(ours, theirs, [rng.standard_normal((2, 3)), rng.standard_normal((3, 2)),
                                   rng.standard_normal((1, 2))], rng)
