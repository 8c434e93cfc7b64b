"""save/load: round trips, exact resumption, and refusal of bad files without side effects."""
import json
import os
import subprocess
import sys
import textwrap
import time
import zipfile

import numpy as np
import pytest

import nnkit as nn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _net(seed=0):
    nn.seed(seed)
    return nn.FFN((nn.Multiply, nn.glorot(4, 8)), (nn.Add, nn.zeros(8)), (nn.LReLU, 0.1),
                  (nn.Multiply, nn.glorot(8, 3)), (nn.Add, nn.zeros(3)))


def _data(seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((32, 4)).astype(np.float32), rng.integers(0, 3, 32)


def _train(net, opt, steps, start=0):
    x, y = _data()
    for step in range(start, start + steps):
        rows = slice((step * 8) % 32, (step * 8) % 32 + 8)
        nn.SoftmaxCELoss(net(nn.NetVar(x[rows], requires_grad=False)), y[rows]).back()
        opt.step()


def _snapshot(params):
    return [p.data.copy() for p in params]


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "model.npz")


def test_ffn_round_trip_rebuilds_the_network(path):
    net = _net()
    net.topology.insert(3, (nn.Transpose, (1, 0)))
    net.topology.insert(4, (nn.Transpose, (1, 0)))
    nn.save(path, net, extra={"epoch": 4, "note": "best"})
    loaded = nn.load(path)
    assert loaded.extra == {"epoch": 4, "note": "best"}
    rebuilt = loaded.model
    assert [entry[0] for entry in rebuilt.topology] == [entry[0] for entry in net.topology]
    assert rebuilt.topology[3][1] == (1, 0) and rebuilt.topology[2][1] == 0.1
    x = nn.NetVar(_data()[0], requires_grad=False)
    np.testing.assert_array_equal(rebuilt(x).data, net(x).data)
    assert all(a is not b for a, b in zip(rebuilt.vars, net.vars))
    assert [p.dtype for p in rebuilt.vars] == [np.float32] * 4


def test_loss_target_constants_survive_and_stay_out_of_vars(path):
    net = nn.FFN((nn.Multiply, nn.rand2(2, 3)), (nn.SoftMax,),
                 (nn.CELoss, nn.NetVar([0, 0, 1])))
    nn.save(path, net)
    rebuilt = nn.load(path).model
    assert len(rebuilt.vars) == 1
    np.testing.assert_array_equal(rebuilt.topology[2][1].data, [[0, 0, 1]])


def test_topology_constants_keep_their_dtype_and_shape(path):
    # class indices came back as float32 and the rebuilt loss refused them as probabilities
    labels = nn.NetVar(np.array([0, 2, 1]), dtype=np.int64, requires_grad=False)
    scale = nn.constant(np.float64(0.5))                          # 0-d
    net = nn.FFN((nn.Multiply, nn.rand2(2, 3)), (nn.Mul, scale), (nn.SoftmaxCELoss, labels))
    x = np.ones((3, 2), np.float32)
    nn.save(path, net)
    rebuilt = nn.load(path).model
    for position in (1, 2):
        kept = rebuilt.topology[position][1]
        original = net.topology[position][1]
        assert (kept.dtype, kept.shape) == (original.dtype, original.shape)
        np.testing.assert_array_equal(kept.data, original.data)
    assert rebuilt(x).item() == net(x).item()


def test_save_load_continue_is_bit_identical(path):
    net, reference = _net(0), _net(0)
    opt = nn.Adam(net.vars, lr=0.01)
    reference_opt = nn.Adam(reference.vars, lr=0.01)
    _train(reference, reference_opt, 10)

    _train(net, opt, 5)
    schedule = nn.StepLR(opt, 2, gamma=0.5)
    nn.save(path, net, optimizer=opt, extra={"schedule": schedule.state_dict()})

    resumed = _net(7)                                  # different initial values
    resumed_opt = nn.Adam(resumed.vars, lr=0.5)
    checkpoint = nn.load(path, resumed, optimizer=resumed_opt)
    assert resumed_opt.state[0]["t"] == 5 and checkpoint.extra["schedule"] == schedule.state_dict()
    _train(resumed, resumed_opt, 5, start=5)
    for a, b in zip(resumed.vars, reference.vars):
        np.testing.assert_array_equal(a.data, b.data)
    for a, b in zip(resumed_opt.state, reference_opt.state):
        np.testing.assert_array_equal(a["m"], b["m"])
        np.testing.assert_array_equal(a["v"], b["v"])


