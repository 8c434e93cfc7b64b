"""What a node offers as the array it holds: shape, dtype, conversions, device moves, printing.

NetVar (core.py) inherits it; everything here reads the node's ``_data`` (and moves ``_g``
along with it), so the engine file keeps only what the engine does.
"""
import numpy

from . import backend

_ndarray = numpy.ndarray


def preview(array, threshold=6, precision=4, one_line=True):
    """A text picture of an array: all of it when small, its corners otherwise."""
    if array is None:
        return "-"
    text = numpy.array2string(numpy.asarray(backend.to_cpu(array)), precision=precision,
                              threshold=threshold, edgeitems=2, separator=", ",
                              suppress_small=False)   # 1e-6 must not read as 0
    return " ".join(text.split()) if one_line else text


class ArrayLike:
    """The array side of a node (NetVar's base): properties and conversions of ``_data``."""
    __slots__ = ()

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
        return f"{kind}{label} #{self._index} of shape {tuple(self._data.shape)}"

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
