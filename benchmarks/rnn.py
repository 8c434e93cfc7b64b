"""W4: a variable-length tanh RNN, fused (``nnkit.RNN``) and unrolled (``nnkit.RNNCell``).

B 32 sequences of lengths 5..100, F 32 inputs, H 128 hidden units; forward, then backward of
Σ G·y for a fixed random G (valid steps only), giving dW, dR and db. The NumPy baseline does only
the needed work: the batch sorted by length, the valid steps packed, one input projection, and
a step loop whose batch shrinks as sequences end. A second row times the fused row's step
captured with ``nn.capture`` and replayed (the same batch every call after the recording),
after the other rows.
"""
import numpy as np

import nnkit as nn
from nnkit.backend import array_module

from .harness import Replay, Row, check_close, check_replay, interleaved, optional_torch


def make_data(B=32, F=32, H=128, shortest=5, longest=100, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(shortest, longest + 1, B)
    lengths[0] = longest
    T = int(lengths.max())
    x = rng.standard_normal((T, B, F)).astype(np.float32)
    G = rng.standard_normal((T, B, H)).astype(np.float32)
    G *= (np.arange(T)[:, None] < lengths[None, :])[:, :, None]       # nothing at padding
    W = (rng.standard_normal((F, H)) / np.sqrt(F)).astype(np.float32)
    R = (rng.standard_normal((H, H)) / np.sqrt(H)).astype(np.float32)
    b = (0.1 * rng.standard_normal(H)).astype(np.float32)
    return x, G, W, R, b, lengths


class NumpyRNN:
    """The hand-written baseline: packed valid steps, shrinking batch, in-place BPTT.

    ``x`` and ``G`` may be CuPy arrays (the GPU rows, W7): the same code runs on their module;
    ``lengths`` stays a host array, as the bookkeeping is done once, on the host.
    """

    def __init__(self, x, G, lengths):
        T, B, F = x.shape
        self.xp = array_module(x)
        self.order = np.argsort(-lengths, kind="stable")
        running = np.arange(T)[:, None] < lengths[self.order][None, :]
        self.sizes = running.sum(axis=1).tolist()
        self.offsets = np.concatenate(([0], np.cumsum(self.sizes))).tolist()
        t, j = np.nonzero(running)
        self.rows = self.xp.asarray(t * B + self.order[j])
        self.x, self.G = x, G

    def gradients(self, W, R, b):
        xp = self.xp
        T, B, F = self.x.shape
        H = R.shape[0]
        sizes, offsets, rows = self.sizes, self.offsets, self.rows
        Xp = self.x.reshape(T * B, F)[rows]
        Y = Xp @ W                              # pre-activations, then outputs, in place
        Y += b
        h0 = xp.zeros((B, H), np.float32)
        for t, n in enumerate(sizes):
            s = offsets[t]
            a = Y[s:s + n]
            a += (h0[:n] if t == 0 else Y[offsets[t - 1]:offsets[t - 1] + n]) @ R
            xp.tanh(a, out=a)
        dA = self.G.reshape(T * B, H)[rows]     # the upstream gradient, packed
        dh = xp.zeros((B, H), np.float32)
        RT = R.T
        previous = xp.empty_like(Y)             # h_{t−1} of every valid position, for dR
        for t in range(len(sizes) - 1, -1, -1):
            n, s = sizes[t], offsets[t]
            da = dA[s:s + n]
            da += dh[:n]
            y = Y[s:s + n]
            da *= 1 - y * y
            xp.matmul(da, RT, out=dh[:n])
            previous[s:s + n] = h0[:n] if t == 0 else Y[offsets[t - 1]:offsets[t - 1] + n]
        return [Xp.T @ dA, previous.T @ dA, dA.sum(axis=0)]


def fused_gradients(x, G, W, R, b, lengths):
    """A function computing dW, dR, db of Σ G·y through one fused ``nnkit.RNN`` node."""
    xv = nn.NetVar(x, requires_grad=False)

    def fused():
        W.reset()
        R.reset()
        b.reset()
        nn.RNN(xv, W, R, b, lengths=lengths).back(G)
        return [W.g, R.g, b.g.reshape(-1)]
    return fused


def captured_rnn(x, G, W0, R0, b0, lengths, eager_gradients):
    """The fused step on parameters of its own, the batch, the upstream gradient and the
    lengths as its inputs, returning nothing (as the eager contender, which returns only the
    gradients: a returned output would be handed out as a copy); checked against the eager
    gradients after a replay, recorded on other values so that a replay which left the
    recording's values in place would differ."""
    W, R, b = nn.NetVar(W0), nn.NetVar(R0), nn.NetVar(b0)

    def rnn_step(x, G, lengths):
        W.reset()
        R.reset()
        b.reset()
        y = nn.RNN(nn.NetVar(x, requires_grad=False), W, R, b, lengths=lengths)
        y.back(G)

    def check(step):
        step(0.5 * x, 2 * G, lengths)       # records
        step(x, G, lengths)                 # records again: the gradients now exist
        step(x, G, lengths)                 # replays (checked against eager by capture too)
        note = check_replay("W4 fused", ["W.g", "R.g", "b.g"], [W.g, R.g, b.g.reshape(-1)],
                            eager_gradients)
        return note
    return Replay(rnn_step, check)


def torch_gradients(torch, x, G, W, R, b, lengths, device="cpu"):
    """The PyTorch contender of W4 (and W7 with ``device="cuda"``): a function computing dW,
    dR, db of Σ G·y through ``torch.nn.RNN`` holding W, R, b, as tensors on ``device``."""
    T = x.shape[0]
    module = torch.nn.RNN(*W.shape).to(device)
    with torch.no_grad():
        module.weight_ih_l0.copy_(torch.from_numpy(W.T))
        module.weight_hh_l0.copy_(torch.from_numpy(R.T))
        module.bias_ih_l0.copy_(torch.from_numpy(b))
        module.bias_hh_l0.zero_()
    xt, Gt = torch.from_numpy(x).to(device), torch.from_numpy(G).to(device)
    lengths_t = torch.from_numpy(lengths)           # pack_padded_sequence wants them on the CPU
    pack, unpack = torch.nn.utils.rnn.pack_padded_sequence, torch.nn.utils.rnn.pad_packed_sequence

    def run():
        module.zero_grad(set_to_none=True)
        out, _ = module(pack(xt, lengths_t, enforce_sorted=False))
        y, _ = unpack(out, total_length=T)
        (y * Gt).sum().backward()
        return [module.weight_ih_l0.grad.T, module.weight_hh_l0.grad.T, module.bias_ih_l0.grad]
    return run


def rnn_rows(rounds, number=5):
    """W4 rows: the fused op (target 1.3x of NumPy), the same captured and replayed (target
    1.0x) and the unrolled RNNCell loop."""
    x, G, W0, R0, b0, lengths = make_data()
    B = x.shape[1]
    baseline = NumpyRNN(x, G, lengths)
    reference = baseline.gradients(W0, R0, b0)
    W, R, b = nn.NetVar(W0), nn.NetVar(R0), nn.NetVar(b0)
    fused = fused_gradients(x, G, W, R, b, lengths)

    order = baseline.order
    xs = [x[t][order[:n]] for t, n in enumerate(baseline.sizes)]      # sorted, valid rows
    Gs = [nn.NetVar(G[t][order[:n]], requires_grad=False) for t, n in enumerate(baseline.sizes)]

    def unrolled():
        W.reset()
        R.reset()
        b.reset()
        h = nn.NetVar(np.zeros((B, W0.shape[1]), np.float32), requires_grad=False)
        total = None
        for t, n in enumerate(baseline.sizes):
            if n < h.shape[0]:
                h = h[:n]
            h = nn.RNNCell(nn.NetVar(xs[t], requires_grad=False), h, W, R, b)
            term = (h * Gs[t]).sum()
            total = term if total is None else total + term
        total.back()
        return [W.g, R.g, b.g.reshape(-1)]

    check_close("W4 fused", fused(), reference, rtol=1e-3, atol=1e-4)
    check_close("W4 unrolled", unrolled(), reference, rtol=1e-3, atol=1e-4)
    fused_runs = {"nnkit": fused, "numpy": lambda: baseline.gradients(W0, R0, b0)}
    unrolled_runs = {"nnkit": unrolled, "numpy": fused_runs["numpy"]}
    torch = optional_torch()
    if torch is not None:
        torch_run = torch_gradients(torch, x, G, W0, R0, b0, lengths)
        check_close("W4 (PyTorch)", [g.numpy() for g in torch_run()], reference,
                    rtol=1e-3, atol=1e-4)
        fused_runs["torch"] = unrolled_runs["torch"] = torch_run
    rows = [Row("W4 variable-length tanh RNN, fused nnkit.RNN", "ms", 1e3,
                interleaved(fused_runs, rounds, number), target=1.30)]
    rows.append(Row("W4 the same, unrolled RNNCell loop", "ms", 1e3,
                    interleaved(unrolled_runs, max(3, rounds // 2), 2)))
    replay = captured_rnn(x, G, W0, R0, b0, lengths, [g.copy() for g in fused()])
    times = replay.measure(lambda: replay(x, G, lengths), {"numpy": fused_runs["numpy"]}, rounds,
                           number)
    rows.insert(1, replay.row("W4 the same, captured (nn.capture) and replayed", "ms", 1e3,
                              times, target=1.0))
    return rows
