"""Conv2D / MaxPool2D / AvgPool2D: gradchecks, PyTorch parity (values and gradients), errors,
the padded pools and an FFN with padded pools saved and loaded."""
import re

import numpy as np
import pytest

import nnkit as nn
from tests.conftest import var64
from tests.ops.helpers import assert_matches_pytorch, assert_same_hvp

CONV_CASES = [  # x shape, w shape, stride, padding, bias
    ((2, 3, 5, 5), (4, 3, 3, 3), 1, 0, True),
    ((1, 2, 6, 5), (3, 2, 3, 2), 2, 1, True),
    ((2, 1, 4, 4), (2, 1, 1, 1), 1, 0, False),
    ((1, 2, 5, 6), (2, 2, 2, 3), (2, 1), (0, 2), True),
]


@pytest.mark.parametrize("xs,ws,stride,padding,bias", CONV_CASES)
def test_conv2d_gradcheck(xs, ws, stride, padding, bias, rng):
    x, w = var64(rng, *xs), var64(rng, *ws)
    if bias:
        b = var64(rng, ws[0])
        nn.gradcheck(lambda u, v, c: nn.Conv2D(u, v, c, stride, padding), x, w, b)
    else:
        nn.gradcheck(lambda u, v: nn.Conv2D(u, v, None, stride, padding), x, w)


@pytest.mark.parametrize("xs,ws,stride,padding,bias", CONV_CASES)
def test_conv2d_matches_pytorch(xs, ws, stride, padding, bias, torch, rng):
    import torch.nn.functional as F
    arrays = [rng.standard_normal(xs), rng.standard_normal(ws)] + \
        ([rng.standard_normal(ws[0])] if bias else [])
    assert_matches_pytorch(torch, lambda x, w, b=None: nn.Conv2D(x, w, b, stride, padding),
                           lambda x, w, b=None: F.conv2d(x, w, b, stride, padding), *arrays,
                           rng=rng, atol=1e-12, grad_atol=1e-11)


def test_conv2d_errors(rng):
    x = var64(rng, 1, 3, 5, 5)
    with pytest.raises(ValueError, match=r"Conv2D: w of shape \(8, 1, 3, 3\) expects 1 input "
                                         r"channels, x of shape \(1, 3, 5, 5\) has 3"):
        nn.Conv2D(x, var64(rng, 8, 1, 3, 3))
    with pytest.raises(ValueError, match=r"Conv2D: x must be \(N, C, H, W\)"):
        nn.Conv2D(var64(rng, 3, 5), var64(rng, 8, 3, 3, 3))
    with pytest.raises(ValueError, match="Conv2D: a 7×7 window does not fit"):
        nn.Conv2D(x, var64(rng, 2, 3, 7, 7))
    with pytest.raises(ValueError, match="Conv2D: b of shape"):
        nn.Conv2D(x, var64(rng, 2, 3, 3, 3), var64(rng, 3))
    with pytest.raises(ValueError, match="Conv2D: stride must be an int or a pair"):
        nn.Conv2D(x, var64(rng, 2, 3, 3, 3), stride=0)


def test_conv2d_keeps_float32(rng):
    x = nn.NetVar(rng.standard_normal((2, 1, 4, 4)).astype(np.float32))
    w = nn.NetVar(rng.standard_normal((2, 1, 3, 3)).astype(np.float32))
    y = nn.Conv2D(x, w, padding=1)
    y.back()
    assert y.dtype == x.g.dtype == w.g.dtype == np.float32 and y.shape == (2, 2, 4, 4)


POOL_CASES = [((2, 3, 4, 4), 2, None), ((1, 2, 5, 5), 3, 1), ((1, 1, 6, 5), (2, 3), (1, 2)),
              ((2, 2, 5, 4), 2, None)]


@pytest.mark.parametrize("op", [nn.MaxPool2D, nn.AvgPool2D])
@pytest.mark.parametrize("shape,size,stride", POOL_CASES)
def test_pool_gradcheck(op, shape, size, stride, rng):
    x = var64(rng, *shape)
    nn.gradcheck(lambda v: op(v, size, stride), x)


