import numpy as np
import pytest

import nnkit as nn
from tests.conftest import var64
from tests.ops.helpers import (assert_honours_the_upstream_gradient, assert_matches_pytorch,
                               assert_same_hvp)


@pytest.mark.parametrize("op", [nn.Sum, nn.Mean])
@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 2)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reduction_gradcheck(op, axis, keepdims, rng):
    x = var64(rng, 2, 3, 4)
    nn.gradcheck(lambda v: op(v, axis=axis, keepdims=keepdims), x)
    expected = getattr(np, op.__name__.lower())(x.data, axis=axis, keepdims=keepdims)
    np.testing.assert_allclose(op(x, axis, keepdims).data, expected)


def test_methods(rng):
    x = var64(rng, 3, 4)
    np.testing.assert_allclose(x.sum(axis=0).data, x.data.sum(axis=0))
    np.testing.assert_allclose(x.mean().data, x.data.mean())
    with pytest.raises(ValueError, match="Sum: axis 2 is out of range"):
        x.sum(axis=2)


REDUCE_CASES = [((3, 4), None, False), ((3, 4), 0, False), ((3, 4), 1, True),
                ((2, 3, 4), (0, 2), False), ((2, 3, 4), -1, True), ((1, 5), 1, False)]


@pytest.mark.parametrize("op,reference", [(nn.Max, np.max), (nn.Min, np.min),
                                          (nn.Var, np.var), (nn.Norm, None),
                                          (nn.LogSumExp, None)])
@pytest.mark.parametrize("shape,axis,keepdims", REDUCE_CASES)
def test_new_reductions_gradcheck_and_values(op, reference, shape, axis, keepdims, rng):
    x = var64(rng, *shape)
    y = op(x, axis, keepdims)
    if reference is None:
        reference = {nn.Norm: lambda a, axis, keepdims: np.sqrt((a * a).sum(axis, keepdims=keepdims)),
                     nn.LogSumExp: lambda a, axis, keepdims: np.log(np.exp(a).sum(axis, keepdims=keepdims))}[op]
    np.testing.assert_allclose(y.data, reference(x.data, axis=axis, keepdims=keepdims))
    nn.gradcheck(lambda v: op(v, axis, keepdims), x)


def test_max_min_split_ties_evenly():
    x = nn.NetVar(np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]]))
    x.max(axis=1).back(np.array([4.0, 8.0]))
    np.testing.assert_allclose(x.g, [[0, 2, 2, 0], [2, 2, 2, 2]])
    x.reset()
    x.min().back()
    np.testing.assert_allclose(x.g, [[0, 0, 0, 1], [0, 0, 0, 0]])
    x.reset()
    nn.Max(x, 0).back(np.array([1.0, 1.0, 1.0, 1.0]))
    np.testing.assert_allclose(x.g, [[0, 1, 1, 0], [1, 0, 0, 1]])


def test_logsumexp_is_stable():
    x = nn.NetVar(np.array([[1000.0, 1000.0], [-1000.0, -np.inf], [-np.inf, -np.inf]]))
    with np.errstate(over="raise", divide="ignore"):     # log 0 = −inf for the last row
        y = nn.LogSumExp(x, axis=1)
    np.testing.assert_allclose(y.data, [1000 + np.log(2), -1000, -np.inf])
    nn.LogSumExp(x[:2], axis=1).back()
    np.testing.assert_allclose(x.g[:2], [[0.5, 0.5], [1, 0]])


def test_var_ddof_and_error(rng):
    x = var64(rng, 4, 3)
    np.testing.assert_allclose(x.var(0, ddof=1).data, np.var(x.data, 0, ddof=1))
    nn.gradcheck(lambda v: nn.Var(v, 0, ddof=1), x)
    with pytest.raises(ValueError, match="Var: 1 values over axes"):
        nn.Var(var64(rng, 1, 3), 0, ddof=1)


def test_norm_gradient_is_zero_at_zero(rng):
    x = nn.NetVar(np.zeros((2, 3)))
    x.norm(axis=1).back()
    np.testing.assert_array_equal(x.g, 0)
    x = nn.NetVar(np.array([[0.0, 0.0], [3.0, 4.0]]))
    y = x.norm(1, keepdims=True)
    np.testing.assert_allclose(y.data, [[0], [5]])
    y.back()
    np.testing.assert_allclose(x.g, [[0, 0], [0.6, 0.8]])


def test_argmax_is_an_integer_constant(rng):
    x = var64(rng, 3, 5)
    i = x.argmax(axis=1)
    np.testing.assert_array_equal(i.data, x.data.argmax(1))
    assert i.dtype.kind == "i" and not i.requires_grad
    assert nn.ArgMax(x).data == x.data.argmax()
    assert nn.ArgMax(x, -1, keepdims=True).shape == (3, 1)
    np.testing.assert_array_equal(x[np.arange(3), i].data, x.data.max(1))


