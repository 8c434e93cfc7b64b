"""The engine: NetVar, NetOp and the backward pass, then its interface to the rest of nnkit.

A NetOp computes its value once, in its constructor, and keeps its parents: that is the graph.
``back()`` collects the op nodes reachable from the root (``collect``), children first (parents
are created first: descending creation index), and ``propagate`` calls each ``_back`` once.
"""
import itertools
import operator

import numpy

from . import backend
from .arraylike import ArrayLike, as_op_array, not_nodes_error
from .dtypes import as_array, operand_array, wants_gradient
from .gradients import conform, owned_copy, seed_gradient
from .modes import state as _modes, threads_without_grad as _grad_off
from .nodecopy import Copyable
from .specialize import own_code

_ndarray = numpy.ndarray
_counter = itertools.count()    # creation indices: a parent's is smaller than its children's
_edits = 0            # edit stamp: bumped whenever some NetVar's data is replaced or updated
# Observers (docs/contributing.md; detect_anomaly() attaches one): forward(node, parents) for each
# op built, before(node) / after(node) around each _back; none costs a test per op and per _back.
observers = []
recorder = None       # the class back(trace=True) records with; nnkit.trace sets it
NO_GRAD_CAUSES = ("it was built under no_grad(), only from constants with requires_grad=False, "
                  "from an op whose super().__init__(value, *parents) was given no parents, or "
                  "returned by a step nn.capture replays, which returns values: back() inside it")


class InplaceEditError(RuntimeError):
    """A parent's data was changed after an op used it, so its gradient would be wrong."""


def constant(value, like=None, dtype=None):
    """A NetVar that needs no gradient, holding ``value`` as it is (no row promotion); a
    Python number or list adopts ``like``'s dtype and device (``dtypes.operand_array``)."""
    if isinstance(value, NetVar):
        return value
    if dtype is None and type(value) is _ndarray and value.dtype.kind == "f":
        data = value              # the dtype policy keeps a float array as it is
    else:
        data = operand_array(value, None if like is None else like._data, dtype)
    node = NetVar.__new__(NetVar)
    node._data = data
    node._g = None
    node.requires_grad = False
    node._parents = ()
    node._index = next(_counter)
    return node


# ----------------------------------------------------------------------------- NetVar

