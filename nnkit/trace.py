"""A recorded backward pass: what ``node.back(trace=True)`` returns.

Each step is one op's ``_back``, in execution order: the node, the upstream gradient it
received, the local rule (from its docstring) and what it added to each parent's gradient.
"""
import numpy

from . import backend


def local_rule(op_class):
    """The formula lines of an op's docstring (everything after its first line)."""
    doc = (op_class.__doc__ or "").strip().splitlines()
    lines = [line.strip() for line in doc[1:] if line.strip()]
    return "; ".join(lines) if lines else "(no formula documented)"


class TraceStep:
    __slots__ = ("node", "upstream", "added")

    def __init__(self, node, upstream, added):
        self.node = node
        self.upstream = upstream
        self.added = added

    @property
    def rule(self):
        return local_rule(type(self.node))


def _short(array):
    if array is None:
        return "-"
    text = numpy.array2string(numpy.asarray(backend.to_cpu(array)), precision=4, threshold=6,
                              edgeitems=2, separator=", ")
    return " ".join(text.split())


class Trace(list):
    """The steps of one backward pass, in the order they ran."""

    def __init__(self, steps=()):
        super().__init__(TraceStep(*s) if isinstance(s, tuple) else s for s in steps)

    def __str__(self):
        lines = []
        for k, step in enumerate(self):
            node = step.node
            lines.append(f"step {k}: {type(node).__name__} #{node.index} "
                         f"shape={tuple(node.shape)}")
            lines.append(f"    upstream g = {_short(step.upstream)}")
            lines.append(f"    rule: {step.rule}")
            for position, (parent, added) in enumerate(zip(node.parents, step.added)):
                lines.append(f"    -> input {position} ({type(parent).__name__} "
                             f"#{parent.index}) += {_short(added)}")
        return "\n".join(lines)
