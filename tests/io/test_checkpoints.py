"""nn.save / nn.load for any model: nested Modules with buffers and shared weights, FFNs with
BatchNorm, SequenceModels, nested dicts and lists; exact resumption; refused checkpoints that
change nothing; files written by format version 1; SaveBest's check of its model."""
import contextlib
import copy
import json
import os
import zipfile

import numpy as np
import pytest

import nnkit as nn
from tests.data.make_version1_checkpoints import inputs as v1_inputs

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
F32 = np.float32


def _param(rng, *shape, dtype=F32):
    return nn.NetVar((rng.standard_normal(shape) * 0.5).astype(dtype))


class Block(nn.Module):
    def __init__(self, rng, shared):
        self.W = _param(rng, 4, 4)
        self.shared = shared            # the same NetVar in every block

    def forward(self, x):
        return nn.Tanh(nn.Add(nn.Multiply(x, self.W), self.shared))


class Net(nn.Module):
    """Blocks (a list) sharing one bias, BatchNorm with its running statistics, an LSTM
    SequenceModel, and a head kept in a dict of a parameter and a list."""

    def __init__(self, seed, blocks=2, outputs=2, head_dtype=F32, batchnorm=True):
        rng = np.random.default_rng(seed)
        shared = _param(rng, 1, 4)
        self.blocks = [Block(rng, shared) for _ in range(blocks)]
        self.gamma = nn.NetVar(1 + _param(rng, 1, 4).data)
        self.beta = _param(rng, 1, 4)
        self.bn = nn.BatchNormState(4, momentum=0.2) if batchnorm else None
        self.seq = nn.SequenceModel(3, 5, 4, cell="lstm", per_step=False, seed=seed)
        self.head = {"W": _param(rng, 4, outputs, dtype=head_dtype),
                     "b": [_param(rng, 1, outputs, dtype=head_dtype)]}

    def forward(self, x, s):
        h = nn.NetVar(x, requires_grad=False)
        for block in self.blocks:
            h = block(h)
        h = nn.BatchNorm(h, self.gamma, self.beta, self.bn)
        h = nn.Add(h, self.seq(s))
        return nn.Add(nn.Multiply(h, self.head["W"]), self.head["b"][0])


def _batch(step):
    rng = np.random.default_rng(100 + step)
    return (rng.standard_normal((8, 4)).astype(F32), rng.standard_normal((3, 8, 3)).astype(F32),
            rng.integers(0, 2, 8))


def _train(net, opt, steps, start=0):
    for step in range(start, start + steps):
        x, s, y = _batch(step)
        nn.SoftmaxCELoss(net(x, s), y).back()
        opt.step()


def _eval(net, step=99):
    x, s, _ = _batch(step)
    with nn.eval_mode():
        return net(x, s).data


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "model.npz")


# ----------------------------------------------------------------------------- nested Modules

def test_a_nested_module_round_trips_with_its_buffers_and_shared_weight(path):
    net = Net(0)
    _train(net, nn.Adam(net.vars, lr=0.01), 3)      # moves the running statistics
    assert not np.array_equal(net.bn.running_mean, np.zeros(4))
    nn.save(path, net)
    with np.load(path) as archive:
        meta = json.loads(bytes(archive["__nnkit__"]).decode())
    names = [entry["name"] for entry in meta["params"]]
    assert names[:3] == ["blocks.0.W", "blocks.0.shared", "blocks.1.W"]   # shared: stored once
    assert "seq.rnn.W" in names and "head.b.0" in names
    assert [entry["name"] for entry in meta["buffers"]] == ["bn.running_mean", "bn.running_var"]

    fresh = Net(1)                                  # other values, the same structure
    shared = fresh.blocks[0].shared
    assert not np.array_equal(_eval(fresh), _eval(net))
    assert nn.load(path, fresh).model is fresh
    np.testing.assert_array_equal(_eval(fresh), _eval(net))
    for name, array in net.state().items():
        np.testing.assert_array_equal(fresh.state()[name], array)
    assert fresh.blocks[0].shared is shared and fresh.blocks[1].shared is shared
    np.testing.assert_array_equal(shared.data, net.blocks[1].shared.data)


def test_training_resumed_from_a_checkpoint_is_bit_identical(path):
    reference = Net(0)
    reference_opt = nn.Adam(reference.vars, lr=0.01)
    _train(reference, reference_opt, 8)

    net = Net(0)
    opt = nn.Adam(net.vars, lr=0.01)
    _train(net, opt, 4)
    nn.save(path, net, optimizer=opt, extra={"step": 4})
    resumed = Net(7)
    resumed_opt = nn.Adam(resumed.vars, lr=0.5)
    assert nn.load(path, resumed, optimizer=resumed_opt).extra == {"step": 4}
    assert resumed_opt.lr == 0.01 and resumed_opt.state[0]["t"] == 4
    _train(resumed, resumed_opt, 4, start=4)

    expected = reference.state()
    got = resumed.state()
    assert list(got) == list(expected)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    for mine, theirs in zip(resumed_opt.state, reference_opt.state):
        assert mine["t"] == theirs["t"]
        np.testing.assert_array_equal(mine["m"], theirs["m"])
        np.testing.assert_array_equal(mine["v"], theirs["v"])


