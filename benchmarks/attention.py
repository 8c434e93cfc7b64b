"""W8: masked multi-head self-attention, forward and backward.

B 32 sequences of lengths 5..100 padded to the batch's longest (100), dim 128, 4 heads, time-major
(T, B, dim) float32; forward, then backward of Σ G·y for a fixed random G (zero at padded
steps), giving dx and the gradients of the eight weights. nnkit's ``layers.MultiHeadAttention``
(one fused ``Attention`` node between the projections) against the same math written by hand in
NumPy (the same layout, keys past each length masked, the softmax in the scores' buffer, only
the attention weights kept for backward; checked equal before timing) and against PyTorch's
``nn.MultiheadAttention`` with ``key_padding_mask`` (CPU, ``need_weights=False``, the weights
converted as the layer documents; checked equal too). Target: at most 1.3x NumPy and faster than
PyTorch (the median over rounds of nnkit / PyTorch below 1).

Memory, peak bytes traced by ``tracemalloc`` during one forward and backward pass (what the
pass allocates, not the data or the weights), as W6 measures: the fused ``Attention`` op
against the attention by hand (``attention_core``) on the same (B·heads, T, dh) blocks, target
no more than the hand-written version (its arrays: a node's few hundred bytes of Python objects
aside); and the whole layer against the whole hand-written pass, reported without a target (the
graph keeps every node's value: x·W and x·W + b both, where the hand-written pass adds the bias
in place).
"""
import gc
import math
import tracemalloc

import numpy as np

import nnkit as nn
from nnkit.backend import array_module

from .harness import Row, check_close, interleaved, median_ratio, optional_torch


