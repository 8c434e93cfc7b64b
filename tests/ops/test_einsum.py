"""Einsum: values against NumPy's einsum, float64 gradchecks, PyTorch parity of values,
gradients and second derivatives, and the refusals of bad subscripts naming them and the
shapes."""
import numpy as np
import pytest

import nnkit as nn
from tests.conftest import var64
from tests.ops.helpers import assert_matches_pytorch, assert_same_hvp

EINSUM_CASES = [           # subscripts, operand shapes
    ("ij,jk->ik", (2, 3), (3, 4)),
    ("bij,bjk->bik", (2, 2, 3), (2, 3, 4)),
    ("...ij,...jk->...ik", (1, 2, 3), (5, 3, 4)),       # a broadcast along '...'
    ("...ij,...jk->...ik", (2, 3), (4, 5, 3, 4)),       # a has no '...' axes at all
    ("...ij,...jk->...ik", (4, 1, 2, 3), (5, 3, 2)),
    ("i,i->", (3,), (3,)),
    ("ij->ji", (2, 3)),
    ("bhqd,bhkd->bhqk", (2, 3, 4, 5), (2, 3, 6, 5)),
    ("ij,jk,kl->il", (2, 3), (3, 4), (4, 2)),
    ("ab,bc,cd,de->ae", (2, 3), (3, 2), (2, 4), (4, 1)),
    ("ii->i", (3, 3)),                                  # a diagonal
    ("ii", (3, 3)),                                     # a trace (implicit output)
    ("iij->ij", (2, 2, 3)),
    ("iii->", (2, 2, 2)),
    ("ii,ij->j", (3, 3), (3, 2)),
    ("ij->", (2, 3)),
    ("ij->i", (2, 3)),                                  # sums over an index only x has
    ("ij,jk", (2, 3), (3, 4)),                          # implicit: 'ij,jk->ik'
    ("ji", (2, 3)),                                     # implicit: a transpose
    ("bA", (2, 3)),                                     # implicit order: upper case first
    ("i...", (2, 3, 4)),                                # implicit: '...' first
    ("i...j,j...k->i...k", (2, 5, 3), (3, 1, 4)),
    ("ij,jk->ik", (2, 3), (1, 5)),                      # an index of size 1 broadcasts
    ("ii,i->i", (3, 3), (1,)),
    ("ij,ij,ij->", (2, 3), (2, 3), (1, 3)),
    ("i,j->ij", (3,), (2,)),
    ("ab,cd->abcd", (2, 3), (1, 2)),
    (" ij , jk -> ik ", (2, 3), (3, 4)),                # spaces are ignored
    ("ij,jk->ik", (1, 1), (1, 1)),
]


def as_shapes(nodes, shapes):
    """The nodes reshaped to ``shapes``: NetVar makes 1-D data a (1, n) row."""
    return [x.reshape(shape) if x.shape != shape else x for x, shape in zip(nodes, shapes)]


@pytest.mark.parametrize("subscripts,shapes", [(c[0], c[1:]) for c in EINSUM_CASES],
                         ids=[c[0].strip() + str(c[1:]) for c in EINSUM_CASES])
def test_einsum_equals_numpy_and_gradchecks(subscripts, shapes, rng):
    leaves = [var64(rng, *shape) for shape in shapes]
    arrays = [x.data.reshape(shape) for x, shape in zip(leaves, shapes)]
    y = nn.Einsum(subscripts, *as_shapes(leaves, shapes))
    expected = np.einsum(subscripts, *arrays, optimize=False)
    assert y.shape == expected.shape
    np.testing.assert_allclose(y.data, expected, rtol=1e-12, atol=1e-14)
    assert nn.gradcheck(lambda *xs: nn.Einsum(subscripts, *as_shapes(xs, shapes)), *leaves)


TORCH_EINSUM = [
    ("ij,jk->ik", (2, 3), (3, 4)),
    ("bij,bjk->bik", (2, 2, 3), (2, 3, 4)),
    ("...ij,...jk->...ik", (1, 2, 3), (5, 3, 4)),
    ("...ij,...jk->...ik", (2, 3), (4, 5, 3, 4)),
    ("i,i->", (3,), (3,)),
    ("ij->ji", (2, 3)),
    ("bhqd,bhkd->bhqk", (2, 3, 4, 5), (2, 3, 6, 5)),
    ("ij,jk,kl->il", (2, 3), (3, 4), (4, 2)),
    ("ii->i", (3, 3)),
    ("ii", (3, 3)),
    ("ij,jk", (2, 3), (3, 4)),
    ("bij->j", (2, 3, 4)),
]


@pytest.mark.parametrize("subscripts,shapes", [(c[0], c[1:]) for c in TORCH_EINSUM],
                         ids=[c[0] for c in TORCH_EINSUM])
def test_einsum_matches_pytorch(torch, subscripts, shapes, rng):
    assert_matches_pytorch(
        torch, lambda *xs: nn.Einsum(subscripts, *as_shapes(xs, shapes)),
        lambda *ts: torch.einsum(subscripts, *ts),
        *[rng.standard_normal(shape) for shape in shapes], rng=rng, rtol=1e-12, atol=1e-13)


