"""Recording: the first call of a captured step, run eagerly with every array operation written
down as an instruction that a replay repeats into the same arrays.

While a ``Recording`` is active the arrays a step computes with are ``Traced``: a NumPy array
subclass whose ufuncs (``__array_ufunc__``: the operators, ``xp.exp``, ``.sum()``, ...), NumPy
functions (``__array_function__``: ``xp.einsum``, ``xp.where``, ...) and the methods listed on
the class run on the plain arrays underneath, and are recorded:

- a result that is a new array becomes a *buffer*: the instruction writes into that very array
  at each replay (``out=`` where the function takes it, else a copy of what it returns), so a
  replay allocates nothing and every view of a buffer stays valid;
- a result that is a view of an argument needs no instruction (its memory is a buffer's);
- a call that returns None (``xp.add.at``, ``a[i] = v``, ``copyto``) is a write, replayed as is;
- a value read into Python (``bool``, ``float``, ``int``, ``.item()``, ``.tolist()``) is a
  *guard*: the replay reads it again and stops (the step is recorded again) when it differs.

What no instruction reaches is refused, never frozen: an array made by an operation this file
does not know (``__array_finalize__`` outside a recorded call) marks the recording unusable, and
the step then runs eagerly with a warning naming where.
"""
import operator
import os
import sys
import threading

import numpy

from .. import backend
from ..core import NetVar
from .instructions import _arrays, _check, _draw, _into, _restore, _root, _under

_ndarray = numpy.ndarray
active = None           # the Recording in progress (recording runs in one thread at a time)


class Unrecordable(Exception):
    """The step did something a replay could not repeat; the message says what and where."""


_NNKIT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OPS = os.path.join(_NNKIT, "ops")


def _site():
    """``file:line`` where a step read or wrote: the first frame in an op file or outside nnkit
    (a node's ``float()`` is reported where the step called it), NumPy's frames skipped."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if "numpy" not in name and (not name.startswith(_NNKIT) or name.startswith(_OPS)):
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def _method(name):
    """A method of ndarray that NumPy does not dispatch, recorded as a call of it."""
    function = getattr(_ndarray, name)

    def recorded(self, *args, **kwargs):
        return call(function, (self,) + args, kwargs)
    recorded.__name__ = name
    return recorded


def _read(convert):
    def read(self, *args):
        value = convert(plain(self), *args)
        if active is not None and not active.paused:
            active.guard(convert, (plain(self),) + args, value)
        return value
    return read


class Traced(_ndarray):
    """An array of a recording: its operations are written down (see the module docstring)."""

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return call(getattr(ufunc, method) if method != "__call__" else ufunc, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return call(func, args, kwargs)

    def __array_finalize__(self, obj):
        if active is not None and not active.inside and obj is not None:
            active.refuse(f"an array operation capture does not record ({_site()})")

    for _name in ("reshape", "transpose", "swapaxes", "squeeze", "ravel", "flatten", "astype",
                  "copy", "__getitem__", "__setitem__", "fill", "argmax", "argmin", "argsort",
                  "sort", "dot", "take", "repeat", "cumsum", "cumprod", "nonzero", "put",
                  "view", "__copy__", "__deepcopy__", "__reduce__", "__reduce_ex__",
                  "byteswap", "partition", "searchsorted", "diagonal", "conj", "round",
                  "mean", "var", "std"):      # (float16's end in a conversion NumPy makes)
        locals()[_name] = _method(_name)
    del _name
    T = property(lambda self: call(_ndarray.transpose, (self,), {}))
    __bool__ = _read(_ndarray.__bool__)
    __float__ = _read(_ndarray.__float__)
    __int__ = _read(_ndarray.__int__)
    __index__ = _read(_ndarray.__index__)
    __complex__ = _read(_ndarray.__complex__)
    item = _read(_ndarray.item)
    tolist = _read(_ndarray.tolist)
    tobytes = _read(_ndarray.tobytes)
    __format__ = _read(_ndarray.__format__)     # f"{loss:.3f}", str(), repr(): values too
    __str__ = _read(_ndarray.__str__)
    __repr__ = _read(_ndarray.__repr__)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    @property
    def flat(self):
        _unseen(".flat")
        return _ndarray.flat.__get__(self)


def _unseen(what):
    """A way into a step's arrays that no instruction records (what it reads or writes)."""
    if _ours():
        active.refuse(f"the step reads or writes its arrays through {what} ({_site()}), which "
                      "capture does not see; index them, or use .reshape(-1)")