class NetVar(ArrayLike, Copyable):
    """A node holding an array ``data`` and, after ``back()``, its gradient ``g``.

    ``NetVar(data, requires_grad=None, dtype=None, name=None)``: 1-D data becomes a row
    ``(1, n)``, scalars ``(1, 1)``. Float arrays keep their dtype (and memory); lists, numbers and
    int/bool data become ``nnkit.dtype`` unless ``dtype=`` says otherwise (``dtype=int`` for
    labels: a constant, refused with ``requires_grad=True``). ``requires_grad``: float data
    requires a gradient unless it is False, which marks inputs and targets.
    """
    # An op node sets only what the engine reads on every node (_data, _g, requires_grad,
    # _parents, _index; _pversion with parents), the rest is read with a default or written
    # first: _gread (zeros a .g read made), _received (outputs' hand-over), is_bias (MaxNorm).
    __slots__ = ("_data", "_g", "_gshared", "requires_grad", "_parents", "_index", "_version",
                 "_pversion", "_name", "_gread", "_received", "is_bias", "__weakref__")

    def __init__(self, data, requires_grad=None, dtype=None, name=None):
        # A node's data is copied: two nodes sharing one array would miss each other's edits
        data = as_array(data._data.copy() if isinstance(data, NetVar) else data, dtype)
        if data.ndim < 2:
            data = data.reshape(1, -1) if data.ndim == 1 else data.reshape(1, 1)
        self.requires_grad = wants_gradient(requires_grad, data.dtype)
        self._data = data
        self._g = None
        self._gshared = False
        self._parents = ()
        self._index = next(_counter)
        self._version = 0
        self._name = name

    def mark_edited(self):
        """Record that ``data`` changed in place (optimizers call this after an update): an
        op built from this node before the edit refuses to backpropagate through it."""
        global _edits
        _edits += 1
        self._version = _edits

    @property
    def index(self):
        """Creation index: a parent's is always smaller than its children's."""
        return self._index

    def detach(self):
        """A constant holding a copy of the data (an edit through it must not reach the graph)."""
        return constant(self._data.copy())

    __hash__ = object.__hash__

    def back(self, g=None, trace=False):
        """Backpropagate from this node: fill ``.g`` of every node it depends on.

        ``g`` seeds this node's gradient (ones by default). Op nodes start each call from zero;
        leaves accumulate until ``reset()``. ``trace=True`` returns a ``nnkit.trace.Trace``.
        """
        if not self.requires_grad:
            raise RuntimeError(
                f"back(): {self._describe()} does not require a gradient ({NO_GRAD_CAUSES})")
        seed = seed_gradient(g, self, lambda: f"back(): the seed gradient of {self._describe()}")
        nodes = collect((self,))
        check_edits(nodes)              # refused before any gradient changes
        for node in nodes:              # op nodes start from zero (leaves accumulate)
            node._g = None
        self.accumulate(seed)
        return propagate(nodes, trace)

    def accumulate(self, g):
        """Add the contribution ``g`` to this node's gradient (ops call it from ``_back``).

        ``g`` is summed over the axes this node was broadcast along (refused when it cannot
        be) in the node's dtype. The first contribution is kept as it is (no copy); later ones
        are added into an array the node owns. Nodes that need no gradient ignore it.
        """
        if not self.requires_grad:
            return
        mine = self._g
        if mine is None:          # the first contribution: kept, not copied (it may be shared)
            data = self._data
            if g.shape != data.shape or g.dtype is not data.dtype:
                g = conform(g, self)
            self._g = g
            self._gshared = True
            return
        if self._gshared:         # the second: a copy this node owns (of its dtype, an array)
            self._g = mine = owned_copy(mine, self._data)
            self._gshared = False
        # Later ones go in place (the array keeps its dtype). `+=` raises for a g that must be
        # summed first but would spread a smaller one: comparing sizes rules that out cheaply.
        if g.size == mine.size:
            try:
                mine += g
                return
            except ValueError:
                pass
        mine += conform(g, self)

    def accumulate_same_shape(self, g):
        """``accumulate(g)`` for a ``g`` with this node's shape and dtype by construction (one-input
        elementwise ops): on a tiny op the tests cost as much as the addition."""
        if not self.requires_grad:
            return
        mine = self._g
        if mine is None:
            self._g = g
            self._gshared = True
            return
        if self._gshared:
            self._g = mine = owned_copy(mine, self._data)
            self._gshared = False
        mine += g

    def _ancestors(self):     # nodecopy's order: the nodes below this one, oldest first
        return [node for node in reversed(collect((self,), every=True)) if node is not self]

    def _renew(self, how):
        """A copy's bookkeeping (nodecopy.py): its own index; ``copy.copy``: its own arrays;
        unpickled: built now, unedited (another process's edit stamps mean nothing here)."""
        global _edits
        self._index = next(_counter)
        if how != "unpickled" and getattr(self, "_pversion", _edits) < _edits:
            _edits += 1     # newer than ops built since an edit, with an older stamp: check all
        if how == "copy":
            self._data = self._data.copy()
            if self._g is not None:
                self._g, self._gshared = self._g.copy(), False
        elif how == "unpickled":          # (harmless on a node that had neither)
            self._pversion, self._version = _edits, 0


_creation_index = operator.attrgetter("_index")     # a C-level sort key: no Python call per node


def collect(roots, every=False):
    """The nodes ``roots`` depend on, the roots included, children before parents (descending
    creation index): the op nodes (those with parents), or with ``every`` the leaves and
    constants too. The one graph walk: back(), ``grad`` and the trace use it."""
    nodes = [root for root in roots if root._parents or every]
    seen = set(nodes)
    visit, add = seen.add, nodes.append       # bound once: a hot loop
    try:
        for node in nodes:        # the list grows as the loop reads it: each node once
            for parent in node._parents:
                if (parent._parents or every) and parent not in seen:
                    visit(parent)
                    add(parent)
    except AttributeError as error:     # a parent that is not a node (costs nothing)
        raise (not_nodes_error(node, node._parents) or error) from None
    nodes.sort(key=_creation_index, reverse=True)
    return nodes


