"""The engine: NetVar, NetOp and the backward pass.

A NetOp computes its value once, eagerly, in its constructor and keeps references to its
parents; that is the whole graph. ``back()`` collects the op nodes reachable from the root in
a list that grows as it is read (no recursion), orders them by creation index (parents are
always created before their children, so descending index is a reverse topological order) and
calls each ``_back`` exactly once, after all of its consumers have contributed to its gradient.
"""
import copy
import itertools
import operator
import threading
import types

import numpy

from . import backend
from .arraylike import ArrayLike
from .dtypes import as_array
from .gradients import _conform, _gradient_from_user, _owned_copy

_ndarray = numpy.ndarray
_counter = itertools.count()
_edits = 0            # global edit stamp: bumped whenever some NetVar's data is replaced or updated
# Observers of the engine: objects with forward(node, parents), called for each op built, and
# before(node) / after(node), called around each _back. detect_anomaly() attaches one for its
# block; back(trace=True) adds a recorder for one pass. The engine knows only this protocol (it
# imports no observer), and with none attached it pays one test per op and two per backward step.
_observers = []
# Why a node needs no gradient, for the errors of back() and grad().
NO_GRAD_CAUSES = ("it was built under no_grad(), only from constants with requires_grad=False, "
                  "or from an op whose super().__init__(value, *parents) was given no parents")
_recorder = None      # the class back(trace=True) records with; nnkit.trace registers it
# Backward passes begun (back() and grad()): a gradient an op hands to another sideways, outside
# the graph's edges (a recurrent op's final cell state), is stamped with its pass, so that a pass
# refused midway leaves nothing for the next one.
_passes = 0


def anomaly_mode():
    """True inside ``detect_anomaly()``: an attached observer checks values, so ops may also run
    their checks that read GPU data back to the host (skipped otherwise: one copy per call)."""
    return any(observer.checks_values for observer in _observers)


class _State(threading.local):
    grad = True       # record parents (no_grad turns it off)
    train = True      # Dropout / BatchNorm behaviour


_state = _State()
# How many grad-off blocks are open in all threads together. While it is 0, grad mode is on in
# every thread and NetOp skips the thread-local read (a third of a tiny op's bookkeeping).
_grad_off = 0


class InplaceEditError(RuntimeError):
    """A parent's data was changed after an op used it, so its gradient would be wrong."""


# ----------------------------------------------------------------------------- leaves and constants

def _init_leaf(node, data, requires_grad, name):
    node._data = data
    node._g = None
    node._gshared = False
    node.requires_grad = requires_grad and data.dtype.kind in "fc"
    node._parents = ()
    node._index = next(_counter)
    node._version = 0
    node._name = name


def constant(value, like=None, dtype=None):
    """A NetVar that needs no gradient, holding ``value`` as it is (no row promotion).

    A Python number or list adopts the dtype (and device) of ``like``, as a Python scalar
    operand does in NumPy 2, and so does an integer or boolean array beside a float ``like``
    (exact in float64: 123456789 stays 123456789); a complex number stays complex, as a complex
    array does; ``dtype`` sets one (``dtype=bool`` keeps a mask boolean).
    """
    if isinstance(value, NetVar):
        return value
    kind = type(value)
    if dtype is None and kind is _ndarray and value.dtype.kind == "f":
        data = value              # the dtype policy keeps a float array as it is
    elif dtype is None and isinstance(value, (complex, numpy.complexfloating)):
        # complex, as a complex array operand is (a cast to like's real dtype dropped 2j)
        xp = numpy if like is None else backend.array_module(like._data)
        data = xp.asarray(value)
    elif (kind is float or kind is int) and like is not None and dtype is None and \
            type(like._data) is _ndarray:
        data = numpy.asarray(value, like._data.dtype)
    elif like is not None and dtype is None and (isinstance(
            value, (int, float, bool, numpy.number, list, tuple)) or (
            backend.is_array(value) and value.dtype.kind in "biu"
            and like._data.dtype.kind == "f")):
        data = backend.array_module(like._data).asarray(value, dtype=like._data.dtype)
    else:
        data = as_array(value, dtype, "constant")
    # A constant sets only what the engine reads on every node; the other slots (_name,
    # _version, _gshared) are read with a default or written before they are read.
    node = NetVar.__new__(NetVar)
    node._data = data
    node._g = None
    node.requires_grad = False
    node._parents = ()
    node._index = next(_counter)
    return node


