"""The cells (one step from ordinary ops) against the fused recurrent ops they unroll."""
import numpy as np
import pytest

import nnkit as nn
from tests.conftest import var64
from tests.ops.recurrent.test_fused import B, F, H, KINDS, T, fused, params


def unrolled(kind, xs, W, R, b, h0, c0, lengths):
    """A loop of cells over a ragged batch: rows past their length keep their state (masking)."""
    lengths = np.asarray(lengths)
    h, c = h0, c0
    outputs = []
    for t, x_t in enumerate(xs):
        m = nn.constant((t < lengths)[:, None].astype(np.float64))
        keep = nn.constant(1.0 - m.data)
        if kind == "lstm":
            h_new, c_new = nn.LSTMCell(x_t, h, c, W, R, b)
            c = m * c_new + keep * c
        elif kind == "gru":
            h_new = nn.GRUCell(x_t, h, W, R, b)
        else:
            h_new = nn.RNNCell(x_t, h, W, R, b, activation=kind.split("-")[1])
        h = m * h_new + keep * h
        outputs.append(m * h_new)
    return outputs, h, c


@pytest.mark.parametrize("kind", KINDS)
def test_fused_equals_unrolled_cells(kind, rng):
    lengths = [3, 5, 1, 5]
    x = var64(rng, T, B, F)
    W, R, b = params(rng, kind)
    h0 = var64(rng, B, H)
    c0 = var64(rng, B, H)
    gy, gh, gc = (rng.standard_normal(s) for s in ((T, B, H), (B, H), (B, H)))

    op = fused(kind, x, W, R, b, h0, c0 if kind == "lstm" else None, lengths)
    total = (op * gy).sum() + (op.final * gh).sum()
    if kind == "lstm":
        total = total + (op.final_c * gc).sum()
    total.back()
    fused_grads = [p.g.copy() for p in (x, W, R, b, h0, c0)]
    for p in (x, W, R, b, h0, c0):
        p.reset()

    xs = [nn.NetVar(x.data[t]) for t in range(T)]
    outputs, h, c = unrolled(kind, xs, W, R, b, h0, c0, lengths)
    total = (h * gh).sum()
    for t, y_t in enumerate(outputs):
        np.testing.assert_allclose(y_t.data, op.data[t], rtol=0, atol=1e-10)
        total = total + (y_t * gy[t]).sum()
    np.testing.assert_allclose(h.data, op.final.data, rtol=0, atol=1e-10)
    if kind == "lstm":
        np.testing.assert_allclose(c.data, op.final_c.data, rtol=0, atol=1e-10)
        total = total + (c * gc).sum()
    total.back()
    np.testing.assert_allclose(np.stack([x_t.g for x_t in xs]), fused_grads[0], rtol=0,
                               atol=1e-10)
    for p, expected in zip((W, R, b, h0, c0), fused_grads[1:]):
        np.testing.assert_allclose(p.g, expected, rtol=0, atol=1e-10)
    assert np.abs(fused_grads[1]).max() > 0.1     # the comparison is not vacuous


@pytest.mark.parametrize("kind", ["rnn-tanh", "lstm", "gru"])
@pytest.mark.parametrize("state_rows", [2, 1])        # 1: one state broadcast over the rows
def test_cells_gradcheck(kind, state_rows, rng):
    x, h, c = var64(rng, 2, F), var64(rng, state_rows, H), var64(rng, state_rows, H)
    W, R, b = params(rng, kind)
    if kind == "lstm":
        assert nn.gradcheck(lambda *a: nn.LSTMCell(*a)[0] + nn.LSTMCell(*a)[1] * 2,
                            x, h, c, W, R, b)
    elif kind == "gru":
        assert nn.gradcheck(nn.GRUCell, x, h, W, R, b)
    else:
        assert nn.gradcheck(nn.RNNCell, x, h, W, R, b)


def test_ten_thousand_steps_fused_and_unrolled(rng):
    steps = 10_000
    x = var64(rng, steps, 1, 1)
    W, R, b = params(rng, "rnn-tanh", F=1, H=2)
    op = nn.RNN(x, W, R, b)
    op.final.sum().back()
    fused_grad = W.g.copy()
    assert np.isfinite(fused_grad).all() and np.abs(fused_grad).max() > 0
    W.reset()
    h = nn.constant(np.zeros((1, 2)))
    for t in range(steps):
        h = nn.RNNCell(nn.constant(x.data[t]), h, W, R, b)
    np.testing.assert_allclose(h.data, op.final.data, atol=1e-10)
    h.sum().back()
    np.testing.assert_allclose(W.g, fused_grad, atol=1e-8)