def plain(value):
    """``value`` with every Traced array (also inside a tuple, list or dict) as its plain array."""
    kind = type(value)
    if kind is Traced:
        found = active.plains.get(id(value)) if active is not None else None
        return found if found is not None else _ndarray.view(value, _ndarray)
    if kind is tuple or kind is list:
        return kind(plain(item) for item in value)
    if kind is dict:
        return {key: plain(item) for key, item in value.items()}
    return value


def holds_traced(value):
    return any(True for _ in _arrays(value, Traced))


def call(function, args, kwargs):
    """Run ``function`` on the plain arrays; while recording, write it down (see above). An
    ``out=`` array is returned as it was given (``a += b`` keeps ``a`` a Traced array)."""
    given = kwargs.get("out")
    args, kwargs = plain(args), plain(kwargs)
    if active is None or active.paused:
        result = function(*args, **kwargs)
    else:
        result = active.record(function, args, kwargs)
    if given is not None:
        if type(given) is tuple:
            return given[0] if len(given) == 1 and type(result) is not tuple else given
        return given
    return result


def _wrapped(kind, result):
    return kind(result) if kind is tuple else result


class Recording:
    """One recording: the instructions, the buffers, the guards and what was refused."""

    def __init__(self):
        self.program = []       # (function, args, kwargs): the replay calls each in turn
        self.plains = {}        # id(Traced) -> its plain array (the buffer or view it is)
        self.traced = []        # the Traced arrays made (kept alive: their ids key plains)
        self.ours = set()       # ids of the roots of their plain arrays: the step's own memory
        self.scalars = set()    # ids of those that are NumPy scalars eagerly (x.sum(), x[0, 0])
        self.buffers = {}       # id(plain array) -> plain array: every array an instruction writes
        self.sources = {}       # id(root array) -> what its value follows: ("input", k), "state"
        self.keyed = set()      # inputs whose values a guard reads (lengths): the signature's
        self.kept = set()       # ids of the parameters' data (written by the optimizer's step)
        self.inputs = set()     # ids of the input buffers (never written)
        self.inputs_written = set()
        self.touched = None     # where the step first changed state a replay cannot take back
        self.inside = False     # in a recorded call: the arrays NumPy makes there are expected
        self.paused = False     # an optimizer's step runs live, its arrays plain
        self.thread = threading.get_ident()
        self.refusals = []
        self.errors = numpy.geterr()    # NumPy's floating-point error state as the step began
        self.watched = {}       # key -> (holder, name, value last seen): see note_changes
        self.changes = []       # (instructions recorded before it, key, new value, old value)

    def watch(self, key, holder, name):
        self.watched[key] = (holder, name, getattr(holder, name, None))

    def note_changes(self):
        """Note each watched attribute (a buffer, a counter, a node input's gradient) that holds
        another object than when last noted (a number: another value), and how many
        instructions came before: what a replay that raises midway hands out (Schedule)."""
        for key, (holder, name, seen) in self.watched.items():
            value = getattr(holder, name, None)
            if value is not seen and not (type(value) is int and value == seen):
                self.changes.append((len(self.program), key, value, seen))
                self.watched[key] = (holder, name, value)

    def refuse(self, why):
        if why not in self.refusals:
            self.refusals.append(why)

    def traced_view(self, array):
        """The Traced twin of the plain ``array`` (a buffer, a view of one, or a constant)."""
        self.inside = True
        try:
            twin = _ndarray.view(array, Traced)
        finally:
            self.inside = False
        self.plains[id(twin)] = array
        self.traced.append(twin)
        self.ours.add(id(_root(array)))
        return twin

    def add(self, function, args, kwargs, writes=(), sources=None):
        """Append an instruction; ``writes``: the arrays it writes (its results, its out=).
        An instruction that reads nothing that varies (``sources`` empty) may be left out of
        the replay (see ``Schedule``): its result is the same every time."""
        if sources is None:
            sources = self.sources_of((args, kwargs))
        if self.watched:
            self.note_changes()
        errors = numpy.geterr()
        if errors != self.errors and function not in (_check, _draw, _restore):
            # inside the step's own np.errstate: replayed under what it changes, over the
            # state a replay finds (as eager's errstate changes the caller's np.seterr)
            changes = {key: value for key, value in errors.items() if self.errors[key] != value}
            function, args, kwargs = _under, (changes, function, args, kwargs), {}
        self.program.append((function, args, kwargs, tuple(writes), sources))
        for array in writes:
            self.buffers[id(array)] = array
            if id(_root(array)) in self.inputs:
                self.inputs_written.add(id(_root(array)))
                self.refuse(f"the step writes into one of its inputs ({_site()}), which a "
                            "replay hands it as a copy")
            if self.touched is None and id(_root(array)) in self.kept:
                self.touched = f"an edit of a parameter's data ({_site()})"
            if sources:
                root = id(_root(array))
                self.sources[root] = self.sources.get(root, frozenset()) | sources
        return sources

    def vary(self, array, source):
        """Mark ``array`` (an input, a parameter's data) as changing from replay to replay."""
        self.sources[id(_root(array))] = frozenset((source,))

    def sources_of(self, value):
        found = frozenset()
        for array in _arrays(value):
            found |= self.sources.get(id(_root(array)), found)
        return found

    def record(self, function, args, kwargs):
        self.inside = True
        try:
            result = function(*args, **kwargs)
        except BaseException:
            # (a step that catches it goes on another way than a call where it does not raise)
            self.refuse(f"an array operation raised inside the step ({_site()}): a replay "
                        "could not tell the calls where it raises")
            raise
        finally:
            self.inside = False
        if "out" in kwargs and kwargs["out"] is not None:
            out = kwargs["out"]
            self._write(function, args, kwargs, out if type(out) is tuple else (out,))
            return _retrace(self, result)
        if type(result) is _ndarray and any(result is arg for arg in args[1:]):
            self._write(function, args, kwargs, (result,))     # out= given by position
            return _retrace(self, result)
        if isinstance(result, NetVar):      # x @ node: NumPy let the node's operator answer,
            return result                   # whose op recorded its own array operations
        if result is None:                  # a write into an argument: a[i] = v, add.at, ...
            self._write(function, args, kwargs, _written(function, args))
            return None
        if function in _SHAPES:             # the signature fixes every buffer's shape
            return result
        results = result if type(result) in (tuple, list) else (result,)      # split: a list
        if not all(isinstance(item, (_ndarray, numpy.generic)) for item in results):
            self.guard(function, args, result)      # a Python value (shape tuples are fine)
            return result
        if function in _UNDEFINED and type(result) is _ndarray:     # nothing to write again
            return self.traced_view(result)
        made = []
        fresh = []
        scalars = set()         # NumPy scalars eagerly: 0-d buffers here (handed out as scalars)
        for item in results:
            if isinstance(item, numpy.generic):
                item = numpy.array(item)
                scalars.add(id(item))
            elif type(item) is not _ndarray:
                item = _ndarray.view(item, _ndarray)
            if not _is_view_of(item, args, kwargs):
                fresh.append(item)
            made.append(item)
        if fresh:
            self._write_fresh(function, args, kwargs, made, fresh)
        twins = [self.traced_view(item) for item in made]
        self.scalars.update(id(twin) for twin, item in zip(twins, made) if id(item) in scalars)
        return type(result)(twins) if type(result) in (tuple, list) else twins[0]

    def _write(self, function, args, kwargs, writes):
        """Record a write into arrays that exist: the step's own (made in it, handed in), or
        refused: an array from outside it (a global's, an object's) would be written by the
        replay as by eager, but not put back by the check of a replay against eager."""
        for array in writes:
            if id(_root(array)) not in self.ours:
                self.refuse(f"the step writes into an array it did not make or get as an input "
                            f"({_site()}): keep it in a Module as a buffer, or pass it in")
        self.add(function, args, kwargs, writes)

    def _write_fresh(self, function, args, kwargs, made, fresh):
        # (ones_like and its kind read only their first argument's shape and dtype)
        sources = self.sources_of((args[1:], kwargs) if function in _LIKE else (args, kwargs))
        if len(made) == 1 and _takes_out(function, args, kwargs, made[0]):
            self.add(function, args, dict(kwargs, out=made[0]), made, sources)
        else:
            if sources and self.touched is not None and _shape_may_follow(function, args):
                # (x[mask]): a replay that meets another shape here could not take back what
                # came before, so it is refused, as a value read there is
                self.refuse(f"the step computes an array whose shape follows the data "
                            f"({_site()}) after {self.touched}; compute it before that, or "
                            "from what the step returns, after the call")
            self.add(_into, (tuple(made), function, args, kwargs), {}, fresh, sources)

    def guard(self, function, args, value):
        """A value read into Python: the replay reads it again and compares."""
        site = _site()
        sources = self.sources_of((args, value))
        if self.touched is not None and sources:
            # a replay that stops here could not take back what came before: refused (a value
            # of constants alone, the same at every call, is left out of the replay: read)
            self.refuse(f"the step reads a value into Python ({site}) after {self.touched}; "
                        "return the node (not .item()) and read it after the call")
        sources = self.add(_check, (function, args, value, site), {}, (), sources)
        if sources and all(type(source) is tuple for source in sources) \
                and function is not _ndarray.__bool__:
            # a number or index of the inputs alone (an RNN's lengths) shapes what the step
            # does: the inputs' values become part of the signature. A truth value (a check
            # that an argument is valid) stays a guard.
            self.keyed |= {k for _, k in sources}

    def create(self, array, undefined=False):
        """An array made without a traced argument (zeros, arange): a buffer whose creation
        the replay repeats only when something writes into it (see Schedule). An empty one's
        values are ``undefined``: no replay makes them again."""
        if undefined:
            return self.traced_view(array)
        zeros = array.dtype.kind in "biufc" and not _ndarray.view(
            numpy.ascontiguousarray(array), numpy.uint8).any()     # bits: -0.0 is not zeros
        self.add(_restore, (array, None if zeros else array.copy()), {}, (array,), frozenset())
        return self.traced_view(array)


