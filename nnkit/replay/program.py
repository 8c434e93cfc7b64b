"""From a recording to what a replay runs: the instructions that read something that varies,
each as ``(f, args)`` called ``f(*args)``, the fastest call NumPy offers for it."""
import functools
import operator

import numpy

from .record import _check, _into, _root

_ndarray = numpy.ndarray


def program(rec):
    """The instructions a replay runs: those that read something that varies, and the ones
    that rebuild an array that something else writes into (a zeros an add.at fills)."""
    writers = {}
    for function, args, kwargs, writes, sources in rec.program:
        for array in writes:
            writers[id(_root(array))] = writers.get(id(_root(array)), 0) + 1
    keyed = frozenset(("input", k) for k in rec.keyed)     # their values are the signature's
    kept = []
    for function, args, kwargs, writes, sources in rec.program:
        if function is _check and sources <= keyed:
            continue            # a check of the keyed inputs alone: the key already holds it
        if sources or any(writers[id(_root(array))] > 1 for array in writes):
            if function is _into and _fixed_gather(rec, args, keyed):
                (target,), _, (table, rows), _ = args    # a[rows], rows fixed: take's fast path
                function, args, kwargs = numpy.take, (table, rows), {
                    "axis": 0, "out": target, "mode": "clip"}     # (in range when recorded)
            kept.append(_call(function, args, kwargs))
    return kept


def _fixed_gather(rec, args, keyed):
    """Whether an ``_into`` instruction is ``a[rows]`` with ``rows`` integer rows that no replay
    changes (computed from constants and keyed inputs, an RNN's packing order): then
    ``numpy.take(..., mode="clip", out=)`` writes the same rows without the copy NumPy's
    buffered ``mode="raise"`` makes."""
    targets, function, call_args, call_kwargs = args
    if function not in (operator.getitem, _ndarray.__getitem__) or call_kwargs \
            or len(targets) != 1 or len(call_args) != 2:
        return False
    table, rows = call_args
    return (type(rows) is _ndarray and rows.dtype.kind in "iu" and type(table) is _ndarray
            and rec.sources_of(rows) <= keyed and targets[0].shape == rows.shape + table.shape[1:]
            and table.shape[0] > 0)


_NO_POSITIONAL_OUT = (numpy.maximum, numpy.minimum)     # NumPy 2 deprecates it for these two


def _call(function, args, kwargs):
    """``(f, args)`` that calls ``function(*args, **kwargs)`` as ``f(*args)``: a ufunc's out=
    goes last among its arguments (the fastest call), other keywords into a partial."""
    out = kwargs.get("out")
    if type(out) is tuple and len(out) == 1:
        out = out[0]
    if isinstance(function, numpy.ufunc) and list(kwargs) == ["out"] and \
            function not in _NO_POSITIONAL_OUT and \
            len(args) == function.nin and type(out) is _ndarray:
        return function, args + (out,)
    if kwargs:
        return functools.partial(function, **kwargs), args
    return function, args


def written(rec, array):
    """Whether some instruction of ``rec`` writes into ``array`` (a view of it included)."""
    return any(_root(target) is array for _, _, _, writes, _ in rec.program for target in writes)
