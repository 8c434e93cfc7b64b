"""nnkit: a define-by-run autograd micro-framework on NumPy (and CuPy on a GPU).

    import nnkit as nn
    x = nn.NetVar([1, 2])
    w = nn.NetVar([[3, 4, 5], [6, 7, 8]])
    y = nn.ReLU(nn.Multiply(x, w))
    y.back()            # fills w.g and x.g

``__all__`` is the public surface: the names ``from nnkit import *`` gives, and three
subpackages used by their own names (``nn.layers``, ``nn.distributed``, ``nn.backend``). The
other modules are imported (``import nnkit.ops`` works) but are not names of ``nnkit``.
"""
import sys as _sys
import types as _types
import warnings as _warnings

from . import backend
from .backend import get_rng_state, gpu_available, seed, set_rng_state
from .core import InplaceEditError, NetOp, NetVar, constant
from .gradients import unbroadcast
from .dtypes import get_dtype, set_dtype
from .modes import enable_grad, eval_mode, is_grad_enabled, is_training, no_grad, train_mode
from .instrument import AnomalyError, detect_anomaly
from .module import Module
from . import layers
from . import distributed
from .layers import positional_encoding
from .ops import *  # noqa: F401,F403  (the op catalogue)
from .optim import *  # noqa: F401,F403
from .nets import *  # noqa: F401,F403
from .training import *  # noqa: F401,F403
from .init import *  # noqa: F401,F403
from .data import *  # noqa: F401,F403
from .io import *  # noqa: F401,F403
from .viz import *  # noqa: F401,F403
from .autodiff import grad
from .replay import capture
from .gradient_check import *  # noqa: F401,F403
from .trace import *  # noqa: F401,F403
from . import data as _data, gradient_check as _gradient_check, hints as _hints, init as _init
from . import io as _io, nets as _nets, ops as _ops, optim as _optim, trace as _trace
from . import training as _training, viz as _viz

__version__ = "0.1.0"

__all__ = [
    # the engine
    "NetVar", "NetOp", "constant", "InplaceEditError", "grad", "unbroadcast",
    # capture and replay (nnkit/replay/)
    "capture",
    # modes, dtypes, devices, random numbers, anomalies
    "no_grad", "enable_grad", "is_grad_enabled", "eval_mode", "train_mode", "is_training",
    "get_dtype", "set_dtype", "gpu_available", "seed", "get_rng_state", "set_rng_state",
    "AnomalyError", "detect_anomaly",
    # models
    "Module", "positional_encoding",
    # the subpackages used by their own names
    "layers", "distributed", "backend",
    # each family lists its own names
    *_ops.__all__, *_optim.__all__, *_nets.__all__, *_training.__all__, *_init.__all__,
    *_data.__all__,
    *_io.__all__, *_viz.__all__, *_gradient_check.__all__, *_trace.__all__,
]

# `import nnkit` imported every module; only the public ones stay names of nnkit (the others
# stay in sys.modules: `import nnkit.ops` and `nnkit.ops` after it keep working, through
# __getattr__ below).
for _name, _value in list(globals().items()):
    if isinstance(_value, _types.ModuleType) and not _name.startswith("_") \
            and _name not in __all__:
        del globals()[_name]
del _name, _value, _data, _init, _io, _nets, _ops, _optim, _trace, _training, _viz


def __getattr__(name):
    """Called only when ``nnkit.name`` is not found: an imported submodule (``nnkit.ops``), or
    an AttributeError naming nnkit's spelling of a PyTorch name (``nn.CrossEntropyLoss``)."""
    module = _sys.modules.get(f"{__name__}.{name}")
    if module is not None and not name.startswith("_"):
        return module
    ours = _hints.spelling("nnkit", name)
    if ours is not None:
        raise AttributeError(f"module 'nnkit' has no attribute {name!r}; in nnkit: {ours}")
    raise AttributeError(f"module 'nnkit' has no attribute {name!r}")


class _Renamed(_types.ModuleType):
    """A module's old name (the function ``nnkit.gradcheck`` hid the module ``nnkit.gradcheck``,
    now ``nnkit.gradient_check``): ``from nnkit.gradcheck import X`` keeps working, with a
    DeprecationWarning naming the new module."""

    def __init__(self, old, new):
        super().__init__(old, f"Renamed: use {new.__name__}.")
        self._new = new

    def __getattr__(self, name):
        if name.startswith("__") and name != "__all__":
            raise AttributeError(name)
        _warnings.warn(f"{self.__name__} is renamed {self._new.__name__}: import {name} from "
                       f"{self._new.__name__} (or from nnkit)", DeprecationWarning, stacklevel=2)
        return getattr(self._new, name)


_sys.modules[f"{__name__}.gradcheck"] = _Renamed(f"{__name__}.gradcheck", _gradient_check)


class _Module(_types.ModuleType):
    """Makes ``nnkit.dtype`` a live, settable view of the default dtype."""

    @property
    def dtype(self):
        return get_dtype()

    @dtype.setter
    def dtype(self, value):
        set_dtype(value)


_sys.modules[__name__].__class__ = _Module
