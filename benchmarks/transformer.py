"""W10: a character-level Transformer language model, one training step.

Tokens of a vocabulary of 65 (T 64, B 32, time-major), an embedding (dim 64) plus the sinusoidal
positions, 2 pre-norm encoder layers (dim 64, 4 heads, feed-forward 256, tanh GELU, causal), a
final LayerNorm and a Linear to the 65 logits; softmax cross-entropy on the next token, then
back and an Adam step, float32. nnkit as a user writes it (``nn.layers``), the same model in
PyTorch (``nn.TransformerEncoderLayer(norm_first=True)`` with ``gelu(approximate='tanh')``,
``dropout=0``, one CPU thread) and by hand in NumPy (forward, backward and Adam written out,
``adam_numpy`` as W2), all from the same float32 weights, checked equal (the gradients, then the
weights after a step) before timing. Target: nnkit's eager step no slower than PyTorch's (the
median over rounds of nnkit / PyTorch at most 1).

A second row times nnkit's step captured with ``nn.capture`` and replayed (the same batch every
call after the recording), checked equal to eager first (the losses, then the weights after three
steps); target: at most 0.8x PyTorch's step.

A third row times the eager contenders in a child process where nnkit leaves glibc's malloc its
own thresholds (``NNKIT_KEEP_FREED_MEMORY=0``; ``nnkit.backend.keep_freed_memory``): how much of
each contender's time then goes to the fresh pages malloc hands out again at every step (no
target; the first row is what users get).
"""
import json
import math
import os
import platform
import subprocess
import sys

import numpy as np

import nnkit as nn

from .harness import (Replay, Row, check_close, check_replay, interleaved, median_ratio,
                      optional_torch)
from .mlp import BETAS, EPS, LR, adam_numpy

V, DIM, HEADS, HIDDEN, LAYERS, T, B = 65, 64, 4, 256, 2, 64, 32
GELU_C, GELU_K = math.sqrt(2 / math.pi), 0.044715


def make_weights(seed=0):
    """The shared float32 weights in nnkit's layout (``state()`` names of ``NnkitLM.model``)."""
    rng = np.random.default_rng(seed)

    def uniform(fan_in, fan_out):
        bound = math.sqrt(6 / (fan_in + fan_out))
        return rng.uniform(-bound, bound, (fan_in, fan_out)).astype(np.float32)

    def row(n, scale=0.02, offset=0.0):
        return (offset + scale * rng.standard_normal((1, n))).astype(np.float32)

    w = {"embed.table": rng.standard_normal((V, DIM)).astype(np.float32)}
    for i in range(LAYERS):
        p = f"layers.{i}."
        for name in ("Wq", "Wk", "Wv", "Wo"):
            w[p + "self_attn." + name] = uniform(DIM, DIM)
        for name in ("bq", "bk", "bv", "bo"):
            w[p + "self_attn." + name] = row(DIM)
        w[p + "linear1.W"], w[p + "linear1.b"] = uniform(DIM, HIDDEN), row(HIDDEN)
        w[p + "linear2.W"], w[p + "linear2.b"] = uniform(HIDDEN, DIM), row(DIM)
        for norm in ("norm1", "norm2"):
            w[p + norm + ".gamma"], w[p + norm + ".beta"] = row(DIM, 0.1, 1.0), row(DIM)
    w["norm.gamma"], w["norm.beta"] = row(DIM, 0.1, 1.0), row(DIM)
    w["head.W"], w["head.b"] = uniform(DIM, V), row(V)
    return w


def make_tokens(seed=1):
    """(T, B) input tokens and their (T, B) next tokens."""
    tokens = np.random.default_rng(seed).integers(0, V, (T + 1, B))
    return tokens[:-1], tokens[1:]