def _is_view_of(result, args, kwargs):
    root = _root(result)        # (an empty array shares no memory, yet is a view)
    return any(_root(array) is root or numpy.may_share_memory(result, array)
               for array in _arrays((args, kwargs)))


def _written(function, args):
    return tuple(array for array in args[:1] if type(array) is _ndarray)


def _retrace(recording, result):
    if type(result) is tuple:
        return tuple(_retrace(recording, item) for item in result)
    if type(result) is _ndarray:
        return recording.traced_view(result)
    return result


_takes_out_cache = {}
_SHAPED = ("compress", "extract", "nonzero", "flatnonzero", "argwhere", "unique",
           "unique_values", "unique_counts", "unique_inverse", "unique_all", "bincount",
           "trim_zeros", "setdiff1d", "intersect1d", "union1d", "setxor1d",
           "histogram", "histogram_bin_edges")      # (shapes that follow the data)
_SHAPED_BY_AN_ARRAY = ("repeat", "delete")  # when their second argument is an array
_SHAPE_OF_ARGUMENTS = ("astype", "copy", "reshape", "transpose")    # (the signature fixes it)


def _shape_may_follow(function, args):
    """Whether the shape of what ``function(*args)`` returns follows the data: indexing with a
    boolean mask, ``np.where`` of a condition alone, the functions of ``_SHAPED``, and
    ``repeat`` and ``delete`` given an array of counts or positions."""
    if function in (operator.getitem, _ndarray.__getitem__):
        index = args[1] if type(args[1]) is tuple else (args[1],)
        return any(isinstance(item, _ndarray) and item.dtype == bool for item in index)
    name = getattr(function, "__name__", "")
    return name in _SHAPED or (name == "where" and len(args) == 1) or (
        name in _SHAPED_BY_AN_ARRAY and len(args) > 1 and isinstance(args[1], _ndarray))


