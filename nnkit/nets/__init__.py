"""Networks and training built from ops: FFN, sequence models, the Trainer, metrics."""
from . import ffn, hooks, metrics, sequence, trainer
from .ffn import *  # noqa: F401,F403
from .sequence import *  # noqa: F401,F403
from .metrics import *  # noqa: F401,F403
from .trainer import *  # noqa: F401,F403
from .hooks import *  # noqa: F401,F403

__all__ = [name for module in (ffn, sequence, metrics, trainer, hooks) for name in module.__all__]