@pytest.mark.parametrize("op", [nn.MaxPool2D, nn.AvgPool2D])
@pytest.mark.parametrize("shape,size,stride", POOL_CASES)
def test_pool_matches_pytorch(op, shape, size, stride, rng, torch):
    import torch.nn.functional as F
    reference = {nn.MaxPool2D: F.max_pool2d, nn.AvgPool2D: F.avg_pool2d}[op]
    assert_matches_pytorch(torch, lambda v: op(v, size, stride),
                           lambda t: reference(t, size, stride), rng.standard_normal(shape),
                           rng=rng, atol=1e-12)


def test_maxpool_ties_go_to_the_first_maximum_as_pytorch(torch):
    import torch.nn.functional as F
    data = np.array([[[[1.0, 1.0, 0.0, 2.0], [1.0, 0.0, 2.0, 2.0],
                       [3.0, 3.0, 3.0, 0.0], [3.0, 3.0, 0.0, 0.0]]]])
    x = nn.NetVar(data)
    nn.MaxPool2D(x, 2, 1).back()
    t = torch.tensor(data, requires_grad=True)
    F.max_pool2d(t, 2, 1).sum().backward()
    np.testing.assert_array_equal(x.g, t.grad.numpy())
    x.reset()
    nn.MaxPool2D(x, 2).back()
    np.testing.assert_array_equal(x.g, [[[[1, 0, 0, 1], [0, 0, 0, 0], [1, 0, 1, 0],
                                          [0, 0, 0, 0]]]])


def test_pool_errors(rng):
    with pytest.raises(ValueError, match="MaxPool2D: a 5×5 window does not fit"):
        nn.MaxPool2D(var64(rng, 1, 1, 4, 4), 5)
    with pytest.raises(ValueError, match=r"AvgPool2D: x must be \(N, C, H, W\)"):
        nn.AvgPool2D(var64(rng, 4, 4), 2)
    with pytest.raises(ValueError, match="MaxPool2D: size must be an int or a pair"):
        nn.MaxPool2D(var64(rng, 1, 1, 4, 4), (2, 2, 2))


# Padded pools. Each op is (name, pool(x, size, stride, padding), PyTorch's function of the same
# arguments); the cases cover odd and even windows, strides 1 and 2, padding 0, 1, half the
# window and a (1, 0) pair.
PADDED_POOLS = {
    "max": (lambda x, k, s, p: nn.MaxPool2D(x, k, s, p),
            lambda F, t, k, s, p: F.max_pool2d(t, k, s, p)),
    "avg": (lambda x, k, s, p: nn.AvgPool2D(x, k, s, p),
            lambda F, t, k, s, p: F.avg_pool2d(t, k, s, p, count_include_pad=True)),
    "avg_real_cells": (lambda x, k, s, p: nn.AvgPool2D(x, k, s, p, count_include_pad=False),
                       lambda F, t, k, s, p: F.avg_pool2d(t, k, s, p, count_include_pad=False)),
}
PADDED_CASES = [  # x shape, size, stride, padding
    ((2, 2, 5, 5), 3, 1, 1),
    ((1, 2, 6, 6), 2, 2, 1),
    ((1, 1, 5, 6), (3, 2), (2, 1), (1, 0)),
    ((2, 1, 4, 5), 4, 2, (1, 0)),
    ((1, 2, 5, 4), 3, 2, 0),
    ((1, 1, 7, 6), 5, 1, 2),
    ((1, 1, 3, 3), 2, 1, 1),
]


def reference_pool(a, kernel, stride, padding, kind):
    """The pools written out window by window on the unpadded input (kind 'max', 'avg' or
    'avg_real_cells'): the windows' cells outside ``a`` are padding."""
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    H, W = a.shape[-2:]
    Ho, Wo = (H + 2 * ph - kh) // sh + 1, (W + 2 * pw - kw) // sw + 1
    y = np.empty(a.shape[:2] + (Ho, Wo))
    for r in range(Ho):
        for q in range(Wo):
            top, left = r * sh - ph, q * sw - pw
            real = a[..., max(top, 0):top + kh, max(left, 0):left + kw]
            if kind == "max":
                y[..., r, q] = real.max(axis=(-2, -1))
            else:
                cells = kh * kw if kind == "avg" else real.shape[-2] * real.shape[-1]
                y[..., r, q] = real.sum(axis=(-2, -1)) / cells
    return y


