"""Embedding: lookup shapes, scatter-add of repeated tokens, errors, gradchecks."""
import numpy as np
import pytest

import nnkit as nn
from tests.conftest import var64
from tests.ops.helpers import (assert_matches_pytorch, assert_same_hvp,
                               hessian_vector_products)


@pytest.mark.parametrize("index_shape", [(5,), (3, 4), (2, 3, 2), ()])
def test_embedding_values_and_gradcheck(index_shape, rng):
    table = var64(rng, 6, 3)
    indices = rng.integers(0, 6, size=index_shape)
    y = nn.Embedding(indices, table)
    assert y.shape == tuple(index_shape) + (3,)
    np.testing.assert_array_equal(y.data, table.data[indices])
    nn.gradcheck(lambda t: nn.Embedding(indices, t), table)


def test_embedding_repeated_tokens_accumulate():
    table = nn.NetVar(np.zeros((4, 2)))
    tokens = nn.NetVar([[1, 3, 1], [1, 0, 3]], dtype=int)
    y = nn.Embedding(tokens, table)
    assert y.shape == (2, 3, 2)
    y.back(np.arange(12.0).reshape(2, 3, 2))
    np.testing.assert_array_equal(table.g, [[8, 9], [0 + 4 + 6, 1 + 5 + 7], [0, 0], [2 + 10, 3 + 11]])


def test_embedding_matches_pytorch(torch, rng):
    import torch.nn.functional as F
    table = rng.standard_normal((7, 4))
    tokens = rng.integers(0, 7, size=(3, 5))
    assert_matches_pytorch(torch, lambda t: nn.Embedding(tokens, t),
                           lambda t: F.embedding(torch.tensor(tokens), t), table, rng=rng,
                           atol=1e-12)


def test_embedding_errors(rng):
    table = var64(rng, 5, 2)
    with pytest.raises(ValueError, match=r"Embedding: index 5 is out of range for a table of 5 "
                                         r"rows \(indices of shape \(2,\)\)"):
        nn.Embedding(np.array([0, 5]), table)
    with pytest.raises(ValueError, match="Embedding: index -1 is out of range"):
        nn.Embedding(np.array([-1, 2]), table)
    with pytest.raises(TypeError, match="Embedding: indices must have an integer dtype"):
        nn.Embedding(np.array([0.0, 1.0]), table)
    with pytest.raises(ValueError, match=r"Embedding: table must be \(V, D\)"):
        nn.Embedding(np.array([0]), var64(rng, 2, 2, 2))


@pytest.mark.parametrize("padding_idx, indices", [
    (2, [[2, 0, 2], [4, 2, 1]]),          # the padding row picked several times
    (-1, [[4, 0], [4, 3]]),               # negative: row V − 1
    (-5, [0, 1, 0]),                      # −V: row 0
    (3, [0, 1, 2, 4]),                    # the padding row never picked
])
def test_embedding_padding_idx_gradcheck(padding_idx, indices, rng):
    table = var64(rng, 5, 3)
    indices = np.array(indices)
    y = nn.Embedding(indices, table, padding_idx=padding_idx)
    np.testing.assert_array_equal(y.data, table.data[indices])      # forward unchanged
    assert y.padding_idx == padding_idx % 5
    # The padding row's zero gradient is a choice, not its derivative: finite differences see
    # it through the lookups. So the table is fed as t·keep + frozen, whose padding row is a
    # constant copy (same values), and every row of t is then checked, the padding row at 0.
    keep = np.ones((5, 1))
    keep[padding_idx] = 0
    frozen = nn.constant(table.data * (1 - keep))
    nn.gradcheck(lambda t: nn.Embedding(indices, t * keep + frozen, padding_idx=padding_idx),
                 table)


def test_embedding_padding_row_gets_exactly_zero_gradient(rng):
    table = var64(rng, 4, 3)
    tokens = nn.NetVar([[0, 3, 0], [1, 0, 3]], dtype=int)
    y = nn.Embedding(tokens, table, padding_idx=np.int64(0))
    y.back(rng.standard_normal(y.shape) + 1.0)
    assert np.all(table.g[0] == 0.0)
    assert np.all(table.g[[1, 3]] != 0.0)        # the other picked rows do train
    assert np.all(table.g[2] == 0.0)             # never picked
    unpadded = var64(rng, 4, 3)
    seed = np.ones(y.shape)
    nn.Embedding(tokens, unpadded).back(seed)
    assert np.all(unpadded.g[0] == 3.0)          # without padding_idx row 0 sums its 3 picks


@pytest.mark.parametrize("padding_idx", [0, 3, -1, -7])
def test_embedding_padding_idx_matches_pytorch(padding_idx, torch, rng):
    import torch.nn.functional as F
    table = rng.standard_normal((7, 4))
    tokens = rng.integers(0, 7, size=(3, 5))
    tokens[0, :3] = padding_idx % 7
    assert_matches_pytorch(torch, lambda t: nn.Embedding(tokens, t, padding_idx=padding_idx),
                           lambda t: F.embedding(torch.tensor(tokens), t, padding_idx=padding_idx),
                           table, rng=rng, rtol=1e-12)


def test_embedding_padding_idx_errors(rng):
    table = var64(rng, 5, 2)
    indices = np.array([0, 1])
    with pytest.raises(ValueError, match=r"Embedding: padding_idx 5 is out of range \[-5, 5\) "
                                         r"for a table of 5 rows"):
        nn.Embedding(indices, table, padding_idx=5)
    with pytest.raises(ValueError, match=r"Embedding: padding_idx -6 is out of range \[-5, 5\)"):
        nn.Embedding(indices, table, padding_idx=-6)
    for bad in (1.0, True, "0", np.array([1])):
        with pytest.raises(TypeError, match=r"Embedding: padding_idx must be None or an "
                                            r"integer in \[-5, 5\) for a table of 5 rows, got"):
            nn.Embedding(indices, table, padding_idx=bad)


