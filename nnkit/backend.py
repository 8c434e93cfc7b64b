"""Which array module an array belongs to: the one place that decides NumPy or CuPy.

Every op reaches its math through ``xp = backend.array_module(x.data)``. CuPy is an optional
extra (``pip install nnkit[cuda]``), imported lazily the first time a non-NumPy array is seen
or a GPU move is requested; without it everything runs on NumPy.

Host memory too: ``keep_freed_memory`` (called once when nnkit is imported) lets glibc's malloc
keep the memory a training step frees for the next step.
"""
import copy
import ctypes
import os

import numpy

from . import checks

_ndarray = numpy.ndarray
_cupy = None          # the cupy module once imported, False when unavailable
_rng = numpy.random.default_rng()
_gpu_rngs = {}


def cupy_module():
    """Return the ``cupy`` module, or None when CuPy (or a GPU) is not available."""
    global _cupy
    if _cupy is None:
        try:
            import cupy
            cupy.cuda.runtime.getDeviceCount()
            _cupy = cupy
        except Exception:  # ImportError, or CUDA present without a device
            _cupy = False
    return _cupy or None


def gpu_available():
    """True when CuPy is installed and can see a GPU (``NetVar.to_gpu()`` then works)."""
    return cupy_module() is not None


def array_module(array):
    """The module (``numpy`` or ``cupy``) whose functions compute on ``array``."""
    if type(array) is _ndarray:          # the common case first: every op asks
        return numpy
    if isinstance(array, numpy.ndarray) or numpy.isscalar(array):
        return numpy
    cp = cupy_module()
    if cp is not None and isinstance(array, cp.ndarray):
        return cp
    raise TypeError(f"nnkit: unsupported array type {type(array).__name__}; "
                    "use a NumPy array (or a CuPy array on a GPU)")


def is_array(value):
    """True for a NumPy or CuPy array (not a NumPy scalar, not a node)."""
    return hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(
        value, numpy.generic) and not hasattr(value, "_parents")


def device_of(array):
    """A short name of where ``array`` lives: 'cpu' or 'gpu:N'."""
    if isinstance(array, numpy.ndarray):
        return "cpu"
    device = getattr(array, "device", None)
    return f"gpu:{getattr(device, 'id', '?')}"


def check_same_device(op_name, *arrays):
    """Raise a clear error when the arrays of one op live on different devices."""
    devices = [device_of(a) for a in arrays]
    if len(set(devices)) > 1:
        shapes = ", ".join(f"{tuple(a.shape)} on {d}" for a, d in zip(arrays, devices))
        raise ValueError(f"{op_name}: inputs live on different devices ({shapes}); "
                         "move them with .to_gpu() or .to_cpu() first")


def to_gpu(array, device=None):
    cp = cupy_module()
    if cp is None:
        raise RuntimeError("to_gpu(): CuPy with a working GPU is not available; "
                           "install it with `pip install nnkit[cuda]` on a machine with a GPU")
    if device is None:
        return cp.asarray(array)
    with cp.cuda.Device(device):
        return cp.asarray(array)


def to_cpu(array):
    """``array`` in host memory (NumPy arrays and scalars, and Python numbers, are returned as
    they are)."""
    if isinstance(array, (numpy.ndarray, numpy.generic, int, float)):
        return array
    return array.get()


KEPT_BYTES = 256 << 20        # freed memory glibc's malloc keeps at the top of its heap
_GLIBC_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")
malloc_keeps_freed_memory = False     # True once nnkit has set malloc's thresholds


