"""``Schedule``: one signature's recording, as the first call made it (``first_call.py``):
``stale`` says whether something the step reads changed, ``replay`` hands the inputs over, runs
the program and hands out what eager would leave; ``save``/``restore`` serve the check against
eager."""
import collections
import copy
import operator

import numpy

from .. import backend
from ..core import NetVar, constant
from ..optim import flat
from .instructions import GuardFailed, ReplayStopped, _arrays, _live_step, _root, live_step_of
from .program import read_from, readers, rehome
from .guards import changed, failed_guard

_COPIED = 64 * 1024     # bytes per reading instruction: an input smaller is copied in

_ndarray = numpy.ndarray


class Schedule:
    """One signature's recording: the program and what a replay hands in and out."""

    records_in_a_row = 0
    verified = False            # its first replay was checked against eager
    homed = False               # its gradients computed into the optimizer's flat arrays
    midway = ()                 # (instructions run before it, what, value): see _hand_out
    read_after_step = False     # an instruction after an optimizer's step reads an input
    last_calls = ()             # (module, name): a node of the last call it keeps (last_call)

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
            return "an optimizer's parameters, groups or modifiers changed"
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
        except GuardFailed as failure:
            done = self._index_of(function, args)
            if done >= self.lasting:
                # (recording refuses what could stop a replay here): recording again would
                # run the step a second time over what the replay changed, so it stops
                self._hand_out(inputs, done)
                raise ReplayStopped(f"capture: a replay stopped ({failure}) after the step had "
                                   "changed what lasts (the optimizer's step), which it keeps as "
                                   "eager made it; the rest of this call did not run") from failure
            if saved is not None:
                backend.rewind_rng(saved)
            raise
        except BaseException as error:  # the optimizer refused, a check raised: eager's state
            done = self._index_of(function, args)
            if done < self.lasting and isinstance(error, Exception):
                # nothing lasting changed yet: recorded again, eagerly (the step may catch it)
                if saved is not None:
                    backend.rewind_rng(saved)
                raise GuardFailed(f"an array operation raised at a replay ({type(error).__name__}: "
                                  f"{error})") from error
            self._hand_out(inputs, done)
            raise
        self._hand_out(inputs, len(self.program))
        return _handed_out(self.outputs)

    def _hand_out(self, inputs, done):
        """Hand out what eager leaves after a step: gradients, buffers and counters; after an
        instruction raised (``done`` of them ran), what eager held then (the parameters'
        gradients those instructions wrote, ``_hand_out_midway``)."""
        ran = self.writers
        for module, name in self.last_calls:
            setattr(module, name, Replayed(f"{type(module).__name__}.{name}"))
        for leaf, buffer in self.grads_out:
            if ran.get(id(buffer), -1) < done:
                leaf._g, leaf._gshared = buffer.copy(), True
        if done < len(self.program):
            self._hand_out_midway(inputs, done)
        else:
            for position, buffer in self.input_grads:        # a node input's gradient
                inputs[position]._g, inputs[position]._gshared = buffer.copy(), True
            for holder, attribute, buffer, how in self.outs:
                if how == "rebind":
                    setattr(holder, attribute, buffer.copy())
                else:
                    numpy.copyto(getattr(holder, attribute), buffer)
            for owner, name, delta in self.counters:
                setattr(owner, name, getattr(owner, name) + delta)
        for index in range(done, len(self.program)):
            live = live_step_of(*self.program[index])
            if live is None:
                continue
            for p, g, _ in live[2]:
                if index == done:       # the step that raised: reset what it reached, as eager
                    if p._g is not None and p._g is g:
                        p._g, p._gshared = g.copy(), True
                elif g is not None and self.grads_written[index, id(p)] < done:
                    p._g, p._gshared = g.copy(), True   # an optimizer that did not step keeps
                    # the gradients written before, as eagerly

    def _hand_out_midway(self, inputs, done):
        """After a replay that raised at instruction ``done``: each buffer and node input's
        gradient as eager held it then, as the step last rebound it (BatchNorm's statistics
        at each update, a gradient at each back()) or wrote into it (what the first ``done``
        instructions wrote), and each counter advanced as often as eager advanced it."""
        def written(buffer):
            return self.first_write.get(id(_root(buffer)), done) < done

        now = {}        # (what, which, name) -> (holder, value, written in place)
        for holder, attribute, buffer, how in self.outs:
            if how == "write" and written(buffer):
                now[("object", holder, attribute)] = holder, buffer, True
        for position, entry in self.input_entries:      # a gradient at entry, added into
            if written(entry):
                now[("input", position, "_g")] = inputs[position], entry, False
        for before, key, value in self.midway:
            if before > done:
                break
            holder = inputs[key[1]] if key[0] == "input" else key[1]
            if type(value) is int:          # a counter's step
                setattr(holder, key[2], getattr(holder, key[2]) + value)
            else:
                now[key] = holder, value, False
        for (_, _, name), (holder, value, in_place) in now.items():
            if in_place:
                numpy.copyto(getattr(holder, name), value)
            else:
                setattr(holder, name, None if value is None else value.copy())
                if name == "_g":
                    holder._gshared = True

    def _note_writers(self, writes):
        """The first and the last instruction that write each buffer (``writes``: the buffers
        each instruction writes), and for each gradient a replay hands out, the last."""
        last, first = self.last_write, self.first_write = {}, {}
        for index, keys in enumerate(writes):
            for key in keys:
                last[key] = index
                first.setdefault(key, index)
        self.writers = {id(buffer): last.get(id(_root(buffer)), -1)
                        for _, buffer in self.grads_out}
        # (before their gradients may be computed into an optimizer's flat array elsewhere)
        self.grads_written = {
            (index, id(p)): -1 if g is None else last.get(id(_root(g)), -1)
            for index, (function, args) in enumerate(self.program)
            for p, g, _ in (live_step_of(function, args) or (None, None, ()))[2]}

    def _index_of(self, function, args):
        """The position of the instruction ``(function, args)`` in the program."""
        return next((index for index, (f, a) in enumerate(self.program)
                     if f is function and a is args), len(self.program))

    def _pinned(self):
        """The arrays a replay hands in or out, or that are the parameters' data: buffers of
        their own, which no other shares memory with or is moved into."""
        return (self.inputs, self.entries, self.input_entries, self.grads_out,
                self.input_grads, self.outs, self.outputs, [leaf._data for leaf in self.leaves],
                [value for _, _, value in self.midway])

    def _home_gradients(self):
        """Once, at the second replay (the first, checked against eager, made the optimizer's
        runs anew): each gradient that the optimizer's step would copy into a flat array
        (small parameters updated together, ``optim/flat.py``) is computed straight into its
        place there, and the step finds it there (W2: 6 copies, 18 µs of a 530 µs step). A
        gradient whose bytes another buffer shares in part, that is handed out, read after the
        step or written by no instruction, and those of an optimizer stepped twice, stay where
        they are; when
        the optimizer makes its runs anew, the step copies again."""
        self.homed = True
        moved = {k for k, (buffer, reading) in enumerate(zip(self.inputs, self.reading))
                 if reading is not buffer}
        read_from(self.program, self.readers, self.inputs, moved)     # the buffers' views
        pinned = self._pinned()
        steps = [(index, args) for index, (function, args) in enumerate(self.program)
                 if function is _live_step]     # (one under the step's errstate stays as it is)
        times = collections.Counter(id(optimizer) for _, (_, optimizer, _) in steps)
        for index, (_, optimizer, grads) in steps:
            if times[id(optimizer)] > 1:    # (the first step's gradients may live on past
                continue                    # the second's, which would share their place)
            # (read after the step, a gradient must be back()'s: the step copies a modifier's
            # new gradient into the flat array)
            after = {id(_root(array)) for function, args in self.program[index + 1:]
                     for array in _arrays((args, getattr(function, "keywords", None)))}
            homes = flat.gradient_homes(optimizer)
            for p, g, _ in grads:
                home = homes.get(id(p))
                # (a gradient no instruction writes, fixed by the signature, stays a constant
                # where it is: another signature or an eager step writes the flat array too)
                if home is not None and g is not None and g.shape == home.shape and \
                        g.dtype == home.dtype and g.flags.c_contiguous and \
                        self.last_write.get(id(_root(g)), -1) >= 0 and \
                        id(_root(g)) not in after:
                    self.program = rehome(self.program, pinned, g, home) or self.program
        self._find_readers()

    def _note_late_readers(self):
        """Whether an instruction after an optimizer's step reads an input's buffer (an input
        that is that optimizer's state would read it changed, eagerly)."""
        steps = [index for index, (function, args) in enumerate(self.program)
                 if live_step_of(function, args)]
        roots = {id(_root(buffer)) for buffer in self.inputs if buffer is not None}
        self.read_after_step = bool(steps) and any(
            id(_root(array)) in roots for function, args in self.program[steps[0] + 1:]
            for array in _arrays((args, getattr(function, "keywords", None))))

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
        # what the step changes besides its parameters' data and buffers: eager would read it
        # through the input as it changes (gradients: eager adds into them)
        changing = [leaf._g for leaf in self.leaves if leaf._g is not None] + [
            value._g for value in inputs if isinstance(value, NetVar) and value._g is not None]
        changing = {id(_root(array)) for array in changing} if changing else set()
        for optimizer in self.world.optimizers if self.read_after_step else ():
            # (its state changes in its step: only an input read after that could see it;
            # NumPy's views name their owner as base)
            changing.update(id(value if value.base is None else value.base)
                            for state in optimizer.state for value in state.values()
                            if type(value) is _ndarray)
        for k, value in enumerate(inputs):
            buffer = self.inputs[k]
            if buffer is None:
                continue
            array = value._data if isinstance(value, NetVar) else value
            root = id(array if array.base is None else _root(array))
            if root in self.state_roots or root in changing:
                raise GuardFailed(f"input {k} shares memory with a parameter, a gradient, a "
                                  "buffer or an optimizer's state")
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
        # the objects that held it (restore puts those very arrays and dicts back: a user may
        # hold them, and what a step made or returned is left alone)
        objects = state["objects"] = {}
        for leaf in self.leaves:        # (read-only data: no step changes it)
            if leaf._data.flags.writeable:
                state[("data", id(leaf))] = leaf._data.copy()
        for holder, attribute, _ in self.entries:
            key = ("entry", id(holder), attribute)
            objects[key] = getattr(holder, attribute)
            state[key] = numpy.array(objects[key])
        for module, name in self.last_calls:        # eager's nodes, or a replay's marker
            objects[("last call", id(module), name)] = getattr(module, name, None)
        for optimizer in self.world.optimizers:
            state[("optimizer", id(optimizer))] = copy.deepcopy(optimizer.state)
            objects[("optimizer", id(optimizer))] = [(each, dict(each)) for each in optimizer.state]
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
        """Put back what ``save`` saved: the very arrays and dicts that held it, with the saved
        values (a generator, a buffer or an optimizer's state a user holds stays the live one;
        what the step made in between is left as it is)."""
        objects = state["objects"]
        for leaf in self.leaves:
            if ("data", id(leaf)) in state:
                leaf._data[...] = state[("data", id(leaf))]
        for holder, attribute, _ in self.entries:
            key = ("entry", id(holder), attribute)
            setattr(holder, attribute, _put_back(objects[key], state[key]))
        for module, name in self.last_calls:
            setattr(module, name, objects[("last call", id(module), name)])
        for optimizer in self.world.optimizers:
            saved = state[("optimizer", id(optimizer))]
            optimizer.state[:] = [held for held, _ in objects[("optimizer", id(optimizer))]]
            for (held, items), was in zip(objects[("optimizer", id(optimizer))], saved):
                held.clear()
                held.update((key, _put_back(items[key], value)) for key, value in was.items())
            flat.recount(optimizer)
            for modifier, saved in zip(_recording(optimizer), state[("modifiers", id(optimizer))]):
                vars(modifier).clear()
                vars(modifier).update(saved)
        for owner, name, _ in self.counters:
            setattr(owner, name, state[("counter", id(owner), name)])
        backend.rewind_rng(state["rng"])
        for leaf, g, shared in state["holders"]:
            leaf._g, leaf._gshared = (None, shared) if g is None else (g.copy(), shared)


