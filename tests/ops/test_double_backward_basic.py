"""Second derivatives of the reductions, indexing and joins, and elementwise math ops
(``grad(create_graph=True)``), against PyTorch's double backward in float64.

test_gradgradcheck_every_op checks each op alone against finite differences; these check
Hessian-vector products through chains of them, the 0-d and (1, 1) edge cases, a node read by
three consumers, and GetItem's scatter-add gradient with repeated indices.
"""
import numpy as np
import pytest

import nnkit as nn
from tests.ops.helpers import assert_same_hvp

torch = pytest.importorskip("torch")


ROWS = [0, 2, 2, 1, 2]      # repeated indices: row 2 is read three times


def test_hvp_through_getitem_concat_norm_and_logsumexp(rng):
    def ours(x, w):
        picked = x[np.array(ROWS)]                                    # (5, 4)
        joined = nn.Concat([picked * w, nn.Norm(x, axis=0, keepdims=True)], axis=0)   # (6, 4)
        return nn.LogSumExp(joined, axis=1).sum() + nn.Var(joined, axis=0, ddof=1).sum()

    def theirs(x, w):
        picked = x[torch.tensor(ROWS)]
        joined = torch.cat([picked * w, x.norm(dim=0, keepdim=True)], dim=0)
        return joined.logsumexp(dim=1).sum() + joined.var(dim=0, unbiased=True).sum()

    assert_same_hvp(ours, theirs, [rng.standard_normal((3, 4)), rng.standard_normal((1, 4))],
                    rng)


def test_hvp_through_stack_split_pad_and_max(rng):
    def ours(x):
        a, b = nn.Split(x, [1], axis=1)                                 # (3, 1), (3, 3)
        padded = nn.Pad(a * b, ((0, 1), (2, 0)), value=0.5)              # (4, 5)
        stacked = nn.Stack([padded.sin(), padded * padded], axis=1)     # (4, 2, 5)
        return (nn.Max(stacked, axis=2) * nn.Min(stacked, axis=(0, 1))[1:3]).sum()

    def theirs(x):
        a, b = x[:, :1], x[:, 1:]
        padded = torch.nn.functional.pad(a * b, (2, 0, 0, 1), value=0.5)
        stacked = torch.stack([padded.sin(), padded * padded], dim=1)
        return (stacked.amax(dim=2) * stacked.amin(dim=(0, 1))[1:3]).sum()

    assert_same_hvp(ours, theirs, [rng.standard_normal((3, 4))], rng)


def test_hvp_through_the_elementwise_math_ops(rng):
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


def test_a_one_by_one_node_and_a_0d_node(rng):
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


def test_a_node_read_by_three_consumers(rng):
    """h feeds a GetItem with repeated indices, a norm and a Where: its gradient node is the sum
    of three contributions, and each of them must be differentiated again."""
    mask = np.array([[True, False, True], [False, True, True]])

    def ours(x):
        h = x.tanh()
        return ((h[np.array([1, 1, 0])] ** 3).sum() + nn.Norm(h, axis=1).sum()
                + nn.Where(mask, h * h, 0.0).sum())

    def theirs(x):
        h = x.tanh()
        return ((h[torch.tensor([1, 1, 0])] ** 3).sum() + h.norm(dim=1).sum()
                + torch.where(torch.tensor(mask), h * h, 0.0).sum())

    assert_same_hvp(ours, theirs, [rng.standard_normal((2, 3))], rng)


@pytest.mark.parametrize("index", [
    np.array([0, 2, 2, 2]),                                 # repeated rows
    (np.array([[1, 1], [0, 1]]), np.array([[2, 2], [0, 2]])),   # repeated (row, column) pairs
    (slice(None), np.array([3, 0, 3])),                     # repeated columns after a slice
])
def test_the_scatter_adds_repeated_indices(index, rng):
    """GetItem's gradient node, for a seed given as a node, is the scatter-add of the seed;
    differentiating it with respect to the seed gathers again (both are linear)."""
    x = nn.NetVar(rng.standard_normal((3, 4)))
    y = x[index]
    seed = nn.NetVar(rng.standard_normal(y.shape))     # a leaf is at least 2-D: reshape it
    seed_node = seed.reshape(y.shape)
    gx, = nn.grad(y, [x], g=seed_node, create_graph=True)
    expected = np.zeros((3, 4))
    np.add.at(expected, index, seed_node.data)
    np.testing.assert_allclose(gx.data, expected, rtol=1e-12)
    v = rng.standard_normal((3, 4))
    dseed, = nn.grad((gx * v).sum(), [seed])
    np.testing.assert_allclose(dseed.reshape(y.shape), v[index], rtol=1e-12)
    # F = Σ v·gx² is quadratic in the seed: its Hessian along u is gather(2 v · scatter(u))
    gseed, = nn.grad((gx * gx * v).sum(), [seed], create_graph=True)
    u = rng.standard_normal(seed.shape)
    hu, = nn.grad((gseed * u).sum(), [seed])
    spread = np.zeros((3, 4))
    np.add.at(spread, index, u.reshape(y.shape))
    np.testing.assert_allclose(hu.reshape(y.shape), (2 * v * spread)[index], rtol=1e-12)


def test_max_and_maximum_ties_split_the_mixed_derivative_as_pytorch(rng):
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


def test_norm_of_a_zero_row_has_zero_second_derivatives_and_the_others_pytorchs(rng):
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


def test_powers_at_zero_have_the_derivatives_of_polynomials():
    # d/dx x⁰ = 0 everywhere (p·x^(p−1) would be 0·∞ = NaN at 0), so every derivative of x²
    # and x³ at 0 is finite and equals PyTorch's
    x = nn.NetVar(np.array([[0.0, 1.5, -2.0]]))
    t = torch.tensor(x.data, requires_grad=True)
    np.testing.assert_array_equal(nn.grad((x ** 0).sum(), [x])[0], [[0.0, 0.0, 0.0]])
    for p in (1, 2, 3):
        mine, ref = (x ** p).sum(), (t ** p).sum()
        for order in range(1, p + 2):            # the last one is 0
            mine, = nn.grad(mine, [x], create_graph=True)
            ref, = torch.autograd.grad(ref, t, create_graph=True, allow_unused=True,
                                       materialize_grads=True)
            np.testing.assert_allclose(mine.data, ref.detach().numpy(), rtol=1e-12,
                                       err_msg=f"x ** {p}, order {order}")
            mine, ref = mine.sum(), ref.sum()
        assert not mine.requires_grad and not ref.requires_grad     # a constant, 0, in both