def _as_pair(value):
    return (value, value) if isinstance(value, int) else value


@pytest.mark.parametrize("kind", PADDED_POOLS)
@pytest.mark.parametrize("shape,size,stride,padding", PADDED_CASES)
def test_padded_pool_gradcheck_and_values(kind, shape, size, stride, padding, rng):
    pool = PADDED_POOLS[kind][0]
    x = var64(rng, *shape)
    nn.gradcheck(lambda v: pool(v, size, stride, padding), x)
    expected = reference_pool(x.data, _as_pair(size), _as_pair(stride), _as_pair(padding), kind)
    np.testing.assert_allclose(pool(x, size, stride, padding).data, expected, rtol=1e-13)


@pytest.mark.parametrize("kind", PADDED_POOLS)
@pytest.mark.parametrize("shape,size,stride,padding", PADDED_CASES)
def test_padded_pool_matches_pytorch(kind, shape, size, stride, padding, rng, torch):
    import torch.nn.functional as F
    ours, theirs = PADDED_POOLS[kind]
    # the gradients sum overlapping windows in another order than PyTorch: a tiny atol keeps a
    # sum that cancels to ~0 from failing the relative test
    assert_matches_pytorch(torch, lambda v: ours(v, size, stride, padding),
                           lambda t: theirs(F, t, size, stride, padding),
                           rng.standard_normal(shape), rng=rng, rtol=1e-12, grad_atol=1e-14)


def test_maxpool_padding_never_wins_over_negative_windows(rng):
    data = -1 - rng.random((2, 3, 5, 5))          # every element below zero
    x = nn.NetVar(data)
    y = nn.MaxPool2D(x, 3, 2, 1)                   # every window overlaps the padding
    assert y.shape == (2, 3, 3, 3)
    assert (y.data < 0).all()                      # a zero pad would give 0 at every window
    np.testing.assert_array_equal(y.data, reference_pool(data, (3, 3), (2, 2), (1, 1), "max"))
    y.back()
    # each of the 2·3·3·3 outputs hands its gradient of 1 to one real cell: nothing is lost
    assert x.g.min() >= 0 and x.g.sum() == y.data.size
    corner = data[..., :2, :2].reshape(2, 3, 4).max(axis=-1)
    np.testing.assert_array_equal(y.data[..., 0, 0], corner)


def test_maxpool_padding_never_wins_over_minus_infinity():
    # a window whose real cells are all -inf tied with its padding, which came first: five of
    # the nine outputs' gradients went to the padding and were lost
    data = np.array([[[[-np.inf, -np.inf], [-np.inf, 1.0]]]])
    x = nn.NetVar(data)
    y = nn.MaxPool2D(x, 2, 1, 1)
    y.back()
    np.testing.assert_array_equal(x.g, [[[[3.0, 1.0], [1.0, 4.0]]]])     # PyTorch's
    nan = nn.NetVar(np.array([[[[np.nan, 2.0], [3.0, 1.0]]]]))
    nn.MaxPool2D(nan, 2, 1, 1).back()
    assert nan.g.sum() == 9 and nan.g[0, 0, 0, 0] == 4     # NaN is the max of its windows


def test_avgpool_count_include_pad_divides_by_the_window_or_the_real_cells():
    x = nn.NetVar(np.ones((1, 1, 4, 4)))
    with_pad = nn.AvgPool2D(x, 3, 1, 1).data[0, 0]
    real_cells = nn.AvgPool2D(x, 3, 1, 1, count_include_pad=False).data[0, 0]
    np.testing.assert_allclose(real_cells, np.ones((4, 4)), rtol=1e-15)
    assert with_pad[0, 0] == pytest.approx(4 / 9) and with_pad[0, 1] == pytest.approx(6 / 9)
    assert with_pad[1, 1] == 1.0


def test_padded_pools_keep_float32(rng):
    for pool in (lambda v: nn.MaxPool2D(v, 3, 1, 1),
                 lambda v: nn.AvgPool2D(v, 2, 2, 1, count_include_pad=False)):
        x = nn.NetVar(rng.standard_normal((1, 2, 4, 4)).astype(np.float32))
        y = pool(x)
        y.back()
        assert y.dtype == x.g.dtype == np.float32