class LM(nn.Module):
    """The model in nnkit, as a user writes it."""

    def __init__(self):
        self.embed = nn.layers.Embedding(V, DIM)
        self.layers = [nn.layers.TransformerEncoderLayer(DIM, HEADS, HIDDEN)
                       for _ in range(LAYERS)]
        self.norm = nn.layers.LayerNorm(DIM)
        self.head = nn.layers.Linear(DIM, V)
        self.positions = nn.layers.positional_encoding(T, DIM)[:, None, :]      # (T, 1, DIM)

    def forward(self, tokens):
        h = self.embed(tokens) + self.positions
        for layer in self.layers:
            h = layer(h, causal=True)
        return self.head(self.norm(h))


class NnkitLM:
    def __init__(self, weights):
        self.model = LM()
        self.model.load_state(weights)
        self.params = self.model.vars
        self.optimizer = nn.Adam(self.params, lr=LR, momentum=BETAS[0], rms=BETAS[1], eps=EPS)

    def gradients(self, x, y):
        loss = nn.SoftmaxCELoss(self.model(x), y)
        loss.back()
        return loss.item()

    def step(self, x, y):
        loss = self.gradients(x, y)
        self.optimizer.step()
        return loss

    def train(self, x, y):
        """``step`` returning the loss node: the function the replay row captures (a captured
        step reads no value into Python, so no ``item()``)."""
        loss = nn.SoftmaxCELoss(self.model(x), y)
        loss.back()
        self.optimizer.step()
        return loss

    def named(self, arrays):
        """name -> array of the parameters, from what ``arrays(p)`` gives for each."""
        return {name: arrays(p) for name, p in zip(self.model.state(), self.params)}


def torch_lm(torch, weights):
    """The same model and step in PyTorch (one thread, set by the harness)."""
    F = torch.nn.functional

    class TorchLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(V, DIM)
            self.layers = torch.nn.ModuleList(
                torch.nn.TransformerEncoderLayer(
                    DIM, HEADS, HIDDEN, dropout=0.0, norm_first=True,
                    activation=torch.nn.GELU(approximate="tanh"))
                for _ in range(LAYERS))
            self.norm = torch.nn.LayerNorm(DIM)
            self.head = torch.nn.Linear(DIM, V)
            self.register_buffer("positions", torch.from_numpy(
                nn.layers.positional_encoding(T, DIM)[:, None, :]))
            self.register_buffer("causal", torch.triu(torch.ones(T, T, dtype=torch.bool), 1))

        def forward(self, tokens):
            h = self.embed(tokens) + self.positions
            for layer in self.layers:
                h = layer(h, src_mask=self.causal, is_causal=True)
            return self.head(self.norm(h))

    model = TorchLM()
    for name, value in torch_state(weights).items():
        model.get_parameter(name).data.copy_(torch.from_numpy(value))
    optimizer = torch.optim.Adam(model.parameters(), lr=LR, betas=BETAS, eps=EPS)

    class Step:
        def gradients(self, x, y):
            optimizer.zero_grad(set_to_none=True)
            logits = model(torch.from_numpy(x))
            loss = F.cross_entropy(logits.reshape(-1, V), torch.from_numpy(y).reshape(-1))
            loss.backward()
            return loss.item()

        def step(self, x, y):
            loss = self.gradients(x, y)
            optimizer.step()
            return loss

        def named(self, arrays):
            state = torch_state(weights)
            return from_torch({name: arrays(model.get_parameter(name)) for name in state},
                              weights)
    return Step()


