"""The recurrent family: fused layers over whole (ragged) sequences, their per-step cells, and
the one table of cell kinds.

- ``fused``: ``RNN``, ``LSTM``, ``GRU``, one node each for a whole batch of sequences, with
  backpropagation through time in one ``_back``; ``RecurrentState`` (``op.final``,
  ``op.final_c``).
- ``cells``: ``RNNCell``, ``LSTMCell``, ``GRUCell``, one step built from ordinary ops.
- ``registry``: ``CELLS``, the cell kinds by name ('rnn', 'lstm', 'gru'), and the loop of cells
  that unrolls a fused op (its second derivatives).
- ``activations``: ``ACTIVATIONS``, the one table of the activations both use.
- ``validation``: the shape and ``lengths`` checks both share.
"""
from .cells import GRUCell, LSTMCell, RNNCell
from .fused import GRU, LSTM, RNN, FinalCellState, RecurrentState
from .registry import CELLS, Cell

__all__ = ['RNN', 'LSTM', 'GRU', 'RecurrentState', 'RNNCell', 'LSTMCell', 'GRUCell']
