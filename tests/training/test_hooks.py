"""The ready-made hooks: early stopping, saving the best model, stopping on NaN, learning-rate
schedules, the progress bar and the loss plot."""
import io
import struct

import numpy as np
import pytest

import nnkit as nn
from tests.training.test_trainer import (_assert_unchanged, _batches, _model, _problem,
                                     _snapshot, _trained_adam)


def test_early_stopping_on_a_plateau():
    x, y = _problem()
    step, params = _model()
    stopper = nn.EarlyStopping("val_loss", patience=3)
    # lr = 0: the validation loss never improves after epoch 1
    history = nn.Trainer(step, nn.GD(params, lr=0.0), hooks=[stopper]).fit(
        _batches(x, y), epochs=20, val=_batches(x, y))
    assert history["epoch"] == [1, 2, 3, 4]
    assert stopper.best_epoch == 1
    with pytest.raises(ValueError, match=r"EarlyStopping: no 'val_accuracy' in the epoch logs; "
                                         r"available: \['epoch', 'loss', "):
        nn.Trainer(step, nn.GD(params), hooks=[nn.EarlyStopping("val_accuracy")]).fit(
            _batches(x, y), val=_batches(x, y))


def test_a_val_metric_without_validation_data_is_refused_before_training():
    x, y, step, params, optimizer = _trained_adam()
    before = _snapshot(params, optimizer)
    plateau = nn.ReduceOnPlateau(optimizer, patience=0)
    for hook, owner in [(nn.EarlyStopping(), "EarlyStopping"),          # monitors val_loss
                        (nn.SaveBest("best.npz", "val_accuracy"), "SaveBest"),
                        (nn.LRSchedule(plateau, metric="val_loss"), "LRSchedule")]:
        trainer = nn.Trainer(step, optimizer, hooks=[hook])
        with pytest.raises(ValueError, match=f"{owner}: monitors 'val_.*', but fit\\(\\) has no "
                                             "validation data"):
            trainer.fit(_batches(x, y), epochs=3)
        assert trainer.epoch == 0 and "loss" not in trainer.history
    _assert_unchanged(before, params, optimizer)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"patience": 0}, ValueError, "patience must be a positive integer, got 0"),
    ({"patience": -3}, ValueError, "patience must be a positive integer, got -3"),
    ({"patience": 2.5}, TypeError, "patience must be a positive integer, got float 2.5"),
    ({"patience": True}, TypeError, "patience must be a positive integer, got bool True"),
    ({"metric": 5}, TypeError, "metric must be the name of an epoch log entry .* got int 5"),
    ({"min_delta": "0.1"}, TypeError, "min_delta must be a number, got str '0.1'"),
    ({"min_delta": -0.1}, ValueError, "min_delta must be >= 0"),
    ({"mode": "maximum"}, ValueError, "mode must be 'min' or 'max'")])
def test_early_stopping_arguments(kwargs, error, message):
    with pytest.raises(error, match=f"EarlyStopping: {message}"):
        nn.EarlyStopping(**kwargs)


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


def test_save_best_checks_its_path_before_training(tmp_path, monkeypatch):
    x, y, step, params, optimizer = _trained_adam()
    before = _snapshot(params, optimizer)
    (tmp_path / "file").write_text("")
    for path, error, message in [
            (tmp_path / "missing" / "best.npz", ValueError, "the folder '.*missing' of path"),
            (tmp_path / "file" / "best.npz", ValueError, "the folder '.*file' of path"),
            (tmp_path, ValueError, "is a folder; give a file name")]:
        trainer = nn.Trainer(step, optimizer, hooks=[nn.SaveBest(path, "loss")])
        with pytest.raises(error, match=f"SaveBest: .*{message}"):
            trainer.fit(_batches(x, y), epochs=2)
        assert trainer.epoch == 0
    monkeypatch.setattr("os.access", lambda path, mode: False)    # (root may write anywhere)
    with pytest.raises(PermissionError, match="SaveBest: the folder .* is not writable"):
        nn.Trainer(step, optimizer, hooks=[nn.SaveBest(tmp_path / "b.npz", "loss")]).fit(
            _batches(x, y))
    _assert_unchanged(before, params, optimizer)
    assert list(tmp_path.iterdir()) == [tmp_path / "file"]


