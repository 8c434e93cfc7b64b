"""The op catalogue, one module per family. Importing it gives NetVar its operators and methods
(``surface``: the one table of them).

Each family module lists its public names in ``__all__``; they are re-exported here and from
``nnkit``.
"""
from . import (activation, arithmetic, attention, classification, conv, einsum, embedding,
               indexing, loss, math, normalization, recurrent, reduce, regularization, shape,
               surface)
from .arithmetic import *  # noqa: F401,F403
from .reduce import *  # noqa: F401,F403
from .shape import *  # noqa: F401,F403
from .indexing import *  # noqa: F401,F403
from .math import *  # noqa: F401,F403
from .activation import *  # noqa: F401,F403
from .loss import *  # noqa: F401,F403
from .classification import *  # noqa: F401,F403
from .regularization import *  # noqa: F401,F403
from .normalization import *  # noqa: F401,F403
from .embedding import *  # noqa: F401,F403
from .conv import *  # noqa: F401,F403
from .recurrent import *  # noqa: F401,F403
from .einsum import *  # noqa: F401,F403
from .attention import *  # noqa: F401,F403

__all__ = [name for family in (arithmetic, reduce, shape, indexing, math, activation, loss,
                               classification, regularization, normalization, embedding, conv,
                               recurrent, einsum, attention)
           for name in family.__all__]


def __getattr__(name):
    """``nnkit.ops.cells``, the recurrent cells' old module, imported (with its warning) when
    reached for, as it was an attribute of this package before it moved."""
    if name == "cells":
        import importlib
        return importlib.import_module(f"{__name__}.cells")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
