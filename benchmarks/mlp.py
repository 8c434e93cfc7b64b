"""W2 (digits MLP epoch), W3 (one step of a BLAS-bound MLP), W6 (W3's peak memory) and W11 (one
step of a 784-256-10 MLP, eager and captured).

The three contenders train the same ReLU MLP with softmax cross-entropy and Adam from the same
float32 weights: nnkit as a user writes it, NumPy by hand with preallocated buffers and in-place
updates, and PyTorch (when installed). W2 and W11 add nnkit's step captured with ``nn.capture``
and replayed, and W11 NumPy written plainly (every intermediate a new array).
"""
import gc
import tracemalloc

import numpy as np

import nnkit as nn
from nnkit.backend import array_module

from .harness import (Replay, Row, check_close, check_replay, interleaved, median_ratio,
                      optional_torch)

LR, BETAS, EPS = 1e-3, (0.9, 0.999), 1e-8


def init_weights(sizes, seed=0):
    """He-uniform weights (fan_in, fan_out) and small biases as float32 NumPy arrays."""
    rng = np.random.default_rng(seed)
    layers = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        limit = np.sqrt(6.0 / fan_in)
        W = rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32)
        b = (0.01 * rng.standard_normal(fan_out)).astype(np.float32)
        layers.append((W, b))
    return layers


def adam_numpy(p, g, m, v, t):
    """The Adam update, in place, with one temporary (bias-corrected, as nnkit.Adam).

    Written against the arrays' module, so the GPU rows (W7) run it on CuPy arrays too.
    """
    xp = array_module(p)
    b1, b2 = BETAS
    c1, c2 = 1 - b1 ** t, 1 - b2 ** t
    tmp = xp.multiply(g, 1 - b1)
    m *= b1
    m += tmp
    xp.multiply(g, g, out=tmp)
    tmp *= 1 - b2
    v *= b2
    v += tmp
    xp.sqrt(v, out=tmp)                       # √(v/c2) + eps = (√v + eps·√c2) / √c2
    tmp += EPS * np.sqrt(c2)
    xp.divide(m, tmp, out=tmp)
    tmp *= LR * np.sqrt(c2) / c1
    p -= tmp


class NumpyMLP:
    """The hand-written baseline: forward, backward and Adam into preallocated buffers.

    ``xp`` is NumPy here and CuPy for the GPU rows (the same code, the same buffers).
    """

    def __init__(self, layers, xp=np):
        self.xp = xp
        self.params = [xp.array(a) for layer in layers for a in layer]
        self.grads = [xp.empty_like(p) for p in self.params]
        self.m = [xp.zeros_like(p) for p in self.params]
        self.v = [xp.zeros_like(p) for p in self.params]
        self.t = 0
        self.buffers = {}

    def _buffers(self, rows):
        xp = self.xp
        if rows not in self.buffers:      # activations and their gradients, per batch size
            widths = [W.shape[1] for W in self.params[0::2]]
            self.buffers[rows] = ([xp.empty((rows, n), np.float32) for n in widths],
                                  [xp.empty((rows, n), np.float32) for n in widths])
        return self.buffers[rows]

    def gradients(self, x, y):
        xp = self.xp
        acts, deltas = self._buffers(len(x))
        n_layers = len(acts)
        a = x
        for i in range(n_layers):
            W, b = self.params[2 * i], self.params[2 * i + 1]
            h = xp.matmul(a, W, out=acts[i])
            h += b
            if i < n_layers - 1:
                xp.maximum(h, 0, out=h)
            a = h
        z, rows = acts[-1], xp.arange(len(x))
        z -= z.max(axis=1, keepdims=True)
        dz = xp.exp(z, out=deltas[-1])
        total = dz.sum(axis=1, keepdims=True)
        loss = float(xp.log(total).mean() - z[rows, y].mean())
        dz /= total
        dz[rows, y] -= 1
        dz /= len(x)
        for i in range(n_layers - 1, -1, -1):
            below = x if i == 0 else acts[i - 1]
            xp.matmul(below.T, dz, out=self.grads[2 * i])
            xp.sum(dz, axis=0, out=self.grads[2 * i + 1])
            if i > 0:
                d_below = xp.matmul(dz, self.params[2 * i].T, out=deltas[i - 1])
                d_below *= below > 0
                dz = d_below
        return loss

    def step(self, x, y):
        loss = self.gradients(x, y)
        self.t += 1
        for p, g, m, v in zip(self.params, self.grads, self.m, self.v):
            adam_numpy(p, g, m, v, self.t)
        return loss


