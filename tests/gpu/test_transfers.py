"""No hidden host-device traffic: one training step on CuPy reads nothing back to the host.

Two instruments, both over a whole step (forward, back, optimizer step with a modifier):
- CuPy's synchronisation detector (``cupyx.allow_synchronize(False)``): any device-to-host
  read (``.get()``, ``.item()``, ``float()``, ``bool()`` or ``if`` on a device array, printing)
  waits for the device and raises ``cupyx.DeviceSynchronized``;
- counters on the explicit ways out (``cupy.asnumpy``, ``nnkit.backend.to_cpu``).
The data are put on the device before the step, and one warm-up step runs first (it creates
the optimizer state and the GPU random generator). On NumPy the same steps run uninstrumented,
which checks the test's own training code.
"""
import contextlib
import warnings

import numpy as np
import pytest

import nnkit as nn
from nnkit import backend as nnbackend


@contextlib.contextmanager
def no_host_reads(backend, monkeypatch):
    """Fail on any device-to-host read inside the block (nothing to watch on NumPy)."""
    if not backend.gpu:
        yield
        return
    import cupy
    import cupyx
    if not hasattr(cupyx, "allow_synchronize"):
        pytest.skip("this CuPy has no synchronisation detector (cupyx.allow_synchronize)")
    reads = []
    to_cpu, asnumpy = nnbackend.to_cpu, cupy.asnumpy
    monkeypatch.setattr(nnbackend, "to_cpu", lambda a: reads.append("to_cpu") or to_cpu(a))
    monkeypatch.setattr(cupy, "asnumpy", lambda a, *args, **kw: reads.append("asnumpy")
                        or asnumpy(a, *args, **kw))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)     # deprecated in CuPy 10, kept
        with cupyx.allow_synchronize(False):
            yield
    monkeypatch.undo()
    assert reads == [], f"host reads in one training step: {reads}"


def ffn_step(backend):
    rng = np.random.default_rng(0)
    net = backend.move(nn.FFN(
        (nn.Multiply, nn.NetVar(rng.standard_normal((4, 16)))), (nn.Add, nn.NetVar(np.zeros(16))),
        (nn.BatchNorm, None, None, nn.BatchNormState(16)), (nn.ReLU,), (nn.Dropout, 0.2),
        (nn.Multiply, nn.NetVar(rng.standard_normal((16, 3)))), (nn.Add, nn.NetVar(np.zeros(3)))))
    opt = nn.Adam(net.vars, lr=0.01, modifiers=[nn.ClipGradNorm(1.0), nn.L2Decay(1e-4)])
    x = backend.array(rng.standard_normal((32, 4)))
    t = backend.array(rng.integers(0, 3, 32), dtype=np.int64)

    def step():
        loss = nn.L2Reg(nn.SoftmaxCELoss(net(x), t), net.vars, 1e-3)
        loss.back()
        opt.step()
        return loss
    return step, net.vars


def sequence_step(backend):
    rng = np.random.default_rng(1)
    model = backend.move(nn.SequenceModel(9, 8, 9, cell="lstm", embedding=5, seed=0))
    opt = nn.AdamW(model.vars, lr=0.01)
    x, lengths, t = next(nn.minibatches([rng.integers(0, 9, n) for n in (6, 4, 5, 2)],
                                        [rng.integers(0, 9, n) for n in (6, 4, 5, 2)],
                                        batch_size=4, shuffle=False,
                                        device=model.vars[0].device))

    def step():
        loss = nn.SoftmaxCELoss(model(x, lengths), t, lengths=lengths)
        loss.back()
        opt.step()
        return loss
    return step, model.vars


@pytest.mark.parametrize("make_step", [ffn_step, sequence_step])
def test_one_training_step_reads_nothing_back(make_step, backend, monkeypatch):
    step, params = make_step(backend)
    step()                                      # warm-up: optimizer state, GPU generator
    before = [backend.host(p).copy() for p in params]
    with no_host_reads(backend, monkeypatch):
        loss = step()
    assert nnbackend.array_module(loss.data) is backend.xp
    assert np.isfinite(backend.host(loss)).all()
    assert all(not np.array_equal(backend.host(p), old) for p, old in zip(params, before)), \
        "the step updated every parameter"
