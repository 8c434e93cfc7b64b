import math

import numpy as np
import pytest

from nnkit import checks

NOT_NUMBERS = [            # (value, how the message shows it)
    (True, "bool True"), (np.bool_(False), f"bool {np.bool_(False)!r}"), ("1.5", "str '1.5'"),
    (None, "NoneType None"), (np.array([0.5]), "ndarray array([0.5])"), ([1.0], "list [1.0]"),
    (1 + 2j, "complex (1+2j)")]


@pytest.mark.parametrize("value", [0, -3, 2.5, np.float32(0.25), np.float64(-1e300),
                                   np.int64(7), np.uint8(200), float("inf"), float("nan")])
def test_is_number_accepts_ints_floats_and_numpy_scalars(value):
    assert checks.is_number(value) is True


@pytest.mark.parametrize("value, _", NOT_NUMBERS)
def test_is_number_refuses_bools_and_non_numbers(value, _):
    assert checks.is_number(value) is False


def test_is_integer_accepts_only_ints_and_numpy_integers():
    assert all(checks.is_integer(v) for v in (0, -4, np.int8(3), np.uint64(2 ** 63)))
    assert not any(checks.is_integer(v) for v in (True, np.bool_(True), 2.0, np.float64(2),
                                                  "2", None, np.array(2)))


@pytest.mark.parametrize("value, expected", [(3, 3.0), (-0.5, -0.5), (np.float32(0.25), 0.25),
                                             (np.int64(-2), -2.0)])
def test_number_returns_a_plain_float(value, expected):
    result = checks.number("Op", "x", value)
    assert type(result) is float and result == expected


def test_number_lets_nan_and_inf_through():
    assert math.isnan(checks.number("Op", "x", float("nan")))
    assert checks.number("Op", "x", -math.inf) == -math.inf


@pytest.mark.parametrize("value, shown", NOT_NUMBERS)
def test_number_refuses_a_non_number_naming_owner_argument_type_and_value(value, shown):
    with pytest.raises(TypeError) as error:
        checks.number("LReLU", "the slope s", value)
    assert str(error.value) == f"LReLU: the slope s must be a number, got {shown}"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"),
                                   np.float32("nan"), np.float64("inf")])
def test_in_range_refuses_what_is_not_finite_before_the_bounds(value):
    with pytest.raises(ValueError) as error:
        checks.in_range("Dropout", "p", value, 0, 1, high_open=True)
    assert str(error.value) == f"Dropout: p must be finite, got {value}"


def test_in_range_without_bounds_is_a_finite_number():
    assert checks.in_range("ELU", "alpha", -1e300) == -1e300
    assert type(checks.in_range("ELU", "alpha", np.float32(2))) is float
    with pytest.raises(TypeError, match=r"^ELU: alpha must be a number, got str '1'$"):
        checks.in_range("ELU", "alpha", "1")


@pytest.mark.parametrize("bounds, inside, outside, words", [
    (dict(low=0), [0, 0.0, 1e300], [-1e-300, -1], ">= 0"),
    (dict(low=0, low_open=True), [1e-300, 5], [0, -0.0, -1], "> 0"),
    (dict(high=1), [1, -1e300], [1.0000001, 2], "<= 1"),
    (dict(high=1, high_open=True), [0.999, -5], [1, 1.5], "< 1"),
    (dict(low=0, high=1), [0, 1, 0.5], [-0.001, 1.001], "in [0, 1]"),
    (dict(low=0, high=1, high_open=True), [0, 0.999], [1, 1.0, -1], "in [0, 1)"),
    (dict(low=0, high=1, low_open=True), [1, 1e-9], [0, 2], "in (0, 1]"),
    (dict(low=-1, high=1, low_open=True, high_open=True), [0, -0.999], [-1, 1], "in (-1, 1)"),
])
def test_in_range_keeps_each_end_open_or_closed(bounds, inside, outside, words):
    for value in inside:
        assert checks.in_range("Op", "a", value, **bounds) == value
    for value in outside:
        with pytest.raises(ValueError) as error:
            checks.in_range("Op", "a", value, **bounds)
        assert str(error.value) == f"Op: a must be {words}, got {value}"