def check_edits(nodes):
    """Refuse a pass through an op whose input (or output) was edited after it was built, before
    any gradient changes: only an edit since the oldest op (the last node) was built can be."""
    stamp = _edits
    if nodes and nodes[-1]._pversion < stamp:
        for node in nodes:
            if node._pversion < stamp:
                check_versions(node)


def check_versions(node):
    if getattr(node, "_version", 0) > node._pversion:       # its own output: _back may read it
        raise InplaceEditError(
            f"back(): the data of {node._describe()} was changed after the op computed it, so "
            "the gradients through it would be wrong; rebuild the graph after editing")
    for position, parent in enumerate(node._parents):
        if getattr(parent, "_version", 0) > node._pversion:    # op nodes: unset until edited
            raise InplaceEditError(
                f"back(): the data of input {position} of {node._describe()} "
                f"({parent._describe()}) was changed after the op used it, so its gradient "
                "would be wrong; rebuild the graph after editing (optimizer steps included)")


def propagate(nodes, trace=False):
    """Call ``_back`` on each of ``nodes`` (children first) that a consumer or a seed gave a
    gradient, ``check_edits(nodes)`` done; with ``trace`` returns the Trace. back() and grad()."""
    watching = observers + [recorder()] if trace else observers
    try:
        for node in nodes:
            if node._g is not None:
                if watching:
                    for observer in watching:
                        observer.before(node)
                parents = node._parents
                # a fixed argument list for one or two parents: Python runs it in this frame
                if len(parents) == 2:
                    node._back(parents[0], parents[1])
                elif len(parents) == 1:
                    node._back(parents[0])
                else:
                    node._back(*parents)
                node._gshared = True      # its parents may hold its array now: .g copies first
                if watching:
                    for observer in watching:
                        observer.after(node)
    except BaseException:        # a pass refused midway leaves nothing handed over for the next
        for node in nodes:
            node._received = None
        raise
    return watching[-1].trace() if trace else None


# ----------------------------------------------------------------------------- NetOp

