"""nn.layers: each layer against PyTorch (values and gradients in float64), gradchecks through the
layers, seeding, argument checks, Sequential, layers inside an FFN, BatchNorm's buffers."""
import copy

import numpy as np
import pytest

import nnkit as nn
import nnkit.nets.sequence
from nnkit.module import Module

L = nn.layers
RTOL, ATOL = 1e-10, 1e-12


def assert_same_as_pytorch(torch, ours, theirs, pairs, rng):
    """Values of ``ours`` (a node) and ``theirs`` (a tensor) agree; one random seed gradient goes
    back through both, and each ``(node, gradient)`` pair agrees (``gradient()`` returns
    PyTorch's, converted to the node's layout)."""
    expected = theirs.detach().numpy()
    np.testing.assert_allclose(ours.data, expected.reshape(ours.shape), rtol=RTOL, atol=ATOL)
    seed = rng.standard_normal(expected.shape)
    ours.back(seed.reshape(ours.shape))
    theirs.backward(torch.tensor(seed))
    for node, gradient in pairs:
        np.testing.assert_allclose(node.g, np.reshape(gradient(), node.g.shape),
                                   rtol=RTOL, atol=ATOL)


def tensor(torch, array):
    return torch.tensor(np.asarray(array), requires_grad=True)


def copy_into(torch, parameter, array):
    with torch.no_grad():
        parameter.copy_(torch.tensor(np.ascontiguousarray(array)).reshape(parameter.shape))


# ----------------------------------------------------------------------------- PyTorch parity

@pytest.mark.parametrize("shape", [(5, 3), (2, 4, 3), (1, 3)])
def test_linear_matches_pytorch(torch, rng, float64, shape):
    layer = L.Linear(3, 4, seed=0)
    layer.b.data = rng.standard_normal((1, 4))
    ref = torch.nn.Linear(3, 4, dtype=torch.float64)
    copy_into(torch, ref.weight, layer.W.data.T)
    copy_into(torch, ref.bias, layer.b.data)
    x = rng.standard_normal(shape)
    xv, xt = nn.NetVar(x), tensor(torch, x)
    assert_same_as_pytorch(torch, layer(xv), ref(xt), [
        (xv, lambda: xt.grad.numpy()), (layer.W, lambda: ref.weight.grad.numpy().T),
        (layer.b, lambda: ref.bias.grad.numpy())], rng)


def test_linear_without_bias_matches_pytorch(torch, rng, float64):
    layer = L.Linear(3, 2, bias=False, seed=1)
    assert layer.b is None and layer.vars == [layer.W]
    ref = torch.nn.Linear(3, 2, bias=False, dtype=torch.float64)
    copy_into(torch, ref.weight, layer.W.data.T)
    x = rng.standard_normal((4, 3))
    xv, xt = nn.NetVar(x), tensor(torch, x)
    assert_same_as_pytorch(torch, layer(xv), ref(xt), [
        (xv, lambda: xt.grad.numpy()), (layer.W, lambda: ref.weight.grad.numpy().T)], rng)


@pytest.mark.parametrize("size,stride,padding", [(3, 1, 0), ((3, 2), 2, 1), (1, (1, 2), (0, 1))])
def test_conv2d_matches_pytorch(torch, rng, float64, size, stride, padding):
    layer = L.Conv2D(2, 3, size, stride=stride, padding=padding, seed=0)
    layer.b.data = rng.standard_normal((1, 3))
    ref = torch.nn.Conv2d(2, 3, size, stride=stride, padding=padding, dtype=torch.float64)
    copy_into(torch, ref.weight, layer.W.data)
    copy_into(torch, ref.bias, layer.b.data)
    x = rng.standard_normal((2, 2, 6, 5))
    xv, xt = nn.NetVar(x), tensor(torch, x)
    assert_same_as_pytorch(torch, layer(xv), ref(xt), [
        (xv, lambda: xt.grad.numpy()), (layer.W, lambda: ref.weight.grad.numpy()),
        (layer.b, lambda: ref.bias.grad.numpy())], rng)


