"""The activations, SoftMax and LogSoftmax (along an axis, with a mask) among them: gradchecks,
PyTorch parity of values and gradients, refused masks and axes, and second derivatives."""
import warnings

import numpy as np
import pytest

import nnkit as nn
from tests.conftest import var64
from tests.ops.helpers import assert_matches_pytorch, assert_same_hvp, keep_mask


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


# ----------------------------------------------------------------------------- SoftMax, LogSoftmax

@pytest.mark.parametrize("shape,axis,mask_shape", [
    ((3, 4), 0, None), ((3, 4), -1, (3, 4)), ((3, 4), 0, (3, 1)), ((3, 4), 1, (1, 4)),
    ((2, 3, 4), 1, (2, 3, 4)), ((2, 3, 4), -2, (3, 1)), ((2, 3, 4), 0, None), ((1, 1), -1, (1, 1)),
])
def test_softmax_and_log_softmax_gradcheck_with_axis_and_mask(shape, axis, mask_shape, rng):
    x = var64(rng, *shape)
    mask = None if mask_shape is None else keep_mask(rng, mask_shape)
    full = np.broadcast_to(True if mask is None else mask, shape)
    assert nn.gradcheck(lambda v: nn.SoftMax(v, axis=axis, mask=mask), x)
    # LogSoftmax is −inf where masked: compare its finite entries (Where passes them through)
    assert nn.gradcheck(lambda v: nn.Where(full, nn.LogSoftmax(v, axis, mask), 0.0), x)


def test_softmax_masked_entries_are_exact_zeros_and_fully_masked_rows_give_zeros(rng):
    x = var64(rng, 4, 5)
    mask = keep_mask(rng, (4, 5))
    mask[1] = False                          # nothing kept in row 1
    mask[2] = [True, False, False, False, False]
    seed = rng.standard_normal((4, 5))
    with np.errstate(all="raise"):
        y = nn.SoftMax(x, mask=mask)
        y.back(seed)
    assert np.all(y.data[~mask] == 0) and np.all(y.data[1] == 0)
    np.testing.assert_allclose(y.data[[0, 2, 3]].sum(axis=-1), 1.0)
    assert y.data[2, 0] == 1.0
    assert np.all(x.g[~mask] == 0) and np.all(x.g[1] == 0) and np.isfinite(x.g).all()
    assert nn.gradcheck(lambda v: nn.SoftMax(v, mask=mask), x)


def test_log_softmax_fully_masked_row_is_minus_inf_with_a_zero_gradient(rng):
    x = var64(rng, 3, 4)
    mask = np.array([[True, False, True, True], [False] * 4, [True] * 4])
    seed = rng.standard_normal((3, 4))           # arbitrary upstream gradient, masked entries too
    with np.errstate(all="raise"):
        y = nn.LogSoftmax(x, mask=mask)
        y.back(seed)
    assert np.all(y.data[~mask] == -np.inf) and np.isfinite(y.data[mask]).all()
    np.testing.assert_allclose(np.exp(y.data[[0, 2]]).sum(axis=-1), 1.0)
    assert np.all(x.g[~mask] == 0) and np.isfinite(x.g).all()
    # the gradient that arrives at a masked (−inf) entry reaches nothing: y there is constant
    kept = np.where(mask, seed, 0.0)
    p = np.exp(y.data)
    np.testing.assert_allclose(x.g, kept - p * kept.sum(axis=-1, keepdims=True), atol=1e-15)


def test_softmax_gradient_ignores_what_arrives_at_masked_entries(rng):
    x = var64(rng, 2, 4)
    mask = np.array([[True, False, True, True], [True, True, False, True]])
    seed = rng.standard_normal((2, 4))
    seed[~mask] = np.inf                        # e.g. the 1/y of a Log at a masked 0
    nn.SoftMax(x, mask=mask).back(seed)
    reference = var64(rng, 2, 4)
    reference.data[...] = x.data
    nn.SoftMax(reference, mask=mask).back(np.where(mask, seed, 0.0))
    np.testing.assert_array_equal(x.g, reference.g)
    assert np.isfinite(x.g).all()


