"""Layers: Modules that own the parameters of one op and call it (``nn.layers.Linear``, ...).

    import nnkit as nn
    model = nn.layers.Sequential(nn.layers.Linear(4, 8, seed=0), nn.ReLU,
                                 nn.layers.Linear(8, 2, seed=1))
    y = model(x)                  # x (B, 4) → y (B, 2)
    model.named_vars()            # {'layers.0.W': …, 'layers.0.b': …, 'layers.2.W': …, …}

Each layer is a ``Module``: its parameters are attributes (listed by ``vars``, saved by
``state()``, moved by ``to_gpu()``), and ``forward`` calls the op of its family (``Multiply``
and ``Add``, ``Conv2D``, ``BatchNorm``, ``LayerNorm``, ``Embedding``, ``RNN``/``LSTM``/``GRU``,
``Dropout``, ``Attention``) and returns the op's node: the math lives in the op alone. A layer
keeps no graph. ``MultiHeadAttention`` wraps the fused ``Attention`` op in its projections and
``TransformerEncoderLayer`` is built from layers; ``positional_encoding`` and ``mean_over_time``
are the functions that go with them.

Parameters get ``nnkit.dtype`` when the layer is built (``nn.set_dtype(numpy.float64)`` first
for a gradcheck). A 1-D parameter (a bias, γ, β) is a NetVar and so a (1, n) row, nnkit's row
convention; the ops broadcast it. Random initialisation draws from ``seed``: None uses nnkit's
global generator (``nnkit.seed``), an int a fresh generator, a ``numpy.random.Generator`` itself.
To initialise otherwise, assign a parameter: ``layer.W = nn.he(4, 8)``.

Input of another float dtype than the parameters never promotes the layer's computation
silently: data (NumPy arrays, a leaf NetVar, even one that needs a gradient) is cast to the
parameters' dtype (float64 data into a float32 model computes in float32, as its weights
are); a node computed by ops of another dtype is refused, naming both dtypes (one computed
under ``no_grad()`` records no ops: it is data, and cast).

Errors name the layer (``layers.Linear``), the argument and the shapes. A constructor checks
every argument before it draws a number, so a refused layer leaves nnkit's generator as it was;
``forward`` checks x against the layer's sizes before the op runs.

PyTorch equivalents, with PyTorch's weights written in nnkit's layout: ``Linear``: W =
weight.T, b = bias; ``Conv2D``: W = weight, b = bias; ``BatchNorm`` (``BatchNorm1d``/``2d``, the
same momentum convention): gamma = weight, beta = bias, ``stats.running_mean`` /
``running_var``; ``LayerNorm``: gamma = weight, beta = bias; ``Embedding``: table = weight;
``RNN``/``LSTM``/``GRU``: see the recurrent ops (W = weight_ih_l0.T, R = weight_hh_l0.T);
``MultiHeadAttention``: Wq, Wk, Wv = the row blocks of in_proj_weight, each transposed, bq, bk,
bv = in_proj_bias split in three, Wo = out_proj.weight.T, bo = out_proj.bias;
``TransformerEncoderLayer``: PyTorch's with ``norm_first=True`` and the tanh GELU, same names.
"""

from .attention import MultiHeadAttention, TransformerEncoderLayer, mean_over_time, positional_encoding
from .basic import BatchNorm, Conv2D, Dropout, Embedding, LayerNorm, Linear, Sequential
from .recurrent import GRU, LSTM, RNN

__all__ = ['Linear', 'Conv2D', 'BatchNorm', 'LayerNorm', 'Embedding', 'RNN', 'LSTM', 'GRU',
           'Dropout', 'MultiHeadAttention', 'TransformerEncoderLayer', 'positional_encoding',
           'mean_over_time', 'Sequential']
