"""The Trainer: epoch logs, the history, the hook protocol, batches and bad usage."""
import copy
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


def test_a_loss_only_step_over_time_major_minibatches_weighs_each_batch_by_its_sequences():
    # x is (T, B, F): the first item's length is T, the same for every batch, which weighted
    # the batches of 3, 3 and 1 sequences alike
    rng = np.random.default_rng(0)
    seqs, labels = rng.standard_normal((7, 5, 2)), rng.integers(0, 2, 7)
    w = nn.NetVar(rng.standard_normal((2, 2)))

    def step(batch):
        x, lengths, t = batch
        return nn.SoftmaxCELoss(nn.NetVar(x, requires_grad=False).sum(axis=0) @ w, t) * 1.0

    trainer = nn.Trainer(step, nn.GD([w], lr=0.0))
    history = trainer.fit(lambda: nn.minibatches(seqs, labels, batch_size=3, shuffle=False),
                          epochs=1)
    full = nn.SoftmaxCELoss(nn.NetVar(seqs.sum(axis=1)) @ w, labels).item()
    assert history["loss"][0] == pytest.approx(full, rel=1e-12)


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


def _snapshot(params, optimizer):
    """Copies of what a refused call must leave as it was."""
    return ([p.data.copy() for p in params], [None if p.g is None else p.g.copy() for p in params],
            copy.deepcopy(optimizer.state_dict()))


def _assert_unchanged(snapshot, params, optimizer):
    data, grads, state = snapshot
    for p, value, g in zip(params, data, grads):
        np.testing.assert_array_equal(p.data, value)
        if g is None:
            assert p.g is None
        else:
            np.testing.assert_array_equal(p.g, g)
    _assert_same(optimizer.state_dict(), state)


