"""Checkpoints as safetensors files: round trips, exchange with the safetensors package, and
hostile files refused with the model untouched."""
import json
import os
import struct

import numpy as np
import pytest

import nnkit as nn
from tests.io.helpers import with_one_bit_flipped
from nnkit.io.safetensors import read_safetensors, write_safetensors


def _net(seed=0):
    nn.seed(seed)
    return nn.FFN((nn.Multiply, nn.glorot(4, 8)), (nn.Add, nn.zeros(8)), (nn.LReLU, 0.1),
                  (nn.Multiply, nn.glorot(8, 3)), (nn.Add, nn.zeros(3)))


def _model(seed=0):
    return nn.layers.Sequential(nn.layers.Linear(4, 6, seed=seed), nn.ReLU,
                                nn.layers.BatchNorm(6), nn.layers.Linear(6, 3, seed=seed + 1))


def _train(model, opt, steps=3):
    rng = np.random.default_rng(1)
    for _ in range(steps):
        x = nn.NetVar(rng.standard_normal((8, 4)).astype(np.float32), requires_grad=False)
        nn.SoftmaxCELoss(model(x), rng.integers(0, 3, 8)).back()
        opt.step()


def _state(model):
    return {name: array.copy() for name, array in model.state().items()}


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype
        np.testing.assert_array_equal(a[name], b[name])


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "model.safetensors")


# ----------------------------------------------------------------------------- round trips

def test_a_module_with_its_optimizer_and_extra_round_trips(path):
    model = _model()
    opt = nn.Adam(model.vars, lr=0.01)
    _train(model, opt)
    nn.save(path, model, optimizer=opt, extra={"epoch": 3})

    loaded, loaded_opt = _model(seed=7), None
    loaded_opt = nn.Adam(loaded.vars, lr=0.5)
    checkpoint = nn.load(path, loaded, optimizer=loaded_opt)
    assert checkpoint.extra == {"epoch": 3} and checkpoint.model is loaded
    _assert_same(_state(loaded), _state(model))
    assert loaded_opt.lr == 0.01 and loaded_opt.state[0]["t"] == 3
    for mine, theirs in zip(loaded_opt.state, opt.state):
        np.testing.assert_array_equal(mine["m"], theirs["m"])
        np.testing.assert_array_equal(mine["v"], theirs["v"])
    tensors, metadata = read_safetensors(path)
    assert "layers.0.W" in tensors and "layers.2.stats.running_var" in tensors
    assert "__optimizer__.layers.0.W.m" in tensors          # the optimizer under its prefix
    description = json.loads(metadata["nnkit"])
    assert description["format"] == "nnkit-checkpoint" and description["version"] == 2
    assert description["params"][0] == {"name": "layers.0.W", "array": {
        "key": "layers.0.W", "shape": [4, 6], "dtype": "float32"}}


def test_an_ffn_is_rebuilt_without_a_model(path):
    net = _net()
    net.topology.insert(2, (nn.Mul, np.array([[2.0]], np.float32)))    # a topology constant
    nn.save(path, net)
    rebuilt = nn.load(path).model
    x = nn.NetVar(np.random.default_rng(0).standard_normal((5, 4)), requires_grad=False)
    np.testing.assert_array_equal(rebuilt(x).data, net(x).data)
    tensors, metadata = read_safetensors(path)
    assert json.loads(metadata["nnkit"])["topology"] is not None
    assert [name for name in tensors if name.startswith("__nnkit__.")] == ["__nnkit__.a4"]


def test_float16_32_64_round_trip_bit_exactly(path):
    rng = np.random.default_rng(0)
    params = {}
    for dtype in (np.float16, np.float32, np.float64):
        values = rng.standard_normal((3, 5)).astype(dtype)
        values[0, :3] = [np.nan, np.inf, -0.0]
        bits = values.view(f"u{values.itemsize}")
        bits[1, 0] |= 1                     # a payload the last bit carries
        params[np.dtype(dtype).name] = nn.NetVar(values)
    before = {name: p.data.copy() for name, p in params.items()}
    nn.save(path, params)
    loaded = nn.load(path).model
    for name, values in before.items():
        assert loaded[name].dtype == values.dtype
        assert loaded[name].data.tobytes() == values.tobytes()


