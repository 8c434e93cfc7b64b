"""Sequence data: padding, lengths, bucketed minibatches, reproducible shuffles.

Batches are time-major, as the recurrent ops expect: ``pad_sequences`` turns B sequences of
lengths L_b into one (T, B, F) array (T = max L_b), or (T, B) for token ids, plus ``lengths``.
"""

__all__ = ['pad_sequences', 'minibatches']
import numpy

from . import backend, checks, distributed
from .core import NetVar
from .dtypes import get_dtype


def _not_a_node(owner, what, value):
    """Padding copies data and records nothing: a NetVar is refused, not silently detached."""
    if isinstance(value, NetVar):
        raise TypeError(f"{owner}: {what} is a NetVar ({value._describe()}); {owner} copies "
                        "data and records no graph: give arrays (its .data)")


def _as_arrays(seqs, owner, what="seqs"):
    _not_a_node(owner, what, seqs)
    if isinstance(seqs, (str, bytes)) or not (hasattr(seqs, "__iter__")
                                              or hasattr(seqs, "__getitem__")):
        raise TypeError(f"{owner}: {what} must be a list of sequences, got "
                        f"{type(seqs).__name__}")
    if isinstance(seqs, numpy.ndarray) and seqs.dtype.kind != "O":
        seqs = list(seqs)          # a rectangular (B, L, ...) array: B sequences of equal length
    arrays = []
    for position, seq in enumerate(seqs):
        _not_a_node(owner, f"sequence {position} of {what}", seq)
        array = numpy.asarray(backend.to_cpu(seq) if hasattr(seq, "shape") else seq)
        if array.ndim == 0:
            raise ValueError(f"{owner}: sequence {position} of {what} is a single number "
                             f"({seq!r}), not a sequence; give a list of sequences, e.g. "
                             "[[1, 2, 3], [4, 5]]")
        if len(array) == 0:
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
    return arrays, _default_dtype(owner, seqs, arrays)


