"""How the first call with a signature makes its ``Schedule``: ``record`` hands the step Traced
arrays (copies of its inputs, its parameters' data, copies of the gradients and buffers it
starts from), runs it eagerly while NumPy is patched to write down each array operation
(``record.py``) and every Python function it runs is read (``world.py``), takes the plain arrays
back out, and refuses what a replay could not do as eager does (``NotRecorded`` before the step
runs, ``inputs.py``; ``Unrecordable`` after it ran)."""
import bisect
import copy
import gc
import numbers
import sys
import threading

import numpy

from .. import core
from ..core import NetVar, constant
from ..module import Module
from ..nodecopy import attributes
from ..ops.loss import Loss
from ..optim.base import Optimizer
from .instructions import _draw, _live_step, _root, live_step_of
from .program import program, written
from .record import Recording, Traced, Unrecordable, patched, plain
from .schedule import Schedule, _entry_grads, _groups, _handed_out
from .guards import changed, failed_guard
from .inputs import check_inputs, inputs_apart, state_arrays, state_before, write_back
from .world import World, op_classes

_ndarray = numpy.ndarray
BOUND = "_captured_"    # where an object keeps the capture of its method (Captured.__get__)


class Meeting:
    """The observer a recording attaches: it meets every leaf the step's ops read."""
    checks_values = False

    def __init__(self):
        self.leaves, self.optimizers = [], []
        self.classes = set()        # the op classes of the nodes the step made
        self._ids = set()
        self.thread = threading.get_ident()

    def forward(self, node, parents):
        if threading.get_ident() != self.thread:    # another thread's eager step: not ours
            return
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


