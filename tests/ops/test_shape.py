import re

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


# ----------------------------------------------------------------------------- bad axes and shapes

@pytest.mark.parametrize("axes", [(0, 5, 1), (0, -4, 1), (3, 0, 1)])
def test_transpose_refuses_out_of_range_axes(axes, rng):
    # an axis was taken modulo ndim: (0, 5, 1) read as (0, 2, 1)
    given = re.escape(repr(axes))
    with pytest.raises(ValueError, match=rf"Transpose: axis -?\d \(in axes={given}\) is out of "
                                         r"range for x of shape \(2, 3, 4\)"):
        nn.Transpose(var64(rng, 2, 3, 4), axes)


def test_transpose_takes_negative_axes_in_range(rng):
    x = var64(rng, 2, 3, 4)
    np.testing.assert_array_equal(nn.Transpose(x, (0, -1, -2)).data,
                                  np.transpose(x.data, (0, 2, 1)))
    nn.gradcheck(lambda v: nn.Transpose(v, (-1, 0, 1)) * 2.0, x)


@pytest.mark.parametrize("axes", [(True, 0, 2), (1.0, 0, 2), (1.5, 0, 2), (np.bool_(True), 0, 2),
                                  "102"])
def test_transpose_refuses_axes_that_are_not_ints(axes, rng):
    with pytest.raises(TypeError, match=r"Transpose: axes must be an int or a tuple of ints"):
        nn.Transpose(var64(rng, 2, 3, 4), axes)


def test_transpose_error_points_pytorch_users_to_the_permutation(rng):
    x = var64(rng, 2, 3, 4, 5)
    with pytest.raises(ValueError, match=r"Transpose: axes \(1, 2\) are not a permutation of the "
                                         r"4 axes of x of shape \(2, 3, 4, 5\).*PyTorch"):
        x.transpose(1, 2)
    with pytest.raises(ValueError, match=r"Transpose: axes \(\) are not a permutation"):
        x.transpose(())                  # an empty permutation is not "reverse them all"
    assert x.transpose().shape == (5, 4, 3, 2)
    assert nn.constant(np.float64(2.0)).transpose().shape == ()


def test_reshape_refuses_a_shape_that_is_not_ints(rng):
    x = var64(rng, 2, 3)
    for shape in ((3.0, 2), (True, 6)):
        with pytest.raises(TypeError, match=r"Reshape: the shape must be ints, got \("):
            x.reshape(shape)
    assert x.reshape(np.int64(6)).shape == (6,)


# ----------------------------------------------------------------------------- PyTorch's keywords

def test_methods_name_nnkits_spelling_of_pytorchs_keywords(rng):
    x = var64(rng, 2, 3)
    with pytest.raises(TypeError, match=r"transpose\(\): nnkit spells the axis argument axis=, "
                                        r"not dim="):
        x.transpose(dim=1)
    with pytest.raises(TypeError, match=r"transpose\(\) got an unexpected keyword argument "
                                        r"'dim0'; give the new order of every axis"):
        x.transpose(dim0=0, dim1=1)
    with pytest.raises(TypeError, match=r"reshape\(\) got an unexpected keyword argument 'shape'"):
        x.reshape(shape=(3, 2))
