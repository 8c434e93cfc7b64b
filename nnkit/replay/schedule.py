"""``capture`` and the schedules it keeps: record on a signature's first call, check and replay
on the next ones (the package's docstring tells the whole story)."""
import copy
import functools
import gc
import operator
import threading
import warnings

import numpy

from .. import backend, core
from ..core import NetVar, constant
from ..dtypes import get_dtype
from ..modes import state as modes, threads_without_grad
from ..optim.base import Optimizer
from . import record as recording
from .record import GuardFailed, Recording, Traced, Unrecordable, patched, plain
from .world import World, changed, failed_guard

__all__ = ["capture", "Captured"]
_ndarray = numpy.ndarray


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
        if not (isinstance(max_signatures, int) and max_signatures >= 1):
            raise ValueError(f"capture: max_signatures must be an int >= 1, got {max_signatures!r}")
        self.fn, self.check, self.max_signatures = fn, bool(check), max_signatures
        self.schedules = {}         # signature -> Schedule, or the reason it runs eagerly
        self.keyed = {}             # signature -> the inputs whose values the step reads
        self.warned_inputs = False
        self.records = self.replays = 0
        self.__wrapped__ = fn

    def __repr__(self):
        return (f"capture({getattr(self.fn, '__qualname__', self.fn)!r}: {len(self.schedules)} "
                f"signatures, {self.records} recorded, {self.replays} replayed)")

    def __call__(self, *inputs):
        if core.observers or recording.active is not None:
            return self.fn(*inputs)         # an observer sees every op: eager (docs/capture.md)
        key = signature(inputs)
        if key is None:             # an input capture cannot compare: eager (warned once)
            if not self.warned_inputs:
                self.warned_inputs = True
                warnings.warn(f"capture: {_name(self.fn)} runs eagerly: its inputs must be "
                              "arrays, nodes, numbers or strings (a list or dict could change "
                              "behind a replay's back)", stacklevel=2)
            return self.fn(*inputs)
        keyed = self.keyed.get(key, ())
        if keyed:
            key = key + (_contents(inputs, keyed),)
        schedule = self.schedules.get(key)
        if isinstance(schedule, str):       # this signature runs eagerly (warned once)
            return self.fn(*inputs)
        if schedule is not None:
            why = schedule.stale()
            if why is None:
                try:
                    if self.check or not schedule.verified:
                        return self._checked(schedule, inputs, key)
                    result = schedule.replay(inputs)
                    self.replays += 1
                    schedule.records_in_a_row = 0
                    return result
                except GuardFailed as failure:
                    why = str(failure)
            schedule.records_in_a_row += 1
            if schedule.records_in_a_row == 4:
                warnings.warn(f"capture: {_name(self.fn)} recorded again {schedule.records_in_a_row} "
                              f"calls in a row ({why}): replays gain nothing", stacklevel=2)
        elif len(self.schedules) >= self.max_signatures:
            warnings.warn(f"capture: {_name(self.fn)} met more than {self.max_signatures} "
                          "signatures (input shapes, dtypes, modes); the oldest is forgotten: "
                          "pad to fewer shapes (docs/capture.md, 'Buckets')", stacklevel=2)
            del self.schedules[next(iter(self.schedules))]
        self.records += 1
        try:
            new, result = Schedule.record(self.fn, inputs)
        except OnDevice as refusal:
            warnings.warn(f"capture: {_name(self.fn)} runs eagerly for this signature: "
                          f"{refusal}", stacklevel=2)
            self.schedules[key] = str(refusal)
            return self.fn(*inputs)
        except Unrecordable as refusal:
            warnings.warn(f"capture: {_name(self.fn)} runs eagerly for this signature: "
                          f"{refusal}", stacklevel=2)
            self.schedules[key] = str(refusal)
            return refusal.result
        if schedule is not None:
            new.records_in_a_row = schedule.records_in_a_row
        if not set(new.keyed) <= set(keyed):    # the recording read these inputs' values
            plain_key = signature(inputs)
            keyed = self.keyed[plain_key] = tuple(sorted(set(keyed) | set(new.keyed)))
            for old in [k for k in self.schedules if k[:len(plain_key)] == plain_key]:
                del self.schedules[old]
            key = plain_key + (_contents(inputs, keyed),)
        self.schedules[key] = new
        return result

    def _checked(self, schedule, inputs, key):
        """Eager from a saved state, then the replay from the same state: the same bits. The
        first replay of every recording is checked so (it catches what no guard sees: a step
        drawing from a generator of its own, NumPy arithmetic on its inputs); a difference
        then leaves eager's state and result, and the signature runs eagerly, with a warning.
        With ``check=True`` every call is checked and a difference raises."""
        saved = schedule.save()
        eager = self.fn(*inputs)
        eager_state = schedule.save()
        schedule.restore(saved)
        replayed = schedule.replay(inputs)
        difference = _difference(_values(eager), _values(replayed), "the result")
        replayed_state = schedule.save()
        for part, value in eager_state.items():
            if part == "holders":       # what restore() puts back, compared as ("grad", ...)
                continue
            difference = difference or _difference(
                [value], [replayed_state[part]], f"the state after the step: {schedule.describe(part)}")
        if difference and self.check:
            raise AssertionError(f"capture(check=True): {_name(self.fn)}: the replay differs "
                                 f"from eager in {difference}")
        if difference:
            schedule.restore(eager_state)
            self.schedules[key] = why = (
                f"its first replay differed from eager in {difference}: the step reads "
                "something capture cannot see (docs/capture.md, 'What a replay checks')")
            warnings.warn(f"capture: {_name(self.fn)} runs eagerly for this signature: {why}",
                          stacklevel=3)
            return eager
        schedule.verified = True
        self.replays += 1
        return replayed


