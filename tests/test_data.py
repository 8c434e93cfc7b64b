import numpy as np
import pytest

import nnkit as nn


def test_pad_sequences_features_are_time_major(rng):
    seqs = [rng.standard_normal((n, 3)) for n in (2, 5, 1)]
    x, lengths = nn.pad_sequences(seqs, value=-1.0)
    assert x.shape == (5, 3, 3) and x.dtype == np.float64
    np.testing.assert_array_equal(lengths, [2, 5, 1])
    for b, seq in enumerate(seqs):
        np.testing.assert_array_equal(x[:len(seq), b], seq)
        assert np.all(x[len(seq):, b] == -1.0)


def test_pad_sequences_tokens_and_dtypes():
    x, lengths = nn.pad_sequences([[3, 1], [4, 1, 5]])
    assert x.dtype.kind == "i" and x.shape == (3, 2)
    np.testing.assert_array_equal(x, [[3, 4], [1, 1], [0, 5]])
    np.testing.assert_array_equal(lengths, [2, 3])
    floats, _ = nn.pad_sequences([[0.5], [1.5, 2.5]])
    assert floats.dtype == nn.get_dtype()
    assert nn.pad_sequences([np.ones(2, np.float32)])[0].dtype == np.float32
    assert nn.pad_sequences([[1, 2]], dtype=np.float64)[0].dtype == np.float64
    lengths_feed_the_ops = nn.RNN(np.ones((3, 2, 1)), np.ones((1, 2)), np.eye(2), np.zeros(2),
                                  lengths=lengths)
    assert np.all(lengths_feed_the_ops.data[2, 0] == 0)


def test_pad_sequences_errors():
    with pytest.raises(ValueError, match="pad_sequences: sequence 1 is empty"):
        nn.pad_sequences([[1], []])
    with pytest.raises(ValueError, match=r"pad_sequences: sequence 1 has steps of shape \(2,\)"):
        nn.pad_sequences([np.ones((2, 3)), np.ones((2, 2))])
    with pytest.raises(ValueError, match="no sequences"):
        nn.pad_sequences([])


def _dataset(rng, n=50):
    seqs = [rng.integers(0, 9, rng.integers(1, 30)) for _ in range(n)]
    labels = np.arange(n)
    return seqs, labels


def test_minibatches_cover_every_sequence_once(rng):
    seqs, labels = _dataset(rng)
    seen = []
    for x, lengths, t in nn.minibatches(seqs, labels, batch_size=8, seed=0):
        assert x.shape == (lengths.max(), len(t))
        for b, label in enumerate(t):
            np.testing.assert_array_equal(x[:lengths[b], b], seqs[label])
        seen.extend(t.tolist())
    assert sorted(seen) == list(range(50)) and seen != list(range(50))


def test_minibatches_reproducible_shuffle(rng):
    seqs, labels = _dataset(rng)

    def order(**kw):
        return [t.tolist() for _, _, t in nn.minibatches(seqs, labels, batch_size=8, **kw)]

    assert order(seed=3) == order(seed=3)
    assert order(seed=3) != order(seed=4)
    nn.seed(7)
    first = order()
    nn.seed(7)
    assert order() == first
    generator = np.random.default_rng(1)
    assert order(seed=generator) != order(seed=generator)    # a new order every epoch
    assert order(shuffle=False) == [list(range(k, min(k + 8, 50))) for k in range(0, 50, 8)]


def test_bucketing_keeps_padding_small(rng):
    seqs, labels = _dataset(rng, 200)

    def padding(**kw):
        total = 0
        for x, lengths, t in nn.minibatches(seqs, labels, batch_size=16, seed=0, **kw):
            total += x.size - lengths.sum()
        return total

    assert padding(bucket=True) < padding(bucket=4) < padding() / 2
    seen = sorted(k for _, _, t in nn.minibatches(seqs, labels, batch_size=16, bucket=4, seed=0)
                  for k in t)
    assert seen == list(range(200))