def _takes_out(function, args, kwargs, result):
    """Whether ``function(..., out=result)`` writes the same bits: tried once per call site."""
    if isinstance(function, numpy.ufunc) or (
            hasattr(function, "__self__") and isinstance(function.__self__, numpy.ufunc)):
        return True
    if function in (operator.getitem, _ndarray.__getitem__) or getattr(
            function, "__name__", "") in _SHAPE_OF_ARGUMENTS + _SHAPED:
        return False            # (a shape that follows the data: _into checks it)
    try:
        again = numpy.empty_like(result)
        function(*args, **dict(kwargs, out=again))
    except (TypeError, ValueError):
        return False
    return again.tobytes() == result.tobytes()


# ----------------------------------------------------------------------------- NumPy's makers

_SHAPES = (numpy.shape, numpy.ndim, numpy.size)
_MAKERS = ("zeros", "ones", "empty", "full", "arange", "eye", "identity", "linspace", "tri")
_CONVERTERS = ("asarray", "ascontiguousarray", "asfortranarray", "array", "asanyarray")


def _ours():
    """Whether NumPy is called from the recording's own thread (others get plain arrays)."""
    return active is not None and not active.paused and active.thread == threading.get_ident()


def _maker(original):
    def make(*args, **kwargs):
        if not _ours():
            return original(*args, **kwargs)
        return active.create(original(*args, **kwargs), original is _EMPTY)
    return make