def torch_state(weights):
    """nnkit's weights as PyTorch's parameters (names and layouts)."""
    s = {"embed.weight": weights["embed.table"]}
    for i in range(LAYERS):
        p = f"layers.{i}."
        Wq, Wk, Wv = (weights[p + "self_attn." + n] for n in ("Wq", "Wk", "Wv"))
        s[p + "self_attn.in_proj_weight"] = np.concatenate([Wq.T, Wk.T, Wv.T])
        s[p + "self_attn.in_proj_bias"] = np.concatenate(
            [weights[p + "self_attn." + n][0] for n in ("bq", "bk", "bv")])
        s[p + "self_attn.out_proj.weight"] = weights[p + "self_attn.Wo"].T
        s[p + "self_attn.out_proj.bias"] = weights[p + "self_attn.bo"][0]
        for lin in ("linear1", "linear2"):
            s[p + lin + ".weight"] = weights[p + lin + ".W"].T
            s[p + lin + ".bias"] = weights[p + lin + ".b"][0]
        for norm in ("norm1", "norm2"):
            s[p + norm + ".weight"] = weights[p + norm + ".gamma"][0]
            s[p + norm + ".bias"] = weights[p + norm + ".beta"][0]
    s["norm.weight"], s["norm.bias"] = weights["norm.gamma"][0], weights["norm.beta"][0]
    s["head.weight"], s["head.bias"] = weights["head.W"].T, weights["head.b"][0]
    return {name: np.ascontiguousarray(a) for name, a in s.items()}


def from_torch(arrays, weights):
    """PyTorch's named arrays back in nnkit's names and layouts."""
    out = {"embed.table": arrays["embed.weight"]}
    for i in range(LAYERS):
        p = f"layers.{i}."
        W, b = arrays[p + "self_attn.in_proj_weight"], arrays[p + "self_attn.in_proj_bias"]
        for j, n in enumerate("qkv"):
            out[p + "self_attn.W" + n] = W[j * DIM:(j + 1) * DIM].T
            out[p + "self_attn.b" + n] = b[j * DIM:(j + 1) * DIM][None]
        out[p + "self_attn.Wo"] = arrays[p + "self_attn.out_proj.weight"].T
        out[p + "self_attn.bo"] = arrays[p + "self_attn.out_proj.bias"][None]
        for lin in ("linear1", "linear2"):
            out[p + lin + ".W"] = arrays[p + lin + ".weight"].T
            out[p + lin + ".b"] = arrays[p + lin + ".bias"][None]
        for norm in ("norm1", "norm2"):
            out[p + norm + ".gamma"] = arrays[p + norm + ".weight"][None]
            out[p + norm + ".beta"] = arrays[p + norm + ".bias"][None]
    out["norm.gamma"], out["norm.beta"] = arrays["norm.weight"][None], arrays["norm.bias"][None]
    out["head.W"], out["head.b"] = arrays["head.weight"].T, arrays["head.bias"][None]
    return {name: out[name] for name in weights}


def layer_norm(x, gamma, beta, eps=1e-5):
    """(y, x̂, 1/σ) of a LayerNorm over the last axis."""
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    inv = 1 / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + eps)
    xhat = centred
    xhat *= inv
    y = xhat * gamma
    y += beta
    return y, xhat, inv


def layer_norm_back(g, xhat, inv, gamma):
    """(dx, dγ, dβ) of a LayerNorm for its upstream gradient g."""
    product = g * xhat
    dgamma = product.sum(axis=0, keepdims=True)
    dbeta = g.sum(axis=0, keepdims=True)
    product *= gamma
    d = g * gamma
    d -= d.mean(axis=-1, keepdims=True)
    d -= np.multiply(xhat, product.mean(axis=-1, keepdims=True), out=product)
    d *= inv
    return d, dgamma, dbeta