@pytest.mark.parametrize("shape", [(6, 4), (3, 4, 2, 5)])
def test_batchnorm_matches_pytorch_in_training_and_evaluation(torch, rng, float64, shape):
    layer = L.BatchNorm(4, momentum=0.3, eps=1e-3)
    layer.gamma.data = rng.standard_normal((1, 4))
    layer.beta.data = rng.standard_normal((1, 4))
    kind = torch.nn.BatchNorm1d if len(shape) == 2 else torch.nn.BatchNorm2d
    ref = kind(4, momentum=0.3, eps=1e-3, dtype=torch.float64)
    copy_into(torch, ref.weight, layer.gamma.data)
    copy_into(torch, ref.bias, layer.beta.data)
    for step in range(2):                        # training: batch statistics, running ones move
        x = rng.standard_normal(shape) * 2 + 1
        xv, xt = nn.NetVar(x), tensor(torch, x)
        ref.weight.grad = ref.bias.grad = None
        layer.gamma.reset(), layer.beta.reset()
        assert_same_as_pytorch(torch, layer(xv), ref(xt), [
            (xv, lambda: xt.grad.numpy()), (layer.gamma, lambda: ref.weight.grad.numpy()),
            (layer.beta, lambda: ref.bias.grad.numpy())], rng)
        np.testing.assert_allclose(layer.stats.running_mean, ref.running_mean.numpy(), RTOL)
        np.testing.assert_allclose(layer.stats.running_var, ref.running_var.numpy(), RTOL)
    ref.eval()
    x = rng.standard_normal(shape)
    xv, xt = nn.NetVar(x), tensor(torch, x)
    ref.weight.grad = ref.bias.grad = None
    layer.gamma.reset(), layer.beta.reset()
    with nn.eval_mode():
        assert_same_as_pytorch(torch, layer(xv), ref(xt), [
            (xv, lambda: xt.grad.numpy()), (layer.gamma, lambda: ref.weight.grad.numpy()),
            (layer.beta, lambda: ref.bias.grad.numpy())], rng)


def test_layernorm_matches_pytorch(torch, rng, float64):
    layer = L.LayerNorm(5, eps=1e-4)
    layer.gamma.data = rng.standard_normal((1, 5))
    layer.beta.data = rng.standard_normal((1, 5))
    ref = torch.nn.LayerNorm(5, eps=1e-4, dtype=torch.float64)
    copy_into(torch, ref.weight, layer.gamma.data)
    copy_into(torch, ref.bias, layer.beta.data)
    x = rng.standard_normal((2, 3, 5))
    xv, xt = nn.NetVar(x), tensor(torch, x)
    assert_same_as_pytorch(torch, layer(xv), ref(xt), [
        (xv, lambda: xt.grad.numpy()), (layer.gamma, lambda: ref.weight.grad.numpy()),
        (layer.beta, lambda: ref.bias.grad.numpy())], rng)


@pytest.mark.parametrize("padding_idx", [None, 1, -1])
def test_embedding_matches_pytorch(torch, rng, float64, padding_idx):
    layer = L.Embedding(6, 3, padding_idx=padding_idx, seed=0)
    if padding_idx is not None:
        np.testing.assert_array_equal(layer.table.data[padding_idx], 0)   # as PyTorch starts
    layer.table.data = rng.standard_normal((6, 3))
    ref = torch.nn.Embedding(6, 3, padding_idx=padding_idx, dtype=torch.float64)
    copy_into(torch, ref.weight, layer.table.data)
    ids = np.array([[1, 2, 1, 5], [0, 5, 5, 3]])
    assert_same_as_pytorch(torch, layer(ids), ref(torch.tensor(ids)), [
        (layer.table, lambda: ref.weight.grad.numpy())], rng)
    if padding_idx is not None:
        np.testing.assert_array_equal(layer.table.g[padding_idx], 0)


def torch_recurrent(torch, layer):
    """The PyTorch layer with ``layer``'s weights (bias_hh = 0 but for the GRU's b_h)."""
    H = layer.hidden
    if isinstance(layer, L.LSTM):
        ref = torch.nn.LSTM(layer.inputs, H, dtype=torch.float64)
    elif isinstance(layer, L.GRU):
        ref = torch.nn.GRU(layer.inputs, H, dtype=torch.float64)
    else:
        ref = torch.nn.RNN(layer.inputs, H, nonlinearity=layer.activation, dtype=torch.float64)
    copy_into(torch, ref.weight_ih_l0, layer.W.data.T)
    copy_into(torch, ref.weight_hh_l0, layer.R.data.T)
    copy_into(torch, ref.bias_ih_l0, layer.b.data[0])
    copy_into(torch, ref.bias_hh_l0, layer.b.data[1] if isinstance(layer, L.GRU)
              else np.zeros(ref.bias_hh_l0.shape))
    return ref


RECURRENT = [("rnn", lambda: L.RNN(3, 4, seed=0)),
             ("rnn-relu", lambda: L.RNN(3, 4, activation="relu", seed=0)),
             ("lstm", lambda: L.LSTM(3, 4, seed=0)),
             ("gru", lambda: L.GRU(3, 4, seed=0))]


