"""The recurrent cell kinds by name, ``CELLS``, and the loop of cells that unrolls a fused op.

``CELLS`` is the one table of the names 'rnn', 'lstm' and 'gru': code that takes a cell name
(weights, layers, sequence models) looks it up here.
"""
from typing import Callable, NamedTuple

import numpy

from ..indexing import Stack
from ..math import Where
from .cells import GRUCell, LSTMCell, RNNCell
from .fused import GRU, LSTM, RNN, _Recurrent


class Cell(NamedTuple):
    """One kind of recurrent cell: its fused op, its per-step cell, the number of gates
    (``W`` is (F, gates·H), ``R`` (H, gates·H)) and of states (1: h; 2: h and c)."""
    op: type
    cell: Callable
    gates: int
    states: int


CELLS = {
    'rnn': Cell(RNN, RNNCell, RNN.gates, RNN.states),
    'lstm': Cell(LSTM, LSTMCell, LSTM.gates, LSTM.states),
    'gru': Cell(GRU, GRUCell, GRU.gates, GRU.states),
}
"""The recurrent cell kinds by name: ``CELLS['lstm'].op`` is ``LSTM``, ``.cell`` ``LSTMCell``,
``.gates`` 4 (W is (F, 4H)), ``.states`` 2 (h and c)."""


def unrolled(op, x, W, R, b, h0, c0=None):
    """The fused ``op`` (RNN, LSTM or GRU) rebuilt from its inputs as a loop of its cells:
    (outputs (T, B, H), final h, final c (None but for the LSTM)), the op's values.

    The fused ops' second derivatives go through it (their ``_composite``). As in the fused op,
    a sequence past its length keeps its state and outputs zeros: the cells run on every row and
    a constant mask keeps the new state of the running rows only. Padded inputs are zeroed
    first, so garbage there (NaN included) reaches no gradient, as in the fused op.
    """
    T = x.shape[0]
    cell = next(entry for entry in CELLS.values() if isinstance(op, entry.op))
    lengths = op._sequence_lengths()
    if not op.dense:
        x = Where((numpy.arange(T)[:, None] < lengths)[:, :, None], x, 0.0)
    h, c = h0, c0
    outputs = []
    for t in range(T):
        if cell.states == 2:
            new_h, new_c = cell.cell(x[t], h, c, W, R, b)
        elif isinstance(op, RNN):
            new_h, new_c = cell.cell(x[t], h, W, R, b, op.activation), None
        else:
            new_h, new_c = cell.cell(x[t], h, W, R, b), None
        if op.dense:
            h, c = new_h, new_c
            outputs.append(h)
            continue
        running = (t < lengths)[:, None]
        h = Where(running, new_h, h)
        c = None if c is None else Where(running, new_c, c)
        outputs.append(Where(running, new_h, 0.0))
    return Stack(outputs), h, c


# The fused ops sit below their cells and Stack: the loop is attached here (as ops.surface
# attaches NetVar's methods), for their _composite.
_Recurrent._unrolled = unrolled