def test_every_dtype_round_trips_through_the_file_format(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {np.dtype(dtype).name: (rng.standard_normal((2, 3)) * 100).astype(dtype)
               for dtype in (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32,
                             np.int64, np.uint8, np.uint16, np.uint32, np.uint64)}
    tensors["bool"] = np.array([True, False, True])
    tensors["empty"] = np.zeros((0, 4), np.float32)
    tensors["scalar"] = np.array(2.5)
    tensors["big-endian"] = np.arange(4, dtype=">i4")
    file = str(tmp_path / "all.safetensors")
    write_safetensors(file, tensors, {"note": "hello"})
    read, metadata = read_safetensors(file)
    assert metadata == {"note": "hello"}
    for name, array in tensors.items():
        assert read[name].shape == array.shape
        assert read[name].dtype == array.dtype.newbyteorder("=")
        np.testing.assert_array_equal(read[name], array)
        assert read[name].flags.writeable


def test_the_header_is_padded_to_eight_bytes(path):
    write_safetensors(path, {"a": np.ones(3, np.float32)})
    with open(path, "rb") as file:
        length = struct.unpack("<Q", file.read(8))[0]
    assert length % 8 == 0


# ----------------------------------------------------------------------------- the package

def test_files_load_with_the_safetensors_package(path):
    numpy_files = pytest.importorskip("safetensors.numpy", reason="safetensors is not installed")
    model = _model()
    nn.save(path, model)
    _assert_same(numpy_files.load_file(path), _state(model))


def test_files_load_with_the_safetensors_package_in_torch(path):
    pytest.importorskip("safetensors", reason="safetensors is not installed")
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    from safetensors.torch import load_file
    model = _model()
    nn.save(path, model)
    loaded = load_file(path)
    _assert_same({name: tensor.numpy() for name, tensor in loaded.items()}, _state(model))
    assert all(isinstance(tensor, torch.Tensor) for tensor in loaded.values())


def test_a_file_the_safetensors_package_wrote_loads_into_a_model(path):
    numpy_files = pytest.importorskip("safetensors.numpy", reason="safetensors is not installed")
    source = _model(seed=3)
    numpy_files.save_file(_state(source), path)
    model = _model()
    nn.load(path, model)
    _assert_same(_state(model), _state(source))


def test_a_file_safetensors_torch_wrote_loads_and_bfloat16_widens_exactly(tmp_path):
    pytest.importorskip("safetensors", reason="safetensors is not installed")
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    from safetensors.torch import save_file
    file = str(tmp_path / "t.safetensors")
    values = torch.randn(4, 5, dtype=torch.float64)
    save_file({"w": values.float(), "b": values.to(torch.bfloat16), "i": torch.arange(3)}, file)
    tensors, _ = read_safetensors(file)
    np.testing.assert_array_equal(tensors["w"], values.float().numpy())
    assert tensors["b"].dtype == np.float32
    np.testing.assert_array_equal(tensors["b"], values.to(torch.bfloat16).float().numpy())
    np.testing.assert_array_equal(tensors["i"], np.arange(3))

    source = _model(seed=3)
    save_file({name: torch.from_numpy(array) for name, array in _state(source).items()}, file)
    model = _model()
    nn.load(file, model)
    _assert_same(_state(model), _state(source))


# ----------------------------------------------------------------------------- refusals

def _raw(header, data=b"", pad=True, length=None):
    text = json.dumps(header).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text) if length is None else length) + text + data


GOOD = {"layers.0.W": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}


