import numpy as np
import pytest

import nnkit as nn
from tests.conftest import var64


@pytest.mark.parametrize("shape", [(4, 3), (12,), (2, -1), (1, 2, 6)])
def test_reshape_gradcheck(shape, rng):
    nn.gradcheck(lambda x: nn.Reshape(x, shape) * 2.0, var64(rng, 3, 4))


def test_reshape_error(rng):
    with pytest.raises(ValueError, match=r"Reshape: cannot reshape \(3, 4\) into \(5,\)"):
        var64(rng, 3, 4).reshape(5)


@pytest.mark.parametrize("axes", [None, (0, 2, 1), (2, 0, 1)])
def test_transpose_gradcheck(axes, rng):
    x = var64(rng, 2, 3, 4)
    nn.gradcheck(lambda v: nn.Transpose(v, axes) * 1.5, x)
    np.testing.assert_array_equal(nn.Transpose(x, axes).data, np.transpose(x.data, axes))


def test_T_and_methods(rng):
    x = var64(rng, 2, 3)
    assert x.T.shape == (3, 2)
    assert x.reshape(3, 2).shape == (3, 2)
    assert x.reshape((6,)).shape == (6,)
    assert x.transpose(1, 0).shape == (3, 2)
    nn.gradcheck(lambda v: v.T @ v, x)
