"""The attention ops: SoftMax / LogSoftmax along an axis with a mask, Einsum, sequence_mask and
Attention. Gradients are checked in float64 against finite differences; values and gradients
against NumPy's einsum and PyTorch (softmax after masked_fill, einsum, and
scaled_dot_product_attention with a boolean mask)."""
import tracemalloc

import numpy as np
import pytest

import nnkit as nn
from tests.conftest import var64
from tests.ops.helpers import assert_matches_pytorch


def keep_mask(rng, shape, p=0.6):
    return rng.random(shape) < p


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


# ----------------------------------------------------------------------------- Einsum

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


# ----------------------------------------------------------------------------- sequence_mask

def test_sequence_mask_values_and_layouts():
    lengths = np.array([2, 0, 3, 1])
    mask = nn.sequence_mask(lengths, 3)
    assert mask.dtype == bool and mask.shape == (3, 4)
    np.testing.assert_array_equal(mask, np.arange(3)[:, None] < lengths[None, :])
    batch_first = nn.sequence_mask(lengths, 3, time_major=False)
    np.testing.assert_array_equal(batch_first, mask.T)
    np.testing.assert_array_equal(nn.sequence_mask([2, 0, 3, 1], 3), mask)
    np.testing.assert_array_equal(nn.sequence_mask(nn.NetVar(lengths), 3), mask)   # (1, 4) floats
    np.testing.assert_array_equal(nn.sequence_mask(lengths[:, None], 3), mask)
    assert nn.sequence_mask(np.zeros(0, dtype=int), 3).shape == (3, 0)
    assert nn.sequence_mask([0, 0], 0).shape == (0, 2)


def test_sequence_mask_follows_the_device_of_lengths(backend):
    mask = nn.sequence_mask(backend.array([2, 4, 1]), 4, time_major=False)
    assert nn.backend.array_module(mask) is backend.xp
    np.testing.assert_array_equal(backend.host(mask), np.arange(4)[None, :] < [[2], [4], [1]])


@pytest.mark.parametrize("lengths,T,time_major,error,message", [
    ([1, 4], 3, True, ValueError, r"lengths must be integers in \[0, 3\] \(the steps\), got 4"),
    ([-1, 2], 3, True, ValueError, r"lengths must be integers in \[0, 3\].*got -1"),
    ([1.5, 2], 3, True, ValueError, r"lengths must be integers in \[0, 3\].*got 1.5"),
    ([np.nan, 2], 3, True, ValueError, r"lengths must be integers in \[0, 3\].*got nan"),
    ([True, False], 3, True, TypeError, r"lengths must be integers, got bool values"),
    (["1", "2"], 3, True, TypeError, r"lengths must be integers, got <U1 values"),
    (np.ones((2, 2), dtype=int), 3, True, ValueError,
     r"lengths of shape \(2, 2\) must be one axis \(B,\) of sequence lengths"),
    ([1, 2], 3.0, True, TypeError, r"T must be an integer >= 0, got float 3.0"),
    ([1, 2], -1, True, ValueError, r"T must be an integer >= 0, got -1"),
    ([1, 2], 3, "no", TypeError, r"time_major must be True or False, got str 'no'"),
], ids=["above-T", "negative", "fraction", "nan", "bool", "str", "two-axes", "T-float",
        "T-negative", "time_major-str"])
def test_sequence_mask_refuses_bad_lengths(lengths, T, time_major, error, message):
    with pytest.raises(error, match="^sequence_mask: " + message):
        nn.sequence_mask(lengths, T, time_major)


def test_losses_still_take_lengths(rng):
    p, t = var64(rng, 3, 2, 4), var64(rng, 3, 2, 4)
    mask = nn.sequence_mask([3, 1], 3)
    assert nn.MSELoss(p, t, lengths=np.array([3, 1])).item() == pytest.approx(
        nn.MSELoss(p, t, mask=mask).item())
    with pytest.raises(TypeError, match=r"MSELoss: lengths must be integers, got bool"):
        nn.MSELoss(p, t, lengths=np.array([True, False]))


