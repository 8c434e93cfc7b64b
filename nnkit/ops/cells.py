"""Deprecated: the recurrent cells moved into the recurrent family's package.

``RNNCell``, ``LSTMCell`` and ``GRUCell`` are in ``nnkit.ops.recurrent`` (module
``nnkit.ops.recurrent.cells``) and in ``nnkit``; this module re-exports them.
"""
import warnings

from .recurrent.cells import GRUCell, LSTMCell, RNNCell

__all__ = ['RNNCell', 'LSTMCell', 'GRUCell']

warnings.warn("nnkit.ops.cells is deprecated: import RNNCell, LSTMCell and GRUCell from "
              "nnkit.ops.recurrent (or nnkit)", DeprecationWarning, stacklevel=2)
