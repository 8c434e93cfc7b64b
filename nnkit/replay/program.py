"""From a recording to what a replay runs: the instructions that read something that varies,
each as ``(f, args)`` called ``f(*args)``, the fastest call NumPy offers for it, and their
buffers sharing memory where one's life ends before another's begins."""
import functools
import heapq
import operator
import types

import numpy

from .instructions import _arrays, _copy, _draw, _into, _paths, _restore, _root

_ndarray = numpy.ndarray


def program(rec, pinned=(), trusted=()):
    """The instructions a replay runs: those that read something that varies (beyond the
    inputs whose values are the signature's), and the ones that rebuild an array that something
    else writes into (a zeros an add.at fills). ``pinned``: arrays read or written outside the
    program (inputs, gradients handed out, outputs), whose memory stays their own;
    ``trusted``: functions whose arguments may hold objects (an optimizer) that hide no
    buffer. Returns the instructions and, for each, the ids of the buffers it writes (their
    roots, as recorded: the pinned ones are still theirs after the sharing) and its position
    in the recording."""
    writers = {}
    for function, args, kwargs, writes, sources in rec.program:
        for array in writes:
            writers[id(_root(array))] = writers.get(id(_root(array)), 0) + 1
    keyed = frozenset(("input", k) for k in rec.keyed)     # their values are the signature's
    kept, origins = [], []
    for origin, (function, args, kwargs, writes, sources) in enumerate(rec.program):
        # what reads the keyed inputs alone (an RNN's packing order, a check of its lengths)
        # gives what it gave when recorded: the signature holds those inputs' values
        if sources - keyed or any(writers[id(_root(array))] > 1 for array in writes):
            if function is _into and _fixed_gather(rec, args, keyed):
                (target,), _, (table, rows), _ = args    # a[rows], rows fixed: take's fast path
                function, args, kwargs = numpy.take, (table, rows), {
                    "axis": 0, "out": target, "mode": "clip"}     # (in range when recorded)
            elif function is _into and _a_copy(args):
                (target,), how, (source, *_), _ = args     # reshape or astype: one copy
                if how is not _ndarray.astype:
                    target = target.reshape(source.shape)
                function, args, writes = _copy, (target, source), (target,)
            kept.append((function, args, kwargs, writes))
            origins.append(origin)
    writes = [frozenset(id(_root(array)) for array in written) for *_, written in kept]
    return [_call(function, args, kwargs) for function, args, kwargs in
            _shared(kept, pinned, trusted)], writes, origins


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


def _a_copy(args):
    """Whether an ``_into`` instruction is a copy into its buffer: ``astype`` to the buffer's
    shape, or a ``reshape`` in C order into a C-ordered buffer (of an array not laid out for a
    view). Then ``_copy`` writes the buffer directly, without the array the call makes."""
    targets, how, call_args, call_kwargs = args
    if len(targets) != 1 or not call_args or type(call_args[0]) is not _ndarray:
        return False
    target, source = targets[0], call_args[0]
    if how is _ndarray.astype:
        return target.shape == source.shape and set(call_kwargs) <= {"copy", "order"}
    return how in (_ndarray.reshape, numpy.reshape) and target.flags.c_contiguous and \
        target.size == source.size and call_kwargs.get("order", "C") == "C" and \
        set(call_kwargs) <= {"order", "shape", "newshape"}


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


# ------------------------------------------------------------------------ memory shared

_WHOLE = (_into, _restore, _draw, _copy)       # write every element of what they write
_PLAIN = (int, float, complex, bool, str, bytes, slice, type(None), type(Ellipsis), type,
          numpy.dtype, numpy.generic, numpy.ufunc, type(numpy.concatenate), types.FunctionType,
          types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType,
          types.ModuleType)