@pytest.mark.parametrize("name,make", RECURRENT)
@pytest.mark.parametrize("lengths", [None, [3, 5, 1]])
def test_recurrent_layers_match_pytorch(torch, rng, float64, name, make, lengths):
    layer = make()
    layer.b.data = rng.standard_normal(layer.b.shape)
    ref = torch_recurrent(torch, layer)
    T, B, H = 5, 3, 4
    x = rng.standard_normal((T, B, 3))
    states = [rng.standard_normal((B, H)) for _ in range(2 if name == "lstm" else 1)]
    xv, xt = nn.NetVar(x), tensor(torch, x)
    sv = [nn.NetVar(s) for s in states]
    st = [tensor(torch, s[None]) for s in states]
    node = layer(xv, lengths=lengths, state=tuple(sv))
    packed = xt if lengths is None else torch.nn.utils.rnn.pack_padded_sequence(
        xt, torch.tensor(lengths), enforce_sorted=False)
    out, final = ref(packed, tuple(st) if name == "lstm" else st[0])
    if lengths is not None:
        out = torch.nn.utils.rnn.pad_packed_sequence(out, total_length=T)[0]
    finals = final if name == "lstm" else (final,)
    ours = [node, node.final] + ([node.final_c] if name == "lstm" else [])
    theirs = [out] + [f[0] for f in finals]
    weights = [rng.standard_normal(t.shape) for t in theirs]
    ours_total = sum((o * w).sum() for o, w in zip(ours, weights))
    theirs_total = sum((t * torch.tensor(w)).sum() for t, w in zip(theirs, weights))
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o.data, t.detach().numpy(), rtol=RTOL, atol=ATOL)
    grads = [(xv, lambda: xt.grad.numpy()),
             (layer.W, lambda: ref.weight_ih_l0.grad.numpy().T),
             (layer.R, lambda: ref.weight_hh_l0.grad.numpy().T)]
    if name == "gru":
        grads.append((layer.b, lambda: np.stack([ref.bias_ih_l0.grad.numpy(),
                                                 ref.bias_hh_l0.grad.numpy()])))
    else:
        grads.append((layer.b, lambda: ref.bias_ih_l0.grad.numpy()))
    grads += [(v, lambda t=t: t.grad.numpy()[0]) for v, t in zip(sv, st)]
    assert_same_as_pytorch(torch, ours_total, theirs_total, grads, rng)


# ----------------------------------------------------------------------------- gradchecks

def test_gradcheck_linear_and_conv(rng, float64):
    linear = L.Linear(3, 2, seed=0)
    x = nn.NetVar(rng.standard_normal((4, 3)))
    assert nn.gradcheck(lambda x, W, b: linear(x), x, linear.W, linear.b)
    tiny = L.Linear(1, 1, seed=0)                     # (1, 1) everything
    one = nn.NetVar(rng.standard_normal((1, 1)))
    assert tiny.W.shape == tiny.b.shape == (1, 1)
    assert nn.gradcheck(lambda x, W, b: tiny(x), one, tiny.W, tiny.b)
    conv = L.Conv2D(2, 3, (2, 3), stride=(2, 1), padding=1, seed=0)
    image = nn.NetVar(rng.standard_normal((2, 2, 4, 5)))
    assert nn.gradcheck(lambda x, W, b: conv(x), image, conv.W, conv.b)


def test_gradcheck_normalization(rng, float64):
    batchnorm = L.BatchNorm(3)
    batchnorm.gamma.data = rng.standard_normal((1, 3))
    x = nn.NetVar(rng.standard_normal((5, 3, 2)))
    assert nn.gradcheck(lambda x, g, b: batchnorm(x), x, batchnorm.gamma, batchnorm.beta)
    with nn.eval_mode():
        assert nn.gradcheck(lambda x, g, b: batchnorm(x), x, batchnorm.gamma, batchnorm.beta)
    layernorm = L.LayerNorm(4)
    layernorm.gamma.data = rng.standard_normal((1, 4))
    x = nn.NetVar(rng.standard_normal((2, 3, 4)))
    assert nn.gradcheck(lambda x, g, b: layernorm(x), x, layernorm.gamma, layernorm.beta)
    single = L.LayerNorm(1)                           # one feature: (1, 1) parameters
    assert nn.gradcheck(lambda x, g, b: single(x), nn.NetVar(rng.standard_normal((1, 1))),
                        single.gamma, single.beta)


@pytest.mark.parametrize("name,make", RECURRENT)
def test_gradcheck_recurrent_and_embedding(rng, float64, name, make):
    embedding = L.Embedding(5, 3, seed=0)     # (a padding row is read but never trained)
    layer = make()
    ids = rng.integers(0, 5, (4, 2))
    state = tuple(nn.NetVar(rng.standard_normal((2, 4))) for _ in range(layer.op.states))

    def run(table, W, R, b, *state):
        node = layer(embedding(ids), lengths=[4, 2], state=state)
        return node.sum() + (node.final * node.final).sum()

    assert nn.gradcheck(run, embedding.table, layer.W, layer.R, layer.b, *state)


