import numpy as np
import pytest

import nnkit as nn


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def torch():
    """PyTorch as a reference oracle; tests using it are skipped when it is not installed."""
    return pytest.importorskip("torch")


def var64(rng, *shape, requires_grad=True, positive=False, name=None):
    """A float64 NetVar with standard-normal data (|data| + 0.5 when positive)."""
    data = rng.standard_normal(shape)
    if positive:
        data = np.abs(data) + 0.5
    return nn.NetVar(data, requires_grad=requires_grad, name=name)


class Backend:
    """One array backend for a test: ``name`` ('numpy' or 'cupy') and ``xp`` (its module).

    Tests build their inputs on the host and move them with ``array`` / ``var`` / ``var64``,
    and bring results back with ``host``, so one test body checks both backends.
    """

    def __init__(self, name):
        self.name = name
        self.gpu = name == "cupy"
        self.xp = nn.backend.cupy_module() if self.gpu else np

    def array(self, data, dtype=None):
        """``data`` (host data) as an array of this backend."""
        return self.xp.asarray(np.asarray(data, dtype=dtype))

    def var(self, data, requires_grad=True, dtype=None, name=None):
        """A NetVar made on the host as ``nn.NetVar`` does, then moved to this backend."""
        return self.move(nn.NetVar(data, requires_grad=requires_grad, dtype=dtype, name=name))

    def var64(self, rng, *shape, requires_grad=True, positive=False, name=None):
        """``var64`` (float64 standard-normal data) on this backend."""
        return self.move(var64(rng, *shape, requires_grad=requires_grad, positive=positive,
                               name=name))

    def move(self, thing):
        """A NetVar, model or optimizer moved in place to this backend (returned)."""
        return thing.to_gpu() if self.gpu else thing

    def host(self, value):
        """A NetVar's data, an array or a number as NumPy (copied from the GPU if there)."""
        if isinstance(value, nn.NetVar):
            value = value.data
        return np.asarray(nn.backend.to_cpu(value))

    def __repr__(self):
        return f"Backend({self.name!r})"


@pytest.fixture
def float64():
    """nnkit's default dtype float64 for the test (new parameters and converted data), restored
    after it."""
    saved = nn.get_dtype()
    nn.set_dtype(np.float64)
    yield
    nn.set_dtype(saved)


@pytest.fixture(params=["numpy", "cupy"])
def backend(request):
    """Runs a test on NumPy and, when CuPy with a GPU is present, again on CuPy."""
    if request.param == "cupy" and not nn.gpu_available():
        pytest.skip("CuPy with a GPU is not available")
    return Backend(request.param)