def _shared(instructions, pinned, trusted):
    """``instructions`` with the buffers whose lives do not overlap in the same memory, as
    hand-written NumPy reuses its temporaries (a replay's working set then stays in cache).

    A buffer's life runs from the instruction that first touches it to the last; it may move
    into another's memory only when that first touch writes all of it without reading it (out=,
    a copy, a fill), so nothing it held before is ever read. Buffers the schedule touches
    outside the program (``pinned``), and any buffer at all when an argument is an object that
    could hide one, keep their memory. Returns ``(function, args, kwargs)`` triples."""
    pinned = {id(_root(array)) for array in _arrays(pinned)}
    first, last, roots, fresh, views = {}, {}, {}, set(), {}
    for i, (function, args, kwargs, writes) in enumerate(instructions):
        if function not in trusted and not _transparent((function, args, kwargs)):
            return [instruction[:3] for instruction in instructions]
        reads = {id(_root(array)) for array in _reads(function, args, kwargs)}
        whole = function in _WHOLE or ("out" in kwargs and kwargs.get("where", True) is True)
        for array in _arrays((args, kwargs)):
            root = _root(array)
            key = id(root)
            views.setdefault(key, {})[id(array)] = array
            if function in trusted:
                pinned.add(key)
            last[key] = i
            if key not in first:
                first[key], roots[key] = i, root
                if whole and key not in reads and any(
                        w is array and w.nbytes == root.nbytes and _contiguous(w)
                        for w in writes):
                    fresh.add(key)
    movable = [key for key in fresh if key not in pinned and roots[key].flags.c_contiguous
               and roots[key].nbytes > 0 and not roots[key].dtype.hasobject]    # (references)
    homes = _homes(sorted(movable, key=first.get), first, last, roots)
    moved = {}
    for key, memory in homes.items():
        start = _address(roots[key])
        for array in views[key].values():
            moved[id(array)] = _same_view(array, memory, _address(array) - start)
    return [(function, _moved(args, moved), _moved(kwargs, moved))
            for function, args, kwargs, _ in instructions]


def _homes(order, first, last, roots):
    """The memory each buffer of ``order`` (sorted by first touch) moves into: a buffer whose
    life has ended, the smallest that holds it (a buffer finding none keeps its own)."""
    living, free, homes = [], [], {}
    for key in order:
        while living and living[0][0] < first[key]:
            free.append(heapq.heappop(living)[2])
        size = roots[key].nbytes
        fits = [k for k, memory in enumerate(free) if memory.nbytes >= size]
        if fits:
            memory = homes[key] = free.pop(min(fits, key=lambda k: free[k].nbytes))
        else:
            memory = roots[key].reshape(-1).view(numpy.uint8)
        heapq.heappush(living, (last[key], key, memory))
    return homes


def _reads(function, args, kwargs):
    """The arrays an instruction reads (those it only writes left out)."""
    if function is _into:
        return _arrays(args[2:])
    if function is _restore or function is _copy:
        return _arrays(args[1])
    if function is _draw:
        return _arrays(args[3:5])
    if "out" in kwargs:
        return _arrays((args, {k: v for k, v in kwargs.items() if k != "out"}))
    return _arrays((args, kwargs))      # a write into an argument (a[i] = v) reads it too


def _transparent(value):
    """Whether every array ``value`` reaches is in plain sight (tuples, lists, dicts)."""
    kind = type(value)
    if kind is tuple or kind is list:
        return all(map(_transparent, value))
    if kind is dict:
        return all(map(_transparent, value.values()))
    return kind is _ndarray or isinstance(value, _PLAIN) or (
        kind is types.BuiltinMethodType and isinstance(value.__self__, numpy.ufunc))


def _moved(value, moved):
    kind = type(value)
    if kind is _ndarray:
        return moved.get(id(value), value)
    if kind is tuple or kind is list:
        return kind([_moved(item, moved) for item in value])
    if kind is dict:
        return {key: _moved(item, moved) for key, item in value.items()}
    return value


def _contiguous(array):
    return array.flags.c_contiguous or array.flags.f_contiguous


