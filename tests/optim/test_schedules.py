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


@pytest.mark.parametrize("make, error, message", [
    (lambda o: nn.StepLR(o, -2), ValueError,
     "StepLR: step_size must be a positive integer, got -2"),
    (lambda o: nn.StepLR(o, 2.5), TypeError,
     "StepLR: step_size must be a positive integer, got float 2.5"),
    (lambda o: nn.StepLR(o, 2, gamma=float("nan")), ValueError, "StepLR: gamma must be"),
    (lambda o: nn.StepLR(o, 2, gamma=float("inf")), ValueError, "StepLR: gamma must be"),
    (lambda o: nn.StepLR(o, "2"), TypeError,
     "StepLR: step_size must be a positive integer, got str '2'"),
    (lambda o: nn.ExponentialLR(o, float("nan")), ValueError, "ExponentialLR: gamma must be"),
    (lambda o: nn.ExponentialLR(o, -0.5), ValueError, "ExponentialLR: gamma must be"),
    (lambda o: nn.CosineLR(o, 0), ValueError, "CosineLR: total must be a positive integer"),
    (lambda o: nn.CosineLR(o, 10, min_lr=float("nan")), ValueError, "CosineLR: min_lr must be"),
    (lambda o: nn.LinearWarmup(o, 0), ValueError,
     "LinearWarmup: warmup must be a positive integer, got 0"),
    (lambda o: nn.LinearWarmup(o, 1.5), TypeError,
     "LinearWarmup: warmup must be a positive integer, got float 1.5"),
    (lambda o: nn.LinearWarmup(o, 5, start=1.5), ValueError, "LinearWarmup: start must be"),
    (lambda o: nn.LinearWarmup(o, 5, then=0.5), TypeError,
     "LinearWarmup: then must be a schedule, got float"),
    (lambda o: nn.ReduceOnPlateau(o, factor=1.0), ValueError,
     r"ReduceOnPlateau: factor must be in \[0, 1\), got 1.0"),
    (lambda o: nn.ReduceOnPlateau(o, factor=float("nan")), ValueError, "ReduceOnPlateau: factor"),
    (lambda o: nn.ReduceOnPlateau(o, patience=-1), ValueError, "ReduceOnPlateau: patience"),
    (lambda o: nn.ReduceOnPlateau(o, min_delta=float("nan")), ValueError, "min_delta"),
    (lambda o: nn.ReduceOnPlateau(o, min_delta=float("inf")), ValueError, "min_delta"),
])
def test_bad_schedule_arguments_are_refused_and_leave_lr_alone(make, error, message):
    opt = _opt(0.5)
    with pytest.raises(error, match=message):
        make(opt)
    assert opt.lr == 0.5


@pytest.mark.parametrize("metric", [float("nan"), float("inf"), np.float64("nan")])
def test_reduce_on_plateau_refuses_a_non_finite_metric(metric):
    plateau = nn.ReduceOnPlateau(_opt(), factor=0.5, patience=0)
    plateau.step(1.0)
    before = plateau.state_dict()
    with pytest.raises(ValueError, match=f"ReduceOnPlateau.step: metric is {metric}"):
        plateau.step(metric)
    assert plateau.state_dict() == before and plateau.optimizer.lr == 1.0
    with pytest.raises(TypeError, match="ReduceOnPlateau.step: metric must be a number, got str"):
        plateau.step("0.5")


def test_a_group_added_after_the_schedule_is_refused_at_its_step():
    opt = _opt(1.0)
    schedule = nn.StepLR(opt, 1, gamma=0.5)
    opt.add_param_group({"params": [nn.NetVar(np.ones((1, 1)))], "lr": 0.1})
    with pytest.raises(ValueError, match="StepLR: the optimizer has 2 parameter groups, the "
                                         "schedule was built for 1"):
        schedule.step()
    assert opt.lr == 1.0 and opt.param_groups[1]["lr"] == 0.1 and schedule.t == 0


def test_a_user_schedule_with_a_bad_factor_is_refused():
    class Broken(nn.Schedule):
        def factor(self, t):
            return float("nan") if t else 1.0

    opt = _opt(0.3)
    schedule = Broken(opt)
    with pytest.raises(ValueError, match="Broken: the factor of the base learning rate must be "
                                         "finite and >= 0, got nan"):
        schedule.step()
    assert opt.lr == 0.3 and schedule.t == 0