# ----------------------------------------------------------------------------- NetVar

class NetVar(ArrayLike):
    """A node holding an array ``data`` and, after ``back()``, its gradient ``g``.

    ``NetVar(data, requires_grad=True, dtype=None, name=None)``: 1-D data becomes a row
    ``(1, n)`` and scalars ``(1, 1)`` (the row-oriented convention). Float arrays keep their
    dtype (and share memory with the array given); lists, Python scalars and int/bool data become
    ``nnkit.dtype`` unless ``dtype=`` says otherwise (``dtype=int`` for class labels, which then
    need no gradient). ``requires_grad=False`` marks constants such as inputs and targets.
    """
    # An op node sets only what the engine reads on every node (_data, _g, requires_grad,
    # _parents, _index, and _pversion with the parents): dropping three more writes made a tiny
    # op 2-3% faster. _name and _version are set on leaves and on nodes named or edited later,
    # and read with a default; _gshared is set with a gradient and read only when there is one.
    __slots__ = ("_data", "_g", "_gshared", "requires_grad", "_parents", "_index",
                 "_version", "_pversion", "_name", "_fingerprint", "_gread", "__weakref__")
    __array_ufunc__ = None        # `array + node` defers to NetVar.__radd__

    def __init__(self, data, requires_grad=True, dtype=None, name=None):
        if not isinstance(requires_grad, (bool, numpy.bool_)):
            raise TypeError(f"NetVar: requires_grad must be True or False, got {requires_grad!r}")
        # A node's data is copied: two nodes sharing one array would miss each other's edits
        data = as_array(data._data.copy() if isinstance(data, NetVar) else data, dtype)
        if data.ndim < 2:
            data = data.reshape(1, -1) if data.ndim == 1 else data.reshape(1, 1)
        _init_leaf(self, data, bool(requires_grad), name)

    # -- data and gradient
    @property
    def data(self):
        """The value (a NumPy or CuPy array). Assigning to it marks the node as edited."""
        return self._data

    @data.setter
    def data(self, value):
        if isinstance(value, NetVar):
            value = value._data.copy()      # not shared: an edit through one node is seen
        if not (hasattr(value, "shape") and hasattr(value, "dtype")):
            value = as_array(value, self._data.dtype, f".data of {self._describe()}")
            value = backend.array_module(self._data).asarray(value)
        elif value.dtype.kind not in "biuf":
            raise TypeError(f".data of {self._describe()}: cannot hold an array of dtype "
                            f"{value.dtype}")
        if value.dtype.kind in "biu" and self._data.dtype.kind == "f":
            value = value.astype(self._data.dtype)     # a float node stays float (its gradient)
        if value.shape != self._data.shape:
            self.reset()                  # a gradient of the old shape would be wrong
        elif self._g is not None and self._g.dtype != value.dtype:
            self._g = self._g.astype(value.dtype)      # .g keeps the node's dtype
            self._gshared = False
        self._data = value
        self.mark_edited()

    @property
    def name(self):
        """An optional label, shown in errors, reprs, traces and graph drawings."""
        return getattr(self, "_name", None)

    @name.setter
    def name(self, value):
        self._name = value

    def mark_edited(self):
        """Record that ``data`` changed in place (optimizers call this after an update).

        An op built from this node before the edit refuses to backpropagate through it.
        """
        global _edits
        _edits += 1
        self._version = _edits

    @property
    def g(self):
        """The gradient: an array of this node's shape and dtype, zeros until back() reaches it.

        Assigning works as a PyTorch user expects: ``p.g = 0`` (any number) fills it, ``p.g =
        None`` resets it, an array of the node's shape is taken (in the node's dtype); any other
        shape, a non-numeric value or an array on another device is refused at the assignment.
        The zeros a read makes are kept (``x.g += ...`` and ``x.g[i] = v`` edit them) but are
        no gradient while they stay zeros: an optimizer skips them, as it skips a node without
        one (Adam's momentum or AdamW's decay moved a frozen or unused weight after a mere
        ``print(w.g)``).
        """
        if self._g is None:
            self._g = self._gread = backend.array_module(self._data).zeros_like(self._data)
            self._gshared = False
        elif self._gshared:       # maybe another node's gradient: copy before a user edits it
            self._g = _owned_copy(self._g, self._data)
            self._gshared = False
        return self._g

    @g.setter
    def g(self, value):
        if value is self._g:              # `x.g += ...`: the getter's own array, edited in place
            self._gshared = False
        elif value is None:
            self.reset()
        else:                             # kept as shared: the caller's array is never edited
            self._g = _gradient_from_user(value, self, f".g of {self._describe()}")
            self._gshared = True

    def accumulate(self, g):
        """Add the contribution ``g`` to this node's gradient (ops call it from ``_back``).

        ``g`` is summed over the axes along which this node was broadcast and takes the node's
        dtype; one that cannot be summed back to the node's shape is refused. The first
        contribution is kept as it is (no copy); later ones are added into an array the node
        owns. Nodes that need no gradient ignore it.
        """
        if not self.requires_grad:
            return
        mine = self._g
        if mine is None:          # the first contribution: kept, not copied (it may be shared)
            data = self._data
            if g.shape != data.shape or g.dtype is not data.dtype:
                g = _conform(g, self)
            self._g = g
            self._gshared = True
            return
        if self._gshared:         # the second: a copy this node owns (of its dtype, an array)
            self._g = mine = _owned_copy(mine, self._data)
            self._gshared = False
        # Later contributions go in place into the array this node owns, which keeps its dtype.
        # `+=` raises for a g that must be summed first, but would spread a g with fewer elements
        # over the node: comparing sizes (two ints, cheaper than two shapes) rules that out.
        if g.size == mine.size:
            try:
                mine += g
                return
            except ValueError:
                pass
        mine += _conform(g, self)

    def accumulate_same_shape(self, g):
        """``accumulate(g)`` for a ``g`` that already has this node's shape and dtype.

        An elementwise op of one input hands it such a gradient by construction, so the shape
        and dtype tests of ``accumulate`` are skipped: on a tiny op they cost as much as the
        addition. A ``g`` of another shape must go through ``accumulate``.
        """
        if not self.requires_grad:
            return
        mine = self._g
        if mine is None:
            self._g = g
            self._gshared = True
            return
        if self._gshared:
            self._g = mine = _owned_copy(mine, self._data)
            self._gshared = False
        mine += g

    def reset(self):
        """Forget the gradient: ``g`` reads as zeros until the next ``back()``."""
        self._g = self._gread = None
        self._gshared = False

    # -- the backward pass
    def back(self, g=None, trace=False):
        """Backpropagate from this node: fill ``.g`` of every node it depends on.

        ``g`` seeds this node's gradient (ones by default) and must have its shape. Every
        ``_back`` of the reachable graph runs exactly once, after all of its consumers. Op
        nodes start each call from zero; leaf gradients accumulate across calls until
        ``reset()``. With ``trace=True`` the steps are recorded and returned as a
        ``nnkit.trace.Trace``.
        """
        if not self.requires_grad:
            raise RuntimeError(
                f"back(): {self._describe()} does not require a gradient ({NO_GRAD_CAUSES})")
        if g is None:
            seed = backend.array_module(self._data).ones_like(self._data)
        else:
            seed = _gradient_from_user(g, self, f"back(): the seed gradient of {self._describe()}")
            if seed is g or seed is getattr(g, "_data", None):
                seed = seed.copy()      # the caller's array: the gradients must not follow it
        nodes = _reverse_topological(self)
        _check_edits(nodes)             # refused before any gradient changes
        for node in nodes:              # op nodes start from zero (leaves accumulate)
            node._g = None
        self.accumulate(seed)
        return _propagate(nodes, trace)

    def __deepcopy__(self, memo):
        """An independent copy (data, gradient, parents copied) with a creation index of its
        own: drawings and traces tell nodes apart by it."""
        clone = object.__new__(type(self))
        memo[id(self)] = clone
        for name, value in _attributes(self):
            setattr(clone, name, copy.deepcopy(value, memo))
        clone._index = next(_counter)            # after its parents' copies: still larger
        return clone

    def __copy__(self):
        """A copy with its own data (and gradient) and creation index, the same parents: two
        nodes never share an array (an edit through one would go unseen) or an index."""
        clone = object.__new__(type(self))
        for name, value in _attributes(self):
            setattr(clone, name, value)
        clone._data = self._data.copy()
        if self._g is not None:
            clone._g, clone._gshared = self._g.copy(), False
        clone._index = next(_counter)
        return clone

    def __setstate__(self, state):
        """Unpickling: the attributes, and a creation index of this process (the pickled one
        may belong to a live node here). The edit stamps of another process mean nothing
        here (compared with this one's, an edit went unseen or a fresh graph was refused): an
        unpickled graph counts as built now, unedited."""
        attributes, slots = state if isinstance(state, tuple) else (state, None)
        for mapping in (attributes, slots):
            for name, value in (mapping or {}).items():
                setattr(self, name, value)
        self._index = next(_counter)
        if hasattr(self, "_pversion"):
            self._pversion = _edits
        if hasattr(self, "_version"):
            self._version = 0

    # -- the graph
    def detach(self):
        """A constant NetVar holding a copy of this node's data, cut from the graph (a copy:
        an edit through it, ``d.data += 1``, must not change the data this node's graph
        used without the engine seeing it)."""
        return constant(self._data.copy())

    @property
    def parents(self):
        """The nodes this one was computed from (empty for leaves and no_grad results)."""
        return self._parents

    @property
    def index(self):
        """Creation index: a parent's is always smaller than its children's."""
        return self._index

    __hash__ = object.__hash__