def test_gradcheck_through_sequential(rng, float64):
    model = L.Sequential(L.Linear(3, 4, seed=0), nn.Tanh, L.LayerNorm(4),
                         lambda x: x * 2, L.Linear(4, 1, seed=1))
    x = nn.NetVar(rng.standard_normal((5, 3)), requires_grad=False)
    assert nn.gradcheck(lambda *p: model(x), *model.vars)
    assert nn.gradcheck(lambda *p: model(x[:1]), *model.vars)       # one row: a (1, 1) output


# ----------------------------------------------------------------------------- seeding, dtype

SEEDED = [
    lambda seed: L.Linear(3, 4, seed=seed),
    lambda seed: L.Conv2D(2, 3, 3, seed=seed),
    lambda seed: L.Embedding(7, 3, seed=seed),
    lambda seed: L.RNN(3, 4, seed=seed),
    lambda seed: L.LSTM(3, 4, seed=seed),
    lambda seed: L.GRU(3, 4, seed=seed),
]


@pytest.mark.parametrize("make", SEEDED)
def test_same_seed_same_weights(make):
    def weights(layer):
        return [p.data for p in layer.vars]

    for a, b in zip(weights(make(0)), weights(make(0))):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(weights(make(0))[0], weights(make(1))[0])
    for a, b in zip(weights(make(np.random.default_rng(5))),
                    weights(make(np.random.default_rng(5)))):
        np.testing.assert_array_equal(a, b)
    nn.seed(3)
    first = weights(make(None))
    nn.seed(3)
    for a, b in zip(first, weights(make(None))):
        np.testing.assert_array_equal(a, b)


def test_initial_values():
    linear = L.Linear(6, 2, seed=0)
    assert np.abs(linear.W.data).max() <= np.sqrt(6 / 8) and np.all(linear.b.data == 0)
    np.testing.assert_array_equal(linear.W.data, nn.glorot_uniform(6, 2, seed=0).data)
    conv = L.Conv2D(2, 3, (2, 2), seed=0)
    np.testing.assert_array_equal(conv.W.data, nn.glorot_uniform(3, 2, 2, 2, seed=0).data)
    for layer, cell in ((L.LSTM(3, 4, forget_bias=2.0, seed=0), "lstm"),
                        (L.GRU(3, 4, seed=0), "gru"), (L.RNN(3, 4, seed=0), "rnn")):
        kwargs = {"forget_bias": 2.0} if cell == "lstm" else {}
        for mine, theirs in zip(layer.vars, nn.recurrent_weights(cell, 3, 4, seed=0, **kwargs)):
            np.testing.assert_array_equal(mine.data, theirs.data)
    batchnorm, layernorm = L.BatchNorm(3), L.LayerNorm(3)
    for layer in (batchnorm, layernorm):
        np.testing.assert_array_equal(layer.gamma.data, np.ones((1, 3)))
        np.testing.assert_array_equal(layer.beta.data, np.zeros((1, 3)))


def test_recurrent_weights_lives_in_init():
    assert nn.recurrent_weights is nn.init.recurrent_weights
    with pytest.warns(DeprecationWarning, match=r"nnkit.nets.sequence.recurrent_weights is "
                                                r"deprecated: use nnkit.init.recurrent_weights"):
        assert nnkit.nets.sequence.recurrent_weights is nn.recurrent_weights


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_parameters_and_buffers_take_nnkits_dtype(dtype):
    saved = nn.get_dtype()
    nn.set_dtype(dtype)
    try:
        model = L.Sequential(L.Linear(2, 3), L.Conv2D(1, 1, 1), L.BatchNorm(3),
                             L.LayerNorm(3), L.Embedding(4, 2, padding_idx=0), L.RNN(2, 3),
                             L.LSTM(2, 3), L.GRU(2, 3))
    finally:
        nn.set_dtype(saved)
    assert {array.dtype for array in model.state().values()} == {np.dtype(dtype)}


# ----------------------------------------------------------------------------- argument checks