def _contents(inputs, keyed):
    """The values of the inputs a recording read into Python (an RNN's lengths), as bytes."""
    return tuple((value._data if isinstance(value, NetVar) else value).tobytes()
                 for position, value in enumerate(inputs) if position in keyed)


def signature(inputs):
    parts = [modes.grad, modes.train, threads_without_grad[0] > 0, get_dtype()]
    for value in inputs:
        if isinstance(value, NetVar):
            parts.append(("node", value._data.shape, value._data.dtype, value.requires_grad,
                          value._g is None))      # a gradient at entry is added to
        elif backend.is_array(value):        # (a GPU array: recording refuses it, by name)
            parts.append(("array", type(value), value.shape, value.dtype))
        elif isinstance(value, (int, float, bool, str, type(None), numpy.generic)):
            parts.append(("value", type(value), value))
        else:
            return None
    return tuple(parts)


class Schedule:
    """One signature's recording: the program and what a replay hands in and out."""

    records_in_a_row = 0
    verified = False            # its first replay was checked against eager

    @classmethod
    def record(cls, fn, inputs):
        """Run ``fn(*inputs)`` eagerly while recording: ``(schedule, result)``, or Unrecordable
        (the step ran eagerly all the same; its result is the exception's ``result``)."""
        world = World(fn, inputs)
        arrays = [leaf._data for leaf in world.leaves] + [
            value._data if isinstance(value, NetVar) else value for value in inputs
            if isinstance(value, NetVar) or backend.is_array(value)]
        if any(not isinstance(array, _ndarray) for array in arrays):
            raise OnDevice("capture records steps on NumPy arrays; on a GPU the step runs as "
                           "it is (docs/capture.md)")
        schedule, rec = cls(), Recording()
        schedule.world, schedule.swaps, schedule.entries = world, [], []
        start = constant(numpy.zeros(())).index     # leaves from here on: the step's own
        before = world.snapshot(optimizers=True)
        counters = [(owner, name, getattr(owner, name))
                    for owner in world.owners for name in getattr(type(owner), "counters", ())]
        entry_grads = {id(leaf): _entry_grads([leaf])[0] for leaf in world.leaves}
        traced_inputs = schedule._hand_in(rec, inputs)
        met = Meeting()
        result, error = schedule._run(rec, met, fn, traced_inputs)
        for value, buffer in zip(inputs, schedule.inputs):
            if buffer is not None and id(buffer) in rec.inputs_written:   # as eager wrote it
                numpy.copyto(value._data if isinstance(value, NetVar) else value, buffer)
        schedule.outputs = _outputs(result, rec)
        for leaf in met.leaves:
            if leaf.index < start and not any(leaf is known for known in world.leaves) \
                    and leaf.requires_grad and type(leaf._data) is not Traced:
                rec.refuse(f"the step uses a parameter capture did not find before it ran "
                           f"({leaf._describe()}): keep parameters in a Module, an optimizer, "
                           "or a name the step reads")
        schedule.leaves = [leaf for leaf in world.leaves + met.leaves if leaf.index < start
                           and all(leaf is not value for value in inputs)]
        schedule.input_grads = [(k, plain(value._g)) for k, value in enumerate(inputs)
                                if isinstance(value, NetVar) and type(value._g) is Traced]
        schedule.counters = [(owner, name, getattr(owner, name) - value)
                             for owner, name, value in counters]
        schedule._take_out(rec, inputs)
        gc.collect()        # the recorded graph's cycles: freed now, not amid later steps
        moved = failed_guard(world.guards)
        if moved:           # the step itself changed what it reads: a counter, a schedule
            rec.refuse(f"the step changes Python state a replay would not: {moved}")
        ignore = {(id(owner), name) for owner, name, _ in schedule.counters}
        for holder, name in changed(before, world.snapshot(optimizers=True), ignore):
            owner = ("a parameter group of an optimizer" if isinstance(holder, dict)
                     else type(holder).__name__)
            rec.refuse(f"the step changed {owner}'s {name}, which a replay would not (change "
                       "it between calls: a schedule's step() outside the captured step)")
        eager_result = _handed_out(schedule.outputs)
        if error is not None:
            raise error
        if rec.refusals:
            refusal = Unrecordable("; ".join(rec.refusals))
            refusal.result = eager_result
            raise refusal
        schedule.program = _program(rec)
        schedule.entry_grads = _entry_grads(schedule.leaves, entry_grads)
        schedule.snapshot, schedule.held = world.snapshot(), world.held()
        schedule.data = [(leaf, leaf._data) for leaf in schedule.leaves]
        schedule.draws = any(step[0] is recording._draw for step in rec.program)
        schedule.keyed = tuple(sorted(rec.keyed))
        return schedule, eager_result

    def _swap(self, holder, attribute, twin):
        self.swaps.append((holder, attribute, getattr(holder, attribute), twin))
        setattr(holder, attribute, twin)

    def _hand_in(self, rec, inputs):
        """Give the step Traced arrays: copies of its inputs (the input buffers), its
        parameters' data (themselves: the optimizer updates them in place), copies of their
        gradients and of the buffers (entries, copied in at each replay). Returns the inputs."""
        self.inputs, traced = [], []
        for value in inputs:
            if not isinstance(value, (_ndarray, NetVar)):
                self.inputs.append(None)
                traced.append(value)
                continue
            buffer = numpy.array(value._data if isinstance(value, NetVar) else value, copy=True,
                                 subok=False)
            rec.vary(buffer, ("input", len(self.inputs)))
            rec.inputs.add(id(buffer))
            self.inputs.append(buffer)
            twin = rec.traced_view(buffer)
            if isinstance(value, NetVar):
                self._swap(value, "_data", twin)
            traced.append(value if isinstance(value, NetVar) else twin)
        for leaf in self.world.leaves:
            rec.vary(leaf._data, "state")
            rec.kept.add(id(_root(leaf._data)))
            self._swap(leaf, "_data", rec.traced_view(leaf._data))
            if leaf._g is not None:
                self._enter(rec, leaf, "_g")
        for owner in self.world.owners:
            for name in type(owner).buffers:
                if isinstance(getattr(owner, name, None), _ndarray):
                    self._enter(rec, owner, name)
        return traced

    def _enter(self, rec, holder, attribute):
        entry = numpy.array(getattr(holder, attribute), copy=True, subok=False)
        rec.vary(entry, "state")
        self.entries.append((holder, attribute, entry))
        self._swap(holder, attribute, rec.traced_view(entry))

    @staticmethod
    def _run(rec, met, fn, inputs):
        """``fn(*inputs)`` recorded: NumPy patched, the optimizer's step live (an instruction
        that sets the gradients it reads and calls it), back(trace=True) refused, every leaf
        the ops read met. Returns ``(result, error)``."""
        live_step, tracer = Optimizer.step, core.recorder

        def step(optimizer):
            if threading.get_ident() != rec.thread:     # another thread's optimizer: its own
                return live_step(optimizer)
            params = [p for group in optimizer.param_groups for p in group["params"]]
            grads = [(p, None if p._g is None else plain(p._g), p._gshared) for p in params]
            rec.add(_live_step, (live_step, optimizer, grads), {}, (), frozenset(("state",)))
            rec.touched = rec.touched or f"{type(optimizer).__name__}.step()"
            twins = [p._data for p in params]
            for p, g, _ in grads:       # the step runs on plain arrays, as at a replay
                p._data, p._g = plain(p._data), g
            rec.paused = True
            try:
                live_step(optimizer)
            finally:
                rec.paused = False
                for p, twin in zip(params, twins):
                    if p._data is plain(twin):      # updated in place: the Traced twin again
                        p._data = twin

        def traced_back():          # back(trace=True): a Trace no replay would make
            rec.refuse("the step calls back(trace=True), whose Trace a replay would not make")
            return tracer()
        Optimizer.step, core.recorder = step, traced_back
        core.observers.append(met)
        try:
            with patched(rec):
                return fn(*inputs), None
        except BaseException as raised:
            return None, raised
        finally:
            Optimizer.step, core.recorder = live_step, tracer
            core.observers.remove(met)

    def _take_out(self, rec, inputs):
        """Put the plain arrays back where the Traced ones were handed in, and note what each
        replay hands out: gradients (copies), buffers the step rebinds (copies) or writes into
        (copied into the holder's array). A parameter the step assigned new data keeps it."""
        self.grads_out = [(leaf, plain(leaf._g)) for leaf in self.leaves
                          if type(leaf._g) is Traced]
        self.outs = []          # (holder, attribute, buffer, "rebind" or "write")
        originals = {(id(holder), attribute): old for holder, attribute, old, _ in self.swaps}
        for holder, attribute, old, twin in self.swaps:
            value = getattr(holder, attribute)
            if attribute != "_data":
                continue
            if value is twin:
                holder._data = old
            else:
                rec.refuse(f"the step assigned new data to {holder._describe()}")
                holder._data = plain(value).copy() if type(value) is Traced else value
        for holder, attribute, entry in self.entries:
            if attribute == "_g":       # a gradient at entry: handed out with grads_out
                continue
            value, original = getattr(holder, attribute), originals[(id(holder), attribute)]
            if type(value) is not Traced:
                rec.refuse(f"the step assigned {type(holder).__name__}.{attribute} a value "
                           "capture did not see computed")
            elif _root(plain(value)) is not entry:
                self.outs.append((holder, attribute, plain(value), "rebind"))
                setattr(holder, attribute, plain(value).copy())
            else:
                setattr(holder, attribute, original)
                if _written(rec, entry):
                    numpy.copyto(original, entry)
                    self.outs.append((holder, attribute, entry, "write"))
        for leaf, buffer in self.grads_out:
            leaf._g, leaf._gshared = buffer.copy(), True
        for position, buffer in self.input_grads:
            inputs[position]._g, inputs[position]._gshared = buffer.copy(), True

    # -- a replay
    def stale(self):
        """Why this schedule cannot replay now (something the step reads changed), or None."""
        why = failed_guard(self.world.guards)
        if why:
            return why
        for leaf, data in self.data:
            if leaf._data is not data:
                return f"the data of {leaf._describe()} was replaced"
        if _entry_grads(self.leaves) != self.entry_grads:
            return "a parameter's gradient was set or reset outside the step"
        held = self.world.held()
        if len(held) != len(self.held) or not all(map(operator.is_, held, self.held)):
            differences = changed(self.snapshot, self.world.snapshot())
            if differences:
                holder, name = differences[0]
                return f"{type(holder).__name__}.{name} changed"
            self.held = held        # equal numbers in new objects: the same attributes
        for holder, attribute, entry in self.entries:
            value = getattr(holder, attribute)
            if getattr(value, "shape", None) != entry.shape or value.dtype != entry.dtype:
                return f"{type(holder).__name__}.{attribute} changed shape or dtype"
        return None

    def replay(self, inputs):
        for buffer, value in zip(self.inputs, inputs):
            if buffer is not None:
                numpy.copyto(buffer, value._data if isinstance(value, NetVar) else value)
        for holder, attribute, entry in self.entries:
            numpy.copyto(entry, getattr(holder, attribute))
        saved = backend.get_rng_state() if self.draws else None
        try:
            for function, args in self.program:
                function(*args)
        except GuardFailed:
            if saved is not None:
                backend.set_rng_state(saved)
            raise
        for leaf, buffer in self.grads_out:
            leaf._g, leaf._gshared = buffer.copy(), True
        for position, buffer in self.input_grads:        # a node input's gradient
            inputs[position]._g, inputs[position]._gshared = buffer.copy(), True
        for holder, attribute, buffer, how in self.outs:
            if how == "rebind":
                setattr(holder, attribute, buffer.copy())
            else:
                numpy.copyto(getattr(holder, attribute), buffer)
        for owner, name, delta in self.counters:
            setattr(owner, name, getattr(owner, name) + delta)
        return _handed_out(self.outputs)

    # -- check=True
    def save(self):
        state = {}
        for leaf in self.leaves:
            state[("data", id(leaf))] = leaf._data.copy()
        for holder, attribute, _ in self.entries:
            state[("entry", id(holder), attribute)] = numpy.array(getattr(holder, attribute))
        for optimizer in self.world.optimizers:
            state[("optimizer", id(optimizer))] = _copied(optimizer.state)
        for owner, name, _ in self.counters:
            state[("counter", id(owner), name)] = getattr(owner, name)
        state["rng"] = backend.get_rng_state()
        for leaf in self.leaves:
            state[("grad", id(leaf))] = None if leaf._g is None else numpy.array(leaf._g)
        state["holders"] = [(leaf, leaf._g, leaf._gshared) for leaf in self.leaves]
        return state

    def describe(self, key):
        """A key of ``save()`` in words: which parameter, buffer or optimizer state."""
        if key[0] in ("data", "grad"):
            leaf = next(leaf for leaf in self.leaves if id(leaf) == key[1])
            return f"the {'gradient' if key[0] == 'grad' else 'data'} of {leaf._describe()}"
        if key[0] == "optimizer":
            return "the optimizer's state"
        if key[0] in ("entry", "counter"):
            return f"{key[0]} {key[2]}"
        return str(key[0])

    def restore(self, state):
        for leaf in self.leaves:
            leaf._data[...] = state[("data", id(leaf))]
        for holder, attribute, _ in self.entries:
            setattr(holder, attribute, state[("entry", id(holder), attribute)].copy())
        for optimizer in self.world.optimizers:
            optimizer.state[:] = _copied(state[("optimizer", id(optimizer))])
        for owner, name, _ in self.counters:
            setattr(owner, name, state[("counter", id(owner), name)])
        backend.set_rng_state(state["rng"])
        for leaf, g, shared in state["holders"]:
            leaf._g, leaf._gshared = g, shared


