"""Sequence models: embedding -> recurrent layer -> affine, made of ``nn.layers``."""

__all__ = ['SequenceModel']
import warnings

import numpy

from .. import backend, checks, layers
from ..core import NetVar
from ..layers import RNN, Embedding, Linear
from ..layers.common import described
from ..module import Module
from ..ops.recurrent import CELLS


class SequenceModel(Module):
    """(embedding) → recurrent layer → affine: a language model or a sequence classifier, made
    of layers: ``embedding`` (``nn.layers.Embedding``, or None), ``rnn`` (``nn.layers.RNN``,
    ``LSTM`` or ``GRU``) and ``head`` (``nn.layers.Linear``).

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
    next chunk: truncated BPTT). A Module: ``model.named_vars()`` lists the parameters
    ``[embedding.table,] rnn.W, rnn.R, rnn.b, head.W, head.b``, ``model.state()`` copies them
    out for saving.

    Initialisation is drawn from ``seed`` (None: nnkit's global generator), the layers in
    turn from one generator: the same numbers as before the model was made of layers, when it
    named its parameters ``table, W, R, b, Wo, bo`` (checkpoints and states with those names
    still load; ``model.W`` etc. still read and assign, with a DeprecationWarning naming the new
    place).
    """
    last_call = ("recurrent", "output")     # final_state reads them (Module.last_call)
    renamed = {"table": "embedding.table", "W": "rnn.W", "R": "rnn.R", "b": "rnn.b",
               "Wo": "head.W", "bo": "head.b"}

    def __init__(self, inputs, hidden, outputs, cell='lstm', per_step=True, embedding=None,
                 activation='tanh', seed=None):
        if cell not in CELLS:
            raise ValueError(f"SequenceModel: cell must be one of {sorted(CELLS)}, got {cell!r}")
        for name, size in (("inputs", inputs), ("hidden", hidden), ("outputs", outputs)):
            checks.count("SequenceModel", name, size, 1)
        if embedding is not None:
            checks.count("SequenceModel", "embedding", embedding, 1)
        checks.flag("SequenceModel", "per_step", per_step)
        if cell != 'rnn' and activation != 'tanh':
            raise ValueError(f"SequenceModel: activation is for cell='rnn'; an '{cell}' cell "
                             f"has its own nonlinearities, got activation={activation!r}")
        if activation not in RNN.op.activations:       # refused before any weight is drawn
            raise ValueError(f"SequenceModel: activation must be one of "
                             f"{list(RNN.op.activations)}, got {activation!r}")
        generator = backend.as_generator(seed, "SequenceModel")
        self.cell, self.per_step, self.activation = cell, per_step, activation
        self.embedding = None if embedding is None else Embedding(inputs, embedding,
                                                                  seed=generator)
        features = inputs if embedding is None else embedding
        if cell == 'rnn':
            self.rnn = RNN(features, hidden, activation, seed=generator)
        else:
            # the layer of a cell's op has the op's name (nn.LSTM the op, nn.layers.LSTM the layer)
            self.rnn = getattr(layers, CELLS[cell].op.__name__)(features, hidden, seed=generator)
        self.head = Linear(hidden, outputs, seed=generator)
        self.recurrent = None       # the recurrent layer's output of the last call
        self.output = None

    @property
    def final_state(self):
        """The final states of the last call, ``(h,)`` or ``(h, c)``: (B, H) nodes."""
        if self.recurrent is None:
            raise RuntimeError("SequenceModel.final_state: call the model on a batch first")
        if CELLS[self.cell].states == 2:
            return self.recurrent.final, self.recurrent.final_c
        return (self.recurrent.final,)

    def _inputs(self, x):
        data = x._data if isinstance(x, NetVar) else x
        if self.embedding is None:
            F = self.rnn.inputs
            if len(numpy.shape(data)) != 3:
                raise ValueError(f"SequenceModel: features must be (T, B, F), time-major, got "
                                 f"shape {numpy.shape(data)}")
            if numpy.shape(data)[2] != F:
                raise ValueError(f"SequenceModel: features of shape {numpy.shape(data)} have "
                                 f"F = {numpy.shape(data)[2]}; this model takes F = {F} "
                                 f"(inputs={F})")
            return x
        if numpy.ndim(data) != 2:
            raise ValueError(f"SequenceModel: token ids must be (T, B), got shape "
                             f"{numpy.shape(data)}")
        return self.embedding(data)

    def _state(self, state, x):
        """``state`` as the tuple of initial states of the cell, each checked against (B, H)."""
        if state is None:
            return ()
        count = CELLS[self.cell].states
        names = "(h, c)" if count == 2 else "(h,) or h"
        B, H = numpy.shape(x._data if isinstance(x, NetVar) else x)[1], self.rnn.hidden
        expected = (f"SequenceModel(cell='{self.cell}'): state must be {names}, each of shape "
                    f"(B, H) = ({B}, {H}) or (1, {H})")
        if count == 1 and hasattr(state, "shape"):
            state = (state,)          # a bare h, as PyTorch's RNN and GRU take it
        if not isinstance(state, (tuple, list)) or not all(hasattr(s, "shape") for s in state):
            raise TypeError(f"{expected}; got {described(state)}")
        shapes = [tuple(s.shape) for s in state]
        if len(state) != count or any(
                s not in ((B, H), (1, H)) for s in shapes):
            raise ValueError(f"{expected}; got {len(state)} state(s) of shape(s) "
                             f"{', '.join(map(str, shapes)) or 'none'}")
        return tuple(state)

    def forward(self, x, lengths=None, state=None):
        """Logits (T, B, outputs) with ``per_step``, else (B, outputs)."""
        x = self._inputs(x)
        state = self._state(state, x)
        self.recurrent = self.rnn(x, lengths=lengths, state=state or None)
        self.output = self.head(self.recurrent if self.per_step else self.recurrent.final)
        return self.output


def _former(old):
    """A deprecated read and assignment of the parameter the model called ``old`` before it
    was made of layers."""
    new = SequenceModel.renamed[old]
    layer, _, name = new.partition(".")

    def warn():
        warnings.warn(f"SequenceModel.{old} is deprecated: the parameter is now "
                      f"model.{new}", DeprecationWarning, stacklevel=3)

    def read(self):
        warn()
        return None if getattr(self, layer) is None else getattr(getattr(self, layer), name)

    def write(self, value):
        warn()
        if getattr(self, layer) is None:
            raise AttributeError(f"SequenceModel.{old}: this model has no {layer} (it was "
                                 f"built without {layer}=), so no model.{new} to assign")
        setattr(getattr(self, layer), name, value)
    return property(read, write, doc=f"Deprecated: ``model.{new}``.")


for _old in SequenceModel.renamed:
    setattr(SequenceModel, _old, _former(_old))
del _old


def __getattr__(name):
    """``nnkit.nets.sequence.recurrent_weights``, its home before ``nnkit.init``: deprecated."""
    if name != "recurrent_weights":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from ..init import recurrent_weights
    warnings.warn("nnkit.nets.sequence.recurrent_weights is deprecated: use "
                  "nnkit.init.recurrent_weights (nn.recurrent_weights)", DeprecationWarning,
                  stacklevel=2)
    return recurrent_weights
