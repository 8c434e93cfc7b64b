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