def keep_freed_memory(limit=KEPT_BYTES):
    """Let glibc's malloc keep up to ``limit`` bytes of freed memory for reuse; True when set.

    An eager step frees its graph when it ends (every node's value and gradient: 50 MB for the
    benchmarks' W10 Transformer step). Left to itself, glibc's malloc gives the freed top of its
    heap back to the system, and the next step gets the same memory fresh from the kernel, a
    page fault every 4 KB: 12,500 a step in W10, a third of the step's time. This sets malloc's
    two thresholds (``mallopt``) where glibc's adaptive ones end after a program frees one 32 MiB
    array: arrays up to 32 MiB come from the heap, and up to ``limit`` bytes free at its top
    stay there. A process then keeps memory up to its own peak (never more) instead of giving
    it back between steps; PyTorch's step frees less at once and meets this less.

    nnkit calls it when imported, on Linux with glibc, unless the environment holds
    ``NNKIT_KEEP_FREED_MEMORY=0`` or glibc's own settings (``MALLOC_TRIM_THRESHOLD_``,
    ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TOP_PAD_``, ``glibc.malloc`` in ``GLIBC_TUNABLES``):
    the user's choice stands. False (nothing changed) with another C library, or when malloc
    refuses the values; ``malloc_keeps_freed_memory`` tells whether nnkit set them.
    """
    global malloc_keeps_freed_memory
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"keep_freed_memory: limit must be an int number of bytes, got "
                        f"{type(limit).__name__}")
    if limit < 0:
        raise ValueError(f"keep_freed_memory: limit must be >= 0 bytes, got {limit}")
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"):
            return False
        mallopt = ctypes.CDLL(None).mallopt
    except (ValueError, OSError, AttributeError):
        return False
    trim, mmap = -1, -3                 # M_TRIM_THRESHOLD, M_MMAP_THRESHOLD (malloc.h)
    if mallopt(mmap, 32 << 20) and mallopt(trim, min(limit, 2 ** 31 - 1)):
        malloc_keeps_freed_memory = True
    return malloc_keeps_freed_memory


