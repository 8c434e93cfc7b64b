"""A captured step's inputs, and the state a call may change: what ``record`` refuses before
the step runs (``NotRecorded``: arrays on a GPU, inputs laid out as no copy is, inputs sharing
memory with what the step changes), what it keeps to put back when two inputs share memory, and
what it writes back after the call (the inputs the step wrote into, as eager does)."""
import copy

import numpy

from .. import backend
from ..arraylike import gradient_only_read
from ..core import NetVar

_ndarray = numpy.ndarray


class NotRecorded(Exception):
    """The step runs eagerly, nothing recorded: its parameters or inputs live on a GPU, or an
    input shares memory with its parameters or buffers (a copy would not see their updates).
    ``lasting``: the signature runs eagerly from then on (else this call only)."""

    def __init__(self, message, lasting=True):
        super().__init__(message)
        self.lasting = lasting


def check_inputs(world, inputs):
    """Refuse (NotRecorded) a call whose inputs or parameters no replay could take."""
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
    for k, value in enumerate(inputs):
        array = value._data if isinstance(value, NetVar) else value
        if isinstance(array, _ndarray) and not _copied_as_laid_out(array):
            raise NotRecorded(f"input {k} is laid out in memory as no copy of it is (negative "
                              "strides, gaps between elements, a broadcast, an odd address), "
                              "and the bits of a sum follow the layout: pass "
                              "numpy.ascontiguousarray(x)")
    for k in world.inputs_held:
        raise NotRecorded(f"input {k} is a parameter of the step's model or optimizer: a "
                          "replay's copy of it would not see the optimizer's update")
    for k, value in enumerate(inputs):
        if isinstance(value, NetVar) and any(value is other for other in inputs[:k]):
            raise NotRecorded(f"input {k} is a node given earlier too: each input is "
                              "copied into a buffer of its own")


def inputs_apart(inputs, state):
    """The pairs ``(j, k)`` of inputs that share memory without being one array given twice
    (each gets a buffer of its own: a write through one would not show through the other);
    an input sharing memory with ``state`` (``state_arrays``) is refused."""
    arrays = [(k, value._data if isinstance(value, NetVar) else value)
              for k, value in enumerate(inputs)]
    arrays = [(k, array) for k, array in arrays if isinstance(array, _ndarray)]
    for k, array in arrays:
        for what, other, _ in state:
            if numpy.may_share_memory(array, other):
                raise NotRecorded(f"input {k} shares memory with {what}, which the step "
                                  "may change: a replay's copy of the input would not "
                                  "see it (pass a copy to capture it)")
    return [(j, k) for j, a in arrays for k, b in arrays
            if j < k and inputs[j] is not inputs[k] and numpy.may_share_memory(a, b)]


def write_back(schedule, rec, given, handed, apart, before_call):
    """After the recorded call: each input the step wrote into written back into the caller's
    array (``given``), as eager, or the call refused: a write capture did not see; a write
    into one of two inputs sharing memory (``apart``), which first puts back what the call
    changed (``before_call``) and raises. Integer inputs no operation read are refused."""
    # (against what it was handed: the caller's array may have changed otherwise)
    written = [k for k, (buffer, was) in enumerate(zip(schedule.inputs, handed))
               if buffer is not None and buffer.tobytes() != was.tobytes()]
    for k, j in [(k, j) for k in written for pair in apart if k in pair
                 for j in pair if j != k][:1]:
        put_state_back(before_call)
        raise RuntimeError(
            f"capture: the step wrote into input {k}, which shares memory with input {j}; the "
            "call ran on a copy of each, where the write did not show through the other as it "
            "does eagerly, so what it changed is put back (the inputs, and the parameters, "
            "optimizers and buffers found before it ran): give the step arrays of their own")
    for k, (array, buffer) in enumerate(zip(given, schedule.inputs)):
        if buffer is not None:
            buffer.flags.writeable = True
        if k in written:                # as eager
            if id(buffer) not in rec.inputs_written:
                rec.refuse(f"the step writes into input {k} where capture does not see it "
                           "(x.flat[i] = v, np.nditer): a replay hands it a copy")
            numpy.copyto(array, buffer)
    read = set().union(*(sources for *_, sources in rec.program))
    for k, buffer in enumerate(schedule.inputs):
        # integers or booleans no recorded operation reads: an index NumPy took itself
        if buffer is not None and buffer.dtype.kind in "biu" and \
                ("input", k) not in read and k not in rec.keyed:
            rec.refuse(f"input {k} is read by no operation capture saw: NumPy reads an "
                       "index itself (table[y], np.take(table, y) with a plain table), "
                       "without asking it; index a node (nn.constant(table)[y] built "
                       "outside the step, nn.layers.Embedding) or pass the table too")