def test_lists_and_dicts_of_parameters(path):
    w, b = nn.rand2(3, 2), nn.zeros(2)
    nn.save(path, {"w": w, "b": b})
    params = nn.load(path).model
    assert sorted(params) == ["b", "w"]
    np.testing.assert_array_equal(params["w"].data, w.data)
    other = [nn.rand2(3, 2), nn.rand2(2)]
    nn.save(path, [w, b])
    nn.load(path, other)
    np.testing.assert_array_equal(other[0].data, w.data)


def _assert_unchanged(params, before):
    for p, data in zip(params, before):
        np.testing.assert_array_equal(p.data, data)


def test_mismatched_model_is_refused_and_left_unchanged(path):
    nn.save(path, _net())
    wider = nn.FFN((nn.Multiply, nn.glorot(4, 9)), (nn.Add, nn.zeros(9)), (nn.LReLU, 0.1),
                   (nn.Multiply, nn.glorot(9, 3)), (nn.Add, nn.zeros(3)))
    before = _snapshot(wider.vars)
    with pytest.raises(nn.CheckpointError,
                       match=r"parameter 'topology.0.1' is float32 \(4, 8\) in the file, "
                             r"float32 \(4, 9\) in the model"):
        nn.load(path, wider)
    _assert_unchanged(wider.vars, before)

    shorter = nn.FFN((nn.Multiply, nn.glorot(4, 8)), (nn.Add, nn.zeros(8)))
    with pytest.raises(nn.CheckpointError, match=r"the file's parameter 'topology.3.1' is not "
                                                 r"in the model .*in the file but not in the "
                                                 r"model: \['topology.3.1', 'topology.4.1'\]"):
        nn.load(path, shorter)

    other_ops = _net(3)
    other_ops.topology[2] = (nn.Tanh,)
    before = _snapshot(other_ops.vars)
    with pytest.raises(nn.CheckpointError, match="holds an FFN with ops"):
        nn.load(path, other_ops)
    _assert_unchanged(other_ops.vars, before)


def test_mismatched_optimizer_changes_nothing(path):
    net = _net()
    opt = nn.Adam(net.vars)
    _train(net, opt, 1)
    nn.save(path, net, optimizer=opt)
    target = _net(5)
    before = _snapshot(target.vars)
    with pytest.raises(nn.CheckpointError, match="the state is of a Adam optimizer"):
        nn.load(path, target, optimizer=nn.GD(target.vars))
    with pytest.raises(nn.CheckpointError, match="updated parameters"):
        nn.load(path, target, optimizer=nn.Adam(target.vars[:2]))
    with pytest.raises(TypeError, match=r"load: optimizer must be an nnkit optimizer, got "
                                        r"object"):           # not "the file is corrupted"
        nn.load(path, target, optimizer=object())
    _assert_unchanged(target.vars, before)
    nn.save(path, net)
    with pytest.raises(nn.CheckpointError, match="has no optimizer state"):
        nn.load(path, target, optimizer=nn.Adam(target.vars))
    _assert_unchanged(target.vars, before)