@pytest.mark.parametrize("axis", [0, 1, -1, 2])
def test_softmax_and_log_softmax_with_axis_and_mask_match_pytorch(torch, axis, rng):
    data = rng.standard_normal((3, 4, 5)) * 3
    mask = keep_mask(rng, (3, 4, 5), 0.7)
    first = [slice(None)] * 3
    first[axis] = 0
    mask[tuple(first)] = True             # no slice along the axis is fully masked
    tmask = torch.tensor(mask)
    assert_matches_pytorch(
        torch, lambda v: nn.SoftMax(v, axis, mask),
        lambda t: torch.softmax(t.masked_fill(~tmask, -torch.inf), dim=axis),
        data, rng=rng, rtol=1e-12, atol=1e-14)
    # LogSoftmax: PyTorch passes the gradient of a −inf entry on to the row (nnkit drops it,
    # see above), so the seed here is 0 at the masked entries
    node = nn.NetVar(data)
    tensor = torch.tensor(data, requires_grad=True)
    ours = nn.LogSoftmax(node, axis, mask)
    theirs = torch.log_softmax(tensor.masked_fill(~tmask, -torch.inf), dim=axis)
    seed = np.where(mask, rng.standard_normal(data.shape), 0.0)
    ours.back(seed)
    theirs.backward(torch.tensor(seed))
    np.testing.assert_allclose(ours.data, theirs.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(node.g, tensor.grad.numpy(), rtol=1e-12, atol=1e-14)


def test_softmax_axis_without_mask_matches_pytorch(torch, rng):
    for op, reference in ((nn.SoftMax, torch.softmax), (nn.LogSoftmax, torch.log_softmax)):
        for axis in (0, 1):
            assert_matches_pytorch(torch, lambda v: op(v, axis=axis),
                                   lambda t: reference(t, dim=axis),
                                   rng.standard_normal((3, 4)), rng=rng, rtol=1e-12, atol=1e-14)


def test_softmax_methods_take_axis_and_mask(rng):
    x = var64(rng, 3, 4)
    mask = keep_mask(rng, (1, 4), 0.8) | np.array([[True, False, False, False]])
    np.testing.assert_array_equal(x.softmax(0).data, nn.SoftMax(x, 0).data)
    np.testing.assert_array_equal(x.softmax(mask=mask).data, nn.SoftMax(x, mask=mask).data)
    np.testing.assert_array_equal(x.log_softmax(axis=0, mask=mask).data,
                                  nn.LogSoftmax(x, 0, mask).data)
    np.testing.assert_array_equal(x.softmax().data, nn.SoftMax(x).data)
    with pytest.raises(TypeError, match=r"softmax\(\): nnkit spells the axis argument axis="):
        x.softmax(dim=1)
    with pytest.raises(TypeError, match=r"log_softmax\(\): nnkit spells the axis argument"):
        x.log_softmax(dim=1)


def test_softmax_mask_may_be_a_boolean_node(rng):
    x = var64(rng, 3, 4)
    y = nn.SoftMax(x, mask=x > 0)
    np.testing.assert_array_equal(y.data == 0, x.data <= 0)


SOFTMAX_REFUSED = [
    (lambda op, x: op(x, mask=np.ones((3, 4))), TypeError,
     r"{op}: mask of shape \(3, 4\) and dtype float64 must be boolean \(True = keep\)"),
    (lambda op, x: op(x, mask=nn.NetVar([[1, 0, 1, 1]])), TypeError,
     r"{op}: mask of shape \(1, 4\) and dtype float32 must be boolean"),
    (lambda op, x: op(x, mask=np.ones((4,), dtype=int)), TypeError,
     r"{op}: mask of shape \(4,\) and dtype int64 must be boolean"),
    (lambda op, x: op(x, mask=np.ones((4, 3), dtype=bool)), ValueError,
     r"{op}: mask of shape \(4, 3\) does not broadcast to x of shape \(3, 4\)"),
    (lambda op, x: op(x, mask=np.ones((2, 3, 4), dtype=bool)), ValueError,
     r"{op}: mask of shape \(2, 3, 4\) does not broadcast to x of shape \(3, 4\)"),
    (lambda op, x: op(x, axis=2), ValueError,
     r"{op}: axis 2 is out of range for x of shape \(3, 4\)"),
    (lambda op, x: op(x, axis=2, mask=np.ones((3, 4), dtype=bool)), ValueError,
     r"{op}: axis 2 is out of range for x of shape \(3, 4\)"),
    (lambda op, x: op(x, axis=(0, 1)), TypeError, r"{op}: axis must be an int, got \(0, 1\)"),
    (lambda op, x: op(x, axis=1.0), TypeError, r"{op}: axis must be an int, got 1.0"),
    (lambda op, x: op(x, axis=-1.0), TypeError, r"{op}: axis must be an int, got -1.0"),
    (lambda op, x: op(x[:, 0:0], mask=np.ones((3, 0), dtype=bool)), ValueError,
     r"{op}: x of shape \(3, 0\) has an empty last axis"),
    (lambda op, x: op(x[0:0], axis=0), ValueError,
     r"{op}: x of shape \(0, 4\) has an empty axis 0"),
    (lambda op, x: op(x[0:0], axis=0, mask=np.ones((0, 4), dtype=bool)), ValueError,
     r"{op}: x of shape \(0, 4\) has an empty axis 0"),
]
SOFTMAX_REFUSED_IDS = ["float-mask", "float-node-mask", "int-mask", "mask-4x3", "mask-enlarges",
                       "axis-out-of-range", "axis-out-of-range-masked", "axis-tuple", "axis-float",
                       "axis-minus-one-float", "empty-axis-masked", "empty-axis-0",
                       "empty-axis-0-masked"]


@pytest.mark.parametrize("op", [nn.SoftMax, nn.LogSoftmax], ids=["SoftMax", "LogSoftmax"])
@pytest.mark.parametrize("make,error,message", SOFTMAX_REFUSED, ids=SOFTMAX_REFUSED_IDS)
def test_softmax_refuses_bad_masks_and_axes(op, make, error, message, rng):
    x = var64(rng, 3, 4)
    with pytest.raises(error, match=message.format(op=op.__name__)):
        make(op, x)


def test_masked_softmax_keeps_float32(rng):
    x = nn.NetVar(rng.standard_normal((3, 4)).astype(np.float32))
    mask = keep_mask(rng, (3, 4))
    for op in (nn.SoftMax, nn.LogSoftmax):
        x.reset()
        y = op(x, 0, mask)
        nn.Sum(nn.Where(mask, y, 0.0)).back()
        assert y.dtype == x.g.dtype == np.float32, op.__name__


def test_softmax_without_mask_keeps_no_mask():
    x = nn.NetVar(np.array([[1.0, 2.0]]))
    y = nn.SoftMax(x)
    assert y.axis == -1 and y.mask is None
    assert nn.LogSoftmax(x).mask is None


# ----------------------------------------------------------------------------- Second derivatives
# Hessian-vector products (grad(create_graph=True)) against PyTorch's double backward in float64;
# test_gradgradcheck_every_op checks each op alone against finite differences. Masks, a fully
# masked softmax slice (zero, finite second derivatives), (1, 1) and 0-d nodes, a node read by
# three consumers and a third derivative.

def test_hvp_of_the_smooth_activations(torch, rng):
    F = torch.nn.functional

    def ours(x, w):
        return (nn.GELU(x) * w + nn.SiLU(x * w) + nn.ELU(x, 0.7) * w + nn.SELU(x - w)
                + nn.Softplus(x) * nn.Sigmoid(w) + nn.Tanh(x * w) * x).sum()

    def theirs(x, w):
        return (F.gelu(x, approximate="tanh") * w + F.silu(x * w) + F.elu(x, 0.7) * w
                + F.selu(x - w) + F.softplus(x) * torch.sigmoid(w) + torch.tanh(x * w) * x).sum()

    assert_same_hvp(ours, theirs, [rng.standard_normal((3, 4)) * 2, rng.standard_normal((1, 4))],
                    rng)


def test_hvp_of_the_piecewise_activations_keeps_the_mixed_terms(torch, rng):
    # Their own second derivatives are 0; multiplied by w the mixed terms ∂²/∂x∂w are not
    F = torch.nn.functional

    def ours(x, w):
        return ((nn.ReLU(x) + nn.LReLU(x, 0.1) + nn.HardTanh(x, -0.8, 0.6)) * w * w).sum()

    def theirs(x, w):
        return ((F.relu(x) + F.leaky_relu(x, 0.1) + F.hardtanh(x, -0.8, 0.6)) * w * w).sum()

    assert_same_hvp(ours, theirs, [rng.standard_normal((3, 4)), rng.standard_normal((3, 1))],
                    rng)


def test_hvp_of_softmax_and_log_softmax_along_an_axis(torch, rng):
    def ours(x, w):
        return (nn.SoftMax(x, axis=1) * w).sum() + (nn.LogSoftmax(x * w, axis=-1) ** 2).sum()

    def theirs(x, w):
        return (torch.softmax(x, dim=1) * w).sum() + (torch.log_softmax(x * w, dim=-1) ** 2).sum()

    assert_same_hvp(ours, theirs, [rng.standard_normal((2, 3, 4)), rng.standard_normal((3, 4))],
                    rng)


KEEP = np.array([[True, False, True, True],
                 [True, True, False, True],
                 [False, True, True, True]])


def test_hvp_of_masked_softmax_and_log_softmax(torch, rng):
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


def test_third_derivatives_through_rules_written_with_the_output(torch, rng):
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


def test_zero_dimensional_nodes(torch):
    F = torch.nn.functional
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


def test_a_node_read_by_three_consumers(torch, rng):
    F = torch.nn.functional

    def ours(x):
        h = nn.Tanh(x)
        return (nn.Sigmoid(h) + nn.Softplus(h) * h + nn.SoftMax(h, axis=0)).sum()

    def theirs(x):
        h = torch.tanh(x)
        return (torch.sigmoid(h) + F.softplus(h) * h + torch.softmax(h, dim=0)).sum()

    assert_same_hvp(ours, theirs, [rng.standard_normal((3, 2))], rng)


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


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu_far_below_zero_is_zero_without_an_overflow_warning(dtype):
    """GELU computes x · σ(2u) as x / (1 + e^(−2u)): far below zero e^(−2u) is inf (ignored, not
    warned of) and y is −0, as ½x(1 + tanh u) gives; eagerly and replayed by nn.capture."""
    def step(x):
        y = nn.GELU(x)
        y.back()
        return y

    x = np.array([[-1000.0, -60.0, 0.0, 60.0]], dtype)
    captured = nn.capture(step)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for run in (step, captured, captured, captured):
            node = nn.NetVar(x.copy())
            y = run(node).data
            np.testing.assert_array_equal(y, np.array([[-0.0, -0.0, 0.0, 60.0]], dtype))
            assert np.signbit(y[0, :2]).all()
            np.testing.assert_array_equal(node.g, np.array([[0.0, 0.0, 0.5, 1.0]], dtype))
    assert captured.replays == 2


def test_gelu_in_float32_is_within_a_few_ulps_of_the_exact_value_and_slope():
    """x / (1 + e^(−2u)) and its slope s(1 + x(1 − s)·2c(1 + 3kx²)), 1 − s = 1/(1 + 1/e),
    cancel nowhere: float32 stays near float64 across the range (½x(1 + tanh u) loses all
    relative precision below −5, and its slope's 1 − t² is 1.2e-6 off near x = 2)."""
    x = np.linspace(-8, 8, 40001).astype(np.float32)[None, :]
    c, k, w = np.sqrt(2 / np.pi), 0.044715, x.astype(np.float64)
    u = c * (w + k * w ** 3)
    s = 1 / (1 + np.exp(-2 * u))            # float64: ½(1 + tanh u) without its cancellation
    exact = w * s
    slope = s + w * s * (1 - s) * 2 * c * (1 + 3 * k * w * w)
    node = nn.NetVar(x.copy())
    y = nn.GELU(node)
    y.back()
    ulps = np.abs(y.data - exact) / np.spacing(np.abs(exact).astype(np.float32))
    assert ulps.max() < 128 and np.median(ulps) < 2   # e^(−2u), |2u| up to 90: its own rounding
    assert np.max(np.abs(node.g - slope)) < 4e-7


def test_gelu_gradient_is_the_derivative_across_its_range(rng):
    # the hand-derived slope against a central difference, float64, far out on both sides
    x = np.concatenate([np.linspace(-8, 8, 41), [-30.0, 30.0, 0.0]])[None, :]
    node = nn.NetVar(x.copy())
    nn.GELU(node).back()
    h = 1e-6
    numeric = (nn.GELU(nn.NetVar(x + h)).data - nn.GELU(nn.NetVar(x - h)).data) / (2 * h)
    np.testing.assert_allclose(node.g, numeric, rtol=1e-7, atol=1e-9)
