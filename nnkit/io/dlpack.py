"""DLPack, the in-memory exchange of arrays between libraries: ``nn.from_dlpack``.

A node exports its value the other way (``torch.from_dlpack(node)``, ``numpy.from_dlpack(node)``,
``cupy.from_dlpack(node)``): ``NetVar.__dlpack__`` shares the node's memory.

Shared memory and nnkit's in-place edit rules: an op records the version of each input it
reads, and backpropagating through it after its input was edited raises ``InplaceEditError``
(``mark_edited()`` records an edit: assigning ``.data`` does it, an optimizer's step does it).
An edit made through the other library (``tensor.add_(1)`` on memory a node shares) is not
seen by nnkit: call ``node.mark_edited()`` after it, as after editing ``node.data[...]`` in
place, so that a graph built before the edit refuses to backpropagate instead of giving a
gradient of values that are gone.
"""
import numpy

from .. import backend
from ..core import NetVar
from ..dtypes import as_array

__all__ = ['from_dlpack']

_CPU, _CUDA, _CUDA_HOST = 1, 2, 3       # DLPack's device types


def from_dlpack(x, requires_grad=None, dtype=None, copy=None):
    """A leaf node holding the array of ``x``, any DLPack producer (a ``torch.Tensor``, a NumPy
    or CuPy array, a JAX array, ...): a parameter or a constant, as ``NetVar``'s
    ``requires_grad`` says (by default a parameter: integer data becomes nnkit's float dtype, as
    below; ``dtype=int`` keeps it integer, a constant).

    Without a copy where possible: the node and ``x`` share memory, on the host (NumPy) or on
    a GPU (CuPy; a CUDA producer needs CuPy). A copy is made, so that the node owns its data,
    when ``copy=True``; when ``x`` is read-only (a read-only NumPy array, a tensor PyTorch
    marks so): nnkit writes into parameters in place (optimizers), so a node never holds a
    read-only array; and when nnkit's dtype policy converts it (an integer or boolean producer
    becomes nnkit's float dtype, as ``NetVar`` does, unless ``dtype`` says otherwise; ``dtype``
    casts). ``copy=False`` raises ValueError instead of copying. A 0-d or 1-d array becomes a
    (1, 1) or (1, n) row, as in ``NetVar``, as a view.

    After writing into the shared memory through ``x``, call ``node.mark_edited()``: see the
    module's docstring.
    """
    if not callable(getattr(x, "__dlpack__", None)) or not callable(
            getattr(x, "__dlpack_device__", None)):
        raise TypeError(f"from_dlpack: x must be a DLPack producer (with __dlpack__ and "
                        f"__dlpack_device__), got {type(x).__name__}")
    if copy not in (None, True, False):
        raise TypeError(f"from_dlpack: copy must be None, True or False, got {copy!r}")
    device = int(x.__dlpack_device__()[0])
    if device in (_CUDA, _CUDA_HOST):
        xp = backend.cupy_module()
        if xp is None:
            raise RuntimeError("from_dlpack: x lives on a CUDA device; nnkit needs CuPy to hold "
                               "it (pip install nnkit[cuda]), or move it to the host first")
    elif device == _CPU:
        xp = numpy
    else:
        raise ValueError(f"from_dlpack: x lives on DLPack device type {device}; nnkit holds "
                         "host (NumPy) and CUDA (CuPy) arrays")
    try:
        array = xp.from_dlpack(x)
    except (BufferError, RuntimeError, TypeError, ValueError) as error:
        raise type(error)(f"from_dlpack: {type(x).__name__} refused to export its data: "
                          f"{error}") from None
    reasons = []
    if copy:
        reasons.append("copy=True")
    if xp is numpy and not array.flags.writeable:
        reasons.append("x is read-only")
    converted = as_array(array, dtype, "from_dlpack")
    if converted.dtype != array.dtype:
        reasons.append(f"nnkit's dtype policy makes {array.dtype} {converted.dtype}")
    if reasons and copy is False:
        raise ValueError(f"from_dlpack: copy=False, but a copy is needed: {'; '.join(reasons)}")
    if reasons and converted is array:
        converted = converted.copy()
    if converted.ndim < 2:
        converted = converted.reshape(1, -1)
    node = NetVar(xp.zeros((1, 1), dtype=converted.dtype), requires_grad=requires_grad,
                  dtype=converted.dtype)
    node.data = converted       # the setter keeps the array itself (NetVar(...) copies it)
    return node