def _assert_same(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        np.testing.assert_array_equal(a, b)


def _trained_adam():
    """A step_fn, its parameters and an Adam optimizer that has state (one epoch trained)."""
    x, y = _problem()
    step, params = _model()
    optimizer = nn.Adam(params, lr=0.05)
    nn.Trainer(step, optimizer).fit(_batches(x, y), epochs=1)
    return x, y, step, params, optimizer


def test_bad_usage_is_explained():
    x, y = _problem()
    step, params = _model()
    trainer = nn.Trainer(lambda batch: step(batch)[0].data, nn.GD(params))
    with pytest.raises(TypeError, match="step_fn must return the loss node"):
        trainer.fit(_batches(x, y))
    with pytest.raises(TypeError, match=r"got NetVar of shape \(16, 2\)"):
        nn.Trainer(lambda batch: step(batch)[1], nn.GD(params)).fit(_batches(x, y))
    with pytest.raises(TypeError, match=r"got tuple of 2 item\(s\): NetVar of shape \(1, 1\), "):
        nn.Trainer(lambda batch: step(batch)[:2], nn.GD(params)).fit(_batches(x, y))
    with pytest.raises(TypeError, match="got float"):
        nn.Trainer(lambda batch: step(batch)[0].item(), nn.GD(params)).fit(_batches(x, y))
    with pytest.raises(TypeError, match="step_fn returned predictions of type list"):
        nn.Trainer(lambda b: (step(b)[0], [0, 1], b[1]), nn.GD(params)).fit(_batches(x, y))
    with pytest.raises(ValueError, match="Trainer.fit: train_batches holds no batches"):
        nn.Trainer(step, nn.GD(params)).fit([], epochs=1)
    with pytest.raises(TypeError, match="train_batches must be a list of batches"):
        nn.Trainer(step, nn.GD(params)).fit(42)
    trainer = nn.Trainer(step, nn.GD(params))
    with pytest.raises(TypeError, match="Trainer.fit: val must be a list of batches, a "
                                        "re-iterable or a function .* got float"):
        trainer.fit(_batches(x, y), val=0.2)            # (a split fraction, as in Keras)
    assert trainer.epoch == 0 and "loss" not in trainer.history
    with pytest.raises(TypeError, match="step_fn must be callable"):
        nn.Trainer(None, nn.GD(params))
    with pytest.raises(TypeError, match=r"Trainer: optimizer is the class Adam; pass an "
                                        r"instance: Adam\(params, ...\)"):
        nn.Trainer(step, nn.Adam)
    with pytest.raises(TypeError, match="Trainer: optimizer must be an nnkit optimizer, got "
                                        "StepLR"):
        nn.Trainer(step, nn.StepLR(nn.GD(params), 1))      # would only change the rate
    assert math.isnan(nn.MeanLoss().value)


@pytest.mark.parametrize("epochs, error", [(0, ValueError), (-2, ValueError), (2.0, TypeError),
                                           (True, TypeError), ("3", TypeError)])
def test_epochs_must_be_a_positive_integer(epochs, error):
    x, y = _problem()
    step, params = _model()
    trainer = nn.Trainer(step, nn.GD(params))
    with pytest.raises(error, match=f"Trainer.fit: epochs must be a positive integer, got .*"
                                    f"{epochs!r}"):
        trainer.fit(_batches(x, y), epochs=epochs)
    assert trainer.epoch == 0 and trainer.steps == 0 and "loss" not in trainer.history
    assert nn.Trainer(step, nn.GD(params)).fit(_batches(x, y), epochs=np.int64(2))["epoch"] == \
        [1, 2]


def test_metrics_without_predictions_are_refused_before_any_update():
    x, y, step, params, optimizer = _trained_adam()
    params[0].g = np.ones((3, 2))                       # a gradient the user accumulated
    before = _snapshot(params, optimizer)
    trainer = nn.Trainer(lambda b: step(b)[0], optimizer, metrics={"accuracy": nn.Accuracy()})
    with pytest.raises(ValueError, match=r"Trainer: the metrics \['accuracy'\] need step_fn to "
                                         r"return \(loss, predictions, targets\)"):
        trainer.fit(_batches(x, y))
    _assert_unchanged(before, params, optimizer)
    assert trainer.epoch == 0 and trainer.steps == 0
    with pytest.raises(ValueError, match="need step_fn to return"):      # evaluate too
        trainer.evaluate(_batches(x, y))


def test_predictions_the_metrics_refuse_change_nothing():
    x, y, step, params, optimizer = _trained_adam()
    before = _snapshot(params, optimizer)

    def wrong_rows(batch):
        loss, z, t = step(batch)
        return loss, z, t[:-1]                            # one label short

    trainer = nn.Trainer(wrong_rows, optimizer, metrics={"accuracy": nn.Accuracy()})
    with pytest.raises(ValueError, match=r"Accuracy: predictions of shape \(16, 2\) do not "
                                         r"match targets of shape \(15,\)"):
        trainer.fit(_batches(x, y))
    _assert_unchanged(before, params, optimizer)


def test_a_failed_epoch_does_not_count():
    x, y = _problem()
    step, params = _model()
    calls = []

    def failing_once(batch):
        if not calls:
            calls.append(batch)
            raise RuntimeError("data loading failed")
        return step(batch)

    trainer = nn.Trainer(failing_once, nn.GD(params))
    with pytest.raises(RuntimeError, match="data loading failed"):
        trainer.fit(_batches(x, y), epochs=2)
    assert trainer.epoch == 0 and trainer.steps == 0
    assert trainer.fit(_batches(x, y), epochs=2)["epoch"] == [1, 2]


class _RaiseOnce(nn.Hook):
    """Raises in on_before_step the first time: after back(), before the update."""

    def __init__(self):
        self.raised = False

    def on_before_step(self, trainer, loss):
        if not self.raised:
            self.raised = True
            raise OSError("disk full")


def test_a_step_starts_from_zero_gradients_even_after_a_failed_fit_or_a_stray_back():
    # A fit that fails between back() and the update leaves that batch's gradient in .g (to
    # inspect); the next step must not add it to its own, nor one left by the user's back().
    x, y = _problem()
    batches = _batches(x, y)[:1]
    step, params = _model()
    nn.Trainer(step, nn.GD(params, lr=0.1)).fit(batches)
    expected = [p.data.copy() for p in params]
    for spoil in ("failed fit", "stray back()"):
        step, params = _model()
        trainer = nn.Trainer(step, nn.GD(params, lr=0.1), hooks=[_RaiseOnce()])
        if spoil == "failed fit":
            with pytest.raises(OSError, match="disk full"):
                trainer.fit(batches)
            assert all(p._g is not None for p in params)        # left for inspection
        else:
            trainer.hooks[-1].raised = True
            step(batches[0])[0].back()
        trainer.fit(batches)
        for p, value in zip(params, expected):
            np.testing.assert_array_equal(p.data, value, err_msg=spoil)


def test_a_one_shot_iterator_for_several_epochs_is_refused_before_training():
    x, y, step, params, optimizer = _trained_adam()
    before = _snapshot(params, optimizer)
    started = []

    class Watcher(nn.Hook):
        def on_fit_start(self, trainer):
            started.append(trainer)

    trainer = nn.Trainer(step, optimizer, hooks=[Watcher()])
    one_shot = [iter(_batches(x, y)), (b for b in _batches(x, y)),
                nn.minibatches([[1, 2], [3]], batch_size=1)]
    for batches in one_shot:
        with pytest.raises(TypeError, match=r"Trainer.fit: train_batches is an iterator \(\w+\), "
                                            r"which is exhausted after one epoch; for 3 epochs "
                                            "pass a list or a function returning a fresh"):
            trainer.fit(batches, epochs=3)
    with pytest.raises(TypeError, match=r"Trainer.fit: val is an iterator"):
        trainer.fit(_batches(x, y), epochs=2, val=iter(_batches(x, y)))
    _assert_unchanged(before, params, optimizer)
    assert trainer.epoch == 0 and not started
    # one epoch over an iterator is fine, and a used iterator gives a clear error, not NaN
    once = iter(_batches(x, y))
    assert trainer.fit(once, epochs=1, val=iter(_batches(x, y)))["epoch"] == [1]
    with pytest.raises(ValueError, match="train_batches gave no batches in epoch 2"):
        trainer.fit(once, epochs=1)
    with pytest.raises(ValueError, match="Trainer.evaluate: the validation batches gave no"):
        trainer.evaluate(once)


class _Duck:                     # a hook that does not derive from Hook
    def __init__(self):
        self.epochs = 0

    def on_epoch_end(self, trainer, logs):
        self.epochs += 1


def test_hooks_are_checked_at_construction():
    step, params = _model()
    optimizer = nn.GD(params)
    with pytest.raises(TypeError, match=r"Trainer: hooks\[0\] is the class EarlyStopping; pass "
                                        r"an instance: EarlyStopping\(...\)"):
        nn.Trainer(step, optimizer, hooks=[nn.EarlyStopping])
    with pytest.raises(TypeError, match=r"Trainer: hooks\[1\] must be a hook .* got int 42"):
        nn.Trainer(step, optimizer, hooks=[nn.StopOnNaN(), 42])
    with pytest.raises(TypeError, match=r"Trainer: hooks\[0\] must be a hook .* got str 'a'"):
        nn.Trainer(step, optimizer, hooks=["a"])
    for single in (nn.StopOnNaN(), nn.History(), _Duck(), "progress"):
        with pytest.raises(TypeError, match="hooks must be a list of hooks, got .*put a single "
                                            "hook in a list"):
            nn.Trainer(step, optimizer, hooks=single)
    stopper = nn.EarlyStopping("loss")
    with pytest.raises(ValueError, match=r"hooks\[2\] is the same EarlyStopping as hooks\[0\]; "
                                         "its callbacks would run twice"):
        nn.Trainer(step, optimizer, hooks=[stopper, nn.StopOnNaN(), stopper])
    duck = _Duck()
    x, y = _problem()
    nn.Trainer(step, optimizer, hooks=[duck]).fit(_batches(x, y), epochs=2)
    assert duck.epochs == 2
    assert len(nn.Trainer(step, optimizer, hooks=None).hooks) == 1      # the History


def test_metrics_are_checked_at_construction():
    step, params = _model()
    optimizer = nn.GD(params)
    with pytest.raises(TypeError, match=r"metrics\['acc'\] is the class Accuracy; pass an "
                                        r"instance: Accuracy\(...\)"):
        nn.Trainer(step, optimizer, metrics={"acc": nn.Accuracy})
    with pytest.raises(TypeError, match=r"metrics\['acc'\] must be a metric .* got int 1"):
        nn.Trainer(step, optimizer, metrics={"acc": 1})
    with pytest.raises(TypeError, match="metrics must be a dict of name: metric.* got list"):
        nn.Trainer(step, optimizer, metrics=[nn.Accuracy()])
    with pytest.raises(TypeError, match="metric names must be strings, got 0"):
        nn.Trainer(step, optimizer, metrics={0: nn.Accuracy()})
    for taken in ("loss", "lr", "epoch", "val_accuracy"):
        # "loss" would silently replace the epoch's mean loss in the logs
        with pytest.raises(ValueError, match=f"metric name '{taken}' would overwrite the epoch "
                                             "logs' own entry"):
            nn.Trainer(step, optimizer, metrics={taken: nn.MSE()})


def test_an_empty_validation_list_is_refused_before_training():
    # it was refused after the first epoch had trained (parameters and lr changed)
    x, y = _problem()
    step, params = _model()
    before = [p.data.copy() for p in params]
    trainer = nn.Trainer(step, nn.GD(params, lr=0.5))
    with pytest.raises(ValueError, match="Trainer.fit: val holds no batches"):
        trainer.fit(_batches(x, y), epochs=2, val=[])
    assert trainer.epoch == 0 and trainer.steps == 0
    for p, data in zip(params, before):
        np.testing.assert_array_equal(p.data, data)


def test_dict_and_slice_batches_weigh_by_their_rows():
    # a dict batch weighed its number of keys, a slice batch 1
    x, y = _problem(rows=25)
    step, params = _model()
    full = step((x, y))[0].item()

    def by_dict(batch):                  # (· 1.0: a loss node that states no denominator)
        return step((batch["x"], batch["y"]))[0] * 1.0

    def by_slice(rows):
        return step((x[rows], y[rows]))[0] * 1.0

    dicts = [{"x": x[i:i + 10], "y": y[i:i + 10]} for i in range(0, 25, 10)]
    slices = [slice(i, min(i + 10, 25)) for i in range(0, 25, 10)]
    for step_fn, batches in ((by_dict, dicts), (by_slice, slices)):
        history = nn.Trainer(step_fn, nn.GD(params, lr=0.0)).fit(batches, val=batches)
        assert history["samples"] == [25]
        assert history["loss"][0] == pytest.approx(full, rel=1e-12)
        assert history["val_loss"][0] == pytest.approx(full, rel=1e-12)


def test_history_aligns_entries_that_only_some_epochs_log():
    # val_loss of epochs 4 and 5 was stored at places 0 and 1, read as epochs 1 and 2
    x, y = _problem()
    step, params = _model()
    trainer = nn.Trainer(step, nn.GD(params, lr=0.1))
    trainer.fit(_batches(x, y), epochs=3)
    history = trainer.fit(_batches(x, y), epochs=2, val=_batches(x, y))
    assert history["epoch"] == [1, 2, 3, 4, 5]
    assert history["val_loss"][:3] == [None] * 3 and None not in history["val_loss"][3:]
    trainer.fit(_batches(x, y), epochs=1)
    assert history["val_loss"][5] is None and len(history["loss"]) == 6


def test_early_stopping_counts_afresh_in_each_fit():
    # the second fit stopped after one epoch, on the first fit's count
    x, y = _problem()
    step, params = _model()
    stopper = nn.EarlyStopping("loss", patience=3)
    trainer = nn.Trainer(step, nn.GD(params, lr=0.0), hooks=[stopper])
    trainer.fit(_batches(x, y), epochs=10)
    assert trainer.epoch == 4                     # best at 1, then three epochs without gain
    trainer.fit(_batches(x, y), epochs=10)
    assert trainer.epoch == 8 and stopper.best_epoch == 5


def test_padded_sequence_batches_weigh_their_valid_steps_even_with_predictions():
    # with (loss, logits, targets) and no mask a batch weighed T·B positions, padding included
    rng = np.random.default_rng(0)
    seqs = [rng.standard_normal((n, 2)) for n in (5, 1, 3, 2, 4, 2, 5)]
    targets = [rng.integers(0, 3, len(s)) for s in seqs]
    w = nn.NetVar(rng.standard_normal((2, 3)))

    def step(batch):
        x, lengths, t = batch
        logits = nn.NetVar(x, requires_grad=False) @ w
        return nn.SoftmaxCELoss(logits, t, lengths=lengths) * 1.0, logits, t   # no denominator

    trainer = nn.Trainer(step, nn.GD([w], lr=0.0))
    history = trainer.fit(lambda: nn.minibatches(seqs, targets, batch_size=3, shuffle=False))
    x, lengths = nn.pad_sequences(seqs)
    t, _ = nn.pad_sequences(targets)
    full = nn.SoftmaxCELoss(nn.NetVar(x) @ w, t, lengths=lengths).item()
    assert history["loss"][0] == pytest.approx(full, rel=1e-12)
    assert history["samples"] == [sum(len(s) for s in seqs)]


def test_a_fit_refused_by_a_hook_at_its_start_changes_no_hook_and_not_the_trainer(tmp_path):
    # EarlyStopping had already forgotten its best, and the trainer its val and epochs, when
    # SaveBest refused a fit without validation data
    x, y = _problem()
    step, params = _model()
    stopper = nn.EarlyStopping("loss", patience=5)
    saver = nn.SaveBest(str(tmp_path / "best.npz"), "val_loss")
    trainer = nn.Trainer(step, nn.GD(params, lr=0.1), hooks=[stopper, saver])
    trainer.fit(_batches(x, y), epochs=2, val=_batches(x, y))
    best, epoch, val, epochs = stopper.best, stopper.best_epoch, trainer.val, trainer.epochs
    with pytest.raises(ValueError, match="SaveBest: monitors 'val_loss', but fit"):
        trainer.fit(_batches(x, y), epochs=2)
    assert (stopper.best, stopper.best_epoch) == (best, epoch) and best is not None
    assert trainer.val is val and trainer.epochs == epochs


def test_a_batch_refused_by_one_metric_is_counted_by_none():
    # Accuracy had counted the batch that MSE then refused
    x, y = _problem()
    step, params = _model()
    metrics = {"accuracy": nn.Accuracy(), "mse": nn.MSE()}
    trainer = nn.Trainer(step, nn.GD(params, lr=0.1), metrics=metrics)
    with pytest.raises(ValueError):
        trainer.fit(_batches(x, y))
    assert all(metric.count == 0 for metric in metrics.values())


class _Hits:
    """A user's metric (update, reset, value) keeping its own state: no total, no count."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.hits, self.seen, self.per_class = 0, [], {"right": np.zeros(2)}
        self.inner, self.weights = nn.Accuracy(), np.ones(2)
        self.weights.flags.writeable = False

    def update(self, predictions, targets):
        right = np.asarray(predictions).argmax(axis=-1) == np.asarray(targets)
        self.hits += int(right.sum())
        self.seen.append(len(right))
        self.per_class["right"] += np.bincount(np.asarray(targets)[right], minlength=2)
        self.inner.update(predictions, targets)

    @property
    def value(self):
        return self.hits / sum(self.seen)


class _Slotted:
    __slots__ = ("total", "count")

    def __init__(self):
        self.reset()

    def reset(self):
        self.total = self.count = 0.0

    def update(self, predictions, targets):
        self.total += float((np.asarray(predictions).argmax(axis=-1) == targets).sum())
        self.count += len(targets)

    @property
    def value(self):
        return self.total / self.count


def test_a_users_metric_of_its_own_state_is_counted_and_put_back_when_another_refuses():
    # the Trainer read metric.total and metric.count, which a user's metric need not have:
    # AttributeError at the first batch
    x, y = _problem()
    step, params = _model()
    mine = _Hits()
    trainer = nn.Trainer(step, nn.GD(params, lr=0.0), metrics={"hits": mine})
    history = trainer.fit(_batches(x, y))
    predictions = (x @ params[0].data + params[1].data).argmax(axis=1)
    assert history["hits"] == [np.mean(predictions == y)]
    mine.reset()
    slotted = _Slotted()
    refusing = {"hits": mine, "slotted": slotted, "mse": nn.MSE()}   # MSE refuses the labels
    trainer = nn.Trainer(step, nn.GD(params, lr=0.0), metrics=refusing)
    with pytest.raises(ValueError, match="MSE: predictions of shape"):
        trainer.fit(_batches(x, y))
    assert (mine.hits, mine.seen, mine.inner.count) == (0, [], 0)
    assert (mine.per_class["right"] == 0).all() and (slotted.total, slotted.count) == (0, 0)


def test_a_metric_that_cannot_be_copied_is_refused_when_the_trainer_is_built():
    import threading
    step, params = _model()
    locked = _Hits()
    locked.lock = threading.Lock()
    with pytest.raises(TypeError, match=r"metrics\['hits'\] cannot be copied \(TypeError"):
        nn.Trainer(step, nn.GD(params, lr=0.0), metrics={"hits": locked})


def test_a_class_weighted_or_ignoring_loss_weighs_its_batch_by_what_it_divided_by():
    # batches were weighed by their rows while the loss divided by Σ w (class weights) or by
    # the targets it did not ignore: the epoch loss differed from the full-data value
    x, y = _problem(rows=30)
    step, params = _model()
    y = y.copy()
    y[:12] = -1                                  # the first batch mostly ignored
    weight = np.array([0.2, 3.0])

    def weighted(batch):
        xb, yb = batch
        z = nn.NetVar(xb, requires_grad=False) @ params[0] + params[1]
        return nn.SoftmaxCELoss(z, yb, weight=weight, ignore_index=-1)

    history = nn.Trainer(weighted, nn.GD(params, lr=0.0)).fit(_batches(x, y, 16))
    assert history["loss"][0] == pytest.approx(weighted((x, y)).item(), rel=1e-12)


def test_a_loss_plus_a_penalty_weighs_its_batch_by_what_the_loss_divided_by():
    # the sum is no Loss: batches were weighed by their rows, ignored ones too (and under
    # DataParallel so were the ranks' gradients: other parameters than one process's)
    x, y = _problem(rows=30)
    step, params = _model()
    y = y.copy()
    y[:12] = -1

    def penalized(batch):
        xb, yb = batch
        z = nn.NetVar(xb, requires_grad=False) @ params[0] + params[1]
        return nn.SoftmaxCELoss(z, yb, ignore_index=-1) + 1e-3 * nn.Sum(params[0] * params[0])

    history = nn.Trainer(penalized, nn.GD(params, lr=0.0)).fit(_batches(x, y, 16))
    assert history["loss"][0] == pytest.approx(penalized((x, y)).item(), rel=1e-12)
    z = nn.NetVar(x[:4], requires_grad=False) @ params[0]
    two = nn.SoftmaxCELoss(z, y[:4], ignore_index=-1) + nn.SoftmaxCELoss(z, np.maximum(y[:4], 0))
    from nnkit.training.trainer import _denominator
    with pytest.raises(ValueError, match=r"DataParallel: the loss adds nnkit losses that divide "
                                         r"by different totals \(0, 4\)"):
        _denominator(two, parallel=True)
    assert _denominator(two) is None          # one process: weighed by its rows


def test_a_masked_mse_weighs_each_batch_by_its_valid_elements():
    # MSELoss states its N (the valid elements) as its denominator: the epoch's value is the
    # masked mean over all the data (each batch weighed by all its T·B positions gave 5.0)
    V = nn.NetVar(np.ones((1, 1)))
    batches = [(np.ones((4, 1, 1)), np.zeros((4, 1, 1)), np.array([[1], [1], [1], [1]])),
               (np.ones((4, 1, 1)), np.full((4, 1, 1), -2.0), np.array([[1], [0], [0], [0]]))]

    def step(batch):
        x, t, m = batch
        p = nn.NetVar(x, requires_grad=False) @ V
        return nn.MSELoss(p, t, mask=m), p, t

    trainer = nn.Trainer(step, nn.GD([V], lr=0.0, momentum=0.0))
    assert trainer.evaluate(batches)["loss"] == pytest.approx((4 * 1 + 1 * 9) / 5)


def test_an_unmasked_mse_weighs_each_batch_by_its_elements():
    # MSELoss's denominator is then a Python int, which the Trainer could not read
    V = nn.NetVar(np.ones((1, 1)))
    batches = [(np.ones((3, 1)), np.zeros((3, 1))), (np.ones((1, 1)), np.full((1, 1), -2.0))]

    def step(batch):
        x, t = batch
        return nn.MSELoss(nn.NetVar(x, requires_grad=False) @ V, t)

    trainer = nn.Trainer(step, nn.GD([V], lr=0.0, momentum=0.0))
    assert trainer.evaluate(batches)["loss"] == pytest.approx((3 * 1 + 1 * 9) / 4)
    trainer.fit(batches, epochs=1)
    assert trainer.history["loss"] == [pytest.approx(3.0)]


def test_an_mse_batch_counts_its_rows_as_samples():
    # the loss's element count (rows times outputs) was taken as the batch's samples
    model = nn.layers.Linear(3, 2, seed=0)
    X, Y = np.ones((32, 3), np.float32), np.zeros((32, 2), np.float32)
    trainer = nn.Trainer(lambda batch: nn.MSELoss(model(batch[0]), batch[1]),
                         nn.GD(model.vars, lr=0.0, momentum=0.0))
    trainer.fit([(X, Y)], epochs=1)
    assert trainer.history["samples"] == [32.0]


def test_slice_batches_past_the_data_are_weighed_by_the_rows_the_loss_saw():
    # slice(20, 30) of 25 rows counted 10 rows, slice(20, None) 1: the epoch value was off;
    # a loss's own prediction tells its rows
    rng = np.random.default_rng(0)
    X, Y = rng.standard_normal((25, 3)), rng.standard_normal((25, 1))
    V = nn.NetVar(np.ones((3, 1)))

    def step(rows):
        return nn.MSELoss(nn.NetVar(X[rows], requires_grad=False) @ V, Y[rows])

    whole = nn.MSELoss(nn.NetVar(X, requires_grad=False) @ V, Y).item()
    for batches in ([slice(i, i + 10) for i in range(0, 25, 10)],
                    [slice(0, 10), slice(10, 20), slice(20, None)]):
        trainer = nn.Trainer(step, nn.GD([V], lr=0.0, momentum=0.0))
        assert trainer.evaluate(batches)["loss"] == pytest.approx(whole)
        trainer.fit(batches, epochs=1)
        assert trainer.history["samples"] == [25]


def test_samples_count_rows_whatever_the_loss_weighs_and_any_op_may_be_the_loss():
    # class weights of 0.1 made 40 rows count as 4 samples; CosineSimilarity's own
    # `denominator` array was read as the batch weight (fit failed inside NumPy)
    rng = np.random.default_rng(0)
    X, labels = rng.standard_normal((40, 3)), rng.integers(0, 2, 40)
    model = nn.layers.Linear(3, 2, seed=0)

    def weighted(batch):
        z = model(batch[0])
        return nn.SoftmaxCELoss(z, batch[1], weight=np.array([0.1, 0.1])), z, batch[1]

    trainer = nn.Trainer(weighted, nn.GD(model.vars, lr=0.0, momentum=0.0))
    trainer.fit([(X, labels)], epochs=1)
    assert trainer.history["samples"] == [40]

    def cosine_loss(batch):
        return 1 - nn.CosineSimilarity(model(batch[0]), model(batch[0] + 1)).reshape(1, -1)[:, :1]

    cosine = nn.Trainer(cosine_loss, nn.GD(model.vars, lr=0.1))
    expected = cosine_loss((X[:1],)).item()
    cosine.fit([(X[:1], labels[:1])], epochs=1)
    assert cosine.history["loss"] == [pytest.approx(expected)] and expected > 0


# ----------------------------------------------------------------------------- old spellings

@pytest.mark.parametrize("module, name", [("trainer", "Trainer"), ("hooks", "SaveBest"),
                                          ("metrics", "Accuracy")])
def test_the_old_nets_modules_still_work_and_name_nnkit_training(module, name):
    import importlib

    import nnkit.training
    new = getattr(importlib.import_module(f"nnkit.training.{module}"), name)
    assert getattr(nn, name) is new and getattr(nnkit.training, name) is new
    old = importlib.import_module(f"nnkit.nets.{module}")
    with pytest.warns(DeprecationWarning, match=rf"nnkit.nets.{module} is deprecated: it moved "
                                                rf"to nnkit.training.{module}"):
        assert getattr(old, name) is new
    with pytest.warns(DeprecationWarning, match=rf"nnkit.nets.{name} is deprecated: it moved to "
                                                rf"nnkit.training.{name} \(nnkit.{name}\)"):
        assert getattr(nn.nets, name) is new
    with pytest.warns(DeprecationWarning, match=rf"nnkit.nets.{module} is deprecated"):
        exec(f"from nnkit.nets.{module} import {name} as imported", {})
    assert name not in nn.nets.__all__
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        nn.nets.Nothing