def test_cell_bad_input_errors_name_cell_argument_and_shapes(rng):
    x, h = var64(rng, 2, F), var64(rng, 2, H)
    W, R, b = params(rng, "rnn-tanh")
    with pytest.raises(ValueError, match=r"RNNCell: x, h, W and R must be 2-D, got shapes "
                                         r"\(1, 2, 2\), \(2, 3\)"):
        nn.RNNCell(var64(rng, 1, 2, F), h, W, R, b)
    with pytest.raises(ValueError, match=r"RNNCell: b of shape \(1, 4\) must be \(3,\) or "
                                         r"\(1, 3\) for H = 3"):
        nn.RNNCell(x, h, W, R, var64(rng, 1, 4))
    with pytest.raises(ValueError, match=r"RNNCell: activation must be one of"):
        nn.RNNCell(x, h, W, R, b, activation="softsign")
    with pytest.raises(TypeError, match=r"RNNCell: b must be a NetVar or an array, got list"):
        nn.RNNCell(x, h, W, R, [0.0] * H)
    Wg, Rg, _ = params(rng, "gru")
    with pytest.raises(ValueError, match=r"GRUCell: b of shape \(3, 9\) must be \(2, 9\) "
                                         r"for H = 3"):
        nn.GRUCell(x, h, Wg, Rg, var64(rng, 3, 9))
    Wl, Rl, bl = params(rng, "lstm")
    with pytest.raises(ValueError, match=r"LSTMCell: c of shape \(3, 3\) must be \(B, H\) = "
                                         r"\(2, 3\) or \(1, 3\)"):
        nn.LSTMCell(x, h, var64(rng, 3, H), Wl, Rl, bl)
    h_new, c_new = nn.LSTMCell(x, var64(rng, 1, H), var64(rng, 1, H), Wl, Rl, bl)
    assert h_new.shape == c_new.shape == (2, H)      # (1, H) states are shared by every row


def test_graph_drawing_marks_fused_ops_only(rng):
    x, h = var64(rng, 2, F), var64(rng, 2, H)
    W, R, b = params(rng, "lstm")
    h_new, c_new = nn.LSTMCell(x, h, h, W, R, b)
    cell = nn.draw((h_new + c_new).sum()).source
    assert "box3d" not in cell and "T=" not in cell          # a cell is ordinary ops
    layer = nn.draw(nn.LSTM(var64(rng, T, B, F), W, R, b).final.sum()).source
    assert layer.count("box3d") == 1 and "LSTM  T=5" in layer


def test_cells_refuse_a_state_tuple_where_one_state_is_expected(rng):
    x, h, c = var64(rng, 2, F), var64(rng, 2, H), var64(rng, 2, H)
    Wl, Rl, bl = params(rng, "lstm")
    with pytest.raises(TypeError, match=r"LSTMCell: h must be a NetVar or an array, got tuple"):
        nn.LSTMCell(x, (h, c), c, Wl, Rl, bl)
    Wg, Rg, bg = params(rng, "gru")
    with pytest.raises(TypeError, match=r"GRUCell: h must be a NetVar or an array, got tuple"):
        nn.GRUCell(x, nn.LSTMCell(x, h, c, Wl, Rl, bl), Wg, Rg, bg)


def test_the_old_module_name_of_the_cells_warns_and_gives_the_same_cells():
    import importlib
    import sys
    sys.modules.pop("nnkit.ops.cells", None)
    with pytest.warns(DeprecationWarning, match=r"nnkit\.ops\.cells is deprecated: import RNNCell"
                                                r", LSTMCell and GRUCell from nnkit\.ops\.recurrent"):
        old = importlib.import_module("nnkit.ops.cells")
    assert (old.RNNCell, old.LSTMCell, old.GRUCell) == (nn.RNNCell, nn.LSTMCell, nn.GRUCell)


def test_the_old_module_of_the_cells_is_an_attribute_of_nnkit_ops_as_it_was():
    # nnkit.ops imported its cells module, so nn.ops.cells.LSTMCell worked after `import
    # nnkit`; the moved module must still be reached that way (with its warning)
    import sys
    sys.modules.pop("nnkit.ops.cells", None)
    vars(nn.ops).pop("cells", None)
    with pytest.warns(DeprecationWarning, match=r"nnkit\.ops\.cells is deprecated"):
        old = nn.ops.cells
    assert old.LSTMCell is nn.LSTMCell
    with pytest.raises(AttributeError, match="no_such_name"):
        nn.ops.no_such_name


@pytest.mark.parametrize("name", ["rnn", "lstm", "gru"])
def test_the_cell_registry_gives_each_kinds_op_cell_and_sizes(name, rng):
    from nnkit.ops.recurrent import CELLS
    entry = CELLS[name]
    W, R, b = (nn.NetVar(a) for a in nn.recurrent_weights(name, F, H, seed=0))
    assert W.shape == (F, entry.gates * H) and R.shape == (H, entry.gates * H)
    x = var64(rng, 1, B, F)
    op = entry.op(x, W, R, b)
    h0 = nn.constant(np.zeros((B, H)))
    step = entry.cell(x[0], h0, h0, W, R, b) if entry.states == 2 else entry.cell(x[0], h0, W, R, b)
    h = step[0] if entry.states == 2 else step
    np.testing.assert_allclose(h.data, op.data[0], rtol=1e-12, atol=1e-14)
    assert sorted(CELLS) == ["gru", "lstm", "rnn"]
