"""PyTorch state dicts in and out: ``nn.load_torch_state(model, state_dict)`` and
``nn.torch_state(model)``.

An nnkit model built from ``nn.layers`` under the same attribute names as a ``torch.nn`` model
has the same weights, in other layouts and under other names. The mapping, layer by layer
(``p`` is the layer's dotted place; nnkit's 1-D parameters are (1, n) rows, PyTorch's (n,)):

- ``Linear`` ↔ ``Linear``: ``p.weight`` = Wᵀ (out, in), ``p.bias`` = b[0];
- ``Conv2D`` ↔ ``Conv2d``: ``p.weight`` = W, ``p.bias`` = b[0];
- ``BatchNorm`` ↔ ``BatchNorm1d`` / ``BatchNorm2d``: ``p.weight`` = gamma[0], ``p.bias`` =
  beta[0], ``p.running_mean`` and ``p.running_var`` = ``stats.running_mean`` and
  ``stats.running_var``, ``p.num_batches_tracked`` = ``stats.num_batches_tracked``;
- ``LayerNorm`` ↔ ``LayerNorm``: ``p.weight`` = gamma[0], ``p.bias`` = beta[0];
- ``Embedding`` ↔ ``Embedding``: ``p.weight`` = table;
- ``RNN``, ``LSTM`` ↔ ``RNN``, ``LSTM``: ``p.weight_ih_l0`` = Wᵀ, ``p.weight_hh_l0`` = Rᵀ,
  b = ``p.bias_ih_l0`` + ``p.bias_hh_l0`` (written back as ``bias_ih_l0`` = b[0] and
  ``bias_hh_l0`` = 0: the same layer);
- ``GRU`` ↔ ``GRU``: the same, with b = [``bias_ih_l0``; ``bias_hh_l0``] (nnkit keeps both:
  the reset gate multiplies one of them);
- a ``Sequential`` of recurrent layers of one kind ↔ one stacked ``RNN`` / ``LSTM`` / ``GRU``
  (``num_layers`` = its length): entry k ↔ the ``_l<k>`` weights;
- ``MultiHeadAttention`` ↔ ``MultiheadAttention``: ``p.in_proj_weight`` = [Wqᵀ; Wkᵀ; Wvᵀ],
  ``p.in_proj_bias`` = [bq, bk, bv], ``p.out_proj.weight`` = Woᵀ, ``p.out_proj.bias`` = bo[0];
- ``Sequential`` ↔ ``Sequential``: entry i at ``p.layers.i`` ↔ ``p.i``;
- any other Module, a list, a dict ↔ the same attribute names (``ModuleList``,
  ``ModuleDict``), its own parameters and buffers as they are (a (1, n) row parameter also
  takes PyTorch's (n,) vector on loading).

``TransformerEncoderLayer`` is a Module of these layers with PyTorch's attribute names
(``self_attn``, ``linear1``, ``linear2``, ``norm1``, ``norm2``), so it maps as the layers do.
The gate order of the recurrent weights is PyTorch's (nnkit's ops use it), so the blocks move
as they are. A layer without a bias (``bias=False``) has no bias key, as in PyTorch.

``load_torch_state`` checks every key, shape and dtype before anything is assigned (then
``Module.load_state`` assigns, checking again); a key the model has no place for, or a key the
model needs and the state dict lacks, is refused naming the key and the layer. Parameters take
the state dict's values in their own dtype only: build the nnkit model in the state dict's
dtype (``nn.set_dtype(numpy.float32)`` before building it, for PyTorch's default).
"""
import numpy

from .. import backend
from ..core import NetVar
from ..dtypes import native
from ..layers import (GRU, LSTM, RNN, BatchNorm, Conv2D, Embedding, LayerNorm, Linear,
                      MultiHeadAttention, Sequential)
from ..module import Module, dotted

__all__ = ['load_torch_state', 'torch_state']

_RECURRENT = (RNN, LSTM, GRU)


def _row(vector):
    return vector[None, :]


# how a parameter's nnkit layout becomes PyTorch's, and back
_LAYOUTS = {"same": (lambda a: a, lambda a: a),
            "row": (lambda a: a[0], _row),                  # (1, n) row ↔ (n,) vector
            "T": (lambda a: a.T, lambda a: a.T)}            # (in, out) ↔ (out, in)


class _Part:
    """One layer's (or one parameter's) mapping: the nnkit names it covers, what it writes in
    PyTorch's names and layouts (``out``) and what it reads back (``into``)."""

    def __init__(self, place, label, names, out, into, counter=None):
        self.place, self.label, self.names = place, label, names
        self.out, self.into, self.counter = out, into, counter

    def describe(self):
        return f"'{self.place}' ({self.label})" if self.place else f"own {self.label}"


