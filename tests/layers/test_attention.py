"""The attention layers: MultiHeadAttention and TransformerEncoderLayer against PyTorch (values and
every gradient in float64, weights converted as documented), gradchecks, positional_encoding
against its formula, mean_over_time ignoring padding, one Attention box in draw, seeding, and one
refused case per guard."""
import numpy as np
import pytest

import nnkit as nn
from tests.layers.test_layers import (assert_refused_drawing_nothing, assert_same_as_pytorch,
                                      tensor)

L = nn.layers
RTOL, ATOL = 1e-10, 1e-12


def random_biases(layer, rng):
    """Nonzero biases (they start at zero), so that their gradients and mapping are tested."""
    for name in ("bq", "bk", "bv", "bo"):
        setattr(layer, name, nn.NetVar(rng.standard_normal((1, layer.dim))))


def pytorch_mha(torch, layer):
    """``nn.MultiheadAttention`` holding ``layer``'s weights, converted as the layer documents."""
    D = layer.dim
    ref = torch.nn.MultiheadAttention(D, layer.heads, bias=layer.bo is not None,
                                      dtype=torch.float64)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.tensor(np.concatenate(
            [layer.Wq.data.T, layer.Wk.data.T, layer.Wv.data.T])))
        ref.out_proj.weight.copy_(torch.tensor(layer.Wo.data.T))
        if layer.bo is not None:
            ref.in_proj_bias.copy_(torch.tensor(np.concatenate(
                [layer.bq.data[0], layer.bk.data[0], layer.bv.data[0]])))
            ref.out_proj.bias.copy_(torch.tensor(layer.bo.data[0]))
    return ref


def mha_gradients(layer, ref):
    """(node, PyTorch's gradient in nnkit's layout) for every parameter of the layer."""
    D = layer.dim
    W, pairs = ref.in_proj_weight, []
    for k, name in enumerate(("Wq", "Wk", "Wv")):
        pairs.append((getattr(layer, name), lambda k=k: W.grad[k * D:(k + 1) * D].numpy().T))
    pairs.append((layer.Wo, lambda: ref.out_proj.weight.grad.numpy().T))
    if layer.bo is not None:
        b = ref.in_proj_bias
        for k, name in enumerate(("bq", "bk", "bv")):
            pairs.append((getattr(layer, name), lambda k=k: b.grad[k * D:(k + 1) * D].numpy()))
        pairs.append((layer.bo, lambda: ref.out_proj.bias.grad.numpy()))
    return pairs


def masks(torch, lengths, Tq, Tk, causal):
    """PyTorch's key_padding_mask and attn_mask (True = ignore) for nnkit's lengths, causal."""
    padding = None if lengths is None else torch.tensor(
        ~nn.sequence_mask(lengths, Tk, time_major=False))
    future = torch.triu(torch.ones(Tq, Tk, dtype=torch.bool), 1) if causal else None
    return padding, future


# ----------------------------------------------------------------------------- PyTorch parity

@pytest.mark.parametrize("lengths", [None, [6, 2, 4]])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_self_attention_matches_pytorch(torch, rng, float64, lengths, causal, bias):
    T, B, D, H = 6, 3, 8, 2
    layer = L.MultiHeadAttention(D, H, bias=bias, seed=0)
    if bias:
        random_biases(layer, rng)
    ref = pytorch_mha(torch, layer)
    x = rng.standard_normal((T, B, D))
    xv, xt = nn.NetVar(x), tensor(torch, x)
    padding, future = masks(torch, lengths, T, T, causal)
    theirs, _ = ref(xt, xt, xt, key_padding_mask=padding, attn_mask=future, need_weights=False)
    ours = layer(xv, lengths=lengths, causal=causal)
    assert ours.shape == (T, B, D)
    assert_same_as_pytorch(torch, ours, theirs, [(xv, lambda: xt.grad.numpy())] + mha_gradients(layer, ref),
                rng)


