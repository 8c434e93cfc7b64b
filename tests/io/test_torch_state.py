"""PyTorch state dicts to and from nnkit's layers: equal outputs and gradients both ways, every
key, shape and dtype checked before anything is assigned, and torch.save's files read without
PyTorch."""
import copy
import os
import pickle
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest

import nnkit as nn
from tests.io.helpers import with_one_bit_flipped
from nnkit.io.torch_state import _parts

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the equality tests "
                                            "compare with it")
L = nn.layers
TOLERANCE = {np.float32: 1e-6, np.float64: 1e-12}


def assert_close(actual, expected, tol, err_msg=""):
    """|actual − expected| ≤ tol · max(1, max |expected|): ``tol`` relative to the array's
    scale (float32 sums in another order differ by a few ulps of the largest terms)."""
    expected = np.asarray(expected)
    scale = max(1.0, float(np.abs(expected).max(initial=0)))
    np.testing.assert_allclose(actual, expected, rtol=0, atol=tol * scale, err_msg=err_msg)


@pytest.fixture(params=[np.float32, np.float64], ids=["float32", "float64"])
def dtype(request):
    previous = nn.get_dtype()
    nn.set_dtype(request.param)
    torch.manual_seed(0)
    yield request.param
    nn.set_dtype(previous)


def _torch_dtype(dtype):
    return torch.float32 if dtype == np.float32 else torch.float64


