"""FFN: the article's feed-forward convenience class, a list of (OpClass, *args) entries."""

__all__ = ['FFN']
import numpy

from .. import backend
from ..core import NetOp, NetVar
from ..ops.loss import Loss
from ..ops.normalization import BatchNormState


class FFN:
    """A feed-forward network described by its topology, a mutable list of entries.

    Each entry is ``(OpClass, *args)``: calling ``net(x)`` builds ``node = OpClass(node, *args)``
    for each entry in order, starting from ``x``, and returns the last node. ``net.back()``
    backpropagates from that node. ``net.vars`` lists the trainable parameters: the NetVar
    arguments that require a gradient, never the targets of a Loss entry.

        net = FFN((Multiply, rand2(2, 3)), (Add, rand2(3)), (ReLU,))
        net.topology.append((CELoss, target))   # train against a loss ...
        net.topology.pop()                     # ... and remove it afterwards
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
        if not (isinstance(op, type) and issubclass(op, NetOp)) and not callable(op):
            raise TypeError(f"FFN: topology entry {position} starts with {op!r}, which is not an "
                            "op class")

    def __call__(self, x):
        """Run every entry in order on ``x`` and return the last node."""
        node = x if isinstance(x, NetVar) else NetVar(x, requires_grad=False)
        for position, entry in enumerate(self.topology):
            self._check(position, entry)
            op, *args = entry
            try:
                node = op(node, *args)
            except (TypeError, ValueError) as error:
                name = getattr(op, "__name__", repr(op))
                raise type(error)(f"FFN: topology entry {position} ({name}): {error}") from None
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
        plain arrays in the topology are replaced by device copies, and BatchNorm running
        statistics move with them. Raises RuntimeError when CuPy with a GPU is not available.
        """
        return self._move(lambda array: backend.to_gpu(array, device),
                          lambda node: node.to_gpu(device))

    def to_cpu(self):
        """Move the network to host memory (NumPy) in place, as ``to_gpu``; returns self."""
        return self._move(backend.to_cpu, lambda node: node.to_cpu())

    def _move(self, move_array, move_node):
        def moved(value):
            if isinstance(value, NetVar):
                return move_node(value)
            if isinstance(value, BatchNormState):
                value.running_mean = move_array(value.running_mean)
                value.running_var = move_array(value.running_var)
                return value
            if isinstance(value, (tuple, list)):
                return type(value)(moved(item) for item in value)
            if isinstance(value, numpy.ndarray) or hasattr(value, "__cuda_array_interface__"):
                return move_array(value)
            return value

        self.topology[:] = [(entry[0], *(moved(arg) for arg in entry[1:]))
                            if isinstance(entry, tuple) and entry else entry
                            for entry in self.topology]
        self.output = None      # the last graph lives on the old device
        return self

    @property
    def vars(self):
        """The trainable parameters, in topology order, each once."""
        params, seen = [], set()
        for entry in self.topology:
            if not isinstance(entry, tuple) or not entry:
                continue
            op = entry[0]
            if isinstance(op, type) and issubclass(op, Loss):
                continue
            for arg in entry[1:]:
                if isinstance(arg, NetVar) and arg.requires_grad and not arg.parents \
                        and id(arg) not in seen:
                    seen.add(id(arg))
                    params.append(arg)
        return params
