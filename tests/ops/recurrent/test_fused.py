import numpy as np
import pytest

import nnkit as nn
from tests.conftest import var64

T, B, F, H = 5, 4, 2, 3
RAGGED = [3, 5, 1, 4]          # includes a length-1 and a full-length sequence
KINDS = ["rnn-tanh", "rnn-relu", "rnn-sigmoid", "rnn-linear", "lstm", "gru"]


def params(rng, kind, F=F, H=H):
    k = {"lstm": 4, "gru": 3}.get(kind, 1)
    W = var64(rng, F, k * H, name="W")
    R = var64(rng, H, k * H, name="R")
    R.data *= 0.5
    b = var64(rng, 2, 3 * H, name="b") if kind == "gru" else var64(rng, k * H, name="b")
    return W, R, b


def fused(kind, x, W, R, b, h0=None, c0=None, lengths=None):
    if kind == "lstm":
        return nn.LSTM(x, W, R, b, h0=h0, c0=c0, lengths=lengths)
    if kind == "gru":
        return nn.GRU(x, W, R, b, h0=h0, lengths=lengths)
    return nn.RNN(x, W, R, b, h0=h0, lengths=lengths, activation=kind.split("-")[1])


# ----------------------------------------------------------------------------- gradients

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("lengths", [RAGGED, None, [1, 1, 1, 1]])
def test_gradcheck_outputs_and_final_states(kind, lengths, rng):
    x = var64(rng, T, B, F, name="x")
    W, R, b = params(rng, kind)
    h0 = var64(rng, B, H, name="h0")
    c0 = var64(rng, B, H, name="c0") if kind == "lstm" else None
    states = (h0, c0) if c0 is not None else (h0,)

    def outputs(x, W, R, b, h0, c0=None):
        return fused(kind, x, W, R, b, h0, c0, lengths)

    def final(x, W, R, b, h0, c0=None):
        return fused(kind, x, W, R, b, h0, c0, lengths).final

    def both(x, W, R, b, h0, c0=None):    # outputs and final state used together
        op = fused(kind, x, W, R, b, h0, c0, lengths)
        total = op.sum() + (op.final * op.final).sum()
        return total + op.final_c.sum() * 3 if kind == "lstm" else total

    for f in (outputs, final, both):
        assert nn.gradcheck(f, x, W, R, b, *states)
    if kind == "lstm":
        assert nn.gradcheck(lambda *a: fused(kind, *a, lengths).final_c, x, W, R, b, h0, c0)


@pytest.mark.parametrize("kind", ["rnn-tanh", "lstm", "gru"])
def test_gradcheck_broadcast_initial_state(kind, rng):
    x = var64(rng, 3, B, F)
    W, R, b = params(rng, kind)
    h0 = var64(rng, 1, H)          # one initial state shared by every sequence
    lengths = [2, 3, 1, 3]
    assert nn.gradcheck(lambda x, W, R, b, h0: fused(kind, x, W, R, b, h0, None, lengths),
                        x, W, R, b, h0)
    op = fused(kind, x, W, R, b, h0, None, lengths)
    tiled = fused(kind, x, W, R, b, nn.NetVar(np.repeat(h0.data, B, axis=0)), None, lengths)
    np.testing.assert_allclose(op.data, tiled.data, rtol=0, atol=1e-15)


@pytest.mark.parametrize("kind", KINDS)
def test_padding_is_zero_and_ignored(kind, rng):
    x = var64(rng, T, B, F)
    W, R, b = params(rng, kind)
    op = fused(kind, x, W, R, b, lengths=RAGGED)
    mask = np.arange(T)[:, None] < np.array(RAGGED)[None, :]
    assert np.all(op.data[~mask] == 0)
    # garbage in the padding changes nothing, and gets no gradient
    noisy = x.data.copy()
    noisy[~mask] = 1e3
    other = fused(kind, nn.NetVar(noisy), W, R, b, lengths=RAGGED)
    np.testing.assert_array_equal(op.data, other.data)
    op.back(rng.standard_normal(op.shape))
    assert np.all(x.g[~mask] == 0) and np.all(x.g[mask] != 0)
    # the final state is the output at each sequence's own last step
    last = np.array(RAGGED) - 1
    np.testing.assert_array_equal(op.final.data, op.data[last, np.arange(B)])


