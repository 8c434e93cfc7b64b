"""Metrics accumulated over minibatches equal the metric over the whole data set."""
import math

import numpy as np
import pytest

import nnkit as nn

SIZES = [7, 3, 10, 1, 9]     # unequal minibatches covering 30 rows


def _batches(*arrays, axis=0):
    start = 0
    for n in SIZES:
        yield tuple(np.take(a, range(start, start + n), axis=axis) for a in arrays)
        start += n


def test_accuracy_over_minibatches_equals_full_data(rng):
    scores, labels = rng.standard_normal((30, 4)), rng.integers(0, 4, 30)
    metric = nn.Accuracy()
    for s, t in _batches(scores, labels):
        metric.update(nn.NetVar(s), t)
    full = (scores.argmax(1) == labels).mean()
    assert 0 < full < 1 and metric.value == pytest.approx(full, abs=1e-15)
    assert metric.count == 30


def test_accuracy_accepts_indices_and_one_hot(rng):
    labels = rng.integers(0, 3, 12)
    one_hot = np.eye(3)[labels]
    assert nn.Accuracy().update(labels, labels).value == 1.0
    assert nn.Accuracy().update(one_hot * 5, one_hot).value == 1.0
    wrong = np.roll(one_hot, 1, axis=1)
    assert nn.Accuracy().update(wrong, labels).value == 0.0
    with pytest.raises(ValueError, match=r"predictions of shape \(12, 3\) do not match targets"):
        nn.Accuracy().update(one_hot, labels[:5])


def test_accuracy_reads_integer_predictions_as_class_indices():
    # (T, B) = (3, 2) class indices whose target rows happen to look one-hot: 5 of 6 match
    p = np.array([[1, 1], [1, 0], [0, 1]])
    t = np.array([[0, 1], [1, 0], [0, 1]])
    assert nn.Accuracy().update(p, t).value == pytest.approx(5 / 6)
    # whole-number float predictions beside integer one-hot-looking targets: both readings fit
    with pytest.raises(ValueError, match=r"Accuracy: .*shape \(3, 2\) read both"):
        nn.Accuracy().update(p.astype(float), t)
    # scores with integer one-hot targets still read as scores
    scores = np.array([[0.2, 0.8], [0.9, 0.1], [0.3, 0.7]])
    assert nn.Accuracy().update(scores, t).value == 1.0


def test_masked_sequence_metrics_equal_full_data(rng):
    steps, batch, classes = 5, 30, 4
    logits = rng.standard_normal((steps, batch, classes))
    labels = rng.integers(0, classes, (steps, batch))
    lengths = rng.integers(1, steps + 1, batch)
    mask = nn.sequence_mask(lengths, steps).astype(np.float64)
    accuracy, loss = nn.Accuracy(), nn.MeanLoss()
    for z, t, m in _batches(logits, labels, mask, axis=1):
        accuracy.update(z, t, mask=m)
        loss.update(nn.SoftmaxCELoss(nn.NetVar(z), t, mask=m), n=m.sum())
    valid = mask.astype(bool)
    expected_acc = (logits.argmax(-1) == labels)[valid].mean()
    expected_loss = nn.SoftmaxCELoss(nn.NetVar(logits), labels, mask=mask).item()
    assert accuracy.value == pytest.approx(expected_acc, abs=1e-15)
    assert loss.value == pytest.approx(expected_loss, rel=1e-12)
    assert accuracy.count == lengths.sum()


def test_mean_loss_weights_by_batch_size(rng):
    x, t = rng.standard_normal((30, 2)), rng.standard_normal((30, 2))
    metric = nn.MeanLoss()
    for xb, tb in _batches(x, t):
        metric.update(nn.MSELoss(nn.NetVar(xb), tb), n=len(xb))
    assert metric.value == pytest.approx(nn.MSELoss(nn.NetVar(x), t).item(), rel=1e-12)


def test_mse_with_and_without_mask(rng):
    p, t = rng.standard_normal((4, 30, 3)), rng.standard_normal((4, 30, 3))
    mask = (rng.random((4, 30)) < 0.6).astype(np.float64)
    plain, masked = nn.MSE(), nn.MSE()
    for pb, tb, mb in _batches(p, t, mask, axis=1):
        plain.update(pb, tb)
        masked.update(nn.NetVar(pb), tb, mask=mb)
    assert plain.value == pytest.approx(((p - t) ** 2).mean(), rel=1e-12)
    expected = nn.MSELoss(nn.NetVar(p), t, mask=mask).item()
    assert masked.value == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="mask of shape"):
        nn.MSE().update(p, t, mask=mask[:, :3])


def test_reset_and_empty_value():
    metric = nn.MeanLoss()
    assert math.isnan(metric.value)
    metric.update(2.0, n=3).update(np.array([[4.0]]), n=1)
    assert metric.value == 2.5
    metric.reset()
    assert math.isnan(metric.value) and metric.count == 0


