"""Module: the base class of anything that owns parameters (layers, models, FFN).

Assigning is registering: a NetVar, a Module, or a list, tuple or dict of them stored as an
attribute is found by walking the object's attributes in the order they were assigned. A
parameter is a leaf NetVar that requires a gradient, a constant one that does not (a frozen
weight); a node computed by an op (the last output a model keeps, even one computed under
``no_grad()``, which has no parents) is a graph, and is neither listed, saved, moved nor copied.

Buffers are arrays that are saved and moved but never trained (BatchNorm's running
statistics). An object declares them with a class attribute ``buffers``, the names of its
attributes that hold them; the walk finds such objects like parameters (``BatchNormState`` is
one, so an FFN with BatchNorm saves its statistics). It may also define
``check_buffer(attribute, array, where)``, which ``load_state`` calls on each incoming array
before anything is assigned (BatchNormState refuses a negative or non-finite statistic).

Names are dotted paths of attributes, list indices and dict keys: ``blocks.0.fc.W``. A set
holding layers or parameters is refused, naming the attribute: it has no order to name them by
(PyTorch's ``nn.Module`` ignores one silently).

All of it is one walk, ``walk`` (below): the names, parameters, constants, buffers and
submodules that ``named_vars()``, ``state()``, ``load_state()``, the device moves, ``repr``,
``nn.save`` / ``nn.load`` and ``nnkit.distributed``'s collectives use, with each refusal worded
once. ``tests/test_structure.py`` names any other function of nnkit that walks models or
collections on its own.
"""
import copy
import html
import reprlib
from collections.abc import Mapping
import weakref

import numpy

from . import backend
from .core import NetOp, NetVar
from .dtypes import native
from .hints import spelling

__all__ = ["Module", "walk", "former_names"]


class BufferNames(tuple):
    """The class attribute ``buffers`` of a Module: a tuple of attribute names, as the walk and
    capture read it (``type(owner).buffers``), that answers a call (``model.buffers()``, a
    method elsewhere) with the spelling of the buffers themselves. Each Module class gets its
    own, its ``owner`` named, from the tuple it assigns or inherits (``Module.__init_subclass__``).
    """

    def __new__(cls, names=(), owner="Module"):
        self = super().__new__(cls, names)
        self.owner = owner
        return self

    def __call__(self, *args, **keywords):
        raise TypeError(f"{self.owner}.buffers is a class attribute, the names of the "
                        f"attributes that hold the class's own buffers {tuple(self)!r}, not a "
                        f"method: a model's buffers are model.named_buffers(), a dict of dotted "
                        f"name → array over every submodule, and model.state() holds them with "
                        f"the parameters")