def _randomize(module):
    """Every parameter and buffer of a torch model drawn afresh (zero biases and unit
    statistics would hide a swapped or dropped one)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(torch.randn_like(p) * 0.5)
        for name, b in module.named_buffers():
            if name.endswith("running_var"):
                b.copy_(torch.rand_like(b) + 0.5)
            elif name.endswith("running_mean"):
                b.copy_(torch.randn_like(b))
            elif name.endswith("num_batches_tracked"):
                b.fill_(5)
        for m in module.modules():
            if isinstance(m, torch.nn.Embedding) and m.padding_idx is not None:
                m.weight[m.padding_idx] = 0


def _nn_grads_as_torch(model):
    """The gradients of the nnkit model's parameters in PyTorch's names and layouts (an
    RNN's or LSTM's one bias b gets the gradient of both of PyTorch's)."""
    grads = {name: p.g for name, p in model.named_vars().items()}
    out = {}
    for part in _parts(model):
        out.update(part.out(grads))
    for key in list(out):
        if "bias_hh_l" in key and key.replace("bias_hh", "bias_ih") in out and \
                not (np.asarray(out[key]) != 0).any():
            out[key] = out[key.replace("bias_hh", "bias_ih")]
    return out


def _compare(nn_model, torch_model, nn_call, torch_call, inputs, dtype, grad_of_inputs=True,
             tol=None):
    """Same outputs, and the same gradients of inputs and parameters for one random upstream
    gradient; returns the PyTorch model that computed the reference.

    In float32 the reference is PyTorch's float64 computation on the same (float32) weights and
    inputs: two float32 computations summing in different orders differ by more than either
    differs from the exact value (a deep model's gradient: PyTorch's float32 is 8e-7 from it,
    nnkit's 4e-7, and they are 1.2e-6 apart), so nnkit's float32 is held to 1e-6 of the exact
    value (``tol`` overrides that, for a model whose gradients amplify rounding)."""
    tol = TOLERANCE[dtype] if tol is None else tol
    if dtype == np.float32:
        torch_model = copy.deepcopy(torch_model).double()
    nn_inputs = [nn.NetVar(x, requires_grad=grad_of_inputs) for x in inputs]
    torch_inputs = [torch.tensor(x.astype(np.float64) if x.dtype.kind == "f" else x,
                                 requires_grad=grad_of_inputs and x.dtype.kind == "f")
                    for x in inputs]
    y = nn_call(nn_model, *nn_inputs)
    expected = torch_call(torch_model, *torch_inputs)
    assert y.dtype == dtype
    assert_close(y.data.reshape(expected.shape), expected.detach().numpy(), tol)
    g = np.random.default_rng(3).standard_normal(expected.shape).astype(dtype)
    y.back(g.reshape(y.shape))
    expected.backward(torch.tensor(g.astype(np.float64)))
    if grad_of_inputs:
        for mine, theirs in zip(nn_inputs, torch_inputs):
            assert_close(mine.g.reshape(theirs.shape), theirs.grad.numpy(), tol)
    mine = _nn_grads_as_torch(nn_model)
    theirs = {name: p.grad.numpy() for name, p in torch_model.named_parameters()}
    assert mine.keys() == theirs.keys()
    for name in theirs:
        assert_close(mine[name], theirs[name], tol, err_msg=name)
    return torch_model


def _both_ways(make_nn, make_torch, nn_call, torch_call, inputs, dtype, grad_of_inputs=True,
               tol=None):
    """torch → nnkit (load_torch_state) and nnkit → torch (torch_state), compared each time."""
    source = make_torch().to(_torch_dtype(dtype))
    _randomize(source)
    model = nn.load_torch_state(make_nn(), source.state_dict())
    _compare(model, source, nn_call, torch_call, inputs, dtype, grad_of_inputs, tol)

    model = make_nn()
    rng = np.random.default_rng(5)
    for p in model.vars:                    # drawn here: nonzero biases too
        p.data = (rng.standard_normal(p.shape) * 0.5).astype(dtype)
    target = make_torch().to(_torch_dtype(dtype))
    target.load_state_dict({key: torch.from_numpy(value)
                            for key, value in nn.torch_state(model).items()})
    reference = _compare(model, target, nn_call, torch_call, inputs, dtype, grad_of_inputs, tol)
    return model, reference


def _x(*shape, dtype=np.float64):
    return np.random.default_rng(sum(shape)).standard_normal(shape).astype(dtype)


# ----------------------------------------------------------------------------- each layer

def test_linear(dtype):
    _both_ways(lambda: L.Linear(5, 3), lambda: torch.nn.Linear(5, 3),
               lambda m, x: m(x), lambda m, x: m(x), [_x(4, 5, dtype=dtype)], dtype)
    _both_ways(lambda: L.Linear(5, 3, bias=False), lambda: torch.nn.Linear(5, 3, bias=False),
               lambda m, x: m(x), lambda m, x: m(x), [_x(4, 5, dtype=dtype)], dtype)


def test_conv2d(dtype):
    _both_ways(lambda: L.Conv2D(2, 3, 3, stride=(1, 2), padding=1),
               lambda: torch.nn.Conv2d(2, 3, 3, stride=(1, 2), padding=1),
               lambda m, x: m(x), lambda m, x: m(x), [_x(2, 2, 6, 7, dtype=dtype)], dtype)


@pytest.mark.parametrize("shape, torch_layer", [((6, 4), torch.nn.BatchNorm1d),
                                                ((3, 4, 3, 2), torch.nn.BatchNorm2d)])
def test_batchnorm_in_training_and_evaluation(dtype, shape, torch_layer):
    model, target = _both_ways(lambda: L.BatchNorm(4), lambda: torch_layer(4),
                               lambda m, x: m(x), lambda m, x: m(x), [_x(*shape, dtype=dtype)],
                               dtype)
    tol = TOLERANCE[dtype]
    state = nn.torch_state(model)              # the running statistics after one step
    for key, value in target.state_dict().items():
        assert_close(state[key], value.numpy(), tol, err_msg=key)
    assert state["num_batches_tracked"].dtype == np.int64
    x = _x(*shape, dtype=dtype)
    target.eval()
    with nn.eval_mode():
        assert_close(model(x).data, target(torch.tensor(x.astype(np.float64))).detach().numpy(),
                     tol)


def test_batchnorm_counter_and_statistics_come_from_the_state_dict(dtype):
    source = torch.nn.BatchNorm1d(3).to(_torch_dtype(dtype))
    _randomize(source)
    model = nn.load_torch_state(L.BatchNorm(3), source.state_dict())
    assert model.stats.num_batches_tracked == 5
    np.testing.assert_array_equal(model.stats.running_var, source.running_var.numpy())


def test_layernorm(dtype):
    _both_ways(lambda: L.LayerNorm(6), lambda: torch.nn.LayerNorm(6), lambda m, x: m(x),
               lambda m, x: m(x), [_x(3, 4, 6, dtype=dtype)], dtype)


def test_embedding_with_a_padding_row(dtype):
    ids = np.array([[1, 2, 9], [2, 0, 2]])
    _both_ways(lambda: L.Embedding(10, 4, padding_idx=2),
               lambda: torch.nn.Embedding(10, 4, padding_idx=2),
               lambda m, i: m(i.data.astype(int)), lambda m, i: m(i), [ids], dtype,
               grad_of_inputs=False)


RECURRENT = [(L.RNN, torch.nn.RNN, {}), (L.LSTM, torch.nn.LSTM, {}), (L.GRU, torch.nn.GRU, {}),
             (lambda i, h: L.RNN(i, h, activation="relu"), torch.nn.RNN,
              {"nonlinearity": "relu"})]


@pytest.mark.parametrize("nn_layer, torch_layer, options", RECURRENT,
                         ids=["rnn", "lstm", "gru", "rnn-relu"])
def test_recurrent_layers(dtype, nn_layer, torch_layer, options):
    _both_ways(lambda: nn_layer(3, 5), lambda: torch_layer(3, 5, **options),
               lambda m, x: m(x), lambda m, x: m(x)[0], [_x(4, 2, 3, dtype=dtype)], dtype)


@pytest.mark.parametrize("nn_layer, torch_layer, options", RECURRENT[:3],
                         ids=["rnn", "lstm", "gru"])
def test_stacked_recurrent_layers(dtype, nn_layer, torch_layer, options):
    model, _ = _both_ways(
        lambda: L.Sequential(nn_layer(3, 5), nn_layer(5, 5), nn_layer(5, 5)),
        lambda: torch_layer(3, 5, num_layers=3), lambda m, x: m(x), lambda m, x: m(x)[0],
        [_x(4, 2, 3, dtype=dtype)], dtype)
    assert "weight_hh_l2" in nn.torch_state(model)


@pytest.mark.parametrize("bias", [True, False])
def test_multihead_attention(dtype, bias):
    _both_ways(lambda: L.MultiHeadAttention(8, 2, bias=bias),
               lambda: torch.nn.MultiheadAttention(8, 2, bias=bias),
               lambda m, x: m(x), lambda m, x: m(x, x, x, need_weights=False)[0],
               [_x(5, 3, 8, dtype=dtype)], dtype)


def _torch_encoder():
    return torch.nn.TransformerEncoderLayer(
        8, 2, 16, dropout=0.0, norm_first=True,
        activation=lambda x: torch.nn.functional.gelu(x, approximate="tanh"))


def test_transformer_encoder_layer(dtype):
    _both_ways(lambda: L.TransformerEncoderLayer(8, 2, 16), _torch_encoder,
               lambda m, x: m(x), lambda m, x: m(x), [_x(5, 3, 8, dtype=dtype)], dtype)


# ----------------------------------------------------------------------------- a mixed model

class Tagger(nn.Module):
    def __init__(self):
        self.embed = L.Embedding(12, 8, padding_idx=0)
        self.encoder = L.TransformerEncoderLayer(8, 2, 16)
        self.rnn = L.Sequential(L.LSTM(8, 6), L.LSTM(6, 6))
        self.head = L.Sequential(L.Linear(6, 6), nn.ReLU, L.LayerNorm(6), L.Linear(6, 4))
        self.scale = nn.NetVar(np.ones((1, 4)), dtype=nn.get_dtype())   # the model's own

    def forward(self, ids):
        h = self.rnn(self.encoder(self.embed(ids)))
        return self.head(nn.Reshape(h, (-1, 6))) * self.scale


class TorchTagger(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(12, 8, padding_idx=0)
        self.encoder = _torch_encoder()
        self.rnn = torch.nn.LSTM(8, 6, num_layers=2)
        self.head = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.ReLU(),
                                        torch.nn.LayerNorm(6), torch.nn.Linear(6, 4))
        self.scale = torch.nn.Parameter(torch.ones(1, 4))

    def forward(self, ids):
        h = self.rnn(self.encoder(self.embed(ids)))[0]
        return self.head(h.reshape(-1, 6)) * self.scale


def test_a_model_mixing_the_layers(dtype):
    # float32: the head's LayerNorm over 6 features amplifies rounding on its way back, so the
    # gradients before it stand further from the exact ones than one layer's do: over twelve
    # draws of the weights, up to 1.7e-6 (and 4.4e-6 since GELU's float32 slope, 6× closer to
    # the exact one alone, rounds otherwise); a wrong layer is off by far more.
    tol = 1e-5 if dtype == np.float32 else None
    ids = np.array([[1, 4, 7], [3, 0, 11], [5, 5, 0], [2, 9, 0]])     # (T, B)
    model, _ = _both_ways(Tagger, TorchTagger, lambda m, i: m(i.data.astype(int)),
                          lambda m, i: m(i), [ids], dtype, grad_of_inputs=False, tol=tol)
    assert sorted(nn.torch_state(model)) == sorted(TorchTagger().state_dict())


# ----------------------------------------------------------------------------- refusals

def _snapshot(model):
    return {name: array.copy() for name, array in model.state().items()}


def _unchanged(model, before):
    after = model.state()
    assert after.keys() == before.keys()
    for name in before:
        np.testing.assert_array_equal(after[name], before[name])


def _make_tagger():
    previous = nn.get_dtype()
    nn.set_dtype(np.float32)
    try:
        return Tagger()
    finally:
        nn.set_dtype(previous)


@pytest.mark.parametrize("edit, error, fault", [
    (lambda s: s.pop("rnn.bias_hh_l1"), ValueError,
     "no 'rnn.bias_hh_l1', which the model's 'rnn' \\(a stack of 2 layers.LSTM\\) needs"),
    (lambda s: s.update({"rnn.weight_ih_l2": torch.zeros(24, 6)}), ValueError,
     "'rnn.weight_ih_l2' has no place in the model: its layer 'rnn' .*takes "
     "\\['rnn.weight_ih_l0'"),
    (lambda s: s.update({"decoder.weight": torch.zeros(2)}), ValueError,
     "'decoder.weight' has no place in the model \\(no layer"),
    (lambda s: s.update({"head.0.weight": torch.zeros(6, 5)}), ValueError,
     "'head.0.weight' is \\(6, 5\\) in the state dict; the model's 'head.0' \\(layers.Linear\\) "
     "needs \\(6, 6\\)"),
    (lambda s: s.update({"head.3.bias": torch.zeros(4, dtype=torch.float64)}), TypeError,
     "'head.3.bias' is float64 in the state dict and float32 in the model's 'head.3'"),
    (lambda s: s.update({"scale": [1, 2, 3, 4]}), TypeError, "'scale' is a list"),
    (lambda s: s.update({"encoder.norm1.bias": torch.full((8,), float("nan"))}), None, None),
    (lambda s: s.update({"encoder.self_attn.in_proj_weight": torch.zeros(8, 8)}), ValueError,
     "in_proj_weight' is \\(8, 8\\) in the state dict; the model's 'encoder.self_attn' "
     "\\(layers.MultiHeadAttention\\) needs \\(24, 8\\)"),
])
def test_a_state_dict_that_does_not_fit_is_refused_and_nothing_changes(edit, error, fault):
    source = TorchTagger()
    state = source.state_dict()
    edit(state)
    model = _make_tagger()
    before = _snapshot(model)
    if error is None:               # a NaN is a value: taken (load_state assigns it)
        nn.load_torch_state(model, state)
        assert np.isnan(model.encoder.norm1.beta.data).all()
        return
    with pytest.raises(error, match=fault):
        nn.load_torch_state(model, state)
    _unchanged(model, before)


def test_a_bad_running_variance_is_refused_by_the_layers_own_check():
    source = torch.nn.BatchNorm1d(3)
    state = source.state_dict()
    state["running_var"] = torch.tensor([1.0, -1.0, 1.0])
    model = L.BatchNorm(3)
    before = _snapshot(model)
    with pytest.raises(ValueError, match="negative"):
        nn.load_torch_state(model, state)
    _unchanged(model, before)
    assert model.stats.num_batches_tracked == 0


def test_numpy_arrays_and_bfloat16_tensors_are_taken():
    source = torch.nn.Linear(3, 2)
    state = {"weight": source.weight.detach().numpy(),
             "bias": source.bias.detach().to(torch.bfloat16)}
    model = nn.load_torch_state(L.Linear(3, 2), state)
    np.testing.assert_array_equal(model.W.data, source.weight.detach().numpy().T)
    np.testing.assert_array_equal(model.b.data[0], source.bias.detach().to(torch.bfloat16).float())


def test_big_endian_arrays_are_taken_and_meta_tensors_refused_naming_the_key():
    # '>f4' was refused with "build the model in >f4" about "the model's the model"; a tensor
    # of the meta device raised PyTorch's own NotImplementedError, naming no key
    source = torch.nn.Linear(3, 2)
    weight = source.weight.detach().numpy()
    model = nn.load_torch_state(L.Linear(3, 2), {"weight": weight.astype(">f4"),
                                                 "bias": source.bias.detach().numpy()})
    np.testing.assert_array_equal(model.W.data, weight.T)
    assert model.W.data.dtype == np.float32
    before = model.W.data.copy()
    with pytest.raises(TypeError, match="'weight' is a tensor on PyTorch's meta device"):
        nn.load_torch_state(model, {"weight": torch.empty(2, 3, device="meta"),
                                    "bias": torch.zeros(2)})
    with pytest.raises(TypeError, match="in the model's own layers.Linear; build the model"):
        nn.load_torch_state(model, {"weight": weight.astype(np.float64),
                                    "bias": np.zeros(2)})
    np.testing.assert_array_equal(model.W.data, before)


def test_a_vector_parameter_fills_a_row_parameter():
    class Scaled(nn.Module):
        def __init__(self):
            self.scale = nn.NetVar(np.ones(3, np.float32))     # nnkit's (1, 3) row

    model = nn.load_torch_state(Scaled(), {"scale": torch.tensor([1.0, 2.0, 3.0])})
    np.testing.assert_array_equal(model.scale.data, [[1, 2, 3]])
    with pytest.raises(ValueError, match="'scale' is \\(2,\\) in the state dict"):
        nn.load_torch_state(model, {"scale": torch.tensor([1.0, 2.0])})



def test_an_integer_constant_of_several_values_round_trips():
    # the check of the BatchNorm batch counter read every integer array as one count: a
    # model holding an integer table raised numpy's "only 0-dimensional arrays can be
    # converted to Python scalars"
    class Picked(nn.Module):
        def __init__(self):
            self.order = nn.NetVar(np.array([[0, 2, 1]]), dtype=np.int64, requires_grad=False)

    model = Picked()
    state = nn.torch_state(model)
    state["order"] = np.array([[2, -1, 0]])
    nn.load_torch_state(model, {key: torch.from_numpy(value) for key, value in state.items()})
    np.testing.assert_array_equal(model.order.data, [[2, -1, 0]])

def test_a_model_nnkit_cannot_map_is_refused():
    with pytest.raises(TypeError, match="must be an nnkit Module"):
        nn.torch_state({"w": nn.NetVar([1.0])})
    with pytest.raises(TypeError, match="state_dict must be a dict"):
        nn.load_torch_state(L.Linear(2, 2), [1, 2])


def test_two_arrays_of_one_pytorch_key_are_refused_both_ways_and_nothing_changes():
    # a dict key holding a dot: the Linear's weight and the parameter were both 'd.x.weight';
    # the export dropped one and the import wrote one tensor into both
    class Holder(nn.Module):
        def __init__(self):
            self.d = {"x": L.Linear(2, 2, seed=0), "x.weight": nn.NetVar(np.full((2, 2), 7.0))}

    model = Holder()
    before = {name: array.copy() for name, array in model.state().items()}
    message = (r"PyTorch's 'd.x.weight' would hold two of the model's arrays: of 'd.x' "
               r"\(layers.Linear\) and of 'd.x.weight' \(a parameter\)")
    with pytest.raises(TypeError, match=message):
        nn.torch_state(model)
    with pytest.raises(TypeError, match=message):
        nn.load_torch_state(model, {"d.x.weight": np.ones((2, 2)), "d.x.bias": np.zeros(2)})
    for name, array in model.state().items():
        np.testing.assert_array_equal(array, before[name])


# ----------------------------------------------------------------------------- .pt files

def test_a_torch_save_file_loads_through_nn_load(tmp_path):
    source = TorchTagger()
    _randomize(source)
    file = str(tmp_path / "tagger.pt")
    torch.save(source.state_dict(), file)
    model = _make_tagger()
    assert nn.load(file, model).model is model
    ids = np.array([[1, 4], [3, 0]])
    np.testing.assert_allclose(model(ids).data, source(torch.tensor(ids)).detach().numpy(),
                               rtol=1e-6, atol=1e-6)
    with pytest.raises(nn.CheckpointError, match="give the nnkit model"):
        nn.load(file)


def test_views_sharing_a_storage_and_every_dtype_read_back(tmp_path):
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    state = {"view": base[1:, ::2], "transposed": base.t(), "f16": base.half(),
             "bf16": base.to(torch.bfloat16), "i8": base.to(torch.int8),
             "i64": base.long(), "u8": base.to(torch.uint8), "bool": base > 5,
             "scalar": torch.tensor(3), "empty": torch.zeros(0, 3), "f32": base.float()}
    file = str(tmp_path / "all.pt")
    torch.save(state, file)
    read = nn.read_torch_file(file)
    for key, tensor in state.items():
        expected = tensor.float() if tensor.dtype == torch.bfloat16 else tensor
        np.testing.assert_array_equal(read[key], expected.numpy(), err_msg=key)
        assert read[key].dtype == expected.numpy().dtype


def test_a_torch_file_loads_with_pytorch_hidden(tmp_path):
    source = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    _randomize(source)
    file = str(tmp_path / "model.pt")
    torch.save(source.state_dict(), file)
    expected = str(tmp_path / "expected.npz")
    np.savez(expected, **{k: v.numpy() for k, v in source.state_dict().items()})
    script = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None         # import torch now raises ImportError
        import numpy as np
        import nnkit as nn
        model = nn.layers.Sequential(nn.layers.Linear(3, 4), nn.layers.BatchNorm(4))
        nn.load({file!r}, model)
        expected = np.load({expected!r})
        state = nn.torch_state(model)
        for key in expected.files:
            np.testing.assert_array_equal(state[key], expected[key])
        assert "torch" not in sys.modules or sys.modules["torch"] is None
        print("loaded", len(state))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": os.getcwd()}, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "loaded 7" in result.stdout


class _Boom:
    def __reduce__(self):
        return (os.system, ("echo ran > " + os.environ.get("BOOM_FILE", "/nonexistent"),))


def _rewrite_pickle(file, payload):
    """A torch.save archive whose data.pkl is replaced by ``payload``."""
    with zipfile.ZipFile(file) as archive:
        records = {name: archive.read(name) for name in archive.namelist()}
    name = next(name for name in records if name.endswith("/data.pkl"))
    records[name] = payload
    with zipfile.ZipFile(file, "w") as archive:
        for key, content in records.items():
            archive.writestr(key, content)


def test_a_file_asking_for_other_classes_is_refused_without_running_them(tmp_path, monkeypatch):
    file = str(tmp_path / "evil.pt")
    torch.save({"w": torch.ones(2)}, file)
    flag = tmp_path / "ran"
    monkeypatch.setenv("BOOM_FILE", str(flag))
    _rewrite_pickle(file, pickle.dumps({"w": _Boom()}, protocol=2))
    with pytest.raises(nn.CheckpointError, match="asks for (posix|os|nt).system, which is not "
                                                 "one of the classes a state dict needs"):
        nn.read_torch_file(file)
    assert not flag.exists()

    torch.save(torch.nn.Linear(2, 2), file)         # a whole module, not its state dict
    with pytest.raises(nn.CheckpointError, match="torch.nn.modules.linear.Linear.*save "
                                                 "model.state_dict\\(\\), not the model"):
        nn.read_torch_file(file)


def test_any_flipped_byte_is_refused_or_changes_nothing(tmp_path):
    source = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    _randomize(source)
    file = str(tmp_path / "model.pt")
    torch.save(source.state_dict(), file)
    expected = {key: value.numpy() for key, value in source.state_dict().items()}
    refused = 0
    for _ in with_one_bit_flipped(file, 200):
        try:
            read = nn.read_torch_file(file)
        except nn.CheckpointError:
            refused += 1
            continue
        assert read.keys() == expected.keys()     # a byte the zip does not check (a comment,
        for key in expected:                      # a timestamp, an unused record's header)
            np.testing.assert_array_equal(read[key], expected[key])
    assert refused > 50         # torch.save pads each record to 64 bytes in fields zip
                                # does not check: a flip there changes nothing


def test_truncated_short_and_old_files_are_refused(tmp_path):
    file = str(tmp_path / "model.pt")
    torch.save(torch.nn.Linear(3, 2).state_dict(), file)
    content = open(file, "rb").read()
    model = L.Linear(3, 2)
    before = _snapshot(model)
    for size in (0, 10, len(content) // 2, len(content) - 30):
        with open(file, "wb") as out:
            out.write(content[:size])
        with pytest.raises(nn.CheckpointError):
            nn.load(file, model)
    _unchanged(model, before)

    torch.save(torch.nn.Linear(3, 2).state_dict(), file)
    with zipfile.ZipFile(file) as archive:
        records = {name: archive.read(name) for name in archive.namelist()}
    storage = next(name for name in records if name.endswith("/data/0"))
    records[storage] = records[storage][:-4]
    with zipfile.ZipFile(file, "w") as archive:
        for key, value in records.items():
            archive.writestr(key, value)
    with pytest.raises(nn.CheckpointError, match="holds 20 bytes, not 6 FloatStorage elements"):
        nn.load(file, model)
    _unchanged(model, before)

    torch.save(torch.nn.Linear(3, 2).state_dict(), file, _use_new_zipfile_serialization=False)
    with pytest.raises(nn.CheckpointError, match="older PyTorch must be loaded and saved again"):
        nn.read_torch_file(file)
    with pytest.raises(FileNotFoundError, match="no file at"):
        nn.read_torch_file(str(tmp_path / "missing.pt"))