def test_in_range_message_shows_the_value_as_given():
    with pytest.raises(ValueError, match=r"^gaussian: std must be >= 0, got -1$"):
        checks.in_range("gaussian", "std", -1, 0)
    with pytest.raises(ValueError, match=r"^Op: a must be > 0, got 0\.0$"):
        checks.in_range("Op", "a", np.float64(0), 0, low_open=True)


def test_in_range_with_finite_false_allows_inf_but_no_nan_past_a_bound():
    assert checks.in_range("ClipValue", "limit", math.inf, 0, low_open=True,
                           finite=False) == math.inf
    with pytest.raises(ValueError, match=r"^ClipValue: limit must be > 0, got nan$"):
        checks.in_range("ClipValue", "limit", float("nan"), 0, low_open=True, finite=False)
    with pytest.raises(ValueError, match=r"^ClipValue: limit must be > 0, got -inf$"):
        checks.in_range("ClipValue", "limit", -math.inf, 0, low_open=True, finite=False)


def test_in_range_refuses_bools_and_non_numbers_with_a_type_error():
    for value, shown in NOT_NUMBERS:
        with pytest.raises(TypeError) as error:
            checks.in_range("Adam", "learning rate", value, 0)
        assert str(error.value) == f"Adam: learning rate must be a number, got {shown}"


@pytest.mark.parametrize("value, low", [(0, 0), (1, 1), (10 ** 20, 1), (np.int64(5), 1),
                                        (np.uint8(0), 0), (-2, -3)])
def test_count_returns_a_plain_int(value, low):
    result = checks.count("Op", "n", value, low)
    assert type(result) is int and result == value


@pytest.mark.parametrize("value, low, words", [(0, 1, "a positive integer"),
                                               (-1, 0, "an integer >= 0"),
                                               (np.int32(2), 3, "an integer >= 3")])
def test_count_refuses_a_count_below_low_with_a_value_error(value, low, words):
    with pytest.raises(ValueError) as error:
        checks.count("StepLR", "step_size", value, low)
    assert str(error.value) == f"StepLR: step_size must be {words}, got {value}"


@pytest.mark.parametrize("value, shown", [(2.5, "float 2.5"), (2.0, "float 2.0"),
                                          (np.float64(3), f"float64 {np.float64(3)!r}"),
                                          (float("nan"), "float nan"), (True, "bool True"),
                                          (np.bool_(True), f"bool {np.bool_(True)!r}"),
                                          ("3", "str '3'"),
                                          (None, "NoneType None")])
def test_count_refuses_floats_bools_and_others_with_a_type_error(value, shown):
    with pytest.raises(TypeError) as error:
        checks.count("minibatches", "batch_size", value, 1)
    assert str(error.value) == f"minibatches: batch_size must be a positive integer, got {shown}"


def test_count_default_low_is_zero():
    assert checks.count("Op", "n", 0) == 0
    with pytest.raises(ValueError, match=r"^Op: n must be an integer >= 0, got -1$"):
        checks.count("Op", "n", -1)


@pytest.mark.parametrize("value, expected", [(True, True), (False, False),
                                             (np.bool_(True), True), (np.bool_(False), False)])
def test_flag_returns_a_plain_bool(value, expected):
    result = checks.flag("Op", "f", value)
    assert type(result) is bool and result is expected


@pytest.mark.parametrize("value, shown", [(1, "int 1"), (0, "int 0"), ("no", "str 'no'"),
                                          (None, "NoneType None"), (1.0, "float 1.0"),
                                          (np.array(True), "ndarray array(True)")])
def test_flag_refuses_anything_but_a_bool(value, shown):
    with pytest.raises(TypeError) as error:
        checks.flag("SaveBest", "restore", value)
    assert str(error.value) == f"SaveBest: restore must be True or False, got {shown}"
