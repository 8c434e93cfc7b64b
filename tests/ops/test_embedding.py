"""Embedding: lookup shapes, scatter-add of repeated tokens, errors, gradchecks."""
import numpy as np
import pytest

import nnkit as nn
from tests.conftest import var64
from tests.ops.helpers import assert_matches_pytorch


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
