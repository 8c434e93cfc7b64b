"""Never stale: each change that would make a replay wrong records again, runs eagerly or is read
live, and the captured step gives eager's bits (issue 32, item 2, case by case).

Each test runs the same scenario twice from the same seed, eagerly and captured, and compares
every loss and every parameter; it also checks that the captured run did replay (otherwise it
would pass by never replaying). The guard that handles each case is named in the test.
"""
import warnings

import numpy as np
import pytest

import nnkit as nn

SCALE = 1.0                     # a global number the step reads
OFFSET = np.zeros((1, 3), np.float32)       # a global array the step reads


def data(n, seed=1):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((5, 8)), rng.integers(0, 3, 5)) for _ in range(n)]


def captured_matches(step, eager, batches):
    """``step`` captured over ``batches`` (warnings ignored) gives the losses ``eager``."""
    captured = nn.capture(step)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        replayed = [np.array(captured(x, y).data) for x, y in batches]
    assert all(np.array_equal(a, b) for a, b in zip(eager, replayed))
    return captured


def finish(loss, optimizer):
    """The end of every step here: back() and the optimizer's step; the loss node returned."""
    loss.back()
    optimizer.step()
    return loss


def build(dropout=0.0, extra=None):
    nn.seed(0)
    model = nn.Module()
    model.l1 = nn.layers.Linear(8, 16)
    model.drop = nn.layers.Dropout(dropout)
    model.l2 = nn.layers.Linear(16, 3)
    optimizer = nn.GD(model.vars, lr=0.1, momentum=0.9)
    settings = {"k": 2.0}

    def step(x, y):
        h = model.drop(nn.Tanh(model.l1(x))) * settings["k"]
        z = model.l2(h) * SCALE + OFFSET
        if getattr(model, "extra", None) is not None:
            z = model.extra(z)
        loss = nn.SoftmaxCELoss(z, y)
        return finish(loss, optimizer)

    return model, optimizer, step, settings


def run(captured, between=lambda i, model, optimizer, settings: None, n=12, dropout=0.0,
        around=None):
    global SCALE, OFFSET
    SCALE, OFFSET = 1.0, np.zeros((1, 3), np.float32)
    model, optimizer, step, settings = build(dropout)
    if captured:
        step = nn.capture(step)
    losses = []
    for i, (x, y) in enumerate(data(n)):
        between(i, model, optimizer, settings)
        with around(i) if around else _nothing():
            losses.append(np.array(step(x, y).data))
    return losses, [p.data.copy() for p in model.vars], step


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def same_as_eager(min_replays=1, **scenario):
    eager_losses, eager_params, _ = run(False, **scenario)
    losses, params, step = run(True, **scenario)
    for i, (a, b) in enumerate(zip(eager_losses, losses)):
        assert np.array_equal(a, b), f"the loss of call {i} differs: {a} vs {b} ({step})"
    for a, b in zip(eager_params, params):
        assert np.array_equal(a, b)
    assert step.replays >= min_replays, step
    return step


def test_a_learning_rate_changed_by_hand_is_read_live():
    # guard: the optimizer's step() runs live at each replay (it is not recorded)
    def between(i, model, optimizer, settings):
        optimizer.lr = 0.1 / (1 + i)
    step = same_as_eager(between=between, min_replays=10)
    assert step.records == 1


def test_a_schedule_changes_the_learning_rate_and_the_replay_follows():
    schedules = {}

    def between(i, model, optimizer, settings):
        schedule = schedules.setdefault(id(optimizer), nn.StepLR(optimizer, 2, gamma=0.5))
        if i:
            schedule.step()
    same_as_eager(between=between, min_replays=10)


def test_a_global_number_the_step_reads_records_again_when_it_changes():
    # guard: the names the step's code reads (world.py, "global SCALE")
    def between(i, model, optimizer, settings):
        global SCALE
        SCALE = 1.0 + i // 4
    step = same_as_eager(between=between, min_replays=6)
    assert step.records == 3


def test_a_global_array_edited_in_place_records_again():
    def between(i, model, optimizer, settings):
        if i == 5:
            OFFSET[0, 1] = 0.5
    step = same_as_eager(between=between, min_replays=8)
    assert step.records == 2