class Module:
    """Base class for models and layers: subclass it, assign parameters and submodules as
    attributes in ``__init__``, and define ``forward``; ``model(x)`` calls ``model.forward(x)``.

        class Residual(nn.Module):
            def __init__(self, features):
                self.fc = nn.layers.Linear(features, features)

            def forward(self, x):
                return x + nn.ReLU(self.fc(x))

    ``vars`` / ``named_vars()`` list the trainable parameters (each once, even when shared);
    ``named_constants()`` the leaf NetVars that need no gradient (a weight frozen with
    ``requires_grad = False``, a fixed table); ``state()`` / ``load_state()`` copy parameters,
    constants and buffers out and back in (``nn.save`` and ``nn.load`` use them);
    ``to_gpu()`` / ``to_cpu()`` move them in place, so an optimizer built on ``model.vars``
    keeps working; ``copy.deepcopy(model)`` copies them, not the last graph. A subclass need
    not call ``Module.__init__``.
    """
    buffers = BufferNames()     # names of the attributes holding buffers; not a method
    # True when the members are the arguments of the model's computation (FFN's topology): a
    # node computed by an op that needs a gradient among them is refused (training would not
    # change it), and so is the model inside itself (it would call itself forever). Else a
    # computed node is the last output the model keeps, and a cycle is walked once.
    members_are_arguments = False
    # Old dotted name → current one, relative to the module, of what this class once named
    # otherwise: checkpoints and states written before the rename still load (former_names).
    renamed = {}
    # The attributes forward sets to nodes of its last call, to read after it (FFN's output):
    # nn.capture lets a step set them, and a replay, which builds no nodes, leaves in each a
    # marker that says so when it is used (docs/capture.md).
    last_call = ()

    def __init_subclass__(cls, **keywords):
        super().__init_subclass__(**keywords)
        if isinstance(cls.buffers, tuple):      # buffers = ("running_mean",), or inherited
            cls.buffers = BufferNames(cls.buffers, cls.__name__)

    def __call__(self, *args, **keywords):
        return self.forward(*args, **keywords)

    def forward(self, *args, **keywords):
        """The model's computation: every Module subclass defines its own."""
        raise NotImplementedError(f"{type(self).__name__} defines no forward(); a Module is "
                                  "called as model(...), which runs model.forward(...)")

    # -- what the model holds
    def members(self):
        """``(name, value)`` for each attribute the walk looks into, in assignment order.

        The default is every instance attribute. A subclass whose parameters live elsewhere
        (FFN's topology) overrides it.
        """
        return list(vars(self).items())

    def named_vars(self):
        """Dict of dotted name → trainable parameter (a leaf NetVar that requires a gradient),
        in a deterministic order; a parameter reachable under several names is listed once,
        under the first."""
        return {name: value for name, kind, value in walk(self) if kind == "var"}

    @property
    def vars(self):
        """The trainable parameters, each once, in the order of ``named_vars()``."""
        return [value for _, kind, value in walk(self) if kind == "var"]

    def named_constants(self):
        """Dict of dotted name → leaf NetVar that needs no gradient (``requires_grad`` False:
        a frozen weight, a fixed table), each once: saved, loaded and moved with the
        parameters, never trained."""
        return {name: value for name, kind, value in walk(self) if kind == "constant"}

    def named_buffers(self):
        """Dict of dotted name → buffer array (saved and moved, never trained)."""
        return {name: getattr(*value) for name, kind, value in walk(self) if kind == "buffer"}

    # -- state: copies out, checked copies in
    def state(self):
        """Dict of dotted name → host (NumPy) copy of every parameter, constant and buffer."""
        return {name: backend.to_cpu(_array(kind, value)).copy()
                for name, kind, value in walk(self) if kind != "module"}

    def load_state(self, state):
        """Assign the arrays of ``state`` (as ``state()`` returns it, or any mapping of name →
        array, such as the ``NpzFile`` that ``numpy.load`` returns for ``numpy.savez(path,
        **model.state())``) to the parameters and buffers of the same names, each on its
        current device.

        Every name, shape and dtype is checked first: a missing or unexpected name, another
        shape or another dtype raises (KeyError, ValueError, TypeError naming the first
        difference) and nothing is assigned. Parameters keep their identity (an optimizer over
        ``vars`` keeps working); their gradients are forgotten. A buffer may come in another
        float dtype and is taken in it: buffers follow the data's dtype at their next use
        (BatchNorm's statistics of float64 data are float64). The byte order is no difference
        (a big-endian '>f4' array loads into a float32 parameter, in the parameter's order).
        """
        where = f"{type(self).__name__}.load_state"
        if not isinstance(state, Mapping):
            raise TypeError(f"{where}: state must be a dict (a mapping) of name → array, got "
                            f"{type(state).__name__}")
        targets = [entry for entry in walk(self, where) if entry[1] != "module"]
        names = [name for name, _, _ in targets]
        former = former_names(self)         # a state written before a class renamed its parts
        keys = {name: former[name] if name not in state and former.get(name) in state else name
                for name in names}
        missing = [name for name in names if keys[name] not in state]
        if missing:
            raise KeyError(f"{where}: the state has no '{missing[0]}' ({len(missing)} of the "
                           f"model's {len(names)} names missing)")
        unexpected = [key for key in state if key not in set(keys.values())]
        if unexpected:
            raise KeyError(f"{where}: the state has '{unexpected[0]}', which the model does not "
                           f"have ({len(unexpected)} unexpected names)")
        given = {name: state[keys[name]] for name in names}   # an NpzFile reads each once
        for name, kind, value in targets:
            mine, array = _array(kind, value), given[name]
            if not backend.is_array(array):
                raise TypeError(f"{where}: '{name}' must be an array, got "
                                f"{type(array).__name__}")
            if tuple(array.shape) != tuple(mine.shape):
                raise ValueError(f"{where}: '{name}' has shape {tuple(array.shape)} in the state "
                                 f"and {tuple(mine.shape)} in the model")
            if kind != "buffer" and native(array.dtype) != native(mine.dtype) \
                    or array.dtype.kind != mine.dtype.kind:
                raise TypeError(f"{where}: '{name}' has dtype {array.dtype} in the state and "
                                f"{mine.dtype} in the model")
            owner = value[0] if kind == "buffer" else None
            if callable(getattr(owner, "check_buffer", None)):    # e.g. no negative variance
                owner.check_buffer(value[1], array, f"{where}: '{name}'")
        for name, kind, value in targets:               # all checked: now assign
            array = _like(given[name], _array(kind, value))
            if kind == "buffer":
                setattr(*value, array)
            else:
                value.data = array
                value.reset()
        return self

    # -- devices
    def to_gpu(self, device=None):
        """Move every parameter, constant and buffer to the GPU (CuPy; GPU number ``device``)
        in place; returns the model. The last graph a model keeps is dropped (it lives on the
        old device). Raises RuntimeError when CuPy with a GPU is not available."""
        backend.to_gpu(numpy.zeros(0), device)     # fails before anything moves
        return self._move(lambda node: node.to_gpu(device),
                          lambda array: backend.to_gpu(array, device))

    def to_cpu(self):
        """Move every parameter, constant and buffer to host memory (NumPy) in place; returns
        the model."""
        return self._move(lambda node: node.to_cpu(), backend.to_cpu)

    def _move(self, move_node, move_array):
        for _, kind, value in walk(self):
            if kind == "buffer":
                setattr(*value, move_array(getattr(*value)))
            elif kind == "module":
                value._move_own_data(move_node, move_array)
            else:
                move_node(value)
        return self

    def _move_own_data(self, move_node, move_array):
        """What this module holds outside its members and must not keep on the old device:
        its last graph (the nodes computed by ops it keeps as attributes, its last output),
        which is dropped. A module that keeps data outside its members (FFN's plain arrays and
        Loss targets) moves it here."""
        self._forget_graph()

    def _forget_graph(self):
        """Drop the nodes computed by ops that this module keeps as attributes (its last
        output): the graph of the last call, which must not move, be copied or be saved."""
        for name, value in list(vars(self).items()):
            if _is_graph(value):
                setattr(self, name, None)

    def __deepcopy__(self, memo):
        """A copy with its own parameters and buffers (shared ones stay shared within the
        copy); the last graph the model keeps is not copied."""
        clone = type(self).__new__(type(self))
        memo[id(self)] = clone
        for name, value in vars(self).items():
            setattr(clone, name, None if _is_graph(value) else copy.deepcopy(value, memo))
        return clone

    # -- printing
    def extra_repr(self):
        """What ``repr`` shows in the parentheses after the class name (a layer's sizes)."""
        return ""

    def tree(self):
        """The lines of ``repr(self)`` without the parameter count: the class, then one line
        per parameter, buffer and submodule (indented), as the walk finds them."""
        body = []
        for name, kind, value in walk(self, descend=False)[1:]:
            if kind == "module":
                lines = value.tree()
                body += [f"({name}): {lines[0]}"] + lines[1:]
            elif kind == "var":
                body.append(f"({name}): {tuple(value.shape)} {value.dtype}")
            elif kind == "buffer":
                body.append(f"({name}): buffer {tuple(getattr(*value).shape)}")
        head = f"{type(self).__name__}({self.extra_repr()}"
        return [head + ")"] if not body else [head] + ["  " + line for line in body] + [")"]

    def __repr__(self):
        lines = self.tree()
        count = f"{sum(p.size for p in self.vars):,} parameters"
        if len(lines) == 1:
            return f"{lines[0]}  # {count}"
        return "\n".join(lines[:-1] + [f"  # {count}", lines[-1]])

    def _repr_html_(self):
        return f"<pre>{html.escape(repr(self))}</pre>"

    # -- PyTorch's names, and parameters replaced under an optimizer
    def __getattr__(self, name):
        """Called only when the normal lookup found nothing: PyTorch's names
        (``model.parameters()``, ``.eval()``, ...) raise an AttributeError naming nnkit's
        spelling (``hints.PYTORCH["module"]``); any other name raises Python's own error."""
        ours = spelling("module", name)
        # (again, so that a property's own AttributeError is the one seen, even one of the
        # class's own with a PyTorch name)
        if ours is None or hasattr(type(self), name):
            return object.__getattribute__(self, name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}; in nnkit: {ours}")

    def __setattr__(self, name, value):
        """Assigning is registering (nothing more), except that replacing a parameter (or a
        submodule holding parameters) that a live optimizer updates is told to that
        optimizer, whose next ``step()`` refuses to go on training the NetVar the model no
        longer uses (see ``watch_replacements``)."""
        if _watchers:
            old = self.__dict__.get(name)
            if old is not value and isinstance(old, (NetVar, Module)):
                replaced = parameters_of(old)
                if replaced:            # what the new value still holds is not replaced
                    kept = {id(p) for p in parameters_of(value)}
                    replaced = [p for p in replaced if id(p) not in kept]
                for watcher in list(_watchers) if replaced else ():
                    watcher.parameters_replaced(replaced, f"{type(self).__name__}.{name}",
                                                self, name)
        object.__setattr__(self, name, value)