# ----------------------------------------------------------------------------- NetOp

class NetOp(NetVar):
    """A NetVar whose ``data`` is computed once, in its constructor, from its parents.

    Every op, built-in or a user's, is written the same way:

    - the constructor checks its arguments (errors name the op, the argument and the shapes),
      computes the value with ``xp = backend.array_module(x.data)`` (NumPy or CuPy) and calls
      ``super().__init__(value, *parents)``. Parents are recorded only when grad mode is on and
      some parent needs a gradient;
    - ``_back(self, *parents)`` hands each parent its share of the upstream gradient ``self.g``
      with ``parent.accumulate(g)``, which sums a broadcast ``g`` back to the parent's shape,
      casts it to the parent's dtype, refuses a ``g`` that cannot be summed back and ignores a
      parent that needs no gradient; ``parent.accumulate_same_shape(g)`` skips the shape and
      dtype tests for a ``g`` that has them by construction (one-input elementwise ops);
      ``parent.g += ...`` works too, as the article writes it. An op class that defines its own
      ``accumulate`` gets every consumer's contribution through it (``grad(create_graph=True)``
      builds gradients from ``_grads`` and calls no ``accumulate``);
    - ``_grads(self, g, *parents)`` (or ``_composite(self, *parents)``) is the same backward
      rule written with ops on nodes, which ``nnkit.grad(..., create_graph=True)`` uses for
      gradients of gradients; an op without either refuses only that;
    - the docstring states the forward and backward formulas (x, w, b inputs; y output;
      g upstream gradient; B rows).

    The built-in ops read the engine's slots ``x._data`` and ``self._g``: the same arrays as
    ``x.data`` and ``self.g`` without a property call (and ``.g`` copies a gradient another
    node shares before handing it out, which a ``_back`` that only reads it does not need).
    Each built-in op class declares ``__slots__`` with the attributes it stores (``()`` when
    none), so its nodes carry no ``__dict__``; a user's op may do without. An op that keeps an
    array it was given beside its parents and reads it in ``_back`` (a mask, an index) names
    the attribute in ``kept_arrays``: inside ``detect_anomaly()`` it is hashed with the
    parents' data, and an in-place edit before ``back()`` is caught.
    """
    __slots__ = ()
    kept_arrays = ()

    def __init_subclass__(cls, **kwargs):
        """Each op class gets its own copy of the accumulate methods (see ``own_code``): every
        op's ``_back`` calls them on its parents, nodes of every op class."""
        super().__init_subclass__(**kwargs)
        if "accumulate" in cls.__dict__ and "accumulate_same_shape" not in cls.__dict__:
            # a class's own accumulate is its one rule: the same-shape shortcut (one-input
            # elementwise consumers call it) must not skip it
            cls.accumulate_same_shape = cls.__dict__["accumulate"]
        for name in ("accumulate", "accumulate_same_shape"):
            if name not in cls.__dict__:
                setattr(cls, name, own_code(getattr(cls, name), cls))

    def __init__(self, data, *parents):
        if type(data) is not _ndarray:
            data = _as_op_array(data)
        self._data = data
        self._g = None
        self._index = next(_counter)
        try:
            for parent in parents:
                if parent.requires_grad and (not _grad_off or _state.grad):
                    self.requires_grad = True
                    self._parents = parents
                    self._pversion = _edits
                    break
            else:
                self.requires_grad = False
                self._parents = ()
        except AttributeError as error:     # (costs nothing unless raised)
            raise (_not_nodes(self, parents) or error) from None
        if _observers:
            for observer in _observers:
                observer.forward(self, parents)

    def _back(self, *parents):
        """Add each parent's gradient contribution: every subclass defines its own.

        ``super()._back()`` with no arguments (as the article's ops end) does nothing; the
        engine calls ``_back`` with the parents, which reaches here only when the subclass
        defines no backward rule, and that must not pass as a zero gradient.
        """
        if parents:
            raise NotImplementedError(
                f"back(): {type(self).__name__} defines no _back, so nnkit cannot "
                f"backpropagate through {self._describe()}; give the op a "
                f"_back(self, {', '.join(f'input{i}' for i in range(len(parents)))}) that "
                "accumulates each input's gradient")

    def _grads(self, g, *parents):
        """The backward rule written with ops on nodes, for ``nnkit.grad(create_graph=True)``:
        returns each parent's gradient as a node (None for none), given the upstream gradient
        as the node ``g``. Every subclass that can be differentiated twice defines it (or
        ``_composite(*parents)``, the same value built from such ops); this one refuses.
        """
        raise NotImplementedError(
            f"grad(create_graph=True): {type(self).__name__} defines no _grads, so nnkit cannot "
            f"differentiate the backward pass of {self._describe()}; give the op a "
            f"_grads(self, g, {', '.join(f'input{i}' for i in range(len(parents)))}) that returns "
            "each input's gradient built from ops (docs/contributing.md, 'Higher-order "
            "gradients'), or use create_graph=False")


