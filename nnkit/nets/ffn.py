"""FFN: the article's feed-forward convenience class, a list of (OpClass, *args) entries."""

__all__ = ['FFN']
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
    network is built or called; an op's own error is re-raised naming the entry. ``vars`` (and
    everything else that walks the model) raises ValueError for an FFN that contains itself and
    TypeError for an argument that needs a gradient but is computed by an op (``w * 2``: its
    value is fixed when the FFN is built, so training ``w`` would not change it).

    Its parameters, constants and buffers are Module's: the walk over ``members()``, which
    lists the topology's arguments. ``to_gpu()`` / ``to_cpu()`` move them in place, and the
    plain arrays and Loss targets that are an entry's own arguments with them.
    """

    members_are_arguments = True      # a computed argument or the FFN inside itself is refused
    last_call = ("output",)           # what back() starts from (Module.last_call)

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

    def _move_own_data(self, move_node, move_array):
        """Besides its members (moved by Module's walk): the plain arrays among the arguments
        and a Loss's targets move too (each entry's own arguments: an array inside a list
        argument stays where it is); the last output is dropped."""
        self.output = None
        for position, entry in enumerate(self.topology):
            if isinstance(entry, tuple) and entry:
                self.topology[position] = (entry[0], *(
                    move_array(value) if backend.is_array(value) else
                    move_node(value) if isinstance(value, NetVar) else value
                    for value in entry[1:]))

    def members(self):
        """``(name, value)`` for each op argument (not a Loss's targets) and each FFN or Module
        entry, named ``topology.<entry>.<argument>`` (a nested model is argument 0)."""
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


def _label(op):
    """How an entry's op is named in errors: the class or function name, or the model type."""
    if isinstance(op, type) or not hasattr(op, "vars"):
        return getattr(op, "__name__", type(op).__name__)
    return type(op).__name__
