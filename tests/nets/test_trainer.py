"""The Trainer: logs, hooks, early stopping, saving the best model, stopping on NaN."""
import io
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


def test_early_stopping_on_a_plateau():
    x, y = _problem()
    step, params = _model()
    stopper = nn.EarlyStopping("val_loss", patience=3)
    # lr = 0: the validation loss never improves after epoch 1
    history = nn.Trainer(step, nn.GD(params, lr=0.0), hooks=[stopper]).fit(
        _batches(x, y), epochs=20, val=_batches(x, y))
    assert history["epoch"] == [1, 2, 3, 4]
    assert stopper.best_epoch == 1
    with pytest.raises(KeyError, match="no 'val_accuracy' in the epoch logs"):
        nn.Trainer(step, nn.GD(params), hooks=[nn.EarlyStopping("val_accuracy")]).fit(
            _batches(x, y), val=_batches(x, y))


def test_early_stopping_max_mode_and_message(capsys):
    trainer = nn.Trainer(lambda b: None, nn.GD([nn.NetVar([1.0])]))
    stopper = nn.EarlyStopping("acc", patience=2, mode="max")
    for epoch, acc in enumerate([0.5, 0.7, 0.7, 0.69], start=1):
        trainer.epoch = epoch
        stopper.on_epoch_end(trainer, {"acc": acc})
    assert trainer.stop_reason == ("EarlyStopping: acc has not improved for 2 epochs "
                                   "(best 0.7 at epoch 2)")
    assert "EarlyStopping" in capsys.readouterr().err


def test_save_best_keeps_the_best_epoch(tmp_path):
    x, y = _problem()
    step, params = _model()
    path = str(tmp_path / "best.npz")
    scores = iter([0.3, 0.1, 0.2, 0.05, 0.4])
    snapshots = {}

    class FakeMetric(nn.Hook):
        def on_epoch_end(self, trainer, logs):
            logs["score"] = next(scores)
            snapshots[trainer.epoch] = [p.data.copy() for p in params]

    saver = nn.SaveBest(path, metric="score", mode="min", optimizer=True, restore=True)
    nn.Trainer(step, nn.Adam(params, lr=0.05), hooks=[FakeMetric(), saver]).fit(
        _batches(x, y), epochs=5)
    assert saver.best_epoch == 4
    checkpoint = nn.load(path)
    assert checkpoint.extra == {"epoch": 4, "score": 0.05}
    for p, best in zip(params, snapshots[4]):       # restore=True put them back
        np.testing.assert_array_equal(p.data, best)
    np.testing.assert_array_equal(checkpoint.model["0"].data, snapshots[4][0])


def test_stop_on_nan_names_the_loss_and_leaves_parameters(capsys):
    x, y = _problem()
    step, params = _model()
    x = x.copy()
    x[20] = np.nan                                   # the second batch
    before = [p.data.copy() for p in params]
    trainer = nn.Trainer(step, nn.GD(params, lr=0.0), hooks=[nn.StopOnNaN()])
    history = trainer.fit(_batches(x, y), epochs=3)
    assert trainer.stop_reason == ("StopOnNaN: the loss is nan at epoch 1, batch 2; "
                                   "parameters not updated")
    assert "StopOnNaN" in capsys.readouterr().err
    assert trainer.steps == 1 and "loss" not in history
    for p, data in zip(params, before):
        np.testing.assert_array_equal(p.data, data)
        assert p._g is None


def test_stop_on_nan_names_the_parameter_with_a_bad_gradient():
    w = nn.NetVar(np.array([[0.0, 4.0]]), name="scale")

    def step(batch):
        return nn.Sum(nn.Pow(w, 0.5))                 # d√w/dw is inf at 0, √0 = 0 is finite

    trainer = nn.Trainer(step, nn.GD([nn.NetVar([1.0]), w]), hooks=[nn.StopOnNaN()])
    with np.errstate(divide="ignore"):
        trainer.fit([None], epochs=1)
    assert trainer.stop_reason.startswith("StopOnNaN: the gradient of parameter 1 'scale' of "
                                          "shape (1, 2) is not finite at epoch 1, batch 1")
    np.testing.assert_array_equal(w.data, [[0.0, 4.0]])


def test_lr_schedule_per_epoch_per_step_and_on_plateau():
    x, y = _problem()
    step, params = _model()
    opt = nn.GD(params, lr=1.0)
    history = nn.Trainer(step, opt, hooks=[nn.LRSchedule(nn.StepLR(opt, 1, gamma=0.5))]).fit(
        _batches(x, y), epochs=3)
    assert history["lr"] == [1.0, 0.5, 0.25] and opt.lr == 0.125
    opt = nn.GD(params, lr=1.0)
    nn.Trainer(step, opt, hooks=[nn.LRSchedule(nn.ExponentialLR(opt, 0.5), every="step")]).fit(
        _batches(x, y), epochs=1)
    assert opt.lr == 0.5 ** 4
    opt = nn.GD(params, lr=0.0)
    plateau = nn.ReduceOnPlateau(opt, patience=0)
    opt.lr = plateau.base = 1e-9
    nn.Trainer(step, opt, hooks=[nn.LRSchedule(plateau)]).fit(
        _batches(x, y), epochs=3, val=_batches(x, y))
    assert plateau.monitor.best is not None and plateau.t == 3


def test_progress_bar_prints_one_line_per_epoch():
    pytest.importorskip("tqdm")
    x, y = _problem()
    step, params = _model()
    out = io.StringIO()
    nn.Trainer(step, nn.GD(params), hooks=[nn.ProgressBar(file=out)]).fit(
        _batches(x, y), epochs=2, val=_batches(x, y))
    text = out.getvalue()
    finals = [line.split("\r")[-1] for line in text.strip().split("\n")]
    assert len(finals) == 2
    assert finals[0].startswith("epoch 1/2") and finals[1].startswith("epoch 2/2")
    assert "4/4" in finals[1] and "val_loss=" in finals[1] and "samples/s" in finals[1]


def test_plot_history_saves_a_figure(tmp_path):
    pytest.importorskip("matplotlib")
    x, y = _problem()
    step, params = _model()
    path = tmp_path / "curves.png"
    nn.Trainer(step, nn.GD(params), hooks=[nn.PlotHistory(str(path))],
               metrics={"accuracy": nn.Accuracy()}).fit(_batches(x, y), epochs=2,
                                                        val=_batches(x, y))
    assert path.read_bytes()[:4] == b"\x89PNG"


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