class NetOp(NetVar):
    """A NetVar whose ``data`` is computed once, in its constructor, from its parents.

    Every op, built-in or a user's, is written the same way (docs/contributing.md has more):

    - the constructor checks its arguments (errors name the op, the argument and the shapes;
      ``node._describe()`` names a node), computes the value with ``xp =
      backend.array_module(x.data)`` and calls ``super().__init__(value, *parents)``; parents
      are recorded only when grad mode is on and some parent needs a gradient;
    - ``_back(self, *parents)`` hands each parent its share of ``self.g`` with
      ``parent.accumulate(g)`` (sums a broadcast ``g`` back, casts it to the parent's dtype,
      ignores a parent that needs no gradient), or ``accumulate_same_shape(g)`` for a ``g``
      that has the parent's shape and dtype by construction; ``parent.g += ...`` works too;
    - ``_grads(self, g, *parents)`` (or ``_composite(self, *parents)``) is the same rule with
      ops on nodes, for ``nnkit.grad(..., create_graph=True)``;
    - the docstring states the forward and backward formulas (x inputs, y output, g upstream).

    Several outputs (an LSTM's final h and c, Split's parts): the op node is output 0 and
    ``Output(self, k, value)`` is output k = 1, 2, ... The engine clears each output's
    gradient like any gradient and hands it to the op, whose ``_back`` reads them with
    ``self.output_grads()`` (``{k: g}``; Chainer's ``backward(indexes, grad_outputs)``).
    Such an op sets ``n_outputs``: ``_grads`` then gets (g0, g1, ...) (None for an unused one)
    and ``_composite`` returns the tuple of outputs.

    Speed: op files read the slots ``_data``, ``_g``, ``_parents`` (the only private names read
    across packages with ``_describe``, ``_grads``, ``_composite``: tests/test_structure.py).
    Built-in ops declare ``__slots__``; an op that keeps an array beside its parents (a mask)
    names it in ``kept_arrays``, so that ``detect_anomaly()`` catches an in-place edit of it.
    ``nn.capture`` needs (docs/contributing.md, "Capture"): array operations on the parents'
    data, a value read into Python only to raise or branch, ``isinstance(a, numpy.ndarray)``,
    and state changed outside the node held by an object declaring ``buffers``/``counters``.
    """
    __slots__ = ()
    kept_arrays = ()
    n_outputs = 1

    def __init_subclass__(cls, **kwargs):
        """Each op class gets its own copy of the accumulate methods (``own_code``)."""
        super().__init_subclass__(**kwargs)
        if "accumulate" in cls.__dict__ and "accumulate_same_shape" not in cls.__dict__:
            # a class's own accumulate is its one rule: the same-shape shortcut must not skip it
            cls.accumulate_same_shape = cls.__dict__["accumulate"]
        for name in ("accumulate", "accumulate_same_shape"):
            if name not in cls.__dict__:
                setattr(cls, name, own_code(getattr(cls, name), cls))

    def __init__(self, data, *parents):
        if type(data) is not _ndarray:
            data = as_op_array(data)
        self._data = data
        self._g = None
        self._index = next(_counter)
        try:
            for parent in parents:
                if parent.requires_grad and (not _grad_off[0] or _modes.grad):
                    self.requires_grad = True
                    self._parents = parents
                    self._pversion = _edits
                    break
            else:
                self.requires_grad = False
                self._parents = ()
        except AttributeError as error:     # (costs nothing unless raised)
            raise (not_nodes_error(self, parents) or error) from None
        if observers:
            for observer in observers:
                observer.forward(self, parents)

    def output_grads(self):
        """``{k: g}``: the gradients this pass handed outputs 1, 2, ... (read once, in _back)."""
        received, self._received = getattr(self, "_received", None), None
        return received or {}

    def _back(self, *parents):
        """Every subclass defines its own. ``super()._back()`` (as the article's ops end) does
        nothing; called with the parents, an op without a rule must not pass as a zero."""
        if parents:
            raise self._missing("back()", "_back", "backpropagate through", parents,
                                "accumulates each input's gradient")

    def _grads(self, g, *parents):
        """Each parent's gradient as a node (None for none) given ``g`` as a node, for
        ``nnkit.grad(create_graph=True)``. This one refuses."""
        raise self._missing("grad(create_graph=True)", "_grads", "differentiate the backward "
                            "pass of", parents, "returns each input's gradient built from ops "
                            "(docs/contributing.md, 'Higher-order gradients'), or use "
                            "create_graph=False", "g, ")

    def _missing(self, caller, rule, what, parents, does, g=""):
        inputs = ", ".join(f"input{i}" for i in range(len(parents)))
        return NotImplementedError(
            f"{caller}: {type(self).__name__} defines no {rule}, so nnkit cannot {what} "
            f"{self._describe()}; give the op a {rule}(self, {g}{inputs}) that {does}")


class Output(NetOp):
    """Output ``k`` (1, 2, ...) of an op with several outputs (see NetOp); its parent: the op.
    y = the op's output k;  backward: g is handed to the op as it is (``op.output_grads()``)"""
    __slots__ = ("k",)

    def __init__(self, op, k, value):
        self.k = k
        NetOp.__init__(self, value, op)     # (not super(): a subclass may mix in another op)

    def _back(self, op):
        received = getattr(op, "_received", None)
        if received is None:
            op._received = received = {}
        mine = received.get(self.k)     # two nodes of one output (a copy's final_c) add up
        received[self.k] = self._g if mine is None else mine + self._g
        if op._g is None:     # only other outputs were used: the op's _back must still run
            xp = backend.array_module(op._data)
            op.accumulate(xp.broadcast_to(xp.zeros((), op._data.dtype), op._data.shape))


def link(node, data, a, b=None):
    """``NetOp.__init__(node, data, a, b)`` for the operators' fast path (ops/surface.py) alone,
    returning ``node``: Python runs a call without ``*parents`` inside the caller's frame."""
    if type(data) is not _ndarray:
        data = as_op_array(data)
    node._data = data
    node._g = None
    node._index = next(_counter)
    if (a.requires_grad or (b is not None and b.requires_grad)) and (
            not _grad_off[0] or _modes.grad):
        node.requires_grad = True
        node._parents = (a,) if b is None else (a, b)
        node._pversion = _edits
    else:
        node.requires_grad = False
        node._parents = ()
    if observers:
        for observer in observers:
            observer.forward(node, (a,) if b is None else (a, b))
    return node


# ----------------------------------------------------------------------------- interface

def anomaly_mode():
    """True inside ``detect_anomaly()``: ops may then run checks that read GPU data back."""
    return any(observer.checks_values for observer in observers)