def test_save_best_a_failed_save_keeps_the_checkpoint_and_the_best(tmp_path, monkeypatch):
    import nnkit.io
    x, y = _problem()
    step, params = _model()
    path = tmp_path / "best.npz"
    saver = nn.SaveBest(path, "loss")
    trainer = nn.Trainer(step, nn.Adam(params, lr=0.05), hooks=[saver])
    trainer.fit(_batches(x, y), epochs=1)
    saved, best = path.read_bytes(), saver.monitor.best

    def full_disk(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(nnkit.io, "save", full_disk)
    with pytest.raises(OSError, match="No space left"):
        trainer.fit(_batches(x, y), epochs=1)       # the loss improves: SaveBest saves
    assert saver.monitor.best == best and saver.monitor.bad == 0 and saver.best_epoch == 1
    assert path.read_bytes() == saved
    assert [p.name for p in tmp_path.iterdir()] == ["best.npz"]


@pytest.mark.parametrize("kwargs, error, message", [
    ({"path": None}, TypeError, "path must be a str or a path, got NoneType None"),
    ({"metric": ("val_loss",)}, TypeError, "metric must be the name of an epoch log entry"),
    ({"optimizer": "adam"}, TypeError, "optimizer must be True or False, got str 'adam'"),
    ({"restore": 1}, TypeError, "restore must be True or False, got int 1"),
    ({"mode": "best"}, ValueError, "mode must be 'min' or 'max'")])
def test_save_best_arguments(kwargs, error, message):
    with pytest.raises(error, match=f"SaveBest: {message}"):
        nn.SaveBest(**{"path": "best.npz", **kwargs})


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
    # stopped before the epoch's first update: it does not count (epoch 0, then 1 again)
    assert trainer.epoch == 0 and trainer.steps == 0


def test_lr_schedule_per_epoch_per_step_and_on_plateau():
    x, y = _problem()
    step, params = _model()
    opt = nn.GD(params, lr=1.0)
    history = nn.Trainer(step, opt, hooks=[nn.LRSchedule(nn.StepLR(opt, 1, gamma=0.5))]).fit(
        _batches(x, y), epochs=3)
    assert history["lr"] == [1.0, 0.5, 0.25] and opt.lr == 0.125
    opt = nn.GD(params, lr=1.0)
    history = nn.Trainer(step, opt, hooks=[nn.LRSchedule(nn.ExponentialLR(opt, 0.5),
                                                         every="step")]).fit(_batches(x, y))
    assert opt.lr == 0.5 ** 4
    assert history["lr"] == [0.5 ** 3]          # the rate the epoch's last update used
    opt = nn.GD(params, lr=0.0)
    plateau = nn.ReduceOnPlateau(opt, patience=0)
    opt.lr = plateau.base = 1e-9
    history = nn.Trainer(step, opt, hooks=[nn.LRSchedule(plateau)]).fit(
        _batches(x, y), epochs=3, val=_batches(x, y))
    assert plateau.monitor.best is not None and plateau.t == 3
    assert plateau.monitor.best == min(history["val_loss"])     # fed val_loss, not loss
    opt = nn.GD(params, lr=1.0)
    plateau = nn.ReduceOnPlateau(opt, patience=0, min_delta=1.0)   # only epoch 1 improves
    history = nn.Trainer(step, opt, hooks=[nn.LRSchedule(plateau)]).fit(
        _batches(x, y), epochs=3, val=_batches(x, y))
    assert history["lr"] == pytest.approx([1.0, 1.0, 0.1]) and opt.lr == pytest.approx(0.01)


def test_lr_schedule_refuses_what_is_not_a_schedule_of_the_trainers_optimizer():
    x, y, step, params, optimizer = _trained_adam()
    with pytest.raises(TypeError, match=r"LRSchedule: schedule is the class StepLR; pass an "
                                        r"instance: StepLR\(optimizer, ...\)"):
        nn.LRSchedule(nn.StepLR)
    # an optimizer has step() too: driven as a schedule it would update once more per epoch
    with pytest.raises(TypeError, match="LRSchedule: schedule must be a learning-rate "
                                        "schedule, got the optimizer Adam; wrap it"):
        nn.LRSchedule(optimizer)
    with pytest.raises(TypeError, match="schedule must be a learning-rate schedule .* got "
                                        "float 0.1"):
        nn.LRSchedule(0.1)
    with pytest.raises(ValueError, match="LRSchedule: metric is read by ReduceOnPlateau only, "
                                         "not by StepLR"):
        nn.LRSchedule(nn.StepLR(optimizer, 1), metric="val_loss")
    with pytest.raises(ValueError, match="LRSchedule: every must be 'epoch' or 'step'"):
        nn.LRSchedule(nn.StepLR(optimizer, 1), every="batch")
    before = _snapshot(params, optimizer)
    other = nn.GD(params, lr=1.0)
    trainer = nn.Trainer(step, optimizer, hooks=[nn.LRSchedule(nn.StepLR(other, 1))])
    with pytest.raises(ValueError, match=r"LRSchedule: the schedule drives another optimizer "
                                         r"\(GD\) than the trainer's \(Adam\)"):
        trainer.fit(_batches(x, y), epochs=2)
    _assert_unchanged(before, params, optimizer)

    class Halve:                 # any object with step() is a schedule
        def step(self):
            optimizer.lr /= 2

    nn.Trainer(step, optimizer, hooks=[nn.LRSchedule(Halve())]).fit(_batches(x, y), epochs=2)
    assert optimizer.lr == pytest.approx(0.05 / 4)


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
    width, height = struct.unpack(">II", path.read_bytes()[16:24])
    assert (width, height) == (1000, 400)       # two panels: the losses, then the accuracies


def test_plot_history_arguments():
    pytest.importorskip("matplotlib")
    with pytest.raises(ValueError, match="PlotHistory: every_epoch=True redraws a file; give a "
                                         "path"):
        nn.PlotHistory(every_epoch=True)
    with pytest.raises(TypeError, match="PlotHistory: every_epoch must be True or False"):
        nn.PlotHistory("curves.png", every_epoch="yes")
    with pytest.raises(TypeError, match="PlotHistory: path must be None, a str or a path"):
        nn.PlotHistory(3)


def test_save_best_of_the_optimizers_parameters_refuses_a_frozen_one_before_training(tmp_path):
    # a parameter frozen after the optimizer was built cannot go into a checkpoint of the
    # optimizer's parameters: the save refused it at the first epoch's end, after an update
    x, y, step, params, optimizer = _trained_adam()
    before = _snapshot(params, optimizer)
    params[0].requires_grad = False
    trainer = nn.Trainer(step, optimizer, hooks=[nn.SaveBest(tmp_path / "best.npz", "loss")])
    with pytest.raises(ValueError, match=r"SaveBest: the optimizer's parameter 0 .* does not "
                                         "require a gradient.*model="):
        trainer.fit(_batches(x, y), epochs=2)
    params[0].requires_grad = True
    _assert_unchanged(before, params, optimizer)
    assert trainer.epoch == 0 and list(tmp_path.iterdir()) == []


def test_stop_on_nan_lets_a_batch_that_counts_for_nothing_through():
    # every target ignored: the loss is 0/0 = NaN with a zero gradient (as in PyTorch), and
    # the batch weighs 0; under DataParallel one rank's shard like it stopped every rank
    x = np.random.default_rng(0).standard_normal((4, 3))
    model = nn.layers.Linear(3, 3, seed=0)

    def step(batch):
        z = model(batch[0])
        return nn.SoftmaxCELoss(z, batch[1], ignore_index=-1)

    trainer = nn.Trainer(step, nn.GD(model.vars, lr=0.1), hooks=[nn.StopOnNaN()])
    trainer.fit([(x, np.array([0, 1, 2, 0])), (x, np.array([-1, -1, -1, -1]))], epochs=2)
    assert trainer.stop_reason is None and trainer.epoch == 2
    nan = nn.Trainer(lambda batch: nn.SoftmaxCELoss(model(batch[0]) * np.nan, batch[1]),
                     nn.GD(model.vars, lr=0.1), hooks=[nn.StopOnNaN()])
    nan.fit([(x, np.array([0, 1, 2, 0]))], epochs=1)
    assert "the loss is nan" in nan.stop_reason
