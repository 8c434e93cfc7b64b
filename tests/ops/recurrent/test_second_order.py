"""Second derivatives of the fused recurrent ops (RNN, LSTM, GRU) and their final states
(``grad(create_graph=True)``), which go through the same recurrence unrolled into cells.

test_gradgradcheck_every_op checks each op against finite differences; these check that the
unrolled loop has the fused op's values (ragged lengths, initial states, padding), second-order
quantities against PyTorch's double backward in float64 (an LSTM with its final states, a
gradient penalty through a GRU), and the final states' second derivatives.
"""
import numpy as np
import pytest

import nnkit as nn
from tests.conftest import var64
from tests.ops.recurrent.test_fused import fused, params as recurrent_params

torch = pytest.importorskip("torch")

T, B, F, H = 4, 3, 2, 3
RAGGED = [2, 4, 1]          # a full-length sequence, a length-1 one, and padding
KINDS = ["rnn-tanh", "rnn-relu", "rnn-sigmoid", "rnn-linear", "lstm", "gru"]


def params(rng, kind):
    return recurrent_params(rng, kind, F=F, H=H)


# ----------------------------------------------------------------------------- values

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("lengths", [RAGGED, None, [2, 1, 2]], ids=["ragged", "dense", "short"])
@pytest.mark.parametrize("state", ["none", "rows", "shared"])
def test_unrolled_cells_give_the_fused_values(kind, lengths, state, rng):
    x = var64(rng, T, B, F)
    W, R, b = params(rng, kind)
    rows = {"none": None, "rows": B, "shared": 1}[state]
    h0 = var64(rng, rows, H) if rows else None
    c0 = var64(rng, rows, H) if rows and kind == "lstm" else None
    if lengths is not None:
        x.data[np.arange(T)[:, None] >= np.array(lengths)] = np.nan   # padding is never read
    op = fused(kind, x, W, R, b, h0, c0, lengths)
    y, h, c = op._unrolled(*op.parents)
    np.testing.assert_allclose(y.data, op.data, rtol=0, atol=1e-12)
    np.testing.assert_allclose(h.data, op.final.data, rtol=0, atol=1e-12)
    if kind == "lstm":
        np.testing.assert_allclose(c.data, op.final_c.data, rtol=0, atol=1e-12)
    if lengths is not None:
        assert np.all(y.data[np.arange(T)[:, None] >= np.array(lengths)] == 0)
    composite = op._composite(*op.parents)      # the LSTM's: its outputs y and final_c
    if kind == "lstm":
        composite, c_again = composite
        np.testing.assert_array_equal(c_again.data, c.data)
    np.testing.assert_array_equal(composite.data, y.data)
    rebuilt = op.final._composite(*op.final.parents)    # final_c is the op's output 1: above
    np.testing.assert_allclose(rebuilt.data, op.final.data, rtol=0, atol=1e-12)
    # NaN padding reaches no gradient through the composite either
    for g in nn.grad(op.sum() * op.sum(), [W, R, b], create_graph=True):
        assert np.isfinite(nn.grad((g * g).sum(), [W])[0]).all()


def test_final_c_is_the_ops_output_1_and_final_h_a_node_of_its_outputs(rng):
    x = var64(rng, T, B, F)
    W, R, b = params(rng, "lstm")
    h0, c0 = var64(rng, B, H), var64(rng, 1, H)
    op = nn.LSTM(x, W, R, b, h0, c0, lengths=RAGGED)
    assert op.final.parents == (op,) and not isinstance(op.final, nn.core.Output)
    assert op.final_c.parents == (op,) and isinstance(op.final_c, nn.core.Output)
    assert op.final_c.k == 1 and op.n_outputs == 2
    # first order through the op's BPTT (the inputs' share comes from the op alone), and the
    # same gradient from the graph of the unrolled cells
    arrays = nn.grad((op.final_c * op.final_c).sum(), [x, W, R, b, h0, c0])
    nodes = nn.grad((op.final_c * op.final_c).sum(), [x, W, R, b, h0, c0], create_graph=True)
    for array, node in zip(arrays, nodes):
        np.testing.assert_allclose(node.data, array, rtol=1e-12, atol=1e-14)
    assert np.all(arrays[0][np.arange(T)[:, None] >= np.array(RAGGED)] == 0)


