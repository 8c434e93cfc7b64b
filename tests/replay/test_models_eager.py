"""The capture tests' model zoo (tests/replay/models.py), run eagerly: each model's training
is reproducible bit for bit from its seed, learns, keeps its dtype, and its ``state()`` sees
what training changes, so that a replay compared with it can fail."""
import numpy as np
import pytest

import nnkit as nn
from tests.replay import models

DTYPES = (np.float32, np.float64)
STEPS = 20


@pytest.fixture(autouse=True)
def _nnkit_generator_and_dtype_restored():
    """Building seeds nnkit's global generator: give other tests back the one they had."""
    saved, dtype = nn.get_rng_state(), nn.get_dtype()
    yield
    nn.set_rng_state(saved)
    nn.set_dtype(dtype)


def _train(kind, dtype, seed=0, steps=STEPS):
    """A fresh build trained ``steps`` steps on its batches: (built, losses as floats)."""
    built = models.build(kind, dtype, seed)
    losses = [built.step(*inputs) for inputs in built.batches(steps)]
    return built, [loss.item() for loss in losses]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kind", models.KINDS)
def test_two_builds_train_to_the_same_state_bit_for_bit(kind, dtype):
    first, first_losses = _train(kind, dtype)
    second, second_losses = _train(kind, dtype)
    assert models.same_state(first.state(), second.state())
    assert first_losses == second_losses
    assert np.isfinite(first_losses).all()
    # the model learns: the last losses (before their updates) below the first ones
    assert np.mean(first_losses[-5:]) < np.mean(first_losses[:5])
    if kind == "mlp":
        assert first_losses[-1] < first_losses[0]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kind", models.KINDS)
def test_training_keeps_the_dtype_and_moves_every_parameter(kind, dtype):
    default = nn.get_dtype()
    built = models.build(kind, dtype)
    assert nn.get_dtype() == default              # set only while building
    before = {name: p.data.copy() for name, p in built.model.named_vars().items()}
    losses = [built.step(*inputs) for inputs in built.batches(2)]
    assert all(loss.dtype == dtype for loss in losses)
    floats = [array for array in built.state() if array.dtype.kind == "f"]
    assert floats and all(array.dtype == dtype for array in floats)
    # all of them, even the transformer's encoder.self_attn.bk, whose gradient is rounding
    # error only (~1e-18: the softmax ignores it), which Adam turns into steps of ~1e-12
    unmoved = [name for name, p in built.model.named_vars().items()
               if np.array_equal(p.data, before[name])]
    assert unmoved == []


@pytest.mark.parametrize("kind", models.KINDS)
def test_another_seed_gives_another_state(kind):
    """The comparison can fail: a model built from seed 1 ends elsewhere than seed 0's."""
    zero, _ = _train(kind, np.float32, seed=0, steps=3)
    one, _ = _train(kind, np.float32, seed=1, steps=3)
    assert not models.same_state(zero.state(), one.state())
    assert not np.array_equal(zero.batches(1)[0][0], one.batches(1)[0][0])


def test_same_state_compares_length_dtype_shape_and_values():
    a = [np.zeros(3, np.float32), np.array(2, np.int64)]
    assert models.same_state(a, [x.copy() for x in a])
    assert not models.same_state(a, a[:1])
    assert not models.same_state(a, [a[0].astype(np.float64), a[1]])
    assert not models.same_state(a, [a[0].reshape(1, 3), a[1]])
    assert not models.same_state(a, [a[0], np.array(3, np.int64)])
    assert not models.same_state([np.zeros(2)], [np.array([0.0, 5e-324])])   # the smallest step


@pytest.mark.parametrize("kind", models.KINDS)
def test_batches_have_one_signature_and_depend_on_the_seed_and_index_only(kind):
    built = models.build(kind, np.float32)
    batches = built.batches(6)
    signature = [(x.shape, x.dtype) for x in batches[0]]
    assert all([(x.shape, x.dtype) for x in inputs] == signature for inputs in batches)
    assert all(isinstance(x, np.ndarray) for inputs in batches for x in inputs)
    again = models.build(kind, np.float32).batches(3)
    assert all(np.array_equal(x, y) for a, b in zip(again, batches) for x, y in zip(a, b))
    assert not np.array_equal(batches[0][0], batches[1][0])


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
def test_ragged_batches_vary_their_lengths_under_one_padded_length(kind):
    batches = models.build(kind, np.float32).batches(5)
    lengths = np.stack([inputs[1] for inputs in batches])        # (batches, B)
    T = batches[0][0].shape[0]
    assert lengths.min() >= 1 and lengths.max() <= T
    assert all(len(set(row)) > 1 for row in lengths)              # ragged within a batch
    assert len({tuple(row) for row in lengths}) == len(batches)   # and from batch to batch
    mask = nn.sequence_mask(lengths[0], T)
    assert not batches[0][0][~mask].any()                          # zero padding


def test_transformer_draws_dropout_masks_from_nnkits_generator():
    built = models.build("transformer", np.float32)
    inputs = built.batches(1)[0]
    position = models.generator_position()
    assert np.array_equal(built.state()[-1], position)              # state() holds it
    built.step(*inputs)
    assert not np.array_equal(models.generator_position(), position)
    assert np.array_equal(built.state()[-1], models.generator_position())
    # the same step from the same weights with another generator position: another loss
    first = models.build("transformer", np.float32)
    second = models.build("transformer", np.float32)
    nn.seed(12345)
    assert first.step(*inputs).item() != second.step(*inputs).item()


def test_bn_cnn_updates_the_running_statistics():
    built = models.build("bn_cnn", np.float64)
    stats = built.model.norm.stats
    mean, var = stats.running_mean.copy(), stats.running_var.copy()
    for inputs in built.batches(2):
        built.step(*inputs)
    assert stats.num_batches_tracked == 2
    assert not np.array_equal(stats.running_mean, mean)
    assert not np.array_equal(stats.running_var, var)


def test_dqn_syncs_its_target_every_fifth_call_inside_step():
    built = models.build("dqn", np.float64)
    q = built.model
    parameters = len(q.state())
    target = lambda: built.state()[parameters:2 * parameters]      # noqa: E731
    online = lambda: built.state()[:parameters]                     # noqa: E731
    initial = target()
    batches = built.batches(6)
    for inputs in batches[:4]:
        built.step(*inputs)
    assert models.same_state(target(), initial)                     # not synced yet
    assert not models.same_state(online(), initial)
    built.step(*batches[4])
    assert models.same_state(target(), online())                   # synced at the 5th call
    built.step(*batches[5])
    assert not models.same_state(target(), online())
