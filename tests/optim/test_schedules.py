"""Learning-rate schedules on an optimizer's lr (and its groups' own lr)."""
import math

import numpy as np
import pytest

import nnkit as nn


def _opt(lr=1.0):
    return nn.GD([nn.NetVar(np.ones((1, 1)))], lr=lr)


def _lrs(schedule, calls):
    return [schedule.optimizer.lr] + [schedule.step() for _ in range(calls)]


def test_step_and_exponential():
    assert _lrs(nn.StepLR(_opt(), 2, gamma=0.5), 5) == [1, 1, 0.5, 0.5, 0.25, 0.25]
    assert _lrs(nn.ExponentialLR(_opt(2.0), 0.5), 3) == [2.0, 1.0, 0.5, 0.25]


def test_cosine_reaches_min_and_stays():
    lrs = _lrs(nn.CosineLR(_opt(), total=4, min_lr=0.1), 6)
    expected = [0.1 + 0.9 * (1 + math.cos(math.pi * min(t, 4) / 4)) / 2 for t in range(7)]
    np.testing.assert_allclose(lrs, expected)
    assert lrs[-1] == pytest.approx(0.1)


def test_linear_warmup_then_cosine():
    opt = _opt(0.4)
    warm = nn.LinearWarmup(opt, 4, then=nn.CosineLR(opt, total=2))
    np.testing.assert_allclose(_lrs(warm, 7), [0.0, 0.1, 0.2, 0.3, 0.4, 0.2, 0.0, 0.0])


def test_schedules_scale_group_learning_rates():
    a, b = nn.NetVar(np.ones((1, 1))), nn.NetVar(np.ones((1, 1)))
    opt = nn.Adam([{"params": [a]}, {"params": [b], "lr": 0.01}], lr=0.1)
    nn.StepLR(opt, 1, gamma=0.5).step()
    assert opt.lr == pytest.approx(0.05) and opt.param_groups[1]["lr"] == pytest.approx(0.005)


def test_reduce_on_plateau():
    plateau = nn.ReduceOnPlateau(_opt(), factor=0.5, patience=1, min_lr=0.2)
    lrs = [plateau.step(v) for v in [3, 2, 2, 2, 2, 2, 2, 2]]
    assert lrs == [1, 1, 1, 0.5, 0.5, 0.25, 0.25, 0.2]
    maxing = nn.ReduceOnPlateau(_opt(), factor=0.1, patience=0, mode="max")
    assert [maxing.step(v) for v in [1, 2, 2]] == pytest.approx([1, 1, 0.1])


def test_state_dict_restores_the_schedule():
    plateau = nn.ReduceOnPlateau(_opt(), factor=0.5, patience=0)
    for v in [1, 2]:
        plateau.step(v)
    copy = nn.ReduceOnPlateau(_opt(), factor=0.5, patience=0)
    copy.load_state_dict(plateau.state_dict())
    assert copy.optimizer.lr == 0.5 and copy.step(3) == plateau.step(3) == 0.25


def test_bad_arguments():
    with pytest.raises(ValueError, match="StepLR: step_size"):
        nn.StepLR(_opt(), 0)
    with pytest.raises(ValueError, match="mode must be 'min' or 'max'"):
        nn.ReduceOnPlateau(_opt(), mode="up")
    with pytest.raises(TypeError, match="expects an nnkit optimizer"):
        nn.StepLR(object(), 1)
