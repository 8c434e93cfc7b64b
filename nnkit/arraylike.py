"""What a node offers as the array it holds: its value and gradient as a user reads and sets
them (``data``, ``g``, ``name``), shape, dtype, conversions, device moves, printing.

NetVar (core.py) inherits it; everything here reads and sets the node's ``_data`` and ``_g``,
so the engine file keeps only what the engine does.
"""
import numpy

from . import backend
from .dtypes import as_array
from .gradients import gradient_from_user, owned_copy

_ndarray = numpy.ndarray


def preview(array, threshold=6, precision=4, one_line=True):
    """A text picture of an array: all of it when small, its corners otherwise."""
    if array is None:
        return "-"
    text = numpy.array2string(numpy.asarray(backend.to_cpu(array)), precision=precision,
                              threshold=threshold, edgeitems=2, separator=", ",
                              suppress_small=False)   # 1e-6 must not read as 0
    return " ".join(text.split()) if one_line else text


def not_nodes_error(op, parents):
    """The TypeError for an op given parents that are not nodes (None for an absent bias, an
    array), or None when every parent is a node."""
    position, parent = next(((k, p) for k, p in enumerate(parents)
                             if not isinstance(p, ArrayLike)), (None, None))
    if position is None:
        return None
    return TypeError(f"{type(op).__name__}: parent {position} given to super().__init__ is "
                     f"{type(parent).__name__}, not a node (a NetVar); pass only nodes (leave "
                     "an absent input out, make an array a NetVar)")


def as_op_array(data):
    """An op's value as an array: a node's data, a GPU array as it is, else a NumPy array."""
    if isinstance(data, ArrayLike):
        return data._data
    if hasattr(data, "__cuda_array_interface__"):
        return data
    return numpy.asarray(data)


def gradient_only_read(node):
    """Whether ``node``'s gradient is the zeros that reading ``node.g`` made, untouched since:
    no gradient, as for a node that has none (an optimizer skips it)."""
    g = node._g
    return g is getattr(node, "_gread", None) and not bool(backend.array_module(g).any(g))


class ArrayLike:
    """The array side of a node (NetVar's base): its value and gradient as a user reads and
    sets them, and the properties and conversions of ``_data``."""
    __slots__ = ()

    @property
    def data(self):
        """The value (a NumPy or CuPy array). Assigning to it marks the node as edited."""
        return self._data

    @data.setter
    def data(self, value):
        if isinstance(value, ArrayLike):
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
    def g(self):
        """The gradient: an array of this node's shape and dtype, zeros until back() reaches it.

        Assigning works as a PyTorch user expects: ``p.g = 0`` (any number) fills it, ``p.g =
        None`` resets it, an array of the node's shape is taken (in the node's dtype); any other
        shape, a non-numeric value or an array on another device is refused at the assignment.
        The zeros a read makes are kept (``x.g += ...`` and ``x.g[i] = v`` edit them) but are
        no gradient while they stay zeros (``gradient_only_read``): an optimizer skips them, as
        it skips a node without one (Adam's momentum or AdamW's decay moved a frozen or unused
        weight after a mere ``print(w.g)``).
        """
        if self._g is None:
            self._g = self._gread = backend.array_module(self._data).zeros_like(self._data)
            self._gshared = False
        elif self._gshared:       # maybe another node's gradient: copy before a user edits it
            self._g = owned_copy(self._g, self._data)
            self._gshared = False
        return self._g

    @g.setter
    def g(self, value):
        if value is self._g:              # `x.g += ...`: the getter's own array, edited in place
            self._gshared = False
        elif value is None:
            self.reset()
        else:                             # kept as shared: the caller's array is never edited
            self._g = gradient_from_user(value, self, f".g of {self._describe()}")
            self._gshared = True

    def reset(self):
        """Forget the gradient: ``g`` reads as zeros until the next ``back()``."""
        self._g = self._gread = None
        self._gshared = False

    @property
    def parents(self):
        """The nodes this one was computed from (empty for leaves and no_grad results)."""
        return self._parents

    @property
    def name(self):
        """An optional label, shown in errors, reprs, traces and graph drawings."""
        return getattr(self, "_name", None)

    @name.setter
    def name(self, value):
        self._name = value

    @property
    def shape(self):
        return self._data.shape

    @property
    def dtype(self):
        return self._data.dtype

    @property
    def ndim(self):
        return self._data.ndim

    @property
    def size(self):
        return self._data.size

    def __len__(self):
        return len(self._data)

    def item(self):
        """The value as a Python number (the node must hold exactly one element)."""
        return self._single_value("item()")

    def __float__(self):
        return float(self._single_value("float()"))

    def __int__(self):
        return int(self._single_value("int()"))

    def _single_value(self, caller):
        if self._data.size != 1:
            raise ValueError(f"{caller}: {self._describe()} holds {self._data.size} elements, "
                             "not one")
        return self._data.item()

    def tolist(self):
        """The value as nested Python lists (copied from the GPU when it lives there)."""
        return backend.to_cpu(self._data).tolist()

    def __array__(self, dtype=None, copy=None):
        """``numpy.asarray(node)`` gives its values (``.numpy()`` for data on a GPU)."""
        if not isinstance(self._data, (_ndarray, numpy.generic)):
            raise TypeError(f"numpy.asarray(): {self._describe()} lives on {self.device}; "
                            "bring it to the host with .numpy() first")
        if copy is None:          # NumPy 1 passes no copy argument; NumPy 2's default
            return numpy.asarray(self._data, dtype=dtype)
        return numpy.array(self._data, dtype=dtype, copy=copy)

    def numpy(self):
        """The value as a NumPy array (copied from the GPU when it lives there)."""
        return backend.to_cpu(self._data)

    def __dlpack__(self, **keywords):
        """DLPack export of the value, sharing its memory (``torch.from_dlpack(node)``,
        ``numpy.from_dlpack(node)``): after writing through the other library, call
        ``mark_edited()``, as after editing ``.data`` in place."""
        return self._data.__dlpack__(**keywords)

    def __dlpack_device__(self):
        return self._data.__dlpack_device__()

    def to_gpu(self, device=None):
        """Move data (and gradient) to the GPU in place; returns self."""
        self._data = backend.to_gpu(self._data, device)
        if self._g is not None:
            self._g = backend.to_gpu(self._g, device)
        return self

    def to_cpu(self):
        """Move data (and gradient) to host memory in place; returns self."""
        self._data = backend.to_cpu(self._data)
        if self._g is not None:
            self._g = backend.to_cpu(self._g)
        return self

    @property
    def device(self):
        return backend.device_of(self._data)

    def _describe(self):
        kind = type(self).__name__
        label = f" '{self.name}'" if self.name else ""
        return f"{kind}{label} #{self.index} of shape {tuple(self._data.shape)}"

    def __repr__(self):
        kind = type(self).__name__
        if not self._parents and kind == "NetVar":
            kind = "NetVar" if self.requires_grad else "NetVar(constant)"
        name = f" '{self.name}'" if self.name else ""
        return (f"<{kind}{name} shape={tuple(self._data.shape)} dtype={self._data.dtype} "
                f"requires_grad={self.requires_grad} data={preview(self._data, threshold=8)}>")

    def __bool__(self):
        raise TypeError(f"the truth value of {self._describe()} is ambiguous; "
                        "compare .data or use .item()")

    def __setitem__(self, index, value):
        raise TypeError(f"{self._describe()} does not support item assignment: a node's value "
                        "is fixed once ops have read it; build a new node (nn.Where, nn.Concat) "
                        "or, outside any graph, edit .data[...] and call mark_edited()")