REFUSED = [
    (lambda: L.Linear(0, 4), ValueError,
     r"layers\.Linear: inputs must be a positive integer, got 0"),
    (lambda: L.Linear(3, 2.0), TypeError, r"layers\.Linear: outputs must be a positive integer"),
    (lambda: L.Linear(3, 4, bias="yes"), TypeError, r"layers\.Linear: bias must be True or False"),
    (lambda: L.Linear(3, 4, seed="0"), TypeError, r"layers\.Linear: seed must be None, an int"),
    (lambda: L.Conv2D(0, 3, 3), ValueError, r"layers\.Conv2D: in_channels must be a positive"),
    (lambda: L.Conv2D(2, True, 3), TypeError, r"layers\.Conv2D: out_channels must be a positive"),
    (lambda: L.Conv2D(2, 3, (3, 3, 3)), ValueError,
     r"layers\.Conv2D: size must be an int or a pair of ints, got \(3, 3, 3\)"),
    (lambda: L.Conv2D(2, 3, (3, 0)), ValueError, r"layers\.Conv2D: size must be a positive"),
    (lambda: L.Conv2D(2, 3, 3, stride=0), ValueError, r"layers\.Conv2D: stride must be a positive"),
    (lambda: L.Conv2D(2, 3, 3, padding=-1), ValueError,
     r"layers\.Conv2D: padding must be an integer >= 0, got -1"),
    (lambda: L.Conv2D(2, 3, 3, padding=1.5), TypeError, r"layers\.Conv2D: padding must be an"),
    (lambda: L.Conv2D(2, 3, 3, bias=None), TypeError, r"layers\.Conv2D: bias must be True or"),
    (lambda: L.Conv2D(2, 3, 3, seed=-1), ValueError, r"layers\.Conv2D: seed must be >= 0"),
    (lambda: L.BatchNorm(0), ValueError, r"layers\.BatchNorm: features must be a positive"),
    (lambda: L.BatchNorm(3, momentum=1.5), ValueError,
     r"layers\.BatchNorm: momentum must be in \[0, 1\], got 1.5"),
    (lambda: L.BatchNorm(3, eps=0), ValueError, r"layers\.BatchNorm: eps must be > 0, got 0"),
    (lambda: L.LayerNorm(-2), ValueError, r"layers\.LayerNorm: features must be a positive"),
    (lambda: L.LayerNorm(3, eps=float("nan")), ValueError,
     r"layers\.LayerNorm: eps must be finite"),
    (lambda: L.Embedding(0, 3), ValueError, r"layers\.Embedding: V must be a positive integer"),
    (lambda: L.Embedding(5, "3"), TypeError, r"layers\.Embedding: D must be a positive integer"),
    (lambda: L.Embedding(5, 3, padding_idx=1.0), TypeError,
     r"layers\.Embedding: padding_idx must be None or an integer in \[-5, 5\)"),
    (lambda: L.Embedding(5, 3, padding_idx=5), ValueError,
     r"layers\.Embedding: padding_idx 5 is out of range \[-5, 5\) for a table of 5 rows"),
    (lambda: L.Embedding(5, 3, padding_idx=-6), ValueError,
     r"layers\.Embedding: padding_idx -6 is out of range"),
    (lambda: L.Embedding(5, 3, seed=1.5), TypeError, r"layers\.Embedding: seed must be None"),
    (lambda: L.RNN(0, 4), ValueError, r"layers\.RNN: inputs must be a positive integer, got 0"),
    (lambda: L.RNN(3, 4, activation="gelu"), ValueError,
     r"layers\.RNN: activation must be one of \['linear', 'relu', 'sigmoid', 'tanh'\], got 'gelu'"),
    (lambda: L.LSTM(3, 0), ValueError, r"layers\.LSTM: hidden must be a positive integer, got 0"),
    (lambda: L.LSTM(3, 4, forget_bias=float("inf")), ValueError,
     r"layers\.LSTM: forget_bias must be finite"),
    (lambda: L.LSTM(3, 4, forget_bias="1"), TypeError, r"layers\.LSTM: forget_bias must be a"),
    (lambda: L.GRU(3, 4, seed="x"), TypeError, r"layers\.GRU: seed must be None, an int"),
    (lambda: L.Dropout(1), ValueError, r"layers\.Dropout: p must be in \[0, 1\), got 1"),
    (lambda: L.Dropout(None), TypeError, r"layers\.Dropout: p must be a number"),
    (lambda: L.Sequential(nn.ReLU, 3), TypeError,
     r"layers\.Sequential: entry 1 \(3\) is not a Module, an op class or a function"),
    (lambda: L.Sequential(L.Linear), TypeError, r"layers\.Sequential: entry 0 .*Linear"),
]


def assert_refused_drawing_nothing(make, error, message):
    """``make()`` raises ``error`` matching ``message`` and leaves nnkit's generator as it was."""
    nn.seed(0)
    expected = L.Linear(2, 2).W.data
    nn.seed(0)
    with pytest.raises(error, match=message):
        make()
    np.testing.assert_array_equal(L.Linear(2, 2).W.data, expected)   # the generator is as it was


@pytest.mark.parametrize("make,error,message", REFUSED)
def test_refused_arguments_name_the_layer_and_draw_nothing(make, error, message):
    assert_refused_drawing_nothing(make, error, message)