def test_the_optimizer_state_follows_parameter_names_not_positions(path):
    net = Net(0)
    opt = nn.Adam(net.vars, lr=0.01)
    _train(net, opt, 2)
    nn.save(path, net, optimizer=opt)
    fresh = Net(3)
    reordered = nn.Adam(fresh.vars[::-1], lr=0.01)
    with pytest.raises(nn.CheckpointError, match=r"the saved optimizer updated parameters "
                                                 r".*\(parameter 0: 'blocks.0.W' in the file, "
                                                 r"'head.b.0' in this one\)"):
        nn.load(path, fresh, optimizer=reordered)


def test_a_sequence_model_round_trips_and_is_not_rebuilt_without_it(path):
    model = nn.SequenceModel(6, 8, 6, cell="gru", embedding=4, seed=0)
    nn.save(path, model)
    fresh = nn.SequenceModel(6, 8, 6, cell="gru", embedding=4, seed=1)
    nn.load(path, fresh)
    tokens = np.array([[0, 1], [2, 5], [4, 3]])
    np.testing.assert_array_equal(fresh(tokens).data, model(tokens).data)
    with pytest.raises(nn.CheckpointError, match=r"cannot rebuild its model without it: the "
                                                 r"model is a SequenceModel; .*give the model to "
                                                 r"load into"):
        nn.load(path)


# ----------------------------------------------------------------------------- FFN with BatchNorm

def _bn_ffn(seed, state=None):
    nn.seed(seed)
    state = state or nn.BatchNormState(6, momentum=0.3, eps=1e-3)
    return nn.FFN((nn.Multiply, nn.glorot(4, 6)),
                  (nn.BatchNorm, nn.NetVar(np.ones((1, 6), F32)), nn.zeros(6), state),
                  (nn.ReLU,), (nn.Multiply, nn.glorot(6, 3)), (nn.Add, nn.zeros(3)))


def _train_ffn(net, opt, steps):
    for step in range(steps):
        x, _, y = _batch(step)
        nn.SoftmaxCELoss(net(nn.NetVar(x, requires_grad=False)), y[:8] % 3).back()
        opt.step()


def _eval_ffn(net):
    with nn.eval_mode():
        return net(nn.NetVar(_batch(50)[0], requires_grad=False)).data


def test_an_ffn_with_batchnorm_restores_its_statistics_and_rebuilds(path):
    net = _bn_ffn(0)
    _train_ffn(net, nn.Adam(net.vars, lr=0.05), 3)
    state = net.topology[1][3]
    assert state.num_batches_tracked == 3
    nn.save(path, net)

    fresh = _bn_ffn(4)
    nn.load(path, fresh)
    loaded = fresh.topology[1][3]
    np.testing.assert_array_equal(loaded.running_mean, state.running_mean)
    np.testing.assert_array_equal(loaded.running_var, state.running_var)
    np.testing.assert_array_equal(_eval_ffn(fresh), _eval_ffn(net))

    rebuilt = nn.load(path).model                   # no model: rebuilt from the file
    again = rebuilt.topology[1][3]
    assert isinstance(again, nn.BatchNormState) and again is not state
    assert (again.features, again.momentum, again.eps, again.num_batches_tracked) == (
        6, 0.3, 1e-3, 3)
    np.testing.assert_array_equal(again.running_var, state.running_var)
    np.testing.assert_array_equal(_eval_ffn(rebuilt), _eval_ffn(net))
    assert sorted(rebuilt.named_buffers()) == ["topology.1.3.running_mean",
                                               "topology.1.3.running_var"]


def test_a_shared_batchnorm_state_stays_shared_when_rebuilt(path):
    state = nn.BatchNormState(3)
    state.running_mean = np.array([0.5, -1.0, 2.0], F32)
    gamma, beta = nn.NetVar(np.ones((1, 3), F32)), nn.zeros(3)
    net = nn.FFN((nn.BatchNorm, gamma, beta, state), (nn.Tanh,),
                 (nn.BatchNorm, gamma, beta, state))
    nn.save(path, net)
    rebuilt = nn.load(path).model
    assert rebuilt.topology[0][3] is rebuilt.topology[2][3]
    assert rebuilt.topology[0][1] is rebuilt.topology[2][1]
    np.testing.assert_array_equal(rebuilt.topology[2][3].running_mean, state.running_mean)


def test_an_ffn_holding_a_module_saves_and_loads_into_a_model_only(path):
    def make(seed):
        return nn.FFN((nn.SequenceModel(3, 4, 2, per_step=False, seed=seed),), (nn.Tanh,))

    net = make(0)
    nn.save(path, net)
    fresh = make(1)
    nn.load(path, fresh)
    x = np.random.default_rng(0).standard_normal((5, 2, 3)).astype(F32)
    np.testing.assert_array_equal(fresh(x).data, net(x).data)
    with pytest.raises(nn.CheckpointError, match=r"FFN topology entry 0 is a SequenceModel \(a "
                                                 r"Module other than an FFN\), which cannot be "
                                                 r"rebuilt from the file"):
        nn.load(path)