# ----------------------------------------------------------------------------- PyTorch parity

def torch_layer(kind, W, R, b):
    """A PyTorch layer holding nnkit's weights (float64)."""
    layer = (torch.nn.LSTM(F, H) if kind == "lstm" else torch.nn.GRU(F, H)).double()
    with torch.no_grad():
        layer.weight_ih_l0.copy_(torch.tensor(W.T))
        layer.weight_hh_l0.copy_(torch.tensor(R.T))
        if kind == "gru":
            layer.bias_ih_l0.copy_(torch.tensor(b[0]))
            layer.bias_hh_l0.copy_(torch.tensor(b[1]))
        else:                                  # nnkit's one bias is PyTorch's two summed
            layer.bias_ih_l0.copy_(torch.tensor(b))
            layer.bias_hh_l0.zero_()
    return layer


def torch_run(layer, x, lengths, state):
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor(lengths),
                                                     enforce_sorted=False)
    out, final = layer(packed, state)
    y, _ = torch.nn.utils.rnn.pad_packed_sequence(out, total_length=x.shape[0])
    return y, final


def torch_weight_grads(kind, layer):
    dW, dR = layer.weight_ih_l0.grad.numpy().T, layer.weight_hh_l0.grad.numpy().T
    bi, bh = layer.bias_ih_l0.grad.numpy(), layer.bias_hh_l0.grad.numpy()
    return dW, dR, np.stack([bi, bh]) if kind == "gru" else bi


def test_lstm_gradient_norm_matches_torch(rng):
    """∇ of ‖∂s/∂x‖², s = Σ y·gy + Σ h_T·gh + Σ c_T·gc, with ragged lengths and initial
    states: every input's second derivative, final states included."""
    x, W, R, b, h0, c0 = (rng.standard_normal(s) for s in
                          ((T, B, F), (F, 4 * H), (H, 4 * H), (4 * H,), (B, H), (B, H)))
    gy, gh, gc = (rng.standard_normal(s) for s in ((T, B, H), (B, H), (B, H)))

    nodes = [nn.NetVar(a) for a in (x, W, R, b, h0, c0)]
    op = nn.LSTM(*nodes, lengths=RAGGED)
    s = (op * gy).sum() + (op.final * gh).sum() + (op.final_c * gc).sum()
    dx = nn.grad(s, nodes[0], create_graph=True)[0]
    mine = nn.grad((dx * dx).sum(), nodes)

    layer = torch_layer("lstm", W, R, b)
    xt, h0t, c0t = (torch.tensor(a, requires_grad=True) for a in (x, h0[None], c0[None]))
    y, (hT, cT) = torch_run(layer, xt, RAGGED, (h0t, c0t))
    s = (y * torch.tensor(gy)).sum() + (hT[0] * torch.tensor(gh)).sum() + \
        (cT[0] * torch.tensor(gc)).sum()
    dxt, = torch.autograd.grad(s, xt, create_graph=True)
    np.testing.assert_allclose(dx.data, dxt.detach().numpy(), rtol=1e-9, atol=1e-12)
    (dxt * dxt).sum().backward()
    dW, dR, db = torch_weight_grads("lstm", layer)
    expected = [xt.grad.numpy(), dW, dR, db, h0t.grad.numpy()[0], c0t.grad.numpy()[0]]
    for m, e in zip(mine, expected):
        assert np.abs(e).max() > 1e-3          # a second-order term that a bug would change
        np.testing.assert_allclose(m.reshape(e.shape), e, rtol=1e-9, atol=1e-12)   # b is a row