class PlainNumpyMLP:
    """The same step as a NumPy user first writes it: every intermediate a new array, Adam's
    moments rebuilt at each step (W11's second hand-written baseline)."""

    def __init__(self, layers):
        self.params = [a.copy() for layer in layers for a in layer]
        self.m = [np.zeros_like(p) for p in self.params]
        self.v = [np.zeros_like(p) for p in self.params]
        self.t = 0

    def step(self, x, y):
        weights, biases = self.params[0::2], self.params[1::2]
        activations = [x]
        for i, (W, b) in enumerate(zip(weights, biases)):
            h = activations[-1] @ W + b
            if i < len(weights) - 1:
                h = np.maximum(h, 0)
            activations.append(h)
        z = activations[-1]
        z = z - z.max(axis=1, keepdims=True)
        e = np.exp(z)
        probabilities = e / e.sum(axis=1, keepdims=True)
        rows = np.arange(len(x))
        loss = float(-np.log(probabilities[rows, y]).mean())
        dz = probabilities.copy()
        dz[rows, y] -= 1
        dz = dz / len(x)
        grads = []
        for i in range(len(weights) - 1, -1, -1):
            grads = [activations[i].T @ dz, dz.sum(axis=0)] + grads
            if i > 0:
                dz = (dz @ weights[i].T) * (activations[i] > 0)
        self.t += 1
        b1, b2 = BETAS
        for i, (p, g) in enumerate(zip(self.params, grads)):
            self.m[i] = b1 * self.m[i] + (1 - b1) * g
            self.v[i] = b2 * self.v[i] + (1 - b2) * g * g
            m_hat = self.m[i] / (1 - b1 ** self.t)
            v_hat = self.v[i] / (1 - b2 ** self.t)
            p -= LR * m_hat / (np.sqrt(v_hat) + EPS)
        return loss


def run_mlp(h, params, relu):
    """The MLP's logits written with a framework's tensors (PyTorch's here): h·W + b per layer
    (params W0, b0, W1, ...), ``relu`` between layers."""
    last = len(params) - 2
    for i in range(0, len(params), 2):
        h = h @ params[i] + params[i + 1]
        if i < last:
            h = relu(h)
    return h


class NnkitMLP:
    """The same network written as an nnkit user would write it: a ``Sequential`` of
    ``nn.layers.Linear`` with ReLU between them, given the shared start weights through
    ``load_state`` (on the GPU with ``gpu``)."""

    def __init__(self, layers, gpu=False):
        entries = []
        for W, _ in layers:
            entries += [nn.layers.Linear(*W.shape), nn.ReLU]
        self.model = nn.layers.Sequential(*entries[:-1])          # no ReLU after the last
        state = {}
        for i, (W, b) in enumerate(layers):                       # Linear's b is a (1, n) row
            state[f"layers.{2 * i}.W"], state[f"layers.{2 * i}.b"] = W, b.reshape(1, -1)
        self.model.load_state(state)
        if gpu:
            self.model.to_gpu()
        self.params = self.model.vars                 # W0, b0, W1, b1, ...
        self.optimizer = nn.Adam(self.params, lr=LR, momentum=BETAS[0], rms=BETAS[1], eps=EPS)

    def loss(self, x, y):
        return nn.SoftmaxCELoss(self.model(x), y)

    def gradients(self, x, y):
        loss = self.loss(x, y)
        loss.back()
        return loss.item()

    def step(self, x, y):
        loss = self.loss(x, y)
        loss.back()
        self.optimizer.step()
        return loss.item()

    def train(self, x, y):
        """``step`` returning the loss node: the function W2 and W11 capture (a captured step
        reads no value into Python, so no ``item()``)."""
        loss = self.loss(x, y)
        loss.back()
        self.optimizer.step()
        return loss