def make_data(B=32, dim=128, shortest=5, longest=100, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(shortest, longest + 1, B)
    lengths[0] = longest                                 # the batch is padded to its longest
    T = int(lengths.max())
    x = rng.standard_normal((T, B, dim)).astype(np.float32)
    G = rng.standard_normal((T, B, dim)).astype(np.float32)
    G *= (np.arange(T)[:, None] < lengths[None, :])[:, :, None]       # nothing at padding
    bound = math.sqrt(3 / dim)
    weights = [rng.uniform(-bound, bound, (dim, dim)).astype(np.float32) for _ in range(4)]
    biases = [(0.1 * rng.standard_normal(dim)).astype(np.float32) for _ in range(4)]
    return x, G, weights, biases, lengths


class NumpyAttention:
    """The hand-written baseline, in the layout nnkit's layer uses: three projections of the
    (T·B, dim) rows, heads copied into contiguous (B, heads, T, dh) blocks, the masked softmax
    in place in the scores' buffer (``attention_core``), and a backward that keeps only the
    attention weights. Written against the arrays' module: W7 runs it on CuPy arrays."""

    def __init__(self, x, G, lengths, heads):
        T, B, D = x.shape
        self.x, self.G, self.heads = x, G, heads
        keep = (np.arange(T)[None, :] < lengths[:, None])[:, None, None, :]       # (B,1,1,T)
        self.keep = array_module(x).asarray(keep)

    def gradients(self, weights, biases):
        """dx, dWq, dWk, dWv, dWo, dbq, dbk, dbv, dbo."""
        x, H = self.x, self.heads
        xp = array_module(x)
        T, B, D = x.shape
        dh = D // H
        Wq, Wk, Wv, Wo = weights
        bq, bk, bv, bo = biases
        X = x.reshape(T * B, D)

        def split(W, b):                                # (T·B, D) → (B, H, T, dh) blocks
            y = X @ W
            y += b
            return xp.ascontiguousarray(y.reshape(T, B, H, dh).transpose(1, 2, 0, 3))

        def merge(a):                                   # (B, H, T, dh) → (T·B, D)
            return a.transpose(2, 0, 1, 3).reshape(T * B, D)

        q, k, v = split(Wq, bq), split(Wk, bk), split(Wv, bv)
        o, backward = attention_core(q, k, v, self.keep)
        O = merge(o)
        y = O @ Wo
        y += bo                                         # the output (unused: G is its gradient)

        g = self.G.reshape(T * B, D)
        do = xp.ascontiguousarray((g @ Wo.T).reshape(T, B, H, dh).transpose(1, 2, 0, 3))
        dq, dk, dv = backward(do)
        dQ, dK, dV = merge(dq), merge(dk), merge(dv)
        dx = dQ @ Wq.T
        dx += dK @ Wk.T
        dx += dV @ Wv.T
        return [dx.reshape(T, B, D), X.T @ dQ, X.T @ dK, X.T @ dV, O.T @ g,
                dQ.sum(axis=0), dK.sum(axis=0), dV.sum(axis=0), g.sum(axis=0)]


def attention_core(q, k, v, keep):
    """Masked scaled dot-product attention by hand: (o, backward), where backward(do) gives
    (dq, dk, dv). The weights are computed in the scores' buffer and are all it keeps."""
    xp = array_module(q)
    scale = np.float32(1 / math.sqrt(q.shape[-1]))
    a = q @ k.swapaxes(-1, -2)                          # scores, then the weights in place
    a *= scale
    xp.copyto(a, -np.inf, where=~keep)
    a -= a.max(axis=-1, keepdims=True)
    xp.exp(a, out=a)
    a /= a.sum(axis=-1, keepdims=True)

    def backward(do):
        dv = a.swapaxes(-1, -2) @ do
        ds = do @ v.swapaxes(-1, -2)                    # da, then ds in place
        ds -= (ds * a).sum(axis=-1, keepdims=True)
        ds *= a
        dq = ds @ k
        dq *= scale
        dk = ds.swapaxes(-1, -2) @ q
        dk *= scale
        return dq, dk, dv
    return a @ v, backward


def nnkit_gradients(x, G, weights, biases, lengths, heads, gpu=False):
    """A function computing the same gradients through ``nn.layers.MultiHeadAttention`` (on the
    GPU with ``gpu``: ``G`` is then a CuPy array; ``lengths`` stay on the host)."""
    dim = x.shape[2]
    layer = nn.layers.MultiHeadAttention(dim, heads, seed=0)
    names = ("Wq", "Wk", "Wv", "Wo")
    for name, W in zip(names, weights):
        getattr(layer, name).data = W
    for name, b in zip(("bq", "bk", "bv", "bo"), biases):
        getattr(layer, name).data = b.reshape(1, -1)
    xv = nn.NetVar(x)
    if gpu:
        layer.to_gpu()
        xv.to_gpu()
    parameters = [getattr(layer, name) for name in names + ("bq", "bk", "bv", "bo")]

    def run():
        xv.reset()
        for p in parameters:
            p.reset()
        layer(xv, lengths).back(G)
        return [xv.g] + [p.g.reshape(-1) if p.shape[0] == 1 else p.g for p in parameters]
    return run


def torch_gradients(torch, x, G, weights, biases, lengths, heads, device="cpu"):
    """The PyTorch contender: ``nn.MultiheadAttention`` (weights converted as
    ``layers.MultiHeadAttention`` documents) with ``key_padding_mask``, on ``device``."""
    T, B, dim = x.shape
    module = torch.nn.MultiheadAttention(dim, heads)
    Wq, Wk, Wv, Wo = weights
    with torch.no_grad():
        module.in_proj_weight.copy_(torch.from_numpy(np.concatenate([Wq.T, Wk.T, Wv.T])))
        module.in_proj_bias.copy_(torch.from_numpy(np.concatenate(biases[:3])))
        module.out_proj.weight.copy_(torch.from_numpy(Wo.T.copy()))
        module.out_proj.bias.copy_(torch.from_numpy(biases[3]))
    module.to(device)
    xt = torch.from_numpy(x).to(device).requires_grad_()
    Gt = torch.from_numpy(G).to(device)
    padding = torch.from_numpy(~(np.arange(T)[None, :] < lengths[:, None])).to(device)  # ignored

    def run():
        module.zero_grad(set_to_none=True)
        xt.grad = None
        y, _ = module(xt, xt, xt, key_padding_mask=padding, need_weights=False)
        y.backward(Gt)
        W = module.in_proj_weight.grad
        b = module.in_proj_bias.grad
        return [xt.grad, W[:dim].T, W[dim:2 * dim].T, W[2 * dim:].T,
                module.out_proj.weight.grad.T, b[:dim], b[dim:2 * dim], b[2 * dim:],
                module.out_proj.bias.grad]
    return run


def peak_memory(run):
    """Peak bytes traced by tracemalloc during one call of ``run`` (after a first call), what
    the call returns included."""
    run()
    gc.collect()
    tracemalloc.start()
    try:
        result = run()
        peak = tracemalloc.get_traced_memory()[1]
        del result
        return peak
    finally:
        tracemalloc.stop()
        gc.collect()


BOOKKEEPING = 16 * 1024     # bytes of Python objects (a node, its slots) beyond the arrays


def core_runs(x, G, weights, biases, lengths, heads):
    """The attention alone, on the layer's (B·heads, T, dh) blocks: nnkit's fused ``Attention``
    node and ``attention_core``, each forward and backward (dq, dk, dv)."""
    T, B, D = x.shape
    dh = D // heads
    rng = np.random.default_rng(1)
    q, k, v, do = (rng.standard_normal((B * heads, T, dh)).astype(np.float32)
                   for _ in range(4))
    keep = np.repeat(np.arange(T)[None, :] < lengths[:, None], heads, axis=0)[:, None, :]
    nodes = [nn.NetVar(a) for a in (q, k, v)]

    def fused():
        for node in nodes:
            node.reset()
        nn.Attention(*nodes, mask=keep).back(do)
        return [node.g for node in nodes]

    def by_hand():
        o, backward = attention_core(q, k, v, keep)
        return list(backward(do))
    check_close("W8 Attention", fused(), by_hand(), rtol=1e-3, atol=1e-4)
    return fused, by_hand


def attention_rows(rounds, number=3, heads=4):
    """W8 rows: time against hand-written NumPy (target 1.3x) and PyTorch (faster), and the
    peak memory of the fused Attention op against the attention by hand (target 1x), and of
    the whole pass (no target)."""
    x, G, weights, biases, lengths = make_data()
    baseline = NumpyAttention(x, G, lengths, heads)
    reference = baseline.gradients(weights, biases)
    ours = nnkit_gradients(x, G, weights, biases, lengths, heads)
    check_close("W8 MultiHeadAttention", ours(), reference, rtol=1e-3, atol=1e-4)
    runs = {"nnkit": ours, "numpy": lambda: baseline.gradients(weights, biases)}
    torch = optional_torch()
    if torch is not None:
        theirs = torch_gradients(torch, x, G, weights, biases, lengths, heads)
        check_close("W8 (PyTorch)", [g.detach().numpy() for g in theirs()], reference,
                    rtol=1e-3, atol=1e-4)
        runs["torch"] = theirs
    times = interleaved(runs, rounds, number)
    row = Row("W8 self-attention fwd+bwd, B 32, T 5..100, dim 128, 4 heads", "ms", 1e3, times,
              target=1.30)
    if "torch" in times:
        against = median_ratio(times["nnkit"], times["torch"])
        row.target = "<= 1.30x, < PyTorch"
        row.met = row.ratio <= 1.30 and against < 1
        row.note = f"nnkit / PyTorch {against:.3f}x (median over rounds)"
    fused, by_hand = core_runs(x, G, weights, biases, lengths, heads)
    peaks = {"nnkit": [peak_memory(fused)], "numpy": [peak_memory(by_hand)]}
    extra = peaks["nnkit"][0] - peaks["numpy"][0]
    rows = [row,
            Row("W8 peak memory, the Attention op fwd+bwd", "MB", 1e-6, peaks,
                target="<= 1.00x (arrays)", met=extra <= BOOKKEEPING,
                note=f"the fused op's peak minus the hand-written one's: {extra:+,} bytes "
                     f"(the node's Python objects; met within {BOOKKEEPING // 1024} KiB)"),
            Row("W8 peak memory, the whole W8 pass", "MB", 1e-6,
                {"nnkit": [peak_memory(ours)], "numpy": [peak_memory(runs["numpy"])]},
                note="PyTorch's allocations are not traced")]
    return rows