def record(fn, inputs):
    """Run ``fn(*inputs)`` eagerly while recording: ``(schedule, result)``, or Unrecordable
    (the step ran eagerly all the same; its result is the exception's ``result``)."""
    world = World(fn, inputs)
    check_inputs(world, inputs)
    state = state_arrays(world, inputs)
    # inputs sharing memory (not one array given twice: one buffer) are copied apart, where a
    # write through one would not show through the other: the state before the call is kept
    # to be put back should the step write into one (then the call raises)
    apart = inputs_apart(inputs, state)
    before_call = state_before(world, inputs) if apart else None
    schedule, rec = Schedule(), Recording()
    schedule.world, schedule.swaps, schedule.entries = world, [], []
    start = constant(numpy.zeros(())).index     # leaves from here on: the step's own
    before = world.snapshot(optimizers=True)
    counters = [(owner, name, getattr(owner, name))
                for owner in world.owners for name in getattr(type(owner), "counters", ())]
    entry_grads = {id(leaf): _entry_grads([leaf])[0] for leaf in world.leaves}
    given = [value._data if isinstance(value, NetVar) else value for value in inputs]
    traced_inputs = _hand_in(schedule, rec, inputs)
    handed = [None if buffer is None else buffer.copy() for buffer in schedule.inputs]
    for owner in world.owners:      # what a replay that raises midway hands out (Schedule)
        for name in type(owner).buffers + getattr(type(owner), "counters", ()):
            rec.watch(("object", owner, name), owner, name)
    for k, value in enumerate(inputs):
        if isinstance(value, NetVar):
            rec.watch(("input", k, "_g"), value, "_g")
    kept_before = [(module, name, getattr(module, name, None)) for module in world.modules
                   for name in type(module).last_call]
    met = Meeting()
    result, error = _run(rec, met, fn, traced_inputs, world)
    for holder, attribute, array in schedule.earlier:
        setattr(holder, attribute, array)
    rec.note_changes()
    for optimizer in met.optimizers:        # kept where only the step's code finds it
        world._add(optimizer, world.optimizers)
    schedule.outputs = _outputs(result, rec)
    for leaf in met.leaves:
        if leaf.index < start and not any(leaf is known for known in world.leaves) \
                and leaf.requires_grad and type(leaf._data) is not Traced:
            rec.refuse(f"the step uses a parameter capture did not find before it ran "
                       f"({leaf._describe()}): keep parameters in a Module, an optimizer, "
                       "or a name the step reads")
    # (an optimizer found as the step ran: its parameters' gradients at entry are checked too)
    stepped = [p for optimizer in world.optimizers for group in optimizer.param_groups
               for p in group["params"]]
    schedule.leaves = [leaf for leaf in {id(leaf): leaf for leaf in world.leaves +
                                         met.leaves + stepped}.values()   # (each once)
                       if leaf.index < start and all(leaf is not value for value in inputs)]
    schedule.input_grads = [(k, plain(value._g)) for k, value in enumerate(inputs)
                            if isinstance(value, NetVar) and type(value._g) is Traced]
    schedule.counters = [(owner, name, getattr(owner, name) - value)
                         for owner, name, value in counters]
    schedule.last_calls = [(module, name) for module in world.modules     # (Module.last_call)
                           for name in type(module).last_call if _made(module, name, start)]
    for module, name, was in kept_before:
        if getattr(module, name, None) is not was and not _made(module, name, start):
            rec.refuse(f"the step set {type(module).__name__}.{name} to a "
                       f"{type(getattr(module, name, None)).__name__}, where a replay would "
                       "leave a marker for the node it did not make: last_call names "
                       "attributes that a call sets to one node")
    _take_out(schedule, rec, inputs)
    _copied_out(world.modules, start)
    write_back(schedule, rec, given, handed, apart, before_call)
    earlier = sorted({source[1] for *_, sources in rec.program for source in sources
                      if type(source) is tuple and source[0] == "earlier"})
    if earlier:
        rec.refuse(f"the step reads {earlier[0]}, a node of the call before, which a replay "
                   "would not see change: return what the next call needs from the step and "
                   "pass it in (return loss, *model.final_state; give the next call their "
                   "detached copies as its state)")
    gc.collect()        # the recorded graph's cycles: freed now, not amid later steps
    moved = failed_guard(world.guards)
    if moved:           # the step itself changed what it reads: a counter, a schedule
        rec.refuse(f"the step changes Python state a replay would not: {moved}")
    ignore = {(id(owner), name) for owner, name, _ in schedule.counters}
    for holder, name in changed(before, world.snapshot(optimizers=True), ignore):
        if isinstance(name, str) and name.startswith(BOUND):
            continue        # (the capture of a method, bound to the object as the step ran)
        owner = ("a parameter group of an optimizer" if isinstance(holder, dict)
                 else type(holder).__name__)
        if isinstance(holder, Module) and _made(holder, name, start):
            rec.refuse(f"the step set {owner}.{name} to a node it made, which a replay, "
                       f"making no nodes, would not: declare last_call = ({name!r},) on "
                       f"{owner} to replay it (docs/capture.md, 'Ops and capture')")
            continue
        rec.refuse(f"the step changed {owner}'s {name}, which a replay would not (change "
                   "it between calls: a schedule's step() outside the captured step)")
    eager_result = _handed_out(schedule.outputs)
    if error is not None:
        raise error
    if rec.refusals:
        refusal = Unrecordable("; ".join(rec.refusals))
        refusal.result = eager_result
        raise refusal
    _compile(schedule, rec, world, met, state, entry_grads)
    return schedule, eager_result


def _made(module, name, start):
    """Whether ``module.name`` holds a node the step made (created from index ``start`` on)."""
    value = getattr(module, name, None)
    return isinstance(value, NetVar) and value.index >= start


def _compile(schedule, rec, world, met, state, entry_grads):
    """Fill ``schedule`` from the recording ``rec`` of a call that raised and refused nothing:
    the program a replay runs, and what its guards compare before each replay."""
    schedule.midway = [(before, key, plain(value) if type(value) is Traced else
                        value - old if type(value) is int else value)
                       for before, key, value, old in rec.changes]
    schedule.program, writes, origins = program(rec, pinned=schedule._pinned(),
                                                trusted=(_live_step,))
    # (each change after the instructions that came before it, as the program counts them)
    schedule.midway = [(bisect.bisect_left(origins, before), key, value)
                       for before, key, value in schedule.midway]
    schedule._note_writers(writes)
    data = {id(_root(leaf._data)) for leaf in schedule.leaves}
    # the first instruction that changes what a call leaves (the optimizer, a parameter's data)
    schedule.lasting = next((index for index, ((function, _), written) in enumerate(
        zip(schedule.program, writes)) if live_step_of(function, _) or written & data),
        len(schedule.program))
    schedule._find_readers()
    schedule._note_late_readers()
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


def _swap(schedule, holder, attribute, twin):
    schedule.swaps.append((holder, attribute, getattr(holder, attribute), twin))
    setattr(holder, attribute, twin)