class NumpyLM:
    """The hand-written baseline: the same model's forward, backward and Adam step written out
    in NumPy on (T·B, dim) rows, the attention as W8's ``attention_core`` (the softmax in the
    scores' buffer), the GELU's tanh kept for its backward."""

    def __init__(self, weights):
        self.params = {name: a.copy() for name, a in weights.items()}
        self.grads = {}
        self.m = {name: np.zeros_like(a) for name, a in weights.items()}
        self.v = {name: np.zeros_like(a) for name, a in weights.items()}
        self.t = 0
        self.positions = nn.layers.positional_encoding(T, DIM)[:, None, :]
        self.keep = np.tri(T, T, dtype=bool)

    def gradients(self, x, y):
        from .attention import attention_core
        P, G = self.params, self.grads
        dh = DIM // HEADS
        rows = T * B

        def split(a):                                   # (T·B, D) → (B, H, T, dh) blocks
            return np.ascontiguousarray(a.reshape(T, B, HEADS, dh).transpose(1, 2, 0, 3))

        def merge(a):                                   # (B, H, T, dh) → (T·B, D)
            return a.transpose(2, 0, 1, 3).reshape(rows, DIM)

        h = (P["embed.table"][x] + self.positions).reshape(rows, DIM)
        saved = []
        for i in range(LAYERS):
            p = f"layers.{i}."
            n1, xhat1, inv1 = layer_norm(h, P[p + "norm1.gamma"], P[p + "norm1.beta"])
            q, k, v = (split(n1 @ P[p + "self_attn.W" + c] + P[p + "self_attn.b" + c])
                       for c in "qkv")
            o, attention_back = attention_core(q, k, v, self.keep)
            O = merge(o)
            h = h + (O @ P[p + "self_attn.Wo"] + P[p + "self_attn.bo"])
            n2, xhat2, inv2 = layer_norm(h, P[p + "norm2.gamma"], P[p + "norm2.beta"])
            u = n2 @ P[p + "linear1.W"]
            u += P[p + "linear1.b"]
            tanh = u * GELU_K                           # tanh(c·(u + k u³)), in place
            tanh *= u
            tanh *= u
            tanh += u
            tanh *= GELU_C
            np.tanh(tanh, out=tanh)
            a = tanh + 1
            a *= u
            a *= 0.5
            f = a @ P[p + "linear2.W"]
            f += P[p + "linear2.b"]
            h = h + f
            saved.append((n1, xhat1, inv1, attention_back, O, n2, xhat2, inv2, u, tanh, a))
        n, xhat, inv = layer_norm(h, P["norm.gamma"], P["norm.beta"])
        z = n @ P["head.W"]
        z += P["head.b"]

        labels = y.reshape(-1)
        z -= z.max(axis=1, keepdims=True)
        dz = np.exp(z)
        total = dz.sum(axis=1, keepdims=True)
        loss = float(np.log(total).mean() - z[np.arange(rows), labels].mean())
        dz /= total
        dz[np.arange(rows), labels] -= 1
        dz /= rows

        G["head.W"], G["head.b"] = n.T @ dz, dz.sum(axis=0, keepdims=True)
        d, G["norm.gamma"], G["norm.beta"] = layer_norm_back(dz @ P["head.W"].T, xhat, inv,
                                                             P["norm.gamma"])
        for i in reversed(range(LAYERS)):
            p = f"layers.{i}."
            n1, xhat1, inv1, attention_back, O, n2, xhat2, inv2, u, tanh, a = saved[i]
            G[p + "linear2.W"], G[p + "linear2.b"] = a.T @ d, d.sum(axis=0, keepdims=True)
            du = d @ P[p + "linear2.W"].T
            slope = tanh * tanh                         # GELU's slope, in two arrays
            np.subtract(1, slope, out=slope)
            slope *= u
            slope *= 0.5 * GELU_C
            other = u * u
            other *= 3 * GELU_K
            other += 1
            slope *= other
            np.add(tanh, 1, out=other)
            other *= 0.5
            slope += other
            du *= slope
            G[p + "linear1.W"], G[p + "linear1.b"] = n2.T @ du, du.sum(axis=0, keepdims=True)
            dn, G[p + "norm2.gamma"], G[p + "norm2.beta"] = layer_norm_back(
                du @ P[p + "linear1.W"].T, xhat2, inv2, P[p + "norm2.gamma"])
            d = d + dn
            G[p + "self_attn.Wo"], G[p + "self_attn.bo"] = O.T @ d, d.sum(axis=0, keepdims=True)
            dq, dk, dv = (merge(g) for g in attention_back(split(d @ P[p + "self_attn.Wo"].T)))
            dn1 = dq @ P[p + "self_attn.Wq"].T
            dn1 += dk @ P[p + "self_attn.Wk"].T
            dn1 += dv @ P[p + "self_attn.Wv"].T
            for c, g in zip("qkv", (dq, dk, dv)):
                G[p + "self_attn.W" + c] = n1.T @ g
                G[p + "self_attn.b" + c] = g.sum(axis=0, keepdims=True)
            dn, G[p + "norm1.gamma"], G[p + "norm1.beta"] = layer_norm_back(
                dn1, xhat1, inv1, P[p + "norm1.gamma"])
            d += dn
        tokens = x.reshape(-1)                          # rows of equal tokens summed
        order = np.argsort(tokens, kind="stable")
        ordered = tokens[order]
        starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
        table = np.zeros_like(P["embed.table"])
        table[ordered[starts]] = np.add.reduceat(d[order], starts, axis=0)
        G["embed.table"] = table
        return loss

    def step(self, x, y):
        loss = self.gradients(x, y)
        self.t += 1
        for name, p in self.params.items():
            adam_numpy(p, self.grads[name], self.m[name], self.v[name], self.t)
        return loss

    def named(self, arrays):
        return {name: arrays(name) for name in self.params}


