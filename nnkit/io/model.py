"""What a model is for io: a Module, or a dict or list of parameters and Modules seen as one
(``check_model``), and the one class whose models are saved with their topology
(``saved_with_topology``: nnkit.nets.ffn registers FFN; io imports no net)."""
from collections import namedtuple

from .. import backend
from ..core import NetVar
from ..module import Module, dotted

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
    dict or list seen as one), dotted name -> NetVar and dotted name -> array. Raises TypeError
    (ValueError for a model that cannot list its parameters, such as an FFN inside itself),
    starting with ``where`` and naming what was given, for a model that cannot be saved.
    """
    try:
        if isinstance(model, Module):
            root = model
        elif isinstance(model, (dict, list, tuple)):
            _check_collection(model, where)
            root = _Collection(model)
        else:
            hint = "; write [w] or {'w': w}" if isinstance(model, NetVar) else ""
            raise TypeError(f"{where}: the model must be {_KINDS}, got {_got(model)}{hint}")
        return _Model(root, {**root.named_vars(), **root.named_constants()},
                      root.named_buffers())
    except (TypeError, ValueError) as error:
        if str(error).startswith(f"{where}:"):
            raise
        raise (TypeError if isinstance(error, TypeError) else ValueError)(
            f"{where}: {error}") from None


def _got(value):
    """A value as an error shows it: its type, and a short repr."""
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"{type(value).__name__} {shown}"


def _holds_buffers(value):
    names = getattr(type(value), "buffers", ())
    return not isinstance(value, type) and bool(names) and isinstance(names, tuple)


def _check_collection(model, where):
    """Refuse what a dict or list to save must not hold, and two objects under one name."""
    claimed = {}                # name -> (id of the object, where it is)

    def claim(name, value, place):
        other = claimed.setdefault(name, (id(value), place))
        if other[0] != id(value):
            raise TypeError(f"{where}: {other[1]} and {place} would both be saved as "
                            f"'{name}'; rename a key")

    def visit(value, name, place, inside):
        if isinstance(value, NetVar):
            if value.parents or not value.requires_grad:
                what = ("is computed by an op" if value.parents else
                        "does not require a gradient (a constant)")
                raise TypeError(f"{where}: {place} is a NetVar that {what}; a checkpoint holds "
                                "parameters (leaf NetVars that require a gradient) and buffers")
            claim(name, value, place)
        elif isinstance(value, Module):
            for inner, p in value.named_vars().items():
                claim(dotted(name, inner), p, place)
            for inner, array in value.named_buffers().items():
                claim(dotted(name, inner), array, place)
        elif _holds_buffers(value):
            for attribute in type(value).buffers:
                if backend.is_array(getattr(value, attribute, None)):
                    claim(dotted(name, attribute), getattr(value, attribute), place)
        elif isinstance(value, (dict, list, tuple)):
            if id(value) in inside:
                raise ValueError(f"{where}: {place} contains itself")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                visit(item, dotted(name, str(key)), f"{place}[{key!r}]", inside | {id(value)})
        else:
            raise TypeError(f"{where}: {place} is {_got(value)}, not a parameter (a NetVar), "
                            "a Module, or a dict or list of them")

    visit(model, "", "model", frozenset())


def _rebuild_refusal(model):
    """Why ``load`` cannot rebuild ``model`` without it (None when it can): only an FFN and
    dicts and lists of parameters are rebuilt from data."""
    if _has_topology(model):
        return None             # each topology entry says for itself
    if isinstance(model, Module):
        return f"the model is a {type(model).__name__}"

    def find(value, place):
        if isinstance(value, (dict, list, tuple)):
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                found = find(item, f"{place}[{key!r}]")
                if found:
                    return found
        elif not isinstance(value, NetVar):
            return f"{place} is a {type(value).__name__}"
        return None

    return find(model, "model")
