"""``capture`` and ``Captured``: which recording a call replays, or whether it records, checks
against eager or runs eagerly (the package's docstring tells the whole story)."""
import inspect
import threading
import types
import warnings

import numpy

from .. import backend, core
from ..core import NetVar
from ..dtypes import get_dtype
from ..modes import state as modes, threads_without_grad
from . import record as recording
from .instructions import GuardFailed, ReplayStopped, _same, exact
from .record import Unrecordable
from .first_call import BOUND, record
from .inputs import NotRecorded

__all__ = ["capture", "Captured"]


def capture(fn=None, *, check=False, max_signatures=16):
    """Capture the step ``fn``: ``nn.capture(fn)`` or ``@nn.capture`` (docs/capture.md).

    ``check=True`` runs every call twice, eagerly and replayed, from the same state, and raises
    at the first difference (for finding what a step does that capture cannot see).
    ``max_signatures``: how many signatures are kept recorded; a new one beyond it warns and
    forgets the oldest.
    """
    if fn is None:
        return lambda f: Captured(f, check, max_signatures)
    return Captured(fn, check, max_signatures)


class Captured:
    """A captured step: call it as the step itself."""

    def __init__(self, fn, check=False, max_signatures=16):
        if not callable(fn):
            raise TypeError(f"capture: fn must be callable, got {type(fn).__name__}")
        if not (isinstance(max_signatures, int) and not isinstance(max_signatures, bool)
                and max_signatures >= 1):
            raise ValueError(f"capture: max_signatures must be an int >= 1, got {max_signatures!r}")
        self.fn, self.check, self.max_signatures = fn, bool(check), max_signatures
        # a generator or coroutine function runs its body later, on what it was given: the
        # arrays it reads then are the caller's, never copies a recording would hand it
        body = fn.__func__ if isinstance(fn, staticmethod) else fn
        self.deferred = inspect.isgeneratorfunction(body) or inspect.iscoroutinefunction(body) \
            or inspect.isasyncgenfunction(body)
        self.schedules = {}         # signature -> Schedule, or the reason it runs eagerly
        self.others = {}            # signature -> the Schedule it had before (see _call)
        self.keyed = {}             # signature -> the inputs whose values the step reads
        self.warned_inputs = self.warned_keywords = False
        self.records = self.replays = 0
        self.__wrapped__ = fn
        self._busy = threading.Lock()   # the buffers are one: one call at a time replays

    of_object = False       # captures a method of one object (``__get__``)
    _static = None          # above @staticmethod: the capture of its function (``__get__``)

    def __reduce__(self):
        """A copy (``copy``, ``deepcopy``, pickle) captures the same step anew: the recordings
        hold this capture's buffers, and are not copied. A copy of an object keeps nothing of
        the capture of its method (which names the object): the copy captures its own."""
        if self.of_object:
            return _forgotten, ()
        return Captured, (self.fn, self.check, self.max_signatures)

    def __get__(self, obj, objtype=None):
        """``@nn.capture`` above a method: each object captures its own bound method, once,
        and keeps it in its ``__dict__`` under a name of the function's (not the method's: an
        override calling ``super()`` keeps its own). Copies and pickles of the object capture
        it anew."""
        if obj is None:
            return self
        if isinstance(self.fn, staticmethod):       # (above @staticmethod: nothing to bind)
            if self._static is None:
                self._static = Captured(self.fn.__func__, self.check, self.max_signatures)
            return self._static
        # (this capture's own name: a subclass of the same name keeps its own)
        key = f"{BOUND}{getattr(self.fn, '__qualname__', '')}_{id(self):x}"
        try:
            held = vars(obj)
        except TypeError:           # (an object without __dict__: __slots__)
            raise TypeError(f"capture: {_name(self.fn)} is captured as a method of an object "
                            f"without __dict__ ({type(obj).__name__}); capture the bound method "
                            "instead: self.step = nn.capture(self.step)") from None
        bound = held.get(key)
        if bound is None or bound.fn.__self__ is not obj:     # (a shallow copy's: the original's)
            bound = Captured(types.MethodType(self.fn, obj), self.check, self.max_signatures)
            bound.of_object = True
            if isinstance(held, dict):
                held[key] = bound
            else:                   # (a class's mappingproxy: a classmethod's class)
                setattr(obj, key, bound)
        return bound

    def __repr__(self):
        return (f"capture({getattr(self.fn, '__qualname__', self.fn)!r}: {len(self.schedules)} "
                f"signatures, {self.records} recorded, {self.replays} replayed)")

    def __call__(self, *inputs, **keywords):
        if keywords:            # inputs by position only: the signature is theirs (warned once)
            if not self.warned_keywords:
                self.warned_keywords = True
                warnings.warn(f"capture: {_name(self.fn)} runs eagerly when given keyword "
                              f"arguments ({', '.join(keywords)}): pass its inputs by position",
                              stacklevel=2)
            return self.fn(*inputs, **keywords)
        if self.deferred:
            if not self.warned_inputs:
                self.warned_inputs = True
                warnings.warn(f"capture: {_name(self.fn)} runs eagerly: it is a generator (or "
                              "coroutine) function, whose body runs as it is iterated, after "
                              "the call", stacklevel=2)
            return self.fn(*inputs)
        if core.observers or recording.active is not None:
            return self.fn(*inputs)         # an observer sees every op: eager (docs/capture.md)
        if not self._busy.acquire(blocking=False):
            return self.fn(*inputs)         # another thread replays or records: eager
        try:
            return self._call(inputs)
        finally:
            self._busy.release()

    def _call(self, inputs):
        key = signature(inputs)
        if key is None:             # an input capture cannot compare: eager (warned once)
            if not self.warned_inputs:
                self.warned_inputs = True
                warnings.warn(f"capture: {_name(self.fn)} runs eagerly: its inputs must be "
                              "arrays, nodes, numbers or strings (NumPy's own arrays, not a "
                              "subclass such as a masked array, whose copy would lose its "
                              "mask; a list or dict could change behind a replay's back)",
                              stacklevel=3)
            return self.fn(*inputs)
        plain_key, keyed = key, self.keyed.get(key, ())
        if keyed:
            key = key + (_contents(inputs, keyed),)
        schedule = self.schedules.get(key)
        if isinstance(schedule, str):       # this signature runs eagerly (warned once)
            return self.fn(*inputs)
        if schedule is not None:
            why = schedule.stale()
            if why is None:
                try:
                    return self._replay(schedule, inputs, key)
                except GuardFailed as failure:
                    why = str(failure)
            other = self.others.get(key)
            if other is not None and other.stale() is None:
                # the recording before may fit: a step whose state takes turns (gradients
                # accumulated over calls, which an optimizer's step outside resets; a branch)
                self.others[key], self.schedules[key] = schedule, other
                try:
                    return self._replay(other, inputs, key)
                except GuardFailed:         # (neither: recorded again, beside the last one)
                    self.others[key], self.schedules[key] = other, schedule
            schedule.records_in_a_row += 1
            if schedule.records_in_a_row == 4:
                warnings.warn(f"capture: {_name(self.fn)} recorded again {schedule.records_in_a_row} "
                              f"calls in a row ({why}): replays gain nothing", stacklevel=3)
        elif len(self.schedules) >= self.max_signatures:
            warnings.warn(f"capture: {_name(self.fn)} met more than {self.max_signatures} "
                          "signatures (input shapes, dtypes, modes); the oldest is forgotten: "
                          "pad to fewer shapes (docs/capture.md, 'Buckets')", stacklevel=3)
            oldest = next(iter(self.schedules))
            del self.schedules[oldest]
            self.others.pop(oldest, None)
        self.records += 1
        try:
            new, result = record(self.fn, inputs)
        except (NotRecorded, Unrecordable) as refusal:
            if isinstance(refusal, NotRecorded) and not refusal.lasting:
                self.records -= 1           # this call runs eagerly (a recording kept stays)
                return self.fn(*inputs)
            warnings.warn(f"capture: {_name(self.fn)} runs eagerly for this signature: "
                          f"{refusal}", stacklevel=3)
            self.schedules[key] = str(refusal)
            self.others.pop(key, None)
            # an Unrecordable step ran (eagerly) while recording; a NotRecorded one did not
            return self.fn(*inputs) if isinstance(refusal, NotRecorded) else refusal.result
        if schedule is not None:
            new.records_in_a_row = schedule.records_in_a_row
            self.others[key] = schedule     # kept, should the step's state turn back to it
        if not set(new.keyed) <= set(keyed):    # the recording read these inputs' values
            # (under the signature at entry: the call may have given a node input a gradient)
            keyed = self.keyed[plain_key] = tuple(sorted(set(keyed) | set(new.keyed)))
            for old in [k for k in self.schedules if k[:len(plain_key)] == plain_key]:
                del self.schedules[old]
                self.others.pop(old, None)
            key = plain_key + (_contents(inputs, keyed),)
        self.schedules[key] = new
        return result

    def _replay(self, schedule, inputs, key):
        if self.check or not schedule.verified:
            return self._checked(schedule, inputs, key)
        result = schedule.replay(inputs)
        self.replays += 1
        schedule.records_in_a_row = 0
        return result

    def _checked(self, schedule, inputs, key):
        """Eager from a saved state, then the replay from the same state: the same bits. The
        first replay of every recording is checked so (it catches what no guard sees: a step
        drawing from a generator of its own, NumPy arithmetic on its inputs); a difference
        then leaves eager's state and result, and the signature runs eagerly, with a warning.
        With ``check=True`` every call is checked and a difference raises."""
        saved = schedule.save(inputs)
        eager = self.fn(*inputs)
        eager_state = schedule.save(inputs)
        schedule.restore(saved)
        try:
            replayed = schedule.replay(inputs)
        except ReplayStopped as stop:
            replayed, difference = None, f"that it stopped ({stop.__cause__})"
        else:
            difference = _difference(_values(eager), _values(replayed), "the result")
        replayed_state = schedule.save(inputs)
        for part, value in eager_state.items():
            if part in ("holders", "objects"):  # what restore() puts back (values: as parts)
                continue
            difference = difference or _difference(
                [value], [replayed_state[part]], f"the state after the step: {schedule.describe(part)}")
        if difference and self.check:
            schedule.restore(saved)         # (a call that raises changes nothing)
            raise AssertionError(f"capture(check=True): {_name(self.fn)}: the replay differs "
                                 f"from eager in {difference}")
        if difference:
            schedule.restore(eager_state)
            self.others.pop(key, None)
            self.schedules[key] = why = (
                f"its first replay differed from eager in {difference}: the step reads "
                "something capture cannot see (docs/capture.md, 'What a replay checks')")
            warnings.warn(f"capture: {_name(self.fn)} runs eagerly for this signature: {why}",
                          stacklevel=4)
            return eager
        schedule.verified = True
        schedule.records_in_a_row = 0
        self.replays += 1
        return replayed


