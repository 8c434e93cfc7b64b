"""W7: W2-W4 on the GPU with CuPy, when CuPy and a GPU are present.

The same workloads as on the CPU, with every array on the GPU: nnkit on CuPy arrays, the
hand-written baselines of mlp.py and rnn.py run on CuPy (they are written against the arrays'
module), and PyTorch on CUDA when it is installed with a GPU. In these rows the "NumPy" column is
that hand-written CuPy baseline. Each call ends with a device synchronisation and the rows are
timed in wall-clock time (process CPU time says nothing about the GPU).
"""
import nnkit as nn
from nnkit import backend

from . import harness, mlp, rnn
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
    rows = []
    for label, layers, batches, target, number in (
            ("W7 GPU: W2 digits MLP epoch", mlp.init_weights((64, 128, 128, 10)),
             mlp.digits_batches(), 1.25, 2),
            ("W7 GPU: W3 784-1024-1024-10 MLP step", big_layers, [(big_x, big_y)], 1.10, 3)):
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
        return _mlp_rows(cp, torch, rounds, sync) + _rnn_row(cp, torch, rounds, sync)
    finally:
        harness.clock = saved