class OnDevice(Exception):
    """The step's parameters or inputs live on a GPU: it runs eagerly (nothing recorded)."""


class Meeting:
    """The observer a recording attaches: it meets every leaf the step's ops read."""
    checks_values = False

    def __init__(self):
        self.leaves = []
        self._ids = set()

    def forward(self, node, parents):
        for parent in parents:
            if not parent._parents and not isinstance(parent, core.NetOp) \
                    and id(parent) not in self._ids:
                self._ids.add(id(parent))
                self.leaves.append(parent)

    def before(self, node):
        pass

    def after(self, node):
        pass


def _live_step(step, optimizer, grads):
    for p, g, shared in grads:
        p._g, p._gshared = g, shared
    step(optimizer)


def _program(rec):
    """The instructions a replay runs: those that read something that varies, and the ones
    that rebuild an array that something else writes into (a zeros an add.at fills)."""
    writers = {}
    for function, args, kwargs, writes, sources in rec.program:
        for array in writes:
            writers[id(recording._root(array))] = writers.get(id(recording._root(array)), 0) + 1
    keyed = frozenset(("input", k) for k in rec.keyed)     # their values are the signature's
    kept = []
    for function, args, kwargs, writes, sources in rec.program:
        if function is recording._check and sources <= keyed:
            continue            # a check of the keyed inputs alone: the key already holds it
        if sources or any(writers[id(recording._root(array))] > 1 for array in writes):
            if function is recording._into and _fixed_gather(rec, args, keyed):
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