@pytest.mark.parametrize("key_lengths,causal", [(None, False), ([5, 1, 3], False),
                                                ([5, 2, 4], True)])
def test_cross_attention_matches_pytorch(torch, rng, float64, key_lengths, causal):
    Tq, Tk, B, D, H = 4, 5, 3, 12, 3
    layer = L.MultiHeadAttention(D, H, seed=1)
    random_biases(layer, rng)
    ref = pytorch_mha(torch, layer)
    arrays = [rng.standard_normal((T, B, D)) for T in (Tq, Tk, Tk)]
    nodes = [nn.NetVar(a) for a in arrays]
    tensors = [tensor(torch, a) for a in arrays]
    padding, future = masks(torch, key_lengths, Tq, Tk, causal)
    theirs, _ = ref(*tensors, key_padding_mask=padding, attn_mask=future, need_weights=False)
    ours = layer(*nodes, key_lengths=key_lengths, causal=causal)
    assert ours.shape == (Tq, B, D)
    pairs = [(n, lambda t=t: t.grad.numpy()) for n, t in zip(nodes, tensors)]
    assert_same_as_pytorch(torch, ours, theirs, pairs + mha_gradients(layer, ref), rng)


def test_transformer_layer_matches_pytorch(torch, rng, float64):
    T, B, D, H, hidden = 5, 3, 8, 2, 12
    layer = L.TransformerEncoderLayer(D, H, hidden, seed=0)
    random_biases(layer.self_attn, rng)
    for norm in (layer.norm1, layer.norm2):
        norm.gamma.data = 1 + 0.1 * rng.standard_normal((1, D))
        norm.beta.data = 0.1 * rng.standard_normal((1, D))
    for linear in (layer.linear1, layer.linear2):
        linear.b.data = 0.1 * rng.standard_normal(linear.b.shape)
    F = torch.nn.functional
    ref = torch.nn.TransformerEncoderLayer(D, H, hidden, dropout=0.0, norm_first=True,
                                           activation=lambda x: F.gelu(x, approximate="tanh"),
                                           dtype=torch.float64)
    mine = pytorch_mha(torch, layer.self_attn)
    ref.self_attn.load_state_dict(mine.state_dict())
    with torch.no_grad():
        for theirs, ours in ((ref.linear1, layer.linear1), (ref.linear2, layer.linear2)):
            theirs.weight.copy_(torch.tensor(ours.W.data.T))
            theirs.bias.copy_(torch.tensor(ours.b.data[0]))
        for theirs, ours in ((ref.norm1, layer.norm1), (ref.norm2, layer.norm2)):
            theirs.weight.copy_(torch.tensor(ours.gamma.data[0]))
            theirs.bias.copy_(torch.tensor(ours.beta.data[0]))
    lengths = [5, 2, 4]
    x = rng.standard_normal((T, B, D))
    xv, xt = nn.NetVar(x), tensor(torch, x)
    theirs = ref(xt, src_key_padding_mask=masks(torch, lengths, T, T, False)[0])
    pairs = [(xv, lambda: xt.grad.numpy())] + mha_gradients(layer.self_attn, ref.self_attn)
    pairs += [(layer.linear1.W, lambda: ref.linear1.weight.grad.numpy().T),
              (layer.linear1.b, lambda: ref.linear1.bias.grad.numpy()),
              (layer.linear2.W, lambda: ref.linear2.weight.grad.numpy().T),
              (layer.linear2.b, lambda: ref.linear2.bias.grad.numpy()),
              (layer.norm1.gamma, lambda: ref.norm1.weight.grad.numpy()),
              (layer.norm1.beta, lambda: ref.norm1.bias.grad.numpy()),
              (layer.norm2.gamma, lambda: ref.norm2.weight.grad.numpy()),
              (layer.norm2.beta, lambda: ref.norm2.bias.grad.numpy())]
    assert_same_as_pytorch(torch, layer(xv, lengths), theirs, pairs, rng)
    assert len(pairs) == 1 + len(layer.vars)