def captured_lm(weights, x, y):
    """A fresh ``NnkitLM``'s ``train`` captured (a ``Replay``), checked against another fresh
    one's run eagerly for three steps, the first on another batch (the recording), then two on
    ``x, y``: every step's loss and the weights after."""
    model, eager = NnkitLM(weights), NnkitLM(weights)
    batches = [make_tokens(seed=2), (x, y), (x, y)]

    def check(step):
        replayed = [step(*batch).data.copy() for batch in batches]
        expected = [eager.train(*batch).data for batch in batches]
        labels = [f"loss at step {i + 1}" for i in range(len(batches))] + [
            f"parameter {key} after {len(batches)} steps" for key in model.model.state()]
        return check_replay("W10", labels, replayed + [p.data for p in model.params],
                            expected + [p.data for p in eager.params])
    return Replay(model.train, check)


def step_times(rounds, number=2):
    """Check the contenders equal (gradients, then the weights after one Adam step) and time
    their steps interleaved: name -> seconds per step, one per round."""
    weights = make_weights()
    x, y = make_tokens()
    numpy_model, ours = NumpyLM(weights), NnkitLM(weights)
    numpy_model.gradients(x, y)
    ours.gradients(x, y)
    reference = numpy_model.named(lambda name: numpy_model.grads[name])
    names = list(reference)
    check_close("W10", [ours.named(lambda p: p.g)[n] for n in names],
                [reference[n] for n in names], rtol=1e-3, atol=1e-5)
    torch = optional_torch()
    if torch is not None:
        theirs = torch_lm(torch, weights)
        theirs.gradients(x, y)
        got = theirs.named(lambda p: p.grad.numpy())
        check_close("W10 (PyTorch)", [got[n] for n in names], [reference[n] for n in names],
                    rtol=1e-3, atol=1e-5)
    fresh = {"nnkit": NnkitLM(weights), "numpy": NumpyLM(weights)}
    if torch is not None:
        fresh["torch"] = torch_lm(torch, weights)
    for model in fresh.values():
        model.step(x, y)
    after = fresh["numpy"].named(lambda name: fresh["numpy"].params[name])
    # bk's true gradient is 0 (softmax ignores q·bk), so its computed one is rounding noise,
    # which Adam's first step turns into ±lr: it is left out of the comparison after a step
    names = [n for n in names if not n.endswith("self_attn.bk")]
    check_close("W10 after one Adam step", [fresh["nnkit"].named(lambda p: p.data)[n]
                                            for n in names],
                [after[n] for n in names], rtol=1e-5, atol=0.05 * LR)
    if torch is not None:
        got = fresh["torch"].named(lambda p: p.detach().numpy())
        check_close("W10 after one Adam step (PyTorch)", [got[n] for n in names],
                    [after[n] for n in names], rtol=1e-5, atol=0.05 * LR)
    return interleaved({name: (lambda m=model: m.step(x, y)) for name, model in fresh.items()},
                       rounds, number)


