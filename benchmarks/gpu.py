"""W7: W1, W2-W4 and W8 on the GPU with CuPy, when CuPy and a GPU are present.

The same workloads as on the CPU, with every array on the GPU: nnkit on CuPy arrays, the
hand-written baselines of chain.py, mlp.py, rnn.py and attention.py run on CuPy (they are written
against the arrays' module), and PyTorch on CUDA when it is installed with a GPU. In these rows the
"NumPy" column is that hand-written CuPy baseline. Each call ends with a device synchronisation
and the rows are timed in wall-clock time (process CPU time says nothing about the GPU).
"""
import sys
import traceback

import numpy as np

import nnkit as nn
from nnkit import backend

from . import attention, chain, harness, mlp, rnn
from .harness import Row, check_close, interleaved, optional_torch


def _synchronized(function, synchronize):
    def run():
        result = function()
        synchronize()
        return result
    return run


def _torch_cuda():
    torch = optional_torch()
    if torch is None or not torch.cuda.is_available():
        return None
    return torch


def _mlp_rows(cp, torch, rounds, sync):
    """W2 and W3 on the GPU."""
    big_layers, big_x, big_y = mlp.big_mlp_data()
    workloads = [("W7 GPU: W3 784-1024-1024-10 MLP step", big_layers, [(big_x, big_y)], 1.10, 3)]
    try:
        workloads.insert(0, ("W7 GPU: W2 digits MLP epoch", mlp.init_weights((64, 128, 128, 10)),
                             mlp.digits_batches(), 1.25, 2))
    except ImportError as missing:                  # the digits come with scikit-learn
        print(f"W7: W2 skipped ({missing})")
    rows = []
    for label, layers, batches, target, number in workloads:
        on_gpu = [(cp.asarray(x), cp.asarray(y)) for x, y in batches]
        ours, theirs = mlp.NnkitMLP(layers, gpu=True), mlp.NumpyMLP(layers, xp=cp)
        ours.gradients(*on_gpu[0])
        theirs.gradients(*on_gpu[0])
        check_close(label, [p.g.reshape(q.shape) for p, q in zip(ours.params, theirs.params)],
                    theirs.grads)
        models = {"nnkit": mlp.NnkitMLP(layers, gpu=True), "numpy": mlp.NumpyMLP(layers, xp=cp)}
        contenders = {}
        for name, model in models.items():
            contenders[name] = _synchronized(
                lambda m=model: [m.step(x, y) for x, y in on_gpu], sync)
        if torch is not None:
            step = mlp.torch_model(layers, device="cuda").step
            on_cuda = [(torch.as_tensor(x, device="cuda"), torch.as_tensor(y, device="cuda"))
                       for x, y in batches]
            contenders["torch"] = _synchronized(
                lambda: [step(x, y) for x, y in on_cuda], torch.cuda.synchronize)
        rows.append(Row(label, "ms", 1e3, interleaved(contenders, rounds, number),
                        target=target))
    return rows


def _rnn_row(cp, torch, rounds, sync):
    """W4 (the fused variable-length RNN) on the GPU."""
    x, G, W0, R0, b0, lengths = rnn.make_data()
    xg, Gg = cp.asarray(x), cp.asarray(G)
    Wg, Rg, bg = cp.asarray(W0), cp.asarray(R0), cp.asarray(b0)
    baseline = rnn.NumpyRNN(xg, Gg, lengths)
    W, R, b = (nn.NetVar(a).to_gpu() for a in (W0, R0, b0))
    fused = rnn.fused_gradients(xg, Gg, W, R, b, lengths)

    check_close("W7 GPU: W4", fused(), baseline.gradients(Wg, Rg, bg), rtol=1e-3, atol=1e-4)
    contenders = {"nnkit": _synchronized(fused, sync),
                  "numpy": _synchronized(lambda: baseline.gradients(Wg, Rg, bg), sync)}
    if torch is not None:
        contenders["torch"] = _synchronized(
            rnn.torch_gradients(torch, x, G, W0, R0, b0, lengths, device="cuda"),
            torch.cuda.synchronize)
    return [Row("W7 GPU: W4 variable-length tanh RNN, fused", "ms", 1e3,
                interleaved(contenders, rounds, 5), target=1.30)]


