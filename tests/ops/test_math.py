"""Elementwise math: gradchecks over broadcast shapes, subgradients and tie rules."""
import numpy as np
import pytest

import nnkit as nn
from tests.conftest import var64
from tests.ops.helpers import assert_matches_pytorch, assert_same_hvp

SHAPES = [(1, 5), (3, 4), (2, 3, 2)]
BROADCAST_PAIRS = [((3, 4), (3, 4)), ((3, 4), (1, 4)), ((2, 3, 4), (3, 1)), ((1, 4), (3, 1))]


@pytest.mark.parametrize("op,reference,positive", [
    (nn.Sqrt, np.sqrt, True), (nn.Abs, np.abs, False), (nn.Sin, np.sin, False),
    (nn.Cos, np.cos, False)])
@pytest.mark.parametrize("shape", SHAPES)
def test_unary_math_gradcheck(op, reference, positive, shape, rng):
    x = var64(rng, *shape, positive=positive)
    np.testing.assert_allclose(op(x).data, reference(x.data))
    nn.gradcheck(op, x)


def test_abs_subgradient_is_zero_at_zero():
    x = nn.NetVar(np.array([[-2.0, 0.0, 3.0]]))
    abs(x).back()
    np.testing.assert_array_equal(x.g, [[-1, 0, 1]])
    assert isinstance(x.abs(), nn.Abs)


@pytest.mark.parametrize("lo,hi", [(-0.5, 0.5), (None, 0.0), (0.0, None), (-1.0, 1.0)])
def test_clip(lo, hi, rng):
    x = var64(rng, 4, 5)
    y = x.clip(lo, hi)
    np.testing.assert_array_equal(y.data, np.clip(x.data, lo, hi))
    nn.gradcheck(lambda v: nn.Clip(v, lo, hi), x)
    x.reset()
    y.sum().back()
    inside = np.ones_like(x.data, dtype=bool)
    if lo is not None:
        inside &= x.data >= lo
    if hi is not None:
        inside &= x.data <= hi
    np.testing.assert_array_equal(x.g, inside)


def test_clip_with_array_bounds_and_errors(rng):
    x = var64(rng, 3, 4)
    lo = np.full((1, 4), -0.2)
    np.testing.assert_array_equal(nn.Clip(x, lo, 0.3).data, np.clip(x.data, lo, 0.3))
    with pytest.raises(ValueError, match="Clip: the lower bound 1 exceeds the upper bound 0"):
        x.clip(1, 0)
    with pytest.raises(ValueError, match="Clip: give at least one bound"):
        x.clip()


@pytest.mark.parametrize("shapes", BROADCAST_PAIRS)
def test_where_gradcheck(shapes, rng):
    a, b = var64(rng, *shapes[0]), var64(rng, *shapes[1])
    cond = rng.random(np.broadcast_shapes(shapes[0], shapes[1])) > 0.5
    y = nn.Where(cond, a, b)
    np.testing.assert_array_equal(y.data, np.where(cond, a.data, b.data))
    nn.gradcheck(lambda p, q: nn.Where(cond, p, q), a, b)
    nn.gradcheck(lambda p: nn.Where(nn.NetVar(cond, dtype=bool), p, 0.0), a)
    with pytest.raises(ValueError, match="Where: cannot broadcast cond of shape"):
        nn.Where(np.ones((5, 5), dtype=bool), a, b)


@pytest.mark.parametrize("op,reference", [(nn.Maximum, np.maximum), (nn.Minimum, np.minimum)])
@pytest.mark.parametrize("shapes", BROADCAST_PAIRS)
def test_maximum_minimum_gradcheck(op, reference, shapes, rng):
    a, b = var64(rng, *shapes[0]), var64(rng, *shapes[1])
    np.testing.assert_array_equal(op(a, b).data, reference(a.data, b.data))
    nn.gradcheck(op, a, b)
    nn.gradcheck(lambda v: op(v, 0.1), a)


def test_maximum_ties_split_evenly():
    a = nn.NetVar(np.array([[1.0, 2.0, 3.0]]))
    b = nn.NetVar(np.array([[2.0, 2.0, 1.0]]))
    nn.Maximum(a, b).back()
    np.testing.assert_array_equal(a.g, [[0, 0.5, 1]])
    np.testing.assert_array_equal(b.g, [[1, 0.5, 0]])
    a.reset(), b.reset()
    nn.Minimum(a, b).back()
    np.testing.assert_array_equal(a.g, [[1, 0.5, 0]])


def test_maximum_matches_pytorch(torch, rng):
    a = rng.integers(0, 3, size=(4, 5)).astype(float)
    b = rng.integers(0, 3, size=(1, 5)).astype(float)
    for op, reference in [(nn.Maximum, torch.maximum), (nn.Minimum, torch.minimum)]:
        assert_matches_pytorch(torch, op, reference, a, b, rng=rng)


def test_maximum_broadcast_error(rng):
    with pytest.raises(ValueError, match=r"Maximum: cannot broadcast a of shape \(2, 3\) with b "
                                         r"of shape \(2, 2\)"):
        nn.Maximum(var64(rng, 2, 3), var64(rng, 2, 2))