_EMPTY = numpy.empty
_UNDEFINED = (numpy.empty_like,)        # the values of what they return are undefined
_LIKE = (numpy.zeros_like, numpy.ones_like, numpy.full_like)


def _converter(original):
    def convert(value, *args, **kwargs):
        if not _ours() or not holds_traced(value):
            return original(value, *args, **kwargs)
        return call(original, (value,) + args, kwargs)
    return convert


class _Draws:
    """nnkit's generator while recording: each draw is an instruction that draws again from
    the generator ``backend.rng`` gives at the replay (the same stream as eager)."""

    def __init__(self, xp, original):
        self.xp, self.original = xp, original

    def __getattr__(self, name):
        def draw(*args, **kwargs):
            value = getattr(self.original(self.xp), name)(*args, **kwargs)
            if not _ours():
                return value
            if value is None:       # (shuffle: in place)
                active.refuse(f"the step calls {name} of nnkit's generator ({_site()}), which "
                              "changes an array in place, unseen: a replay would not; draw a "
                              "new array (permutation)")
                return value
            if not isinstance(value, _ndarray):
                active.refuse(f"the step draws a single number from nnkit's generator "
                              f"({name}, {_site()}), a Python number no replay draws again: "
                              "give size=1 for an array")
                return value
            value = plain(value)        # (NumPy made it with the recorded np.empty: Traced)
            active.add(_draw, (self.original, self.xp, name, args, kwargs, value), {}, (value,),
                       frozenset(("draw",)))
            return active.traced_view(value)
        return draw


class patched:
    """NumPy's makers and converters, and nnkit's generator, recorded while a recording is on."""

    def __init__(self, recording):
        self.recording = recording

    def __enter__(self):
        global active
        self.saved = [(numpy, name, getattr(numpy, name)) for name in _MAKERS + _CONVERTERS]
        nditer = numpy.nditer
        self.saved += [(numpy, "nditer", nditer), (backend, "rng", backend.rng)]
        for module, name, original in self.saved[:-2]:
            setattr(module, name, (_maker if name in _MAKERS else _converter)(original))

        def iterated(operands, *args, **kwargs):
            if holds_traced(operands):
                _unseen("np.nditer")
            return nditer(operands, *args, **kwargs)
        numpy.nditer = iterated
        rng = backend.rng
        backend.rng = lambda xp=numpy: _Draws(xp, rng)
        active = self.recording
        return self.recording

    def __exit__(self, *exc):
        global active
        active = None
        for module, name, original in self.saved:
            setattr(module, name, original)
