"""Sequence data: padding, lengths, bucketed minibatches, reproducible shuffles.

Batches are time-major, as the recurrent ops expect: ``pad_sequences`` turns B sequences of
lengths L_b into one (T, B, F) array (T = max L_b), or (T, B) for token ids, plus ``lengths``.
"""

__all__ = ['pad_sequences', 'minibatches']
import numpy

from . import backend
from .core import get_dtype


def _as_arrays(seqs, owner):
    if isinstance(seqs, numpy.ndarray) and seqs.dtype.kind != "O":
        seqs = list(seqs)          # a rectangular (B, L, ...) array: B sequences of equal length
    arrays = []
    for position, seq in enumerate(seqs):
        array = numpy.asarray(backend.to_cpu(seq) if hasattr(seq, "shape") else seq)
        if array.ndim == 0 or len(array) == 0:
            raise ValueError(f"{owner}: sequence {position} is empty (shape "
                             f"{tuple(array.shape)}); every sequence needs at least one step")
        if array.dtype.kind not in "biuf":
            raise TypeError(f"{owner}: sequence {position} has dtype {array.dtype}; give "
                            "numbers (token ids or features)")
        if arrays and array.shape[1:] != arrays[0].shape[1:]:
            raise ValueError(f"{owner}: sequence {position} has steps of shape "
                             f"{array.shape[1:]}, sequence 0 has {arrays[0].shape[1:]}")
        arrays.append(array)
    if not arrays:
        raise ValueError(f"{owner}: no sequences given")
    return arrays, _default_dtype(seqs, arrays)


def _default_dtype(seqs, arrays):
    """Integers stay integers (token ids), float arrays keep their dtype, lists get nnkit's."""
    dtype = numpy.result_type(*arrays)
    if dtype.kind == "b":
        return numpy.dtype(numpy.int64)
    if dtype.kind == "f" and not all(hasattr(s, "dtype") for s in seqs):
        return get_dtype()
    return dtype


def pad_sequences(seqs, dtype=None, value=0.0):
    """Stack B variable-length sequences time-major, padding with ``value``.

    ``seqs``: B sequences, each (L_b,) (token ids or scalars) or (L_b, F...) (feature vectors).
    Returns ``(x, lengths)``: x of shape (T, B) or (T, B, F...) with T = max L_b,
    x[t, b] = seqs[b][t] for t < L_b and ``value`` elsewhere; lengths (B,) int64.
    dtype: given, or integer for integer sequences (token ids stay ids), the arrays' float
    dtype for float arrays, and ``nnkit.dtype`` for Python lists of floats.
    """
    arrays, default = _as_arrays(seqs, "pad_sequences")
    return _pad(arrays, default if dtype is None else dtype, value)


def _pad(arrays, dtype, value):
    """``pad_sequences`` of arrays already checked by ``_as_arrays``."""
    lengths = numpy.array([len(a) for a in arrays], dtype=numpy.int64)
    x = numpy.full((int(lengths.max()), len(arrays)) + arrays[0].shape[1:], value, dtype=dtype)
    for b, array in enumerate(arrays):
        x[:len(array), b] = array
    return x, lengths


def minibatches(seqs, targets=None, batch_size=32, shuffle=True, bucket=False, seed=None,
                drop_last=False, value=0.0, device=None):
    """An iterator of padded minibatches ``(x, lengths, t)`` (``(x, lengths)`` without targets).

    x, lengths: ``pad_sequences`` of the batch's sequences (x (T, B) or (T, B, F), time-major).
    targets: None; one label per sequence (an array of N labels, or a list of numbers), giving
    t of shape (B, ...); or a list of target sequences (e.g. next tokens) as long as their
    input sequences, padded with 0 like x.
    shuffle: a new random order, drawn from ``seed`` (None: nnkit's global generator, seeded
    by ``nnkit.seed``; an int: a fresh generator, hence the same order on every call; a
    ``numpy.random.Generator``: used as it is, a new order each call).
    bucket: False, True or k. Batches group sequences of similar length so padding stays small:
    the (shuffled) sequences are taken k·batch_size at a time (all of them for True), sorted
    by length inside each pool and cut into batches, and the batches are shuffled.
    drop_last: skip a final batch smaller than batch_size.
    device: where x and t are yielded: None or 'cpu' (NumPy), 'gpu' or 'gpu:N' (CuPy), e.g.
    ``device=model.vars[0].device``. lengths stay NumPy: the recurrent ops read them on the
    host to schedule their steps.
    """
    move = _mover(device)
    arrays, dtype = _as_arrays(seqs, "minibatches")
    N = len(arrays)
    if int(batch_size) < 1:
        raise ValueError(f"minibatches: batch_size must be at least 1, got {batch_size}")
    batch_size = int(batch_size)
    target_dtype = None
    if targets is not None:
        if len(targets) != N:
            raise ValueError(f"minibatches: {len(targets)} targets for {N} sequences")
        if not isinstance(targets, numpy.ndarray) and any(numpy.ndim(t) for t in targets):
            targets, target_dtype = _as_arrays(targets, "minibatches")
            for position, (x, t) in enumerate(zip(arrays, targets)):
                if len(x) != len(t):
                    raise ValueError(f"minibatches: sequence {position} has {len(x)} steps "
                                     f"but its target sequence has {len(t)}")
        else:
            targets = numpy.asarray(targets)
    rng = backend.as_generator(seed)
    order = rng.permutation(N) if shuffle else numpy.arange(N)
    if bucket:
        pool = N if bucket is True else int(bucket) * batch_size
        lengths = numpy.array([len(a) for a in arrays])
        order = numpy.concatenate([chunk[numpy.argsort(lengths[chunk], kind="stable")]
                                   for chunk in numpy.array_split(order, range(pool, N, pool))])
    batches = [order[start:start + batch_size] for start in range(0, N, batch_size)]
    if drop_last and batches and len(batches[-1]) < batch_size:
        batches.pop()
    if bucket and shuffle:
        batches = [batches[k] for k in rng.permutation(len(batches))]
    return _padded(batches, arrays, dtype, value, targets, target_dtype, move)


def _mover(device):
    """A function taking a host array to ``device`` (None or 'cpu', 'gpu' or 'gpu:N')."""
    if device is None or device == "cpu":
        return lambda array: array
    kind, _, number = str(device).partition(":")
    if kind != "gpu" or (number and not number.isdigit()):
        raise ValueError(f"minibatches: device must be None, 'cpu', 'gpu' or 'gpu:N', "
                         f"got {device!r}")
    if not backend.gpu_available():
        raise RuntimeError(f"minibatches: device {device!r} needs CuPy with a working GPU, "
                           "which is not available")
    return lambda array: backend.to_gpu(array, int(number) if number else None)


def _padded(batches, arrays, dtype, value, targets, target_dtype, move):
    """The generator behind ``minibatches`` (so that bad arguments raise at the call)."""
    for rows in batches:
        x, lengths = _pad([arrays[k] for k in rows], dtype, value)
        if targets is None:
            yield move(x), lengths
        elif target_dtype is not None:
            yield move(x), lengths, move(_pad([targets[k] for k in rows], target_dtype, 0)[0])
        else:
            yield move(x), lengths, move(targets[rows])