@pytest.mark.parametrize("make,call,message", [
    (lambda: L.Linear(3, 4), lambda m: m(np.ones((2, 5))),
     r"layers\.Linear: x of shape \(2, 5\) must be \(\.\.\., B, inputs\) with 3 on its last axis"),
    (lambda: L.Conv2D(2, 3, 1), lambda m: m(np.ones((1, 3, 4, 4))),
     r"layers\.Conv2D: x of shape \(1, 3, 4, 4\) must be \(N, C, H, W\) with 2 on axis 1"),
    (lambda: L.Conv2D(2, 3, 1), lambda m: m(np.ones((1, 2, 4))),
     r"layers\.Conv2D: x of shape \(1, 2, 4\) must be \(N, C, H, W\) with C = 2"),
    (lambda: L.BatchNorm(3), lambda m: m(np.ones((4, 2))),
     r"layers\.BatchNorm: x of shape \(4, 2\) must be \(B, features, \.\.\.\) with 3 on axis 1"),
    (lambda: L.LayerNorm(3), lambda m: m(np.ones((4, 2))),
     r"layers\.LayerNorm: x of shape \(4, 2\) must be \(\.\.\., features\) with 3 on its last"),
    (lambda: L.LSTM(3, 4), lambda m: m(np.ones((5, 2, 2))),
     r"layers\.LSTM: x of shape \(5, 2, 2\) must be \(T, B, F\) with 3 on axis 2"),
    (lambda: L.GRU(3, 4), lambda m: m(np.ones((5, 2, 3, 1))),
     r"layers\.GRU: x of shape \(5, 2, 3, 1\) must be \(T, B, F\), time-major, with F = 3"),
    (lambda: L.LSTM(3, 4), lambda m: m(np.ones((5, 2, 3)), state=(np.zeros((2, 4)),)),
     r"layers\.LSTM: state must be \(h0, c0\), each \(B, H\) or \(1, H\); got 1 state\(s\) of "
     r"shape\(s\) \(2, 4\)"),
    (lambda: L.GRU(3, 4), lambda m: m(np.ones((5, 2, 3)), state=5),
     r"layers\.GRU: state must be \(h0,\) or h0, each a NetVar or an array of shape \(B, H\) "
     r"or \(1, H\); got int 5"),
    (lambda: L.RNN(3, 4), lambda m: m(np.ones((5, 2, 3)), state=[np.zeros((2, 4))] * 2),
     r"layers\.RNN: state must be \(h0,\) or h0"),
])
def test_refused_inputs_name_the_layer_and_the_shapes(make, call, message):
    layer = make()
    before = layer.state()
    with pytest.raises((ValueError, TypeError), match=message):
        call(layer)
    for name, array in layer.state().items():
        np.testing.assert_array_equal(array, before[name])


def test_refused_batch_leaves_the_running_statistics(rng):
    layer = L.BatchNorm(3)
    with pytest.raises(ValueError, match="layers.BatchNorm"):
        layer(rng.standard_normal((4, 2)))
    assert layer.stats.num_batches_tracked == 0


# ----------------------------------------------------------------------------- recurrent calls

@pytest.mark.parametrize("name,make", RECURRENT)
def test_recurrent_state_forms_and_finals(rng, float64, name, make):
    layer = make()
    x = rng.standard_normal((4, 2, 3))
    h0 = rng.standard_normal((2, 4))
    if name == "lstm":
        c0 = rng.standard_normal((1, 4))         # (1, H) broadcasts over the batch
        node = layer(x, state=(h0, c0))
        again = layer(x, state=[h0, c0])
        direct = nn.LSTM(x, layer.W, layer.R, layer.b, h0, c0)
        np.testing.assert_array_equal(node.final_c.data, direct.final_c.data)
    else:
        node, again = layer(x, state=h0), layer(x, state=(h0,))
        direct = type(node)(x, layer.W, layer.R, layer.b, h0, **(
            {"activation": layer.activation} if name.startswith("rnn") else {}))
    assert isinstance(node, layer.op)
    np.testing.assert_array_equal(node.data, again.data)
    np.testing.assert_array_equal(node.data, direct.data)
    np.testing.assert_array_equal(node.final.data, direct.final.data)
    zero = layer(x)                              # no state: zeros
    np.testing.assert_array_equal(zero.data, layer(x, state=(np.zeros((1, 4)),) * (
        2 if name == "lstm" else 1)).data)
    ragged = layer(x, lengths=[4, 2])
    assert np.all(ragged.data[2:, 1] == 0) and ragged.final.shape == (2, 4)


def test_embedding_feeds_a_recurrent_layer_and_trains_no_padding_row(rng):
    embedding, lstm = L.Embedding(6, 3, padding_idx=0, seed=0), L.LSTM(3, 4, seed=1)
    ids = np.array([[1, 0], [2, 0], [3, 4]])
    out = lstm(embedding(ids))
    out.sum().back()
    assert out.shape == (3, 2, 4)
    assert np.all(embedding.table.g[0] == 0) and np.any(embedding.table.g[1] != 0)
    assert embedding.table.g[5].tolist() == [0, 0, 0]             # never looked up


# ----------------------------------------------------------------------------- dropout

