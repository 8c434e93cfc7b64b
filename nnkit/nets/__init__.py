"""Networks: the models built from ops and layers (FFN, SequenceModel).

Training (the Trainer, its hooks and metrics) lives in ``nnkit.training``; its old spellings
``nnkit.nets.trainer``, ``nnkit.nets.hooks``, ``nnkit.nets.metrics`` (and their names read
from ``nnkit.nets``) still work, with a DeprecationWarning naming the new module.
"""
import importlib
import sys
import types
import warnings

from . import ffn, sequence
from .ffn import *  # noqa: F401,F403
from .sequence import *  # noqa: F401,F403

__all__ = [name for module in (ffn, sequence) for name in module.__all__]

_MOVED = ("trainer", "hooks", "metrics")      # to nnkit.training, the same module names


class _MovedModule(types.ModuleType):
    """``nnkit.nets.<name>``, which moved to ``nnkit.training.<name>``: each name read from it
    warns and comes from there. A module object, not a file, so that version control follows
    the moved files."""

    def __getattr__(self, attribute):
        if attribute.startswith("__") and attribute != "__all__":
            raise AttributeError(attribute)     # the import system's questions (__path__)
        target = f"nnkit.training.{self.__name__.rpartition('.')[2]}"
        warnings.warn(f"{self.__name__} is deprecated: it moved to {target}",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(target), attribute)


for _name in _MOVED:                            # `import nnkit.nets.trainer` finds these
    sys.modules[f"{__name__}.{_name}"] = globals()[_name] = _MovedModule(f"{__name__}.{_name}")
del _name


def __getattr__(name):
    """A training name read from ``nnkit.nets`` (``nnkit.nets.Trainer``): deprecated."""
    training = importlib.import_module("nnkit.training")
    if name not in training.__all__:
        raise AttributeError(f"module 'nnkit.nets' has no attribute '{name}'")
    warnings.warn(f"nnkit.nets.{name} is deprecated: it moved to nnkit.training.{name} "
                  f"(nnkit.{name})", DeprecationWarning, stacklevel=2)
    return getattr(training, name)