def test_a_number_in_a_dict_the_closure_reads_records_again():
    def between(i, model, optimizer, settings):
        settings["k"] = 2.0 + i // 3
    same_as_eager(between=between, min_replays=6)


def test_a_parameter_given_new_data_records_again():
    # guard: each leaf's data is the array the recording read (Schedule.stale)
    def between(i, model, optimizer, settings):
        if i == 5:
            model.l1.W.data = model.l1.W.data * 0.5
    step = same_as_eager(between=between, min_replays=8)
    assert step.records == 2


def test_a_parameter_edited_in_place_is_read_live():
    def between(i, model, optimizer, settings):
        if i == 5:
            model.l1.W.data[...] *= 0.5
    step = same_as_eager(between=between, min_replays=10)
    assert step.records == 1


def test_a_layer_added_to_the_model_records_again():
    # guard: each Module's attributes (world.snapshot)
    def between(i, model, optimizer, settings):
        if i == 6:
            model.extra = nn.layers.Linear(3, 3)
    step = same_as_eager(between=between, min_replays=8)
    # the new layer is not the optimizer's, so its gradient stays and the next back() adds
    # into it: one more recording once it has one (guard: each leaf's gradient at entry)
    assert step.records == 3


def test_a_layer_option_changed_records_again():
    def between(i, model, optimizer, settings):
        if i == 6:
            model.drop.p = 0.25
    step = same_as_eager(between=between, min_replays=8, dropout=0.5)
    assert step.records == 2


def test_dropout_draws_fresh_masks_from_nnkits_generator_at_every_replay():
    step = same_as_eager(dropout=0.5, min_replays=10)
    assert step.records == 1


def test_eval_mode_is_part_of_the_signature():
    def around(i):
        return nn.eval_mode() if i % 3 == 1 else _nothing()
    step = same_as_eager(dropout=0.5, around=around, min_replays=8)
    assert len(step.schedules) == 2


def test_no_grad_is_part_of_the_signature():
    model, optimizer, _, _ = build()

    def predict(x):
        return nn.Softmax(model.l2(nn.Tanh(model.l1(x))))
    captured = nn.capture(predict)
    x = data(1)[0][0]
    with nn.no_grad():
        a = captured(x)
    b = captured(x)                     # grad mode on: another signature, with a graph
    assert len(captured.schedules) == 2
    assert np.array_equal(a.data, predict(x).data) and np.array_equal(b.data, a.data)


def test_a_branch_on_a_computed_value_records_again_when_it_goes_the_other_way():
    # guard: a value read into Python (bool of an array) is read again by the replay
    model, optimizer, _, _ = build()
    flips = []

    def step(x, y):
        z = model.l2(nn.Tanh(model.l1(x)))
        if z.data.sum() > 0:
            z = z * 2.0
        loss = nn.SoftmaxCELoss(z, y)
        return finish(loss, optimizer)
    nn.seed(0)
    eager = [np.array(step(x, y).data) for x, y in data(16)]
    model, optimizer, _, _ = build()
    captured = nn.capture(step)
    replayed = [np.array(captured(x, y).data) for x, y in data(16)]
    assert all(np.array_equal(a, b) for a, b in zip(eager, replayed))
    assert captured.records >= 2 and captured.replays >= 1, captured
    del flips


def test_item_inside_the_step_records_again_rather_than_replaying_a_stale_number():
    model, optimizer, _, _ = build()
    log = []

    def step(x, y):
        loss = nn.SoftmaxCELoss(model.l2(nn.Tanh(model.l1(x))), y)
        loss.back()
        optimizer.step()
        log.append(loss.item())         # a Python side effect: only eager runs it
        return loss
    eager = [np.array(step(x, y).data) for x, y in data(8)]
    eager_log, log[:] = list(log), []
    model, optimizer, _, _ = build()
    captured_matches(step, eager, data(8))
    assert log == eager_log             # every call appended: none was replayed stale


def test_float_of_a_loss_without_side_effects_is_a_guard():
    model, optimizer, _, _ = build()

    def step(x, y):
        loss = nn.SoftmaxCELoss(model.l2(nn.Tanh(model.l1(x))), y)
        scale = 0.5 if float(loss.data[0, 0]) > 1.0 else 1.0     # steers the step
        (loss * scale).back()
        optimizer.step()
        return loss
    nn.seed(0)
    eager = [np.array(step(x, y).data) for x, y in data(10)]
    model, optimizer, _, _ = build()
    captured = captured_matches(step, eager, data(10))
    # a number read into Python must be the same for a replay to stand: the loss changes at
    # every call, so every call records (and a warning says replays gain nothing)
    assert captured.records == 10 and captured.replays == 0, captured


