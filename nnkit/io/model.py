"""What a model is for io: a Module, or a dict or list of parameters and Modules seen as one
(``check_model``), and the one class whose models are saved with their topology
(``saved_with_topology``: nnkit.nets.ffn registers FFN; io imports no net)."""
from collections import namedtuple

from ..core import NetVar
from ..module import Module, walk

_topology_model = None      # the class registered by saved_with_topology (FFN)


def saved_with_topology(cls):
    """Class decorator: save ``cls``'s models with their topology, rebuild them on load.

    ``cls`` is a Module with ``topology`` (a list of ``(op, *args)`` entries; ``(model,)`` is a
    model of ``cls`` inside) whose parameters are the NetVar arguments of its entries, and
    ``cls(*entries)`` builds one. One class holds this role; nnkit's FFN does.
    """
    global _topology_model
    _topology_model = cls
    return cls


def _has_topology(value):
    return _topology_model is not None and isinstance(value, _topology_model)


def _topology_class():
    """The class registered by ``saved_with_topology`` (what ``load`` rebuilds a topology with)."""
    return _topology_model


_Model = namedtuple("_Model", "root params buffers")
_KINDS = ("a Module (an FFN, a SequenceModel, your own nn.Module), or a dict or list of "
          "parameters (NetVars) and Modules")


class _Collection(Module):
    """A dict, list or tuple of parameters and Modules seen as a Module: its members are the
    items, named by key or index, so the names, the checks and the assignment are Module's."""

    def __init__(self, value):
        self.value = value

    def members(self):
        items = self.value.items() if isinstance(self.value, dict) else enumerate(self.value)
        return [(str(key), item) for key, item in items]


def check_model(model, where="save"):
    """The parameters and buffers ``save`` would store for ``model``, by name.

    Returns ``(root, params, buffers)``: a Module to assign through (``model`` itself, or the
    dict or list seen as one), dotted name -> NetVar (parameters and constants) and dotted
    name -> array. Raises TypeError or ValueError starting with ``where`` and naming what was
    given (the walk's errors: ``nnkit.module.walk``) for a model that cannot be saved.
    """
    if isinstance(model, (dict, list, tuple)):
        walk(model, where)                          # refuses what a collection may not hold
        root = _Collection(model)
    elif isinstance(model, Module):
        root = model
    else:
        hint = "; write [w] or {'w': w}" if isinstance(model, NetVar) else ""
        raise TypeError(f"{where}: the model must be {_KINDS}, got {_got(model)}{hint}")
    entries = walk(root, where)
    return _Model(root, {name: value for name, kind, value in entries
                         if kind in ("var", "constant")},
                  {name: getattr(*value) for name, kind, value in entries if kind == "buffer"})


def _got(value):
    """A value as an error shows it: its type, and a short repr."""
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"{type(value).__name__} {shown}"


def _rebuild_refusal(model):
    """Why ``load`` cannot rebuild ``model`` without it (None when it can): only an FFN and
    dicts and lists of parameters are rebuilt from data."""
    if _has_topology(model):
        return None             # each topology entry says for itself
    if isinstance(model, Module):
        return f"the model is a {type(model).__name__}"
    for name, kind, value in walk(model, "save", descend=False):
        if kind == "module":
            return f"'{name}' is a {type(value).__name__}"
        if kind == "buffer":
            return f"'{name.rpartition('.')[0]}' is a {type(value[0]).__name__}"
    return None