def _renamed_part(nn_p, torch_p, label, pairs):
    """Parameters that map one to one: ``(nnkit name, PyTorch name, layout)`` each, layout a
    key of ``_LAYOUTS``; a parameter the model lacks (``bias=False``) has no key."""

    def out(state):
        return {dotted(torch_p, theirs): _LAYOUTS[layout][0](state[dotted(nn_p, mine)])
                for mine, theirs, layout in pairs if dotted(nn_p, mine) in state}

    def into(get, state):
        return {dotted(nn_p, mine): _LAYOUTS[layout][1](get(dotted(torch_p, theirs)))
                for mine, theirs, layout in pairs if dotted(nn_p, mine) in state}

    return _Part(torch_p, label, [dotted(nn_p, mine) for mine, _, _ in pairs], out, into)


def _batchnorm_part(layer, nn_p, torch_p):
    part = _renamed_part(nn_p, torch_p, "layers.BatchNorm",
                         [("gamma", "weight", "row"), ("beta", "bias", "row"),
                          ("stats.running_mean", "running_mean", "same"),
                          ("stats.running_var", "running_var", "same")])
    part.counter = (layer.stats, dotted(torch_p, "num_batches_tracked"))
    return part


def _recurrent_part(layers, nn_places, torch_p, label):
    """One recurrent layer, or a stack of them (entry k ↔ PyTorch's ``_l<k>``)."""
    two_biases = isinstance(layers[0], GRU)

    def out(state):
        result = {}
        for k, nn_p in enumerate(nn_places):
            b = state[dotted(nn_p, "b")]
            result[dotted(torch_p, f"weight_ih_l{k}")] = state[dotted(nn_p, "W")].T
            result[dotted(torch_p, f"weight_hh_l{k}")] = state[dotted(nn_p, "R")].T
            result[dotted(torch_p, f"bias_ih_l{k}")] = b[0]
            result[dotted(torch_p, f"bias_hh_l{k}")] = b[1] if two_biases else numpy.zeros_like(
                b[0])
        return result

    def into(get, state):
        result = {}
        for k, nn_p in enumerate(nn_places):
            b_ih = get(dotted(torch_p, f"bias_ih_l{k}"))
            b_hh = get(dotted(torch_p, f"bias_hh_l{k}"))
            result[dotted(nn_p, "W")] = get(dotted(torch_p, f"weight_ih_l{k}")).T
            result[dotted(nn_p, "R")] = get(dotted(torch_p, f"weight_hh_l{k}")).T
            result[dotted(nn_p, "b")] = numpy.stack([b_ih, b_hh]) if two_biases else \
                _row(b_ih + b_hh)
        return result

    names = [dotted(nn_p, name) for nn_p in nn_places for name in ("W", "R", "b")]
    return _Part(torch_p, label, names, out, into)


def _attention_part(nn_p, torch_p):
    names = [dotted(nn_p, name) for name in ("Wq", "Wk", "Wv", "Wo", "bq", "bk", "bv", "bo")]
    has_bias = lambda state: dotted(nn_p, "bq") in state                      # noqa: E731

    def out(state):
        mine = lambda name: state[dotted(nn_p, name)]                          # noqa: E731
        result = {dotted(torch_p, "in_proj_weight"): numpy.concatenate(
            [mine("Wq").T, mine("Wk").T, mine("Wv").T])}
        if has_bias(state):
            result[dotted(torch_p, "in_proj_bias")] = numpy.concatenate(
                [mine("bq")[0], mine("bk")[0], mine("bv")[0]])
        result[dotted(torch_p, "out_proj.weight")] = mine("Wo").T
        if has_bias(state):
            result[dotted(torch_p, "out_proj.bias")] = mine("bo")[0]
        return result

    def into(get, state):
        dim = state[dotted(nn_p, "Wq")].shape[0]
        packed = get(dotted(torch_p, "in_proj_weight"))
        result = {dotted(nn_p, name): packed[i * dim:(i + 1) * dim].T
                  for i, name in enumerate(("Wq", "Wk", "Wv"))}
        result[dotted(nn_p, "Wo")] = get(dotted(torch_p, "out_proj.weight")).T
        if has_bias(state):
            bias = get(dotted(torch_p, "in_proj_bias"))
            result.update({dotted(nn_p, name): _row(bias[i * dim:(i + 1) * dim])
                           for i, name in enumerate(("bq", "bk", "bv"))})
            result[dotted(nn_p, "bo")] = _row(get(dotted(torch_p, "out_proj.bias")))
        return result

    return _Part(torch_p, "layers.MultiHeadAttention", names, out, into)


def _stack(value):
    """The recurrent layers of a Sequential that is a stack of one kind, else None."""
    entries = list(value.layers)
    if entries and all(type(entry) is type(entries[0]) for entry in entries) \
            and isinstance(entries[0], _RECURRENT):
        return entries
    return None


