"""Optimizers (each updates parameters from their gradients in ``step()``), modifiers and
learning-rate schedules."""
from . import adam, base, gd, modifiers, schedules
from .base import *  # noqa: F401,F403
from .gd import *  # noqa: F401,F403
from .adam import *  # noqa: F401,F403
from .modifiers import *  # noqa: F401,F403
from .schedules import *  # noqa: F401,F403

__all__ = [name for module in (base, gd, adam, modifiers, schedules) for name in module.__all__]
