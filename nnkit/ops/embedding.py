"""Embedding lookup: rows of a table by integer index."""

__all__ = ['Embedding']
from .. import backend
from ..core import NetOp, NetVar
from .indexing import scatter_add


class Embedding(NetOp):
    """The rows of a (V, D) table picked by integer indices of any shape.

    y[i…] = table[indices[i…]]            (y has shape indices.shape + (D,))
    dtable = zeros, then dtable[indices[i…]] += g[i…]   (scatter-add: a token that appears k
             times gets the sum of its k gradients)
    indices: an integer array, list or NetVar (e.g. ``NetVar(tokens, dtype=int)``, which is
    a (1, n) row for 1-D tokens); every index must lie in [0, V).
    """

    def __init__(self, indices, table):
        td = table._data
        if td.ndim != 2:
            raise ValueError(f"Embedding: table must be (V, D), got shape {tuple(td.shape)}")
        xp = backend.array_module(td)
        idx = xp.asarray(indices._data if isinstance(indices, NetVar) else indices)
        if idx.dtype.kind not in "iu":
            raise TypeError(f"Embedding: indices must have an integer dtype, got {idx.dtype} "
                            "(e.g. NetVar(tokens, dtype=int))")
        V = td.shape[0]
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= V):
            bad = int(idx.min()) if int(idx.min()) < 0 else int(idx.max())
            raise ValueError(f"Embedding: index {bad} is out of range for a table of {V} rows "
                             f"(indices of shape {tuple(idx.shape)})")
        self.idx = idx
        super().__init__(td[idx], table)

    def _back(self, table):
        xp = backend.array_module(table._data)
        D = table._data.shape[1]
        dtable = xp.zeros_like(table._data)
        scatter_add(dtable, self.idx.reshape(-1), self._g.reshape(-1, D))
        table.accumulate(dtable)