# ----------------------------------------------------------------------------- dicts and lists

def test_nested_dicts_and_lists_of_parameters(path):
    rng = np.random.default_rng(0)

    def make():
        return {"enc": {"w": _param(rng, 3, 2), "b": [_param(rng, 1, 2), _param(rng, 1, 2)]},
                "dec": (_param(rng, 2, 3),)}

    params = make()
    nn.save(path, params)
    other = make()
    nn.load(path, other)
    np.testing.assert_array_equal(other["enc"]["b"][1].data, params["enc"]["b"][1].data)
    np.testing.assert_array_equal(other["dec"][0].data, params["dec"][0].data)
    flat = nn.load(path).model                      # no model: one flat dict
    assert list(flat) == ["enc.w", "enc.b.0", "enc.b.1", "dec.0"]
    np.testing.assert_array_equal(flat["enc.w"].data, params["enc"]["w"].data)
    assert flat["enc.w"].requires_grad

    other["enc"]["b"].append(_param(rng, 1, 2))
    with pytest.raises(nn.CheckpointError, match=r"the model's parameter 'enc.b.2' is not in "
                                                 r"the file"):
        nn.load(path, other)


def test_dicts_and_lists_of_modules(path):
    rng = np.random.default_rng(0)
    w = _param(rng, 2, 2)
    net = Net(0)
    _train(net, nn.Adam(net.vars), 1)
    opt = nn.Adam(net.vars + [w], lr=0.02)
    nn.save(path, {"net": net, "aux": [w]}, optimizer=opt)
    fresh, fresh_w = Net(1), _param(rng, 2, 2)
    fresh_opt = nn.Adam(fresh.vars + [fresh_w])
    nn.load(path, {"net": fresh, "aux": [fresh_w]}, optimizer=fresh_opt)
    np.testing.assert_array_equal(_eval(fresh), _eval(net))
    np.testing.assert_array_equal(fresh_w.data, w.data)
    assert fresh_opt.lr == 0.02
    with pytest.raises(nn.CheckpointError, match=r"cannot rebuild its model without it: "
                                                 r"'net' is a Net"):
        nn.load(path)


def test_what_a_dict_or_list_may_not_hold_is_refused_by_name(path):
    w = nn.zeros(2)
    for model, error, message in [
            ({"a.b": w, "a": {"b": nn.zeros(2)}}, ValueError,
             r"model\['a.b'\] and model\['a'\]\['b'\] would both be named 'a.b'"),
            ({"w": w, "x": None}, TypeError, r"model\['x'\] is NoneType None, not a parameter"),
            ([w, w * 2], TypeError, r"model\[1\] is a NetVar that is computed by an op"),
            (w, TypeError, r"the model must be .*, got NetVar .*; write \[w\]")]:
        for call in (lambda: nn.save(path, model), lambda: nn.load(path, model)):
            with pytest.raises(error, match=message):
                call()
    loop = [w]
    loop.append(loop)
    with pytest.raises(ValueError, match=r"save: model\[1\] contains itself"):
        nn.save(path, loop)
    assert not os.path.exists(path)


# ----------------------------------------------------------------------------- refusals

def _prepared(seed=5):
    """A trained Net with its Adam optimizer, holding gradients (back() without step)."""
    net = Net(seed)
    opt = nn.Adam(net.vars, lr=0.01)
    _train(net, opt, 2)
    x, s, y = _batch(20)
    nn.SoftmaxCELoss(net(x, s), y).back()
    return net, opt


def _everything(net, opt):
    return (net.state(), {name: p.g.copy() for name, p in net.named_vars().items()},
            opt.lr, copy.deepcopy(opt.state),
            [dict(group, params=list(group["params"])) for group in opt.param_groups])


def _assert_same(before, after):
    state, grads, lr, opt_state, group = before
    state2, grads2, lr2, opt_state2, group2 = after
    assert list(state) == list(state2) and list(grads) == list(grads2)
    for name in state:
        np.testing.assert_array_equal(state[name], state2[name], err_msg=name)
    for name in grads:
        np.testing.assert_array_equal(grads[name], grads2[name], err_msg=name)
    assert lr == lr2 and len(opt_state) == len(opt_state2)
    for a, b in zip(opt_state, opt_state2):
        assert sorted(a) == sorted(b) and a["t"] == b["t"]
        np.testing.assert_array_equal(a["m"], b["m"])
        np.testing.assert_array_equal(a["v"], b["v"])
    assert len(group) == len(group2)
    for a, b in zip(group, group2):
        assert a.keys() == b.keys() and all(p is q for p, q in zip(a["params"], b["params"]))
        assert {k: v for k, v in a.items() if k != "params"} == \
            {k: v for k, v in b.items() if k != "params"}