def _hand_in(schedule, rec, inputs):
    """Give the step Traced arrays: copies of its inputs (the input buffers), its
    parameters' data (themselves: the optimizer updates them in place), copies of their
    gradients and of the buffers (entries, copied in at each replay). Returns the inputs."""
    schedule.inputs, schedule.input_entries, traced = [], [], []
    for k, value in enumerate(inputs):
        if not isinstance(value, (_ndarray, NetVar)):
            schedule.inputs.append(None)
            traced.append(value)
            continue
        first = next(j for j, other in enumerate(inputs) if other is value)
        if first < k:           # an array given twice: one buffer, as eager reads one array
            schedule.inputs.append(schedule.inputs[first])
            traced.append(traced[first])
            continue
        buffer = numpy.array(value._data if isinstance(value, NetVar) else value, copy=True,
                             subok=False)
        rec.vary(buffer, ("input", len(schedule.inputs)))
        rec.inputs.add(id(buffer))
        schedule.inputs.append(buffer)
        if not (value._data if isinstance(value, NetVar) else value).flags.writeable:
            buffer.flags.writeable = False      # a write into it raises, as eagerly (until
            # the step has run: a replay copies the next input in)
        twin = rec.traced_view(buffer)
        if isinstance(value, NetVar):
            _swap(schedule, value, "_data", twin)
            if value._g is not None:    # a gradient it adds to: the caller's, each call
                entry = numpy.array(value._g, copy=True, subok=False)
                rec.vary(entry, "state")
                schedule.input_entries.append((len(schedule.inputs) - 1, entry))
                _swap(schedule, value, "_g", rec.traced_view(entry))
        traced.append(value if isinstance(value, NetVar) else twin)
    for leaf in schedule.world.leaves:
        rec.vary(leaf._data, "state")
        rec.kept.add(id(_root(leaf._data)))
        _swap(schedule, leaf, "_data", rec.traced_view(leaf._data))
        if leaf._g is not None:
            _enter(schedule, rec, leaf, "_g")
    schedule.earlier = []       # the arrays of a call before's nodes (Module.last_call):
    known = set(rec.sources)    # what reads them is refused (see record)
    for module in schedule.world.modules:
        for name in type(module).last_call:
            for holder, attribute in _arrays_kept(getattr(module, name, None)):
                array = getattr(holder, attribute)
                if id(_root(array)) in known:       # (a parameter's data, viewed)
                    continue
                rec.vary(array, ("earlier", f"{type(module).__name__}.{name}"))
                schedule.earlier.append((holder, attribute, array))
                setattr(holder, attribute, rec.traced_view(array))
    for owner in schedule.world.owners:
        for name in type(owner).buffers:
            if isinstance(getattr(owner, name, None), _ndarray):
                _enter(schedule, rec, owner, name)
    return traced


def _copied_out(modules, start):
    """The nodes this call left in Modules' ``last_call`` attributes, and the graph the step
    made behind them, given copies of their arrays: an eager call's own, where the recording's
    are the replay's buffers, which every replay overwrites (a node the user kept changed)."""
    stack = [getattr(module, name, None) for module in modules for name in type(module).last_call]
    seen = set()
    while stack:
        node = stack.pop()
        if not isinstance(node, NetVar) or node.index < start or id(node) in seen:
            continue            # (a parameter, an input: their own arrays, put back)
        seen.add(id(node))
        for name, value in list(attributes(node)):      # (set as it goes)
            if isinstance(value, _ndarray):             # (a Traced array too)
                setattr(node, name, plain(value).copy())
            elif isinstance(value, NetVar):
                stack.append(value)
        stack += node._parents


def _arrays_kept(value):
    """``(holder, attribute)`` of each array the node ``value`` holds, and the nodes it holds
    (a recurrent op's ``final`` reads the op's ``hidden``)."""
    if not isinstance(value, NetVar):
        return []
    nodes = [value] + [node for _, node in attributes(value)
                       if isinstance(node, NetVar) and node is not value]
    return [(node, name) for node in nodes for name, array in attributes(node)
            if type(array) is _ndarray]