def test_minibatches_per_step_targets_and_drop_last(rng):
    seqs = [rng.standard_normal((n, 2)) for n in (3, 1, 4, 2, 5)]
    targets = [np.arange(len(s)) + 1 for s in seqs]
    batches = list(nn.minibatches(seqs, targets, batch_size=2, drop_last=True, seed=0))
    assert len(batches) == 2
    for x, lengths, t in batches:
        assert x.shape[:2] == t.shape and t.dtype.kind == "i"
        for b in range(len(lengths)):
            np.testing.assert_array_equal(t[:lengths[b], b], np.arange(lengths[b]) + 1)
            assert np.all(t[lengths[b]:, b] == 0)
    assert [len(b) for b in nn.minibatches(seqs, batch_size=5)] == [2]     # (x, lengths)
    with pytest.raises(ValueError, match="sequence 2 has 4 steps but its target sequence has 3"):
        nn.minibatches(seqs, targets[:2] + [np.zeros(3)] + targets[3:])
    with pytest.raises(ValueError, match="4 targets for 5 sequences"):
        nn.minibatches(seqs, targets[:4])
    # a bad step shape is found at the call and named by its place in the whole data set
    with pytest.raises(ValueError, match=r"minibatches: sequence 3 has steps of shape \(3,\), "
                                         r"sequence 0 has \(2,\)"):
        nn.minibatches(seqs[:3] + [np.ones((2, 3))], batch_size=2, shuffle=False)


def test_drop_last_with_buckets_leaves_out_a_random_few_not_the_longest(rng):
    # one sequence longer than all others: bucketing sorts it last, and dropping the last
    # (short) batch after bucketing left it out of every epoch
    seqs = [np.ones(n) for n in (2, 3, 2, 4, 3, 2, 3, 2, 3, 9)]
    labels = np.arange(10)
    longest_seen, full_batches = 0, True
    for seed in range(20):
        rows = [t for _, _, t in nn.minibatches(seqs, labels, batch_size=3, bucket=True,
                                                 drop_last=True, seed=seed)]
        full_batches &= [len(t) for t in rows] == [3, 3, 3]
        longest_seen += any(9 in t for t in rows)
    assert full_batches and 0 < longest_seen < 20
    # without a shuffle the last sequences of the given order are left out, as without buckets
    plain = [t.tolist() for _, _, t in nn.minibatches(seqs, labels, batch_size=3,
                                                      shuffle=False, drop_last=True)]
    assert plain == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_target_array_of_equal_length_sequences_is_time_major_like_x(rng):
    # an (N, T) array of per-step targets beside N sequences of T steps: t is (T, B) like x,
    # not the batch-major (B, T) rows (wrong at once when T == B)
    x_all = rng.integers(0, 5, (6, 4))
    t_all = x_all + 10
    for x, lengths, t in nn.minibatches(x_all, t_all, batch_size=4, seed=0):
        assert x.shape == t.shape == (4, len(lengths))
        np.testing.assert_array_equal(t, x + 10)
    # one label per sequence of another length stays (B, K)
    labels = rng.standard_normal((6, 3))
    for x, lengths, t in nn.minibatches(x_all, labels, batch_size=4, shuffle=False):
        assert t.shape == (len(lengths), 3)