def _parts(model):
    """Every _Part of ``model``, found by walking its members as ``Module`` does (each object
    once), with the nnkit and the PyTorch place of each."""
    parts, seen = [], set()

    def visit(value, nn_p, torch_p):
        if isinstance(value, NetVar):
            if not value.parents and id(value) not in seen:
                seen.add(id(value))
                parts.append(_Part(torch_p, "a parameter", [nn_p],
                                   lambda state: {torch_p: state[nn_p]} if nn_p in state else {},
                                   lambda get, state: {nn_p: get(torch_p).reshape(
                                       state[nn_p].shape)} if nn_p in state else {}))
            return
        if isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                visit(item, dotted(nn_p, str(i)), dotted(torch_p, str(i)))
            return
        if isinstance(value, dict):
            for key, item in value.items():
                visit(item, dotted(nn_p, str(key)), dotted(torch_p, str(key)))
            return
        if isinstance(value, type) or id(value) in seen:
            return
        seen.add(id(value))
        if isinstance(value, Linear):
            parts.append(_renamed_part(nn_p, torch_p, "layers.Linear",
                                       [("W", "weight", "T"), ("b", "bias", "row")]))
        elif isinstance(value, Conv2D):
            parts.append(_renamed_part(nn_p, torch_p, "layers.Conv2D",
                                       [("W", "weight", "same"), ("b", "bias", "row")]))
        elif isinstance(value, BatchNorm):
            parts.append(_batchnorm_part(value, nn_p, torch_p))
        elif isinstance(value, LayerNorm):
            parts.append(_renamed_part(nn_p, torch_p, "layers.LayerNorm",
                                       [("gamma", "weight", "row"), ("beta", "bias", "row")]))
        elif isinstance(value, Embedding):
            parts.append(_renamed_part(nn_p, torch_p, "layers.Embedding",
                                       [("table", "weight", "same")]))
        elif isinstance(value, _RECURRENT):
            parts.append(_recurrent_part([value], [nn_p], torch_p,
                                         f"layers.{type(value).__name__}"))
        elif isinstance(value, MultiHeadAttention):
            parts.append(_attention_part(nn_p, torch_p))
        elif isinstance(value, Sequential) and _stack(value):
            stack = _stack(value)
            seen.update(id(entry) for entry in stack)
            parts.append(_recurrent_part(
                stack, [dotted(nn_p, f"layers.{k}") for k in range(len(stack))], torch_p,
                f"a stack of {len(stack)} layers.{type(stack[0]).__name__}"))
        elif isinstance(value, Sequential):
            for i, entry in enumerate(value.layers):
                visit(entry, dotted(nn_p, f"layers.{i}"), dotted(torch_p, str(i)))
        elif isinstance(value, Module):
            for name, item in value.members():
                visit(item, dotted(nn_p, name), dotted(torch_p, name))
        else:
            names = getattr(type(value), "buffers", ())
            if names and isinstance(names, tuple):      # running statistics, as they are
                for attribute in names:
                    mine, theirs = dotted(nn_p, attribute), dotted(torch_p, attribute)
                    parts.append(_Part(theirs, "a buffer", [mine],
                                       lambda state, a=mine, b=theirs: {b: state[a]}
                                       if a in state else {},
                                       lambda get, state, a=mine, b=theirs: {a: get(b)}
                                       if a in state else {}))

    if not isinstance(model, Module):
        raise TypeError(f"torch_state: the model must be an nnkit Module (a layer, a Sequential, "
                        f"your own nn.Module), got {type(model).__name__}")
    visit(model, "", "")
    return parts


def _layouts(model, where):
    """``(parts, state, out)``: the parts, the model's ``state()`` and PyTorch's arrays by
    key with the part that writes each; a name of the model no part covers is refused."""
    parts = _parts(model)
    state = model.state()
    covered = {name for part in parts for name in part.names}
    uncovered = [name for name in state if name not in covered]
    if uncovered:
        raise TypeError(f"{where}: the model's '{uncovered[0]}' is in no layer or attribute "
                        "nnkit can map to PyTorch")
    out = {}
    for part in parts:
        arrays = part.out(state)
        if part.counter is not None:
            stats, key = part.counter
            arrays[key] = numpy.array(int(stats.num_batches_tracked), dtype=numpy.int64)
        for key, array in arrays.items():
            if key in out:          # (a dict key with a dot: {"x": Linear, "x.weight": ...})
                raise TypeError(f"{where}: PyTorch's '{key}' would hold two of the model's "
                                f"arrays: of {_described(out[key][1])} and of "
                                f"{_described(part)}; rename one")
            out[key] = (array, part)
    return parts, state, out