def test_an_output_kept_by_the_caller_is_not_overwritten_by_the_next_replay():
    model, optimizer, step, _ = build()
    captured = nn.capture(step)
    batches = data(4)
    first = captured(*batches[0])
    second = captured(*batches[1])
    kept = second.data.copy()
    third = captured(*batches[2])
    fourth = captured(*batches[3])
    assert captured.replays >= 2
    assert np.array_equal(second.data, kept)
    assert not np.array_equal(third.data, fourth.data)
    assert first.data is not second.data


def test_an_attached_observer_sees_every_op_so_the_step_runs_eagerly():
    # guard: core.observers non-empty -> eager (detect_anomaly must see the replayed ops)
    model, optimizer, _, _ = build()

    def step(x, y, poison):
        loss = nn.SoftmaxCELoss(model.l2(nn.Tanh(model.l1(x * poison))), y)
        return finish(loss, optimizer)
    captured = nn.capture(step)
    x, y = data(1)[0]
    one = np.ones((1, 8))
    captured(x, y, one)
    captured(x, y, one)
    with nn.detect_anomaly():
        with pytest.raises(nn.AnomalyError):
            captured(x, y, np.full((1, 8), np.nan))


def test_check_true_raises_at_the_first_difference():
    model, optimizer, _, _ = build()
    own = np.random.default_rng(3)      # a generator capture cannot see

    def step(x, y):
        loss = nn.SoftmaxCELoss(model.l1(x + own.standard_normal(x.shape))[:, :3], y)
        return finish(loss, optimizer)
    captured = nn.capture(step, check=True)
    x, y = data(1)[0]
    captured(x, y)
    with pytest.raises(AssertionError, match="differs from eager in the result"):
        captured(x, y)


def test_the_first_replay_is_checked_so_an_unseen_generator_runs_eagerly():
    model, optimizer, _, _ = build()
    own = np.random.default_rng(3)

    def step(x, y):
        loss = nn.SoftmaxCELoss(model.l1(x + own.standard_normal(x.shape))[:, :3], y)
        return finish(loss, optimizer)
    nn.seed(0)
    eager = [np.array(step(x, y).data) for x, y in data(5)]
    model, optimizer, _, _ = build()
    own = np.random.default_rng(3)
    captured = nn.capture(step)
    with pytest.warns(UserWarning, match="first replay differed from eager"):
        replayed = [np.array(captured(x, y).data) for x, y in data(5)]
    assert all(np.array_equal(a, b) for a, b in zip(eager, replayed))
    assert captured.replays == 0


def test_a_value_read_after_the_optimizer_step_runs_the_step_eagerly():
    # a replay stopped by that read could not take the update back: refused when recorded,
    # so the optimizer never steps twice for one call
    model, optimizer, _, _ = build()

    def step(x, y):
        loss = nn.SoftmaxCELoss(model.l2(nn.Tanh(model.l1(x))), y)
        loss.back()
        optimizer.step()
        return loss.item()
    eager = [step(x, y) for x, y in data(6)]
    model, optimizer, _, _ = build()
    captured = nn.capture(step)
    with pytest.warns(UserWarning, match=r"after GD.step\(\); return the node"):
        replayed = [captured(x, y) for x, y in data(6)]
    assert replayed == eager and captured.replays == 0


def test_a_step_writing_into_its_input_runs_eagerly():
    model, optimizer, _, _ = build()

    def step(x, y):
        x -= x.mean()               # the caller's array, in eager
        loss = nn.SoftmaxCELoss(model.l2(nn.Tanh(model.l1(x))), y)
        return finish(loss, optimizer)
    captured = nn.capture(step)
    x, y = data(1)[0]
    kept = x.copy()
    with pytest.warns(UserWarning, match="writes into one of its inputs"):
        captured(x, y)
    assert not np.array_equal(x, kept)      # changed as eager changes it
    assert captured.replays == 0


