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


def native(dtype):
    """``dtype`` in the machine's byte order: '>f4' is float32 on a little-endian machine (the
    same values; files and checkpoints tell dtypes apart by this, never by the order)."""
    return dtype.newbyteorder("=") if dtype.byteorder not in "=|" else dtype


def wide(array):
    """``array`` in float32 when it is float16, else as it is: where an op squares its input
    (a norm, a cube), float16's range (65504) would overflow at |x| > 256 although the result
    fits; such ops compute in float32 and give float16, as PyTorch's half ops do."""
    return array.astype(numpy.float32) if array.dtype == numpy.float16 else array


def wide_sum(a, **how):
    """``a.sum(**how)`` (``axis``, ``keepdims``), accumulated in float32 when ``a`` is float16
    and given in float32 then: float16 stops at 65504, so a sum over many elements, or of large
    ones, was inf where a mean of them fits."""
    return a.sum(dtype=numpy.float32, **how) if a.dtype == numpy.float16 else a.sum(**how)


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


def wants_gradient(requires_grad, dtype, owner="NetVar"):
    """Whether a leaf of ``dtype`` requires a gradient: ``requires_grad`` as given (True or False)
    or, when None (not given), whether ``dtype`` is a float type. Only floats have a gradient: an
    explicit True for integer or boolean data is refused (it was silently made a constant)."""
    if requires_grad is None:
        return dtype.kind in "fc"
    if not isinstance(requires_grad, (bool, numpy.bool_)):
        raise TypeError(f"{owner}: requires_grad must be True or False, got {requires_grad!r}")
    if requires_grad and dtype.kind not in "fc":
        raise TypeError(f"{owner}: data of dtype {dtype} has no gradient (only floats have one), "
                        "so requires_grad=True is refused; give a float dtype (leave dtype= out "
                        "for nnkit.dtype) or leave requires_grad out")
    return bool(requires_grad)


def operand_array(value, like=None, dtype=None):
    """The array of a constant operand ``value`` beside the array ``like`` (``constant()``).

    A Python number or list adopts the dtype (and device) of ``like``, as a Python scalar
    operand does in NumPy 2, and so does an integer or boolean array beside a float ``like``
    (exact in float64: 123456789 stays 123456789); a float array is kept as it is; a complex
    number stays complex, as a complex array does; ``dtype`` sets one (``dtype=bool`` keeps a
    mask boolean). Anything else follows ``as_array``.
    """
    kind = type(value)
    if dtype is None and kind is _ndarray and value.dtype.kind == "f":
        return value
    if dtype is None and isinstance(value, (complex, numpy.complexfloating)):
        # complex, as a complex array operand is (a cast to like's real dtype dropped 2j)
        return (numpy if like is None else backend.array_module(like)).asarray(value)
    if like is None or dtype is not None:
        return as_array(value, dtype, "constant")
    if like.dtype.kind not in "fc":
        # beside integer or boolean data a value keeps its own kind, as in NumPy (labels * 0.5
        # is 0.5 each, not 0; mask + 2 is 3, not True): only a Python int takes an int dtype
        array = value if backend.is_array(value) else numpy.asarray(value)
        if array.dtype.kind in "fc" or like.dtype.kind == "b" and array.dtype.kind in "iu":
            return backend.array_module(like).asarray(array)
    if (kind is float or kind is int) and type(like) is _ndarray:
        return numpy.asarray(value, like.dtype)
    if isinstance(value, (int, float, bool, numpy.number, list, tuple)) or (
            backend.is_array(value) and value.dtype.kind in "biu" and like.dtype.kind == "f"):
        return backend.array_module(like).asarray(value, dtype=like.dtype)
    return as_array(value, dtype, "constant")