@pytest.mark.parametrize("content, fault", [
    (b"\x01\x00", "fewer than the 8"),
    (struct.pack("<Q", 200_000_000) + b"{}", "over the limit"),
    (_raw(GOOD, b"\0" * 8, length=10_000), "more than the"),
    (_raw(GOOD, b"\0" * 4), "ends at byte 8 of a data block of 4"),
    (_raw(GOOD, b"\0" * 12), "4 bytes follow the last tensor"),
    (b"\x08\x00\x00\x00\x00\x00\x00\x00[1,2,3] ", "not a JSON object"),
    (b"\x04\x00\x00\x00\x00\x00\x00\x00\xff\xfe{}", "not UTF-8 JSON"),
    (_raw({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12),
     "overlapping offsets"),
    (_raw({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
           "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}, b"\0" * 12),
     "leaving a hole"),
    (_raw({"a": {"dtype": "F64", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8),
     "16 bytes, but its data_offsets"),
    (_raw({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, b"\0" * 8),
     "not \\[begin, end\\]"),
    (_raw({"a": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}}, b"\0" * 2),
     "has dtype 'F8_E4M3'"),
    (_raw({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 0]}}), "not a list of sizes"),
    (_raw({"a": {"dtype": "F32", "shape": [1]}}), "not {dtype, shape, data_offsets}"),
    (_raw({"__metadata__": {"a": 1}}), "__metadata__ is not an object of strings"),
    (b"\x18\x00\x00\x00\x00\x00\x00\x00" + b'{"a":{}, "a":{}}        ', "names 'a' twice"),
])
def test_hostile_files_are_refused_and_the_model_is_untouched(path, content, fault):
    model = _model()
    before = _state(model)
    with open(path, "wb") as file:
        file.write(content)
    with pytest.raises(nn.CheckpointError, match=fault):
        nn.load(path, model)
    _assert_same(_state(model), before)


def test_every_truncation_of_a_checkpoint_is_refused(path):
    model = _model()
    opt = nn.Adam(model.vars)
    _train(model, opt, 1)
    nn.save(path, model, optimizer=opt)
    content = open(path, "rb").read()
    target, target_opt = _model(seed=5), None
    target_opt = nn.Adam(target.vars)
    before = _state(target)
    for size in list(range(0, 64, 7)) + list(range(64, len(content), 97)) + [len(content) - 1]:
        with open(path, "wb") as file:
            file.write(content[:size])
        with pytest.raises(nn.CheckpointError):
            nn.load(path, target, optimizer=target_opt)
        _assert_same(_state(target), before)
        assert target_opt.state[0] == {} or "t" not in target_opt.state[0] or \
            target_opt.state[0]["t"] == 0


def test_any_flipped_byte_is_refused_or_changes_nothing(path):
    """The format has no checksum: nnkit's files carry one, so a flipped data byte or a changed
    ``extra`` is refused, not loaded as a silently different model."""
    model = _model()
    opt = nn.Adam(model.vars)
    _train(model, opt, 1)
    nn.save(path, model, optimizer=opt, extra={"epoch": 3})
    expected = _state(model)
    refused = 0
    for _ in with_one_bit_flipped(path, 150):
        target = _model(seed=5)
        before = _state(target)
        try:
            checkpoint = nn.load(path, target, optimizer=nn.Adam(target.vars))
        except nn.CheckpointError:
            refused += 1
            _assert_same(_state(target), before)
        else:                               # whitespace of the JSON header: the same model
            _assert_same(_state(target), expected)
            assert checkpoint.extra == {"epoch": 3}
    assert refused > 100


def test_a_flipped_data_byte_is_refused_by_the_checksum(path):
    nn.save(path, _model(), extra={"epoch": 3})
    content = bytearray(open(path, "rb").read())
    content[-3] ^= 0x10                     # inside the last tensor's bytes
    with open(path, "wb") as file:
        file.write(content)
    with pytest.raises(nn.CheckpointError, match="does not match its checksum"):
        read_safetensors(path)


def _rewrite(path, change):
    """Load the file's tensors and header, let ``change`` edit them, write it back."""
    tensors, metadata = read_safetensors(path)
    description = json.loads(metadata["nnkit"])
    change(tensors, description)
    write_safetensors(path, tensors, {"nnkit": json.dumps(description)})


@pytest.mark.parametrize("change, fault", [
    (lambda t, d: t.update({"layers.0.W": t["layers.0.W"].T.copy()}),
     "described as float32 \\(4, 6\\) but stored as float32 \\(6, 4\\)"),
    (lambda t, d: t.update({"layers.0.W": t["layers.0.W"].astype(np.float64)}),
     "stored as float64"),
    (lambda t, d: t.pop("layers.3.b"), "the tensor 'layers.3.b', which the file does not hold"),
    (lambda t, d: t.update({"stray": np.zeros(2, np.float32)}),
     "the tensor 'stray' is in no entry"),
    (lambda t, d: d["params"][1]["array"].update(key="layers.0.W"), "'layers.0.W' twice"),
    (lambda t, d: d.update(params=7), "description is malformed"),
])
def test_a_tampered_description_is_refused_and_the_model_is_untouched(path, change, fault):
    nn.save(path, _model(seed=2))
    _rewrite(path, change)
    model = _model()
    before = _state(model)
    with pytest.raises(nn.CheckpointError, match=fault):
        nn.load(path, model)
    _assert_same(_state(model), before)


def test_a_file_of_another_model_is_refused_naming_the_difference(path):
    nn.save(path, nn.layers.Sequential(nn.layers.Linear(4, 5)))
    model = _model()
    before = _state(model)
    with pytest.raises(nn.CheckpointError, match=f"'{path}' does not match the model"):
        nn.load(path, model)
    _assert_same(_state(model), before)


def test_a_foreign_file_must_hold_exactly_the_models_names(path):
    model = _model()
    before = _state(model)
    state = _state(_model(seed=4))
    write_safetensors(path, {**state, "extra.weight": np.zeros(2, np.float32)})
    with pytest.raises(nn.CheckpointError, match="'extra.weight' is not in the model"):
        nn.load(path, model)
    write_safetensors(path, {name: a for name, a in state.items() if name != "layers.0.b"})
    with pytest.raises(nn.CheckpointError, match="'layers.0.b' is not in the file"):
        nn.load(path, model)
    _assert_same(_state(model), before)
    with pytest.raises(nn.CheckpointError, match="give the model"):
        nn.load(path)
    with pytest.raises(nn.CheckpointError, match="no optimizer state"):
        nn.load(path, model, optimizer=nn.Adam(model.vars))


# ----------------------------------------------------------------------------- writing

def test_an_interrupted_write_leaves_the_previous_file(path, monkeypatch):
    model = _model()
    nn.save(path, model)
    before = open(path, "rb").read()

    def crash(*args):
        raise KeyboardInterrupt("killed mid-save")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        nn.save(path, _model(seed=9))
    monkeypatch.undo()
    assert open(path, "rb").read() == before
    assert os.listdir(os.path.dirname(path)) == ["model.safetensors"]     # no temporary left


def test_a_refused_save_writes_nothing(path):
    with pytest.raises(TypeError, match=r"model\[.w.\] is str"):
        nn.save(path, {"w": "not a parameter"})
    assert not os.path.exists(path)
    with pytest.raises(TypeError, match="safetensors has no name for"):
        write_safetensors(path, {"c": np.zeros(2, np.complex64)})
    with pytest.raises(TypeError, match="metadata must be a dict of str -> str"):
        write_safetensors(path, {"a": np.zeros(2)}, {"n": 1})
    assert not os.path.exists(path)


def test_the_npz_stays_the_default(tmp_path):
    model = _model()
    for name in ("model.npz", "model", "model.ckpt"):
        nn.save(str(tmp_path / name), model)
        with open(tmp_path / name, "rb") as file:
            assert file.read(2) == b"PK"                     # a zip: NumPy's .npz
    with pytest.raises(ValueError, match="does not write PyTorch's .pt"):
        nn.save(str(tmp_path / "model.pt"), model)


@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
def test_an_array_of_the_other_byte_order_saves_and_loads_as_its_values(tmp_path, suffix):
    # a big-endian ('>f4') parameter or buffer saved to .safetensors (stored little-endian)
    # was described as >f4: no load of the file ever succeeded ("corrupted")
    model = _model()
    state = _state(model)
    state["layers.0.W"] = state["layers.0.W"].astype(">f4")
    state["layers.2.stats.running_var"] = state["layers.2.stats.running_var"].astype(">f4")
    model.load_state(state)
    assert model.layers[0].W.data.dtype == np.float32      # the model's own dtype kept
    swapped = _model(seed=1)
    swapped.layers[0].W.data = state["layers.0.W"].copy()
    path = str(tmp_path / f"m{suffix}")
    nn.save(path, swapped)
    for order in ("=", ">"):
        target = _model(seed=2)
        target.layers[0].W.data = target.layers[0].W.data.astype(f"{order}f4")
        dtype = target.layers[0].W.data.dtype
        nn.load(path, target)
        loaded, saved = _state(target), _state(swapped)
        assert loaded.keys() == saved.keys()
        for name in saved:                  # the same values, each array in its model's dtype
            np.testing.assert_array_equal(loaded[name], saved[name])
        assert target.layers[0].W.data.dtype == dtype        # the model's own byte order


def test_a_checkpoint_safetensors_cannot_hold_is_refused_naming_save(tmp_path):
    path = tmp_path / "c.safetensors"
    path.write_bytes(b"kept")
    with pytest.raises(TypeError, match=r"^save: tensor 'w' has dtype complex64"):
        nn.save(str(path), {"w": nn.NetVar(np.ones((1, 2), np.complex64))})
    assert path.read_bytes() == b"kept"