def test_accuracy_of_class_index_sequences(rng):
    # (T, B) predicted ids and (T, B) labels: argmax over the batch axis before
    labels = rng.integers(0, 5, (6, 4))
    predicted = np.where(rng.random((6, 4)) < 0.5, labels, (labels + 1) % 5)
    expected = (predicted == labels).mean()
    assert 0 < expected < 1
    assert nn.Accuracy().update(predicted, labels).value == expected
    assert nn.Accuracy().update(predicted.astype(np.float32), labels).value == expected
    soft = np.full((6, 3), 0.1) + 0.7 * np.eye(3)[rng.integers(0, 3, 6)]   # smoothed labels
    assert nn.Accuracy().update(soft, soft).value == 1.0


def test_accuracy_refuses_to_guess(rng):
    labels = rng.integers(0, 2, 8)
    probabilities = rng.random((8, 1))
    # one sigmoid output per row: argmax over one column always said class 0
    with pytest.raises(ValueError, match=r"Accuracy: predictions of shape \(8, 1\) hold one score "
                                         r"per position for targets of shape \(8,\); give C >= 2"):
        nn.Accuracy().update(probabilities, labels)
    with pytest.raises(ValueError, match=r"Accuracy: predictions and targets of shape \(8,\) are "
                                         "neither class indices"):
        nn.Accuracy().update(probabilities[:, 0], labels)
    with pytest.raises(ValueError, match=r"of shape \(8, 1\) are neither class indices"):
        nn.Accuracy().update(probabilities, labels[:, None])
    thresholded = (probabilities > 0.5).astype(np.int64)
    assert nn.Accuracy().update(thresholded, labels[:, None]).value == \
        (thresholded[:, 0] == labels).mean()
    with pytest.raises(ValueError, match=r"predictions of shape \(8, 3\) do not match targets of "
                                         r"shape \(7,\)"):
        nn.Accuracy().update(rng.random((8, 3)), labels[:7])
    with pytest.raises(TypeError, match="Accuracy: predictions must be a NetVar or an array of "
                                        "numbers, got NoneType"):
        nn.Accuracy().update(None, labels)
    with pytest.raises(TypeError, match="Accuracy: targets must be .* got list of dtype <U1"):
        nn.Accuracy().update(labels, list("ab" * 4))


def test_masks_hold_non_negative_weights(rng):
    p, t = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    with pytest.raises(ValueError, match=r"MSE: mask must hold weights >= 0 \(1 valid, 0 "
                                         r"padding\), got min -1.0"):
        nn.MSE().update(p, t, mask=np.array([1.0, 0.0, -1.0]))
    with pytest.raises(ValueError, match="Accuracy: mask must hold weights >= 0"):
        nn.Accuracy().update(p, t.argmax(-1), mask=np.array([1.0, np.nan, 1.0]))
    with pytest.raises(ValueError, match=r"mask of shape \(3, 1\) does not match"):
        nn.MSE().update(p, t, mask=np.ones((3, 1)))
    metric = nn.MSE().update(p, t, mask=np.array([True, False, True]))
    assert metric.value == pytest.approx(((p - t)[[0, 2]] ** 2).mean(), rel=1e-12)


def test_mse_never_broadcasts():
    with pytest.raises(ValueError, match=r"MSE: predictions of shape \(4,\) and targets of shape "
                                         r"\(4, 1\) differ"):
        nn.MSE().update(np.zeros(4), np.zeros((4, 1)))


@pytest.mark.parametrize("n, error, message", [
    (float("inf"), ValueError, "n must be finite, got inf"),
    (float("nan"), ValueError, "n must be finite, got nan"),
    (-1, ValueError, "n must be >= 0, got -1.0"),
    (np.array([2, 3]), ValueError, r"n must be one number, got shape \(2,\)"),
    (None, TypeError, "n must be a NetVar or an array of numbers, got NoneType")])
def test_mean_loss_weight(n, error, message):
    metric = nn.MeanLoss().update(1.0, n=2)
    with pytest.raises(error, match=f"MeanLoss: {message}"):
        metric.update(5.0, n=n)
    assert metric.value == 1.0 and metric.count == 2


def test_accuracy_refuses_a_target_outside_the_classes_unless_masked_out():
    # an ignore_index of -1 beside SoftmaxCELoss counted as a wrong prediction: 0.5 for 1.0
    scores = np.array([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0], [0.0, 2.0]])
    targets = np.array([0, 1, -1, -1])
    with pytest.raises(ValueError, match=r"Accuracy: target class -1 is outside the 2 classes"):
        nn.Accuracy().update(scores, targets)
    metric = nn.Accuracy()
    metric.update(scores, targets, mask=targets != -1)
    assert metric.value == 1.0


def test_accuracy_reads_one_hot_targets_whose_masked_padding_rows_are_zero():
    # the one-hot test looked at every row, the masked-out zero rows too, and refused
    scores = np.array([[[2.0, 0.0], [0.0, 2.0]], [[2.0, 0.0], [0.0, 1.0]]])
    targets = np.array([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [0.0, 0.0]]])
    mask = np.array([[1, 1], [1, 0]])
    assert nn.Accuracy().update(scores, targets, mask=mask).value == pytest.approx(2 / 3)