def test_einsum_gradient_of_a_broadcast_operand_is_summed_back(rng):
    a, b = var64(rng, 1, 2, 3), var64(rng, 5, 3, 4)
    y = nn.Einsum("...ij,...jk->...ik", a, b)
    seed = rng.standard_normal(y.shape)
    y.back(seed)
    np.testing.assert_allclose(a.g, (seed @ b.data.swapaxes(-1, -2)).sum(axis=0, keepdims=True))
    np.testing.assert_allclose(b.g, a.data.swapaxes(-1, -2) @ seed)
    w, v = var64(rng, 2, 3), var64(rng, 1, 5)            # index j: 3 in w, 1 (broadcast) in v
    y = nn.Einsum("ij,jk->ik", w, v)
    y.back(seed := rng.standard_normal((2, 5)))
    np.testing.assert_allclose(v.g, (w.data.sum(axis=1) @ seed)[None, :])
    np.testing.assert_allclose(w.g, np.repeat(seed @ v.data.T, 3, axis=1))


def test_einsum_diagonal_gradient_lies_on_the_diagonal(rng):
    x = var64(rng, 3, 3)
    nn.Einsum("ii->i", x).back(np.array([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(x.g, np.diag([1.0, 2.0, 3.0]))
    x.reset()
    nn.Einsum("ii", x).back(np.array(2.0))
    np.testing.assert_array_equal(x.g, 2 * np.eye(3))


def test_einsum_takes_arrays_integers_and_one_operand_twice(rng):
    x = var64(rng, 3, 4)
    nn.Einsum("ij,ij->", x, x).back()
    np.testing.assert_allclose(x.g, 2 * x.data)
    w = rng.standard_normal((4, 2))
    y = nn.Einsum("ij,jk->ik", x, w)                      # an array operand is a constant
    np.testing.assert_allclose(y.data, x.data @ w)
    assert len(y.parents) == 2 and not y.parents[1].requires_grad
    counts = nn.constant(np.arange(12).reshape(3, 4), dtype=np.int64)
    z = nn.Einsum("ij,ij->i", x, counts)
    x.reset()
    z.back(np.ones(3))
    np.testing.assert_allclose(x.g, np.arange(12).reshape(3, 4))


def test_einsum_with_a_0d_operand(rng):
    x, w = var64(rng, 2, 3), var64(rng, 2, 2)
    assert nn.gradcheck(lambda a, b: nn.Einsum(",ij->ij", nn.Sum(b), a), x, w)
    assert nn.gradcheck(lambda a, b: nn.Einsum("ij,->", a, nn.Sum(b)), x, w)


def test_einsum_keeps_float32(rng):
    a = nn.NetVar(rng.standard_normal((3, 4)).astype(np.float32))
    b = nn.NetVar(rng.standard_normal((4, 2)).astype(np.float32))
    y = nn.Einsum("ij,jk->ik", a, b)
    y.back()
    assert y.dtype == a.g.dtype == b.g.dtype == np.float32


def test_einsum_node_keeps_only_its_subscripts():
    assert nn.Einsum.__slots__ == ("parsed",)


SUBSCRIPTS_REFUSED = [
    # subscripts, shapes, error, message after "Einsum: "
    (3, [(2, 3)], TypeError, r"subscripts must be a string such as 'ij,jk->ik', got int 3"),
    ("ij", [], ValueError, r"subscripts 'ij' with no operand"),
    ("ij,jk->ik", [(2, 3)], ValueError,
     r"subscripts 'ij,jk->ik' with operands of shapes \(\(2, 3\)\): they name 2 operands, "
     r"1 given"),
    ("ij->ji", [(2, 3), (3, 4)], ValueError, r"they name 1 operand, 2 given"),
    ("ijk->i", [(2, 3)], ValueError,
     r"subscripts 'ijk->i' with operands of shapes \(\(2, 3\)\): operand 0 of shape \(2, 3\) "
     r"has 2 axes, its subscripts 'ijk' name 3"),
    ("i->i", [(2, 3)], ValueError, r"operand 0 of shape \(2, 3\) has 2 axes, its subscripts "
                                   r"'i' name 1"),
    ("i->i", [(1, 3)], ValueError, r"NetVar makes 1-D data a \(1, n\) row"),
    ("...ijk->i", [(2, 3)], ValueError, r"its subscripts '...ijk' name 3 and more with ..."),
    ("ij,jk->ik", [(2, 3), (4, 5)], ValueError,
     r"subscripts 'ij,jk->ik' with operands of shapes \(\(2, 3\), \(4, 5\)\): index 'j' has "
     r"size 3 in operand 0 of shape \(2, 3\) and 4 in operand 1 of shape \(4, 5\)"),
    ("...i,...i->...i", [(2, 3), (4, 3)], ValueError,
     r"an axis of '...' has size 2 in operand 0 of shape \(2, 3\) and 4 in operand 1"),
    ("ii->i", [(2, 3)], ValueError,
     r"index 'i' names axes of sizes 2 and 3 in operand 0 of shape \(2, 3\); a repeated index "
     r"takes a diagonal"),
    ("ij->ik", [(2, 3)], ValueError, r"the output names 'k', which no operand has"),
    ("ij->jj", [(2, 3)], ValueError, r"the output names 'j' twice"),
    ("ij->ii", [(2, 3)], ValueError, r"the output names 'i' twice"),
    ("i1", [(2, 3)], ValueError, r"operand 0's subscripts 'i1' hold '1'; subscripts are "
                                 r"letters a-z, A-Z"),
    ("i.j", [(2, 3)], ValueError, r"operand 0's subscripts 'i.j' hold a '.' that is not part"),
    ("...i...", [(2, 3)], ValueError, r"hold a '.' that is not part of one '...'"),
    ("ij->j.", [(2, 3)], ValueError, r"the output's subscripts 'j.' hold a '.'"),
    ("i->j->", [(2,)], ValueError, r"'->' may appear once"),
    ("ij-jk", [(2, 3)], ValueError, r"'->' may appear once"),
    ("...ij->ij", [(4, 2, 3)], ValueError,
     r"the operands' '...' stands for 1 axes, which the output must keep"),
]


EINSUM_REFUSED_IDS = [
    "not-a-string", "no-operand", "too-few-operands", "too-many-operands", "too-many-letters",
    "too-few-letters", "row-hint", "too-many-letters-with-dots", "sizes-differ",
    "dots-sizes-differ", "diagonal-sizes-differ", "output-letter-unknown", "output-twice",
    "output-twice-ii", "not-a-letter", "lone-dot", "two-ellipses", "output-dot", "two-arrows",
    "lone-dash", "dots-dropped"]


@pytest.mark.parametrize("subscripts,shapes,error,message", SUBSCRIPTS_REFUSED,
                         ids=EINSUM_REFUSED_IDS)
def test_einsum_refuses_bad_subscripts_naming_them_and_the_shapes(subscripts, shapes, error,
                                                                   message, rng):
    operands = [nn.constant(rng.standard_normal(s)) for s in shapes]
    with pytest.raises(error, match=message) as refused:
        nn.Einsum(subscripts, *operands)
    if error is ValueError and shapes:          # every message names the subscripts and shapes
        assert str(refused.value).startswith(
            f"Einsum: subscripts {subscripts!r} with operands of shapes "
            f"({', '.join(str(s) for s in shapes)}): ")
    else:
        assert str(refused.value).startswith("Einsum: ")


def test_einsum_refusals_agree_with_numpy(rng):
    """Every refused case that NumPy can parse is refused by NumPy's einsum too. Dropping the
    '...' axes from an explicit output is left out: NumPy's default path refuses it (as nnkit
    does) but its optimize=True path sums them, and NumPy may settle on summing."""
    for (subscripts, shapes, _, _), name in zip(SUBSCRIPTS_REFUSED, EINSUM_REFUSED_IDS):
        if not isinstance(subscripts, str) or not shapes or name == "dots-dropped":
            continue
        with pytest.raises(ValueError):
            np.einsum(subscripts, *[np.ones(s) for s in shapes], optimize=False)


def test_einsum_refuses_many_ellipsis_axes_beyond_the_spare_letters(rng):
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXY"      # 51 of 52
    x = nn.constant(np.ones((1,) * 53))
    with pytest.raises(ValueError, match=r"'...' stands for 2 axes, more than the 1 letters"):
        nn.Einsum("..." + letters, x)


# ----------------------------------------------------------------------------- Second derivatives
# Hessian-vector products (grad(create_graph=True)) against PyTorch's double backward in float64;
# test_gradgradcheck_every_op checks each op alone against finite differences.

def test_einsum_hvp_with_diagonals_broadcasting_and_a_0d_operand_matches_torch(torch, rng):
    def ours(x, y, z, c):
        t = nn.Einsum("ii->i", x) * nn.Einsum("ij,jk,kl->il", x, y, z).sum(1)     # (3,)
        batched = nn.Einsum("...ij,...jk->...ik", y.reshape(1, 3, 2),                # (2, 3, 1)
                            z.reshape(2, 2, 1) * x[:2, :2].reshape(2, 2, 1))
        s = nn.Einsum(",i->", c.reshape(()), t.sin())                              # 0-d
        return s * nn.Einsum("ii", x) + (batched * batched).sum()

    def theirs(x, y, z, c):
        t = torch.einsum("ii->i", x) * torch.einsum("ij,jk,kl->il", x, y, z).sum(1)
        batched = torch.einsum("...ij,...jk->...ik", y.reshape(1, 3, 2),
                               z.reshape(2, 2, 1) * x[:2, :2].reshape(2, 2, 1))
        s = torch.einsum(",i->", c.reshape(()), t.sin())
        return s * torch.einsum("ii", x) + (batched * batched).sum()

    assert_same_hvp(ours, theirs, [rng.standard_normal((3, 3)), rng.standard_normal((3, 2)),
                                   rng.standard_normal((2, 2)), rng.standard_normal((1, 1))],
                    rng)