def test_new_reductions_keep_float32(rng):
    x = nn.NetVar(rng.standard_normal((3, 4)).astype(np.float32))
    for op in (nn.Max, nn.Min, nn.LogSumExp, nn.Var, nn.Norm):
        x.reset()
        y = op(x, 1)
        y.back()
        assert y.dtype == np.float32 and x.g.dtype == np.float32, op.__name__


def test_reduction_methods_match_the_ops(rng):
    x = var64(rng, 3, 4)
    for method, op in [("max", nn.Max), ("min", nn.Min), ("logsumexp", nn.LogSumExp),
                       ("var", nn.Var), ("norm", nn.Norm)]:
        assert isinstance(getattr(x, method)(1), op)
        np.testing.assert_allclose(getattr(x, method)(1).data, op(x, 1).data)
    with pytest.raises(ValueError, match="Max: axis 3 is out of range"):
        x.max(3)


@pytest.mark.parametrize("shapes,axis", [(((4, 3), (4, 3)), -1), (((4, 3), (1, 3)), 1),
                                         (((2, 3, 4), (2, 3, 4)), 1), (((2, 3, 4), (4,)), -1)])
def test_cosine_similarity_gradcheck(shapes, axis, rng):
    a, b = var64(rng, *shapes[0]), var64(rng, *shapes[1])
    if len(shapes[1]) == 1:
        b = nn.constant(b.data.reshape(shapes[1]))
        b.requires_grad = True
    y = nn.CosineSimilarity(a, b, axis)
    an, bn = np.broadcast_arrays(a.data, b.data)
    expected = (an * bn).sum(axis) / np.linalg.norm(an, axis=axis) / np.linalg.norm(bn, axis=axis)
    np.testing.assert_allclose(y.data, expected)
    nn.gradcheck(lambda u, v: nn.CosineSimilarity(u, v, axis), a, b)


def test_cosine_similarity_near_zero_vectors(rng):
    a = nn.NetVar(np.array([[1e-10, -2e-10], [0.0, 0.0]]))
    b = var64(rng, 2, 2)
    y = nn.CosineSimilarity(a, b)
    assert np.isfinite(y.data).all() and y.data[1] == 0
    # below eps the norm is the constant eps: y is linear in a there
    np.testing.assert_allclose(y.data[0], (a.data[0] @ b.data[0]) / 1e-8 /
                               np.linalg.norm(b.data[0]))
    nn.gradcheck(nn.CosineSimilarity, a, b, eps=1e-12)


def test_cosine_similarity_honours_the_upstream_gradient(rng):
    z = nn.NetVar(rng.standard_normal((3, 4)))
    other = rng.random((3, 4))
    assert_honours_the_upstream_gradient(lambda: nn.CosineSimilarity(z, other).sum(), z)


def test_cosine_similarity_matches_pytorch(torch, rng):
    import torch.nn.functional as F
    z = rng.standard_normal((6, 4)) * 3
    other = rng.standard_normal((6, 4))
    for axis in (1, 0):
        assert_matches_pytorch(torch, lambda a, b: nn.CosineSimilarity(a, b, axis=axis),
                               lambda a, b: F.cosine_similarity(a, b, dim=axis), z, other,
                               rng=rng, rtol=1e-10, grad_rtol=1e-9, grad_atol=1e-12)


# ----------------------------------------------------------------------------- bad axes, keepdims

AXIS_OPS = [nn.Sum, nn.Mean, nn.Max, nn.Min, nn.LogSumExp, nn.Var, nn.Norm, nn.ArgMax]


@pytest.mark.parametrize("op", AXIS_OPS)
@pytest.mark.parametrize("axis", [True, False, (0, True), np.bool_(True), 1.0, "1"])
def test_reductions_refuse_an_axis_that_is_not_an_int(op, axis, rng):
    # True is an int in Python: x.sum(True) summed axis 1
    with pytest.raises(TypeError, match=rf"{op.__name__}: axis must be an int, a tuple of ints or "
                                        r"None, got "):
        op(var64(rng, 2, 3), axis)


@pytest.mark.parametrize("op", AXIS_OPS)
def test_reductions_refuse_axes_out_of_range_naming_the_shape(op, rng):
    for axis in (2, -3, (0, 2)):
        with pytest.raises(ValueError, match=rf"{op.__name__}: axis -?[23] (\(in axis=\(0, 2\)\) "
                                             r")?is out of range for an input of 2 dimensions, "
                                             r"x of shape \(2, 3\)"):
            op(var64(rng, 2, 3), axis)
    with pytest.raises(ValueError, match=rf"{op.__name__}: repeated axis in \(1, -1\)"):
        op(var64(rng, 2, 3), (1, -1))