def _statistics_of(dtype, seed=0):
    net = Net(seed)
    net.bn.running_mean = net.bn.running_mean.astype(dtype)
    net.bn.running_var = net.bn.running_var.astype(dtype)
    return net


@pytest.mark.parametrize("source, message", [
    (lambda: Net(0, outputs=3), r"parameter 'head.W' is float32 \(4, 3\) in the file, "
                                r"float32 \(4, 2\) in the model"),
    (lambda: Net(0, blocks=1), r"the model's parameter 'blocks.1.W' is not in the file"),
    (lambda: Net(0, blocks=3), r"the file's parameter 'blocks.2.W' is not in the model"),
    (lambda: Net(0, head_dtype=np.float64), r"parameter 'head.W' is float64 \(4, 2\) in the "
                                            r"file, float32 \(4, 2\) in the model"),
    (lambda: Net(0, batchnorm=False), r"the model's buffer 'bn.running_mean' is not in the "
                                      r"file"),
    (lambda: _statistics_of(np.int64), r"buffer 'bn.running_mean' is int64 \(4,\) in the file, "
                                       r"float32 \(4,\) in the model"),
], ids=["shape", "missing name", "extra name", "dtype", "missing buffer", "buffer dtype"])
def test_a_mismatching_checkpoint_changes_nothing_and_names_the_difference(path, source,
                                                                            message):
    model = source()
    nn.save(path, model, optimizer=nn.Adam(model.vars))
    net, opt = _prepared()
    before = _everything(net, opt)
    with pytest.raises(nn.CheckpointError, match=r"load: '.*model.npz' does not match the "
                                                 r"model: " + message):
        nn.load(path, net, optimizer=opt)
    _assert_same(before, _everything(net, opt))


def test_a_buffer_of_another_shape_is_refused(path):
    class Stats(nn.Module):
        def __init__(self, features):
            self.w = nn.NetVar(np.ones((1, 2), F32))
            self.bn = nn.BatchNormState(features)

    nn.save(path, Stats(5))
    target = Stats(4)
    target.bn.running_mean = np.arange(4, dtype=F32)
    with pytest.raises(nn.CheckpointError, match=r"buffer 'bn.running_mean' is float32 \(5,\) "
                                                 r"in the file, float32 \(4,\) in the model"):
        nn.load(path, target)
    np.testing.assert_array_equal(target.bn.running_mean, np.arange(4))