@pytest.mark.parametrize("kind", KINDS)
def test_ragged_batch_equals_each_sequence_alone(kind, rng):
    x = var64(rng, T, B, F)
    W, R, b = params(rng, kind)
    op = fused(kind, x, W, R, b, lengths=RAGGED)
    for row, length in enumerate(RAGGED):
        alone = fused(kind, nn.NetVar(x.data[:length, row:row + 1]), W, R, b)
        np.testing.assert_allclose(op.data[:length, row], alone.data[:, 0], atol=1e-14)
        np.testing.assert_allclose(op.final.data[row], alone.final.data[0], atol=1e-14)


def test_lengths_none_equals_full_lengths_and_float32_is_kept(rng):
    x = nn.NetVar(rng.standard_normal((T, B, F)).astype(np.float32))
    W, R, b = (nn.NetVar(p.data.astype(np.float32)) for p in params(rng, "lstm"))
    dense = nn.LSTM(x, W, R, b)
    packed = nn.LSTM(x, W, R, b, lengths=np.array([T] * B, dtype=np.int32))
    assert dense.dtype == np.float32 and dense.final_c.dtype == np.float32
    np.testing.assert_array_equal(dense.data, packed.data)
    dense.sum().back()
    assert W.g.dtype == np.float32


def test_final_state_node_is_cached_and_only_final_state_used(rng):
    x = var64(rng, T, B, F)
    W, R, b = params(rng, "rnn-tanh")
    op = nn.RNN(x, W, R, b, lengths=RAGGED)
    assert op.final is op.final
    assert op.final.shape == (B, H) and op.final.parents == (op,)
    with pytest.raises(ValueError, match=r"RecurrentState: RNN has 1 final state\(s\), no "
                                         r"state 1"):
        nn.RecurrentState(op, 1)
    op.final.sum().back()
    # only positions up to each length reach the final state
    mask = np.arange(T)[:, None] < np.array(RAGGED)[None, :]
    assert np.all(x.g[~mask] == 0)
    # a second backward pass (from the outputs) starts from zero again
    W.reset()
    op.sum().back()
    expected = W.g.copy()
    W.reset()
    nn.RNN(x, W, R, b, lengths=RAGGED).sum().back()
    np.testing.assert_allclose(W.g, expected, atol=1e-14)


def test_no_grad_records_nothing(rng):
    x = var64(rng, T, B, F)
    W, R, b = params(rng, "gru")
    with nn.no_grad():
        op = nn.GRU(x, W, R, b, lengths=RAGGED)
    assert not op.requires_grad and op.parents == () and not op.final.requires_grad


# ----------------------------------------------------------------------------- PyTorch parity

