"""Conv2D / MaxPool2D / AvgPool2D: gradchecks, PyTorch parity (values and gradients), errors."""
import numpy as np
import pytest

import nnkit as nn
from tests.conftest import var64
from tests.ops.helpers import assert_matches_pytorch

CONV_CASES = [  # x shape, w shape, stride, padding, bias
    ((2, 3, 5, 5), (4, 3, 3, 3), 1, 0, True),
    ((1, 2, 6, 5), (3, 2, 3, 2), 2, 1, True),
    ((2, 1, 4, 4), (2, 1, 1, 1), 1, 0, False),
    ((1, 2, 5, 6), (2, 2, 2, 3), (2, 1), (0, 2), True),
]


@pytest.mark.parametrize("xs,ws,stride,padding,bias", CONV_CASES)
def test_conv2d_gradcheck(xs, ws, stride, padding, bias, rng):
    x, w = var64(rng, *xs), var64(rng, *ws)
    if bias:
        b = var64(rng, ws[0])
        nn.gradcheck(lambda u, v, c: nn.Conv2D(u, v, c, stride, padding), x, w, b)
    else:
        nn.gradcheck(lambda u, v: nn.Conv2D(u, v, None, stride, padding), x, w)


@pytest.mark.parametrize("xs,ws,stride,padding,bias", CONV_CASES)
def test_conv2d_matches_pytorch(xs, ws, stride, padding, bias, torch, rng):
    import torch.nn.functional as F
    arrays = [rng.standard_normal(xs), rng.standard_normal(ws)] + \
        ([rng.standard_normal(ws[0])] if bias else [])
    assert_matches_pytorch(torch, lambda x, w, b=None: nn.Conv2D(x, w, b, stride, padding),
                           lambda x, w, b=None: F.conv2d(x, w, b, stride, padding), *arrays,
                           rng=rng, atol=1e-12, grad_atol=1e-11)


def test_conv2d_errors(rng):
    x = var64(rng, 1, 3, 5, 5)
    with pytest.raises(ValueError, match=r"Conv2D: w of shape \(8, 1, 3, 3\) expects 1 input "
                                         r"channels, x of shape \(1, 3, 5, 5\) has 3"):
        nn.Conv2D(x, var64(rng, 8, 1, 3, 3))
    with pytest.raises(ValueError, match=r"Conv2D: x must be \(N, C, H, W\)"):
        nn.Conv2D(var64(rng, 3, 5), var64(rng, 8, 3, 3, 3))
    with pytest.raises(ValueError, match="Conv2D: a 7×7 window does not fit"):
        nn.Conv2D(x, var64(rng, 2, 3, 7, 7))
    with pytest.raises(ValueError, match="Conv2D: b of shape"):
        nn.Conv2D(x, var64(rng, 2, 3, 3, 3), var64(rng, 3))
    with pytest.raises(ValueError, match="Conv2D: stride must be an int or a pair"):
        nn.Conv2D(x, var64(rng, 2, 3, 3, 3), stride=0)


def test_conv2d_keeps_float32(rng):
    x = nn.NetVar(rng.standard_normal((2, 1, 4, 4)).astype(np.float32))
    w = nn.NetVar(rng.standard_normal((2, 1, 3, 3)).astype(np.float32))
    y = nn.Conv2D(x, w, padding=1)
    y.back()
    assert y.dtype == x.g.dtype == w.g.dtype == np.float32 and y.shape == (2, 2, 4, 4)


POOL_CASES = [((2, 3, 4, 4), 2, None), ((1, 2, 5, 5), 3, 1), ((1, 1, 6, 5), (2, 3), (1, 2)),
              ((2, 2, 5, 4), 2, None)]


@pytest.mark.parametrize("op", [nn.MaxPool2D, nn.AvgPool2D])
@pytest.mark.parametrize("shape,size,stride", POOL_CASES)
def test_pool_gradcheck(op, shape, size, stride, rng):
    x = var64(rng, *shape)
    nn.gradcheck(lambda v: op(v, size, stride), x)


@pytest.mark.parametrize("op", [nn.MaxPool2D, nn.AvgPool2D])
@pytest.mark.parametrize("shape,size,stride", POOL_CASES)
def test_pool_matches_pytorch(op, shape, size, stride, rng, torch):
    import torch.nn.functional as F
    reference = {nn.MaxPool2D: F.max_pool2d, nn.AvgPool2D: F.avg_pool2d}[op]
    assert_matches_pytorch(torch, lambda v: op(v, size, stride),
                           lambda t: reference(t, size, stride), rng.standard_normal(shape),
                           rng=rng, atol=1e-12)


def test_maxpool_ties_go_to_the_first_maximum_as_pytorch(torch):
    import torch.nn.functional as F
    data = np.array([[[[1.0, 1.0, 0.0, 2.0], [1.0, 0.0, 2.0, 2.0],
                       [3.0, 3.0, 3.0, 0.0], [3.0, 3.0, 0.0, 0.0]]]])
    x = nn.NetVar(data)
    nn.MaxPool2D(x, 2, 1).back()
    t = torch.tensor(data, requires_grad=True)
    F.max_pool2d(t, 2, 1).sum().backward()
    np.testing.assert_array_equal(x.g, t.grad.numpy())
    x.reset()
    nn.MaxPool2D(x, 2).back()
    np.testing.assert_array_equal(x.g, [[[[1, 0, 0, 1], [0, 0, 0, 0], [1, 0, 1, 0],
                                          [0, 0, 0, 0]]]])


def test_pool_errors(rng):
    with pytest.raises(ValueError, match="MaxPool2D: a 5×5 window does not fit"):
        nn.MaxPool2D(var64(rng, 1, 1, 4, 4), 5)
    with pytest.raises(ValueError, match=r"AvgPool2D: x must be \(N, C, H, W\)"):
        nn.AvgPool2D(var64(rng, 4, 4), 2)
    with pytest.raises(ValueError, match="MaxPool2D: size must be an int or a pair"):
        nn.MaxPool2D(var64(rng, 1, 1, 4, 4), (2, 2, 2))