# ----------------------------------------------------------------------------- Attention

def attention_reference(q, k, v, mask=None, causal=False, scale=None):
    """Attention in NumPy, written out (fully masked rows give 0)."""
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = scale * q @ np.swapaxes(k, -1, -2)
    keep = np.ones(s.shape[-2:], dtype=bool)
    if causal:
        keep = np.tri(*s.shape[-2:], dtype=bool)
    if mask is not None:
        keep = keep & mask
    keep = np.broadcast_to(keep, s.shape)
    s = np.where(keep, s, -np.inf)
    top = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0))
    total = e.sum(axis=-1, keepdims=True)
    return (e / np.where(total == 0, 1, total)) @ v


def ragged_self_attention_mask(lengths, T):
    """Key padding from sequence_mask, (B, 1, 1, T): broadcast over heads and queries."""
    return nn.sequence_mask(lengths, T, time_major=False)[:, None, None, :]


@pytest.mark.parametrize("shapes,options", [
    (((3, 4), (5, 4), (5, 2)), {}),
    (((2, 3, 4), (2, 5, 4), (2, 5, 3)), {"scale": 0.7}),
    (((1, 1), (1, 1), (1, 1)), {}),
    (((1, 1), (1, 1), (1, 1)), {"causal": True}),
    (((2, 1, 3, 4), (1, 2, 3, 4), (1, 2, 3, 2)), {}),        # broadcast batch axes
    (((2, 3, 4), (5, 4), (1, 5, 2)), {}),                     # k without batch axes
    (((4, 4), (4, 4), (4, 3)), {"causal": True}),
    (((3, 4), (5, 4), (5, 2)), {"causal": True}),             # Tq < Tk
    (((5, 4), (3, 4), (3, 2)), {"causal": True}),             # Tq > Tk
])
def test_attention_gradcheck(shapes, options, rng):
    q, k, v = (var64(rng, *s) for s in shapes)
    y = nn.Attention(q, k, v, **options)
    np.testing.assert_allclose(y.data, attention_reference(q.data, k.data, v.data, **options),
                               rtol=1e-12, atol=1e-14)
    assert nn.gradcheck(lambda a, b, c: nn.Attention(a, b, c, **options), q, k, v)


def test_attention_gradcheck_with_masks_and_fully_masked_rows(rng):
    q, k, v = var64(rng, 2, 4, 3), var64(rng, 2, 5, 3), var64(rng, 2, 5, 2)
    mask = keep_mask(rng, (2, 4, 5))
    mask[0, 1] = False                              # query 1 of batch 0 attends to nothing
    y = nn.Attention(q, k, v, mask=mask)
    np.testing.assert_allclose(y.data, attention_reference(q.data, k.data, v.data, mask),
                               rtol=1e-12, atol=1e-14)
    assert np.all(y.data[0, 1] == 0)
    assert nn.gradcheck(lambda a, b, c: nn.Attention(a, b, c, mask=mask), q, k, v)
    for broadcast in (mask[:1], mask[:, :1], mask[0, 0]):         # (1, Tq, Tk), (B, 1, Tk), (Tk,)
        assert nn.gradcheck(lambda a, b, c: nn.Attention(a, b, c, mask=broadcast), q, k, v)


def test_attention_mask_with_leading_axes_only_the_values_have(rng):
    # q and k shared by a batch of values, a mask per value: the scores were (Tq, Tk) and
    # softmax failed with NumPy's "non-broadcastable output operand"
    q, k, v = var64(rng, 3, 4), var64(rng, 5, 4), var64(rng, 2, 5, 6)
    mask = keep_mask(rng, (2, 3, 5))
    y = nn.Attention(q, k, v, mask=mask)
    wide = nn.NetVar(np.broadcast_to(q.data, (2, 3, 4)).copy())
    np.testing.assert_array_equal(y.data, nn.Attention(wide, k, v, mask=mask).data)
    np.testing.assert_allclose(y.data, attention_reference(wide.data, k.data, v.data, mask),
                               rtol=1e-12, atol=1e-14)
    assert nn.gradcheck(lambda a, b, c: nn.Attention(a, b, c, mask=mask), q, k, v)
    assert nn.gradgradcheck(lambda a, b, c: nn.Attention(a, b, c, mask=mask), q, k, v)