@pytest.mark.parametrize("kind", ["rnn-tanh", "rnn-relu", "lstm", "gru"])
@pytest.mark.parametrize("with_state", [False, True])
def test_matches_pytorch_packed_sequences(kind, with_state, torch, rng):
    T, B, F, H = 7, 5, 3, 4
    lengths = np.array([4, 7, 1, 6, 7])
    x = rng.standard_normal((T, B, F))
    torch.manual_seed(0)
    if kind == "lstm":
        layer = torch.nn.LSTM(F, H)
    elif kind == "gru":
        layer = torch.nn.GRU(F, H)
    else:
        layer = torch.nn.RNN(F, H, nonlinearity=kind.split("-")[1])
    layer = layer.double()
    xt = torch.tensor(x, requires_grad=True)
    h0 = rng.standard_normal((B, H))
    c0 = rng.standard_normal((B, H))
    h0t = torch.tensor(h0[None], requires_grad=True)
    c0t = torch.tensor(c0[None], requires_grad=True)
    packed = torch.nn.utils.rnn.pack_padded_sequence(xt, torch.tensor(lengths),
                                                     enforce_sorted=False)
    state = ((h0t, c0t) if kind == "lstm" else h0t) if with_state else None
    out, final = layer(packed, state)
    yt, _ = torch.nn.utils.rnn.pad_packed_sequence(out, total_length=T)
    hT, cT = final if kind == "lstm" else (final, None)
    gy, gh, gc = (rng.standard_normal(s) for s in ((T, B, H), (B, H), (B, H)))
    loss = (yt * torch.tensor(gy)).sum() + (hT[0] * torch.tensor(gh)).sum()
    if kind == "lstm":
        loss = loss + (cT[0] * torch.tensor(gc)).sum()
    loss.backward()

    W = nn.NetVar(layer.weight_ih_l0.detach().numpy().T.copy())
    R = nn.NetVar(layer.weight_hh_l0.detach().numpy().T.copy())
    bi, bh = layer.bias_ih_l0.detach().numpy(), layer.bias_hh_l0.detach().numpy()
    b = nn.NetVar(np.stack([bi, bh]) if kind == "gru" else bi + bh)
    X = nn.NetVar(x)
    H0, C0 = (nn.NetVar(h0), nn.NetVar(c0)) if with_state else (None, None)
    op = fused(kind, X, W, R, b, H0, C0, lengths)
    np.testing.assert_allclose(op.data, yt.detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(op.final.data, hT[0].detach().numpy(), atol=1e-12)
    total = (op * gy).sum() + (op.final * gh).sum()
    if kind == "lstm":
        np.testing.assert_allclose(op.final_c.data, cT[0].detach().numpy(), atol=1e-12)
        total = total + (op.final_c * gc).sum()
    total.back()
    np.testing.assert_allclose(X.g, xt.grad.numpy(), atol=1e-12)
    np.testing.assert_allclose(W.g, layer.weight_ih_l0.grad.numpy().T, atol=1e-12)
    np.testing.assert_allclose(R.g, layer.weight_hh_l0.grad.numpy().T, atol=1e-12)
    if kind == "gru":
        db = np.stack([layer.bias_ih_l0.grad.numpy(), layer.bias_hh_l0.grad.numpy()])
    else:
        db = layer.bias_ih_l0.grad.numpy()
    np.testing.assert_allclose(b.g.reshape(db.shape), db, atol=1e-12)
    if with_state:
        np.testing.assert_allclose(H0.g, h0t.grad.numpy()[0], atol=1e-12)
        if kind == "lstm":
            np.testing.assert_allclose(C0.g, c0t.grad.numpy()[0], atol=1e-12)


# ----------------------------------------------------------------------------- truncated BPTT

def test_truncated_bptt_no_gradient_crosses_chunks(rng):
    x = var64(rng, 2 * T, B, F)
    W, R, b = params(rng, "lstm")
    first_x = nn.NetVar(x.data[:T])
    second_x = nn.NetVar(x.data[T:])
    first = nn.LSTM(first_x, W, R, b)
    h0, c0 = first.final.detach(), first.final_c.detach()
    second = nn.LSTM(second_x, W, R, b, h0=h0, c0=c0)
    second.sum().back()
    assert np.all(first_x.g == 0)                    # nothing reached the first chunk
    carried = W.g.copy()
    W.reset()
    alone = nn.LSTM(nn.NetVar(x.data[T:]), W, R, b, h0=nn.constant(h0.data),
                    c0=nn.constant(c0.data))
    alone.sum().back()
    np.testing.assert_array_equal(W.g, carried)
    # the state itself is carried: the chunks together equal one long sequence
    whole = nn.LSTM(x, W, R, b)
    np.testing.assert_allclose(second.data, whole.data[T:], atol=1e-14)


# ----------------------------------------------------------------------------- bad input

def test_bad_input_errors_name_op_argument_and_shapes(rng):
    x = var64(rng, T, B, F)
    W, R, b = params(rng, "rnn-tanh")
    with pytest.raises(ValueError, match=r"RNN: x of shape \(4, 2\) must be 3-D"):
        nn.RNN(var64(rng, 4, 2), W, R, b)
    with pytest.raises(ValueError, match=r"RNN: lengths must lie in 1..T = 1..5.*max 6"):
        nn.RNN(x, W, R, b, lengths=[1, 2, 6, 3])
    with pytest.raises(ValueError, match=r"RNN: lengths must lie in 1..T.*min 0"):
        nn.RNN(x, W, R, b, lengths=[0, 2, 5, 3])
    with pytest.raises(ValueError, match=r"RNN: lengths of shape \(3,\) must be \(B,\) = \(4,\)"):
        nn.RNN(x, W, R, b, lengths=[1, 2, 3])
    with pytest.raises(ValueError, match=r"RNN: lengths must be integers"):
        nn.RNN(x, W, R, b, lengths=[1.5, 2, 3, 3])
    with pytest.raises(ValueError, match=r"RNN: W of shape \(3, 3\) must be \(F, 1·H\) = \(2, 3\)"):
        nn.RNN(x, var64(rng, 3, 3), R, b)
    with pytest.raises(ValueError, match=r"LSTM: R of shape \(3, 3\) must be \(H, 4·H\)"):
        nn.LSTM(x, var64(rng, F, 12), R, var64(rng, 12))
    with pytest.raises(ValueError, match=r"RNN: b of shape \(1, 4\) must be \(3,\) or \(1, 3\)"):
        nn.RNN(x, W, R, var64(rng, 4))
    with pytest.raises(ValueError, match=r"GRU: b of shape \(1, 9\) must be \(2, 9\)"):
        nn.GRU(x, var64(rng, F, 9), var64(rng, H, 9), var64(rng, 9))
    with pytest.raises(ValueError, match=r"RNN: h0 of shape \(2, 3\) must be \(B, H\) = \(4, 3\)"):
        nn.RNN(x, W, R, b, h0=var64(rng, 2, 3))
    with pytest.raises(ValueError, match=r"LSTM: c0 of shape \(4, 2\) must be"):
        nn.LSTM(x, var64(rng, F, 12), var64(rng, H, 12), var64(rng, 12), c0=var64(rng, 4, 2))
    with pytest.raises(ValueError, match=r"RNN: activation must be one of"):
        nn.RNN(x, W, R, b, activation="softsign")


def test_lengths_accept_lists_int_netvars_and_integral_floats(rng):
    x = var64(rng, T, B, F)
    W, R, b = params(rng, "gru")
    expected = nn.GRU(x, W, R, b, lengths=np.array(RAGGED)).data
    for lengths in (RAGGED, nn.NetVar(RAGGED, dtype=int), np.array(RAGGED, dtype=float)):
        np.testing.assert_array_equal(nn.GRU(x, W, R, b, lengths=lengths).data, expected)


@pytest.mark.parametrize("lengths, error, message", [
    ([True, True, True, True], TypeError, r"RNN: lengths must be integers, got bool values"),
    (np.array([True, False, True, True]), TypeError, r"RNN: lengths must be integers, got bool"),
    (["5", "2", "1", "3"], TypeError, r"RNN: lengths must be integers, got <U1 values"),
    ([np.inf, 2, 1, 3], ValueError, r"RNN: lengths must be integers, got float64 values \[inf"),
    ([np.nan, 2, 1, 3], ValueError, r"RNN: lengths must be integers, got float64 values \[nan"),
])
def test_lengths_refuse_bools_strings_and_non_finite_values(lengths, error, message, rng):
    # booleans were read as lengths 1 and 0; inf became -2**63 in the range error
    x = var64(rng, T, B, F)
    W, R, b = params(rng, "rnn-tanh")
    with pytest.raises(error, match=message):
        nn.RNN(x, W, R, b, lengths=lengths)


def test_states_of_the_wrong_kind_or_shape_are_refused(rng):
    x = var64(rng, T, B, F)
    h, c = var64(rng, B, H), var64(rng, B, H)
    for kind in ("rnn-tanh", "gru"):            # an LSTM's (h, c) given where h is expected
        W, R, b = params(rng, kind)
        name = "GRU" if kind == "gru" else "RNN"
        with pytest.raises(TypeError, match=rf"{name}: h0 must be a NetVar or an array, got tuple"):
            fused(kind, x, W, R, b, h0=(h, c))
    W, R, b = params(rng, "gru")
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'c0'"):
        nn.GRU(x, W, R, b, c0=c)
    W, R, b = params(rng, "lstm")
    with pytest.raises(ValueError, match=r"LSTM: h0 of shape \(1, 4, 3\) must be \(B, H\) = "
                                         r"\(4, 3\) or \(1, 3\) \(PyTorch's \(num_layers, B, H\) "
                                         r"state: drop its first axis\)"):
        nn.LSTM(x, W, R, b, h0=var64(rng, 1, B, H))
    with pytest.raises(ValueError, match=r"LSTM: c0 of shape \(3,\) must be \(B, H\) = \(4, 3\) "
                                         r"or \(1, 3\)$"):
        nn.LSTM(x, W, R, b, c0=nn.constant(np.zeros(H)))


def test_a_refused_call_changes_no_gradient(rng):
    x = var64(rng, T, B, F)
    W, R, b = params(rng, "lstm")
    nn.LSTM(x, W, R, b, lengths=RAGGED).sum().back()
    before = [(v.data.copy(), v.g.copy()) for v in (x, W, R, b)]
    with pytest.raises(ValueError, match="LSTM: lengths must lie in 1..T"):
        nn.LSTM(x, W, R, b, lengths=[1, 2, 9, 3])
    for v, (data, g) in zip((x, W, R, b), before):
        np.testing.assert_array_equal(v.data, data)
        np.testing.assert_array_equal(v.g, g)


@pytest.mark.parametrize("which", [True, False, 1.0, "c"])
def test_recurrent_state_refuses_a_which_that_is_not_an_int(which, rng):
    # True picked the LSTM's c, 1.0 failed only in back()
    op = fused("lstm", var64(rng, T, B, F), *params(rng, "lstm"))
    with pytest.raises(TypeError, match=r"RecurrentState: which must be 0 \(h\) or 1 \(an LSTM's "
                                        r"c\), got "):
        nn.RecurrentState(op, which)
    assert nn.RecurrentState(op, np.int64(1)).shape == (B, H)


# ----------------------------------------------------------------------------- the final states

def _final_loss(op, w):
    """A loss that reads the outputs and every final state."""
    loss = (op * w).sum() + (op.final * op.final).sum()
    if isinstance(op, nn.LSTM):
        loss = loss + (op.final_c * 3.0).sum()
    return loss


@pytest.mark.parametrize("kind", ["rnn-tanh", "lstm", "gru"])
def test_the_outputs_gradient_includes_what_reached_them_through_final(kind, rng):
    # final is the outputs at each sequence's last step: its gradient lands there, in .g and in
    # grad() with or without create_graph (it went to the op by a side channel, .g missed it)
    x = var64(rng, T, B, F)
    W, R, b = params(rng, kind)
    op = fused(kind, x, W, R, b, lengths=RAGGED)
    w = var64(rng, T, B, H)
    last = np.array(RAGGED) - 1
    expected = w.data.copy()
    expected[last, np.arange(B)] += 2 * op.final.data
    got, = nn.grad(_final_loss(op, w), [op])
    np.testing.assert_allclose(got, expected, rtol=1e-13)
    deep, = nn.grad(_final_loss(op, w), [op], create_graph=True)
    np.testing.assert_allclose(deep.data, expected, rtol=1e-13)
    _final_loss(op, w).back()
    np.testing.assert_allclose(op.g, expected, rtol=1e-13)
    only = np.zeros((T, B, H))
    only[last, np.arange(B)] = 1.0
    np.testing.assert_array_equal(nn.grad(op.final.sum(), [op])[0], only)


@pytest.mark.parametrize("kind", ["rnn-tanh", "lstm", "gru"])
def test_a_final_state_first_read_under_no_grad_still_differentiates(kind, rng):
    x = var64(rng, T, B, F)
    W, R, b = params(rng, kind)
    w = var64(rng, T, B, H)
    expected, = nn.grad(_final_loss(fused(kind, x, W, R, b, lengths=RAGGED), w), [W])
    op = fused(kind, x, W, R, b, lengths=RAGGED)
    with nn.no_grad():
        peek = [op.final] + ([op.final_c] if kind == "lstm" else [])     # kept alive
    got, = nn.grad(_final_loss(op, w), [W])
    assert all(not node.requires_grad for node in peek)
    np.testing.assert_allclose(got, expected, rtol=1e-13)


@pytest.mark.parametrize("kind", ["rnn-tanh", "lstm", "gru"])
@pytest.mark.parametrize("first", ["grad", "back"])
def test_a_pass_refused_midway_leaves_no_final_state_gradient_behind(kind, first, rng):
    x = var64(rng, T, B, F)
    W, R, b = params(rng, kind)
    w = var64(rng, T, B, H)
    op = fused(kind, x, W, R, b, lengths=RAGGED)
    expected, = nn.grad(op.sum(), [W])
    loss = _final_loss(op, w)
    w.data = w.data + 1.0                     # edited after use: the pass is refused
    with pytest.raises(nn.InplaceEditError):
        nn.grad(loss, [W]) if first == "grad" else loss.back()
    got, = nn.grad(op.sum(), [W])             # the outputs alone: nothing of final's share
    np.testing.assert_allclose(got, expected, rtol=1e-13)


def test_final_c_handed_over_to_a_pass_refused_at_the_op_is_not_kept_for_the_next(rng):
    # final_c is the LSTM's output 1: the engine hands its gradient to the op, then a check
    # before the op's BPTT refuses the pass (W holds a NaN gradient from before); the next
    # pass, through the outputs alone, must not start its BPTT from that final_c gradient
    x = var64(rng, T, B, F)
    W, R, b = params(rng, "lstm")
    op = fused("lstm", x, W, R, b, lengths=RAGGED)
    expected, = nn.grad(op.sum(), [W])
    with nn.detect_anomaly():
        W.g = np.full(W.shape, np.nan)
        with pytest.raises(nn.AnomalyError, match="held a NaN or Inf gradient before"):
            (op.sum() + (op.final_c * 3.0).sum()).back()
    W.reset()
    op.sum().back()
    np.testing.assert_allclose(W.g, expected, rtol=1e-13)


def test_a_copied_recurrent_node_hands_out_its_own_final_states():
    # copies kept weak references to the original's final-state nodes: the gradient of
    # deepcopy(op).final went to the original's weights, and pickle failed after .final
    import copy
    import pickle
    rng = np.random.default_rng(0)
    x = nn.NetVar(rng.standard_normal((3, 2, 4)), requires_grad=False)
    W, R, b = (nn.NetVar(rng.standard_normal(s)) for s in ((4, 5), (5, 5), (5,)))
    op = nn.RNN(x, W, R, b)
    original = op.final
    twin = copy.deepcopy(op)
    assert twin.final is not original and twin.final.parents[0] is twin
    twin.final.sum().back()
    assert W._g is None and np.any(twin.parents[1].g)
    restored = pickle.loads(pickle.dumps(op))
    np.testing.assert_array_equal(restored.final.data, original.data)


def test_two_final_c_nodes_of_one_op_both_reach_the_weights(rng):
    # final_c is the op's output 1; two such nodes (RecurrentState(op, 1) beside op.final_c,
    # or a copied graph's final_c beside the copy's own op.final_c) each handed the op its
    # gradient, and the second replaced the first: half the gradient, silently
    x = var64(rng, T, B, F)
    W, R, b = params(rng, "lstm")
    op = fused("lstm", x, W, R, b, lengths=RAGGED)
    first, second = op.final_c, nn.ops.RecurrentState(op, 1)
    expected, = nn.grad(first.sum() * 2.0, [W])
    both = first.sum() + second.sum()
    got, = nn.grad(both, [W])
    np.testing.assert_allclose(got, expected, rtol=1e-13)
    got, = nn.grad(both, [W], create_graph=True)
    np.testing.assert_allclose(got.data, expected, rtol=1e-12)
    both.back()
    np.testing.assert_allclose(W.g, expected, rtol=1e-13)