def _link(node, data, a, b=None):
    """``NetOp.__init__(node, data, a, b)`` for the operators' fast path (ops/surface.py) alone;
    returns ``node``.

    The same bookkeeping with a fixed argument list: Python specialises a call to a function
    without ``*parents`` and runs it inside the caller's frame, which on the chains of tiny
    steps these operators make is a visible part of each op's cost.
    """
    if type(data) is not _ndarray:
        data = _as_op_array(data)
    node._data = data
    node._g = None
    node._index = next(_counter)
    if (a.requires_grad or (b is not None and b.requires_grad)) and (
            not _grad_off or _state.grad):
        node.requires_grad = True
        node._parents = (a,) if b is None else (a, b)
        node._pversion = _edits
    else:
        node.requires_grad = False
        node._parents = ()
    if _observers:
        for observer in _observers:
            observer.forward(node, (a,) if b is None else (a, b))
    return node


def own_code(function, owner=None):
    """A copy of ``function`` with a code object of its own, and otherwise the same (defaults,
    attributes; named as a method of ``owner`` when given, so that pickle finds it there).

    CPython specialises each attribute read and write in a code object to the class of the
    object it last saw, and gives up the specialisation when the classes keep changing. The
    engine's functions that run on every node (``accumulate``, the operators' bookkeeping)
    meet nodes of every op class; one copy per class keeps each copy on one class. Measured on
    W1 (benchmarks/), about 6% of a tiny op's time. (So patching ``NetVar.accumulate`` reaches
    the leaves only: patch the op class whose nodes you mean.)
    """
    copy = types.FunctionType(function.__code__.replace(), function.__globals__,
                              function.__name__, function.__defaults__, function.__closure__)
    copy.__kwdefaults__ = function.__kwdefaults__
    copy.__dict__.update(function.__dict__)
    copy.__doc__ = function.__doc__
    copy.__qualname__ = function.__qualname__
    copy.__module__ = function.__module__
    if owner is not None:
        copy.__qualname__ = f"{owner.__qualname__}.{function.__name__}"
        copy.__module__ = owner.__module__
    return copy


