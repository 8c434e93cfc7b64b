"""Optimizers (each updates parameters from their gradients in ``step()``), modifiers and
learning-rate schedules."""
from . import adagrad, adam, adamw, base, gd, modifiers, nesterov, rmsprop, schedules
from .base import *  # noqa: F401,F403
from .gd import *  # noqa: F401,F403
from .adam import *  # noqa: F401,F403
from .nesterov import *  # noqa: F401,F403
from .rmsprop import *  # noqa: F401,F403
from .adagrad import *  # noqa: F401,F403
from .adamw import *  # noqa: F401,F403
from .modifiers import *  # noqa: F401,F403
from .schedules import *  # noqa: F401,F403

__all__ = [name for module in (base, gd, adam, nesterov, rmsprop, adagrad, adamw,
                               modifiers, schedules) for name in module.__all__]