def test_dropout_follows_the_op_and_the_global_mode(rng):
    layer = L.Dropout(0.4)
    assert layer.vars == [] and layer.state() == {}
    x = rng.standard_normal((50, 20))
    nn.seed(7)
    y = layer(x)
    nn.seed(7)
    np.testing.assert_array_equal(y.data, nn.Dropout(nn.NetVar(x, requires_grad=False), 0.4).data)
    assert 0.3 < np.mean(y.data == 0) < 0.5
    with nn.eval_mode():
        np.testing.assert_array_equal(layer(x).data, x)
    np.testing.assert_array_equal(L.Dropout(0)(x).data, x)


# ----------------------------------------------------------------------------- Sequential

def test_sequential_runs_modules_and_callables_in_order(rng):
    first, second = L.Linear(3, 4, seed=0), L.Linear(4, 2, seed=1)
    model = L.Sequential(first, nn.ReLU, L.Dropout(0.5), lambda x: x * 2, second)
    x = rng.standard_normal((5, 3))
    with nn.eval_mode():
        y = model(x)
    expected = (np.maximum(x @ first.W.data + first.b.data, 0) * 2) @ second.W.data + second.b.data
    np.testing.assert_allclose(y.data, expected, rtol=1e-6)
    assert list(model.named_vars()) == ["layers.0.W", "layers.0.b", "layers.4.W", "layers.4.b"]
    assert model.vars == [first.W, first.b, second.W, second.b]
    assert len(model) == 5 and model[0] is first and model[-1] is second and model[1] is nn.ReLU
    assert list(model) == model.layers
    tail = model[3:]
    assert isinstance(tail, L.Sequential) and len(tail) == 2 and tail[1] is second
    assert list(tail.named_vars()) == ["layers.1.W", "layers.1.b"]
    y.back()
    assert first.W.g is not None and second.b.g is not None
    lines = repr(model).splitlines()
    assert lines[0] == "Sequential(" and "  (layers.1): ReLU" in lines
    assert "  (layers.3): <lambda>" in lines and "  (layers.4): Linear(4, 2" in lines


def test_sequential_nesting_sharing_state_and_copies(rng):
    shared = L.Linear(2, 2, seed=0)
    model = L.Sequential(shared, L.Sequential(L.BatchNorm(2), shared), nn.Tanh)
    assert list(model.named_vars()) == ["layers.0.W", "layers.0.b", "layers.1.layers.0.gamma",
                                        "layers.1.layers.0.beta"]
    state = model.state()
    assert "layers.1.layers.0.stats.running_mean" in state
    clone = copy.deepcopy(model)
    assert clone[0] is clone[1][1] and clone[0] is not shared
    x = rng.standard_normal((4, 2))
    model(x)                                       # training moves the running statistics
    model.load_state(state)
    np.testing.assert_array_equal(model[1][0].stats.running_mean, np.zeros(2))
    assert isinstance(model, Module) and len(L.Sequential()) == 0 and L.Sequential()(x) is x


def test_layers_as_ffn_entries(rng):
    layer = L.Linear(3, 4, seed=0)
    net = nn.FFN((layer,), (nn.ReLU,))
    assert net.vars == [layer.W, layer.b]
    assert list(net.named_vars()) == ["topology.0.0.W", "topology.0.0.b"]
    x = rng.standard_normal((2, 3))
    np.testing.assert_allclose(net(x).data, np.maximum(layer(x).data, 0))
    net.back(np.ones((2, 4)))
    assert layer.W.g.shape == (3, 4)
    stack = nn.FFN((L.Sequential(L.Linear(4, 4, seed=1), L.BatchNorm(4)),), (layer,))
    assert len(stack.vars) == 6
    assert "topology.0.0.layers.1.stats.running_var" in stack.state()


# ----------------------------------------------------------------------------- BatchNorm buffers

def test_batchnorm_statistics_are_buffers_updated_in_training_used_in_evaluation(rng, float64):
    layer = L.BatchNorm(3, momentum=0.25, eps=1e-3)
    assert list(layer.named_vars()) == ["gamma", "beta"]
    assert list(layer.state()) == ["gamma", "beta", "stats.running_mean", "stats.running_var"]
    assert list(layer.named_buffers()) == ["stats.running_mean", "stats.running_var"]
    x = rng.standard_normal((8, 3)) * 3 + 2
    layer(x)
    np.testing.assert_allclose(layer.stats.running_mean, 0.25 * x.mean(axis=0))
    np.testing.assert_allclose(layer.stats.running_var, 0.75 + 0.25 * x.var(axis=0, ddof=1))
    saved = layer.state()
    np.testing.assert_array_equal(saved["stats.running_mean"], layer.stats.running_mean)
    layer.gamma.data = rng.standard_normal((1, 3))
    layer.beta.data = rng.standard_normal((1, 3))
    z = rng.standard_normal((2, 3))
    with nn.eval_mode():
        y = layer(z)
    mean, var = layer.stats.running_mean, layer.stats.running_var
    np.testing.assert_allclose(y.data, (z - mean) / np.sqrt(var + 1e-3) * layer.gamma.data
                               + layer.beta.data)
    np.testing.assert_array_equal(layer.stats.running_mean, saved["stats.running_mean"])
    fresh = L.BatchNorm(3, momentum=0.25, eps=1e-3).load_state(layer.state())
    with nn.eval_mode():
        np.testing.assert_array_equal(fresh(z).data, y.data)
    assert "(stats.running_mean): buffer (3,)" in repr(layer)


