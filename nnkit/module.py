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

Names are dotted paths of attributes, list indices and dict keys: ``blocks.0.fc.W``.
"""
import copy
import html
import weakref

import numpy

from . import backend
from .core import NetOp, NetVar
from .hints import spelling

__all__ = ["Module"]


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
    buffers = ()

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
        return {name: value for name, value, kind in _walk(self) if kind == "var"}

    @property
    def vars(self):
        """The trainable parameters, each once, in the order of ``named_vars()``."""
        return list(self.named_vars().values())

    def named_constants(self):
        """Dict of dotted name → leaf NetVar that needs no gradient (``requires_grad`` False:
        a frozen weight, a fixed table), each once: saved, loaded and moved with the
        parameters, never trained."""
        return {name: value for name, value, kind in _walk(self) if kind == "constant"}

    def named_buffers(self):
        """Dict of dotted name → buffer array (saved and moved, never trained)."""
        return {name: getattr(*value) for name, value, kind in _walk(self)
                if kind == "buffer"}

    # -- state: copies out, checked copies in
    def state(self):
        """Dict of dotted name → host (NumPy) copy of every parameter, constant and buffer."""
        out = {}
        for name, value, kind in _walk(self):
            array = getattr(*value) if kind == "buffer" else value._data
            out[name] = backend.to_cpu(array).copy()
        return out

    def load_state(self, state):
        """Assign the arrays of ``state`` (as ``state()`` returns it) to the parameters and
        buffers of the same names, each on its current device.

        Every name, shape and dtype is checked first: a missing or unexpected name, another
        shape or another dtype raises (KeyError, ValueError, TypeError naming the first
        difference) and nothing is assigned. Parameters keep their identity (an optimizer over
        ``vars`` keeps working); their gradients are forgotten. A buffer may come in another
        float dtype and is taken in it: buffers follow the data's dtype at their next use
        (BatchNorm's statistics of float64 data are float64).
        """
        if not isinstance(state, dict):
            raise TypeError(f"{type(self).__name__}.load_state: state must be a dict of name → "
                            f"array, got {type(state).__name__}")
        targets = [(name, value, kind) for name, value, kind in _walk(self)]
        names = [name for name, _, _ in targets]
        where = f"{type(self).__name__}.load_state"
        missing = [name for name in names if name not in state]
        if missing:
            raise KeyError(f"{where}: the state has no '{missing[0]}' ({len(missing)} of the "
                           f"model's {len(names)} names missing)")
        unexpected = [name for name in state if name not in set(names)]
        if unexpected:
            raise KeyError(f"{where}: the state has '{unexpected[0]}', which the model does not "
                           f"have ({len(unexpected)} unexpected names)")
        for name, value, kind in targets:
            mine = getattr(*value) if kind == "buffer" else value._data
            given = state[name]
            if not backend.is_array(given):
                raise TypeError(f"{where}: '{name}' must be an array, got "
                                f"{type(given).__name__}")
            if tuple(given.shape) != tuple(mine.shape):
                raise ValueError(f"{where}: '{name}' has shape {tuple(given.shape)} in the state "
                                 f"and {tuple(mine.shape)} in the model")
            if kind != "buffer" and given.dtype != mine.dtype or given.dtype.kind != mine.dtype.kind:
                raise TypeError(f"{where}: '{name}' has dtype {given.dtype} in the state and "
                                f"{mine.dtype} in the model")
            owner = value[0] if kind == "buffer" else None
            if callable(getattr(owner, "check_buffer", None)):    # e.g. no negative variance
                owner.check_buffer(value[1], given, f"{where}: '{name}'")
        for name, value, kind in targets:               # all checked: now assign
            mine = getattr(*value) if kind == "buffer" else value._data
            array = _like(state[name], mine)
            if kind == "buffer":
                setattr(*value, array)
            else:
                value.data = array
                value.reset()
        return self

    # -- devices
    def to_gpu(self, device=None):
        """Move every parameter and buffer to the GPU (CuPy; GPU number ``device``) in place;
        returns the model. The last graph a model keeps is dropped (it lives on the old
        device). Raises RuntimeError when CuPy with a GPU is not available."""
        backend.to_gpu(numpy.zeros(0), device)     # fails before anything moves
        return self._move(lambda node: node.to_gpu(device),
                          lambda array: backend.to_gpu(array, device))

    def to_cpu(self):
        """Move every parameter and buffer to host memory (NumPy) in place; returns the
        model."""
        return self._move(lambda node: node.to_cpu(), backend.to_cpu)

    def _move(self, move_node, move_array):
        for _, value, kind in _walk(self):
            if kind == "buffer":
                setattr(*value, move_array(getattr(*value)))
            else:
                move_node(value)
        for module in _modules(self):
            module._forget_graph()
        return self

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
        per parameter, buffer and submodule (indented)."""
        body = []
        for name, value in self.members():
            body.extend(_describe_member(name, value))
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
        if ours is None:        # (again, so that a property's own AttributeError is the one seen)
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
                replaced = old.vars if isinstance(old, Module) else \
                    [old] if old.requires_grad and not old.parents else ()   # (not a graph)
                for watcher in list(_watchers) if replaced else ():
                    watcher.parameters_replaced(replaced, f"{type(self).__name__}.{name}")
        object.__setattr__(self, name, value)


_watchers = weakref.WeakSet()


def watch_replacements(watcher):
    """Tell ``watcher`` (an optimizer) whenever a Module's attribute holding a NetVar or a
    Module is assigned another value: ``watcher.parameters_replaced(old_parameters, where)``,
    ``where`` naming the attribute (``"Linear.W"``). Only attributes are seen: a parameter
    replaced inside a list or dict, or outside any Module, is not."""
    _watchers.add(watcher)


# ----------------------------------------------------------------------------- the walk

def _is_graph(value):
    """A node computed by an op: with parents, or built under no_grad() (an op without)."""
    return isinstance(value, NetVar) and (bool(value._parents) or isinstance(value, NetOp))


def _walk(root):
    """``(name, value, kind)`` for every parameter (kind "var", value the NetVar), constant
    (kind "constant": a leaf NetVar that needs no gradient) and buffer (kind "buffer", value
    ``(owner, attribute)``) under ``root``, each once."""
    found, seen_vars, seen_objects, names = [], set(), set(), set()

    def add(name, value, kind):
        if name in names:        # e.g. a dict key with a dot: "a.b" and {"a": {"b": ...}}
            raise ValueError(f"{type(root).__name__}: two parameters or buffers would be named "
                             f"'{name}'; rename one (a dict key must not contain a dot)")
        names.add(name)
        found.append((name, value, kind))

    def visit(prefix, value):
        if isinstance(value, NetVar):
            if _is_graph(value) or id(value) in seen_vars:
                return
            seen_vars.add(id(value))
            add(prefix, value, "var" if value.requires_grad else "constant")
            return
        if isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                visit(dotted(prefix, str(i)), item)
            return
        if isinstance(value, dict):
            for key, item in value.items():
                visit(dotted(prefix, str(key)), item)
            return
        if isinstance(value, type) or id(value) in seen_objects:
            return
        if isinstance(value, Module):
            seen_objects.add(id(value))
            for name, item in value.members():
                visit(dotted(prefix, name), item)
        names = getattr(type(value), "buffers", ())
        if names and isinstance(names, tuple):
            seen_objects.add(id(value))
            for attribute in names:
                if backend.is_array(getattr(value, attribute, None)):
                    add(dotted(prefix, attribute), (value, attribute), "buffer")

    visit("", root)
    return found


def _modules(root):
    """Every Module under ``root`` (itself included), each once."""
    out, seen = [], set()

    def visit(value):
        if isinstance(value, (list, tuple)):
            for item in value:
                visit(item)
        elif isinstance(value, dict):
            for item in value.values():
                visit(item)
        elif isinstance(value, Module) and id(value) not in seen:
            seen.add(id(value))
            out.append(value)
            for _, item in value.members():
                visit(item)

    visit(root)
    return out


def dotted(prefix, name):
    """``prefix.name``, or ``name`` at the top: how nested names are written."""
    return f"{prefix}.{name}" if prefix else name


def _like(array, mine):
    """``array`` on the device of ``mine`` (a fresh array: the state's own is never kept)."""
    if backend.array_module(mine) is numpy:
        return numpy.array(backend.to_cpu(array))
    return backend.to_gpu(backend.to_cpu(array), mine.device.id)


# ----------------------------------------------------------------------------- repr

def _describe_member(name, value):
    """Lines for one attribute in a module's repr, or [] for what is not a parameter, buffer
    or module."""
    if isinstance(value, Module):
        lines = value.tree()
        return [f"({name}): {lines[0]}"] + lines[1:]
    if isinstance(value, NetVar):
        if value.requires_grad and not value._parents:
            return [f"({name}): {tuple(value.shape)} {value.dtype}"]
        return []
    if isinstance(value, (list, tuple, dict)):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        lines = []
        for key, item in items:
            lines.extend(_describe_member(f"{name}.{key}", item))
        return lines
    names = getattr(type(value), "buffers", ())
    if names and isinstance(names, tuple) and not isinstance(value, type):
        return [f"({name}.{a}): buffer {tuple(getattr(value, a).shape)}" for a in names
                if backend.is_array(getattr(value, a, None))]
    return []