def test_attention_explains_a_node_made_from_a_boolean_mask(rng):
    q = var64(rng, 2, 3)
    with pytest.raises(TypeError, match=r"a NetVar made from a boolean array holds floats .*"
                                        r"NetVar\(mask, dtype=bool\)"):
        nn.Attention(q, q, q, mask=nn.NetVar(np.array([[True, False], [True, True]])))
    mask = nn.NetVar(np.array([[True, False], [True, True]]), dtype=bool)
    assert nn.Attention(q, q, q, mask=mask).shape == (2, 3)


def test_attention_causal_with_ragged_lengths_gradcheck(rng):
    B, H, T, d = 3, 2, 4, 3
    lengths = np.array([4, 2, 0])                   # the last sequence is empty: no key at all
    q, k, v = var64(rng, B, H, T, d), var64(rng, B, H, T, d), var64(rng, B, 1, T, 2)
    mask = ragged_self_attention_mask(lengths, T)
    seed = rng.standard_normal((B, H, T, 2))
    with np.errstate(all="raise"):
        y = nn.Attention(q, k, v, mask=mask, causal=True)
        y.back(seed)
    np.testing.assert_allclose(
        y.data, attention_reference(q.data, k.data, v.data, mask, causal=True), atol=1e-14)
    assert np.all(y.data[2] == 0)
    for x in (q, k, v):
        assert np.isfinite(x.g).all()
    assert np.all(q.g[2] == 0) and np.all(k.g[2] == 0) and np.all(v.g[2] == 0)
    assert np.all(k.g[1, :, 2:] == 0) and np.all(v.g[1, :, 2:] == 0)    # padded keys
    assert nn.gradcheck(lambda a, b, c: nn.Attention(a, b, c, mask=mask, causal=True), q, k, v)


def test_attention_weights_sum_to_one_over_kept_keys(rng):
    q, k, v = var64(rng, 2, 5, 3), var64(rng, 2, 5, 3), var64(rng, 2, 5, 4)
    mask = keep_mask(rng, (2, 5, 5)) | np.eye(5, dtype=bool)
    y = nn.Attention(q, k, v, mask=mask, causal=True)
    keep = mask & np.tri(5, dtype=bool)
    assert np.all(y.weights[~keep] == 0)
    np.testing.assert_allclose(y.weights.sum(axis=-1), 1.0)
    np.testing.assert_allclose(y.data, y.weights @ v.data)


def sdpa_inputs(rng, batch, Tq, Tk, d, dv):
    return (rng.standard_normal(batch + (Tq, d)), rng.standard_normal(batch + (Tk, d)),
            rng.standard_normal(batch + (Tk, dv)))


@pytest.mark.parametrize("batch,Tq,Tk,options", [
    ((2, 3), 4, 6, {}),
    ((2, 3), 4, 6, {"mask": True}),
    ((2, 3), 5, 5, {"causal": True}),
    ((2,), 3, 6, {"causal": True}),                 # Tq < Tk: aligned at the start
    ((2,), 6, 3, {"causal": True}),                 # Tq > Tk
    ((2, 3), 5, 5, {"causal": True, "mask": True}),
    ((2, 3), 4, 6, {"mask": True, "scale": 0.3}),
    ((), 1, 1, {}),
])
def test_attention_matches_pytorch_sdpa(torch, batch, Tq, Tk, options, rng):
    F = torch.nn.functional
    q, k, v = sdpa_inputs(rng, batch, Tq, Tk, 4, 3)
    mask = None
    if options.get("mask"):
        mask = keep_mask(rng, batch[:1] + (1, Tq, Tk)[len(batch) == 1:], 0.6)
        mask[..., 0] = True                      # every query keeps key 0: no row fully masked
    causal, scale = options.get("causal", False), options.get("scale")
    torch_mask = None
    if mask is not None:
        torch_mask = torch.tensor(mask if not causal else mask & np.tri(Tq, Tk, dtype=bool))
    assert_matches_pytorch(
        torch, lambda a, b, c: nn.Attention(a, b, c, mask=mask, causal=causal, scale=scale),
        lambda a, b, c: F.scaled_dot_product_attention(
            a, b, c, attn_mask=torch_mask, is_causal=causal and mask is None, scale=scale),
        q, k, v, rng=rng, rtol=1e-10, atol=1e-12)


