"""nnkit: a define-by-run autograd micro-framework on NumPy (and CuPy on a GPU).

    import nnkit as nn
    x = nn.NetVar([1, 2])
    w = nn.NetVar([[3, 4, 5], [6, 7, 8]])
    y = nn.ReLU(nn.Multiply(x, w))
    y.back()            # fills w.g and x.g
"""
import sys as _sys
import types as _types

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
from .gradcheck import *  # noqa: F401,F403
from .trace import *  # noqa: F401,F403

__version__ = "0.1.0"


class _Module(_types.ModuleType):
    """Makes ``nnkit.dtype`` a live, settable view of the default dtype."""

    @property
    def dtype(self):
        return get_dtype()

    @dtype.setter
    def dtype(self, value):
        set_dtype(value)


_sys.modules[__name__].__class__ = _Module
