"""``Schedule``: one signature's recording. ``record`` runs the step once with Traced arrays
handed in and takes the plain ones back out; ``replay`` hands the inputs over, runs the program
and hands out what eager would leave; ``save``/``restore`` serve the check against eager."""
import collections
import copy
import gc
import operator
import sys
import threading

import numpy

from .. import backend, core
from ..arraylike import gradient_only_read
from ..core import NetVar, constant
from ..optim import flat
from ..optim.base import Optimizer
from .instructions import GuardFailed, _arrays, _draw, _root
from .program import program, read_from, readers, rehome, written
from .record import Recording, Traced, Unrecordable, patched, plain
from .world import World, changed, failed_guard, op_classes

_COPIED = 64 * 1024     # bytes per reading instruction: an input smaller is copied in

_ndarray = numpy.ndarray


class Schedule:
    """One signature's recording: the program and what a replay hands in and out."""

    records_in_a_row = 0
    verified = False            # its first replay was checked against eager
    homed = False               # its gradients computed into the optimizer's flat arrays

    @classmethod
    def record(cls, fn, inputs):
        """Run ``fn(*inputs)`` eagerly while recording: ``(schedule, result)``, or Unrecordable
        (the step ran eagerly all the same; its result is the exception's ``result``)."""
        world = World(fn, inputs)
        arrays = [leaf._data for leaf in world.leaves] + [
            value._data if isinstance(value, NetVar) else value for value in inputs
            if isinstance(value, NetVar) or backend.is_array(value)]
        if any(not isinstance(array, _ndarray) for array in arrays):
            raise NotRecorded("capture records steps on NumPy arrays; on a GPU the step runs as "
                              "it is (docs/capture.md)")
        for leaf in world.leaves:
            if leaf._g is not None and gradient_only_read(leaf):
                raise NotRecorded(f"the gradient of {leaf._describe()} is the zeros reading "
                                  "its .g made, which its optimizer skips as no gradient and "
                                  "a replay could not tell from one: this call runs eagerly",
                                  lasting=False)
        for k, value in enumerate(inputs):
            if isinstance(value, NetVar) and value._parents:
                raise NotRecorded(f"input {k} is a node computed by an op, with a graph: back() "
                                  "inside the step would go on into it, which a replay cannot "
                                  "do; give x.detach() (or its data)")
        for k in world.inputs_held:
            raise NotRecorded(f"input {k} is a parameter of the step's model or optimizer: a "
                              "replay's copy of it would not see the optimizer's update")
        for k, value in enumerate(inputs):
            if isinstance(value, NetVar) and any(value is other for other in inputs[:k]):
                raise NotRecorded(f"input {k} is a node given earlier too: each input is "
                                  "copied into a buffer of its own")
        state = _state_arrays(world)
        for k, value in enumerate(inputs):
            array = value._data if isinstance(value, NetVar) else value
            for what, other, _ in state:
                if isinstance(array, _ndarray) and numpy.may_share_memory(array, other):
                    raise NotRecorded(f"input {k} shares memory with {what}, which the step "
                                      "may change: a replay's copy of the input would not "
                                      "see it (pass a copy to capture it)")
        schedule, rec = cls(), Recording()
        schedule.world, schedule.swaps, schedule.entries = world, [], []
        start = constant(numpy.zeros(())).index     # leaves from here on: the step's own
        before = world.snapshot(optimizers=True)
        counters = [(owner, name, getattr(owner, name))
                    for owner in world.owners for name in getattr(type(owner), "counters", ())]
        entry_grads = {id(leaf): _entry_grads([leaf])[0] for leaf in world.leaves}
        traced_inputs = schedule._hand_in(rec, inputs)
        met = Meeting()
        result, error = schedule._run(rec, met, fn, traced_inputs, world)
        for optimizer in met.optimizers:        # kept where only the step's code finds it
            world._add(optimizer, world.optimizers)
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
        schedule.leaves = [leaf for leaf in {id(leaf): leaf for leaf in world.leaves +
                                             met.leaves}.values()   # (each once)
                           if leaf.index < start and all(leaf is not value for value in inputs)]
        schedule.input_grads = [(k, plain(value._g)) for k, value in enumerate(inputs)
                                if isinstance(value, NetVar) and type(value._g) is Traced]
        schedule.counters = [(owner, name, getattr(owner, name) - value)
                             for owner, name, value in counters]
        schedule._take_out(rec, inputs)
        read = set().union(*(sources for *_, sources in rec.program))
        for k, buffer in enumerate(schedule.inputs):
            # integers or booleans no recorded operation reads: an index NumPy took itself
            if buffer is not None and buffer.dtype.kind in "biu" and \
                    ("input", k) not in read and k not in rec.keyed:
                rec.refuse(f"input {k} is read by no operation capture saw: NumPy reads an "
                           "index itself (table[y], np.take(table, y) with a plain table), "
                           "without asking it; index a node (nn.constant(table)[y] built "
                           "outside the step, nn.layers.Embedding) or pass the table too")
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
        schedule.program, writes = program(rec, pinned=schedule._pinned(),
                                           trusted=(_live_step,))
        schedule._note_writers(writes)
        schedule._find_readers()
        schedule.entry_grads = _entry_grads(schedule.leaves, entry_grads)
        schedule.wants = [leaf.requires_grad for leaf in schedule.leaves]
        schedule.groups = _groups(world.optimizers)
        op_classes(world, met.classes)
        schedule.snapshot, schedule.held = world.snapshot(), world.held()
        # the parameters' data and the buffers: arrays that live on (not the gradients)
        schedule.state_roots = {id(_root(array)) for _, array, lasting in state if lasting}
        schedule.data = [(leaf, leaf._data) for leaf in schedule.leaves]
        schedule.draws = any(step[0] is _draw for step in rec.program)
        schedule.keyed = tuple(sorted(rec.keyed))
        return schedule, eager_result

    def _swap(self, holder, attribute, twin):
        self.swaps.append((holder, attribute, getattr(holder, attribute), twin))
        setattr(holder, attribute, twin)

    def _hand_in(self, rec, inputs):
        """Give the step Traced arrays: copies of its inputs (the input buffers), its
        parameters' data (themselves: the optimizer updates them in place), copies of their
        gradients and of the buffers (entries, copied in at each replay). Returns the inputs."""
        self.inputs, self.input_entries, traced = [], [], []
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
                if value._g is not None:    # a gradient it adds to: the caller's, each call
                    entry = numpy.array(value._g, copy=True, subok=False)
                    rec.vary(entry, "state")
                    self.input_entries.append((len(self.inputs) - 1, entry))
                    self._swap(value, "_g", rec.traced_view(entry))
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
    def _run(rec, met, fn, inputs, world):
        """``fn(*inputs)`` recorded: NumPy patched, the optimizer's step live (an instruction
        that sets the gradients it reads and calls it), back(trace=True) refused, every leaf
        the ops read met, every Python function that runs read by the world (a profile hook).
        Returns ``(result, error)``."""
        live_step, tracer = Optimizer.step, core.recorder

        def step(optimizer):
            if threading.get_ident() != rec.thread:     # another thread's optimizer: its own
                return live_step(optimizer)
            met.optimizers.append(optimizer)
            params = [p for group in optimizer.param_groups for p in group["params"]]
            grads = [(p, None if p._g is None else plain(p._g), p._gshared) for p in params]
            rec.add(_live_step, (live_step, optimizer, grads), {}, (), frozenset(("state",)))
            rec.touched = rec.touched or f"{type(optimizer).__name__}.step()"
            twins = [p._data for p in params]
            read = [p for p in params if p._g is not None and getattr(p, "_gread", None) is p._g]
            for p, g, _ in grads:       # the step runs on plain arrays, as at a replay
                p._data, p._g = plain(p._data), g
            for p in read:      # zeros a read of .g made in the step: no gradient while zeros
                p._gread = p._g
                rec.refuse(f"the step reads .g of {p._describe()}, which had no gradient: the "
                           "zeros that makes are no gradient to its optimizer, which a replay "
                           "could not tell from a gradient of zeros; read .g after the call")
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
        def profile(frame, event, arg):
            if frame.f_code.co_name == "__del__":
                return
            if event == "call":
                world.meet(frame)
            elif event == "return":
                world.met_return(frame, arg)

        Optimizer.step, core.recorder = step, traced_back
        core.observers.append(met)
        profiler, collecting = sys.getprofile(), gc.isenabled()
        try:
            with patched(rec):
                gc.disable()        # (a collection's callbacks are no code of the step's)
                sys.setprofile(profile)
                try:
                    return fn(*inputs), None
                finally:
                    sys.setprofile(profiler)
                    if collecting:
                        gc.enable()
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
                if written(rec, entry):
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
        if [leaf.requires_grad for leaf in self.leaves] != self.wants:
            return "a parameter's requires_grad was changed"
        if _groups(self.world.optimizers) != self.groups:
            return "an optimizer's parameters or groups changed"
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
        if self.verified and not self.homed:
            self._home_gradients()
        self._hand_over(inputs)
        for holder, attribute, entry in self.entries:
            numpy.copyto(entry, getattr(holder, attribute))
        for k, entry in self.input_entries:
            g = inputs[k]._g
            if g.shape != entry.shape or g.dtype != entry.dtype:
                raise GuardFailed(f"the gradient of input {k} changed shape or dtype")
            numpy.copyto(entry, g)
        saved = backend.get_rng_state() if self.draws else None
        try:
            for function, args in self.program:
                function(*args)
        except GuardFailed:
            if saved is not None:
                backend.set_rng_state(saved)
            raise
        except BaseException:       # the optimizer refused, a check raised: eager's state
            self._hand_out(inputs, self._index_of(function, args))
            raise
        self._hand_out(inputs, len(self.program))
        return _handed_out(self.outputs)

    def _hand_out(self, inputs, done):
        """Hand out what eager leaves after a step: gradients, buffers and counters, those
        written by the first ``done`` instructions (all of them, unless one raised)."""
        ran = self.writers
        for leaf, buffer in self.grads_out:
            if ran.get(id(buffer), -1) < done:
                leaf._g, leaf._gshared = buffer.copy(), True
        for position, buffer in self.input_grads:        # a node input's gradient
            if ran.get(id(buffer), -1) < done:
                inputs[position]._g, inputs[position]._gshared = buffer.copy(), True
        for holder, attribute, buffer, how in self.outs:
            if ran.get(id(buffer), -1) >= done:
                continue
            if how == "rebind":
                setattr(holder, attribute, buffer.copy())
            else:
                numpy.copyto(getattr(holder, attribute), buffer)
        for owner, name, delta in self.counters:
            if ran.get(("counter", id(owner)), -1) < done:
                setattr(owner, name, getattr(owner, name) + delta)

    def _note_writers(self, writes):
        """For each array a replay hands out, the last instruction that writes it (``writes``:
        the buffers each instruction writes); a counter goes with its owner's buffers."""
        last = {}
        for index, keys in enumerate(writes):
            for key in keys:
                last[key] = index
        self.writers = {id(buffer): last.get(id(_root(buffer)), -1) for buffer in _arrays(
            (self.grads_out, self.input_grads, [out[2] for out in self.outs]))}
        for owner, _, _ in self.counters:
            self.writers[("counter", id(owner))] = max(
                [self.writers[id(buffer)] for holder, _, buffer, _ in self.outs
                 if holder is owner], default=-1)

    def _index_of(self, function, args):
        """The position of the instruction ``(function, args)`` in the program."""
        return next((index for index, (f, a) in enumerate(self.program)
                     if f is function and a is args), len(self.program))

    def _pinned(self):
        """The arrays a replay hands in or out, or that are the parameters' data: buffers of
        their own, which no other shares memory with or is moved into."""
        return (self.inputs, self.entries, self.input_entries, self.grads_out,
                self.input_grads, self.outs, self.outputs, [leaf._data for leaf in self.leaves])

    def _home_gradients(self):
        """Once, at the second replay (the first, checked against eager, made the optimizer's
        runs anew): each gradient that the optimizer's step would copy into a flat array
        (small parameters updated together, ``optim/flat.py``) is computed straight into its
        place there, and the step finds it there (W2: 6 copies, 18 µs of a 530 µs step). A
        gradient whose bytes another buffer shares in part, or that is handed out, stays
        where it is; when the optimizer makes its runs anew, the step copies again."""
        self.homed = True
        moved = {k for k, (buffer, reading) in enumerate(zip(self.inputs, self.reading))
                 if reading is not buffer}
        read_from(self.program, self.readers, self.inputs, moved)     # the buffers' views
        pinned = self._pinned()
        steps = [args for function, args in self.program if function is _live_step]
        for _, optimizer, grads in steps:
            homes = flat.gradient_homes(optimizer)
            for p, g, _ in grads:
                home = homes.get(id(p))
                if home is not None and g is not None and g.shape == home.shape and \
                        g.dtype == home.dtype and g.flags.c_contiguous:
                    self.program = rehome(self.program, pinned, g, home) or self.program
        self._find_readers()

    def _find_readers(self):
        """Which instructions read each input buffer (``readers``), for the inputs a replay can
        hand over as they are (``direct``): those the schedule does not also hand out, large
        enough that copying them would cost more than pointing their readers at them (about
        2 µs an instruction, the time to copy 64 KiB: a small batch is copied)."""
        elsewhere = {id(_root(array)) for array in _arrays((
            self.entries, self.input_entries, self.grads_out, self.input_grads, self.outs,
            self.outputs))}
        self.readers = readers(self.program, [
            None if buffer is None or id(buffer) in elsewhere else buffer
            for buffer in self.inputs])
        count = collections.Counter(k for _, _, _, views in self.readers
                                    for k in {view[0] for view in views})
        self.direct = {k for k, n in count.items() if self.inputs[k].nbytes > _COPIED * n}
        self.reading = list(self.inputs)        # what the instructions read now, by input

    def _hand_over(self, inputs):
        """The inputs to the program: the instructions read an input array itself where it is
        laid out as its buffer (C order; its shape and dtype are the signature's), as eager
        reads it; else a copy of it in the buffer."""
        moved = set()
        for k, value in enumerate(inputs):
            buffer = self.inputs[k]
            if buffer is None:
                continue
            array = value._data if isinstance(value, NetVar) else value
            if id(array if array.base is None else _root(array)) in self.state_roots:
                raise GuardFailed(f"input {k} shares memory with a parameter or buffer")
            if k in self.direct and type(array) is _ndarray and array.flags.c_contiguous:
                reading = array
            else:
                reading = buffer
                numpy.copyto(buffer, array)
            if reading is not self.reading[k]:
                self.reading[k] = reading
                moved.add(k)
        if moved:
            read_from(self.program, self.readers, self.reading, moved)

    # -- check=True
    def save(self, inputs=()):
        """The state a step changes (and the gradients of the node ``inputs``), as copies."""
        state = {}
        for leaf in self.leaves:
            state[("data", id(leaf))] = leaf._data.copy()
        for holder, attribute, _ in self.entries:
            state[("entry", id(holder), attribute)] = numpy.array(getattr(holder, attribute))
        for optimizer in self.world.optimizers:
            state[("optimizer", id(optimizer))] = copy.deepcopy(optimizer.state)
            state[("modifiers", id(optimizer))] = [    # what they record (a clipped norm)
                copy.copy(vars(modifier)) for modifier in _recording(optimizer)]
        for owner, name, _ in self.counters:
            state[("counter", id(owner), name)] = getattr(owner, name)
        state["rng"] = backend.get_rng_state()
        for leaf in self.leaves:
            state[("grad", id(leaf))] = None if leaf._g is None else numpy.array(leaf._g)
        # the gradients' values, not their arrays: eager adds into the arrays it finds
        nodes = [value for value in inputs if isinstance(value, NetVar)]
        for k, value in enumerate(inputs):
            if isinstance(value, NetVar):
                state[("input grad", k)] = None if value._g is None else numpy.array(value._g)
        state["holders"] = [(leaf, None if leaf._g is None else numpy.array(leaf._g),
                             getattr(leaf, "_gshared", False)) for leaf in self.leaves + nodes]
        return state

    def describe(self, key):
        """A key of ``save()`` in words: which parameter, buffer or optimizer state."""
        if key[0] in ("data", "grad"):
            leaf = next(leaf for leaf in self.leaves if id(leaf) == key[1])
            return f"the {'gradient' if key[0] == 'grad' else 'data'} of {leaf._describe()}"
        if key[0] == "optimizer":
            return "the optimizer's state"
        if key[0] == "modifiers":
            return "what the optimizer's modifiers record"
        if key[0] == "input grad":
            return f"the gradient of input {key[1]}"
        if key[0] in ("entry", "counter"):
            return f"{key[0]} {key[2]}"
        return str(key[0])

    def restore(self, state):
        for leaf in self.leaves:
            leaf._data[...] = state[("data", id(leaf))]
        for holder, attribute, _ in self.entries:
            setattr(holder, attribute, state[("entry", id(holder), attribute)].copy())
        for optimizer in self.world.optimizers:
            optimizer.state[:] = copy.deepcopy(state[("optimizer", id(optimizer))])
            for modifier, saved in zip(_recording(optimizer), state[("modifiers", id(optimizer))]):
                vars(modifier).clear()
                vars(modifier).update(saved)
        for owner, name, _ in self.counters:
            setattr(owner, name, state[("counter", id(owner), name)])
        backend.set_rng_state(state["rng"])
        for leaf, g, shared in state["holders"]:
            leaf._g, leaf._gshared = (None, shared) if g is None else (g.copy(), shared)