@pytest.mark.parametrize("op", AXIS_OPS)
@pytest.mark.parametrize("keepdims", [1, 0, "no", None, (1,)])
def test_reductions_refuse_keepdims_that_is_not_a_bool(op, keepdims, rng):
    # x.sum(0, 1) (two axes, PyTorch-style) summed axis 0 alone and kept it
    with pytest.raises(TypeError, match=rf"{op.__name__}: keepdims must be True or False, got "
                                        r".*axis=\(0, 1\)"):
        op(var64(rng, 2, 3), 0, keepdims)


def test_reductions_take_numpy_ints_and_bools(rng):
    x = var64(rng, 2, 3)
    np.testing.assert_allclose(nn.Sum(x, np.int64(1), np.bool_(True)).data,
                               x.data.sum(1, keepdims=True))
    assert nn.ArgMax(x, np.int64(-1)).shape == (2,)


@pytest.mark.parametrize("ddof", [True, "1", None])
def test_var_refuses_a_ddof_that_is_not_a_number(ddof, rng):
    with pytest.raises(TypeError, match=r"Var: ddof must be a number \(1 for the unbiased "
                                        r"estimate\), got "):
        nn.Var(var64(rng, 4, 3), 0, ddof=ddof)
    with pytest.raises(ValueError, match="Var: 4 values over axes .* leave no degrees of freedom"):
        nn.Var(var64(rng, 4, 3), 0, ddof=float("nan"))      # NaN ddof gave a NaN variance
    np.testing.assert_allclose(nn.Var(var64(rng, 4, 3), 0, ddof=1.5).data.shape, (3,))


@pytest.mark.parametrize("axis", [True, 1.0, (1, 0)])
def test_cosine_similarity_refuses_an_axis_that_is_not_an_int(axis, rng):
    with pytest.raises(TypeError, match=r"CosineSimilarity: axis must be an int, got "):
        nn.CosineSimilarity(var64(rng, 3, 4), var64(rng, 3, 4), axis)
    with pytest.raises(ValueError, match=r"CosineSimilarity: axis 2 is out of range for a of "
                                         r"shape \(3, 4\) and b of shape \(3, 4\)"):
        nn.CosineSimilarity(var64(rng, 3, 4), var64(rng, 3, 4), 2)


# ----------------------------------------------------------------------------- PyTorch's keywords

METHODS = ["sum", "mean", "max", "min", "logsumexp", "var", "norm", "argmax"]


@pytest.mark.parametrize("method", METHODS)
def test_methods_name_nnkits_spelling_of_dim_and_keepdim(method, rng):
    x = var64(rng, 2, 3)
    with pytest.raises(TypeError, match=rf"^{method}\(\): nnkit spells the axis argument axis=, "
                                        r"not dim="):
        getattr(x, method)(dim=1)
    with pytest.raises(TypeError, match=rf"^{method}\(\): nnkit spells the keepdims argument "
                                        r"keepdims=, not keepdim="):
        getattr(x, method)(1, keepdim=True)
    with pytest.raises(TypeError, match=rf"^{method}\(\) got an unexpected keyword argument "
                                        r"'axes'"):
        getattr(x, method)(axes=1)
    assert getattr(x, method)(axis=1, keepdims=True).shape == (2, 1)


def test_var_and_norm_methods_explain_pytorchs_other_keywords(rng):
    x = var64(rng, 2, 3)
    with pytest.raises(TypeError, match=r"var\(\): nnkit spells the ddof argument ddof=, not "
                                        r"unbiased= \(ddof=1 for the unbiased estimate\)"):
        x.var(1, unbiased=True)
    with pytest.raises(TypeError, match=r"var\(\): nnkit spells the ddof argument ddof=, not "
                                        r"correction="):
        x.var(1, correction=1)
    with pytest.raises(TypeError, match=r"norm\(\) got an unexpected keyword argument 'p'; "
                                        r"nnkit's norm is always the L2 norm"):
        x.norm(p=1)
    np.testing.assert_allclose(x.var(1, ddof=1).data, x.data.var(1, ddof=1))


@pytest.mark.parametrize("op", [nn.Max, nn.Min])
def test_max_and_min_over_the_nonempty_axes_of_an_empty_x(op):
    # NumPy and PyTorch reduce axis 1 of a (0, 3) array to shape (0,); this was refused as
    # "x is empty" although Sum, Mean and LogSumExp take it
    x = nn.NetVar(np.zeros((0, 3)))
    y = op(x, axis=1)
    assert y.shape == (0,)
    y.sum().back()
    assert x.g.shape == (0, 3)