@pytest.mark.parametrize("op", [nn.MaxPool2D, nn.AvgPool2D])
def test_pool_padding_errors(op, rng):
    x = var64(rng, 1, 1, 6, 6)
    name = op.__name__
    with pytest.raises(ValueError, match=rf"{name}: padding \(2, 2\) must be at most half the "
                                         r"3×3 window on each axis"):
        op(x, 3, 1, 2)
    with pytest.raises(ValueError, match=rf"{name}: padding \(1, 2\) must be at most half the "
                                         r"2×3 window"):
        op(x, (2, 3), 1, (1, 2))
    for bad in (-1, (1, -1), (1, 1, 1)):
        with pytest.raises(ValueError, match=rf"{name}: padding must be an int or a pair of "
                                             r"ints ≥ 0, got "):
            op(x, 2, 2, bad)
    for bad in (1.0, 0.5, "1", True, (1, 1.0), None):      # wrong types: TypeError
        with pytest.raises(TypeError, match=rf"{name}: padding must be an int or a pair of "
                                            r"ints ≥ 0, got "):
            op(x, 2, 2, bad)


def test_ffn_with_padded_pools_saves_and_loads(rng, tmp_path):
    x = nn.NetVar(rng.standard_normal((2, 1, 6, 6)), requires_grad=False)
    net = nn.FFN((nn.Conv2D, var64(rng, 4, 1, 3, 3), var64(rng, 4), 1, 1),
                 (nn.MaxPool2D, 2, 2, 1),
                 (nn.AvgPool2D, 3, 1, (1, 0), False))
    before = net(x).data
    assert before.shape == (2, 4, 4, 2)
    path = str(tmp_path / "pools.npz")
    nn.save(path, net)
    loaded = nn.load(path).model
    assert loaded.topology[1][1:] == (2, 2, 1)
    assert loaded.topology[2][1:] == (3, 1, (1, 0), False)
    np.testing.assert_array_equal(loaded(x).data, before)


# ----------------------------------------------------------------------------- bad arguments

def test_conv2d_refuses_a_kernel_or_an_output_of_size_zero(rng):
    # a 0-row kernel gave a (2, 4, 7, 4) output of bias values, larger than x
    x = var64(rng, 2, 3, 6, 6)
    for shape in ((4, 3, 0, 3), (4, 3, 3, 0), (0, 3, 3, 3)):
        with pytest.raises(ValueError, match=r"Conv2D: w must be \(C_out, C_in, kh, kw\) with no "
                                             r"zero size, got shape " + re.escape(str(shape))):
            nn.Conv2D(x, nn.NetVar(np.zeros(shape)))


def test_conv2d_refuses_a_bias_of_another_shape(rng):
    # a (2, 2) bias for 4 output channels was read as 4 values in row order
    x, w = var64(rng, 2, 3, 6, 6), var64(rng, 4, 3, 3, 3)
    for shape in ((2, 2), (4, 1), (1, 4, 1)):
        with pytest.raises(ValueError, match=r"Conv2D: b of shape \(.*\) must be \(4,\) or "
                                             r"\(1, 4\): one value for each of the 4 output"):
            nn.Conv2D(x, w, nn.NetVar(np.zeros(shape)))
    for b in (nn.constant(np.ones(4)), nn.NetVar(np.ones(4))):        # (4,) and (1, 4)
        np.testing.assert_allclose(nn.Conv2D(x, w, b).data, nn.Conv2D(x, w).data + 1)


@pytest.mark.parametrize("name, bad", [("stride", True), ("stride", 1.0), ("stride", (1, 2.0)),
                                       ("padding", np.float64(1))])
def test_conv2d_refuses_strides_and_paddings_that_are_not_ints(name, bad, rng):
    with pytest.raises(TypeError, match=rf"Conv2D: {name} must be an int or a pair of ints ≥ "
                                        rf"\d, got {re.escape(repr(bad))}"):
        nn.Conv2D(var64(rng, 1, 1, 5, 5), var64(rng, 1, 1, 3, 3), **{name: bad})


