"""Copies and pickles of nodes: NetVar inherits ``Copyable``.

A copy is a node of its own: a creation index of its own (drawings and traces tell nodes apart
by it) and, for ``copy.copy``, its own data and gradient arrays (two nodes sharing one array
would miss each other's edits). What a copy must renew in the engine's bookkeeping is the
engine's to say: ``_renew``, which core.py's NetVar defines.
"""
import copy


def attributes(node):
    """``(name, value)`` of every attribute a node holds: its slots, and a user's op's
    ``__dict__``."""
    for klass in type(node).__mro__:
        slots = getattr(klass, "__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name != "__weakref__" and hasattr(node, name):
                yield name, getattr(node, name)
    yield from getattr(node, "__dict__", {}).items()


class Copyable:
    """``copy.copy``, ``copy.deepcopy`` and pickle for nodes."""
    __slots__ = ()

    def _renew(self, how):
        """The engine's bookkeeping of a node that is a copy (``how``: "copy", "deepcopy") or
        was unpickled ("unpickled"): a creation index of this process, and so on (core.py)."""
        raise NotImplementedError

    def __deepcopy__(self, memo):
        """An independent copy (data, gradient, parents copied) with a creation index of its
        own, larger than its parents' copies'."""
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

    def __setstate__(self, state):
        """Unpickling: the attributes, then the engine's bookkeeping of a node built now (the
        pickled creation index may belong to a live node here, and the edit stamps of another
        process mean nothing here: an unpickled graph counts as built now, unedited)."""
        attributes, slots = state if isinstance(state, tuple) else (state, None)
        for mapping in (attributes, slots):
            for name, value in (mapping or {}).items():
                setattr(self, name, value)
        self._renew("unpickled")