def torch_model(layers, device="cpu"):
    """The same network in PyTorch on ``device`` (W7 uses "cuda"), or None when PyTorch is
    not installed; ``x`` and ``y`` may be NumPy arrays or tensors on that device."""
    torch = optional_torch()
    if torch is None:
        return None
    F = torch.nn.functional

    class TorchMLP:
        def __init__(self):
            self.params = [torch.tensor(a, device=device, requires_grad=True)
                           for layer in layers for a in layer]
            self.optimizer = torch.optim.Adam(self.params, lr=LR, betas=BETAS, eps=EPS)

        def gradients(self, x, y):
            logits = run_mlp(torch.as_tensor(x, device=device), self.params, F.relu)
            loss = F.cross_entropy(logits, torch.as_tensor(y, device=device))
            loss.backward()
            return loss.item()

        def step(self, x, y):
            self.optimizer.zero_grad(set_to_none=True)
            loss = self.gradients(x, y)
            self.optimizer.step()
            return loss

        @property
        def grads(self):
            return [p.grad.numpy() for p in self.params]

    return TorchMLP()


def _contenders(layers, x, y):
    """Fresh models of each kind, after checking that they agree on gradients and a step."""
    numpy_model = NumpyMLP(layers)
    numpy_model.gradients(x, y)
    reference = [g.reshape(p.shape) for g, p in zip(numpy_model.grads, numpy_model.params)]
    ours = NnkitMLP(layers)
    ours.gradients(x, y)
    check_close("MLP", [p.g.reshape(p.shape[-1:] if p.shape[0] == 1 else p.shape)
                        for p in ours.params], reference)
    theirs = torch_model(layers)
    if theirs is not None:
        theirs.gradients(x, y)
        check_close("MLP (PyTorch)", theirs.grads, reference)
    ours, numpy_model = NnkitMLP(layers), NumpyMLP(layers)
    ours.step(x, y)
    numpy_model.step(x, y)
    check_close("MLP after one Adam step", [p.data.reshape(-1) for p in ours.params],
                [p.reshape(-1) for p in numpy_model.params], rtol=1e-5, atol=0.05 * LR)
    models = {"nnkit": NnkitMLP(layers), "numpy": NumpyMLP(layers)}
    if theirs is not None:
        models["torch"] = torch_model(layers)
    return models


def captured_mlp(name, layers, batches):
    """A fresh ``NnkitMLP``'s ``train`` captured (a ``Replay``), checked against another fresh
    one's run eagerly over ``batches``: every step's loss and the weights after."""
    model, eager = NnkitMLP(layers), NnkitMLP(layers)

    def check(step):
        replayed = [step(x, y).data.copy() for x, y in batches]
        expected = [eager.train(x, y).data for x, y in batches]
        labels = [f"loss at step {i + 1}" for i in range(len(batches))] + [
            f"parameter {key} after {len(batches)} steps" for key in model.model.state()]
        return check_replay(name, labels, replayed + [p.data for p in model.params],
                            expected + [p.data for p in eager.params])
    return Replay(model.train, check)


