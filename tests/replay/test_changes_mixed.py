"""Never stale, with the changes mixed: a random sequence of calls and of the changes a user
makes between them (a learning rate, a parameter edited or given new data, a global number, the
mode, no_grad (the step then raises), detect_anomaly, the generator's seed, a checkpoint of the
optimizer loaded back, a gradient set by hand, a parameter group's option, two batch sizes),
run once eagerly and once captured from the same seed, gives the same bits after every call:
each loss, every parameter, BatchNorm's running statistics and Adam's state. The same on each
model of the zoo (tests/replay/models.py), with the changes that apply to all of them.

test_guards.py checks each change alone; here they meet in any order, which is where a guard
that forgets to look again after another guard's re-recording would show.
"""
import copy
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import nnkit as nn
from tests.reliability.helpers import PROPERTY

from . import models

SCALE = 1.0                     # a global number the step reads

EVENTS = ("call", "call", "call", "call", "other size", "lr", "edit", "new data", "scale",
          "eval", "no_grad", "seed", "save", "load", "gradient", "group", "anomaly")


def build():
    nn.seed(0)
    model = nn.Module()
    model.l1 = nn.layers.Linear(6, 10)
    model.norm = nn.layers.BatchNorm(10)
    model.drop = nn.layers.Dropout(0.25)
    model.l2 = nn.layers.Linear(10, 3)
    optimizer = nn.Adam(model.vars, lr=0.01)

    def step(x, y):
        h = model.drop(nn.Tanh(model.norm(model.l1(x))))
        loss = nn.SoftmaxCELoss(model.l2(h) * SCALE, y)
        loss.back()
        optimizer.step()
        return loss

    return model, optimizer, step


def batches():
    rng = np.random.default_rng(3)
    return {rows: [(rng.standard_normal((rows, 6)), rng.integers(0, 3, rows)) for _ in range(4)]
            for rows in (5, 7)}


def state(model, optimizer):
    """Everything a step changes, as arrays (copies): parameters and running statistics, Adam's
    state, then the position of nnkit's generator (Dropout draws from it)."""
    arrays = [np.array(v, copy=True) for v in model.state().values()]
    assert len(arrays) == len(model.vars) + 2         # BatchNorm's running mean and variance
    for entry in optimizer.state_dict()["state"]:
        arrays += [np.array(v, copy=True) for v in (entry.values() if isinstance(entry, dict)
                                                     else [])]
    return arrays + [models.generator_position()]


def run(events, captured):
    """``events`` on a fresh model, its step ``captured`` or not: each call's loss (or what it
    raised) and ``state`` after it."""
    global SCALE
    SCALE = 1.0
    model, optimizer, step = build()
    if captured:
        step = nn.capture(step)
    data, saved, seen, rows = batches(), None, [], 5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, event in enumerate(events):
            x, y = data[rows][i % 4]
            if event == "other size":
                rows = 12 - rows
            elif event == "lr":
                optimizer.lr *= 0.5
            elif event == "edit":
                model.l1.W.data[0, :] += 0.125
            elif event == "new data":
                model.l2.b.data = model.l2.b.data + 0.25
            elif event == "scale":
                SCALE += 0.5
            elif event == "seed":
                nn.seed(i)
            elif event == "save":
                saved = copy.deepcopy(optimizer.state_dict())
            elif event == "load" and saved is not None:
                optimizer.load_state_dict(saved)
            elif event == "gradient":
                model.l2.W.g = np.full(model.l2.W.shape, 0.5)
            elif event == "group":          # a group's own option, then set again
                group = optimizer.param_groups[0]
                group["momentum"] = 0.5 if group.get("momentum") == 0.8 else 0.8
            elif event == "anomaly":        # an observer: the step runs eagerly
                with nn.detect_anomaly():
                    loss = step(x, y)
                seen.append([np.array(loss.data)] + state(model, optimizer))
            elif event == "eval":
                with nn.eval_mode():
                    loss = step(x, y)
                seen.append([np.array(loss.data)] + state(model, optimizer))
            elif event == "no_grad":        # back() refuses: nothing may change
                try:
                    with nn.no_grad():
                        step(x, y)
                    raised = "nothing"
                except RuntimeError as error:
                    raised = str(error).split(":")[0]
                seen.append([np.array(raised)] + state(model, optimizer))
            else:
                loss = step(x, y)
                seen.append([np.array(loss.data)] + state(model, optimizer))
    return seen, step


@settings(PROPERTY, max_examples=60)
@given(st.lists(st.sampled_from(EVENTS), min_size=4, max_size=30))
def test_calls_and_changes_in_any_order_give_eagers_bits(events):
    eager, _ = run(events, captured=False)
    replayed, step = run(events, captured=True)
    assert len(eager) == len(replayed)
    for call, (a, b) in enumerate(zip(eager, replayed)):
        for k, (u, v) in enumerate(zip(a, b)):
            assert u.shape == v.shape and np.array_equal(u, v, equal_nan=u.dtype.kind == "f"), (
                f"events {events}: call {call} differs in array {k} ({step})")


def test_the_mixed_scenario_replays():
    """The scenario above does replay (not only record): a run of plain calls replays."""
    _, step = run(["call"] * 6 + ["lr", "call", "call", "edit", "call"], captured=True)
    assert step.replays >= 5, step


ZOO_EVENTS = ("call", "call", "call", "lr", "edit", "new data", "eval", "seed", "save", "load",
              "gradient")


def run_zoo(kind, events, captured):
    """``events`` on the zoo's ``kind`` (tests/replay/models.py): each call's loss and the
    whole ``state()`` after it."""
    built = models.build(kind, np.float64)
    step = nn.capture(built.step) if captured else built.step
    first, last = built.model.vars[0], built.model.vars[-1]
    data, saved, seen = built.batches(4), None, []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, event in enumerate(events):
            if event == "lr":
                built.optimizer.lr *= 0.5
            elif event == "edit":
                first.data.reshape(-1)[:3] += 0.125
            elif event == "new data":
                last.data = last.data * 0.5
            elif event == "seed":
                nn.seed(i)
            elif event == "save":
                saved = copy.deepcopy(built.optimizer.state_dict())
            elif event == "load" and saved is not None:
                built.optimizer.load_state_dict(saved)
            elif event == "gradient":
                first.g = np.full(first.shape, 0.25)
            elif event in ("call", "eval"):
                with nn.eval_mode() if event == "eval" else nn.train_mode():
                    loss = step(*data[i % 4])
                if built.between is not None:
                    built.between()
                seen.append([np.array(loss.data)] + built.state())
    return seen, step


@settings(PROPERTY, max_examples=12)
@given(st.lists(st.sampled_from(ZOO_EVENTS), min_size=4, max_size=20))
@pytest.mark.parametrize("kind", models.KINDS)
def test_each_zoo_model_gives_eagers_bits_through_mixed_changes(kind, events):
    eager, _ = run_zoo(kind, events, captured=False)
    replayed, step = run_zoo(kind, events, captured=True)
    assert len(eager) == len(replayed)
    for call, (a, b) in enumerate(zip(eager, replayed)):
        assert models.same_state(a, b), f"{kind}, events {events}: call {call} differs ({step})"