def test_minibatches_batches_carry_their_weight(rng):
    seqs = [np.ones(n) for n in (3, 1, 4, 2)]
    by_label = list(nn.minibatches(seqs, np.arange(4), batch_size=4, shuffle=False))
    by_step = list(nn.minibatches(seqs, [np.ones(n) for n in (3, 1, 4, 2)], batch_size=4))
    alone = list(nn.minibatches(seqs, batch_size=4))
    assert by_label[0].weight == 4 and by_step[0].weight == 10 and alone[0].weight == 10
    x, lengths, t = by_label[0]                     # still a plain tuple to unpack
    assert x.shape == (4, 4) and t.shape == (4,)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"batch_size": None}, TypeError, "batch_size must be a positive integer, got NoneType"),
    ({"batch_size": 2.5}, TypeError, "batch_size must be a positive integer, got float 2.5"),
    ({"batch_size": True}, TypeError, "batch_size must be a positive integer, got bool True"),
    ({"batch_size": 0}, ValueError, "batch_size must be a positive integer, got 0"),
    ({"bucket": 0.5}, TypeError, r"bucket must be False, True or a number of batches k >= 1, "
                                 "got float 0.5"),
    ({"bucket": -1}, ValueError, "bucket must be False, True or a number of batches k >= 1, "
                                 "got -1"),
    ({"bucket": 0}, ValueError, "bucket must be .* got 0"),
    ({"bucket": "yes"}, TypeError, "bucket must be .* got str 'yes'"),
    ({"shuffle": "no"}, TypeError, "shuffle must be True or False, got str 'no'"),
    ({"shuffle": None}, TypeError, "shuffle must be True or False, got NoneType"),
    ({"drop_last": 1}, TypeError, "drop_last must be True or False, got int 1"),
    ({"seed": 1.5}, TypeError, "seed must be None, an int or a numpy.random.Generator, got "
                               "float 1.5"),
    ({"seed": True}, TypeError, "seed must be None, an int .* got bool True"),
    ({"seed": "0"}, TypeError, "seed must be None, an int .* got str '0'"),
    ({"seed": -1}, ValueError, "seed must be >= 0, got -1"),
    ({"value": 0.5}, ValueError, "value 0.5 cannot be stored in int64 data exactly"),
    ({"value": None}, TypeError, "value must be a number, got NoneType None"),
    ({"value": "pad"}, TypeError, "value must be a number, got str 'pad'"),
    ({"device": "cuda"}, ValueError, "device must be None, 'cpu', 'gpu' or 'gpu:N'")])
def test_minibatches_refuses_bad_arguments_at_the_call(kwargs, error, message):
    seqs, labels = [[1, 2], [3], [4, 5, 6]] * 5, list(range(15))
    nn.seed(5)
    with pytest.raises(error, match=f"minibatches: {message}"):
        nn.minibatches(seqs, labels, **kwargs)
    after_refusal = [t.tolist() for _, _, t in nn.minibatches(seqs, labels, batch_size=4)]
    nn.seed(5)
    expected = [t.tolist() for _, _, t in nn.minibatches(seqs, labels, batch_size=4)]
    assert after_refusal == expected               # the refused call drew no shuffle


def test_minibatches_accepts_numpy_integers_and_bools():
    seqs = [[1, 2], [3], [4, 5, 6], [7]]
    batches = list(nn.minibatches(seqs, batch_size=np.int64(2), bucket=np.int32(1),
                                  shuffle=np.bool_(False), seed=np.int64(0)))
    assert [len(lengths) for _, lengths in batches] == [2, 2]
    assert len(list(nn.minibatches(seqs, batch_size=3, bucket=np.bool_(True)))) == 2


def test_sequences_that_are_numbers_are_named():
    with pytest.raises(ValueError, match=r"pad_sequences: sequence 0 of seqs is a single number "
                                         r"\(1\), not a sequence; give a list of sequences"):
        nn.pad_sequences([1, 2, 3])
    with pytest.raises(ValueError, match="minibatches: sequence 1 of targets is a single number"):
        nn.minibatches([[1, 2], [3]], [[1, 2], 3])
    for seqs in (None, 3, "abc"):
        with pytest.raises(TypeError, match="pad_sequences: seqs must be a list of sequences, "
                                            f"got {type(seqs).__name__}"):
            nn.pad_sequences(seqs)
    with pytest.raises(TypeError, match="minibatches: targets must be one label or target "
                                        "sequence per sequence .* got int"):
        nn.minibatches([[1, 2], [3]], 1)


