"""Whole training on each backend: FFN and SequenceModel steps, every optimizer, device moves,
checkpoints written on one device and read on the other, and batches yielded on a device.

On CuPy every result is compared with the same computation on NumPy (float64), so the GPU
path must give the CPU's numbers, not merely run.
"""
import numpy as np
import pytest

import nnkit as nn
from tests.conftest import Backend

HOST = Backend("numpy")
OPTIMIZERS = [
    (nn.GD, {"lr": 0.1, "momentum": 0.9}),
    (nn.Nesterov, {"lr": 0.05}),
    (nn.AdaGrad, {"lr": 0.1}),
    (nn.RMSProp, {"lr": 0.01}),
    (nn.Adam, {"lr": 0.01}),
    (nn.AdamW, {"lr": 0.01, "weight_decay": 0.1}),
]


def make_ffn(seed=0, batchnorm=False):
    rng = np.random.default_rng(seed)
    W1, b1 = nn.NetVar(rng.standard_normal((4, 8)) * 0.5), nn.NetVar(np.zeros((1, 8)))
    W2, b2 = nn.NetVar(rng.standard_normal((8, 3)) * 0.5), nn.NetVar(np.zeros((1, 3)))
    middle = [(nn.BatchNorm, None, None, nn.BatchNormState(8))] if batchnorm else []
    return nn.FFN((nn.Multiply, W1), (nn.Add, b1), *middle, (nn.Tanh,), (nn.Multiply, W2),
                  (nn.Add, b2))


def batch(backend, seed=1, rows=16):
    rng = np.random.default_rng(seed)
    return (backend.array(rng.standard_normal((rows, 4))),
            backend.array(rng.integers(0, 3, rows), dtype=np.int64))


def train(backend, net, optimizer, steps, seed=1):
    losses = []
    for _ in range(steps):
        x, t = batch(backend, seed)       # one batch, so that the loss must fall
        loss = nn.SoftmaxCELoss(net(x), t)
        loss.back()
        optimizer.step()
        losses.append(float(backend.host(loss).reshape(())))
    return losses


def assert_same_params(device_params, host_params, rtol=1e-9):
    for p, q in zip(device_params, host_params):
        np.testing.assert_allclose(nn.backend.to_cpu(p.data), q.data, rtol=rtol, atol=1e-12)


@pytest.mark.parametrize("make_optimizer, options", OPTIMIZERS,
                         ids=[o.__name__ for o, _ in OPTIMIZERS])
def test_each_optimizer_trains_an_ffn_as_on_the_cpu(make_optimizer, options, backend):
    net = backend.move(make_ffn())
    assert all(nn.backend.array_module(p.data) is backend.xp for p in net.vars)
    losses = train(backend, net, make_optimizer(net.vars, **options), steps=4)
    reference = make_ffn()
    expected = train(HOST, reference, make_optimizer(reference.vars, **options), steps=4)
    np.testing.assert_allclose(losses, expected, rtol=1e-9)
    assert_same_params(net.vars, reference.vars)
    assert losses[-1] < losses[0]


def test_ffn_with_batchnorm_and_clipping_trains_as_on_the_cpu(backend):
    def run(where):
        net = where.move(make_ffn(batchnorm=True))
        opt = nn.Adam(net.vars, lr=0.01, modifiers=[nn.ClipGradNorm(0.5)])
        losses = train(where, net, opt, steps=3)
        with nn.eval_mode():
            x, _ = batch(where, seed=9)
            return losses, where.host(net(x)), net
    (losses, out, net), (expected_losses, expected_out, _) = run(backend), run(HOST)
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-9)
    assert losses[-1] < losses[0]
    np.testing.assert_allclose(out, expected_out, rtol=1e-9, atol=1e-12)
    state = net.topology[2][3]
    assert nn.backend.array_module(state.running_mean) is backend.xp


def test_ffn_moves_every_parameter_constant_and_state(backend):
    target = nn.NetVar(np.eye(3)[[0, 2]], requires_grad=False)
    net = make_ffn(batchnorm=True)
    net.topology.append((nn.MSELoss, target))
    params = net.vars
    assert backend.move(net) is net
    assert net.vars == params, "moves are in place: an optimizer keeps its parameters"
    for p in params + [target]:
        assert nn.backend.array_module(p.data) is backend.xp
    x, _ = batch(backend, rows=2)
    loss = net(x)           # the Loss target moved too: no mixing error
    loss.back()
    assert all(nn.backend.array_module(p.g) is backend.xp for p in params)
    assert net.to_cpu() is net
    assert all(isinstance(p.data, np.ndarray) and isinstance(p.g, np.ndarray) for p in params)
    assert isinstance(net.topology[2][3].running_mean, np.ndarray)