def _keep_freed_memory_unless_told():
    """``keep_freed_memory()`` at import, unless the environment says otherwise (see there)."""
    told = os.environ.get("NNKIT_KEEP_FREED_MEMORY", "1").strip().lower()
    if (told in ("0", "false", "no", "off") or any(os.environ.get(k) for k in _GLIBC_SETTINGS)
            or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", "")):
        return
    keep_freed_memory()


_keep_freed_memory_unless_told()


def seed(value):
    """Seed nnkit's random generators (initializers, dropout masks, shuffles) with an int >= 0."""
    global _rng
    _check_seed(value, "seed")
    _rng = numpy.random.default_rng(value)
    _gpu_rngs.clear()
    cp = cupy_module() if _cupy is not None else None
    if cp is not None:
        cp.random.seed(value)


def get_rng_state():
    """The state of nnkit's global generator (the one ``nnkit.seed`` seeds: initializers,
    dropout masks, shuffles) as plain data, to store with a checkpoint (``nnkit.save`` does)
    and give back to ``set_rng_state`` to continue the same random stream.

    A new dict each call: NumPy's ``bit_generator.state`` (``{"bit_generator": "PCG64",
    "state": {"state": int, "inc": int}, "has_uint32": int, "uinteger": int}``), JSON-able
    (another bit generator's arrays as lists).
    The draws made on a GPU come from a CuPy generator that is not in it: see
    ``set_rng_state``.
    """
    return _plain_state(_rng.bit_generator.state)


def _plain_state(value):
    """A generator's state as new dicts, lists and ints (MT19937 and Philox keep arrays)."""
    if isinstance(value, dict):
        return {key: _plain_state(item) for key, item in value.items()}
    return value.tolist() if isinstance(value, numpy.ndarray) else value


def set_rng_state(state):
    """Continue nnkit's global generator from ``state``, a dict ``get_rng_state`` returned
    (in this process or another, e.g. read back from a checkpoint): the draws that follow are
    those that followed ``get_rng_state()``.

    The state is checked first: a state that is not such a dict, or that NumPy's generator
    refuses, raises (TypeError or ValueError naming what is wrong) and leaves the generator as
    it was. The GPU generators (CuPy's, which draw dropout masks of GPU data) cannot be saved:
    they are forgotten here and derived again from the restored stream at their next draw, so
    a resumed GPU run is reproducible from its checkpoint but its GPU draws are not those of
    the uninterrupted run.
    """
    global _rng
    _rng = generator_from_state(state)
    _gpu_rngs.clear()


def rewind_rng(state):
    """Put nnkit's global generator back to ``state``, a ``get_rng_state()`` of this very
    generator, in place: whoever holds it (``gen = rng()``) draws on from there as well. (A
    replay's check against eager runs the step twice from one state.) Another generator's state
    is given to ``set_rng_state``."""
    if state.get("bit_generator") == type(_rng.bit_generator).__name__:
        _rng.bit_generator.state = state
    else:
        set_rng_state(state)


def generator_from_state(state, where="set_rng_state"):
    """A new NumPy Generator continuing from ``state`` (see ``set_rng_state``), which is
    checked first (TypeError or ValueError naming ``where`` and what is wrong); nnkit's global
    generator is not touched (``nnkit.load`` checks a saved state with it before it assigns
    anything)."""
    if not isinstance(state, dict):
        raise TypeError(f"{where}: state must be the dict get_rng_state() returns, got "
                        f"{type(state).__name__}")
    name = state.get("bit_generator")
    kind = getattr(numpy.random, name, None) if isinstance(name, str) else None
    if not (isinstance(kind, type) and issubclass(kind, numpy.random.BitGenerator)):
        raise ValueError(f"{where}: state['bit_generator'] must name a NumPy bit generator "
                         f"such as 'PCG64', got {name!r}")
    try:
        bit_generator = kind()
    except NotImplementedError:
        raise ValueError(f"{where}: state['bit_generator'] names {name}, which is a base "
                         "class, not a bit generator") from None
    _check_same_layout(where, "state", state, bit_generator.state)
    if name in _POSITIONS:
        keys, last = _POSITIONS[name]
        position, label = state, "state"
        for key in keys:
            position, label = position[key], f"{label}[{key!r}]"
        if not 0 <= position <= last:
            raise ValueError(f"{where}: {label} must be in 0..{last}, got {position}")
    try:
        bit_generator.state = copy.deepcopy(state)
    except (TypeError, ValueError, KeyError, OverflowError) as error:
        raise ValueError(f"{where}: NumPy's {name} refuses the state "
                         f"({type(error).__name__}: {error})") from None
    return numpy.random.Generator(bit_generator)


# bit generator -> (keys of its position in its buffer of draws, the largest position):
# NumPy takes any position and then reads outside the buffer (garbage, or a crash)
_POSITIONS = {"MT19937": (("state", "pos"), 624), "Philox": (("buffer_pos",), 4)}


def _check_same_layout(where, label, state, fresh):
    """Raise ValueError naming the first entry of ``state`` whose keys or kind differ from
    those of a fresh generator's state ``fresh`` (a float where NumPy keeps an int would be
    truncated, not refused)."""
    if isinstance(fresh, dict):
        if not isinstance(state, dict):
            raise ValueError(f"{where}: {label} must be a dict, got {type(state).__name__}")
        if state.keys() != fresh.keys():
            raise ValueError(f"{where}: {label} must have the keys {sorted(fresh)}, got "
                             f"{sorted(state)}")
        for key in fresh:
            _check_same_layout(where, f"{label}[{key!r}]", state[key], fresh[key])
    elif isinstance(fresh, numpy.ndarray):        # (MT19937's key; JSON gives a list)
        if numpy.asarray(state).dtype.kind not in "iu" or numpy.shape(state) != fresh.shape:
            raise ValueError(f"{where}: {label} must be {fresh.shape[0]} integers")
    elif isinstance(fresh, int) and not checks.is_integer(state):
        raise ValueError(f"{where}: {label} must be an int, got {type(state).__name__} "
                         f"{state!r}")


def rng(xp=numpy):
    """The seeded random generator for module ``xp`` (NumPy's Generator, or CuPy's)."""
    if xp is numpy:
        return _rng
    if xp not in _gpu_rngs:
        _gpu_rngs[xp] = xp.random.default_rng(int(_rng.integers(2 ** 63)))
    return _gpu_rngs[xp]


def as_generator(seed, owner):
    """The NumPy Generator for a ``seed`` argument of ``owner`` (None: nnkit's global one, seeded
    by ``nnkit.seed``; an int >= 0: a fresh one; a Generator: itself); anything else is refused
    naming ``owner``."""
    if seed is None:
        return _rng
    if isinstance(seed, numpy.random.Generator):
        return seed
    _check_seed(seed, owner, "None, an int or a numpy.random.Generator")
    return numpy.random.default_rng(seed)


def _check_seed(value, owner, accepted="an int"):
    if not checks.is_integer(value):
        raise TypeError(f"{owner}: seed must be {accepted}, got {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"{owner}: seed must be >= 0, got {value}")