def test_a_branch_after_a_dropout_draw_takes_the_draw_back_before_recording_again():
    # the replay stops at the branch after drawing a mask: the generator is put back, so
    # the recording that follows draws the same mask eager draws
    model, optimizer, _, _ = build(dropout=0.5)

    def step(x, y):
        h = model.drop(nn.Tanh(model.l1(x)))
        if h.data.sum() > 0:
            h = h * 0.5
        loss = nn.SoftmaxCELoss(model.l2(h), y)
        return finish(loss, optimizer)
    nn.seed(0)
    eager = [np.array(step(x, y).data) for x, y in data(16)]
    model, optimizer, _, _ = build(dropout=0.5)
    nn.seed(0)
    captured = nn.capture(step)
    replayed = [np.array(captured(x, y).data) for x, y in data(16)]
    assert all(np.array_equal(a, b) for a, b in zip(eager, replayed))
    assert captured.records >= 2 and captured.replays >= 1, captured


def test_a_list_input_runs_eagerly_since_it_could_change_behind_a_replay():
    model, optimizer, _, _ = build()

    def predict(x, scales):
        return model.l1(x * np.asarray(scales))
    captured = nn.capture(predict)
    x = data(1)[0][0]
    scales = [1.0] * 8
    with pytest.warns(UserWarning, match="inputs must be arrays, nodes, numbers or strings"):
        first = captured(x, scales)
    scales[0] = 5.0                     # the same list, changed
    assert np.array_equal(captured(x, scales).data, predict(x, scales).data)
    assert not np.array_equal(first.data, predict(x, scales).data)


def test_another_thread_gets_plain_arrays_while_a_step_records():
    import threading
    seen = []

    def step(x):
        worker = threading.Thread(target=lambda: seen.append(type(np.zeros(3))))
        worker.start()
        worker.join()
        return nn.Tanh(nn.NetVar(x))
    nn.capture(step)(np.ones((2, 3)))
    assert seen == [np.ndarray]


def test_a_schedule_stepped_inside_the_step_runs_it_eagerly():
    # a replay would not step the schedule: the recording sees the optimizer's lr change
    def scenario(captured):
        model, optimizer, _, _ = build()
        schedule = nn.StepLR(optimizer, 3, gamma=0.5)     # no change in the first calls

        def step(x, y):
            loss = finish(nn.SoftmaxCELoss(model.l2(nn.Tanh(model.l1(x))), y), optimizer)
            schedule.step()
            return loss
        step = nn.capture(step) if captured else step
        return [np.array(step(x, y).data) for x, y in data(8)], optimizer.lr, step
    eager, eager_lr, _ = scenario(False)
    with pytest.warns(UserWarning, match="the step changes Python state a replay would not"):
        replayed, lr, step = scenario(True)
    assert lr == eager_lr and all(np.array_equal(a, b) for a, b in zip(eager, replayed))
    assert step.replays == 0


class _Scaled(nn.Module):
    """A layer whose forward reads a global: changing it must record again."""

    def __init__(self):
        self.inner = nn.layers.Linear(8, 3)

    def forward(self, x):
        return self.inner(x) * FORWARD_SCALE


FORWARD_SCALE = 1.0


class _Settings:
    def __init__(self):
        self.k = 1.0

    def get(self):
        return self.k


@pytest.mark.parametrize("where", ["a Module's forward", "a method of a settings object"])
def test_a_number_read_in_code_the_step_calls_records_again_when_it_changes(where):
    global FORWARD_SCALE
    settings = _Settings()

    def scenario(captured):
        global FORWARD_SCALE
        FORWARD_SCALE, settings.k = 1.0, 1.0
        nn.seed(0)
        model = _Scaled()
        optimizer = nn.GD(model.vars, lr=0.1)

        def step(x, y):
            return finish(nn.SoftmaxCELoss(model(x) * settings.get(), y), optimizer)
        step = nn.capture(step) if captured else step
        losses = []
        for i, (x, y) in enumerate(data(8)):
            if i == 4:
                if where == "a Module's forward":
                    FORWARD_SCALE = 3.0
                else:
                    settings.k = 3.0
            losses.append(np.array(step(x, y).data))
        return losses, step
    eager, _ = scenario(False)
    replayed, step = scenario(True)
    FORWARD_SCALE = 1.0
    assert all(np.array_equal(a, b) for a, b in zip(eager, replayed))
    assert step.records == 2 and step.replays >= 5, step