class Replayed:
    """What a Module's ``last_call`` attribute holds after a replay, which builds no nodes:
    any use of it raises AttributeError, naming the attribute and the way to get its value
    (an AttributeError: ``hasattr`` and the walks over a model take it as no node)."""
    __slots__ = ("where",)

    def __init__(self, where):
        self.where = where

    def __reduce__(self):           # (copies and pickles of a model keep it)
        return Replayed, (self.where,)

    def __getattr__(self, name):
        if name.startswith("__") or name == "where":    # (copy's and pickle's probes)
            raise AttributeError(name)
        raise AttributeError(
            f"{self.where}: the last call was a replay of nn.capture, which builds no nodes, so "
            f"it holds none (reading .{name}); return what you need from the captured step "
            "(its loss, the model's final_state), or call the model outside it")

    def __repr__(self):
        return f"<{self.where} after a replay of nn.capture: no node>"


class LossValue(NetVar):
    """What a replay hands out for a loss the step returns: its value (a node needing no
    gradient, as every node a replay hands out) and the loss's ``denominator``, what it divided
    by (B rows, Σ w of class weights, the valid positions), by which the Trainer weighs its
    batch."""
    __slots__ = ("denominator",)


def _put_back(held, saved):
    """What held ``saved``'s values (an array), with them again; else a copy of ``saved``."""
    if type(held) is _ndarray and type(saved) is _ndarray and held.shape == saved.shape and \
            held.dtype == saved.dtype and held.flags.writeable:
        numpy.copyto(held, saved)
        return held
    return copy.deepcopy(saved)


