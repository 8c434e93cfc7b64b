"""detect_anomaly(): the first op whose forward value or backward contribution holds a NaN or Inf
is named (class, creation index, input shapes); nothing is checked, or even called, when off."""
import re

import numpy as np
import pytest

import nnkit as nn
from nnkit import core, instrument

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _index_of_next_node():
    probe = nn.NetVar([0.0])
    return probe.index + 1


def test_forward_nan_names_the_op_its_index_and_input_shapes():
    x = nn.NetVar(np.array([[1.0, -2.0]]))
    with nn.detect_anomaly():
        h = x * 2.0
        expected = _index_of_next_node()
        with pytest.raises(nn.AnomalyError,
                           match=rf"forward of Log #{expected} \(inputs of shapes \(1, 2\)\) "
                                 r"produced NaN or Inf"):
            nn.Tanh(nn.Log(h))
    assert np.isnan(nn.Log(h).data[0, 1])      # outside the mode: NaN, as NumPy, no error


def test_forward_inf_in_a_binary_op_lists_both_input_shapes():
    a = nn.NetVar(np.ones((2, 3)))
    b = nn.NetVar(np.array([[1.0, 0.0, 2.0]]))
    with nn.detect_anomaly():
        with pytest.raises(nn.AnomalyError,
                           match=r"forward of Div #\d+ \(inputs of shapes \(2, 3\), \(1, 3\)\)"):
            a / b
        with pytest.raises(nn.AnomalyError, match=r"forward of Exp #\d+"):
            nn.Exp(a * 1000.0)


def test_only_the_op_where_nan_appears_raises_not_its_consumers():
    x = nn.NetVar(np.array([[-1.0, 1.0]]))
    y = nn.Log(x)                          # NaN made outside the mode
    with nn.detect_anomaly():
        z = nn.Tanh(y) + 1.0               # consumers of an existing NaN do not raise
        assert np.isnan(z.data[0, 0])
        nan_leaf = nn.NetVar(np.array([[np.nan, 1.0]]))
        y = nn.Sigmoid(nan_leaf)           # nor do consumers of NaN data given by the user
        assert np.isnan(y.data[0, 0]) and np.isfinite(y.data[0, 1])


def test_backward_inf_names_the_op_whose_rule_made_it():
    x = nn.NetVar(np.array([[0.0, 4.0]]))
    with nn.detect_anomaly():
        h = x * 1.0
        root = nn.Sum(nn.Pow(h, 0.5))        # forward is finite: sqrt(0) = 0
        with pytest.raises(nn.AnomalyError) as caught:
            root.back()
    message = str(caught.value)
    assert re.search(r"backward of Pow #\d+ \(inputs of shapes \(1, 2\)\) gave a NaN or Inf "
                     r"gradient to input 0", message), message
    assert "Mul" not in message and "Sum" not in message


def test_backward_nan_through_fan_out_names_the_first_op():
    x = nn.NetVar(np.array([[0.0, 1.0]]))
    with nn.detect_anomaly():
        s = nn.Pow(x, 0.5)
        root = nn.Sum(s * s + nn.Tanh(s))    # s is used three times
        with pytest.raises(nn.AnomalyError, match=r"backward of Pow #%d " % s.index):
            root.back()


def test_a_gradient_already_nan_before_back_is_named_as_stale_not_blamed_on_an_op():
    # w.g NaN from an earlier back() (no reset): the first op adding to it was blamed
    w = nn.NetVar(np.array([[1.0, 2.0]]))
    w.g = np.array([[np.nan, 0.0]])
    with nn.detect_anomaly():
        loss = (w * 3.0).sum()
        with pytest.raises(nn.AnomalyError, match=r"input 0 of Mul #\d+ \(NetVar #\d+ of shape "
                                                  r"\(1, 2\)\) held a NaN or Inf gradient before "
                                                  r"this backward pass reached it"):
            loss.back()
        w.reset()
        loss.back()                             # reset: no anomaly
    np.testing.assert_array_equal(w.g, [[3.0, 3.0]])


def test_anomaly_is_a_floating_point_error_and_the_mode_is_restored():
    assert issubclass(nn.AnomalyError, FloatingPointError)
    x = nn.NetVar(np.array([[-1.0]]))
    with pytest.raises(FloatingPointError):
        with nn.detect_anomaly():
            nn.Log(x)
    assert not core.anomaly_mode() and not core.observers
    with nn.detect_anomaly():
        with nn.detect_anomaly(False):
            nn.Log(x)                      # switched off inside
        with pytest.raises(nn.AnomalyError):
            nn.Log(x)
    assert not core.anomaly_mode() and not core.observers


def test_anomaly_with_trace_still_checks():
    x = nn.NetVar(np.array([[0.0, 1.0]]))
    with nn.detect_anomaly():
        root = nn.Sum(nn.Pow(x, 0.5))
        with pytest.raises(nn.AnomalyError, match="backward of Pow"):
            root.back(trace=True)


def test_finite_graph_passes_and_gives_the_same_gradients():
    rng = np.random.default_rng(0)
    w = nn.NetVar(rng.standard_normal((3, 4)))
    x = nn.NetVar(rng.standard_normal((2, 3)), requires_grad=False)
    nn.SoftmaxCELoss(nn.Tanh(x @ w), np.array([0, 3])).back()
    plain = w.g.copy()
    w.reset()
    with nn.detect_anomaly():
        nn.SoftmaxCELoss(nn.Tanh(x @ w), np.array([0, 3])).back()
    np.testing.assert_array_equal(w.g, plain)


def test_off_by_default_and_costs_no_check(monkeypatch):
    def called(*args):
        raise AssertionError("an anomaly check ran with detect_anomaly off")

    monkeypatch.setattr(instrument, "check_forward", called)
    monkeypatch.setattr(instrument, "nonfinite", called)
    monkeypatch.setattr(instrument, "check_fingerprint", called)
    x = nn.NetVar(np.array([[-1.0, 0.0]]))
    y = nn.Sum(nn.Pow(x, 0.5) + nn.Log(x))   # NaN and -inf forward, inf backward
    y.back()
    assert np.isnan(y.data) and not np.isfinite(x.g).all()