def test_gru_gradient_penalty_matches_torch(rng):
    """A WGAN-GP style penalty Σ_b (‖∂D/∂x_b‖ − 1)² of a critic D = final h · v through a
    ragged GRU, and its gradient for the weights."""
    x, W, R, b, v = (rng.standard_normal(s) for s in
                     ((T, B, F), (F, 3 * H), (H, 3 * H), (2, 3 * H), (H, 1)))

    X, Wn, Rn, bn = (nn.NetVar(a) for a in (x, W, R, b))
    critic = (nn.GRU(X, Wn, Rn, bn, lengths=RAGGED).final @ v).sum()
    dx = nn.grad(critic, X, create_graph=True)[0]
    norms = ((dx * dx).sum(axis=(0, 2)) + 1e-12) ** 0.5
    penalty = ((norms - 1) ** 2).sum()
    mine = nn.grad(penalty, [Wn, Rn, bn])

    layer = torch_layer("gru", W, R, b)
    xt = torch.tensor(x, requires_grad=True)
    _, hT = torch_run(layer, xt, RAGGED, None)
    dxt, = torch.autograd.grad((hT[0] @ torch.tensor(v)).sum(), xt, create_graph=True)
    norms_t = ((dxt * dxt).sum(dim=(0, 2)) + 1e-12) ** 0.5
    penalty_t = ((norms_t - 1) ** 2).sum()
    np.testing.assert_allclose(penalty.data.item(), penalty_t.item(), rtol=1e-12)
    penalty_t.backward()
    for m, e in zip(mine, torch_weight_grads("gru", layer)):
        assert np.abs(e).max() > 1e-3
        np.testing.assert_allclose(m, e, rtol=1e-9, atol=1e-12)


# ----------------------------------------------------------------------------- final states

@pytest.mark.parametrize("kind", ["rnn-tanh", "lstm", "gru"])
def test_final_states_second_order(kind, rng):
    """The outputs and final states together, a final state read by three consumers, shared
    (1, H) initial states: against finite differences of the first derivatives."""
    x = var64(rng, T, B, F)
    W, R, b = params(rng, kind)
    h0 = var64(rng, 1, H)
    c0 = var64(rng, 1, H)

    def f(x, W, R, b, h0, c0):
        op = fused(kind, x, W, R, b, h0, c0 if kind == "lstm" else None, RAGGED)
        h = op.final
        total = (op * op).sum() + (h * h.tanh()).sum() + h.sum(axis=0, keepdims=True)
        return total + (op.final_c * h).sum() if kind == "lstm" else total

    inputs = (x, W, R, b, h0, c0) if kind == "lstm" else (x, W, R, b, h0)
    assert nn.gradgradcheck(lambda *a: f(*a, *([None] * (6 - len(a)))), *inputs)


def test_final_state_as_the_input_of_grad(rng):
    """grad with respect to a final state itself, then through it to the weights."""
    x = var64(rng, T, B, F)
    W, R, b = params(rng, "lstm")
    op = nn.LSTM(x, W, R, b, lengths=RAGGED)
    c = op.final_c
    dc = nn.grad((c * c * c).sum(), c, create_graph=True)[0]    # 3 c²
    np.testing.assert_allclose(dc.data, 3 * c.data ** 2, rtol=1e-14)
    dW = nn.grad(dc.sum(), W)[0]
    expected = nn.grad((3 * op.final_c * op.final_c).sum(), W)[0]
    assert np.abs(expected).max() > 1e-3
    np.testing.assert_allclose(dW, expected, rtol=1e-10, atol=1e-14)


def test_only_final_states_used(rng):
    """Second derivatives through final h and c alone (the outputs get no gradient)."""
    x = var64(rng, T, B, F)
    W, R, b = params(rng, "lstm")

    def f(x, W):
        op = nn.LSTM(x, W, R, b, lengths=RAGGED)
        return op.final * op.final_c
    assert nn.gradgradcheck(f, x, W)