def _recording(optimizer):
    """The modifiers of ``optimizer`` that keep attributes (ClipGradNorm's last norm)."""
    return [modifier for modifier in optimizer.modifiers if hasattr(modifier, "__dict__")]


def _groups(optimizers):
    """Each optimizer's parameters, group by group, and its modifiers (by identity): a modifier
    attached since the recording is met by a recording of its own, which sees what it keeps."""
    return [([[id(p) for p in group["params"]] for group in optimizer.param_groups],
             [id(modifier) for modifier in optimizer.modifiers]) for optimizer in optimizers]


def _entry_grads(leaves, before=None):
    """Whether each leaf had a gradient at entry (a replay adds into it as eager did, or starts
    it): from ``before`` (id -> the same, taken before the recording). Whether it was shared
    changes only which array eager adds into, not the values: reading ``p.g`` changes it, and
    must not make the next call record again."""
    now = [leaf._g is None for leaf in leaves]
    if before is None:
        return now
    return [before.get(id(leaf), True) for leaf in leaves]


def _handed_out(spec):
    kind, value = spec
    if isinstance(kind, dict):          # an empty copy of the dict the step returned
        handed = copy.copy(kind)
        handed.update((key, _handed_out(item)) for key, item in value.items())
        return handed
    if kind == "node":                  # (an integer or boolean one keeps its dtype too)
        value = value.copy()
        return constant(value) if value.dtype.kind == "f" else constant(value, dtype=value.dtype)
    if kind == "loss":                  # (data, the spec of its denominator)
        data, denominator = value
        node = LossValue(data.copy(), requires_grad=False)
        node._data = data.copy()            # (as it is: NetVar makes a 0-d array a row)
        node.denominator = _handed_out(denominator)
        return node
    if kind == "array":
        return value.copy()
    if kind == "scalar":                # a NumPy scalar, as eager returns it
        return value[()]
    if kind == "value":
        return value
    items = [_handed_out(item) for item in value]
    return kind._make(items) if hasattr(kind, "_make") else kind(items)    # (a namedtuple)
