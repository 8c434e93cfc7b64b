"""Copies and pickles of nodes: NetVar inherits ``Copyable``.

A copy is a node of its own: a creation index of its own (drawings and traces tell nodes apart
by it) and, for ``copy.copy``, its own data and gradient arrays (two nodes sharing one array
would miss each other's edits). What a copy must renew in the engine's bookkeeping is the
engine's to say: ``_renew`` and ``_ancestors`` (core's walk), which core.py's NetVar defines.

Copying or pickling a node copies the nodes it was computed from, and Python's copy and pickle
do that by recursing through each node's parents, once per op: a chain of a few thousand ops
overflowed the stack. So the graph's nodes are copied (pickled) first, oldest first: each then
finds its parents done, and the recursion stays one node deep.
"""
import copy
import threading
import weakref

# Pickle does not tell a node what it has written already, so the node that lays out its graph
# notes the nodes it hands pickle (id -> weak reference): each is then pickled as it is.
_laid_out = threading.local()


def attributes(node):
    """``(name, value)`` of every attribute an object holds (a node, a metric): its slots, and
    its ``__dict__`` (a user's op's)."""
    for klass in type(node).__mro__:
        slots = getattr(klass, "__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__weakref__", "__dict__") and hasattr(node, name):
                yield name, getattr(node, name)
    yield from getattr(node, "__dict__", {}).items()


def built_after(older, make, args):
    """Unpickling: ``make(*args)``, the node itself, once ``older`` (its graph) is built."""
    return make(*args)


class _LaidOut:
    """The end of a laid-out graph: pickling it drops the notes left for the nodes pickle had
    written already (it never asks those again); unpickled, it is None."""

    def __init__(self, ids):
        self.ids = ids

    def __reduce__(self):
        pending = _laid_out.nodes
        for key in self.ids:
            pending.pop(key, None)
        return type(None), ()


class Copyable:
    """``copy.copy``, ``copy.deepcopy`` and pickle for nodes."""
    __slots__ = ()

    def _renew(self, how):
        """The engine's bookkeeping of a node that is a copy (``how``: "copy", "deepcopy") or
        was unpickled ("unpickled"): a creation index of this process, and so on (core.py)."""
        raise NotImplementedError

    def _ancestors(self):
        """The nodes this one was computed from, oldest first (each after its parents): the
        engine's graph walk, which core.py gives (copies are not on back()'s hot path)."""
        raise NotImplementedError

    def __deepcopy__(self, memo):
        """An independent copy (data, gradient, parents copied) with a creation index of its
        own, larger than its parents' copies'."""
        if any(id(parent) not in memo for parent in self._parents):
            for node in self._ancestors():      # oldest first: each finds its parents copied
                if id(node) not in memo:
                    copy.deepcopy(node, memo)
        clone = object.__new__(type(self))
        memo[id(self)] = clone
        for name, value in attributes(self):
            setattr(clone, name, copy.deepcopy(value, memo))
        clone._renew("deepcopy")
        return clone

    def __copy__(self):
        """A copy with its own data (and gradient) and creation index, the same parents."""
        clone = object.__new__(type(self))
        for name, value in attributes(self):
            setattr(clone, name, value)
        clone._renew("copy")
        return clone

    def __reduce_ex__(self, protocol):
        """Python's pickling of the node, but the first node of a graph that pickle meets has
        the rest pickled first, oldest first, then is built after them (``built_after``)."""
        reduced = super().__reduce_ex__(protocol)
        pending = getattr(_laid_out, "nodes", None)
        if pending is None:
            pending = _laid_out.nodes = {}
        noted = pending.pop(id(self), None)
        if (noted is not None and noted() is self) or not self._parents:
            return reduced
        older = [node for node in self._ancestors() if id(node) not in pending]
        pending.update((id(node), weakref.ref(node)) for node in older)
        older.append(_LaidOut([id(node) for node in older]))
        return (built_after, (older, *reduced[:2]), *reduced[2:])

    def __setstate__(self, state):
        """Unpickling: the attributes, then the engine's bookkeeping of a node built now (the
        pickled creation index may belong to a live node here, and the edit stamps of another
        process mean nothing here: an unpickled graph counts as built now, unedited)."""
        attributes, slots = state if isinstance(state, tuple) else (state, None)
        for mapping in (attributes, slots):
            for name, value in (mapping or {}).items():
                setattr(self, name, value)
        self._renew("unpickled")