def state_before(world, inputs):
    """What a call may change, as copies: its parameters' data and gradients (and its node
    inputs' gradients), its optimizers' states, its buffers and counters, nnkit's generator."""
    nodes = [value for value in inputs if isinstance(value, NetVar)]
    return ([(leaf, leaf._data.copy(), None if leaf._g is None else leaf._g.copy())
             for leaf in world.leaves] + [(node, None, node._g) for node in nodes],
            [(optimizer, copy.deepcopy(optimizer.state), [
                (modifier, copy.copy(vars(modifier))) for modifier in optimizer.modifiers
                if hasattr(modifier, "__dict__")]) for optimizer in world.optimizers],
            [(owner, name, copy.copy(getattr(owner, name, None))) for owner in world.owners
             for name in type(owner).buffers + getattr(type(owner), "counters", ())],
            backend.get_rng_state())


def put_state_back(state):
    leaves, optimizers, held, rng = state
    for leaf, data, g in leaves:
        if data is not None:
            leaf._data[...] = data
        leaf._g, leaf._gshared = g, False
    for optimizer, saved, modifiers in optimizers:
        optimizer.state[:] = saved
        for modifier, record in modifiers:      # (what they record: a clipped norm)
            vars(modifier).clear()
            vars(modifier).update(record)
    for owner, name, value in held:
        setattr(owner, name, value)
    backend.rewind_rng(rng)


def _copied_as_laid_out(array):
    """Whether the buffer a replay copies ``array`` into (``_hand_in``) is laid out as it is:
    aligned, with its strides (a sum's last bits follow them: negative strides, gaps between
    elements and a broadcast all changed them)."""
    copy = numpy.array(array, copy=True, subok=False)
    return array.flags.aligned and _strides(copy) == _strides(array)


def _strides(array):
    return tuple(stride for n, stride in zip(array.shape, array.strides) if n > 1)


def state_arrays(world, inputs=()):
    """``(what, array, lasting)`` for the arrays a step may change in place: its parameters'
    data and its buffers (``lasting``: they stay the holders' arrays), its parameters' and
    its node inputs' gradients (each back() may make new ones) and its optimizers' states."""
    state = [(f"the data of the parameter {leaf._describe()}", leaf._data, True)
             for leaf in world.leaves]
    state += [(f"{type(owner).__name__}.{name}", getattr(owner, name), True)
              for owner in world.owners for name in type(owner).buffers
              if isinstance(getattr(owner, name, None), _ndarray)]
    state += [(f"the gradient of {leaf._describe()}", leaf._g, False) for leaf in world.leaves
              if isinstance(leaf._g, _ndarray)]
    state += [(f"the gradient of input {k}", value._g, False) for k, value in enumerate(inputs)
              if isinstance(value, NetVar) and isinstance(value._g, _ndarray)]
    state += [(f"the state '{key}' of parameter {position} of a {type(optimizer).__name__}",
               value, False) for optimizer in world.optimizers
              for position, entries in enumerate(optimizer.state)
              for key, value in entries.items() if isinstance(value, _ndarray)]
    return state