def _rewrite(path, edit):
    """Rewrite the checkpoint at ``path`` with ``edit(arrays, meta)`` applied (a tampered file)."""
    with np.load(path) as archive:
        arrays = {key: archive[key] for key in archive.files}
    meta = json.loads(bytes(arrays["__nnkit__"]).decode())
    edit(arrays, meta)
    arrays["__nnkit__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(path, **arrays)


def _array_key(meta, kind, name):
    return next(entry["array"]["key"] for entry in meta[kind] if entry["name"] == name)


def test_corrupted_truncated_and_tampered_files_change_nothing(path, tmp_path):
    source, source_opt = _prepared(0)
    nn.save(path, source, optimizer=source_opt)
    data = open(path, "rb").read()
    net, opt = _prepared()
    before = _everything(net, opt)

    truncated = str(tmp_path / "truncated.npz")
    open(truncated, "wb").write(data[:len(data) // 2])
    with pytest.raises(nn.CheckpointError, match="truncated or corrupted"):
        nn.load(truncated, net, optimizer=opt)

    flipped = bytearray(data)               # a byte inside the first array's data
    with zipfile.ZipFile(path) as archive:
        info = archive.infolist()[0]
    flipped[info.header_offset + 30 + len(info.filename) + 100] ^= 0xFF
    bad = str(tmp_path / "flipped.npz")
    open(bad, "wb").write(bytes(flipped))
    with pytest.raises(nn.CheckpointError, match="truncated or corrupted"):
        nn.load(bad, net, optimizer=opt)

    def other_array(arrays, meta):           # an array that is not what the JSON says
        key = _array_key(meta, "buffers", "bn.running_var")
        arrays[key] = np.ones(5, F32)

    tampered = str(tmp_path / "tampered.npz")
    open(tampered, "wb").write(data)
    _rewrite(tampered, other_array)
    with pytest.raises(nn.CheckpointError, match=r"is corrupted: buffer 'bn.running_var' is "
                                                 r"described as float32 \(4,\) but stored as "
                                                 r"float32 \(5,\)"):
        nn.load(tampered, net, optimizer=opt)

    def malformed(arrays, meta):
        del meta["buffers"][0]["array"]

    open(tampered, "wb").write(data)
    _rewrite(tampered, malformed)
    with pytest.raises(nn.CheckpointError, match=r"is corrupted: its description is malformed"):
        nn.load(tampered, net, optimizer=opt)
    _assert_same(before, _everything(net, opt))


def test_a_mismatching_optimizer_changes_nothing(path, tmp_path):
    source, source_opt = _prepared(0)
    nn.save(path, source, optimizer=source_opt)
    net, opt = _prepared()
    before = _everything(net, opt)
    with pytest.raises(nn.CheckpointError, match=r"the state is of a Adam optimizer"):
        nn.load(path, net, optimizer=nn.GD(net.vars))
    with pytest.raises(nn.CheckpointError, match=r"the saved optimizer updated parameters .*"
                                                 r"\(parameter 5: 'seq.rnn.W' in the file, none in "
                                                 r"this one\)"):
        nn.load(path, net, optimizer=nn.Adam(net.vars[:5]))

    def wrong_state(arrays, meta):          # m of parameter 0 of another shape, consistently
        ref = meta["optimizer"]["state"][0]["m"]["array"]
        arrays[ref["key"]] = np.zeros((3, 3), F32)
        ref["shape"] = [3, 3]

    _rewrite(path, wrong_state)
    with pytest.raises(nn.CheckpointError, match=r"Adam.load_state_dict: state 'm' of parameter "
                                                 r"0 has shape \(3, 3\), the parameter has shape "
                                                 r"\(4, 4\)"):
        nn.load(path, net, optimizer=opt)
    nn.save(path, source)
    with pytest.raises(nn.CheckpointError, match=r"has no optimizer state"):
        nn.load(path, net, optimizer=opt)
    _assert_same(before, _everything(net, opt))


def test_a_file_of_a_newer_format_is_refused(path):
    nn.save(path, [nn.zeros(2)])
    _rewrite(path, lambda arrays, meta: meta.update(version=3))
    with pytest.raises(nn.CheckpointError, match=r"has format version 3; this nnkit reads "
                                                 r"versions 1, 2"):
        nn.load(path)


# ----------------------------------------------------------------------------- version 1 files

def _v1_architecture(seed, outputs=3):
    """The structure of tests/data/v1_ffn_adam.npz with other values."""
    nn.seed(seed)
    shared = nn.glorot(4, 4)
    encoder = nn.FFN((nn.Multiply, shared), (nn.Add, nn.zeros(4)), (nn.Tanh,))
    return nn.FFN((encoder,), (nn.LReLU, 0.1), (nn.Multiply, shared),
                  (nn.Transpose, (1, 0)), (nn.Transpose, (1, 0)),
                  (nn.Multiply, nn.glorot(4, outputs)), (nn.Add, nn.zeros(outputs)),
                  (nn.Add, nn.NetVar(np.array([0.05, 0.1, 0.15], F32)[:outputs],
                                     requires_grad=False)))


def _expected():
    with np.load(os.path.join(DATA, "v1_expected.npz")) as archive:
        return {key: archive[key] for key in archive.files}


def test_a_version_1_ffn_with_adam_loads_into_a_model(tmp_path):
    expected = _expected()
    net = _v1_architecture(3)
    opt = nn.Adam(net.vars, lr=0.5)
    shared = net.topology[2][1]
    checkpoint = nn.load(os.path.join(DATA, "v1_ffn_adam.npz"), net, optimizer=opt)
    assert checkpoint.extra == {"epoch": 2, "note": "written by format version 1"}
    for i, p in enumerate(net.vars):
        np.testing.assert_array_equal(p.data, expected[f"param{i}"])
    assert opt.lr == 0.01
    for i, state in enumerate(opt.state):
        assert state["t"] == 2
        np.testing.assert_array_equal(state["m"], expected[f"m{i}"])
        np.testing.assert_array_equal(state["v"], expected[f"v{i}"])
    assert net.topology[2][1] is shared and net.topology[0][0].topology[0][1] is shared
    x = nn.NetVar(v1_inputs(), requires_grad=False)
    np.testing.assert_array_equal(net(x).data, expected["output"])
    # the file holds its constant only in the topology; the model's own value is replaced
    edited = _v1_architecture(3)
    edited.topology[7][1].data = np.zeros((1, 3), F32)
    nn.load(os.path.join(DATA, "v1_ffn_adam.npz"), edited)
    np.testing.assert_array_equal(edited(x).data, expected["output"])
    again = str(tmp_path / "v2.npz")                # and it saves in the current format
    nn.save(again, net, optimizer=opt)
    other = _v1_architecture(4)
    nn.load(again, other, optimizer=nn.Adam(other.vars))
    np.testing.assert_array_equal(other(x).data, expected["output"])


def test_a_version_1_ffn_is_rebuilt_and_its_mismatches_use_its_names():
    path = os.path.join(DATA, "v1_ffn_adam.npz")
    expected = _expected()
    rebuilt = nn.load(path).model
    x = nn.NetVar(v1_inputs(), requires_grad=False)
    np.testing.assert_array_equal(rebuilt(x).data, expected["output"])
    assert rebuilt.topology[2][1] is rebuilt.topology[0][0].topology[0][1]
    assert len(rebuilt.vars) == 4
    wider = _v1_architecture(0, outputs=2)
    before = [p.data.copy() for p in wider.vars]
    with pytest.raises(nn.CheckpointError, match=r"parameter '5.Multiply.1' is float32 \(4, 3\) "
                                                 r"in the file, float32 \(4, 2\) in the model"):
        nn.load(path, wider)
    for p, data in zip(wider.vars, before):
        np.testing.assert_array_equal(p.data, data)
    with_bn = _bn_ffn(0)
    with pytest.raises(nn.CheckpointError, match="does not match the model"):
        nn.load(path, with_bn)


def test_a_version_1_dict_loads():
    path = os.path.join(DATA, "v1_dict.npz")
    expected = _expected()
    checkpoint = nn.load(path)
    assert checkpoint.extra == {"kind": "dict"} and sorted(checkpoint.model) == ["b", "w"]
    np.testing.assert_array_equal(checkpoint.model["w"].data, expected["w"])
    target = {"w": nn.zeros(3, 2), "b": nn.zeros(2)}
    nn.load(path, target)
    np.testing.assert_array_equal(target["b"].data, expected["b"])


# ----------------------------------------------------------------------------- SaveBest

@pytest.mark.parametrize("model, message", [
    (42, r"SaveBest: the model must be a Module .*, got int 42"),
    ({"w": "weights"}, r"SaveBest: model\['w'\] is str 'weights', not a parameter"),
    (nn.NetVar(np.ones(2)), r"SaveBest: the model must be .*, got NetVar .*; write \[w\]"),
])
def test_save_best_refuses_a_model_it_cannot_save_when_built(model, message):
    with pytest.raises(TypeError, match=message):
        nn.SaveBest("best.npz", "loss", model=model)


def test_save_best_saves_and_restores_a_module_with_buffers(tmp_path):
    net = Net(0)
    opt = nn.Adam(net.vars, lr=0.05)
    snapshots, scores = {}, iter([0.3, 0.1, 0.2])

    class Score(nn.Hook):
        def on_epoch_end(self, trainer, logs):
            logs["score"] = next(scores)
            snapshots[trainer.epoch] = net.state()

    def step(batch):
        x, s, y = batch
        return nn.SoftmaxCELoss(net(x, s), y)

    path = tmp_path / "best.npz"
    saver = nn.SaveBest(path, "score", model=net, optimizer=True, restore=True)
    nn.Trainer(step, opt, hooks=[Score(), saver]).fit([_batch(i) for i in range(3)], epochs=3)
    assert saver.best_epoch == 2
    for name, array in net.state().items():      # restore=True put epoch 2's back, buffers too
        np.testing.assert_array_equal(array, snapshots[2][name], err_msg=name)

    other = nn.Adam(Net(1).vars)
    partial = nn.SaveBest(tmp_path / "b.npz", "loss", model={"head": net.head["W"]},
                          optimizer=True)
    with pytest.raises(ValueError, match=r"SaveBest: the optimizer updates parameter 0 .*, which "
                                         r"the model does not hold"):
        nn.Trainer(lambda batch: step(batch), other, hooks=[partial]).fit([_batch(0)])
    assert not (tmp_path / "b.npz").exists()


def test_float64_statistics_load_into_a_float32_model(path):
    # BatchNorm's statistics follow the data's dtype: a model run on float64 data saves float64
    # statistics, which a fresh model (float32 statistics) takes in float64
    saved = _statistics_of(np.float64)
    saved.bn.running_mean[...] = 0.25
    nn.save(path, saved)
    fresh = Net(1)
    nn.load(path, fresh)
    assert fresh.bn.running_mean.dtype == np.float64
    np.testing.assert_array_equal(fresh.bn.running_mean, np.full(4, 0.25))


def test_a_file_with_an_unusable_batchnorm_statistic_is_refused_both_ways(path):
    # a rebuilt model took a negative (or NaN) running_var and a count of -7 batches: every
    # output in evaluation was NaN; a load into a model raised a ValueError, not CheckpointError
    net = _bn_ffn(0)
    _train_ffn(net, nn.Adam(net.vars, lr=0.01), 2)
    nn.save(path, net)
    fresh = _bn_ffn(1)
    before = {name: array.copy() for name, array in fresh.state().items()}

    def negative(arrays, meta):
        key = _array_key(meta, "buffers", "topology.1.3.running_var")
        arrays[key] = -np.abs(arrays[key])

    _rewrite(path, negative)
    with pytest.raises(nn.CheckpointError, match="running_var holds negative values"):
        nn.load(path)
    with pytest.raises(nn.CheckpointError, match="does not fit the model: .*running_var holds "
                                                 "negative values"):
        nn.load(path, fresh)
    for name, array in fresh.state().items():
        np.testing.assert_array_equal(array, before[name])
    nn.save(path, net)

    def count(arrays, meta):
        meta["topology"][1]["args"][2]["batchnorm"]["batches"] = -7

    _rewrite(path, count)
    with pytest.raises(nn.CheckpointError, match="count of batches is -7"):
        nn.load(path)


def test_a_file_whose_references_were_swapped_or_shared_is_refused(path):
    # a rebuild put the file's topology.2.1 where topology.0.1 is, and two names pointing at
    # one array gave both parameters its values
    net = _bn_ffn(0)
    nn.save(path, net)

    def swapped(arrays, meta):
        first, second = meta["topology"][0]["args"][0], meta["topology"][3]["args"][0]
        meta["topology"][0]["args"][0], meta["topology"][3]["args"][0] = second, first

    _rewrite(path, swapped)
    with pytest.raises(nn.CheckpointError, match="its topology puts a parameter where "
                                                 "another's name says it is"):
        nn.load(path)
    nn.save(path, net)

    def shared(arrays, meta):
        meta["params"][1]["array"] = dict(meta["params"][0]["array"])

    _rewrite(path, shared)
    fresh = _bn_ffn(1)
    before = [p.data.copy() for p in fresh.vars]
    for call in (lambda: nn.load(path), lambda: nn.load(path, fresh)):
        with pytest.raises(nn.CheckpointError, match="is also another entry's"):
            call()
    for p, data in zip(fresh.vars, before):
        np.testing.assert_array_equal(p.data, data)


def test_save_takes_a_bytes_path_and_refuses_a_folder_before_writing(tmp_path):
    # a path ending in '/' was written as the file before it, which load of that path could
    # not read; a folder failed inside the rename; bytes paths failed in a concatenation
    model = nn.layers.Linear(2, 2, seed=0)
    (tmp_path / "folder").mkdir()
    for path in (str(tmp_path / "ckpt.npz") + os.sep, tmp_path / "folder"):
        with pytest.raises(IsADirectoryError, match="save: .* is a folder"):
            nn.save(path, model)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"]
    nn.save(os.fsencode(tmp_path / "b.npz"), model)
    fresh = nn.layers.Linear(2, 2, seed=1)
    nn.load(os.fsencode(tmp_path / "b.npz"), fresh)
    np.testing.assert_array_equal(fresh.W.data, model.W.data)


# ----------------------------------------------------------------------------- version 2 files
# Written by tests/data/make_version2_checkpoints.py with the nnkit of eac902d, before FFN was
# walked as a Module and SequenceModel was made of layers: one file of each kind nnkit wrote.

V2_SEQUENCE_NAMES = {"table": "embedding.table", "W": "rnn.W", "R": "rnn.R", "b": "rnn.b",
                     "Wo": "head.W", "bo": "head.b"}
"""A version 2 SequenceModel's parameter names -> the names the SequenceModel has now."""


def _v2_expected(kind):
    with np.load(os.path.join(DATA, "v2_expected.npz")) as archive:
        return {key[len(kind) + 1:]: archive[key] for key in archive.files
                if key.startswith(kind + "/")}


def _assert_loaded(expected, params, buffers, opt, names=None):
    """Every saved parameter, buffer and optimizer array of ``expected`` equals the model's,
    bit for bit; ``names`` maps the file's parameter names to the model's."""
    names = names or {}
    saved = [key.split("/", 1)[1] for key in expected if key.startswith("param/")]
    assert sorted(names.get(name, name) for name in saved) == sorted(params)
    for name in saved:
        mine = params[names.get(name, name)].data
        assert mine.dtype == np.float64
        np.testing.assert_array_equal(mine, expected[f"param/{name}"], err_msg=name)
    buffered = [key.split("/", 1)[1] for key in expected if key.startswith("buffer/")]
    assert sorted(buffered) == sorted(buffers)
    for name in buffered:
        np.testing.assert_array_equal(buffers[name], expected[f"buffer/{name}"], err_msg=name)
    by_id = {id(p): name for name, p in params.items()}
    inverse = {names.get(name, name): name for name in saved}
    for p, state in zip(opt.params, opt.state):
        for key, value in state.items():
            if isinstance(value, np.ndarray):
                np.testing.assert_array_equal(
                    value, expected[f"opt/{inverse[by_id[id(p)]]}/{key}"], err_msg=key)
            else:
                assert value == 2


@contextlib.contextmanager
def _float64():
    """Models built inside get float64 parameters, as the fixtures' were; the dtype after."""
    before = nn.get_dtype()
    nn.set_dtype(np.float64)
    try:
        yield
    finally:
        nn.set_dtype(before)


def test_a_version_2_ffn_with_batchnorm_and_adam_loads_bit_exact():
    from tests.data import make_version2_checkpoints as v2
    with _float64():
        net = v2.ffn()
        for p in net.vars:                      # other values: the file must set every one
            p.data = p.data * 0.5 - 1
    shared = net.topology[3][1]
    opt = nn.Adam(net.vars, lr=0.5)
    path = os.path.join(DATA, "v2_ffn_adam.npz")
    assert nn.load(path, net, optimizer=opt).extra == {"epoch": 2}
    expected = _v2_expected("ffn")
    _assert_loaded(expected, {**net.named_vars(), **net.named_constants()},
                   net.named_buffers(), opt)
    assert opt.lr == 0.01
    assert net.topology[3][1] is shared and net.topology[0][0].topology[0][1] is shared
    x, _ = v2.ffn_inputs()
    with nn.eval_mode():
        np.testing.assert_array_equal(net(x).data, expected["output"])
        rebuilt = nn.load(path).model               # and rebuilt from its topology alone
        np.testing.assert_array_equal(rebuilt(x).data, expected["output"])
    assert rebuilt.topology[3][1] is rebuilt.topology[0][0].topology[0][1]
    assert rebuilt.topology[1][3].momentum == 0.2


def test_a_version_2_sequence_model_with_adam_loads_bit_exact():
    from tests.data import make_version2_checkpoints as v2
    expected = _v2_expected("sequence")
    with _float64():
        model = nn.SequenceModel(**v2.SEQUENCE_SIZES, seed=0)   # another draw
    opt = nn.Adam(model.vars, lr=0.5)
    assert nn.load(os.path.join(DATA, "v2_sequence_adam.npz"), model,
                   optimizer=opt).extra == {"epoch": 2}
    _assert_loaded(expected, model.named_vars(), model.named_buffers(), opt, V2_SEQUENCE_NAMES)
    ids, lengths, _ = v2.sequence_inputs()
    np.testing.assert_array_equal(model(ids, lengths=lengths).data, expected["output"])
    np.testing.assert_array_equal(model.final_state[0].data, expected["final_h"])
    np.testing.assert_array_equal(model.final_state[1].data, expected["final_c"])


def test_a_sequence_model_draws_what_it_drew_before_from_the_same_seed():
    from tests.data import make_version2_checkpoints as v2
    expected = _v2_expected("sequence")
    with _float64():
        model = v2.sequence_model()
    init = {V2_SEQUENCE_NAMES[key.split("/", 1)[1]]: value for key, value in expected.items()
            if key.startswith("init/")}
    assert sorted(init) == sorted(model.named_vars())
    for name, p in model.named_vars().items():
        np.testing.assert_array_equal(p.data, init[name], err_msg=name)
    ids, lengths, _ = v2.sequence_inputs()
    np.testing.assert_array_equal(model(ids, lengths=lengths).data, expected["init_output"])


def test_a_version_2_module_of_layers_with_batchnorm_and_adam_loads_bit_exact():
    from tests.data import make_version2_checkpoints as v2
    with _float64():
        model = v2.LayersNet()
        for p in model.vars:
            p.data = p.data * 0.5 - 1
    opt = nn.Adam(model.vars, lr=0.5)
    nn.load(os.path.join(DATA, "v2_layers_adam.npz"), model, optimizer=opt)
    expected = _v2_expected("layers")
    _assert_loaded(expected, model.named_vars(), model.named_buffers(), opt)
    x, _ = v2.layers_inputs()
    with nn.eval_mode():
        np.testing.assert_array_equal(model(x).data, expected["output"])


def test_a_version_2_dict_of_parameters_with_rmsprop_loads_bit_exact():
    from tests.data import make_version2_checkpoints as v2
    path = os.path.join(DATA, "v2_dict_rmsprop.npz")
    expected = _v2_expected("dict")
    with _float64():
        params = v2.parameters()
    flat = {"enc.w": params["enc"]["w"], "layers.0": params["layers"][0],
            "layers.1": params["layers"][1]}
    for p in flat.values():
        p.data = p.data + 1
    opt = nn.RMSProp(list(flat.values()), lr=0.5)
    assert nn.load(path, params, optimizer=opt).extra == {"kind": "dict"}
    for name, p in flat.items():
        np.testing.assert_array_equal(p.data, expected[f"param/{name}"], err_msg=name)
    for (name, p), state in zip(flat.items(), opt.state):
        np.testing.assert_array_equal(state["v"], expected[f"opt/{name}/v"], err_msg=name)
    assert opt.lr == 0.01
    rebuilt = nn.load(path).model                   # rebuilt as one flat dict
    assert sorted(rebuilt) == sorted(flat)
    for name, p in rebuilt.items():
        np.testing.assert_array_equal(p.data, expected[f"param/{name}"], err_msg=name)


def test_a_sequence_model_state_with_the_names_before_layers_loads(tmp_path):
    # state() of a SequenceModel before it was made of layers: table, W, R, b, Wo, bo
    from tests.data import make_version2_checkpoints as v2
    expected = _v2_expected("sequence")
    old = {old: expected[f"param/{old}"] for old in V2_SEQUENCE_NAMES}
    np.savez(tmp_path / "old.npz", **old)
    with _float64():
        model = nn.SequenceModel(**v2.SEQUENCE_SIZES, seed=0)
    with np.load(tmp_path / "old.npz") as archive:
        model.load_state(archive)
    for name, new in V2_SEQUENCE_NAMES.items():
        np.testing.assert_array_equal(model.state()[new], old[name], err_msg=name)
    with pytest.warns(DeprecationWarning, match=r"SequenceModel.Wo is deprecated: the parameter "
                                                r"is now model.head.W"):
        assert model.Wo is model.head.W
    del old["bo"]
    with pytest.raises(KeyError, match=r"the state has no 'head.b'"):
        model.load_state(old)