def digits_batches(batch=64):
    """W2's data: scikit-learn's digits scaled to [0, 1] (float32), in batches of ``batch``."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    X = (digits.data / 16.0).astype(np.float32)
    Y = digits.target.astype(np.int64)
    return [(X[i:i + batch], Y[i:i + batch]) for i in range(0, len(X), batch)]


def digits_epoch(rounds, batch=64, number=2):
    """W2: one epoch over scikit-learn's digits (64-128-128-10, batch 64, Adam, float32); then
    the same with nnkit's step captured and replayed, timed against NumPy's again (the last,
    partial batch is a second signature: two recordings, before the timing)."""
    batches = digits_batches(batch)
    layers = init_weights((64, 128, 128, 10))
    models = _contenders(layers, *batches[0])

    def epoch(step):
        def run():
            for x, y in batches:
                step(x, y)
        return run

    times = interleaved({name: epoch(model.step) for name, model in models.items()}, rounds,
                        number)
    eager = Row("W2 digits MLP epoch (64-128-128-10, Adam)", "ms", 1e3, times, target=1.25)
    # both signatures recorded, then both replayed
    replay = captured_mlp("W2", layers, [batches[0], batches[1], batches[-1], batches[2],
                                         batches[-1]])
    times = replay.measure(epoch(replay), {"numpy": epoch(models["numpy"].step)}, rounds, number)
    return [eager, replay.row("W2 the same, each step captured (nn.capture) and replayed", "ms",
                              1e3, times, target=0.9)]


def big_mlp_data(batch=256, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, 784)).astype(np.float32)
    y = rng.integers(0, 10, batch).astype(np.int64)
    return init_weights((784, 1024, 1024, 10)), x, y


def big_mlp_step(rounds, number=3):
    """W3: one training step of a 784-1024-1024-10 MLP on a batch of 256 (BLAS-bound)."""
    layers, x, y = big_mlp_data()
    models = _contenders(layers, x, y)
    times = interleaved({name: (lambda m=model: m.step(x, y)) for name, model in models.items()},
                        rounds, number)
    return [Row("W3 784-1024-1024-10 MLP step, batch 256", "ms", 1e3, times, target=1.10)]


def small_mlp_step(rounds, batch=128, number=30):
    """W11: one Adam step of a 784-256-10 MLP on a batch of 128, where Python's bookkeeping
    still shows: nnkit eager and captured (``nn.capture``) against NumPy with every buffer
    allocated once (``NumpyMLP``), and the replay against NumPy written plainly
    (``PlainNumpyMLP``).

    The plain step's time depends on what ran before it in the process: about twice the
    allocated-once step's run alone, close to it after a workload that freed larger arrays
    (W3, W10): glibc's malloc then keeps arrays of this size in its heap instead of handing
    their pages back at every free (W10's docstring).
    """
    rng = np.random.default_rng(1)
    layers = init_weights((784, 256, 10))
    x = rng.standard_normal((batch, 784)).astype(np.float32)
    y = rng.integers(0, 10, batch).astype(np.int64)
    models = _contenders(layers, x, y)
    plain, allocated_once = PlainNumpyMLP(layers), NumpyMLP(layers)
    plain.step(x, y)
    allocated_once.step(x, y)
    check_close("W11 NumPy written plainly, after one Adam step", plain.params,
                allocated_once.params, rtol=1e-5, atol=0.05 * LR)
    times = interleaved({name: (lambda m=model: m.step(x, y)) for name, model in models.items()},
                        rounds, number)
    label = f"W11 784-256-10 MLP step, batch {batch}"
    rows = [Row(f"{label}, against NumPy with buffers allocated once", "ms", 1e3, times)]
    other = (rng.standard_normal((batch, 784)).astype(np.float32), rng.integers(0, 10, batch))
    replay = captured_mlp("W11", layers, [other, (x, y), (x, y)])     # recorded on another batch
    plain = PlainNumpyMLP(layers)
    times = replay.measure(lambda: replay(x, y), {"numpy": lambda: models["numpy"].step(x, y),
                                                  "plain": lambda: plain.step(x, y)},
                           rounds, number)
    rows.append(replay.row(f"{label}, captured (nn.capture) and replayed", "ms", 1e3, times,
                           target=1.0))
    if times is None:
        rows.append(Row(f"{label}, replayed, against NumPy written plainly", "ms", 1e3, {},
                        note=replay.note))
    else:
        ratio = median_ratio(times["plain"], times["numpy"])
        plainly = (f"NumPy written plainly takes {ratio:.2f}x the allocated-once step (malloc "
                   "hands the memory one step frees to the next)")
        rows.append(Row(f"{label}, replayed, against NumPy written plainly", "ms", 1e3,
                        replay.columns(times, "plain"), note=plainly))
    return rows


def peak_memory(make, x, y):
    """Peak bytes held (traced by tracemalloc: NumPy arrays and Python objects) during one
    training step, weights and optimizer state included, after a first step made that state."""
    gc.collect()
    tracemalloc.start()
    try:
        model = make()
        model.step(x, y)
        tracemalloc.reset_peak()
        model.step(x, y)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        del model
        gc.collect()


def big_mlp_memory(rounds=1):
    """W6: peak memory of W3's step relative to the hand-written NumPy step."""
    layers, x, y = big_mlp_data()
    peaks = {"nnkit": [peak_memory(lambda: NnkitMLP(layers), x, y)],
             "numpy": [peak_memory(lambda: NumpyMLP(layers), x, y)]}
    return [Row("W6 peak memory of the W3 step", "MB", 1e-6, peaks, target=1.30,
                note="PyTorch's allocations are not traced")]
