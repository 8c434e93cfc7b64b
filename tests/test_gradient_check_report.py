"""The learner's side of gradcheck: analytic vs numeric gradients, side by side."""
import numpy as np
import pytest

import nnkit as nn
from nnkit.gradcheck import GradcheckReport
from tests.conftest import var64
from tests.test_gradient_check import WrongTanh


class HalfWrongMultiply(nn.NetOp):
    """x @ w with the gradient of w right and that of x's second column doubled.

    y = x @ w
    dx = g @ wᵀ  (but column 1 doubled: the bug), dw = xᵀ @ g
    """

    def __init__(self, x, w):
        super().__init__(x.data @ w.data, x, w)

    def _back(self, x, w):
        dx = self.g @ w.data.T
        dx[:, 1] *= 2
        x.g += dx
        w.g += x.data.T @ self.g


def test_verbose_report_marks_exactly_the_wrong_elements(rng, capsys):
    x, w = var64(rng, 2, 3, name="x"), var64(rng, 3, 2, name="w")
    with pytest.raises(nn.GradcheckError) as caught:
        nn.gradcheck(HalfWrongMultiply, x, w, verbose=True)
    printed = capsys.readouterr().out
    assert printed == str(caught.value.report) + "\n"
    assert "input 0 'x' of shape (2, 3): 2 of 6 elements wrong" in printed
    assert "input 1 'w' of shape (3, 2): 0 of 6 elements wrong" in printed
    wrong = [line.split()[0] + line.split()[1] for line in printed.splitlines()
             if line.endswith("<-- wrong")]
    assert wrong == ["(0,1)", "(1,1)"]
    assert str(caught.value).startswith("gradcheck: input 0 'x' of shape (2, 3): worst element (")


def test_report_values_are_the_two_gradients(rng):
    x = var64(rng, 2, 2)
    with pytest.raises(nn.GradcheckError) as caught:
        nn.gradcheck(WrongTanh, x)
    report = caught.value.report
    assert not report.ok and not report
    entry = report.inputs[0]
    y = np.tanh(x.data)
    np.testing.assert_allclose(entry.numeric / entry.analytic, (1 + y), rtol=1e-6)
    page = report._repr_html_()
    assert page.count("<tr style=") == entry.wrong == 4 and "analytic" in page


def test_verbose_ok_report_and_skipped_inputs(rng, capsys):
    x = var64(rng, 1, 3)
    c = var64(rng, 1, 3, requires_grad=False)
    assert nn.gradcheck(lambda a, b: a * b, x, c, verbose=True) is True
    printed = capsys.readouterr().out
    assert printed.startswith("gradcheck: OK")
    assert "input 1 of shape (1, 3): needs no gradient (not checked)" in printed
    assert "<-- wrong" not in printed


def test_large_inputs_list_only_the_worst(rng):
    x = var64(rng, 10, 10)
    with pytest.raises(nn.GradcheckError) as caught:
        nn.gradcheck(WrongTanh, x)
    report = caught.value.report
    assert isinstance(report, GradcheckReport)
    text = str(report)
    assert "(the 24 worst elements)" in text and text.count("<-- wrong") == 24