def test_attention_matches_pytorch_with_ragged_key_padding(torch, rng):
    F = torch.nn.functional
    B, H, T, d = 3, 2, 5, 4
    lengths = np.array([5, 3, 0])           # the last sequence: no key, every row masked
    q, k, v = sdpa_inputs(rng, (B, H), T, T, d, d)
    mask = ragged_self_attention_mask(lengths, T)
    assert_matches_pytorch(
        torch, lambda a, b, c: nn.Attention(a, b, c, mask=mask, causal=True),
        lambda a, b, c: F.scaled_dot_product_attention(
            a, b, c, attn_mask=torch.tensor(mask & np.tri(T, dtype=bool))),
        q, k, v, rng=rng, rtol=1e-10, atol=1e-12)


def test_attention_fully_masked_query_gives_zeros_as_pytorch_sdpa_does(torch, rng):
    """PyTorch's scaled_dot_product_attention gives such a row 0 and no gradient since 2.5 (a
    plain softmax of a row of −inf gives NaN, as PyTorch's SDPA did before)."""
    F = torch.nn.functional
    q, k, v = sdpa_inputs(rng, (2,), 3, 4, 2, 2)
    mask = keep_mask(rng, (2, 3, 4))
    mask[1, 2] = False
    mask[0, 0] = False
    nodes = assert_matches_pytorch(
        torch, lambda a, b, c: nn.Attention(a, b, c, mask=mask),
        lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=torch.tensor(mask)),
        q, k, v, rng=rng, rtol=1e-10, atol=1e-12)
    y = nn.Attention(*nodes, mask=mask)
    assert np.all(y.data[1, 2] == 0) and np.all(y.data[0, 0] == 0)
    assert np.all(nodes[0].g[1, 2] == 0) and np.all(nodes[0].g[0, 0] == 0)
    assert torch.isnan(torch.softmax(torch.full((1, 2), -torch.inf), dim=-1)).all()


def test_attention_keeps_only_its_weights(rng):
    assert nn.Attention.__slots__ == ("weights", "scale")
    B, T, d = 4, 64, 8
    q, k, v = (nn.NetVar(rng.standard_normal((B, T, d))) for _ in range(3))
    mask = ragged_self_attention_mask(np.array([64, 50, 20, 1]), T)[:, 0]

    def composed(a, b, c):
        s = nn.Einsum("bqd,bkd->bqk", a, b) * (1 / np.sqrt(d))
        return nn.Einsum("bqk,bkd->bqd", nn.SoftMax(s, mask=mask), c)

    def retained(build):
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            y = build(q, k, v)
            return y, tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()

    y, fused = retained(lambda a, b, c: nn.Attention(a, b, c, mask=mask, causal=True))
    weights = B * T * T * 8
    assert y.weights.shape == (B, T, T) and y.weights.nbytes == weights
    assert fused < weights + y.data.nbytes + 16_000
    _, small_ops = retained(composed)
    assert small_ops > 2.5 * weights                       # scores, scaled scores, weights


