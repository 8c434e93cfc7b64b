"""Indexing and joins: values equal NumPy's, gradients scatter back (repeated indices add up)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import nnkit as nn
from tests.conftest import var64
from tests.ops.helpers import assert_same_hvp

INDICES = [
    (slice(1, 3),),
    (slice(None, None, -1),),
    (slice(None), slice(3, 0, -2)),
    (None, 1),
    (Ellipsis, 1),
    (1, 2, 0),
    (1, slice(None), None),
    ([0, 0, 2],),
    (np.array([[1, 0], [1, 1]]),),
    (slice(None), np.array([3, 3, 0, 3])),
    (np.array([0, 2, 2]), np.array([1, 1, 1])),
    (-1,),
]


@pytest.mark.parametrize("index", INDICES, ids=repr)
def test_getitem_matches_numpy_and_gradchecks(index, rng):
    x = var64(rng, 3, 4, 2)
    index = index[0] if len(index) == 1 else index
    np.testing.assert_array_equal(x[index].data, x.data[index])
    nn.gradcheck(lambda v: v[index], x)


def test_getitem_repeated_indices_accumulate():
    x = nn.NetVar(np.arange(6.0).reshape(3, 2))
    x[[0, 0, 1, 0]].back()
    np.testing.assert_array_equal(x.g, [[3, 3], [1, 1], [0, 0]])


def test_getitem_boolean_mask_and_netvar_index(rng):
    x = var64(rng, 4, 3)
    mask = x.data > 0
    np.testing.assert_array_equal(x[mask].data, x.data[mask])
    nn.gradcheck(lambda v: v[mask], x)
    x.reset()
    x[mask].sum().back()
    np.testing.assert_array_equal(x.g, mask.astype(float))
    rows = nn.NetVar([2, 2, 0], dtype=int)          # (1, 3) integer node
    np.testing.assert_array_equal(x[rows].data, x.data[rows.data])
    nn.gradcheck(lambda v: v[rows], x)
    assert isinstance(x[1:], nn.GetItem)


def test_getitem_errors(rng):
    x = var64(rng, 3, 4)
    with pytest.raises(IndexError, match=r"GetItem: cannot index x of shape \(3, 4\)"):
        x[5]
    with pytest.raises(IndexError, match="integers or booleans"):
        x[nn.NetVar([0.0, 1.0])]


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat_gradcheck(axis, rng):
    shapes = {0: [(2, 3), (1, 3), (4, 3)], 1: [(2, 1), (2, 3), (2, 2)], -1: [(2, 1), (2, 3), (2, 2)]}
    xs = [var64(rng, *s) for s in shapes[axis]]
    y = nn.Concat(xs, axis)
    np.testing.assert_array_equal(y.data, np.concatenate([x.data for x in xs], axis))
    nn.gradcheck(lambda *v: nn.Concat(list(v), axis), *xs)


def test_concat_with_constants_and_errors(rng):
    a = var64(rng, 2, 3)
    nn.gradcheck(lambda v: nn.Concat([v, np.ones((1, 3)), v], 0), a)
    with pytest.raises(ValueError, match=r"Concat: input 1 of shape \(2, 2\) does not match "
                                         r"input 0 of shape \(2, 3\) outside axis 0"):
        nn.Concat([a, var64(rng, 2, 2)], 0)
    with pytest.raises(ValueError, match="Concat: axis 2 is out of range"):
        nn.Concat([a, a], 2)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_stack_gradcheck(axis, rng):
    xs = [var64(rng, 2, 3) for _ in range(3)]
    y = nn.Stack(xs, axis)
    np.testing.assert_array_equal(y.data, np.stack([x.data for x in xs], axis))
    nn.gradcheck(lambda *v: nn.Stack(list(v), axis), *xs)
    with pytest.raises(ValueError, match=r"Stack: input 1 of shape \(3, 2\) differs"):
        nn.Stack([xs[0], var64(rng, 3, 2)])


def test_split(rng):
    x = var64(rng, 6, 4)
    parts = nn.Split(x, 3)
    assert [p.shape for p in parts] == [(2, 4)] * 3
    parts = nn.Split(x, [1, 3], axis=1)
    for got, want in zip(parts, np.split(x.data, [1, 3], axis=1)):
        np.testing.assert_array_equal(got.data, want)
    nn.gradcheck(lambda v: nn.Concat([p * float(i + 1) for i, p in
                                      enumerate(nn.Split(v, [1, 3], axis=1))], 1), x)
    with pytest.raises(ValueError, match="Split: cannot split axis 0 of length 6"):
        nn.Split(x, 4)


def test_flatten(rng):
    x = var64(rng, 2, 3, 2, 2)
    assert x.flatten().shape == (2, 12)
    assert nn.Flatten(x, 0).shape == (24,)
    assert nn.Flatten(x, 1, 2).shape == (2, 6, 2)
    nn.gradcheck(lambda v: v.flatten() * 2.0, x)
    with pytest.raises(ValueError, match="Flatten: axes 3..1"):
        nn.Flatten(x, 3, 1)


@pytest.mark.parametrize("pad_width", [1, (1, 2), ((0, 1), (2, 0)), [(3, 3), (0, 0)]])
def test_pad_gradcheck(pad_width, rng):
    x = var64(rng, 2, 3)
    y = nn.Pad(x, pad_width, value=0.5)
    np.testing.assert_array_equal(y.data, np.pad(x.data, pad_width, constant_values=0.5))
    nn.gradcheck(lambda v: nn.Pad(v, pad_width), x)
    with pytest.raises(ValueError, match="Pad: pad_width -1 has a negative width"):
        nn.Pad(x, -1)


@pytest.mark.parametrize("shapes", [((1, 3), (4, 3)), ((3, 1), (2, 3, 5)), ((2, 3), (2, 3))])
def test_broadcast_gradcheck(shapes, rng):
    x = var64(rng, *shapes[0])
    y = x.expand(*shapes[1])
    np.testing.assert_array_equal(y.data, np.broadcast_to(x.data, shapes[1]))
    nn.gradcheck(lambda v: nn.Broadcast(v, shapes[1]), x)
    with pytest.raises(ValueError, match=r"Broadcast: cannot broadcast x of shape"):
        x.broadcast_to((7, 7, 7))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=12))
def test_getitem_gradient_is_a_one_hot_product(rows):
    """Property: for any index list (repeats included), dx = onehot(rows)ᵀ · g."""
    x = nn.NetVar(np.arange(10.0).reshape(5, 2))
    g = np.random.default_rng(len(rows)).standard_normal((len(rows), 2))
    y = x[rows]
    np.testing.assert_array_equal(y.data, x.data[rows])
    y.back(g)
    np.testing.assert_allclose(x.g, np.eye(5)[rows].T @ g)


# ----------------------------------------------------------------------------- bad axes and sizes

def _joins(rng):
    a = var64(rng, 2, 4)
    return {"Concat": lambda axis: nn.Concat([a, a], axis),
            "Stack": lambda axis: nn.Stack([a, a], axis),
            "Split": lambda axis: nn.Split(a, 2, axis)}


@pytest.mark.parametrize("op", ["Concat", "Stack", "Split"])
@pytest.mark.parametrize("axis", [True, False, 1.0, 1.5, (0, 1), None])
def test_joins_refuse_an_axis_that_is_not_an_int(op, axis, rng):
    # True is an int in Python: Concat([a, a], True) joined along axis 1
    with pytest.raises(TypeError, match=rf"{op}: axis must be an int, got "):
        _joins(rng)[op](axis)


@pytest.mark.parametrize("op, axis", [("Concat", 2), ("Concat", -3), ("Stack", 3), ("Stack", -4),
                                      ("Split", 2)])
def test_joins_refuse_an_axis_out_of_range(op, axis, rng):
    with pytest.raises(ValueError, match=rf"{op}: axis {axis} is out of range for inputs of "
                                         r"shape \(2, 4\)"):
        _joins(rng)[op](axis)
    assert _joins(rng)[op](-1) is not None


@pytest.mark.parametrize("sections", [True, 2.0, [1.5], [True], "2", None])
def test_split_refuses_sections_that_are_not_ints(sections, rng):
    # True made one part; [True] cut at 1
    with pytest.raises(TypeError, match=r"Split: sections must be a number of parts or a list of "
                                        r"cut indices \(ints\), got "):
        nn.Split(var64(rng, 2, 4), sections, axis=1)


@pytest.mark.parametrize("cuts", [[3, 1], [5], [-1], [1, 5]])
def test_split_refuses_cuts_unsorted_or_out_of_range(cuts, rng):
    # [3, 1] gave parts x[:3], x[3:1] (empty) and x[1:]: 6 columns out of 4
    with pytest.raises(ValueError, match=r"Split: the cuts \[.*\] must be sorted and lie in 0..4, "
                                         r"the length of axis 1 of x of shape \(2, 4\)"):
        nn.Split(var64(rng, 2, 4), cuts, axis=1)


def test_split_takes_numpy_ints(rng):
    x = var64(rng, 2, 4)
    assert [p.shape for p in nn.Split(x, np.int64(2), axis=1)] == [(2, 2), (2, 2)]
    assert [p.shape for p in nn.Split(x, np.array([1, 3]), axis=1)] == [(2, 1), (2, 2), (2, 1)]
    assert [p.shape for p in nn.Split(x, [0, 4], axis=1)] == [(2, 0), (2, 4), (2, 0)]


@pytest.mark.parametrize("sections, axis", [(1, 0), (1, 1), ([], 1)])
def test_split_into_one_part_differentiates_twice(sections, axis, rng):
    # one part: the engine hands _grads the gradient itself, not a tuple, and Split read its
    # rows as the parts' gradients (grad(create_graph=True) raised a shape error)
    x = var64(rng, 3, 4)
    w = rng.standard_normal((3, 4))
    part, = nn.Split(x, sections, axis=axis)
    got, = nn.grad((part * part * w).sum(), [x], create_graph=True)
    np.testing.assert_allclose(got.data, 2 * x.data * w)


@pytest.mark.parametrize("start, end", [(True, -1), (1.0, -1), (0, 2.5), (0, False)])
def test_flatten_refuses_axes_that_are_not_ints(start, end, rng):
    with pytest.raises(TypeError, match=r"Flatten: (start|end) must be an int, got "):
        nn.Flatten(var64(rng, 2, 3, 4), start, end)


@pytest.mark.parametrize("pad_width", [1.5, True, (1, 2.5), [(1, 1), (0, True)], "1"])
def test_pad_refuses_widths_that_are_not_ints(pad_width, rng):
    # 1.5 padded 1 cell and True padded 1
    with pytest.raises(TypeError, match=r"Pad: pad_width must be ints, got "):
        nn.Pad(var64(rng, 2, 3), pad_width)
    assert nn.Pad(var64(rng, 2, 3), np.int64(1)).shape == (4, 5)


def test_broadcast_shape_errors_name_the_op(rng):
    x = var64(rng, 1, 3)
    with pytest.raises(TypeError, match=r"Broadcast: the shape must be ints, got \(2, 3.0\)"):
        nn.Broadcast(x, (2, 3.0))
    with pytest.raises(TypeError, match=r"Broadcast: the shape must be ints, got \(True, 3\)"):
        x.expand(True, 3)
    assert nn.Broadcast(nn.constant(np.ones(1)), 4).shape == (4,)        # an int is a shape


def test_getitem_float_netvar_index_error_names_both_fixes(rng):
    x = var64(rng, 3, 4)
    with pytest.raises(IndexError, match=r"GetItem: an index NetVar must hold integers or "
                                         r"booleans, got dtype float32 \(build it with dtype=int, "
                                         r"or dtype=bool for a mask\)"):
        x[nn.NetVar(x.data > 0)]               # NetVar makes bools float32 unless dtype=bool
    mask = nn.NetVar(x.data > 0, dtype=bool)
    np.testing.assert_array_equal(x[mask].data, x.data[x.data > 0])


def test_methods_name_nnkits_spelling_of_pytorchs_keywords(rng):
    x = var64(rng, 2, 3, 4)
    with pytest.raises(TypeError, match=r"flatten\(\): nnkit spells the start argument start=, "
                                        r"not start_dim="):
        x.flatten(start_dim=0)
    with pytest.raises(TypeError, match=r"flatten\(\): nnkit spells the end argument end=, "
                                        r"not end_dim="):
        x.flatten(end_dim=1)
    with pytest.raises(TypeError, match=r"expand\(\) got an unexpected keyword argument 'size'"):
        x.expand(size=(2, 3, 4))
    assert x.flatten(0, 1).shape == (6, 4)
    assert x[:1].expand((3, 3, 4)).shape == (3, 3, 4)


def test_split_of_an_empty_axis_and_pad_of_a_0d_node(rng):
    # an empty axis split in equal parts crashed in range() with step 0
    parts = nn.Split(var64(rng, 0, 3), 2)
    assert [p.shape for p in parts] == [a.shape for a in np.split(np.ones((0, 3)), 2)]
    with pytest.raises(ValueError, match=r"Pad: x of shape \(\) has no axis to pad"):
        nn.Pad(nn.constant(np.float64(1.0)), 1)
    with pytest.raises(ValueError, match=r"Concat: axis 0 is out of range for inputs of shape "
                                         r"\(\) \(it has no axis\)"):
        nn.Concat([nn.constant(np.float64(1.0))] * 2)


def test_an_empty_list_index_selects_nothing_as_in_numpy():
    # [] became a float64 array, refused as a non-integer index
    a = np.arange(6.0).reshape(2, 3)
    x = nn.NetVar(a)
    assert x[[]].shape == a[[]].shape == (0, 3)
    assert x[[], 1].shape == a[[], 1].shape == (0,)
    (x[[]].sum() * 5.0 + x.sum()).back()
    np.testing.assert_array_equal(x.g, np.ones((2, 3)))


@pytest.mark.parametrize("index, expected", [
    (((0, 0), slice(None)), [[2, 2, 2], [0, 0, 0]]),
    ((slice(None), (1, 1)), [[0, 2, 0], [0, 2, 0]]),
    (((0, 0, 1),), [[2, 2, 2], [1, 1, 1]]),
])
def test_a_tuple_inside_the_index_adds_every_repeat_as_a_list_does(index, expected):
    # a tuple part was not read as an index array: repeats overwrote each other (1 for 2)
    a = np.arange(6.0).reshape(2, 3)
    x = nn.NetVar(a)
    y = x[index]
    np.testing.assert_array_equal(y.data, a[index])
    y.sum().back()
    np.testing.assert_array_equal(x.g, expected)
    first, = nn.grad((x[index] * x[index]).sum(), [x], create_graph=True)
    second, = nn.grad((first * first).sum(), [x])
    listed = tuple(list(part) if isinstance(part, tuple) else part for part in index)
    first_l, = nn.grad((x[listed] * x[listed]).sum(), [x], create_graph=True)
    np.testing.assert_array_equal(second, nn.grad((first_l * first_l).sum(), [x])[0])


# ------------------------------------------------------------------ Split: several outputs

SPLIT_CONSUMERS = {
    # every part, each weighted differently
    "all parts": lambda v: nn.Concat([p * float(i + 1) for i, p in
                                      enumerate(nn.Split(v, [1, 3], axis=1))], 1),
    # the middle part unused: its slice of dx is zero
    "unused part": lambda v: (lambda a, b, c: (a * 2.0).sum() + (c * c).sum())(
        *nn.Split(v, [1, 3], axis=1)),
    # only a later part used: part 0 (the op node) gets no gradient of its own
    "only part 2": lambda v: (nn.Split(v, [1, 2], axis=1)[2] ** 2).sum(),
    # parts of shape (1, 1) and a 0-d result from them
    "(1, 1) parts": lambda v: (lambda parts: parts[0] * parts[3] + parts[1].sum())(
        nn.Split(v[:1], 4, axis=1)),
    # parts broadcast against a wider operand, and against each other
    "broadcast": lambda v: (lambda a, b: (a * nn.constant(np.arange(6.0).reshape(3, 2))) + b)(
        *nn.Split(v[:, :2] * 1.0, 2, axis=1)),
    # one part read by three consumers, another by two
    "3 consumers": lambda v: (lambda a, b: a * b + a.exp() + (a * 3.0) + b.tanh())(
        *nn.Split(v, 2, axis=1)),
}


@pytest.mark.parametrize("case", SPLIT_CONSUMERS)
def test_split_gradients_through_each_kind_of_consumer(case, rng):
    x = var64(rng, 3, 4)
    nn.gradcheck(SPLIT_CONSUMERS[case], x)
    nn.gradgradcheck(SPLIT_CONSUMERS[case], x)


def test_split_is_one_node_with_several_outputs(rng):
    x = var64(rng, 3, 4)
    parts = nn.Split(x, [1, 3], axis=1)
    assert isinstance(parts, tuple) and len(parts) == 3
    assert isinstance(parts[0], nn.Split) and parts[0].parents == (x,)
    assert all(p.parents == (parts[0],) for p in parts[1:])
    parts[1].sum().back()                      # only output 1 used
    np.testing.assert_array_equal(x.g, [[0, 1, 1, 0]] * 3)
    np.testing.assert_array_equal(parts[0].g, np.zeros((3, 1)))
    with nn.no_grad():
        quiet = nn.Split(x, 2, axis=1)
    assert all(not p.requires_grad and not p.parents for p in quiet)


def test_a_split_refused_midway_leaves_no_gradient_for_the_next_pass(rng):
    # back() through part 1 hands its gradient to the op, then a check before the op's _back
    # refuses the pass (x holds a NaN gradient from before): the next pass, through part 0
    # alone, must not find part 1's gradient still handed over
    x = var64(rng, 2, 4)
    with nn.detect_anomaly():
        first, second = nn.Split(x, 2, axis=1)
        x.g = np.full((2, 4), np.nan)
        with pytest.raises(nn.AnomalyError, match="held a NaN or Inf gradient before"):
            ((first * 0.0).sum() + second.sum()).back()
    x.reset()
    first.sum().back()
    np.testing.assert_array_equal(x.g, [[1, 1, 0, 0]] * 2)


# ----------------------------------------------------------------------------- Second derivatives
# Hessian-vector products (grad(create_graph=True)) against PyTorch's double backward in float64
# through chains of indexing, joins and reductions (test_gradgradcheck_every_op checks each op
# alone against finite differences), a node read by three consumers, and GetItem's scatter-add
# gradient with repeated indices.

ROWS = [0, 2, 2, 1, 2]      # repeated indices: row 2 is read three times


def test_hvp_through_getitem_concat_norm_and_logsumexp(torch, rng):
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


def test_hvp_through_stack_split_pad_and_max(torch, rng):
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


def test_a_node_read_by_three_consumers(torch, rng):
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