def _enter(schedule, rec, holder, attribute):
    entry = numpy.array(getattr(holder, attribute), copy=True, subok=False)
    rec.vary(entry, "state")
    schedule.entries.append((holder, attribute, entry))
    _swap(schedule, holder, attribute, rec.traced_view(entry))


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
        for p in params:        # a gradient from before the call that no entry hands in
            if type(p._g) is _ndarray and all(p is not leaf for leaf in world.leaves):
                rec.refuse(f"{type(optimizer).__name__}.step() updates {p._describe()} from "
                           "a gradient it had before the call, and capture found the optimizer "
                           "only as the step ran: name it (or its model) in the step")
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
            _live_step(live_step, optimizer, grads)     # (as a replay runs it)
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
            if frame.f_code is live_step.__code__ and not rec.paused:
                rec.refuse("the step calls an optimizer's step() through a reference taken "
                           "before it was captured (opt.step kept or wrapped on the optimizer): "
                           "its update would be replayed with this call's learning rate; wrap "
                           "it after capture, or call optimizer.step() inside the step")
            world.meet(frame, live=rec.paused)
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


def _take_out(schedule, rec, inputs):
    """Put the plain arrays back where the Traced ones were handed in, and note what each
    replay hands out: gradients (copies), buffers the step rebinds (copies) or writes into
    (copied into the holder's array). A parameter the step assigned new data keeps it."""
    schedule.grads_out = [(leaf, plain(leaf._g)) for leaf in schedule.leaves
                      if type(leaf._g) is Traced]
    schedule.outs = []          # (holder, attribute, buffer, "rebind" or "write")
    originals = {(id(holder), attribute): old for holder, attribute, old, _ in schedule.swaps}
    for holder, attribute, old, twin in schedule.swaps:
        value = getattr(holder, attribute)
        if attribute != "_data":
            continue
        if value is twin:
            holder._data = old
        else:
            rec.refuse(f"the step assigned new data to {holder._describe()}")
            holder._data = plain(value).copy() if type(value) is Traced else value
    for holder, attribute, entry in schedule.entries:
        if attribute == "_g":       # a gradient at entry: handed out with grads_out
            continue
        value, original = getattr(holder, attribute), originals[(id(holder), attribute)]
        if type(value) is not Traced:
            rec.refuse(f"the step assigned {type(holder).__name__}.{attribute} a value "
                       "capture did not see computed")
        elif _root(plain(value)) is not entry:
            schedule.outs.append((holder, attribute, plain(value), "rebind"))
            setattr(holder, attribute, plain(value).copy())
        else:
            setattr(holder, attribute, original)
            if written(rec, entry):
                numpy.copyto(original, entry)
                schedule.outs.append((holder, attribute, entry, "write"))
    for leaf, buffer in schedule.grads_out:
        leaf._g, leaf._gshared = buffer.copy(), True
    for position, buffer in schedule.input_grads:
        inputs[position]._g, inputs[position]._gshared = buffer.copy(), True


def _outputs(result, rec):
    """What the step returned, with each node and array as the buffer its value is in."""
    if isinstance(result, NetVar):
        data = result._data
        if type(data) is not Traced:
            rec.refuse("the step returns a node whose value capture did not see computed")
            return ("value", result)
        # a loss goes out with what it divided by, by which the Trainer weighs its batch
        denominator = getattr(result, "denominator", None) if isinstance(result, Loss) else None
        if type(denominator) is Traced or isinstance(denominator, numbers.Number):
            return ("loss", (plain(data), _outputs(denominator, rec)))
        return ("node", plain(data))
    if type(result) is Traced:
        return ("scalar" if id(result) in rec.scalars else "array", plain(result))
    if isinstance(result, _ndarray):
        rec.refuse("the step returns an array capture did not see computed")
        return ("value", result)
    if isinstance(result, list) or type(result) is tuple or hasattr(result, "_make"):
        return (type(result), [_outputs(item, rec) for item in result])    # (a namedtuple)
    if isinstance(result, dict):            # an OrderedDict, a defaultdict: an empty copy
        shell = copy.copy(result)
        shell.clear()
        return (shell, {key: _outputs(item, rec) for key, item in result.items()})
    if isinstance(result, tuple):
        rec.refuse(f"the step returns a {type(result).__name__}: return a tuple or namedtuple")
        return ("value", result)
    if not isinstance(result, (int, float, complex, bool, str, type(None))):
        rec.refuse(f"the step returns a {type(result).__name__}")
    return ("value", result)
