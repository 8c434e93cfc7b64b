"""Device errors: mixing host and GPU data names both devices; moves need CuPy with a GPU.

Without a GPU the mixing error is exercised with a stand-in for CuPy (a fake module whose
``ndarray`` type refuses NumPy operands, as CuPy's does); with one, with real CuPy arrays.
"""
import types

import numpy as np
import pytest

import nnkit as nn
from nnkit import backend as nnbackend


class FakeGPUArray:
    """Just enough of a CuPy array: shape, dtype, device.id; arithmetic with NumPy refuses."""
    __array_ufunc__ = None          # numpy operators raise TypeError, as with a CuPy array

    def __init__(self, data):
        self.data = np.asarray(data)
        self.shape, self.dtype, self.ndim, self.size = (self.data.shape, self.data.dtype,
                                                        self.data.ndim, self.data.size)
        self.device = types.SimpleNamespace(id=1)

    def _refuse(self, other):
        raise TypeError("Unsupported type <class 'numpy.ndarray'>")

    __add__ = __radd__ = __mul__ = __rmul__ = __matmul__ = __rmatmul__ = _refuse


@pytest.fixture
def fake_gpu(monkeypatch):
    """Make nnkit's backend see FakeGPUArray as the CuPy array type."""
    monkeypatch.setattr(nnbackend, "_cupy", types.SimpleNamespace(ndarray=FakeGPUArray))


def on_fake_gpu(data):
    node = nn.NetVar(np.asarray(data, dtype=np.float64))
    node._data = FakeGPUArray(node._data)
    return node


@pytest.mark.parametrize("op", [nn.Add, nn.Mul, nn.Multiply])
def test_mixing_devices_names_the_op_and_both_devices_simulated(op, fake_gpu):
    x = nn.NetVar(np.ones((2, 2)))
    with pytest.raises(ValueError) as error:
        op(x, on_fake_gpu(np.ones((2, 2))))
    message = str(error.value)
    assert message.startswith(f"{op.__name__}: inputs live on different devices")
    assert "(2, 2) on cpu" in message and "(2, 2) on gpu:1" in message
    assert ".to_gpu() or .to_cpu()" in message


def test_mixing_devices_in_a_recurrent_op_simulated(fake_gpu):
    x = nn.NetVar(np.ones((3, 2, 2)))
    W, R, b = on_fake_gpu(np.ones((2, 4))), nn.NetVar(np.ones((4, 4))), nn.NetVar(np.ones(4))
    with pytest.raises(ValueError, match=r"RNN: inputs live on different devices "
                                         r"\(\(3, 2, 2\) on cpu, \(2, 4\) on gpu:1"):
        nn.RNN(x, W, R, b)


def test_device_names(fake_gpu):
    assert nn.NetVar(np.ones(2)).device == "cpu"
    assert on_fake_gpu(np.ones(2)).device == "gpu:1"


def test_mixing_real_devices_names_both(backend):
    if not backend.gpu:
        pytest.skip("needs a GPU: two devices to mix")
    x, w = nn.NetVar(np.ones((2, 3))), backend.var(np.ones((3, 2)))
    for op, args in ((nn.Multiply, (x, w)), (nn.Add, (x, backend.var(np.ones((2, 3)))))):
        with pytest.raises(ValueError, match=f"{op.__name__}: inputs live on different devices"
                                             r".*on cpu.*on gpu:\d"):
            op(*args)


def test_moves_without_a_gpu_raise_a_clear_error():
    if nn.gpu_available():
        pytest.skip("a GPU is present")
    for movable in (nn.NetVar(np.ones(2)), nn.FFN((nn.Add, nn.NetVar(np.ones(2)))),
                    nn.SequenceModel(3, 2, 2, seed=0)):
        with pytest.raises(RuntimeError, match="CuPy with a working GPU is not available"):
            movable.to_gpu()


def test_to_cpu_on_the_host_changes_nothing(rng):
    net = nn.FFN((nn.Multiply, nn.NetVar(rng.standard_normal((2, 3)))), (nn.ReLU,))
    before = [p.data for p in net.vars]
    assert net.to_cpu() is net
    assert all(p.data is data for p, data in zip(net.vars, before)), "no copy on the host"