def _written(rec, entry):
    return any(recording._root(array) is entry
               for _, _, _, writes, _ in rec.program for array in writes)


def _root(array):
    return recording._root(array)


def _entry_grads(leaves, before=None):
    """Whether each leaf had a gradient at entry (a replay adds into it as eager did, or starts
    it): from ``before`` (id -> the same, taken before the recording). Whether it was shared
    changes only which array eager adds into, not the values: reading ``p.g`` changes it, and
    must not make the next call record again."""
    now = [leaf._g is None for leaf in leaves]
    if before is None:
        return now
    return [before.get(id(leaf), True) for leaf in leaves]


def _outputs(result, rec):
    """What the step returned, with each node and array as the buffer its value is in."""
    if isinstance(result, NetVar):
        data = result._data
        if type(data) is not Traced:
            rec.refuse("the step returns a node whose value capture did not see computed")
            return ("value", result)
        return ("node", plain(data))
    if type(result) is Traced:
        return ("array", plain(result))
    if isinstance(result, _ndarray):
        rec.refuse("the step returns an array capture did not see computed")
        return ("value", result)
    if isinstance(result, (tuple, list)):
        return (type(result), [_outputs(item, rec) for item in result])
    if isinstance(result, dict):
        return (dict, {key: _outputs(item, rec) for key, item in result.items()})
    if not isinstance(result, (int, float, complex, bool, str, type(None))):
        rec.refuse(f"the step returns a {type(result).__name__}")
    return ("value", result)


def _handed_out(spec):
    kind, value = spec
    if kind == "node":
        return constant(value.copy())
    if kind == "array":
        return value.copy()
    if kind == "value":
        return value
    if kind is dict:
        return {key: _handed_out(item) for key, item in value.items()}
    return kind(_handed_out(item) for item in value)


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


def _same(a, b):
    if isinstance(a, (_ndarray, numpy.generic)) or isinstance(b, (_ndarray, numpy.generic)):
        return numpy.shape(a) == numpy.shape(b) and numpy.asarray(a).dtype == numpy.asarray(
            b).dtype and numpy.array_equal(a, b, equal_nan=numpy.asarray(a).dtype.kind in "fc")
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[key], b[key]) for key in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and (a == b or (a != a and b != b))


def _copied(value):
    return copy.deepcopy(value)


def _name(fn):
    return getattr(fn, "__qualname__", None) or type(fn).__name__