def _chain_row(cp, torch, rounds, sync, ops=300):
    """W1 on the GPU: x + a, · b, tanh on a (1, 4) row, forward and backward; µs per op. Every
    op launches a kernel or two, so this is nnkit's per-op cost where the GPU waits on Python."""
    kinds = [chain.KINDS[i % 3] for i in range(ops)]
    rng = np.random.default_rng(0)
    x0 = cp.asarray(rng.standard_normal((1, 4)).astype(np.float32))
    a0, b0 = cp.full((1, 4), 0.1, np.float32), cp.full((1, 4), 0.9, np.float32)
    x = nn.NetVar(x0)

    def ours():
        x.reset()
        chain.run_chain(x, kinds, a0, b0, nn.Tanh).back()
        return [x.g]

    def by_hand():
        return chain.chain_by_hand(kinds, x0, a0, b0, cp)

    check_close("W7 GPU: W1", ours(), by_hand())
    contenders = {"nnkit": _synchronized(ours, sync), "numpy": _synchronized(by_hand, sync)}
    if torch is not None:
        xt = torch.tensor(backend.to_cpu(x0), device="cuda", requires_grad=True)
        at, bt = (torch.tensor(backend.to_cpu(v), device="cuda") for v in (a0, b0))

        def theirs():
            xt.grad = None
            h = chain.run_chain(xt, kinds, at, bt, torch.tanh)
            h.backward(torch.ones_like(h))
            return [xt.grad]
        check_close("W7 GPU: W1 (PyTorch)", [theirs()[0].cpu().numpy()], by_hand())
        contenders["torch"] = _synchronized(theirs, torch.cuda.synchronize)
    return [Row(f"W7 GPU: W1 chain of {ops} tiny ops, fwd+bwd", "µs/op", 1e6 / ops,
                interleaved(contenders, rounds, 5))]


def _attention_row(cp, torch, rounds, sync, heads=4):
    """W8 (masked multi-head self-attention, forward and backward) on the GPU."""
    x, G, weights, biases, lengths = attention.make_data()
    xg, Gg = cp.asarray(x), cp.asarray(G)
    on_gpu = [cp.asarray(W) for W in weights], [cp.asarray(b) for b in biases]
    baseline = attention.NumpyAttention(xg, Gg, lengths, heads)
    reference = baseline.gradients(*on_gpu)
    ours = attention.nnkit_gradients(x, Gg, weights, biases, lengths, heads,
                                     gpu=backend.device_of(xg) != "cpu")
    check_close("W7 GPU: W8", ours(), reference, rtol=1e-3, atol=1e-4)
    contenders = {"nnkit": _synchronized(ours, sync),
                  "numpy": _synchronized(lambda: baseline.gradients(*on_gpu), sync)}
    if torch is not None:
        theirs = attention.torch_gradients(torch, x, G, weights, biases, lengths, heads,
                                           device="cuda")
        check_close("W7 GPU: W8 (PyTorch)", [g.detach().cpu().numpy() for g in theirs()],
                    reference, rtol=1e-3, atol=1e-4)
        contenders["torch"] = _synchronized(theirs, torch.cuda.synchronize)
    return [Row("W7 GPU: W8 self-attention fwd+bwd, B 32, T 5..100, dim 128, 4 heads", "ms",
                1e3, interleaved(contenders, rounds, 3), target=1.30)]


def gpu_rows(rounds):
    """The GPU rows, or a printed reason for skipping them."""
    cp = backend.cupy_module()
    if cp is None:
        print("W7 skipped: CuPy with a working GPU is not available on this machine")
        return []
    sync = cp.cuda.Device().synchronize
    torch = _torch_cuda()
    if torch is None:
        print("W7: PyTorch with CUDA is not available; the PyTorch column stays empty")
    saved = harness.clock
    harness.use_clock("wall")
    try:
        rows = []
        for make in (_chain_row, _mlp_rows, _rnn_row, _attention_row):
            try:            # a row that fails says why, and the others still run
                rows += make(cp, torch, rounds, sync)
            except Exception:                       # noqa: BLE001 (reported, not hidden)
                print(f"W7 {make.__name__} failed:")
                traceback.print_exc(file=sys.stdout)
        return rows
    finally:
        harness.clock = saved