def test_gelu_is_the_tanh_approximation(torch, rng, float64):
    x = rng.standard_normal(50) * 3
    expected = torch.nn.functional.gelu(torch.tensor(x), approximate="tanh").numpy()
    np.testing.assert_allclose(nn.GELU(nn.NetVar(x)).data[0], expected, rtol=1e-12, atol=1e-14)


# ----------------------------------------------------------------------------- calls

def test_lengths_given_positionally_as_a_list_an_array_or_a_netvar(rng, float64):
    layer = L.MultiHeadAttention(4, 2, seed=0)
    x = rng.standard_normal((5, 3, 4))
    expected = layer(x, lengths=np.array([5, 2, 3])).data
    for lengths in ([5, 2, 3], np.array([5, 2, 3]), nn.NetVar([5, 2, 3], requires_grad=False)):
        np.testing.assert_array_equal(layer(x, lengths).data, expected)
        np.testing.assert_array_equal(layer(x, lengths=lengths).data, expected)
    np.testing.assert_array_equal(layer(x, x, x, key_lengths=[5, 2, 3]).data, expected)
    np.testing.assert_array_equal(layer(x).data, layer(x, x, x).data)


def test_padded_steps_reach_no_valid_output(rng, float64):
    """Keys past each length are masked: what the padding holds never reaches a valid step,
    and a valid output's gradient reaches no padded input."""
    T, B, D = 6, 3, 8
    lengths = np.array([6, 2, 4])
    valid = nn.sequence_mask(lengths, T)                     # (T, B)
    layer = L.TransformerEncoderLayer(D, 2, 16, seed=0)
    x = rng.standard_normal((T, B, D))
    noisy = np.where(valid[:, :, None], x, 1e6 * rng.standard_normal((T, B, D)))
    for model in (layer, layer.self_attn):
        y = model(x, lengths).data
        np.testing.assert_allclose(model(noisy, lengths).data[valid], y[valid], rtol=1e-9)
        xv = nn.NetVar(x)
        (model(xv, lengths) * nn.NetVar(valid[:, :, None] * 1.0, requires_grad=False)).sum().back()
        assert np.all(xv.g[~valid] == 0) and np.all(xv.g[valid] != 0)


def test_a_sequence_of_length_zero_gives_the_output_bias(rng, float64):
    layer = L.MultiHeadAttention(4, 2, seed=0)
    random_biases(layer, rng)
    y = layer(rng.standard_normal((3, 2, 4)), [3, 0]).data
    np.testing.assert_allclose(y[:, 1], np.broadcast_to(layer.bo.data, (3, 4)), rtol=1e-12)
    assert np.all(np.isfinite(y))


def test_causal_self_attention_sees_no_later_step(rng, float64):
    layer = L.MultiHeadAttention(4, 2, seed=0)
    x = rng.standard_normal((5, 2, 4))
    changed = x.copy()
    changed[3:] += 10
    y, z = layer(x, causal=True).data, layer(changed, causal=True).data
    np.testing.assert_allclose(y[:3], z[:3], rtol=1e-12)
    assert not np.allclose(y[3:], z[3:])


def test_dropout_in_training_only(rng):
    layer = L.TransformerEncoderLayer(8, 2, 16, dropout=0.5, seed=0)
    plain = L.TransformerEncoderLayer(8, 2, 16, seed=0)
    x = rng.standard_normal((4, 2, 8)).astype(np.float32)
    with nn.eval_mode():
        np.testing.assert_array_equal(layer(x, [4, 3]).data, plain(x, [4, 3]).data)
    nn.seed(0)
    assert not np.allclose(layer(x, [4, 3]).data, plain(x, [4, 3]).data)