def test_conv_and_pools_take_arrays_as_constants(rng):
    # an array operand failed with an AttributeError on ._data
    x, w, b = var64(rng, 2, 3, 6, 6), var64(rng, 4, 3, 3, 3), var64(rng, 4)
    expected = nn.Conv2D(x, w, b).data
    np.testing.assert_array_equal(nn.Conv2D(x.data, w, b.data).data, expected)
    y = nn.Conv2D(x, w.data, b)
    y.back()
    assert x.g.shape == x.shape and b.g.shape == b.shape
    for pool in (nn.MaxPool2D, nn.AvgPool2D):
        np.testing.assert_array_equal(pool(x.data, 2).data, pool(x, 2).data)
    # integers beside a float64 node are exact, as with + and @ (float32 gave 123456792)
    big = np.full((1, 1, 1, 1), 123456789)
    one = nn.NetVar(np.ones((1, 1, 1, 1)))
    assert nn.Conv2D(big, one).data.item() == 123456789
    assert nn.Einsum("ij,jk->ik", np.array([[123456789, 3]]),
                     nn.NetVar(np.array([[1.0], [0.0]]))).data.item() == 123456789


@pytest.mark.parametrize("flag", ["no", None, 0, 1])
def test_avg_pool_refuses_count_include_pad_that_is_not_a_bool(flag, rng):
    # "no" is truthy: it counted the padding
    with pytest.raises(TypeError, match=r"AvgPool2D: count_include_pad must be True or False, "
                                        r"got "):
        nn.AvgPool2D(var64(rng, 1, 1, 4, 4), 3, 1, 1, count_include_pad=flag)


def test_max_pooling_sends_an_infinite_gradient_to_the_arg_max_alone():
    # g · [arg = k] made inf · 0 = NaN at every other cell of the window (PyTorch: 0 there),
    # and so did the rule grad(create_graph=True) differentiates
    x = nn.NetVar(np.arange(16.0).reshape(1, 1, 4, 4))
    seed = np.ones((1, 1, 2, 2))
    seed[0, 0, 0, 0] = np.inf
    nn.MaxPool2D(x, 2).back(seed)
    np.testing.assert_array_equal(x.g[0, 0, :2, :2], [[0.0, 0.0], [0.0, np.inf]])
    assert np.isfinite(x.g[0, 0, 2:, :]).all()
    v = nn.NetVar(np.full((1, 1, 4, 4), np.inf), requires_grad=False)
    g = nn.NetVar(np.ones((1, 1, 2, 2)))
    (first,) = nn.grad(nn.MaxPool2D(x, 2), [x], g=g, create_graph=True)
    (second,) = nn.grad((first * np.where(np.arange(16).reshape(1, 1, 4, 4) % 5 == 0, np.inf,
                                          1.0)).sum(), [g])
    assert not np.isnan(second).any()


# ----------------------------------------------------------------------------- Second derivatives
# grad(create_graph=True) against PyTorch's double backward in float64 (test_gradgradcheck_every_op
# checks each op alone against finite differences): a gradient penalty and Hessian-vector products
# through Conv2D and the pools, and their third derivatives (the ops that Conv2D and the pools
# build for their gradients are differentiated again).

def penalty_gradients(ours, theirs, arrays):
    """The gradient of the penalty ‖∂L/∂x‖² (x the first input) with respect to every input,
    L being ``ours(*nodes)`` and ``theirs(*tensors)``: (nnkit's list, PyTorch's list)."""
    import torch
    nodes = [nn.NetVar(a) for a in arrays]
    tensors = [torch.tensor(a, requires_grad=True) for a in arrays]
    (dx,) = nn.grad(ours(*nodes), [nodes[0]], create_graph=True)
    mine = nn.grad((dx * dx).sum(), nodes)
    (dx,) = torch.autograd.grad(theirs(*tensors), [tensors[0]], create_graph=True)
    expected = torch.autograd.grad((dx * dx).sum(), tensors)
    return mine, [e.numpy() for e in expected]