def _not_nodes(op, parents):
    """The TypeError for an op given parents that are not nodes (None for an absent bias, an
    array): it fails in back() otherwise, naming neither. None when every parent is a node
    (the AttributeError came from elsewhere: the caller re-raises it)."""
    position, parent = next(((k, p) for k, p in enumerate(parents)
                             if not isinstance(p, NetVar)), (None, None))
    if position is None:
        return None
    return TypeError(f"{type(op).__name__}: parent {position} given to super().__init__ is "
                     f"{type(parent).__name__}, not a node (a NetVar); pass only nodes (leave "
                     "an absent input out, make an array a NetVar)")


def _as_op_array(data):
    if isinstance(data, NetVar):
        return data._data
    if hasattr(data, "__cuda_array_interface__"):
        return data
    return numpy.asarray(data)


# ----------------------------------------------------------------------------- engine internals

def _propagate(nodes, trace=False):
    """Call ``_back`` on each of ``nodes`` (op nodes, children before parents) whose gradient a
    consumer or a seed has given: the loop of ``back()``, shared with ``nnkit.grad``. The
    caller has run ``_check_edits(nodes)`` before changing any gradient."""
    global _passes
    _passes += 1
    observers = _observers
    if trace:
        recorder = _recorder()
        observers = observers + [recorder]
    for node in nodes:
        if node._g is not None:
            if observers:
                for observer in observers:
                    observer.before(node)
            parents = node._parents
            # `_back(*parents)` as a call with a fixed argument list when it has one or two
            # parents (almost every op): Python runs such a call inside the loop's frame.
            if len(parents) == 2:
                node._back(parents[0], parents[1])
            elif len(parents) == 1:
                node._back(parents[0])
            else:
                node._back(*parents)
            if not node._gshared:     # its parents may hold its array now: .g copies first
                node._gshared = True
            if observers:
                for observer in observers:
                    observer.after(node)
    return recorder.trace() if trace else None