def replay_times(rounds, number=2):
    """The captured step (``captured_lm``) timed interleaved with fresh NumPy and PyTorch
    steps (``step_times`` checked them): ``(replay, times)``, times None when nn.capture
    raised."""
    weights = make_weights()
    x, y = make_tokens()
    replay = captured_lm(weights, x, y)
    baselines = {"numpy": NumpyLM(weights)}
    torch = optional_torch()
    if torch is not None:
        baselines["torch"] = torch_lm(torch, weights)
    steps = {name: (lambda m=model: m.step(x, y)) for name, model in baselines.items()}
    return replay, replay.measure(lambda: replay(x, y), steps, rounds, number)


def steps_row(label, times, limit=1.0):
    """The row of steps per second; the ratios are of times (the inverse ratios of rates). The
    target: nnkit's time at most ``limit`` times PyTorch's."""
    row = Row(label, "steps/s", 1.0, {name: [1 / s for s in t] for name, t in times.items()})
    row.ratio = median_ratio(times["nnkit"], times["numpy"])
    if "torch" in times:
        row.torch_ratio = median_ratio(times["torch"], times["numpy"])
        against = median_ratio(times["nnkit"], times["torch"])
        row.target = "<= PyTorch" if limit == 1.0 else f"<= {limit:.2f}x PyTorch"
        row.met = against <= limit
        row.note = f"nnkit / PyTorch {against:.3f}x in time (median over rounds)"
    return row


# nnkit, imported, lets glibc's malloc keep the memory a step frees (backend.keep_freed_memory);
# told not to, malloc gives the freed top of its heap back and the next step gets fresh pages.
GLIBC_DEFAULTS = {"NNKIT_KEEP_FREED_MEMORY": "0"}


def replay_row(label, rounds, number):
    """The row of the captured step (``replay_times``; target: at most 0.8x PyTorch's time)."""
    replay, times = replay_times(rounds, number)
    label = f"{label}, captured (nn.capture) and replayed"
    if times is None:
        return Row(label, "steps/s", 1.0, {}, target="<= 0.80x PyTorch", met=False,
                   note=replay.note)
    return replay.annotate(steps_row(label, replay.columns(times), limit=0.8))


def transformer_rows(rounds, number=2):
    """W10's rows: steps per second of each contender (target: nnkit no slower than PyTorch),
    as the process runs; nnkit's step captured and replayed (``replay_row``); then the eager
    contenders again in a child process where malloc keeps glibc's own thresholds
    (``GLIBC_DEFAULTS``, the same for all three contenders; Linux only)."""
    label = "W10 char Transformer LM step (2 layers, dim 64, T 64, B 32, Adam)"
    rows = [steps_row(label, step_times(rounds, number)), replay_row(label, rounds, number)]
    if platform.libc_ver()[0] != "glibc":
        return rows
    from . import harness
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    environment.update(GLIBC_DEFAULTS)
    environment["PYTHONPATH"] = os.pathsep.join(
        [root] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    torch = optional_torch()
    threads = torch.get_num_threads() if torch is not None else 1
    clock = next(name for name, f in harness.CLOCKS.items() if f is harness.clock)
    code = ("import json, sys; from benchmarks import harness, transformer; "
            f"harness.use_clock({clock!r}); torch = harness.optional_torch(); "
            f"torch is not None and torch.set_num_threads({threads}); "
            f"json.dump(transformer.step_times({rounds}, {number}), sys.stdout)")
    child = subprocess.run([sys.executable, "-c", code], env=environment, cwd=root,
                           capture_output=True, text=True)
    if child.returncode:
        raise RuntimeError(f"W10 with glibc's malloc thresholds failed:\n{child.stderr}")
    row = steps_row(f"{label}, glibc's malloc thresholds", json.loads(child.stdout))
    row.target, row.met = "-", None
    row.note = (" ".join(f"{k}={v}" for k, v in GLIBC_DEFAULTS.items()) + "; "
                + row.note)
    return rows + [row]