_watchers = weakref.WeakSet()


def parameters_of(value):
    """The parameters an attribute's value holds, for the replacement watchers: a parameter
    itself, a Module's vars, none for anything else (a graph, or a Module the walk refuses: no
    optimizer was built over its vars, and removing it must not raise the walk's error)."""
    if isinstance(value, NetVar):
        return [value] if value.requires_grad and not value.parents else ()
    if not isinstance(value, Module):
        return ()
    try:
        return value.vars
    except (TypeError, ValueError):
        return ()


def watch_replacements(watcher):
    """Tell ``watcher`` (an optimizer) whenever a Module's attribute holding a NetVar or a
    Module is assigned another value: ``watcher.parameters_replaced(old_parameters, where,
    owner, attribute)``, ``where`` naming the attribute (``"Linear.W"``), ``owner`` the Module
    and ``attribute`` its name (to see whether it holds them again later: assigned back). Only
    attributes are seen: a parameter replaced inside a list or dict, or outside any Module, is
    not."""
    _watchers.add(watcher)


# ----------------------------------------------------------------------------- the walk

def _is_graph(value):
    """A node computed by an op: with parents, or built under no_grad() (an op without)."""
    return isinstance(value, NetVar) and (bool(value._parents) or isinstance(value, NetOp))


def _registers(value):
    """Whether the walk looks into ``value``: a NetVar, a Module, an object with buffers."""
    return isinstance(value, (NetVar, Module)) or _buffer_names(value)