def test_float32_by_default_and_named_parameters(rng):
    layer = L.TransformerEncoderLayer(8, 2, 16, seed=0)
    assert list(layer.named_vars()) == [
        "norm1.gamma", "norm1.beta", "self_attn.Wq", "self_attn.Wk", "self_attn.Wv",
        "self_attn.Wo", "self_attn.bq", "self_attn.bk", "self_attn.bv", "self_attn.bo",
        "norm2.gamma", "norm2.beta", "linear1.W", "linear1.b", "linear2.W", "linear2.b"]
    assert {p.dtype for p in layer.vars} == {np.dtype(np.float32)}
    y = layer(rng.standard_normal((4, 2, 8)).astype(np.float32), [4, 1])
    assert y.dtype == np.float32 and y.shape == (4, 2, 8)
    mha = L.MultiHeadAttention(6, 3, bias=False, seed=0)
    assert list(mha.named_vars()) == ["Wq", "Wk", "Wv", "Wo"]
    assert "MultiHeadAttention(6, heads=3, bias=False" in repr(mha)
    assert "TransformerEncoderLayer(8, heads=2, hidden=16" in repr(layer)


def test_draw_shows_one_attention_box(rng):
    layer = L.MultiHeadAttention(4, 2, seed=0)
    y = layer(rng.standard_normal((3, 2, 4)).astype(np.float32), [3, 1], causal=True)
    source = nn.draw(y).source
    assert source.count('label="Attention\\n') == 1
    assert "SoftMax" not in source and "Exp" not in source
    kinds = [type(node).__name__ for node in nn.trace.reachable(y)]
    assert kinds.count("Attention") == 1


# ----------------------------------------------------------------------------- gradchecks

def test_gradcheck_multi_head_attention(rng, float64):
    layer = L.MultiHeadAttention(4, 2, seed=0)
    random_biases(layer, rng)
    params = [layer.Wq, layer.Wk, layer.Wv, layer.Wo, layer.bq, layer.bv, layer.bo]
    x = nn.NetVar(rng.standard_normal((4, 3, 4)))
    assert nn.gradcheck(lambda x, *p: layer(x, [4, 1, 3], causal=True), x, *params)
    q, k = nn.NetVar(rng.standard_normal((2, 3, 4))), nn.NetVar(rng.standard_normal((5, 3, 4)))
    v = nn.NetVar(rng.standard_normal((5, 3, 4)))
    assert nn.gradcheck(lambda q, k, v, *p: layer(q, k, v, key_lengths=[5, 2, 1]), q, k, v,
                        *params)


def test_gradcheck_transformer_layer(rng, float64):
    layer = L.TransformerEncoderLayer(4, 2, 6, seed=0)
    random_biases(layer.self_attn, rng)
    x = nn.NetVar(rng.standard_normal((4, 2, 4)))
    assert nn.gradcheck(lambda x, *p: layer(x, [4, 2]), x, *layer.vars)


def test_gradcheck_pooled_encoder(rng, float64):
    layer = L.TransformerEncoderLayer(4, 1, 4, seed=1)
    x = nn.NetVar(rng.standard_normal((3, 2, 4)))
    assert nn.gradcheck(lambda x, *p: L.mean_over_time(layer(x, [3, 1]), [3, 1]), x,
                        *layer.vars)


# ----------------------------------------------------------------------------- helpers