def test_load_state_dict_is_checked_before_anything_changes():
    plateau = nn.ReduceOnPlateau(_opt(), factor=0.5, patience=0)
    for v in [1, 2]:
        plateau.step(v)
    before = plateau.state_dict()
    for bad in ({"t": -1}, {"t": 2.5}, {"scale": float("nan")}, {"scale": 2.0}, {"bad": -1},
                {"best": float("nan")}, {"best": "low"}):
        with pytest.raises((ValueError, TypeError), match="ReduceOnPlateau.load_state_dict: "):
            plateau.load_state_dict({**before, **bad})
        assert plateau.state_dict() == before and plateau.optimizer.lr == 0.5
    with pytest.raises(TypeError,
                       match=r"StepLR.load_state_dict: t must be an integer >= 0, got float nan"):
        nn.StepLR(_opt(), 2).load_state_dict({"t": float("nan")})


def test_a_schedule_resumed_after_the_optimizer_state_uses_the_first_runs_base():
    # built on an optimizer whose decayed lr was loaded first, the schedule took that lr as its
    # base and decayed it again: 0.00625 for 0.025
    first = _opt(0.1)
    schedule = nn.StepLR(first, 2, gamma=0.5)
    for _ in range(4):
        schedule.step()
    saved_opt, saved_schedule = first.state_dict(), schedule.state_dict()
    second = _opt(0.1)
    second.load_state_dict(saved_opt)                   # lr 0.025 now
    resumed = nn.StepLR(second, 2, gamma=0.5)
    resumed.load_state_dict(saved_schedule)
    assert second.lr == first.lr == pytest.approx(0.025)
    assert resumed.step() == schedule.step()
    before = resumed.state_dict()
    with pytest.raises(ValueError, match="StepLR.load_state_dict: group_bases must list one"):
        resumed.load_state_dict({**before, "group_bases": [None, None]})
    assert resumed.state_dict() == before


def test_reduce_on_plateau_floors_every_group_at_min_lr():
    # a group with its own lr kept its ratio to the optimizer's: 0.1 for min_lr 0.02
    a, b, c = (nn.NetVar(np.ones((1, 1))) for _ in range(3))
    opt = nn.GD([{"params": [a]}, {"params": [b], "lr": 0.5}, {"params": [c], "lr": 0.01}],
                lr=0.1)
    plateau = nn.ReduceOnPlateau(opt, factor=0.1, patience=0, min_lr=0.02)
    for value in [1, 1, 1, 1]:
        plateau.step(value)
    assert opt.lr == pytest.approx(0.02) and opt.param_groups[1]["lr"] == pytest.approx(0.02)
    assert opt.param_groups[2]["lr"] == 0.01            # below min_lr from the start: kept
    copy = nn.GD([{"params": [a]}, {"params": [b], "lr": 0.5}, {"params": [c], "lr": 0.01}],
                 lr=0.1)
    nn.ReduceOnPlateau(copy, factor=0.1, patience=0, min_lr=0.02).load_state_dict(
        plateau.state_dict())
    assert [g.get("lr") for g in copy.param_groups] == [g.get("lr") for g in opt.param_groups]


def test_a_refused_warmup_leaves_the_rates_and_an_overflow_names_the_schedule():
    # LinearWarmup set the rates to start·base before refusing a `then` built for fewer groups
    a, b = nn.NetVar(np.ones((1, 1))), nn.NetVar(np.ones((1, 1)))
    opt = nn.GD([{"params": [a]}], lr=0.1)
    cosine = nn.CosineLR(opt, total=4)
    opt.add_param_group({"params": [b], "lr": 0.3})
    with pytest.raises(ValueError, match="CosineLR: the optimizer has 2 parameter groups"):
        nn.LinearWarmup(opt, 3, then=cosine)
    assert opt.lr == 0.1 and opt.param_groups[1]["lr"] == 0.3
    growing = nn.ExponentialLR(_opt(), 1e200)
    growing.step()
    with pytest.raises(ValueError, match="ExponentialLR: the factor of the base learning rate "
                                         "overflows at count 2"):
        growing.step()
    assert growing.t == 1 and growing.optimizer.lr == 1e200