def test_back_with_a_trace_runs_the_step_eagerly():
    model, optimizer, _, _ = build()
    traces = []

    def step(x, y):
        loss = nn.SoftmaxCELoss(model.l2(nn.Tanh(model.l1(x))), y)
        traces.append(loss.back(trace=True))
        optimizer.step()
        return loss
    captured = nn.capture(step)
    with pytest.warns(UserWarning, match=r"back\(trace=True\)"):
        for x, y in data(3):
            captured(x, y)
    assert len(traces) == 3 and captured.replays == 0


def test_a_node_input_gets_its_gradient_at_every_replay():
    def run(captured):
        model, optimizer, _, _ = build()

        def step(x, y):
            return finish(nn.SoftmaxCELoss(model.l2(nn.Tanh(model.l1(x))), y), optimizer)
        step = nn.capture(step) if captured else step
        grads = []
        for x, y in data(5):
            node = nn.NetVar(x)
            step(node, y)
            grads.append(node.g.copy())
        return grads, step
    eager, _ = run(False)
    replayed, step = run(True)
    assert all(np.array_equal(a, b) for a, b in zip(eager, replayed))
    assert step.replays >= 3, step


def test_an_optimizer_with_modifiers_replays_as_eager():
    # the optimizer's step, its gradient modifiers included, runs live on plain arrays
    def run(captured):
        nn.seed(0)
        model = nn.layers.Sequential(nn.layers.Linear(8, 16), nn.Tanh, nn.layers.Linear(16, 3))
        optimizer = nn.AdamW(model.vars, lr=0.05, weight_decay=0.1,
                             modifiers=[nn.ClipGradNorm(0.5)])

        def step(x, y):
            return finish(nn.SoftmaxCELoss(model(x), y), optimizer)
        step = nn.capture(step) if captured else step
        return [np.array(step(x, y).data) for x, y in data(10)], step
    eager, _ = run(False)
    replayed, step = run(True)
    assert all(np.array_equal(a, b) for a, b in zip(eager, replayed))
    assert step.replays == 9, step


def test_an_embedding_replays_whichever_tokens_a_batch_holds():
    # its table gradient sums the rows of each token: shapes that follow the shapes alone, so
    # a batch with another set of tokens replays (it recorded again at every new set before)
    rng = np.random.default_rng(0)
    batches = [(rng.integers(0, 50, (6, 4)), rng.integers(0, 2, 4)) for _ in range(10)]

    def run(captured):
        nn.seed(0)
        model = nn.Module()
        model.embedding = nn.layers.Embedding(50, 8)
        model.head = nn.layers.Linear(8, 2)
        optimizer = nn.Adam(model.vars, lr=0.05)

        def step(tokens, labels):
            pooled = nn.Mean(model.embedding(tokens), axis=0)
            return finish(nn.SoftmaxCELoss(model.head(pooled), labels), optimizer)
        step = nn.capture(step) if captured else step
        return [np.array(step(t, y).data) for t, y in batches], model, step
    eager, eager_model, _ = run(False)
    replayed, model, step = run(True)
    assert all(np.array_equal(a, b) for a, b in zip(eager, replayed))
    assert np.array_equal(eager_model.embedding.table.data, model.embedding.table.data)
    assert (step.records, step.replays) == (1, 9), step


def test_capture_checks_its_arguments_and_bounds_its_signatures():
    with pytest.raises(TypeError, match="fn must be callable, got int"):
        nn.capture(5)
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="max_signatures must be an int >= 1"):
            nn.capture(lambda x: x, max_signatures=bad)
    model, optimizer, _, _ = build()

    def predict(x):
        return model.l1(x)
    captured = nn.capture(predict, max_signatures=2)
    rows = [np.ones((n, 8)) for n in (1, 2, 3)]
    captured(rows[0])
    captured(rows[1])
    with pytest.warns(UserWarning, match="more than 2 signatures"):
        captured(rows[2])
    assert len(captured.schedules) == 2
    assert np.array_equal(captured(rows[0]).data, predict(rows[0]).data)    # forgotten: records
    assert captured.records == 4
