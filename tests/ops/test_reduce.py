import numpy as np
import pytest

import nnkit as nn
from tests.conftest import var64


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
