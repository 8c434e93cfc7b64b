"""FFN: the article's feed-forward convenience class, a list of (OpClass, *args) entries."""

__all__ = ['FFN']
import numpy

from .. import backend
from ..core import NetOp, NetVar
from ..io import saved_with_topology
from ..module import Module
from ..ops.loss import Loss
from ..ops.normalization import BatchNormState


@saved_with_topology         # nn.save stores the topology, nn.load rebuilds it as FFN(*entries)
class FFN(Module):
    """A feed-forward network described by its topology, a mutable list of entries.

    Each entry is ``(OpClass, *args)``: calling ``net(x)`` builds ``node = OpClass(node, *args)``
    for each entry in order, starting from ``x``, and returns the last node. ``net.back()``
    backpropagates from that node. ``net.vars`` lists the trainable parameters: the NetVar
    arguments that require a gradient, never the targets of a Loss entry.

        net = FFN((Multiply, rand2(2, 3)), (Add, rand2(3)), (ReLU,))
        net.topology.append((CELoss, target))   # train against a loss ...
        net.topology.pop()                     # ... and remove it afterwards

    An entry may also be ``(other_ffn,)`` (networks compose: ``FFN((encoder,), (decoder,))``),
    another Module such as a layer or a ``SequenceModel``, or ``(function, *args)`` for a
    function of a node that returns a node. ``vars`` includes the parameters of the FFNs and
    modules inside, as entries or as arguments (a layer passed to a function, a model entry's
    own arguments such as an RNN layer's ``h0``), each parameter once, in topology order
    (shared weights are listed once): the same parameters as ``named_vars()``.
    FFN is a Module: ``named_vars()`` names a parameter by its place, ``topology.<entry>.<argument>``
    (``topology.0.1`` is the W of ``(Multiply, W)``), and BatchNorm running statistics passed as
    an argument are its buffers (``state()`` saves them).

    Errors: an entry that is not a tuple starting with a NetOp class, an FFN or a callable
    (e.g. ``(int,)`` or ``(3,)``), and an FFN entry with arguments, raise TypeError when the
    network is built or called; an op's own error is re-raised naming the entry. ``vars``
    raises ValueError for an FFN that contains itself and for an argument that needs a
    gradient but is computed by an op (``w * 2``: its value is fixed when the FFN is built, so
    training ``w`` would not change it).
    """

    def __init__(self, *topology):
        self.topology = list(topology)
        self.output = None
        for position, entry in enumerate(self.topology):
            self._check(position, entry)

    @staticmethod
    def _check(position, entry):
        if not isinstance(entry, tuple) or not entry:
            raise TypeError(f"FFN: topology entry {position} ({entry!r}) is not an "
                            "(OpClass, *args) tuple")
        op = entry[0]
        if isinstance(op, type) and not issubclass(op, NetOp) or not callable(op):
            raise TypeError(f"FFN: topology entry {position} starts with {op!r}, which is not an "
                            "op class (a NetOp subclass), an FFN or a function")
        if isinstance(op, FFN) and len(entry) > 1:
            raise TypeError(f"FFN: topology entry {position} (an FFN) takes no arguments, got "
                            f"{len(entry) - 1}")

    def __call__(self, x):
        """Run every entry in order on ``x`` and return the last node."""
        node = x if isinstance(x, NetVar) else NetVar(x, requires_grad=False)
        for position, entry in enumerate(self.topology):
            self._check(position, entry)
            op, *args = entry
            if op is self:
                raise ValueError(f"FFN: topology entry {position} contains the network itself")
            try:
                node = op(node, *args)
            except (TypeError, ValueError) as error:
                raise type(error)(f"FFN: topology entry {position} ({_label(op)}): "
                                  f"{error}") from None
            if not isinstance(node, NetVar):
                raise TypeError(f"FFN: topology entry {position} ({_label(op)}) returned a "
                                f"{type(node).__name__}, not a NetVar")
        self.output = node
        return node

    def back(self, g=None):
        """Backpropagate from the output of the last call."""
        if self.output is None:
            raise RuntimeError("FFN.back(): call the network on an input first")
        return self.output.back(g)

    def to_gpu(self, device=None):
        """Move the network to the GPU (CuPy; GPU number ``device``, the current one by
        default) in place; returns self.

        Every NetVar in the topology (parameters, constants, Loss targets) moves in place, so
        an optimizer over ``net.vars`` keeps working (its state follows at the next step);
        plain arrays in the topology are replaced by device copies, BatchNorm running
        statistics move with them, and the FFNs and models inside move too. Raises
        RuntimeError when CuPy with a GPU is not available.
        """
        return self._move(lambda array: backend.to_gpu(array, device),
                          lambda node: node.to_gpu(device))

    def to_cpu(self):
        """Move the network to host memory (NumPy) in place, as ``to_gpu``; returns self."""
        return self._move(backend.to_cpu, lambda node: node.to_cpu())

    def _move(self, move_array, move_node):
        def moved(value):
            if isinstance(value, FFN):
                return value._move(move_array, move_node)
            if isinstance(value, NetVar):
                return move_node(value)
            if isinstance(value, BatchNormState):
                value.running_mean = move_array(value.running_mean)
                value.running_var = move_array(value.running_var)
                return value
            if isinstance(value, dict):             # what vars and state() look into
                return type(value)((key, moved(item)) for key, item in value.items())
            if isinstance(value, tuple) and hasattr(value, "_fields"):     # a namedtuple
                return type(value)(*(moved(item) for item in value))
            if isinstance(value, (tuple, list)):
                return type(value)(moved(item) for item in value)
            if isinstance(value, numpy.ndarray) or hasattr(value, "__cuda_array_interface__"):
                return move_array(value)
            if not isinstance(value, type) and hasattr(value, "vars") and \
                    hasattr(value, "to_cpu"):          # a model inside, e.g. a SequenceModel
                return move_node(value)
            return value

        self._parts()       # refuses an FFN inside itself before anything moves
        self.topology[:] = [(moved(entry[0]) if entry[0] is not self else self,
                             *(moved(arg) for arg in entry[1:]))
                            if isinstance(entry, tuple) and entry else entry
                            for entry in self.topology]
        self.output = None      # the last graph lives on the old device
        return self

    def members(self):
        """``(name, value)`` for each op argument (not a Loss's targets) and each FFN or Module
        entry, named ``topology.<entry>.<argument>`` (a nested model is argument 0)."""
        self.vars                       # refuses computed arguments and an FFN inside itself
        out = []
        for position, entry in enumerate(self.topology):
            if not isinstance(entry, tuple) or not entry:
                continue
            op = entry[0]
            if isinstance(op, Module):
                out.append((f"topology.{position}.0", op))
            if not (isinstance(op, type) and issubclass(op, Loss)):
                out.extend((f"topology.{position}.{argument}", value)
                           for argument, value in enumerate(entry[1:], start=1))
        return out

    def tree(self):
        """One line per topology entry: the op and its arguments' shapes (nested modules
        indented)."""
        lines = ["FFN("]
        for position, entry in enumerate(self.topology):
            op, *args = entry if isinstance(entry, tuple) and entry else (entry,)
            if isinstance(op, Module):
                inner = op.tree()
                lines.append(f"  ({position}): {inner[0]}")
                lines.extend("  " + line for line in inner[1:])
                continue
            shown = [f"{tuple(a.shape)}" if isinstance(a, NetVar) else
                     type(a).__name__ if isinstance(a, BatchNormState) else repr(a)
                     for a in args]
            lines.append(f"  ({position}): {_label(op)}" + (f" {', '.join(shown)}" if shown
                                                            else ""))
        return lines + [")"]

    @property
    def vars(self):
        """The trainable parameters, in topology order (those of the FFNs and models inside
        included), each once."""
        params, seen = [], set()
        for position, op, argument, value in self._parts():
            if not isinstance(value, NetVar) or not value.requires_grad or id(value) in seen:
                continue
            if value.parents:
                raise ValueError(
                    f"FFN: topology entry {position} ({_label(op)}) argument {argument} "
                    f"({value._describe()}) is computed by an op, so its value is fixed when "
                    "the FFN is built and training would not change it; pass a leaf NetVar "
                    "(or build it under no_grad() if it is a constant)")
            seen.add(id(value))
            params.append(value)
        return params

    def _parts(self, inside=()):
        """(position, op, argument, value) for every argument of an op entry that is not a
        Loss, in topology order, and for every parameter of the FFNs and models inside."""
        inside = (*inside, self)
        parts = []
        for position, entry in enumerate(self.topology):
            if not isinstance(entry, tuple) or not entry:
                continue
            op = entry[0]
            if isinstance(op, type) and issubclass(op, Loss):
                continue
            if isinstance(op, FFN):
                if any(op is outer for outer in inside):
                    raise ValueError(f"FFN: topology entry {position} contains the network "
                                     "itself")
                parts.extend(op._parts(inside))
            elif not isinstance(op, type) and hasattr(op, "vars"):      # a model
                parts.extend((position, op, None, p) for p in op.vars)
            for argument, value in enumerate(entry[1:], start=1):
                parts.extend((position, op, argument, item)
                             for item in _leaves(value, inside, position))
        return parts


def _leaves(value, inside, position):
    """What the Module walk finds in ``value`` (an argument, or the model of an entry): the
    value itself, the items of a list, tuple or dict (nested: a weight passed inside ``[w1,
    w2]`` is a parameter too), the parameters of an FFN or model (an RNN layer's ``h0``
    argument or a layer passed to a function are trained and saved as named_vars() names
    them)."""
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _leaves(item, inside, position)]
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item, inside, position)]
    if isinstance(value, FFN):
        if any(value is outer for outer in inside):
            raise ValueError(f"FFN: topology entry {position} contains the network itself")
        return [p for *_, p in value._parts(inside)]
    if isinstance(value, Module):
        return value.vars
    return [value]


def _label(op):
    """How an entry's op is named in errors: the class or function name, or the model type."""
    if isinstance(op, type) or not hasattr(op, "vars"):
        return getattr(op, "__name__", type(op).__name__)
    return type(op).__name__