@pytest.mark.parametrize("first_on_device", [True, False])
def test_optimizer_state_follows_its_parameters_when_they_move(first_on_device, backend):
    """Two steps on one device, two on the other: Adam's moments must come along."""
    net = make_ffn()
    if first_on_device:
        backend.move(net)
    opt = nn.Adam(net.vars, lr=0.01)
    train(backend if first_on_device else HOST, net, opt, steps=2)
    if first_on_device:
        net.to_cpu()
    else:
        backend.move(net)
    train(HOST if first_on_device else backend, net, opt, steps=2, seed=3)
    for state, p in zip(opt.state, net.vars):
        assert nn.backend.array_module(state["m"]) is nn.backend.array_module(p.data)
    reference = make_ffn()
    reference_opt = nn.Adam(reference.vars, lr=0.01)
    train(HOST, reference, reference_opt, steps=2)
    train(HOST, reference, reference_opt, steps=2, seed=3)
    assert_same_params(net.vars, reference.vars)


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
def test_sequence_model_trains_as_on_the_cpu(cell, backend):
    rng = np.random.default_rng(5)
    tokens = [rng.integers(0, 7, n) for n in (5, 3, 4, 2, 5, 1)]
    labels = rng.integers(0, 2, len(tokens))

    def run(where):
        model = nn.SequenceModel(7, 6, 2, cell=cell, per_step=False, embedding=4, seed=0)
        assert where.move(model) is model
        device = model.vars[0].device
        opt = nn.Adam(model.vars, lr=0.02)
        losses = []
        for _ in range(3):
            for x, lengths, t in nn.minibatches(tokens, labels, batch_size=3, shuffle=False,
                                                device=device):
                assert nn.backend.array_module(x) is where.xp
                assert isinstance(lengths, np.ndarray), "lengths stay on the host"
                loss = nn.SoftmaxCELoss(model(x, lengths), t)
                loss.back()
                opt.step()
                losses.append(float(where.host(loss).reshape(())))
        return losses, model

    (losses, model), (expected, reference) = run(backend), run(HOST)
    np.testing.assert_allclose(losses, expected, rtol=1e-8)
    assert sum(losses[-2:]) < sum(losses[:2])          # the last epoch's two batches vs the first
    assert_same_params(model.vars, reference.vars, rtol=1e-8)
    assert model.to_cpu() is model and all(isinstance(p.data, np.ndarray) for p in model.vars)


def test_minibatches_rejects_an_unknown_device():
    with pytest.raises(ValueError, match="minibatches: device must be"):
        nn.minibatches([[1, 2]], device="tpu")
    if not nn.gpu_available():
        with pytest.raises(RuntimeError, match="CuPy with a working GPU"):
            nn.minibatches([[1, 2]], device="gpu")


def test_save_on_one_device_load_on_the_other(backend, tmp_path):
    net = backend.move(make_ffn())
    opt = nn.Adam(net.vars, lr=0.01)
    train(backend, net, opt, steps=2)
    path = nn.save(tmp_path / "model.npz", net, optimizer=opt, extra={"step": 2})
    # a NumPy-only session rebuilds it on the host
    rebuilt = nn.load(path).model
    assert all(isinstance(p.data, np.ndarray) for p in rebuilt.vars)
    assert_same_params(net.vars, rebuilt.vars, rtol=0)
    # loading into a model on the device keeps it there, optimizer state included
    other = backend.move(make_ffn(seed=3))
    other_opt = nn.Adam(other.vars, lr=0.01)
    assert nn.load(path, other, optimizer=other_opt).extra == {"step": 2}
    assert all(nn.backend.array_module(p.data) is backend.xp for p in other.vars)
    assert all(nn.backend.array_module(s["m"]) is backend.xp for s in other_opt.state)
    assert_same_params(other.vars, rebuilt.vars, rtol=0)
    # ... and training on continues identically on both
    host_opt = nn.Adam(rebuilt.vars, lr=0.01)
    nn.load(path, rebuilt, optimizer=host_opt)
    train(backend, other, other_opt, steps=1, seed=7)
    train(HOST, rebuilt, host_opt, steps=1, seed=7)
    assert_same_params(other.vars, rebuilt.vars)
    # and a host checkpoint loads onto the device model
    host_path = nn.save(tmp_path / "host.npz", rebuilt)
    nn.load(host_path, other)
    assert all(nn.backend.array_module(p.data) is backend.xp for p in other.vars)
    assert_same_params(other.vars, rebuilt.vars, rtol=0)


def test_a_captured_step_on_the_gpu_runs_eagerly_and_says_so(backend):
    """nn.capture records NumPy steps; a step whose parameters live on the GPU runs as it is
    (with a warning), giving eager's numbers on either backend."""
    def build():
        nn.seed(0)
        model = backend.move(nn.layers.Linear(4, 3))
        return model, nn.Adam(model.vars, lr=0.01)
    rng = np.random.default_rng(0)
    batches = [(backend.array(rng.standard_normal((5, 4))), backend.array(rng.integers(0, 3, 5)))
               for _ in range(4)]

    def losses(captured):
        model, optimizer = build()

        def step(x, y):
            loss = nn.SoftmaxCELoss(model(x), y)
            loss.back()
            optimizer.step()
            return loss
        step = nn.capture(step) if captured else step
        return [backend.host(step(x, y)) for x, y in batches], step

    eager, _ = losses(False)
    if backend.gpu:
        with pytest.warns(UserWarning, match="on a GPU the step runs as it is"):
            replayed, step = losses(True)
    else:
        replayed, step = losses(True)
        assert step.replays >= 2
    assert all(np.array_equal(a, b) for a, b in zip(eager, replayed))