def test_missing_truncated_and_corrupted_files(path, tmp_path):
    net = _net()
    before = _snapshot(net.vars)
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        nn.load(str(tmp_path / "nothing.npz"), net)
    nn.save(path, _net(9), optimizer=None)
    data = open(path, "rb").read()

    truncated = str(tmp_path / "truncated.npz")
    open(truncated, "wb").write(data[:len(data) // 2])
    with pytest.raises(nn.CheckpointError, match="truncated or corrupted"):
        nn.load(truncated, net)

    corrupted = bytearray(data)
    with zipfile.ZipFile(path) as archive:    # flip a byte inside the first array's data
        info = archive.infolist()[0]
    corrupted[info.header_offset + 30 + len(info.filename) + 200] ^= 0xFF
    bad = str(tmp_path / "corrupted.npz")
    open(bad, "wb").write(bytes(corrupted))
    with pytest.raises(nn.CheckpointError, match="truncated or corrupted"):
        nn.load(bad, net)

    garbage = str(tmp_path / "garbage.npz")
    np.savez(garbage, w=np.ones(3))
    with pytest.raises(nn.CheckpointError, match="not an nnkit checkpoint"):
        nn.load(garbage, net)
    _assert_unchanged(net.vars, before)


def test_unknown_op_is_refused_with_its_name(path):
    class Cube(nn.NetOp):
        def __init__(self, x):
            super().__init__(x.data ** 3, x)

    net = nn.FFN((nn.Multiply, nn.rand2(2, 2)), (Cube,))
    nn.save(path, net)
    with pytest.raises(nn.CheckpointError, match=r"uses op 'Cube', which is not registered"):
        nn.load(path)
    assert nn.load(path, ops={"Cube": Cube}).model.topology[1][0] is Cube


def test_an_ffn_with_an_entry_that_is_not_data_saves_but_is_not_rebuilt(path):
    def double(x):
        return x * 2

    net = nn.FFN((nn.Multiply, nn.rand2(2, 2)), (double,))
    nn.save(path, net)
    with pytest.raises(nn.CheckpointError, match=r"FFN topology entry 1 is the function double, "
                                                 r"which cannot be rebuilt from the file; give "
                                                 r"the model to load into"):
        nn.load(path)
    other = nn.FFN((nn.Multiply, nn.rand2(2, 2)), (double,))
    nn.load(path, other)
    np.testing.assert_array_equal(other.vars[0].data, net.vars[0].data)


def test_interrupted_writer_leaves_the_previous_checkpoint(path, monkeypatch):
    net = _net()
    nn.save(path, net, extra={"version": 1})
    calls = []
    real = np.lib.format.write_array

    def fail_halfway(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt("killed mid-save")
        return real(*args, **kwargs)

    monkeypatch.setattr(np.lib.format, "write_array", fail_halfway)
    with pytest.raises(KeyboardInterrupt):
        nn.save(path, _net(4), extra={"version": 2})
    monkeypatch.undo()
    assert len(calls) == 3
    assert os.listdir(os.path.dirname(path)) == ["model.npz"]       # no temporary left
    restored = _net(5)
    assert nn.load(path, restored).extra == {"version": 1}
    for a, b in zip(restored.vars, net.vars):
        np.testing.assert_array_equal(a.data, b.data)


def test_killed_save_process_leaves_the_previous_checkpoint(path):
    nn.save(path, {"w": nn.NetVar(np.zeros((2, 2)))}, extra={"version": 1})
    script = textwrap.dedent(f"""
        import sys, numpy as np, nnkit as nn
        big = {{"w": nn.NetVar(np.ones((2, 2))), "big": nn.NetVar(np.ones((4000, 1000)))}}
        print("ready", flush=True)
        while True:
            nn.save({path!r}, big, extra={{"version": 2}})
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                             cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert child.stdout.readline().strip() == b"ready"
        directory = os.path.dirname(path)
        deadline = time.monotonic() + 60
        while not any(name.endswith(".tmp") for name in os.listdir(directory)):
            assert time.monotonic() < deadline, "the child never started writing"
        child.kill()                    # SIGKILL while the temporary file is being written
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
    assert any(name.endswith(".tmp") for name in os.listdir(directory))
    checkpoint = nn.load(path)          # the old or a complete new one, never a broken one
    assert checkpoint.extra["version"] in (1, 2)
    expected = 0.0 if checkpoint.extra["version"] == 1 else 1.0
    assert (checkpoint.model["w"].data == expected).all()


@pytest.mark.skipif(not nn.gpu_available(), reason="needs CuPy and a GPU")
def test_gpu_checkpoint_loads_into_numpy(path):
    net = _net()
    opt = nn.Adam(net.vars)
    for p in net.vars:
        p.to_gpu()
    nn.SoftmaxCELoss(net(nn.NetVar(_data()[0], requires_grad=False).to_gpu()),
                     _data()[1][:32]).back()
    opt.step()
    nn.save(path, net, optimizer=opt)
    cpu = _net(3)
    cpu_opt = nn.Adam(cpu.vars)
    nn.load(path, cpu, optimizer=cpu_opt)
    assert isinstance(cpu.vars[0].data, np.ndarray)
    assert isinstance(cpu_opt.state[0]["m"], np.ndarray)
    np.testing.assert_array_equal(cpu.vars[0].data, net.vars[0].numpy())


def test_optimizer_groups_and_options_round_trip(path):
    net = _net()
    weights, biases = net.vars[0::2], net.vars[1::2]
    opt = nn.AdamW([{"params": weights}, {"params": biases, "weight_decay": 0.0}], lr=0.02)
    _train(net, opt, 2)
    opt.lr = 0.005
    nn.save(path, net, optimizer=opt)
    again = _net(1)
    resumed = nn.AdamW([{"params": again.vars[0::2]},
                        {"params": again.vars[1::2], "weight_decay": 0.3}], lr=1.0)
    nn.load(path, again, optimizer=resumed)
    assert resumed.lr == 0.005 and resumed.param_groups[1]["weight_decay"] == 0.0
    assert resumed.state[1]["t"] == 2 and isinstance(resumed.state[1]["t"], int)


# ---------------------------------------------------------------- composed networks, refusals

def _composed(seed=0):
    nn.seed(seed)
    encoder = nn.FFN((nn.Multiply, nn.glorot(4, 8)), (nn.Add, nn.zeros(8)), (nn.Tanh,))
    decoder = nn.FFN((nn.Multiply, nn.glorot(8, 3)), (nn.Add, nn.zeros(3)))
    return nn.FFN((encoder,), (nn.LReLU, 0.1), (decoder,))


def test_a_composed_ffn_round_trips_with_its_optimizer(path):
    net, reference = _composed(0), _composed(0)
    opt, reference_opt = nn.Adam(net.vars, lr=0.01), nn.Adam(reference.vars, lr=0.01)
    _train(reference, reference_opt, 6)
    _train(net, opt, 3)
    nn.save(path, net, optimizer=opt)

    rebuilt = nn.load(path).model
    assert isinstance(rebuilt.topology[0][0], nn.FFN) and len(rebuilt.vars) == 4
    x = nn.NetVar(_data()[0], requires_grad=False)
    np.testing.assert_array_equal(rebuilt(x).data, net(x).data)

    resumed = _composed(7)
    resumed_opt = nn.Adam(resumed.vars, lr=0.5)
    nn.load(path, resumed, optimizer=resumed_opt)
    _train(resumed, resumed_opt, 3, start=3)
    for a, b in zip(resumed.vars, reference.vars):
        np.testing.assert_array_equal(a.data, b.data)


def test_a_composed_ffn_of_another_layout_is_refused_and_left_unchanged(path):
    nn.save(path, _composed(0))
    flat = _net(1)                       # the same ops and shapes, not nested
    before = _snapshot(flat.vars)
    with pytest.raises(nn.CheckpointError, match="does not match the model"):
        nn.load(path, flat)
    _assert_unchanged(flat.vars, before)
    other = _composed(2)
    other.topology[0][0].topology[2] = (nn.ReLU,)
    before = _snapshot(other.vars)
    with pytest.raises(nn.CheckpointError, match=r"holds an FFN with ops \[\{'FFN': "
                                                 r"\['Multiply', 'Add', 'Tanh'\]\}"):
        nn.load(path, other)
    _assert_unchanged(other.vars, before)


def test_shared_weights_are_saved_once_and_stay_shared(path):
    w = nn.glorot(3, 3)
    block = nn.FFN((nn.Multiply, w), (nn.Tanh,))
    net = nn.FFN((block,), (nn.Multiply, w), (block,))
    nn.save(path, net)
    with np.load(path) as archive:
        assert len([key for key in archive.files if key != "__nnkit__"]) == 1
    rebuilt = nn.load(path).model
    assert len(rebuilt.vars) == 1
    assert rebuilt.topology[1][1] is rebuilt.topology[0][0].topology[0][1]
    x = nn.NetVar(np.ones((2, 3)), requires_grad=False)
    np.testing.assert_array_equal(rebuilt(x).data, net(x).data)


def test_a_refused_save_leaves_the_previous_file_as_it_was(path):
    net = _net()
    opt = nn.Adam(net.vars)
    nn.save(path, net, optimizer=opt, extra={"epoch": 1})
    original = open(path, "rb").read()
    with pytest.raises(TypeError, match="save: extra .* not JSON-able"):
        nn.save(path, _net(3), extra={"callback": print})
    with pytest.raises(TypeError, match=r"save: extra\['by_class'\] has the key 1 \(int\)"):
        nn.save(path, _net(3), extra={"by_class": {1: 0.5}})
    with pytest.raises(ValueError, match=r"save: the optimizer updates parameter 4 \(NetVar "
                                         r".*\), which is not in the model"):
        nn.save(path, net, optimizer=nn.Adam(net.vars + [nn.NetVar(np.ones((1, 2)))]))
    with pytest.raises(TypeError, match=r"save: model\['b'\] is int 3, not a parameter"):
        nn.save(path, {"w": nn.zeros(2), "b": 3})
    with pytest.raises(TypeError, match=r"save: model\[1\] is a set holding a NetVar; a set has "
                                        r"no order"):
        nn.save(path, [nn.zeros(2), {nn.NetVar(np.ones(2))}])
    assert open(path, "rb").read() == original


def test_a_constant_in_a_list_is_saved_and_rebuilt_as_a_constant(path):
    # a list was refused for holding one, though a Module saves its frozen weights
    w, frozen = nn.NetVar(np.arange(2.0)), nn.NetVar(np.ones(2), requires_grad=False)
    nn.save(path, [w, frozen])
    rebuilt = nn.load(path).model
    assert sorted(rebuilt) == ["0", "1"] and not rebuilt["1"].requires_grad
    np.testing.assert_array_equal(rebuilt["1"].data, frozen.data)
    target = [nn.NetVar(np.zeros(2)), nn.NetVar(np.zeros(2), requires_grad=False)]
    nn.load(path, target)
    np.testing.assert_array_equal(target[1].data, frozen.data)
    assert os.listdir(os.path.dirname(path)) == ["model.npz"]


def test_numpy_numbers_in_extra_are_saved_as_numbers(path):
    nn.save(path, _net(), extra={"loss": np.float32(0.25), "epoch": np.int64(3)})
    assert nn.load(path).extra == {"loss": 0.25, "epoch": 3}


def test_a_checkpoint_with_an_optimizer_option_out_of_range_changes_nothing(path, tmp_path):
    net = _net()
    opt = nn.Adam(net.vars)
    _train(net, opt, 1)
    nn.save(path, net, optimizer=opt)
    with np.load(path) as archive:
        arrays = {key: archive[key] for key in archive.files}
    meta = json.loads(bytes(arrays["__nnkit__"]).decode())
    meta["optimizer"]["options"]["momentum"] = 1.5
    arrays["__nnkit__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    edited = str(tmp_path / "edited.npz")
    np.savez(edited, **arrays)
    target = _net(4)
    target_opt = nn.Adam(target.vars, lr=0.3)
    before = _snapshot(target.vars)
    with pytest.raises(nn.CheckpointError, match=r"Adam.load_state_dict: momentum must be in "
                                                 r"\[0, 1\), got 1.5"):
        nn.load(edited, target, optimizer=target_opt)
    _assert_unchanged(target.vars, before)
    assert target_opt.lr == 0.3 and target_opt.state == [{}] * 4


def test_ops_must_map_names_to_op_classes(path):
    nn.save(path, _net())
    for ops, message in (([nn.ReLU], "load: ops must be a dict name -> op class, got list"),
                         ({"Cube": len}, "load: ops\\['Cube'\\] is builtin_function_or_method "
                                         "len, not an op class")):
        with pytest.raises(TypeError, match=message):
            nn.load(path, ops=ops)


@pytest.mark.parametrize("given", ["optimizer", "group"])
def test_a_numpy_learning_rate_resumes_bit_identically(path, given):
    # lr=np.float32(0.01) rounded Adam's step size to float32 in the first run and not after a
    # load (a checkpoint stores Python floats): up to 1.5e-8 apart; the same in a group
    def train(model, opt, steps, start=0):
        for step in range(start, start + steps):
            x = np.random.default_rng(step).standard_normal((8, 4)).astype(np.float32)
            (model(nn.NetVar(x, requires_grad=False)) ** 2).sum().back()
            opt.step()

    lr = np.float32(0.01)

    def adam(model):
        if given == "optimizer":
            return nn.Adam(model.vars, lr=lr)
        return nn.Adam([{"params": model.vars, "lr": lr}])

    reference, net = _net(0), _net(0)
    reference_opt, opt = adam(reference), adam(net)
    train(reference, reference_opt, 6)
    train(net, opt, 3)
    nn.save(path, net, optimizer=opt)
    resumed = _net(7)
    resumed_opt = adam(resumed)
    nn.load(path, resumed, optimizer=resumed_opt)
    train(resumed, resumed_opt, 3, start=3)
    for a, b in zip(resumed.vars, reference.vars):
        np.testing.assert_array_equal(a.data, b.data)


def test_save_follows_a_link_and_a_new_file_follows_the_umask(tmp_path):
    # the link was replaced by a regular file (the checkpoint it named kept the old weights),
    # and a new file was 0o644 under any umask
    net = _net(0)
    target = tmp_path / "real.npz"
    nn.save(target, _net(1))
    link = tmp_path / "latest.npz"
    link.symlink_to(target)
    nn.save(link, net)
    assert link.is_symlink()
    restored = _net(2)
    nn.load(target, restored)
    for a, b in zip(restored.vars, net.vars):
        np.testing.assert_array_equal(a.data, b.data)
    previous = os.umask(0o077)
    try:
        nn.save(tmp_path / "private.npz", net)
    finally:
        os.umask(previous)
    assert (tmp_path / "private.npz").stat().st_mode & 0o777 == 0o600


def test_loading_into_an_ffn_whose_data_arguments_differ_from_the_files_is_refused(path):
    # a plain array or number in the topology is not a parameter: load did not set it, and
    # the model kept its own (another function than the file's, which nn.load(path) rebuilds)
    W = nn.NetVar(np.eye(3, dtype=np.float32))
    mean = np.array([[1.0, 2.0, 3.0]], np.float32)
    nn.save(path, nn.FFN((nn.Sub, mean), (nn.Multiply, W), (nn.LReLU, 0.2)))
    for entry, other in ((0, (nn.Sub, np.zeros((1, 3), np.float32))), (2, (nn.LReLU, 0.01))):
        fresh = nn.FFN((nn.Sub, mean.copy()), (nn.Multiply, nn.NetVar(np.zeros((3, 3), np.float32))),
                       (nn.LReLU, 0.2))
        fresh.topology[entry] = other
        before = _snapshot(fresh.vars)
        with pytest.raises(nn.CheckpointError, match=rf"FFN topology entry {entry} \(\w+\) "
                                                     r"argument 1 is .* in the model but another "
                                                     r"value in the file"):
            nn.load(path, fresh)
        _assert_unchanged(fresh.vars, before)
    same = nn.FFN((nn.Sub, mean.copy()), (nn.Multiply, nn.NetVar(np.zeros((3, 3), np.float32))),
                  (nn.LReLU, 0.2))
    nn.load(path, same)
    np.testing.assert_array_equal(same.topology[1][1].data, np.eye(3))


def test_loading_into_an_ffn_takes_data_arguments_of_equal_value_in_another_form(path):
    # the check refused float32(0.2) for 0.2, a float64 mean for the file's float32 one and a
    # nested list for an array: the same function either way
    mean = np.array([[1.0, 2.0, 3.0]], np.float32)
    nn.save(path, nn.FFN((nn.Sub, mean), (nn.Multiply, nn.NetVar(np.eye(3, dtype=np.float32))),
                         (nn.LReLU, np.float32(0.2))))
    for mean_form, slope in ((mean.astype(np.float64), 0.2), ([[1.0, 2.0, 3.0]], np.float64(0.2)),
                             (mean, np.float32(0.2))):
        net = nn.FFN((nn.Sub, mean_form), (nn.Multiply, nn.NetVar(np.zeros((3, 3), np.float32))),
                     (nn.LReLU, slope))
        nn.load(path, net)
        np.testing.assert_array_equal(net.topology[1][1].data, np.eye(3))