def _address(array):
    return array.__array_interface__["data"][0]


def readers(instructions, buffers):
    """Where a program's ``instructions`` read the input ``buffers`` (None for an input that
    has none) or views of them: ``[(index, function, args, views)]``, ``views`` the arrays of
    those ``args`` that are an input's, as ``(k, view, offset, path)`` (``path``: where in
    ``args`` the view sits). Inputs read through a keyword bound into a partial are left out (a
    copy of them is handed in)."""
    roots = {id(buffer): k for k, buffer in enumerate(buffers) if buffer is not None}
    for function, _ in instructions:
        if isinstance(function, functools.partial):
            for array in _arrays(function.keywords):
                roots.pop(id(_root(array)), None)
    found = []
    for index, (function, args) in enumerate(instructions):
        views = [(roots[id(_root(view))], view, _address(view) - _address(_root(view)), path)
                 for path, view in _paths(args) if id(_root(view)) in roots]
        if views:
            found.append((index, function, args, views))
    return found


def read_from(instructions, found, arrays, changed):
    """Point the instructions ``found`` (``readers``) that read the inputs ``changed`` at the
    same views of ``arrays`` (by input: its buffer, or an array of its shape, dtype and
    layout), rebuilding only the tuples on the way to each view."""
    for index, function, args, views in found:
        if any(k in changed for k, _, _, _ in views):
            for k, view, offset, path in views:
                args = _replaced(args, path, _same_view(view, arrays[k], offset))
            instructions[index] = function, args


def _replaced(value, path, new):
    """``value`` with ``new`` at ``path`` (copies of the containers on the way)."""
    if not path:
        return new
    head = path[0]
    items = dict(value) if type(value) is dict else list(value)
    items[head] = _replaced(value[head], path[1:], new)
    return tuple(items) if type(value) is tuple else items


def rehome(instructions, pinned, array, home):
    """``instructions`` with each view of ``array``'s bytes made the same view of ``home`` (a
    C-ordered array of its shape and dtype), or None where an array of some instruction, of a
    partial's keywords or of ``pinned`` holds only part of those bytes or more."""
    root, start = _root(array), _address(array)
    end = start + array.nbytes

    def inside(view):           # True: within array's bytes, False: apart, None: across
        low, high = _bounds(view)
        return True if start <= low and high <= end else \
            False if high <= start or end <= low else None

    for function, _ in instructions:
        if isinstance(function, functools.partial) and any(
                _root(view) is root and inside(view) is not False
                for view in _arrays(function.keywords)):
            return None
    if any(_root(view) is root and inside(view) is not False for view in _arrays(pinned)):
        return None
    rehomed = []
    for function, args in instructions:
        for path, view in list(_paths(args)):
            if _root(view) is root:
                where = inside(view)
                if where is None:
                    return None
                if where:
                    args = _replaced(args, path, _same_view(view, home,
                                                            _address(view) - start))
        rehomed.append((function, args))
    return rehomed


def _bounds(view):
    """The addresses of ``view``'s first byte and of the byte after its last."""
    low = high = _address(view)
    for n, stride in zip(view.shape, view.strides):
        if n == 0:
            return low, low
        low, high = low + min(0, (n - 1) * stride), high + max(0, (n - 1) * stride)
    return low, high + view.itemsize


def _same_view(view, array, offset):
    """The view of ``array`` that ``view`` is of its input's buffer: the array itself when the
    view is the whole buffer (most inputs), else the same offset, shape and strides."""
    if offset == 0 and view.shape == array.shape and view.strides == array.strides and \
            view.dtype == array.dtype:
        return array
    return numpy.ndarray(view.shape, view.dtype, array, offset, view.strides)


def written(rec, array):
    """Whether some instruction of ``rec`` writes into ``array`` (a view of it included)."""
    return any(_root(target) is array for _, _, _, writes, _ in rec.program for target in writes)