_PLAIN = frozenset({int, float, complex, bool, str, bytes, type(None)})


def _buffer_names(value):
    names = getattr(type(value), "buffers", ())
    return names if names and isinstance(names, tuple) and not isinstance(value, type) else ()


def walk(root, where=None, label="model", descend=True):
    """The one walk over models and collections: ``(name, kind, value)`` for what ``root`` (a
    Module, a NetVar, or a list, tuple or dict of them, nested as you like) holds, each once,
    in a deterministic order (attributes in assignment order, then items in order).

    kind "module": a Module (``root`` itself first, named ""); "var": a parameter (a leaf NetVar
    that requires a gradient); "constant": a leaf NetVar that does not; "buffer": an array an
    object declares in its class attribute ``buffers``, value ``(owner, attribute)``. Names are
    dotted paths of attributes (``members()``), list indices and dict keys: ``blocks.0.fc.W``.
    A NetVar or a buffer reachable twice is listed under its first name. With ``descend``
    False the walk lists the Modules below ``root`` without looking into them.

    Inside a Module anything else is ignored (numbers, functions, the last output a model
    keeps: a node computed by an op). Refused, naming ``where`` (default: root's class) and the
    place (``label`` then the path: ``model.blocks[0]``), each in one wording for every caller:
    two things under one name (ValueError); a collection, or a Module whose
    ``members_are_arguments`` (FFN), inside itself (ValueError); layers or parameters kept in a
    set (TypeError: a set has no order to name them by); a node computed by an op that needs a
    gradient among the members of a Module whose ``members_are_arguments`` (TypeError); and, in
    a collection outside every Module, a computed node or anything that is not a NetVar, a
    Module or a collection of them (TypeError).
    """
    where = where or type(root).__name__
    found, seen, names = [], set(), {}
    trail = []              # the place, in pieces: ".attribute", or (key,) for an item
    inside = {}             # id -> len(trail) of each Module and collection being walked

    def place(pieces=trail):    # formatted only for an error (the walk's hot path)
        return label + "".join(piece if isinstance(piece, str) else f"[{piece[0]!r}]"
                               for piece in pieces)

    def contains_itself(value):
        return ValueError(f"{where}: {place()} contains itself ({place()} is "
                          f"{place(trail[:inside[id(value)]])})")

    def not_a_part(value):
        return TypeError(f"{where}: {place()} is {type(value).__name__} {reprlib.repr(value)}, "
                         "not a parameter (a NetVar), a Module, or a list or dict of them")

    def add(name, kind, value):
        if name in names:           # e.g. a dict key with a dot: "a.b" and {"a": {"b": ...}}
            raise ValueError(f"{where}: {place(names[name])} and {place()} would both be named "
                             f"'{name}'; rename one (a dict key or an attribute must not "
                             "contain a dot)")
        names[name] = tuple(trail)
        found.append((name, kind, value))

    def visit(value, name, graphs):
        # graphs: what a computed node is here: "skip" (inside a Module: its last output),
        # "refuse" (a collection outside every Module), "refuse trained" (FFN's arguments)
        if type(value) in _PLAIN:       # most attributes of a layer: sizes, flags, names
            if graphs == "refuse":
                raise not_a_part(value)
            return
        if isinstance(value, NetVar):
            if value._parents or isinstance(value, NetOp):      # computed by an op
                if graphs == "refuse" or graphs == "refuse trained" and value.requires_grad:
                    raise TypeError(f"{where}: {place()} is a NetVar that is computed by an op "
                                    f"({value._describe()}), so its value is fixed and training "
                                    "would not change it; give leaf NetVars (parameters), the "
                                    "model, or build a constant under no_grad()")
            elif id(value) not in seen:
                seen.add(id(value))
                add(name, "var" if value.requires_grad else "constant", value)
            return
        if isinstance(value, Module):
            if id(value) in inside and value.members_are_arguments:
                raise contains_itself(value)
            if id(value) in seen:
                return
            seen.add(id(value))
            found.append((name, "module", value))
            if descend or value is root:
                inside[id(value)] = len(trail)
                mode = "refuse trained" if value.members_are_arguments else "skip"
                for attribute, item in value.members():
                    trail.append("." + attribute)
                    visit(item, f"{name}.{attribute}" if name else attribute, mode)
                    trail.pop()
                del inside[id(value)]
        elif isinstance(value, (list, tuple, Mapping)):
            if id(value) in inside:
                raise contains_itself(value)
            inside[id(value)] = len(trail)
            for key, item in (value.items() if isinstance(value, Mapping) else enumerate(value)):
                trail.append((key,))
                visit(item, f"{name}.{key}" if name else str(key), graphs)
                trail.pop()
            del inside[id(value)]
            return
        elif isinstance(value, (set, frozenset)):
            held = [item for item in value if _registers(item)]
            if held or graphs == "refuse":
                raise TypeError(f"{where}: {place()} is a {type(value).__name__}"
                                + (f" holding a {type(held[0]).__name__}" if held else "")
                                + "; a set has no order to name its items by, so nnkit does "
                                "not register layers or parameters kept in one: use a list or "
                                "a dict")
            return
        elif _buffer_names(value):
            if id(value) in seen:
                return
            seen.add(id(value))
        else:
            if graphs == "refuse":
                raise not_a_part(value)
            return
        for attribute in _buffer_names(value):
            if backend.is_array(getattr(value, attribute, None)):
                trail.append("." + attribute)
                add(f"{name}.{attribute}" if name else attribute, "buffer", (value, attribute))
                trail.pop()

    visit(root, "", "refuse")
    return found


def dotted(prefix, name):
    """``prefix.name``, or ``name`` at the top: how nested names are written."""
    return f"{prefix}.{name}" if prefix else name


def former_names(root):
    """Current dotted name → the name an older nnkit gave it, for the parts of every Module
    under ``root`` whose class declares ``renamed`` (a SequenceModel's ``rnn.W`` was its
    ``W``): what ``load_state`` and ``nn.load`` accept in place of the current names."""
    return {dotted(prefix, new): dotted(prefix, old) for prefix, kind, module in walk(root)
            if kind == "module" for old, new in type(module).renamed.items()}


def _array(kind, value):
    """The array of a walk entry: a buffer's, or a NetVar's data."""
    return getattr(*value) if kind == "buffer" else value._data


def _like(array, mine):
    """``array`` on the device of ``mine`` (a fresh array: the state's own is never kept), in
    ``mine``'s byte order where only that differs (a big-endian file's '>f4'), else native."""
    host = backend.to_cpu(array)
    dtype = mine.dtype if native(host.dtype) == native(mine.dtype) else native(host.dtype)
    if backend.array_module(mine) is numpy:
        return numpy.array(host, dtype=dtype)
    return backend.to_gpu(host.astype(dtype, copy=False), mine.device.id)
