"""NaN/Inf and in-place edit checks (``detect_anomaly``), as an observer of the engine.

The engine (core.py) calls an attached observer for each op it builds and around each
``_back``; this module attaches one only inside ``detect_anomaly()``.
"""
import weakref

from . import backend, core
from .arraylike import not_nodes_error
from .core import InplaceEditError, NetVar

__all__ = ['AnomalyError', 'detect_anomaly']


# The hashes each op built under detect_anomaly() took of its inputs' data (and kept arrays):
# the checker's own record, by id(node), dropped when the node dies. (Not a WeakKeyDictionary:
# it compares keys with ==, which for nodes is an elementwise op.)
_fingerprints = {}


def _fingerprint(node):
    entry = _fingerprints.get(id(node))
    return entry[1] if entry is not None and entry[0]() is node else None


def _keep_fingerprint(node, digest):
    key = id(node)
    _fingerprints[key] = (weakref.ref(node, lambda _: _fingerprints.pop(key, None)), digest)


class AnomalyError(FloatingPointError):
    """detect_anomaly() found a NaN or Inf in a forward value or a gradient."""


class detect_anomaly:
    """``with nnkit.detect_anomaly():`` check every forward value and every gradient.

    The first op whose output, or whose contribution to a parent's gradient, holds a NaN or
    Inf raises AnomalyError naming the op class, its creation index and its input shapes
    (inside ``grad(create_graph=True)``, also the op whose gradient rule built that op). A
    gradient that is NaN or Inf before the pass reaches it (left by an earlier back() without a
    reset) is named as such, not blamed on the op that adds to it.
    Ops built in the mode also hash their inputs' data, and back() in the mode re-hashes them:
    an edit that bypasses the ``.data`` setter (``x.data[i] = v``) raises InplaceEditError.
    Off by default; when off it costs nothing but the engine's test for observers. The switch
    is process-wide.
    """

    def __init__(self, enabled=True):
        self.enabled = enabled
        self._saved = []

    def __enter__(self):
        # what this block took away and added, undone at its exit whatever other blocks did
        # meanwhile (threads, generators end blocks out of order: restoring a saved list
        # left a checker attached for good)
        removed = [o for o in core.observers if isinstance(o, AnomalyChecker)]
        added = AnomalyChecker() if self.enabled else None
        core.observers[:] = [o for o in core.observers if o not in removed] + (
            [added] if added is not None else [])
        self._saved.append((removed, added))
        return self

    def __exit__(self, *exc):
        removed, added = self._saved.pop()
        if added is not None:
            added.alive = False         # its block is over: no other block brings it back
        core.observers[:] = [o for o in core.observers if o is not added] + [
            o for o in removed if o.alive and o not in core.observers]
        return False


class AnomalyChecker:
    """The engine observer of detect_anomaly(): checks each op's value when it is built and
    each gradient it hands its parents, and each input's data against its hash at back()."""
    checks_values = True

    def __init__(self):
        self.alive = True               # until the block that attached it ends

    def forward(self, node, parents):
        check_forward(node, parents)

    def before(self, node):
        if _fingerprint(node) is not None:
            check_fingerprint(node)
        _check_stale(node)

    def after(self, node):
        _check_backward(node, node._parents)


def nonfinite(array):
    xp = backend.array_module(array)
    return not bool(xp.isfinite(array).all())


def digests(nodes):
    """Hashes of the nodes' data: detect_anomaly's check for edits that bypass ``.data =``."""
    return tuple(hash(backend.to_cpu(n._data).tobytes()) for n in nodes)


def _kept_digest(node):
    """Hashes of the arrays the op keeps beside its inputs (the attributes its class names in
    ``kept_arrays``: x * mask's mask, an index, a condition), arrays inside tuples included."""
    found = []

    def visit(value):
        if isinstance(value, tuple):
            for item in value:
                visit(item)
        elif backend.is_array(value):
            found.append(hash(backend.to_cpu(value).tobytes()))

    for name in type(node).kept_arrays:
        visit(getattr(node, name, None))
    return tuple(found)


def check_fingerprint(node):
    fingerprint = _fingerprint(node)
    for position, (parent, digest) in enumerate(zip(node._parents, fingerprint)):
        if digests((parent,))[0] != digest:
            raise InplaceEditError(
                f"back(): the data of input {position} of {node._describe()} "
                f"({parent._describe()}) was edited in place (e.g. x.data[i] = v) after the op "
                "used it, so its gradient would be wrong (found by detect_anomaly)")
    if fingerprint[len(node._parents):] != _kept_digest(node):
        raise InplaceEditError(
            f"back(): an array {node._describe()} keeps beside its inputs "
            f"({', '.join(type(node).kept_arrays)}) was edited in place after the op used it, "
            "so its gradient would be wrong (found by detect_anomaly)")


def _shapes(nodes):
    return ", ".join(str(tuple(p.shape)) for p in nodes)


def check_forward(node, parents):
    """Called by NetOp for each op built under detect_anomaly()."""
    if not all(isinstance(p, NetVar) for p in parents):
        raise not_nodes_error(node, parents)
    if node._parents:
        _keep_fingerprint(node, digests(node._parents) + _kept_digest(node))
    if node._data.dtype.kind not in "fc" or not nonfinite(node._data):
        return
    if any(getattr(p, "_data", None) is not None and p._data.dtype.kind in "fc"
           and nonfinite(p._data) for p in parents):
        return      # the NaN came in from an input: the op that made it already raised
    raise AnomalyError(f"detect_anomaly: forward of {type(node).__name__} #{node.index} "
                       f"(inputs of shapes {_shapes(parents)}) produced NaN or Inf")


def _check_stale(node):
    """An input whose gradient is NaN or Inf before this op adds to it: no op of this pass made
    it (that op would have raised), so it is left from before, and this op is not to blame."""
    for position, parent in enumerate(node._parents):
        if parent._g is not None and parent._g.dtype.kind in "fc" and nonfinite(parent._g):
            raise AnomalyError(
                f"detect_anomaly: input {position} of {type(node).__name__} #{node.index} "
                f"({parent._describe()}) held a NaN or Inf gradient before this backward pass "
                "reached it: left from an earlier back() or set by hand; reset the gradients "
                "(optimizer.reset() or x.reset()) before back()")


def _check_backward(node, parents):
    if nonfinite(node._g):
        return      # the NaN came from upstream: the op that made it already raised
    for position, parent in enumerate(parents):
        if parent._g is not None and parent._g.dtype.kind in "fc" and nonfinite(parent._g):
            raise AnomalyError(
                f"detect_anomaly: backward of {type(node).__name__} #{node.index} "
                f"(inputs of shapes {_shapes(parents)}) gave a NaN or Inf gradient to input "
                f"{position}")