def test_gradient_penalty_through_conv_and_pools_matches_torch(torch, rng):
    F = torch.nn.functional
    r = rng.standard_normal((2, 3, 3, 1))

    def ours(x, w, b):
        h = nn.Conv2D(x, w, b, stride=(1, 2), padding=1).tanh()                  # (2, 3, 5, 3)
        pooled = nn.AvgPool2D(h, 2, stride=1, padding=(1, 0), count_include_pad=False)
        return (nn.MaxPool2D(pooled, 3, 2, 1) ** 2 * r).sum()                    # (2, 3, 3, 1)

    def theirs(x, w, b):
        h = F.conv2d(x, w, b, stride=(1, 2), padding=1).tanh()
        pooled = F.avg_pool2d(h, 2, stride=1, padding=(1, 0), count_include_pad=False)
        return (F.max_pool2d(pooled, 3, 2, 1) ** 2 * torch.tensor(r)).sum()

    arrays = [rng.standard_normal((2, 2, 5, 5)), rng.standard_normal((3, 2, 3, 3)),
              rng.standard_normal(3)]
    mine, expected = penalty_gradients(ours, theirs, arrays)
    for m, e in zip(mine, expected):
        assert np.abs(e).max() > 1e-3
        np.testing.assert_allclose(m.reshape(e.shape), e, rtol=1e-9, atol=1e-12)


def test_conv_hvp_with_the_kernel_read_by_two_convs_matches_torch(torch, rng):
    """w is read by two convolutions (and x by one of them and a square): the second
    derivatives mix x and w (the cross terms of the bilinear op)."""
    F = torch.nn.functional

    def ours(x, w):
        h = nn.Conv2D(x, w, stride=2)                                            # (1, 2, 3, 3)
        return (h * h).sum() + nn.Conv2D(h, w[:, :2], padding=1).sin().sum() + (x * x * x).sum()

    def theirs(x, w):
        h = F.conv2d(x, w, stride=2)
        return (h * h).sum() + F.conv2d(h, w[:, :2], padding=1).sin().sum() + (x * x * x).sum()

    assert_same_hvp(ours, theirs, [rng.standard_normal((1, 3, 7, 7)),
                                   rng.standard_normal((2, 3, 3, 3))], rng)


def test_third_derivatives_through_conv_and_pool_gradients(rng):
    """The gradients of Conv2D and the pools are ops of their own (linear in each input);
    differentiating them twice more exercises their own backward rules."""
    x, w, g, h = (nn.NetVar(rng.standard_normal(shape)) for shape in
                  ((1, 1, 4, 4), (2, 1, 3, 3), (1, 2, 2, 2), (1, 1, 2, 2)))

    def conv_gradients(x, w, g):
        dx, dw = nn.grad(nn.Conv2D(x, w, padding=1, stride=2), [x, w], g=g, create_graph=True)
        return nn.Concat([dx.reshape(1, -1), dw.reshape(1, -1)], axis=1)

    assert nn.gradgradcheck(conv_gradients, x, w, g)

    def pool_gradients(x, g):
        y = nn.MaxPool2D(x, 3, 2, 1) * nn.AvgPool2D(x, 3, 2, 1, count_include_pad=False)
        return nn.grad(y, [x], g=g, create_graph=True)[0]

    assert nn.gradgradcheck(pool_gradients, x, h)


def test_max_pool_gradient_is_the_upstream_gradient_routed(rng):
    """y is piecewise linear in x: its gradient depends on g alone (a constant routing to each
    window's maximum), so with a constant g it is a constant, and its derivative with respect to
    g picks each window's maximum."""
    x = nn.NetVar(rng.standard_normal((1, 1, 4, 4)))
    (dx,) = nn.grad(nn.MaxPool2D(x, 2), [x], g=rng.standard_normal((1, 1, 2, 2)),
                    create_graph=True)
    assert not dx.requires_grad
    g = nn.NetVar(rng.standard_normal((1, 1, 2, 2)))
    (dx,) = nn.grad(nn.MaxPool2D(x, 2), [x], g=g, create_graph=True)
    v = rng.standard_normal((1, 1, 4, 4))
    windows = x.data.reshape(2, 2, 2, 2).transpose(0, 2, 1, 3).reshape(2, 2, 4)
    picked = np.take_along_axis(v.reshape(2, 2, 2, 2).transpose(0, 2, 1, 3).reshape(2, 2, 4),
                                windows.argmax(axis=2)[..., None], axis=2)
    np.testing.assert_array_equal(nn.grad((dx * v).sum(), [g])[0], picked.reshape(g.shape))
