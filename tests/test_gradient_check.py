import numpy as np
import pytest

import nnkit as nn
from tests.conftest import var64


class WrongTanh(nn.NetOp):
    """Tanh with a deliberately wrong derivative (1 − y instead of 1 − y²).

    y = tanh(x)
    dx = g · (1 − y)
    """

    def __init__(self, x):
        super().__init__(np.tanh(x.data), x)

    def _back(self, x):
        x.g += self.g * (1 - self.data)


def test_gradcheck_passes_correct_ops(rng):
    assert nn.gradcheck(nn.Tanh, var64(rng, 3, 3))


def test_gradcheck_names_input_and_worst_element(rng):
    x = var64(rng, 2, 3, name="hidden")
    with pytest.raises(nn.GradcheckError, match=r"input 0 'hidden' of shape \(2, 3\): worst "
                                                r"element \(\d, \d\) has analytic"):
        nn.gradcheck(WrongTanh, x)
    assert nn.gradcheck(WrongTanh, x, raise_on_error=False) is False


def test_gradcheck_requires_float64(rng):
    with pytest.raises(TypeError, match="float64"):
        nn.gradcheck(nn.Tanh, nn.NetVar([1.0, 2.0]))


def test_gradcheck_leaves_inputs_unchanged(rng):
    x = var64(rng, 3, 2)
    before = x.data.copy()
    nn.gradcheck(lambda v: nn.Exp(v).sum(), x)
    np.testing.assert_array_equal(x.data, before)


@pytest.mark.parametrize("options, message", [
    (dict(eps=float("nan")), r"gradcheck: eps must be a finite number > 0, got nan"),   # passed
    (dict(eps=0), r"eps must be a finite number > 0, got 0"),
    (dict(atol=-1e-6), r"atol must be a finite number >= 0, got -1e-06"),
    (dict(rtol=float("inf")), r"rtol must be a finite number >= 0, got inf"),
    (dict(eps="1e-6"), r"eps must be a finite number > 0, got '1e-6'")])
def test_gradcheck_refuses_tolerances_that_would_check_nothing(options, message, rng):
    x = var64(rng, 2, 2)
    with pytest.raises(ValueError, match=message):
        nn.gradcheck(nn.Tanh, x, **options)


def test_gradcheck_refuses_calls_with_nothing_to_check(rng):
    with pytest.raises(ValueError, match=r"gradcheck: no input requires a gradient"):
        nn.gradcheck(nn.Tanh, var64(rng, 2, 2, requires_grad=False))
    with pytest.raises(TypeError, match=r"gradcheck: f must return a node, got ndarray"):
        nn.gradcheck(lambda a: a.data * 2, var64(rng, 2, 2))


def test_a_strided_input_is_perturbed_in_place_not_in_a_copy():
    # x.T's reshape(-1) was a copy: every numeric derivative came out 0, a false failure
    x = nn.NetVar(np.arange(6.0).reshape(3, 2).T)
    assert not x.data.flags.c_contiguous
    assert nn.gradcheck(lambda v: v * v, x)


def test_gradcheck_leaves_inputs_and_their_gradients_as_they_were():
    x = nn.NetVar(np.array([[1.0, 2.0]]))
    x.g = np.array([[5.0, 6.0]])                       # a gradient the user accumulated
    assert nn.gradcheck(lambda v: v * 3.0, x)
    np.testing.assert_array_equal(x.g, [[5.0, 6.0]])
    calls = []

    def fails_later(v):
        calls.append(1)
        if len(calls) > 2:
            raise RuntimeError("boom")
        return v * 3.0

    with pytest.raises(RuntimeError, match="boom"):
        nn.gradcheck(fails_later, x)
    np.testing.assert_array_equal(x.data, [[1.0, 2.0]])     # not left perturbed


class _NaNBack(nn.NetOp):
    def __init__(self, x):
        super().__init__(x.data * 2, x)

    def _back(self, x):
        x.g += self.g * np.nan


class _Assigns(nn.NetOp):
    """y = 2x, whose _back assigns x.g instead of adding to it."""
    def __init__(self, x):
        super().__init__(x.data * 2, x)

    def _back(self, x):
        x.g = self.g * 2


class _EditsUpstream(nn.NetOp):
    """y = 2x, whose _back scales the upstream gradient in place (its consumer's array)."""
    def __init__(self, x):
        super().__init__(x.data * 2, x)

    def _back(self, x):
        self._g *= 3
        x.accumulate(self._g * 2)


def test_gradcheck_fails_a_nan_gradient():
    # |NaN − n| > tolerance is False: a NaN analytic gradient passed as "0 of 2 wrong"
    x = nn.NetVar(np.array([[0.5, -1.0]]))
    with pytest.raises(nn.GradcheckError, match=r"analytic nan"):
        nn.gradcheck(_NaNBack, x)


def test_gradcheck_fails_an_op_that_assigns_its_inputs_gradient():
    # grad() and the finite differences start every input from no gradient, where x.g = ...
    # gives the right value; back() onto a gradient the input holds loses it (2x + x gave 2)
    x = nn.NetVar(np.array([[0.5, -1.0]]))
    with pytest.raises(nn.GradcheckError, match=r"what back\(\) added to a gradient the "
                                                r"input held"):
        nn.gradcheck(_Assigns, x)
    assert x._g is None


def test_grad_copies_its_seed_and_gradcheck_catches_an_edited_upstream_gradient():
    # grad(g=seed) handed the caller's array to the root: an op editing self.g in place
    # changed gradcheck's weights too, and passed
    x = nn.NetVar(np.array([[0.5, -1.0]]))
    seed = np.ones((1, 2))
    nn.grad(_EditsUpstream(x), [x], g=seed)
    np.testing.assert_array_equal(seed, np.ones((1, 2)))
    with pytest.raises(nn.GradcheckError):
        nn.gradcheck(_EditsUpstream, x)


def test_gradcheck_of_a_function_that_takes_a_gradient_itself():
    # a gradient penalty: the finite differences ran f under no_grad(), where grad() refused
    def penalty(x):
        (gx,) = nn.grad((x * x * x).sum(), [x], create_graph=True)
        return (gx * gx).sum()

    assert nn.gradcheck(penalty, nn.NetVar(np.array([[0.5, -1.0, 2.0]])))