def test_embedding_refuses_bool_and_float_indices_and_changes_nothing(rng):
    table = var64(rng, 5, 2)
    nn.Embedding(np.array([1, 1]), table).back()
    before = table.data.copy(), table.g.copy()
    for indices in (np.array([True, False]), True, nn.NetVar([1, 2]), [1.0, 2.0]):
        with pytest.raises(TypeError, match=r"Embedding: indices must have an integer dtype, got "
                                            r"(bool|float)"):
            nn.Embedding(indices, table)
    with pytest.raises(ValueError, match=r"Embedding: index 7 is out of range for a table of 5 "
                                         r"rows"):
        nn.Embedding(np.array([1, 7], dtype=np.uint8), table)
    np.testing.assert_array_equal(table.data, before[0])
    np.testing.assert_array_equal(table.g, before[1])


def test_an_embedding_of_zero_columns_backpropagates():
    # reshape(-1, 0) of an empty gradient failed inside NumPy
    table = nn.NetVar(np.zeros((3, 0)))
    y = nn.Embedding(np.array([[0, 2]]), table)
    y.back(np.zeros(y.shape))
    assert table.g.shape == (3, 0)
    (first,) = nn.grad(nn.Embedding(np.array([[0, 2]]), table), [table], g=nn.NetVar(
        np.zeros((1, 2, 0))), create_graph=True)
    assert first.shape == (3, 0)


# ----------------------------------------------------------------------------- Second derivatives
# Hessian-vector products (grad(create_graph=True)) against PyTorch's double backward in float64;
# the padding row gets nothing at any order, third derivatives included (the op that Embedding
# builds for its gradient is differentiated again).

def test_embedding_hvp_with_padding_matches_torch(torch, rng):
    F = torch.nn.functional
    tokens = np.array([[0, 2, 3], [2, 2, 1]])              # row 2 is the padding, read 3 times

    def ours(table):
        rows = nn.Embedding(tokens, table, padding_idx=2)
        return (rows * rows * rows).sum() + nn.Embedding(tokens[:, 2:], table).exp().sum()

    def theirs(table):
        rows = F.embedding(torch.tensor(tokens), table, padding_idx=2)
        return (rows ** 3).sum() + F.embedding(torch.tensor(tokens[:, 2:]), table).exp().sum()

    table = rng.standard_normal((5, 3))
    assert_same_hvp(ours, theirs, [table], rng)
    directions = [rng.standard_normal(table.shape)]
    mine, _ = hessian_vector_products(ours, theirs, [table], directions)
    assert not np.any(mine[0][2]) and not np.any(mine[0][4])  # padding row; an unused row


def test_embedding_padding_row_gets_exactly_nothing_at_every_order(rng):
    tokens = np.array([1, 2, 2, 0])
    table = nn.NetVar(rng.standard_normal((3, 4)))
    g = nn.NetVar(rng.standard_normal((4, 4)))
    y = nn.Embedding(tokens, table, padding_idx=-1)        # row 2
    np.testing.assert_array_equal(y.data[1], table.data[2])  # the value is the row itself
    (dtable,) = nn.grad(y * y, [table], g=g, create_graph=True)
    assert not np.any(dtable.data[2])
    v = rng.standard_normal((3, 4))
    dt, dg = nn.grad((dtable * v).sum(), [table, g])
    assert not np.any(dt[2]) and not np.any(dg[1:3])       # padding lookups: nothing, not g·v
    np.testing.assert_allclose(dg[[0, 3]], 2 * table.data[[1, 0]] * v[[1, 0]], rtol=1e-12)
    np.testing.assert_allclose(dt[[0, 1]], 2 * g.data[[3, 0]] * v[[0, 1]], rtol=1e-12)

    def table_gradient(table, g):
        rows = nn.Embedding(tokens, table, padding_idx=2)
        return nn.grad(rows * rows, [table], g=g, create_graph=True)[0]

    assert nn.gradgradcheck(table_gradient, table, g)     # third derivatives


@pytest.mark.parametrize("idx", [[3, 0, 3, 3, 1, 0], [2, 2, 2], [4], [], [5, 4, 3, 2, 1, 0]])
def test_add_rows_sums_the_rows_of_repeated_indices(idx, rng):
    # the sorted segment sum against numpy.add.at, into a table that is not zero
    from nnkit.ops.embedding import add_rows
    idx = np.array(idx, dtype=np.int64)
    rows = rng.standard_normal((idx.size, 3))
    table = rng.standard_normal((6, 3))
    expected = table.copy()
    np.add.at(expected, idx, rows)
    result = add_rows(table, idx, rows)
    assert result is table
    np.testing.assert_allclose(table, expected, rtol=1e-14, atol=1e-14)


def test_embedding_table_gradient_with_repeats_and_padding(rng):
    tokens = np.array([[1, 4, 1], [0, 1, 4]])
    table = nn.NetVar(rng.standard_normal((5, 2)))
    y = nn.Embedding(tokens, table, padding_idx=4)
    seed = rng.standard_normal((2, 3, 2))
    y.back(seed)
    expected = np.zeros((5, 2))
    for position, token in np.ndenumerate(tokens):
        if token != 4:
            expected[token] += seed[position]
    np.testing.assert_allclose(table.g, expected, rtol=1e-14)