@pytest.mark.parametrize("T,dim", [(7, 6), (5, 5), (1, 1), (0, 4)])
def test_positional_encoding_follows_the_formula(T, dim):
    pe = nn.positional_encoding(T, dim)
    assert pe.shape == (T, dim) and pe.dtype == nn.get_dtype()
    for t in range(T):
        for i in range(dim):
            angle = t / 10000 ** (2 * (i // 2) / dim)
            expected = np.sin(angle) if i % 2 == 0 else np.cos(angle)
            assert abs(pe[t, i] - expected) < 1e-6
    assert nn.positional_encoding(3, 4, dtype=np.float64).dtype == np.float64
    assert nn.positional_encoding is L.positional_encoding


def test_mean_over_time_ignores_padding(rng, float64):
    T, B, F = 5, 4, 3
    lengths = [5, 1, 3, 0]
    x = rng.standard_normal((T, B, F))
    x[1:, 1] = 1e6                                  # padding that must not count
    x[3:, 2] = np.nan                               # (0 · NaN was NaN)
    x[4, 2, 0] = np.inf
    xv = nn.NetVar(x)
    y = L.mean_over_time(xv, lengths)
    assert y.shape == (B, F)
    for b, n in enumerate(lengths):
        expected = x[:n, b].mean(axis=0) if n else np.zeros(F)
        np.testing.assert_allclose(y.data[b], expected, rtol=1e-12)
    seed = rng.standard_normal((B, F))
    y.back(seed)
    valid = nn.sequence_mask(lengths, T)
    assert np.all(xv.g[~valid] == 0)
    for b, n in enumerate(lengths[:3]):                 # (the last one has no valid step)
        np.testing.assert_allclose(xv.g[:n, b], np.broadcast_to(seed[b] / n, (n, F)))
    finite = rng.standard_normal((T, B, F))
    np.testing.assert_allclose(L.mean_over_time(finite).data, finite.mean(axis=0))
    assert nn.gradcheck(lambda x: L.mean_over_time(x, [5, 2, 3, 1]), nn.NetVar(finite))


# ----------------------------------------------------------------------------- argument checks

REFUSED = [
    (lambda: L.MultiHeadAttention(0, 1), ValueError,
     r"layers\.MultiHeadAttention: dim must be a positive integer, got 0"),
    (lambda: L.MultiHeadAttention(8, 2.0), TypeError,
     r"layers\.MultiHeadAttention: heads must be a positive integer"),
    (lambda: L.MultiHeadAttention(8, 3), ValueError,
     r"layers\.MultiHeadAttention: heads \(3\) must divide dim \(8\)"),
    (lambda: L.MultiHeadAttention(8, 2, bias=1), TypeError,
     r"layers\.MultiHeadAttention: bias must be True or False"),
    (lambda: L.MultiHeadAttention(8, 2, seed="1"), TypeError,
     r"layers\.MultiHeadAttention: seed must be None, an int"),
    (lambda: L.TransformerEncoderLayer(-1, 2, 8), ValueError,
     r"layers\.TransformerEncoderLayer: dim must be a positive integer"),
    (lambda: L.TransformerEncoderLayer(8, 0, 8), ValueError,
     r"layers\.TransformerEncoderLayer: heads must be a positive integer"),
    (lambda: L.TransformerEncoderLayer(8, 3, 8), ValueError,
     r"layers\.TransformerEncoderLayer: heads \(3\) must divide dim \(8\)"),
    (lambda: L.TransformerEncoderLayer(8, 2, 0), ValueError,
     r"layers\.TransformerEncoderLayer: hidden must be a positive integer"),
    (lambda: L.TransformerEncoderLayer(8, 2, 8, dropout=1.0), ValueError,
     r"layers\.TransformerEncoderLayer: dropout must be in \[0, 1\), got 1.0"),
    (lambda: L.TransformerEncoderLayer(8, 2, 8, seed=-1), ValueError,
     r"layers\.TransformerEncoderLayer: seed must be >= 0"),
]


@pytest.mark.parametrize("make,error,message", REFUSED)
def test_refused_arguments_name_the_layer_and_draw_nothing(make, error, message):
    assert_refused_drawing_nothing(make, error, message)


X = np.ones((5, 2, 4))
MHA = r"layers\.MultiHeadAttention: "


@pytest.mark.parametrize("call,error,message", [
    (lambda m: m(X, [5, 1], True), TypeError,      # True was read as the values v
     MHA + r"give causal by name, mha\(x, lengths, causal=True\)"),
    (lambda m: m(np.ones((5, 2, 3))), ValueError,
     MHA + r"x of shape \(5, 2, 3\) must be \(T, B, dim\), time-major, with dim = 4"),
    (lambda m: m(np.ones((5, 4))), ValueError, MHA + r"x of shape \(5, 4\) must be \(T, B, dim\)"),
    (lambda m: m(np.ones((3, 2, 5)), X, X), ValueError, MHA + r"q of shape \(3, 2, 5\) must be"),
    (lambda m: m(X, np.ones((5, 2, 3)), X), ValueError, MHA + r"k of shape \(5, 2, 3\) must be"),
    (lambda m: m(X, X, np.ones((5, 2))), ValueError, MHA + r"v of shape \(5, 2\) must be"),
    (lambda m: m(X, X, np.ones((4, 2, 4))), ValueError,
     MHA + r"q of shape \(5, 2, 4\), k of shape \(5, 2, 4\) and v of shape \(4, 2, 4\) must be"),
    (lambda m: m(np.ones((3, 1, 4)), X, X), ValueError,
     MHA + r"q of shape \(3, 1, 4\), k of shape \(5, 2, 4\) and v of shape \(5, 2, 4\)"),
    (lambda m: m(X, X), TypeError, MHA + r"call mha\(x, lengths=None, causal=False\) for "
     r"self-attention or mha\(q, k, v, key_lengths=None, causal=False\) for cross-attention; "
     r"got 2 inputs"),
    (lambda m: m(X, X, X, X), TypeError, MHA + r"call mha\(x, .*got 4 inputs"),
    (lambda m: m(X, X, X, lengths=[5, 5]), TypeError,
     MHA + r"cross-attention masks the keys with key_lengths=, not lengths="),
    (lambda m: m(X, key_lengths=[5, 5]), TypeError,
     MHA + r"self-attention masks the keys with lengths=; key_lengths= is for mha\(q, k, v\)"),
    (lambda m: m(X, causal=1), TypeError, MHA + r"causal must be True or False, got int 1"),
    (lambda m: m(X, [5, 5, 5]), ValueError,
     MHA + r"lengths of shape \(3,\) hold 3 lengths for a batch of B = 2 sequences"),
    (lambda m: m(X, [5, 6]), ValueError,
     MHA + r"sequence_mask: lengths must be integers in \[0, 5\]"),
    (lambda m: m(X, X, X, key_lengths=["a", "b"]), TypeError,
     MHA + r"sequence_mask: lengths must be integers"),
])
def test_refused_calls_of_multi_head_attention(call, error, message):
    layer = L.MultiHeadAttention(4, 2, seed=0)
    with pytest.raises(error, match=message):
        call(layer)


@pytest.mark.parametrize("call,error,message", [
    (lambda: L.TransformerEncoderLayer(4, 2, 8)(np.ones((5, 2, 3))), ValueError,
     r"layers\.TransformerEncoderLayer: x of shape \(5, 2, 3\) must be \(T, B, dim\), "
     r"time-major, with dim = 4"),
    (lambda: L.TransformerEncoderLayer(4, 2, 8)(np.ones((5, 8))), ValueError,
     r"layers\.TransformerEncoderLayer: x of shape \(5, 8\) must be \(T, B, dim\)"),
    (lambda: nn.positional_encoding(-1, 4), ValueError,
     r"positional_encoding: T must be an integer >= 0, got -1"),
    (lambda: nn.positional_encoding(3, 0), ValueError,
     r"positional_encoding: dim must be a positive integer, got 0"),
    (lambda: nn.positional_encoding(3.0, 4), TypeError,
     r"positional_encoding: T must be an integer >= 0, got float 3.0"),
    (lambda: L.mean_over_time(np.ones((5, 2))), ValueError,
     r"layers\.mean_over_time: x of shape \(5, 2\) must be \(T, B, F\), time-major"),
    (lambda: L.mean_over_time(X, [5]), ValueError,
     r"layers\.mean_over_time: lengths of shape \(1,\) hold 1 lengths for a batch of B = 2"),
    (lambda: L.mean_over_time(X, [5, -1]), ValueError,
     r"layers\.mean_over_time: sequence_mask: lengths must be integers in \[0, 5\]"),
])
def test_refused_calls_of_the_helpers(call, error, message):
    with pytest.raises(error, match=message):
        call()