def test_clip_bounds_must_be_numbers_or_arrays_without_nan(rng):
    x = var64(rng, 3, 4)
    with pytest.raises(ValueError, match=r"Clip: lo holds NaN"):
        x.clip(float("nan"), 1.0)
    with pytest.raises(ValueError, match=r"Clip: hi holds NaN"):
        nn.Clip(x, None, np.array([[0.0, np.nan, 1.0, 1.0]]))
    with pytest.raises(TypeError, match=r"Clip: lo must be a number or an array, got str"):
        x.clip("low", 1.0)
    with pytest.raises(ValueError, match=r"Clip: lo of shape \(5,\) does not broadcast against x "
                                         r"of shape \(3, 4\)"):
        x.clip(np.zeros(5), None)
    with pytest.raises(ValueError, match=r"Clip: the lower bound .* exceeds the upper bound"):
        nn.Clip(x, np.array([0.0, 0.0, 2.0, 0.0]), 1.0)


def test_where_condition_must_be_boolean_or_0_1(rng):
    a, b = var64(rng, 2, 3), var64(rng, 2, 3)
    with pytest.raises(ValueError, match=r"Where: cond must hold booleans or 0/1, got 0.5"):
        nn.Where(np.array([[1.0, 0.5, 0.0]]), a, b)
    chosen = nn.Where(np.array([[1.0, 0.0, 1.0]]), a, b)
    np.testing.assert_array_equal(chosen.data, np.where([[True, False, True]], a.data, b.data))


def test_clip_refuses_a_bound_that_requires_a_gradient(rng):
    # such a bound was taken as a constant and silently got no gradient (PyTorch's clamp
    # gives it one): refused, pointing at Maximum / Minimum, which differentiate it
    x = var64(rng, 1, 3)
    lo = nn.NetVar(np.full((1, 3), 0.3))
    with pytest.raises(ValueError, match=r"Clip: lo .* requires a gradient.* nn.Maximum\(x, lo\)"):
        nn.Clip(x, lo)
    with pytest.raises(ValueError, match=r"Clip: hi .* requires a gradient.* nn.Minimum\(x, hi\)"):
        x.clip(None, lo)
    with nn.no_grad():                                   # nothing recorded: taken
        np.testing.assert_array_equal(nn.Clip(x, lo).data, np.maximum(x.data, 0.3))
    y = nn.Clip(x, lo.detach())                          # a constant bound: as before
    np.testing.assert_array_equal(y.data, np.maximum(x.data, 0.3))
    m = nn.Maximum(x, lo)
    m.sum().back()
    np.testing.assert_array_equal(lo.g, (x.data < 0.3).astype(float))


# ----------------------------------------------------------------------------- Second derivatives
# Hessian-vector products (grad(create_graph=True)) against PyTorch's double backward in float64;
# test_gradgradcheck_every_op checks each op alone against finite differences.

def test_hvp_through_the_elementwise_math_ops(torch, rng):
    keep = np.array([[True, False, True, True]])

    def ours(a, b):
        picked = nn.Where(keep, nn.Maximum(a, b) * a.cos(), nn.Minimum(a, b).sin() * b)
        root = nn.Sqrt(nn.Abs(a) + 1.0) * nn.Clip(a * b, -0.5, 0.7)
        return (picked * root).sum() + nn.CosineSimilarity(a, b * b).sum()

    def theirs(a, b):
        picked = torch.where(torch.tensor(keep), torch.maximum(a, b) * a.cos(),
                             torch.minimum(a, b).sin() * b)
        root = torch.sqrt(a.abs() + 1.0) * torch.clamp(a * b, -0.5, 0.7)
        return (picked * root).sum() + torch.cosine_similarity(a, b * b, dim=-1).sum()

    assert_same_hvp(ours, theirs, [rng.standard_normal((3, 4)), rng.standard_normal((1, 4))],
                    rng)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shape", [(7,), (5, 1), (3, 64), (2, 3, 65), (0, 4)])
def test_sums_over_the_last_axis_equal_numpys(shape, dtype):
    from nnkit.ops.math import last_dot, last_sum
    rng = np.random.default_rng(0)
    a = rng.standard_normal(shape).astype(dtype)
    b = rng.standard_normal(shape).astype(dtype)
    tol = {np.float16: 1e-2, np.float32: 1e-5, np.float64: 1e-13}[dtype]
    summed = np.float32 if dtype == np.float16 else dtype       # float16 sums in float32
    for x in (a, np.swapaxes(a, 0, -1).copy().swapaxes(0, -1)):       # C order, and not
        found = last_sum(x)
        assert found.shape == x.shape[:-1] + (1,) and found.dtype == summed
        np.testing.assert_allclose(found, x.sum(axis=-1, keepdims=True), rtol=tol, atol=tol)
    found = last_dot(a, b)
    assert found.shape == a.shape[:-1] + (1,) and found.dtype == summed
    np.testing.assert_allclose(found, (a * b).sum(axis=-1, keepdims=True), rtol=tol, atol=tol)
