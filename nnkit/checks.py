"""Checks of scalar arguments: the one place that words "must be a number", "must be finite",
"must be in [0, 1)", "must be a positive integer" and "must be True or False".

A check takes ``owner`` (what the user called: an op, a function, ``"Adam.load_state_dict"``),
the argument's ``name`` and its ``value``, and returns the value in its plain Python type or
raises an error naming all three: TypeError for a value of the wrong kind (a bool where a
number is due, a string, an array, None), ValueError for a number out of range. NumPy scalars
count as numbers. ``is_number`` and ``is_integer`` are the bare tests, for a caller that words
its own error. This module imports nothing from nnkit, so every module may use it.
"""

__all__ = ['is_number', 'is_integer', 'number', 'in_range', 'count', 'flag']
import math
import numbers

import numpy


def is_number(value):
    """Whether ``value`` is a real number (int, float or a NumPy scalar of one), not a bool."""
    return not isinstance(value, bool) and isinstance(value, numbers.Real)


def is_integer(value):
    """Whether ``value`` is an int or a NumPy integer, not a bool."""
    return not isinstance(value, bool) and isinstance(value, numbers.Integral)


def number(owner, name, value):
    """``value`` as a float; TypeError unless it is a real number."""
    # A plain float or int skips the ABC test: Pow's constructor (x ** 2) comes through here.
    if type(value) is not float and type(value) is not int and not is_number(value):
        raise TypeError(f"{owner}: {name} must be a number, got {type(value).__name__} "
                        f"{value!r}")
    return float(value)


def in_range(owner, name, value, low=None, high=None, *, low_open=False, high_open=False,
             finite=True):
    """``value`` as a float, finite (NaN and ±inf refused first) unless ``finite=False``, from
    ``low`` to ``high`` (None: no bound; ``low_open``/``high_open``: that end excluded)."""
    x = number(owner, name, value)
    if finite and not math.isfinite(x):
        raise ValueError(f"{owner}: {name} must be finite, got {value}")
    if not ((low is None or (x > low if low_open else x >= low))
            and (high is None or (x < high if high_open else x <= high))):
        raise ValueError(f"{owner}: {name} must be "
                         f"{_interval(low, high, low_open, high_open)}, got {value}")
    return x


def _interval(low, high, low_open, high_open):
    """The bounds in words: "in [0, 1)", ">= 0", "< 1"."""
    if high is None:
        return f"{'>' if low_open else '>='} {low}"
    if low is None:
        return f"{'<' if high_open else '<='} {high}"
    return f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"


def count(owner, name, value, low=0):
    """``value`` as an int >= ``low``; TypeError for a float (2.0 and 2.5 alike) or a bool."""
    if is_integer(value) and value >= low:
        return int(value)
    wanted = "a positive integer" if low == 1 else f"an integer >= {low}"
    if not is_integer(value):
        raise TypeError(f"{owner}: {name} must be {wanted}, got {type(value).__name__} "
                        f"{value!r}")
    raise ValueError(f"{owner}: {name} must be {wanted}, got {value}")


def flag(owner, name, value):
    """``value`` as a bool; TypeError unless it is True or False (a NumPy bool included)."""
    if value is True or value is False or isinstance(value, numpy.bool_):
        return bool(value)
    raise TypeError(f"{owner}: {name} must be True or False, got {type(value).__name__} "
                    f"{value!r}")
