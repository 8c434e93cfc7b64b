"""Training: the Trainer (an optional loop over the define-by-run graph), its hooks and the
metrics it accumulates. The models it trains live in ``nnkit.nets`` and ``nnkit.layers``."""
from . import hooks, metrics, trainer
from .hooks import *  # noqa: F401,F403
from .metrics import *  # noqa: F401,F403
from .trainer import *  # noqa: F401,F403

__all__ = [name for module in (metrics, trainer, hooks) for name in module.__all__]