def test_pad_sequences_never_truncates():
    # a float padding value in token ids, float features stored as ints: silently cut before
    with pytest.raises(ValueError, match="pad_sequences: value 0.5 cannot be stored in int64 "
                                         "data exactly"):
        nn.pad_sequences([[3, 1], [4]], value=0.5)
    with pytest.raises(ValueError, match="pad_sequences: value nan cannot be stored"):
        nn.pad_sequences([[3, 1], [4]], value=float("nan"))
    with pytest.raises(ValueError, match="pad_sequences: sequence 1 of dtype float64 cannot be "
                                         "stored as int64 without changing its values"):
        nn.pad_sequences([np.array([1.0, 2.0]), np.array([0.5])], dtype=np.int64)
    with pytest.raises(ValueError, match="sequence 0 of dtype int64 cannot be stored as uint8"):
        nn.pad_sequences([[300, 1]], dtype=np.uint8)
    with pytest.raises(ValueError, match="value -1 cannot be stored in uint8"):
        nn.pad_sequences([[3, 1], [4]], dtype=np.uint8, value=-1)
    with pytest.raises(ValueError, match="sequence 0 of dtype int64 cannot be stored as bool"):
        nn.pad_sequences([[2, 0]], dtype=bool)
    with pytest.raises(TypeError, match="pad_sequences: dtype must be a NumPy number type .* "
                                        "got <U"):
        nn.pad_sequences([[1, 2]], dtype=str)
    with pytest.raises(TypeError, match="pad_sequences: dtype must be a NumPy number type .* "
                                        "got 'float99'"):
        nn.pad_sequences([[1, 2]], dtype="float99")
    with pytest.raises(TypeError, match="pad_sequences: value must be a number, got bool"):
        nn.pad_sequences([[1, 2]], value=False)
    # exact conversions and float rounding are fine
    x, _ = nn.pad_sequences([np.array([1.0, 2.0]), np.array([3.0])], dtype=np.int8, value=-1)
    np.testing.assert_array_equal(x, [[1, 3], [2, -1]])
    assert x.dtype == np.int8
    assert nn.pad_sequences([[0.1, 0.2]], dtype=np.float16, value=0.3)[0].dtype == np.float16
    assert np.isnan(nn.pad_sequences([[0.5], [1.5, 2.5]], value=np.nan)[0][1, 0])


def test_nodes_are_refused_by_name_and_mixed_integer_ids_stay_exact():
    with pytest.raises(TypeError, match=r"pad_sequences: sequence 1 of seqs is a NetVar .*"
                                        r"give arrays \(its \.data\)"):
        nn.pad_sequences([np.ones((2, 3)), nn.NetVar(np.ones((1, 3)))])
    with pytest.raises(TypeError, match="minibatches: targets is a NetVar"):
        nn.minibatches([np.ones(2), np.ones(3)], nn.NetVar(np.array([1.0, 0.0])))
    # uint64 beside int64 ids: NumPy's common type float64 rounded 2**60 + 1
    big = 2 ** 60 + 1
    x, _ = nn.pad_sequences([np.array([1, big], dtype=np.uint64), np.array([3], dtype=np.int64)])
    assert x.dtype == np.int64 and int(x[1, 0]) == big
    with pytest.raises(ValueError, match="pad_sequences: sequence 0 of dtype uint64 holds values "
                                         "beyond int64"):
        nn.pad_sequences([np.array([2 ** 63 + 1], dtype=np.uint64), np.array([3])])


def test_ragged_target_sequences_in_an_object_array_are_padded_as_a_list_is():
    # an object array of target sequences was yielded as it was: unpadded, batch-major
    seqs = np.empty(3, dtype=object)
    seqs[:] = [np.array([1, 2, 3]), np.array([4, 5]), np.array([6])]
    targets = np.empty(3, dtype=object)
    targets[:] = [np.array([2, 3, 0]), np.array([5, 0]), np.array([0])]
    (x, lengths, t), = nn.minibatches(seqs, targets, batch_size=3, shuffle=False)
    (_, _, expected), = nn.minibatches(seqs, list(targets), batch_size=3, shuffle=False)
    assert t.dtype == expected.dtype and t.shape == (3, 3)
    np.testing.assert_array_equal(t, expected)