def _forgotten():
    return None


def _contents(inputs, keyed):
    """The values of the inputs a recording read into Python (an RNN's lengths), as bytes."""
    return tuple((value._data if isinstance(value, NetVar) else value).tobytes()
                 for position, value in enumerate(inputs) if position in keyed)


def signature(inputs):
    parts = [modes.grad, modes.train, threads_without_grad[0] > 0, get_dtype()]
    twice = len({id(value) for value in inputs}) < len(inputs)     # an input given twice
    for k, value in enumerate(inputs):
        # an array's layout, its strides and alignment, is part of it: the bits of a sum follow
        # the layout (an F-ordered or an unaligned batch is another signature)
        if isinstance(value, NetVar):
            first = next(j for j, other in enumerate(inputs) if other is value) if twice else k
            data = value._data
            parts.append(("node", data.shape, data.dtype, data.strides, _aligned(data),
                          value.requires_grad, value._g is None, first))  # (a gradient at
            # entry is added to)
        elif type(value) is numpy.ndarray or (backend.is_array(value) and not isinstance(
                value, numpy.ndarray)):     # (a GPU array: recording refuses it, by name)
            first = next(j for j, other in enumerate(inputs) if other is value) if twice else k
            parts.append(("array", type(value), value.shape, value.dtype, value.strides,
                          _aligned(value), first))      # (given twice: one buffer)
        elif isinstance(value, (int, float, bool, str, type(None), numpy.generic)):
            parts.append(("value", exact(value)))        # -0.0 is not 0.0
        else:
            return None
    return tuple(parts)


def _aligned(array):
    return getattr(array.flags, "aligned", True)


def _values(result):
    if isinstance(result, NetVar):
        return [result._data]
    if isinstance(result, (tuple, list)):
        return [v for item in result for v in _values(item)]
    if isinstance(result, dict):
        return [v for item in result.values() for v in _values(item)]
    return [result]


def _difference(a, b, what):
    """``what`` when ``a`` and ``b`` (lists of results or states) differ in any bit, else None."""
    return None if _same(list(a), list(b)) else what


def _name(fn):
    return getattr(fn, "__qualname__", None) or type(fn).__name__