def test_the_variance_of_integers_is_a_float():
    # the result was cast to x's dtype (for float16): integers gave 1 for 1.556
    x = nn.NetVar(np.array([[1, 2, 4]]), dtype=int)
    assert x.var().data == pytest.approx(np.var([1, 2, 4])) and x.var().dtype == np.float64


# ----------------------------------------------------------------------------- Second derivatives
# Against PyTorch's double backward in float64 (test_gradgradcheck_every_op checks each op alone
# against finite differences): the (1, 1) and 0-d edge cases, ties and a zero norm.

def test_a_one_by_one_node_and_a_0d_node(torch, rng):
    """x is (1, 1); z = x[0, 0] is 0-d: reductions over every axis of both, a stack of 0-d
    nodes, and 0-d elementwise math."""
    def ours(x):
        z = x[0, 0]
        s = nn.Stack([z, nn.Sqrt(z * z + 2.0), z.sin()])              # (3,)
        return (nn.LogSumExp(x) * nn.Norm(s) + nn.Max(x) * nn.Min(s * z) + (s * s).sum()
                + nn.Pad(x * x, 1).sum() * z.cos())

    def theirs(x):
        z = x[0, 0]
        s = torch.stack([z, torch.sqrt(z * z + 2.0), z.sin()])
        return (x.logsumexp(dim=(0, 1)) * s.norm() + x.amax() * (s * z).amin() + (s * s).sum()
                + torch.nn.functional.pad(x * x, (1, 1, 1, 1)).sum() * z.cos())

    for value in (0.8, -1.3):
        assert_same_hvp(ours, theirs, [np.array([[value]])], rng)


def test_max_and_maximum_ties_split_the_mixed_derivative_as_pytorch(torch, rng):
    """At ties the shares are constants: d/dg of ⟨v, dx⟩ must split v as torch.amax and
    torch.maximum do (evenly), and the second derivative in x is zero."""
    data = np.array([[1.0, 3.0, 3.0, -2.0], [0.5, 0.5, 0.5, 0.5]])
    other = np.array([[1.0, 0.0, 3.0, 4.0]])
    v = rng.standard_normal((2, 4))
    for ours, theirs, arrays in (
            (lambda x: nn.Max(x, axis=1), lambda x: x.amax(dim=1), [data]),
            (lambda x, y: nn.Maximum(x, y), lambda x, y: torch.maximum(x, y), [data, other])):
        nodes = [nn.NetVar(a) for a in arrays]
        out = ours(*nodes)
        seed = nn.NetVar(np.ones(out.shape))
        gx, = nn.grad(out, nodes[:1], g=seed.reshape(out.shape), create_graph=True)
        dseed, dx = nn.grad((gx * v).sum(), [seed, nodes[0]])
        tensors = [torch.tensor(a, requires_grad=True) for a in arrays]
        t_out = theirs(*tensors)
        t_seed = torch.ones(t_out.shape, dtype=torch.float64, requires_grad=True)
        t_gx, = torch.autograd.grad(t_out, tensors[:1], t_seed, create_graph=True)
        t_dseed, = torch.autograd.grad((t_gx * torch.tensor(v)).sum(), t_seed)
        np.testing.assert_allclose(dseed.reshape(t_dseed.shape), t_dseed.numpy(), rtol=1e-12)
        np.testing.assert_array_equal(dx, np.zeros_like(data))


def test_norm_of_a_zero_row_has_zero_second_derivatives_and_the_others_pytorchs(torch, rng):
    """Where ‖x‖ = 0 the first derivative is the subgradient 0 and so is the second (PyTorch
    gives NaN there); the other rows are unaffected."""
    data = np.vstack([np.zeros((1, 3)), rng.standard_normal((2, 3))])
    v = rng.standard_normal((3, 3))
    x = nn.NetVar(data)
    gx, = nn.grad(nn.Norm(x, axis=1).sum() ** 2, [x], create_graph=True)
    hv, = nn.grad((gx * v).sum(), [x])
    assert np.all(gx.data[0] == 0) and np.all(hv[0] == 0)
    t = torch.tensor(data[1:], requires_grad=True)
    t_gx, = torch.autograd.grad((t.norm(dim=1).sum() + 0.0) ** 2, t, create_graph=True)
    t_hv, = torch.autograd.grad((t_gx * torch.tensor(v[1:])).sum(), t)
    np.testing.assert_allclose(hv[1:], t_hv.numpy(), rtol=1e-9)