def test_attention_is_one_box_in_a_drawing(rng):
    q, k, v = var64(rng, 3, 2, name="q"), var64(rng, 4, 2, name="k"), var64(rng, 4, 5, name="v")
    source = nn.draw(nn.Attention(q, k, v, causal=True)).source
    labels = [line for line in source.splitlines() if 'label="' in line]
    assert len(labels) == 4 and sum("Attention" in line for line in labels) == 1
    assert source.count(" -> ") == 3 and "T=" not in source


def test_attention_takes_arrays_and_float32(rng):
    q = rng.standard_normal((3, 4)).astype(np.float32)
    k = nn.NetVar(rng.standard_normal((5, 4)).astype(np.float32))
    v = nn.NetVar(rng.standard_normal((5, 2)).astype(np.float32))
    y = nn.Attention(q, k, v)
    y.back()
    assert y.dtype == k.g.dtype == v.g.dtype == np.float32
    assert not y.parents[0].requires_grad


@pytest.mark.parametrize("make,error,message", [
    (lambda q, k, v: nn.Attention(q.data[0, 0], k, v), ValueError,
     r"Attention: q of shape \(4,\), k of shape \(2, 5, 4\) and v of shape \(2, 5, 3\): each "
     r"must have at least two axes"),
    (lambda q, k, v: nn.Attention(q, k[..., :3], v), ValueError,
     r"q of shape \(2, 3, 4\), k of shape \(2, 5, 3\) and v of shape \(2, 5, 3\): q and k "
     r"must have one size d on their last axis"),
    (lambda q, k, v: nn.Attention(q, k, v[:, :4]), ValueError,
     r"k and v must hold one number of keys Tk"),
    (lambda q, k, v: nn.Attention(q, k[:, :0], v[:, :0]), ValueError,
     r"there must be at least one key \(Tk > 0\) and d > 0"),
    (lambda q, k, v: nn.Attention(q[..., :0], k[..., :0], v), ValueError,
     r"there must be at least one key \(Tk > 0\) and d > 0"),
    (lambda q, k, v: nn.Attention(q, nn.Concat([k, k, k], axis=0), v), ValueError,
     r"k of shape \(6, 5, 4\) .*: their leading axes do not broadcast together"),
    (lambda q, k, v: nn.Attention(q, k, v, mask=np.ones((3, 5))), TypeError,
     r"Attention: mask of shape \(3, 5\) and dtype float64 must be boolean"),
    (lambda q, k, v: nn.Attention(q, k, v, mask=np.ones((3, 4), dtype=bool)), ValueError,
     r"Attention: mask of shape \(3, 4\) does not broadcast to the scores \(..., Tq, Tk\) = "
     r"\(2, 3, 5\) of q of shape \(2, 3, 4\)"),
    (lambda q, k, v: nn.Attention(q, k, v, mask=np.ones((4, 2, 3, 5), dtype=bool)), ValueError,
     r"Attention: mask of shape \(4, 2, 3, 5\) does not broadcast to the scores"),
    (lambda q, k, v: nn.Attention(q, k, v, causal=1), TypeError,
     r"Attention: causal must be True or False, got int 1"),
    (lambda q, k, v: nn.Attention(q, k, v, scale="0.5"), TypeError,
     r"Attention: scale must be a number, got str"),
    (lambda q, k, v: nn.Attention(q, k, v, scale=float("inf")), ValueError,
     r"Attention: scale must be finite, got inf"),
    (lambda q, k, v: nn.Attention([[1.0]], k, v), TypeError,
     r"Attention: q must be a NetVar or an array, got list"),
], ids=["q-one-axis", "d-differs", "Tk-differs", "no-key", "d-zero", "batch", "mask-float",
        "mask-shape", "mask-enlarges", "causal-int", "scale-str", "scale-inf", "q-list"])
def test_attention_refuses_bad_arguments(make, error, message, rng):
    q, k, v = var64(rng, 2, 3, 4), var64(rng, 2, 5, 4), var64(rng, 2, 5, 3)
    with pytest.raises(error, match=message):
        make(q, k, v)
