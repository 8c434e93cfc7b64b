"""The dtype policy: the dtype an array gets when it becomes a node's data.

Float arrays keep their dtype (and share memory with the array given); lists, Python numbers
and int/bool data become the default float dtype, float32 unless ``set_dtype`` (or
``nnkit.dtype = ...``) changes it. Gradients always have their node's dtype (core.py).
"""
import numpy

from . import backend

_ndarray = numpy.ndarray
_default = numpy.dtype(numpy.float32)


def get_dtype():
    """The float dtype given to lists, Python scalars and int/bool data (float32 by default)."""
    return _default


def set_dtype(dtype):
    """Set the default float dtype (``nnkit.dtype = numpy.float64`` does the same)."""
    global _default
    dtype = numpy.dtype(dtype)
    if dtype.kind != "f":
        raise TypeError(f"set_dtype: nnkit's default dtype must be a float type, got {dtype}")
    _default = dtype


def wide(array):
    """``array`` in float32 when it is float16, else as it is: where an op squares its input
    (a norm, a cube), float16's range (65504) would overflow at |x| > 256 although the result
    fits; such ops compute in float32 and give float16, as PyTorch's half ops do."""
    return array.astype(numpy.float32) if array.dtype == numpy.float16 else array


def as_array(data, dtype=None, owner="NetVar"):
    """The dtype policy: float arrays keep their dtype, everything else becomes nnkit's dtype."""
    if dtype is not None and numpy.dtype(dtype).kind not in "biufc":
        raise TypeError(f"{owner}: dtype must be a number type (float, int or bool), got {dtype}")
    if data is None:
        raise TypeError(f"{owner}: data is None; give numbers or an array")
    if isinstance(data, (str, bytes)):           # NumPy would parse "2" as the number 2
        raise TypeError(f"{owner}: cannot make a numeric array from {type(data).__name__} "
                        f"{data!r}; give numbers or an array")
    if hasattr(data, "__cuda_array_interface__") or isinstance(data, (_ndarray, numpy.generic)):
        if not isinstance(data, _ndarray):
            backend.array_module(data)   # a GPU array nnkit knows (CuPy), else a clear error
        array = data if hasattr(data, "__cuda_array_interface__") else numpy.asarray(data)
        if dtype is not None:
            return array.astype(dtype, copy=False)
        if array.dtype.kind in "biu":
            return array.astype(_default)
        if array.dtype.kind not in "fc":
            raise TypeError(f"{owner}: cannot hold an array of dtype {array.dtype}; "
                            "give numbers (float, int or bool)")
        return array
    try:                         # lists, Python numbers, other array-likes
        array = numpy.asarray(data, dtype=_default if dtype is None else dtype)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{owner}: cannot make a numeric array from {type(data).__name__}: "
                        f"{error}") from None
    if array.dtype.kind == "O":
        raise TypeError(f"{owner}: cannot hold an array of Python objects")
    return array