def _default_dtype(owner, seqs, arrays):
    """Integers stay integers (token ids), float arrays keep their dtype, lists get nnkit's."""
    dtype = numpy.result_type(*arrays)
    if dtype.kind == "b":
        return numpy.dtype(numpy.int64)
    if dtype.kind == "f" and all(a.dtype.kind in "biu" for a in arrays):
        # uint64 beside signed ids: NumPy's common type is float64, which rounds ids above 2**53
        for position, array in enumerate(arrays):
            if not _exact(array, numpy.int64):
                raise ValueError(f"{owner}: sequence {position} of dtype {array.dtype} holds values "
                                 "beyond int64, which other sequences' signed dtype needs; "
                                 "give the sequences one integer dtype")
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

    Raises TypeError for a ``value`` that is not a number or a ``dtype`` that is not a NumPy
    number type, and ValueError when an integer or bool ``dtype`` cannot hold the sequences or
    ``value`` exactly (``value=0.5`` for token ids, float features as int): never truncated.
    """
    arrays, default = _as_arrays(seqs, "pad_sequences")
    dtype = default if dtype is None else _check_dtype("pad_sequences", dtype, arrays)
    _check_value("pad_sequences", value, dtype)
    return _pad(arrays, dtype, value)


def _check_dtype(owner, dtype, arrays):
    """``dtype`` as a NumPy dtype that holds every value of ``arrays`` (a float one rounds)."""
    try:
        dtype = numpy.dtype(dtype)
    except TypeError:
        raise TypeError(f"{owner}: dtype must be a NumPy number type such as numpy.float32, "
                        f"got {dtype!r}") from None
    if dtype.kind not in "biuf":
        raise TypeError(f"{owner}: dtype must be a NumPy number type such as numpy.float32, "
                        f"got {dtype}")
    if dtype.kind in "biu":
        for position, array in enumerate(arrays):
            if not _exact(array, dtype):
                raise ValueError(f"{owner}: sequence {position} of dtype {array.dtype} cannot "
                                 f"be stored as {dtype} without changing its values")
    return dtype


def _check_value(owner, value, dtype):
    checks.number(owner, "value", value)
    if numpy.dtype(dtype).kind in "biu" and not _exact(value, dtype):
        raise ValueError(f"{owner}: value {value!r} cannot be stored in {numpy.dtype(dtype)} "
                         "data exactly; give a value of the data's type")


def _exact(values, dtype):
    """Whether ``values`` survive a cast to the integer or bool ``dtype`` unchanged."""
    with numpy.errstate(all="ignore"):
        try:
            cast = numpy.asarray(values).astype(dtype)
        except (OverflowError, ValueError):
            return False
        return bool(numpy.all(cast == values))


def _pad(arrays, dtype, value):
    """``pad_sequences`` of arrays already checked by ``_as_arrays``."""
    lengths = numpy.array([len(a) for a in arrays], dtype=numpy.int64)
    x = numpy.full((int(lengths.max()), len(arrays)) + arrays[0].shape[1:], value, dtype=dtype)
    for b, array in enumerate(arrays):
        x[:len(array), b] = array
    return x, lengths


def minibatches(seqs, targets=None, batch_size=32, shuffle=True, bucket=False, seed=None,
                drop_last=False, value=0.0, device=None, shard=False):
    """An iterator of padded minibatches ``(x, lengths, t)`` (``(x, lengths)`` without targets).

    x, lengths: ``pad_sequences`` of the batch's sequences (x (T, B) or (T, B, F), time-major).
    targets: None; one label per sequence (an array of N labels, or a list of numbers), giving
    t of shape (B, ...); or a list of target sequences (e.g. next tokens) as long as their
    input sequences, padded with 0 like x and time-major like it: t (T, B, ...). An array
    (N, T, ...) beside N sequences that all have T steps holds target sequences (t (T, B, ...)),
    not labels of shape (T, ...).
    shuffle: a new random order, drawn from ``seed`` (None: nnkit's global generator, seeded
    by ``nnkit.seed``; an int: a fresh generator, hence the same order on every call; a
    ``numpy.random.Generator``: used as it is, a new order each call).
    bucket: False, True or k. Batches group sequences of similar length so padding stays small:
    the (shuffled) sequences are taken k·batch_size at a time (all of them for True), sorted
    by length inside each pool and cut into batches, and the batches are shuffled.
    drop_last: yield only full batches: N mod batch_size sequences are left out of the epoch,
    taken from the end of the (shuffled) order before any bucketing, so with ``shuffle`` they
    are a different random few each epoch (never always the longest).
    device: where x and t are yielded: None or 'cpu' (NumPy), 'gpu' or 'gpu:N' (CuPy), e.g.
    ``device=model.vars[0].device``. lengths stay NumPy: the recurrent ops read them on the
    host to schedule their steps.
    shard: True for data-parallel training (``nnkit.distributed``): every rank yields its part
    of each batch (``distributed.shard`` of the batch's rows), the batches being those of rank 0
    (its shuffle is broadcast, so unseeded ranks agree too) and, on one process, those of
    ``shard=False``. Every rank must give the same number of sequences. batch_size must be at
    least the number of ranks; a last batch with fewer rows than ranks is dropped (its rows
    taken as drop_last takes them, before any bucketing).

    Every argument is checked at the call (TypeError for a wrong kind: a float or bool
    batch_size, a shuffle or drop_last that is not a bool; ValueError for a wrong value), before
    the shuffle draws from the global generator. The result is a one-shot iterator: to train
    for several epochs, call ``minibatches`` once per epoch (``lambda: nn.minibatches(...)``).
    Each batch is a tuple with a ``weight`` attribute, its weight in an epoch's mean loss (read
    by ``Trainer`` when step_fn returns only the loss): the number of sequences B with labels,
    the number of valid steps ``lengths.sum()`` with target sequences or without targets.
    """
    move = _mover(device)
    arrays, dtype = _as_arrays(seqs, "minibatches")
    N = len(arrays)
    _check_value("minibatches", value, dtype)
    batch_size = checks.count("minibatches", "batch_size", batch_size, 1)
    checks.flag("minibatches", "shuffle", shuffle)
    checks.flag("minibatches", "drop_last", drop_last)
    if checks.flag("minibatches", "shard", shard) and batch_size < distributed.size():
        raise ValueError(f"minibatches: shard=True cuts each batch into {distributed.size()} "
                         f"parts, one per rank; batch_size {batch_size} is smaller")
    if not isinstance(bucket, (bool, numpy.bool_)):
        if not checks.is_integer(bucket):
            raise TypeError(f"minibatches: bucket must be False, True or a number of batches "
                            f"k >= 1, got {type(bucket).__name__} {bucket!r}")
        if bucket < 1:
            raise ValueError(f"minibatches: bucket must be False, True or a number of batches "
                             f"k >= 1, got {bucket}")
    target_dtype = None
    if targets is not None:
        _not_a_node("minibatches", "targets", targets)
        if not hasattr(targets, "__len__") or getattr(targets, "ndim", 1) == 0:
            raise TypeError(f"minibatches: targets must be one label or target sequence per "
                            f"sequence (an array or a list), got {type(targets).__name__}")
        if len(targets) != N:
            raise ValueError(f"minibatches: {len(targets)} targets for {N} sequences")
        ragged = not isinstance(targets, numpy.ndarray) or targets.dtype.kind == "O"
        if ragged and any(numpy.ndim(t) for t in targets):      # target sequences, padded
            targets, target_dtype = _as_arrays(targets, "minibatches", "targets")
            for position, (x, t) in enumerate(zip(arrays, targets)):
                if len(x) != len(t):
                    raise ValueError(f"minibatches: sequence {position} has {len(x)} steps "
                                     f"but its target sequence has {len(t)}")
        else:
            targets = numpy.asarray(targets)
            if targets.ndim >= 2 and all(len(a) == targets.shape[1] for a in arrays):
                # (N, T, ...) beside N sequences of T steps: a target per step, time-major as x
                targets, target_dtype = list(targets), targets.dtype
    rng = backend.as_generator(seed, "minibatches")
    order = rng.permutation(N) if shuffle else numpy.arange(N)
    # Rows left out (drop_last's, and a last batch too small to cut into one part per rank)
    # go before bucketing, so that they are a random few, not always the longest.
    left = N % batch_size
    if drop_last or (shard and 0 < left < distributed.size()):
        order = order[:N - left]
    if bucket:
        pool = N if isinstance(bucket, (bool, numpy.bool_)) else int(bucket) * batch_size
        lengths = numpy.array([len(a) for a in arrays])
        order = numpy.concatenate([chunk[numpy.argsort(lengths[chunk], kind="stable")] for chunk
                                   in numpy.array_split(order, range(pool, len(order), pool))])
    batches = [order[start:start + batch_size] for start in range(0, len(order), batch_size)]
    if bucket and shuffle:
        batches = [batches[k] for k in rng.permutation(len(batches))]
    if shard:
        batches = _shards(batches, N)
    return _padded(batches, arrays, dtype, value, targets, target_dtype, move)


def _shards(batches, N):
    """This rank's part of each of rank 0's batches; batches smaller than the number of ranks
    are dropped. Every rank raises ValueError when the ranks hold different numbers of
    sequences."""
    ranks = distributed.size()
    if ranks == 1:
        return batches
    low, high = distributed.allreduce(numpy.array([-N, N]), "max")
    if -low != high:
        raise ValueError(f"minibatches: shard=True needs the same sequences on every rank; "
                         f"this rank has {N}, others between {-low} and {high}")
    sizes = numpy.array([len(rows) for rows in batches], dtype=numpy.int64)
    order = numpy.concatenate([sizes, *batches]).astype(numpy.int64)
    order = distributed.broadcast(order)               # rank 0's batches, on every rank
    sizes, flat = order[:len(batches)], order[len(batches):]
    cuts = numpy.cumsum(sizes)[:-1]
    return [distributed.shard(rows) for rows in numpy.split(flat, cuts) if len(rows) >= ranks]


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


class Batch(tuple):
    """A minibatch ``(x, lengths)`` or ``(x, lengths, t)`` with its ``weight`` in a mean loss."""

    def __new__(cls, items, weight):
        batch = super().__new__(cls, items)
        batch.weight = weight
        return batch


def _padded(batches, arrays, dtype, value, targets, target_dtype, move):
    """The generator behind ``minibatches`` (so that bad arguments raise at the call)."""
    for rows in batches:
        x, lengths = _pad([arrays[k] for k in rows], dtype, value)
        steps = int(lengths.sum())
        if targets is None:
            yield Batch((move(x), lengths), steps)
        elif target_dtype is not None:
            t = _pad([targets[k] for k in rows], target_dtype, 0)[0]
            yield Batch((move(x), lengths, move(t)), steps)
        else:
            yield Batch((move(x), lengths, move(targets[rows])), len(rows))
