import numpy as np
import pytest

import nnkit as nn


def test_rand2_range_and_shape():
    w = nn.rand2(2, 3, seed=0)
    assert w.shape == (2, 3) and w.dtype == np.float32 and w.requires_grad
    limit = np.sqrt(3 / 2.5)
    assert np.all(np.abs(w.data) <= limit)
    big = nn.rand2(200, 300, seed=1)
    assert big.data.var() == pytest.approx(1 / 250, rel=0.05)
    assert nn.rand2(3).shape == (1, 3)


@pytest.mark.parametrize("init", [nn.rand2, nn.glorot, nn.he])
def test_seeded_and_reproducible(init):
    np.testing.assert_array_equal(init(4, 5, seed=7).data, init(4, 5, seed=7).data)
    nn.seed(3)
    a = init(4, 5).data
    nn.seed(3)
    np.testing.assert_array_equal(a, init(4, 5).data)
    assert not np.array_equal(init(4, 5, seed=1).data, init(4, 5, seed=2).data)


def test_fan_conventions():
    g = nn.glorot(400, 600, seed=0)
    assert g.data.var() == pytest.approx(2 / (400 + 600), rel=0.05)
    h = nn.he(500, 300, seed=0)
    assert h.data.var() == pytest.approx(2 / 500, rel=0.05)
    assert not nn.zeros(3, 2).data.any()


def test_bad_shape():
    with pytest.raises(ValueError, match="shape"):
        nn.glorot(0, 3)
