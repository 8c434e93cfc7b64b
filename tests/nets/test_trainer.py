"""The Trainer: epoch logs, the history, the hook protocol, batches and bad usage."""
import math

import numpy as np
import pytest

import nnkit as nn


def _problem(seed=0, rows=60):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 3))
    y = (x @ np.array([1.0, -2.0, 0.5]) > 0).astype(np.int64)
    return x, y


def _batches(x, y, size=16):
    return [(x[i:i + size], y[i:i + size]) for i in range(0, len(x), size)]


def _model(seed=0):
    nn.seed(seed)
    w, b = nn.NetVar(nn.glorot(3, 2).data.astype(np.float64)), nn.NetVar(np.zeros((1, 2)))
    w.name, b.name = "w", "b"

    def step(batch):
        x, y = batch
        z = nn.NetVar(x, requires_grad=False) @ w + b
        return nn.SoftmaxCELoss(z, y), z, y

    return step, [w, b]


def test_epoch_logs_equal_full_data_values_and_history():
    x, y = _problem()
    step, params = _model()
    trainer = nn.Trainer(step, nn.GD(params, lr=0.0), metrics={"accuracy": nn.Accuracy()})
    history = trainer.fit(_batches(x, y), epochs=2, val=_batches(x[:25], y[:25], 7))
    loss, z, _ = step((x, y))
    assert history is trainer.history
    assert history["epoch"] == [1, 2] and history["samples"] == [60, 60]
    assert history["loss"][0] == pytest.approx(loss.item(), rel=1e-12)
    assert history["accuracy"][0] == pytest.approx((z.data.argmax(1) == y).mean(), abs=1e-15)
    val_loss = step((x[:25], y[:25]))[0].item()
    assert history["val_loss"] == pytest.approx([val_loss] * 2, rel=1e-12)
    assert set(history) == {"epoch", "loss", "accuracy", "val_loss", "val_accuracy", "lr",
                            "samples", "time"}
    assert trainer.steps == 8 and history["lr"] == [0.0, 0.0]


def test_a_history_given_as_a_hook_is_the_trainers_and_runs_first():
    x, y = _problem()
    step, params = _model()
    seen = []

    class Watcher(nn.Hook):
        def on_epoch_end(self, trainer, logs):
            seen.append(list(history["epoch"]))

    history = nn.History()
    trainer = nn.Trainer(step, nn.GD(params), hooks=[Watcher(), history])
    assert trainer.history is history and trainer.hooks[0] is history
    assert trainer.fit(_batches(x, y), epochs=2) is history
    assert history["epoch"] == [1, 2] and seen == [[1], [1, 2]]


def test_training_reduces_the_loss_and_callable_batches_reshuffle():
    x, y = _problem()
    step, params = _model()
    rng = np.random.default_rng(0)
    seen = []

    def batches():              # a generator function: a fresh generator each epoch
        order = rng.permutation(len(x))
        seen.append(order[0])
        yield from _batches(x[order], y[order])

    history = nn.Trainer(step, nn.Adam(params, lr=0.05)).fit(
        batches, epochs=15, val=lambda: iter(_batches(x, y)))
    assert len(seen) == 15 and len(set(seen)) > 1 and len(history["val_loss"]) == 15
    assert history["loss"][-1] < 0.5 * history["loss"][0]


def test_hook_callbacks_order_and_validation_modes():
    x, y = _problem()
    step, params = _model()
    modes = []

    def recording_step(batch):
        modes.append((nn.is_training(), nn.is_grad_enabled()))
        return step(batch)

    class Recorder(nn.Hook):
        def __init__(self):
            self.calls = []

        def __getattribute__(self, name):
            if name.startswith("on_"):
                self.calls.append(name)
            return object.__getattribute__(self, name)

    recorder = Recorder()
    nn.Trainer(recording_step, nn.GD(params), hooks=[recorder]).fit(
        _batches(x[:32], y[:32]), epochs=1, val=[(x[:5], y[:5])])
    assert recorder.calls == ["on_fit_start", "on_epoch_start",
                              "on_before_step", "on_batch_end",
                              "on_before_step", "on_batch_end",
                              "on_epoch_end", "on_fit_end"]
    assert modes == [(True, True), (True, True), (False, False)]
    assert nn.is_training() and nn.is_grad_enabled()


def test_bad_usage_is_explained():
    x, y = _problem()
    step, params = _model()
    trainer = nn.Trainer(lambda batch: step(batch)[0].data, nn.GD(params))
    with pytest.raises(TypeError, match="step_fn must return the loss node"):
        trainer.fit(_batches(x, y))
    once = iter(_batches(x, y))
    with pytest.raises(TypeError, match="is an iterator, which is exhausted"):
        nn.Trainer(step, nn.GD(params)).fit(once, epochs=2)
    with pytest.raises(ValueError, match="gave no batches"):
        nn.Trainer(step, nn.GD(params)).fit([], epochs=1)
    with pytest.raises(ValueError, match="metrics need step_fn to return"):
        nn.Trainer(lambda b: step(b)[0], nn.GD(params), metrics={"a": nn.Accuracy()}).fit(
            _batches(x, y))
    assert math.isnan(nn.MeanLoss().value)
