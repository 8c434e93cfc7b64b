"""Embedding lookup: rows of a table by integer index."""

__all__ = ['Embedding']
import numpy

from .. import backend, checks
from ..core import NetOp, NetVar
from ..hints import AppliedOp
from .indexing import scatter_add


class Embedding(NetOp, metaclass=AppliedOp):
    """The rows of a (V, D) table picked by integer indices of any shape.

    y[i…] = table[indices[i…]]            (y has shape indices.shape + (D,))
    dtable = zeros, then dtable[indices[i…]] += g[i…]   (scatter-add: a token that appears k
             times gets the sum of its k gradients), then dtable[padding_idx] = 0
    indices: an integer array, list or NetVar (e.g. ``NetVar(tokens, dtype=int)``, which is
    a (1, n) row for 1-D tokens); every index must lie in [0, V). Host (NumPy) indices are
    checked before they move to the table's device; indices already on the GPU are not (that
    would read them back to the host at every call), so check them where they are made.
    padding_idx: None, or the row (an integer in [−V, V), negative counting from the end, as
    PyTorch's ``embedding``) whose lookups read the row as it is but never train it: its dtable
    row stays 0 (to every order of ``grad(create_graph=True)``). ``self.padding_idx`` holds it
    in [0, V).
    """
    module_call = "layer"     # nn.Embedding(16) names nn.layers.Embedding (hints.AppliedOp)
    __slots__ = ("padding_idx", "idx")
    kept_arrays = ("idx",)

    def __init__(self, indices, table, padding_idx=None):
        td = table._data
        if td.ndim != 2:
            raise ValueError(f"Embedding: table must be (V, D), got shape {tuple(td.shape)}")
        V = td.shape[0]
        self.padding_idx = None if padding_idx is None else padding_row(padding_idx, V)
        idx = indices._data if isinstance(indices, NetVar) else indices
        if not hasattr(idx, "__cuda_array_interface__"):
            idx = numpy.asarray(idx)
        if idx.dtype.kind not in "iu":
            raise TypeError(f"Embedding: indices must have an integer dtype, got {idx.dtype} "
                            "(e.g. NetVar(tokens, dtype=int))")
        if isinstance(idx, numpy.ndarray) and idx.size and (idx.min() < 0 or idx.max() >= V):
            bad = idx.min() if idx.min() < 0 else idx.max()
            raise ValueError(f"Embedding: index {bad} is out of range for a table of {V} rows "
                             f"(indices of shape {tuple(idx.shape)})")
        self.idx = idx = backend.array_module(td).asarray(idx)
        super().__init__(td[idx], table)

    def _back(self, table):
        xp = backend.array_module(table._data)
        D = table._data.shape[1]
        dtable = xp.zeros_like(table._data)
        add_rows(dtable, self.idx.reshape(-1), self._g.reshape(self.idx.size, D))
        if self.padding_idx is not None:
            dtable[self.padding_idx] = 0
        table.accumulate(dtable)

    def _grads(self, g, table):
        return (_RowsAdded(g, self.idx, table._data.shape, self.padding_idx),)


class _RowsAdded(NetOp):
    """An Embedding's table gradient as an op of its upstream gradient g, for
    ``grad(create_graph=True)``: the rows of g added into a zero (V, D) table at their indices,
    the padding row left 0. It is linear in g and its own gradient is the lookup again (0 where
    the index is the padding row), so the table's gradient is differentiable to any order.
    """
    __slots__ = ("idx", "padding_idx")
    kept_arrays = ("idx",)

    def __init__(self, g, idx, shape, padding_idx):
        self.idx, self.padding_idx = idx, padding_idx
        xp = backend.array_module(g._data)
        dtable = xp.zeros(shape, dtype=g._data.dtype)
        add_rows(dtable, idx.reshape(-1), g._data.reshape(idx.size, shape[1]))
        if padding_idx is not None:
            dtable[padding_idx] = 0
        super().__init__(dtable, g)

    def _back(self, g):
        picked = self._g[self.idx]
        if self.padding_idx is not None:
            picked = picked * (self.idx != self.padding_idx)[..., None]
        g.accumulate(picked)

    def _grads(self, up, g):
        picked = Embedding(self.idx, up)
        if self.padding_idx is not None:       # a padding row's g never reached the table
            picked = picked * (self.idx != self.padding_idx)[..., None].astype(up._data.dtype)
        return (picked,)


def add_rows(table, idx, rows):
    """``table[idx[i]] += rows[i]`` for every i, a row picked k times getting the sum of its k
    rows (in place; idx (n,) integers, rows (n, D)).

    On NumPy, a sorted segment sum: the rows ordered by index (a stable sort keeps each index's
    rows in their order) and each run of one index summed by one ``add.reduceat``, several
    times faster than ``numpy.add.at`` (which a character model's embedding spent 3% of its
    step in). Elsewhere (CuPy) the scatter-add.

    Every array here has a shape that depends on the shapes alone, not on which indices occur
    (``nn.capture`` replays it for any batch). There are at most min(n, V) runs: the run starts
    are padded to m = min(n, V) + 1 with n, which picks an appended zero row (at least one pad,
    so the last run ends at n as it would alone: a sum's rounding depends on its length), and
    the padding's zero sums go to rows of indices that do not occur (adding 0 leaves them as
    they are) or, when every row may occur (V <= n), to one row past the table.
    """
    if not isinstance(table, numpy.ndarray) or not idx.size:
        return scatter_add(table, idx, rows)
    n, V = idx.size, table.shape[0]
    m = min(n, V) + 1
    order = numpy.argsort(idx, kind="stable")
    ordered = idx[order]
    first = numpy.concatenate(([True], ordered[1:] != ordered[:-1]))    # where a run starts
    starts = numpy.sort(numpy.where(first, numpy.arange(n + 1)[:n], n))   # its runs, then n's
    starts = numpy.concatenate((starts, numpy.full(1, n, dtype=starts.dtype)))[:m]
    sums = numpy.add.reduceat(numpy.concatenate((rows[order], numpy.zeros_like(rows[:1]))),
                              starts, axis=0)
    occurs = numpy.zeros(V, dtype=bool)
    occurs[idx] = True
    rows_of = numpy.argsort(~occurs, kind="stable")     # the indices that occur, ascending
    if V > n:
        table[rows_of[:m]] += sums
    else:                   # one row past the table takes the padding
        scratch = numpy.zeros((V + 1,) + table.shape[1:], dtype=table.dtype)
        scratch[numpy.concatenate((rows_of, [V]))] += sums
        table += scratch[:V]
    return table


def padding_row(padding_idx, V, where="Embedding"):
    """padding_idx checked against a table of V rows and brought into [0, V); errors start with
    ``where`` (the op, or the layer that owns one)."""
    if not checks.is_integer(padding_idx):
        raise TypeError(f"{where}: padding_idx must be None or an integer in [{-V}, {V}) for a "
                        f"table of {V} rows, got {padding_idx!r}")
    if not -V <= padding_idx < V:
        raise ValueError(f"{where}: padding_idx {padding_idx} is out of range [{-V}, {V}) for "
                         f"a table of {V} rows")
    return int(padding_idx) % V
