"""What a replay's instructions call, and the two array helpers that recording and planning share.

A recording writes each operation down as a call of the function it ran, or of one of these when
that function cannot be called again as it was: ``_into`` (a function without ``out=``, its
results copied into the buffers), ``_under`` (an operation run inside the step's own
``np.errstate``), ``_check`` (a value read into Python, read again and compared), ``_restore``
(an array the step made and something writes into), ``_draw`` (a draw from nnkit's generator),
and ``_copy`` (what ``reshape`` or ``astype`` copied, written straight into its buffer). Those
that find the step taking another way raise ``GuardFailed``.
"""
import numpy

_ndarray = numpy.ndarray


class GuardFailed(Exception):
    """A replay read a value into Python that differs from the recording's (or a shape)."""


class ReplayStopped(RuntimeError):
    """A guard failed after the replay changed what lasts: the call stops (see Schedule)."""


def _root(array):
    """The array whose memory ``array`` views (itself when it owns it), also through the
    stand-in NumPy's ``as_strided`` keeps as a base (``sliding_window_view``)."""
    while True:
        base = array.base
        if isinstance(base, _ndarray):
            array = base
        elif isinstance(getattr(base, "base", None), _ndarray):    # (as_strided's DummyArray)
            array = base.base
        else:
            return array


def _paths(value, array_type=_ndarray, path=()):
    """``(path, array)`` for each array of type ``array_type`` in ``value`` and in its tuples,
    lists and dicts, ``path`` the positions and keys on the way to it."""
    kind = type(value)
    if kind is array_type:
        yield path, value
    elif kind is tuple or kind is list:
        for position, item in enumerate(value):
            yield from _paths(item, array_type, path + (position,))
    elif kind is dict:
        for key, item in value.items():
            yield from _paths(item, array_type, path + (key,))


def _arrays(value, array_type=_ndarray):
    """The arrays of type ``array_type`` in ``value`` and in its tuples, lists and dicts."""
    return (array for _, array in _paths(value, array_type))


def _into(targets, function, args, kwargs):
    """Replay a call whose function takes no ``out=``: copy what it returns into the buffers."""
    results = function(*args, **kwargs)
    if type(results) is not tuple:
        results = (results,)
    for target, value in zip(targets, results):
        if numpy.shape(value) != target.shape:      # a shape that follows the data
            raise GuardFailed(f"{getattr(function, '__name__', function)} returned shape "
                              f"{numpy.shape(value)}, not {target.shape}")
        numpy.copyto(target, value, casting="unsafe")


def _under(errors, function, args, kwargs):
    """Call ``function`` under the floating-point error state it was recorded under (a step's
    ``np.errstate(over="raise")`` raises at a replay too)."""
    with numpy.errstate(**errors):
        function(*args, **kwargs)


def _copy(target, source):
    numpy.copyto(target, source, casting="unsafe")


def _check(function, args, expected, site):
    value = function(*args)
    if value is not expected and (type(value) is not type(expected) or not _same(value, expected)):
        raise GuardFailed(f"a value read into Python at {site} changed")


def _same(a, b):
    """Whether two values are the same bit for bit: arrays and NumPy scalars of one shape, dtype
    and bytes (-0.0 is not 0.0), dicts, lists and tuples item by item, Python values equal (a
    NaN as a NaN). A guard's reading and the check of a replay against eager both ask it."""
    if isinstance(a, (_ndarray, numpy.generic)) or isinstance(b, (_ndarray, numpy.generic)):
        a, b = numpy.asarray(a), numpy.asarray(b)
        return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[key], b[key]) for key in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and exact(a) == exact(b)


def exact(value):
    """A key that two values share exactly when they are the same bits: a float by its hex
    digits (-0.0 is not 0.0, a NaN is a NaN), a NumPy scalar by its type and bytes, a tuple item
    by item, anything else by its type and itself. Signatures and guards compare these."""
    kind = type(value)
    if kind is float:
        return kind, value.hex()
    if kind is complex:
        return kind, value.real.hex(), value.imag.hex()
    if isinstance(value, numpy.generic):
        return kind, value.tobytes()
    if kind is tuple:
        return (kind,) + tuple(map(exact, value))
    return kind, value


def _restore(array, initial):
    if initial is None:         # zeros, which fill() writes without reading a copy
        array.fill(0)
    else:
        numpy.copyto(array, initial)


def _draw(rng, xp, name, args, kwargs, target):
    numpy.copyto(target, getattr(rng(xp), name)(*args, **kwargs))


def _live_step(step, optimizer, grads):
    for p, g, shared in grads:
        p._g, p._gshared = g, shared
    copies = _own_copies(optimizer, grads)
    step(optimizer)
    for g, copy in copies:
        numpy.copyto(g, copy)


def _own_copies(optimizer, grads):
    """Before ``optimizer`` steps on gradients a replay computes into again at every call: when
    it or one of its modifiers is a user's (nnkit's own keep nothing they are handed: tests/
    replay/test_kept_between_calls.py), each parameter's gradient made a copy of its own, as
    eager's arrays are, so that what it keeps is never overwritten. Returns ``(gradient,
    copy)`` pairs: what the step wrote into a copy is copied back where the program reads it."""
    if all(type(holder).__module__.startswith("nnkit.")
           for holder in [optimizer, *optimizer.modifiers]):
        return ()
    copies = []
    for p, g, _ in grads:
        if g is not None and getattr(p, "_gread", None) is not g:   # (zeros a read made)
            p._g, p._gshared = g.copy(), True
            copies.append((g, p._g))
    return copies


def live_step_of(function, args):
    """``(step, optimizer, grads)`` when the instruction ``function(*args)`` is an optimizer's
    live step (also run inside the step's own ``np.errstate``: ``_under``), else None."""
    if function is _live_step:
        return args
    if function is _under and args[1] is _live_step:
        return args[2]
    return None