def test_extra_repr_shows_the_sizes():
    assert L.Linear(3, 4).extra_repr() == "3, 4"
    assert L.Linear(3, 4, bias=False).extra_repr() == "3, 4, bias=False"
    assert L.Conv2D(2, 5, (3, 1), stride=2).extra_repr() == \
        "2, 5, size=(3, 1), stride=(2, 2), padding=(0, 0)"
    assert L.BatchNorm(4).extra_repr() == "4, momentum=0.1, eps=1e-05"
    assert L.LayerNorm(4, eps=1e-6).extra_repr() == "4, eps=1e-06"
    assert L.Embedding(9, 2, padding_idx=-1).extra_repr() == "9, 2, padding_idx=8"
    assert L.RNN(2, 3, activation="relu").extra_repr() == "2, 3, activation='relu'"
    assert L.LSTM(2, 3).extra_repr() == "2, 3" and L.GRU(2, 3).extra_repr() == "2, 3"
    assert L.Dropout(0.25).extra_repr() == "p=0.25"
    assert repr(L.Linear(3, 4)).startswith("Linear(3, 4\n  (W): (3, 4)")


def test_layers_move_between_devices(backend, rng):
    model = L.Sequential(L.Conv2D(1, 2, 3, padding=1, seed=0), L.BatchNorm(2), nn.ReLU)
    x = rng.standard_normal((2, 1, 4, 4)).astype(np.float32)
    expected = model(x).data
    model[1].stats.reset()
    backend.move(model)
    np.testing.assert_allclose(backend.host(model(backend.array(x))), expected, rtol=1e-5,
                               atol=1e-6)


def test_a_recurrent_layers_state_of_lists_is_refused_naming_what_it_holds():
    # "state must be (h0, c0) ...; got tuple": it was a tuple, its items were the trouble
    x = np.zeros((2, 1, 3), np.float32)
    with pytest.raises(TypeError, match=r"layers.LSTM: state must be \(h0, c0\), each a NetVar "
                                        r"or an array .*; got a tuple of list, list"):
        nn.layers.LSTM(3, 2)(x, state=([[0.0, 0.0]], [[0.0, 0.0]]))
    with pytest.raises(TypeError, match=r"layers.GRU: .*; got a list of list"):
        nn.layers.GRU(3, 2)(x, state=[[0.0, 0.0]])


def test_sequential_names_the_entry_that_failed_and_refuses_a_non_node_result():
    # a function returning an array passed it on as a constant (the layers before it never
    # trained); errors did not say which entry raised them
    model = nn.layers.Sequential(nn.layers.Linear(3, 2, seed=0), lambda v: np.tanh(v.data))
    with pytest.raises(TypeError, match="layers.Sequential: entry 1 returned a ndarray, not a "
                                        "node"):
        model(np.ones((4, 3)))
    with pytest.raises(TypeError, match=r"layers.Sequential: entry 1 \(Add\): "):
        nn.layers.Sequential(nn.layers.Linear(3, 2, seed=0), nn.Add)(np.ones((4, 3)))


def test_moving_an_ffn_reaches_weights_in_dicts_and_namedtuples(monkeypatch):
    # the move looked into lists and tuples only: dict members stayed behind, and a
    # namedtuple failed in its constructor
    import collections
    moved = []
    monkeypatch.setattr(nn.NetVar, "to_gpu", lambda node, device=None: moved.append(node) or node)
    monkeypatch.setattr(nn.backend, "to_gpu", lambda array, device=None: array)   # no GPU here
    Pair = collections.namedtuple("Pair", "w b")
    w, b, v = nn.NetVar(np.ones((2, 2))), nn.NetVar(np.ones((1, 2))), nn.NetVar(np.ones((2, 2)))
    net = nn.FFN((lambda x, p: x @ p["w"] + p["b"], {"w": w, "b": b}),
                 (lambda x, p: x @ p.w, Pair(v, None)))
    net.to_gpu()
    assert {id(n) for n in moved} == {id(w), id(b), id(v)}
    assert isinstance(net.topology[1][1], Pair) and isinstance(net.topology[0][1], dict)