def _described(part):
    return part.describe() if part.place else f"the model's {part.describe()}"


def torch_state(model):
    """The state dict of the PyTorch model with ``model``'s layers under the same attribute
    names: a dict key → NumPy array (a contiguous host copy) in PyTorch's names and layouts,
    in the model's order (see the module's docstring for the mapping).

    ``torch_model.load_state_dict({k: torch.from_numpy(v) for k, v in
    nn.torch_state(model).items()})`` hands the weights to PyTorch. A name of the model that
    maps to nothing (a member of a Module nnkit cannot describe) raises TypeError naming it.
    """
    return {key: numpy.ascontiguousarray(array)
            for key, (array, _) in _layouts(model, "torch_state")[2].items()}


def _as_numpy(key, value):
    """A state dict's value as a NumPy array: a torch.Tensor (bfloat16 widened to float32,
    exactly), a NumPy or CuPy array; TypeError naming the key otherwise."""
    if callable(getattr(value, "detach", None)) and callable(getattr(value, "numpy", None)):
        if getattr(value, "is_meta", False):
            raise TypeError(f"load_torch_state: the state dict's '{key}' is a tensor on "
                            "PyTorch's meta device, which holds no values (a model built "
                            "under torch.device('meta')): load or initialize its weights first")
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
        return value.numpy()
    if backend.is_array(value):
        return numpy.asarray(backend.to_cpu(value))
    hint = (" (a checkpoint holding a state dict? pass the state dict: "
            f"state_dict[{key!r}])" if isinstance(value, dict) else "")
    raise TypeError(f"load_torch_state: the state dict's '{key}' is a {type(value).__name__}, "
                    f"not a tensor or an array{hint}")


def load_torch_state(model, state_dict):
    """Assign a PyTorch state dict to ``model``, an nnkit model with the same layers under the
    same attribute names (see the module's docstring for the mapping); returns the model.

    ``state_dict`` maps keys to ``torch.Tensor``s or NumPy arrays (``torch_model.state_dict()``,
    ``nn.read_torch_file(path)``, ``nn.read_safetensors(path)[0]``). Everything is checked before
    anything is assigned: a key the model has no place for, or that the model needs and the
    state dict lacks (ValueError naming the key and the layer), a shape other than the layer's
    (ValueError), a dtype other than the parameter's (TypeError: build the model in the state
    dict's dtype), a value that is not an array (TypeError). Parameters keep their identity (an
    optimizer over ``model.vars`` keeps working) and forget their gradients.
    """
    if not isinstance(state_dict, dict):
        raise TypeError(f"load_torch_state: state_dict must be a dict key -> tensor, got "
                        f"{type(state_dict).__name__}")
    parts, state, expected = _layouts(model, "load_torch_state")
    given = {key: _as_numpy(key, value) for key, value in state_dict.items()}
    for key in given:
        if key not in expected:
            owner = max((part for part in parts if part.place and key.startswith(
                part.place + ".")), key=lambda part: len(part.place), default=None)
            keys = [k for k, (_, part) in expected.items() if part is owner]
            raise ValueError(f"load_torch_state: the state dict's '{key}' has no place in the "
                             "model" + (f": its layer {owner.describe()} takes {keys}"
                                        if owner else " (no layer or parameter of that name)"))
    for key, (array, part) in expected.items():
        if key not in given:
            raise ValueError(f"load_torch_state: the state dict has no '{key}', which the "
                             f"model's {part.describe()} needs")
        other = given[key]
        row = part.label == "a parameter" and other.ndim == 1 and array.shape == (1,) + other.shape
        if other.shape != array.shape and not row:      # (n,) fills a (1, n) row parameter
            raise ValueError(f"load_torch_state: '{key}' is {other.shape} in the state dict; "
                             f"the model's {part.describe()} needs {array.shape}")
        if other.dtype.kind != array.dtype.kind or (
                native(other.dtype) != native(array.dtype) and array.dtype.kind != "i"
                and not key.endswith(("running_mean", "running_var"))):
            raise TypeError(f"load_torch_state: '{key}' is {other.dtype} in the state dict and "
                            f"{array.dtype} in the model's {part.describe()}; build the model in "
                            f"{other.dtype} (nn.set_dtype before building it)")
        counter = part.counter is not None and key == part.counter[1]
        if counter and int(other) < 0:
            raise ValueError(f"load_torch_state: '{key}' is {int(other)}, a negative count")
    values = {}
    for part in parts:
        values.update(part.into(lambda key: given[key], state))
    model.load_state({name: numpy.ascontiguousarray(values[name]) for name in state})
    for part in parts:                          # the counter is a setting, not a buffer
        if part.counter is not None:
            stats, key = part.counter
            stats.num_batches_tracked = int(given[key])
    return model