class NotRecorded(Exception):
    """The step runs eagerly, nothing recorded: its parameters or inputs live on a GPU, or an
    input shares memory with its parameters or buffers (a copy would not see their updates).
    ``lasting``: the signature runs eagerly from then on (else this call only)."""

    def __init__(self, message, lasting=True):
        super().__init__(message)
        self.lasting = lasting


class Meeting:
    """The observer a recording attaches: it meets every leaf the step's ops read."""
    checks_values = False

    def __init__(self):
        self.leaves, self.optimizers = [], []
        self.classes = set()        # the op classes of the nodes the step made
        self._ids = set()

    def forward(self, node, parents):
        self.classes.add(type(node))
        for parent in parents:
            if not parent._parents and not isinstance(parent, core.NetOp) \
                    and id(parent) not in self._ids:
                self._ids.add(id(parent))
                self.leaves.append(parent)

    def before(self, node):
        pass

    def after(self, node):
        pass


def _recording(optimizer):
    """The modifiers of ``optimizer`` that keep attributes (ClipGradNorm's last norm)."""
    return [modifier for modifier in optimizer.modifiers if hasattr(modifier, "__dict__")]


def _groups(optimizers):
    """Each optimizer's parameters, group by group (by identity)."""
    return [[[id(p) for p in group["params"]] for group in optimizer.param_groups]
            for optimizer in optimizers]


def _state_arrays(world):
    """``(what, array, lasting)`` for the arrays a step may change in place: its parameters'
    data and its buffers (``lasting``: they stay the holders' arrays) and its parameters'
    gradients (each back() may make new ones)."""
    state = [(f"the data of the parameter {leaf._describe()}", leaf._data, True)
             for leaf in world.leaves]
    state += [(f"{type(owner).__name__}.{name}", getattr(owner, name), True)
              for owner in world.owners for name in type(owner).buffers
              if isinstance(getattr(owner, name, None), _ndarray)]
    state += [(f"the gradient of {leaf._describe()}", leaf._g, False) for leaf in world.leaves
              if isinstance(leaf._g, _ndarray)]
    return state


def _live_step(step, optimizer, grads):
    for p, g, shared in grads:
        p._g, p._gshared = g, shared
    step(optimizer)


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