def _check_edits(nodes):
    """Refuse a pass through an op whose input (or output) was edited after it was built
    (``InplaceEditError``), checking every node before any gradient changes. Only when an edit
    happened since the oldest op was built (nodes run newest first) is there anything to see."""
    stamp = _edits
    if nodes and nodes[-1]._pversion < stamp:
        for node in nodes:
            if node._pversion < stamp:
                _check_versions(node)


def _reverse_topological(root):
    """The op nodes reachable from ``root`` (itself included), children before parents."""
    if not root._parents:
        return []
    seen = {root}
    nodes = [root]
    visit, collect = seen.add, nodes.append       # bound once: a hot loop
    try:
        for node in nodes:        # the list grows as the loop reads it: each node once
            for parent in node._parents:
                if parent._parents and parent not in seen:
                    visit(parent)
                    collect(parent)
    except AttributeError as error:     # a parent that is not a node (costs nothing)
        raise (_not_nodes(node, node._parents) or error) from None
    nodes.sort(key=_creation_index, reverse=True)
    return nodes


def _attributes(node):
    """``(name, value)`` of every attribute a node holds: its slots, and a user's op's
    ``__dict__``."""
    for klass in type(node).__mro__:
        slots = getattr(klass, "__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name != "__weakref__" and hasattr(node, name):
                yield name, getattr(node, name)
    yield from getattr(node, "__dict__", {}).items()


_creation_index = operator.attrgetter("_index")     # a C-level sort key: no Python call per node


def _check_versions(node):
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
