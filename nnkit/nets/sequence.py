"""Sequence models: embedding -> fused recurrent op -> affine, in a few lines."""

__all__ = ['SequenceModel']
import numpy

from .. import backend, checks
from ..core import NetVar
from ..dtypes import get_dtype
from ..init import glorot_uniform, recurrent_weights
from ..layers.common import described
from ..module import Module
from ..ops.arithmetic import Add, Multiply
from ..ops.embedding import Embedding
from ..ops.recurrent import GRU, LSTM, RNN

_LAYERS = {'rnn': RNN, 'lstm': LSTM, 'gru': GRU}


class SequenceModel(Module):
    """(embedding) → recurrent layer → affine: a language model or a sequence classifier.

    ``SequenceModel(inputs, hidden, outputs, cell='lstm', per_step=True, embedding=None,
    activation='tanh', seed=None)``

    inputs: the feature size F of (T, B, F) data, or the vocabulary size V when ``embedding``
    (a dimension D) is given, in which case the model reads (T, B) token ids through a (V, D)
    table. cell: 'lstm' (forget-gate bias 1), 'gru' or 'rnn' (with ``activation``).
    per_step=True gives logits (T, B, outputs) at every step (a language model);
    per_step=False gives (B, outputs) from each sequence's final state (a classifier).
    ``model(x, lengths=None, state=None)``: ``state`` is the initial state, ``(h0,)`` (or h0
    alone) for 'rnn' and 'gru', ``(h0, c0)`` for 'lstm', each (B, H) or (1, H); another count
    or shape is refused naming the cell, what it expects and the shapes given. After the call
    ``model.final_state`` holds the final states as nodes (detach them to carry them into the
    next chunk: truncated BPTT). A Module: ``model.vars`` lists the parameters ([table,] W, R,
    b, Wo, bo), ``model.state()`` copies them out for saving.
    Initialisation is drawn from ``seed`` (None: nnkit's global generator).
    """

    def __init__(self, inputs, hidden, outputs, cell='lstm', per_step=True, embedding=None,
                 activation='tanh', seed=None):
        if cell not in _LAYERS:
            raise ValueError(f"SequenceModel: cell must be one of {sorted(_LAYERS)}, got {cell!r}")
        for name, size in (("inputs", inputs), ("hidden", hidden), ("outputs", outputs)):
            checks.count("SequenceModel", name, size, 1)
        if embedding is not None:
            checks.count("SequenceModel", "embedding", embedding, 1)
        checks.flag("SequenceModel", "per_step", per_step)
        if cell != 'rnn' and activation != 'tanh':
            raise ValueError(f"SequenceModel: activation is for cell='rnn'; an '{cell}' cell "
                             f"has its own nonlinearities, got activation={activation!r}")
        if activation not in RNN.activations:       # refused before any weight is drawn
            raise ValueError(f"SequenceModel: activation must be one of "
                             f"{list(RNN.activations)}, got {activation!r}")
        generator = backend.as_generator(seed, "SequenceModel")
        self.cell, self.per_step, self.activation = cell, per_step, activation
        self.table = None
        features = inputs
        if embedding is not None:
            self.table = NetVar(generator.standard_normal((inputs, embedding)).astype(get_dtype()))
            features = embedding
        self.W, self.R, self.b = recurrent_weights(cell, features, hidden, seed=generator)
        self.Wo = glorot_uniform(hidden, outputs, seed=generator)
        self.bo = NetVar(numpy.zeros((1, outputs), dtype=get_dtype()))
        self.recurrent = None
        self.output = None

    @property
    def final_state(self):
        """The final states of the last call, ``(h,)`` or ``(h, c)``: (B, H) nodes."""
        if self.recurrent is None:
            raise RuntimeError("SequenceModel.final_state: call the model on a batch first")
        if self.cell == 'lstm':
            return self.recurrent.final, self.recurrent.final_c
        return (self.recurrent.final,)

    def _inputs(self, x):
        data = x._data if isinstance(x, NetVar) else x
        if self.table is None:
            if len(numpy.shape(data)) != 3:
                raise ValueError(f"SequenceModel: features must be (T, B, F), time-major, got "
                                 f"shape {numpy.shape(data)}")
            if numpy.shape(data)[2] != self.W.shape[0]:
                raise ValueError(f"SequenceModel: features of shape {numpy.shape(data)} have "
                                 f"F = {numpy.shape(data)[2]}; this model takes F = "
                                 f"{self.W.shape[0]} (inputs={self.W.shape[0]})")
            return x
        if numpy.ndim(data) != 2:
            raise ValueError(f"SequenceModel: token ids must be (T, B), got shape "
                             f"{numpy.shape(data)}")
        return Embedding(data, self.table)

    def _state(self, state, x):
        """``state`` as the tuple of initial states of the cell, each checked against (B, H)."""
        if state is None:
            return ()
        names = "(h, c)" if self.cell == 'lstm' else "(h,) or h"
        B, H = numpy.shape(x._data if isinstance(x, NetVar) else x)[1], self.R.shape[0]
        expected = (f"SequenceModel(cell='{self.cell}'): state must be {names}, each of shape "
                    f"(B, H) = ({B}, {H}) or (1, {H})")
        if self.cell != 'lstm' and hasattr(state, "shape"):
            state = (state,)          # a bare h, as PyTorch's RNN and GRU take it
        if not isinstance(state, (tuple, list)) or not all(hasattr(s, "shape") for s in state):
            raise TypeError(f"{expected}; got {described(state)}")
        shapes = [tuple(s.shape) for s in state]
        if len(state) != (2 if self.cell == 'lstm' else 1) or any(
                s not in ((B, H), (1, H)) for s in shapes):
            raise ValueError(f"{expected}; got {len(state)} state(s) of shape(s) "
                             f"{', '.join(map(str, shapes)) or 'none'}")
        return tuple(state)

    def forward(self, x, lengths=None, state=None):
        """Logits (T, B, outputs) with ``per_step``, else (B, outputs)."""
        x = self._inputs(x)
        state = self._state(state, x)
        if self.cell == 'lstm':
            self.recurrent = LSTM(x, self.W, self.R, self.b, *state, lengths=lengths)
        elif self.cell == 'gru':
            self.recurrent = GRU(x, self.W, self.R, self.b, *state, lengths=lengths)
        else:
            self.recurrent = RNN(x, self.W, self.R, self.b, *state, lengths=lengths,
                                 activation=self.activation)
        hidden = self.recurrent if self.per_step else self.recurrent.final
        self.output = Add(Multiply(hidden, self.Wo), self.bo)
        return self.output
