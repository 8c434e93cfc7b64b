"""The instrumented engine: NaN/Inf checks (``detect_anomaly``) and recorded backward passes.

The engine (core.py) stays lean: it runs this module's code only while
``detect_anomaly()`` is on or when ``back(trace=True)`` asks for a record, so the default
path pays one global load per op for all of it.
"""
from . import backend, core
from .core import InplaceEditError

__all__ = ['AnomalyError', 'detect_anomaly']


class AnomalyError(FloatingPointError):
    """detect_anomaly() found a NaN or Inf in a forward value or a gradient."""


class detect_anomaly:
    """``with nnkit.detect_anomaly():`` check every forward value and every gradient.

    The first op whose output, or whose contribution to a parent's gradient, holds a NaN or
    Inf raises AnomalyError naming the op class, its creation index and its input shapes.
    Ops built in the mode also hash their inputs' data, and back() in the mode re-hashes them:
    an edit that bypasses the ``.data`` setter (``x.data[i] = v``) raises InplaceEditError.
    Off by default; when off it costs one global load per op. The switch is process-wide.
    """

    def __init__(self, enabled=True):
        self.enabled = enabled
        self._saved = []

    def __enter__(self):
        self._saved.append(core._anomaly)
        core._anomaly = self.enabled
        return self

    def __exit__(self, *exc):
        core._anomaly = self._saved.pop()
        return False


def nonfinite(array):
    xp = backend.array_module(array)
    return not bool(xp.isfinite(array).all())


def digests(nodes):
    """Hashes of the nodes' data: detect_anomaly's check for edits that bypass ``.data =``."""
    return tuple(hash(backend.to_cpu(n._data).tobytes()) for n in nodes)


def check_fingerprint(node):
    for position, (parent, digest) in enumerate(zip(node._parents, node._fingerprint)):
        if digests((parent,))[0] != digest:
            raise InplaceEditError(
                f"back(): the data of input {position} of {node._describe()} "
                f"({parent._describe()}) was edited in place (e.g. x.data[i] = v) after the op "
                "used it, so its gradient would be wrong (found by detect_anomaly)")


def _shapes(nodes):
    return ", ".join(str(tuple(p.shape)) for p in nodes)


def check_forward(node, parents):
    """Called by NetOp for each op built under detect_anomaly()."""
    if node._parents:
        node._fingerprint = digests(node._parents)
    if node._data.dtype.kind not in "fc" or not nonfinite(node._data):
        return
    if any(getattr(p, "_data", None) is not None and p._data.dtype.kind in "fc"
           and nonfinite(p._data) for p in parents):
        return      # the NaN came in from an input: the op that made it already raised
    raise AnomalyError(f"detect_anomaly: forward of {type(node).__name__} #{node._index} "
                       f"(inputs of shapes {_shapes(parents)}) produced NaN or Inf")


def _check_backward(node, parents):
    if nonfinite(node._g):
        return      # the NaN came from upstream: the op that made it already raised
    for position, parent in enumerate(parents):
        if parent._g is not None and parent._g.dtype.kind in "fc" and nonfinite(parent._g):
            raise AnomalyError(
                f"detect_anomaly: backward of {type(node).__name__} #{node._index} "
                f"(inputs of shapes {_shapes(parents)}) gave a NaN or Inf gradient to input "
                f"{position}")


def back_instrumented(nodes, trace):
    """back()'s loop with recording (``trace``) and/or the checks of detect_anomaly().

    Returns a ``nnkit.trace.Trace`` of (node, upstream gradient, what was added to each parent)
    when ``trace`` is true.
    """
    anomaly = core._anomaly
    steps = [] if trace else None
    stamp = core._edits
    for node in nodes:
        if node._g is None:
            continue
        if node._pversion < stamp:
            core._check_versions(node)
        if anomaly and getattr(node, "_fingerprint", None) is not None:
            check_fingerprint(node)
        parents = node._parents
        if trace:
            before = [None if p._g is None else p._g.copy() for p in parents]
            upstream = node._g.copy()
        node._back(*parents)
        if anomaly:
            _check_backward(node, parents)
        if trace:
            added = []
            for parent, old in zip(parents, before):
                if parent._g is None or not parent.requires_grad:
                    added.append(None)
                elif old is None:
                    added.append(parent._g.copy())
                else:
                    added.append(parent._g - old)
            steps.append((node, upstream, tuple(added)))
    if trace:
        from .trace import Trace
        return Trace(steps)
    return None
