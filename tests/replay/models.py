"""The model zoo that capture-and-replay is checked on: five small models, each with one
training step written plainly (forward, loss, ``back()``, ``optimizer.step()``), as a user
coming from PyTorch writes it with nnkit's public API.

``build_<kind>(dtype, seed=0)`` for kind in ``KINDS`` returns a ``Built``:

- ``step(*inputs)``: one full training step; returns the loss node. It calls no ``.item()``
  or ``float()`` and leaves the mode alone: training is nnkit's default (nnkit has no
  ``model.train()``; ``nn.train_mode`` / ``nn.eval_mode`` are modes of the whole thread).
- ``batches(n)``: n input tuples of NumPy arrays, one signature (shapes and dtypes) per kind;
  batch i depends on (seed, i) only, so ``batches(k) == batches(n)[:k]``.
- ``state()``: a flat list of NumPy copies of everything training changes: the model's
  parameters and buffers, each optimizer state array and step count (as an array), BatchNorm's
  count of batches, the DQN's call counter and target network, and the position of nnkit's
  generator (Dropout draws its masks from it), so two runs compare bit for bit
  (``same_state``).

Building seeds nnkit's global generator (``nn.seed(seed)``), so build a model and then run it;
two models whose steps interleave share that generator. Each model is built in ``dtype``
(nnkit's default dtype is set only while building, then restored) and its batches' float
arrays are ``dtype`` too; labels, lengths and actions are int64.

Every model is small enough that 1,000 eager steps take about a second on a 2-core machine.
"""
import copy
import dataclasses
from typing import Any, Callable, List

import numpy as np

import nnkit as nn

KINDS = ("mlp", "lstm", "transformer", "bn_cnn", "dqn")


@dataclasses.dataclass
class Built:
    """One model of the zoo: ``step``, ``batches`` and ``state`` (see the module docstring),
    with the ``model`` and ``optimizer`` for tests that change them (a learning rate, a mode)."""
    kind: str
    dtype: np.dtype
    step: Callable
    batches: Callable[[int], List[tuple]]
    state: Callable[[], List[np.ndarray]]
    model: Any
    optimizer: Any
    between: Callable[[], None] = None      # run after each step, outside it (a DQN's sync)


def build(kind, dtype, seed=0, **options):
    """``build_<kind>(dtype, seed, **options)``."""
    if kind not in KINDS:
        raise ValueError(f"build: kind must be one of {KINDS}, got {kind!r}")
    return globals()[f"build_{kind}"](dtype, seed, **options)


def same_state(a, b):
    """Whether two ``state()`` lists are equal bit for bit: the same length, and each pair of
    arrays of one dtype, one shape and the same bytes (a zero's sign and a NaN's bits too)."""
    return len(a) == len(b) and all(
        x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
        for x, y in zip(a, b))


# ----------------------------------------------------------------------------- helpers

class _default_dtype:
    """nnkit's default dtype set to ``dtype`` inside the block (the layers' parameters take
    it), the previous one restored after."""

    def __init__(self, dtype):
        self.dtype = np.dtype(dtype)

    def __enter__(self):
        self.saved = nn.get_dtype()
        nn.set_dtype(self.dtype)

    def __exit__(self, *exc):
        nn.set_dtype(self.saved)


def generator_position():
    """nnkit's global generator's position (PCG64) as a uint64 array: the 128-bit state and
    increment in two words each, then the buffered 32-bit draw."""
    state = nn.get_rng_state()
    words = []
    for number in (state["state"]["state"], state["state"]["inc"]):
        words += [number & (2 ** 64 - 1), number >> 64]
    return np.array(words + [state["has_uint32"], state["uinteger"]], dtype=np.uint64)


def _optimizer_state(optimizer):
    """Each parameter's state, in the optimizer's order, its keys sorted: arrays copied,
    step counts as 0-d int64 arrays."""
    arrays = []
    for state in optimizer.state:
        for key in sorted(state):
            value = state[key]
            arrays.append(np.array(value, dtype=np.int64) if isinstance(value, int)
                          else np.array(nn.backend.to_cpu(value), copy=True))
    return arrays


def _state(modules, optimizer, *extra):
    """The flat state: each module's ``state()`` (parameters, constants, buffers, by name),
    the optimizer's state, ``extra`` arrays, then nnkit's generator position."""
    arrays = [array for module in modules for array in module.state().values()]
    return (arrays + _optimizer_state(optimizer) + [np.array(x, copy=True) for x in extra]
            + [generator_position()])


def _trained(loss, optimizer):
    """The end of a step: back() and the optimizer's step; the loss node returned."""
    loss.back()
    optimizer.step()
    return loss


def _batches(seed, make):
    """``batches(n)``: ``make(rng)`` for batch i with ``rng = default_rng([seed, i])``."""
    def batches(n):
        return [make(np.random.default_rng([seed, i])) for i in range(n)]
    return batches


def _teacher(seed, *shape):
    """A fixed random matrix per seed, for labels a model can learn."""
    return np.random.default_rng([seed, 1_000_003]).standard_normal(shape)


# ----------------------------------------------------------------------------- the models

def build_mlp(dtype, seed=0):
    """A 2-layer MLP, 8 → 32 → 3 with ReLU, softmax cross-entropy on int labels, Adam.
    Inputs: x (16, 8) float, labels (16,) int64."""
    dtype = np.dtype(dtype)
    nn.seed(seed)
    with _default_dtype(dtype):
        model = nn.layers.Sequential(nn.layers.Linear(8, 32, seed=seed), nn.ReLU,
                                     nn.layers.Linear(32, 3, seed=seed + 1))
    optimizer = nn.Adam(model.vars, lr=0.01)
    teacher = _teacher(seed, 8, 3)

    def step(x, labels):
        return _trained(nn.SoftmaxCELoss(model(x), labels), optimizer)

    def make(rng):
        x = rng.standard_normal((16, 8))
        return x.astype(dtype), (x @ teacher).argmax(axis=1).astype(np.int64)

    return Built("mlp", dtype, step, _batches(seed, make),
                 lambda: _state([model], optimizer), model, optimizer)


class _LSTMClassifier(nn.Module):
    """A fused LSTM over ragged time-major sequences, classified from each sequence's final
    hidden state (at its own last step)."""

    def __init__(self, features, hidden, classes, seed):
        self.lstm = nn.layers.LSTM(features, hidden, seed=seed)
        self.head = nn.layers.Linear(hidden, classes, seed=seed + 1)

    def forward(self, x, lengths):
        return self.head(self.lstm(x, lengths).final)


def build_lstm(dtype, seed=0, patterns=None):
    """A ragged LSTM classifier, 3 features → 12 hidden → 2 classes, Adam. Inputs: x (8, 6, 3)
    float, time-major, zero past each length; lengths (6,) int64 in 2..8, different in each
    batch (the padded T is 8 in all); labels (6,) int64: whether the sequence's first feature
    sums above 0 over its valid steps."""
    dtype = np.dtype(dtype)
    T, B, F = 8, 6, 3
    nn.seed(seed)
    with _default_dtype(dtype):
        model = _LSTMClassifier(F, 12, 2, seed)
    optimizer = nn.Adam(model.vars, lr=0.01)

    def step(x, lengths, labels):
        return _trained(nn.SoftmaxCELoss(model(x, lengths), labels), optimizer)

    def make(rng):
        lengths = rng.integers(2, T + 1, B).astype(np.int64)
        if patterns:        # batches of a few lengths vectors (sequences sorted into buckets)
            lengths = np.asarray(patterns[rng.integers(len(patterns))], dtype=np.int64)
        x = rng.standard_normal((T, B, F)) * nn.sequence_mask(lengths, T)[:, :, None]
        labels = (x[:, :, 0].sum(axis=0) > 0).astype(np.int64)
        return x.astype(dtype), lengths, labels

    return Built("lstm", dtype, step, _batches(seed, make),
                 lambda: _state([model], optimizer), model, optimizer)


class _TransformerClassifier(nn.Module):
    """Token embedding plus sinusoidal positions, one pre-norm encoder layer with Dropout,
    masking the padded keys, mean-pooled over each sequence's valid steps, then a Linear."""

    def __init__(self, vocabulary, T, dim, heads, hidden, classes, dropout, seed):
        self.embedding = nn.layers.Embedding(vocabulary, dim, seed=seed)
        self.positions = nn.positional_encoding(T, dim)[:, None, :]   # (T, 1, dim), constant
        self.encoder = nn.layers.TransformerEncoderLayer(dim, heads, hidden, dropout=dropout,
                                                         seed=seed + 1)
        self.head = nn.layers.Linear(dim, classes, seed=seed + 2)

    def forward(self, tokens, lengths):
        x = self.embedding(tokens) + self.positions
        pooled = nn.layers.mean_over_time(self.encoder(x, lengths), lengths)
        return self.head(pooled)


def build_transformer(dtype, seed=0):
    """A tiny Transformer encoder classifier: vocabulary 6, dim 8, 2 heads, hidden 16, Dropout
    0.1 (masks from nnkit's generator), 2 classes, Adam. Inputs: tokens (10, 4) int64,
    time-major, 0 past each length; lengths (4,) int64 in 3..10, different in each batch (the
    padded keys are masked); labels (4,) int64: whether token 1 is more frequent than token 2
    in the valid steps."""
    dtype = np.dtype(dtype)
    T, B, V = 10, 4, 6
    nn.seed(seed)
    with _default_dtype(dtype):
        model = _TransformerClassifier(V, T, 8, 2, 16, 2, dropout=0.1, seed=seed)
    optimizer = nn.Adam(model.vars, lr=0.01)

    def step(tokens, lengths, labels):
        return _trained(nn.SoftmaxCELoss(model(tokens, lengths), labels), optimizer)

    def make(rng):
        lengths = rng.integers(3, T + 1, B).astype(np.int64)
        valid = nn.sequence_mask(lengths, T)
        tokens = np.where(valid, rng.integers(1, V, (T, B)), 0).astype(np.int64)
        labels = ((tokens == 1).sum(axis=0) > (tokens == 2).sum(axis=0)).astype(np.int64)
        return tokens, lengths, labels

    return Built("transformer", dtype, step, _batches(seed, make),
                 lambda: _state([model], optimizer), model, optimizer)


class _BatchNormCNN(nn.Module):
    """Conv 3×3 (1 → 4 channels) → BatchNorm → ReLU → 2×2 max pool → Linear to the classes."""

    def __init__(self, classes, seed):
        self.conv = nn.layers.Conv2D(1, 4, 3, padding=1, seed=seed)
        self.norm = nn.layers.BatchNorm(4)
        self.head = nn.layers.Linear(4 * 3 * 3, classes, seed=seed + 1)

    def forward(self, images):
        features = nn.MaxPool2D(nn.ReLU(self.norm(self.conv(images))), 2)
        return self.head(features.flatten())


def build_bn_cnn(dtype, seed=0):
    """A small conv net with BatchNorm in training (running statistics updated), a Linear head,
    cross-entropy, GD with momentum. Inputs: images (8, 1, 6, 6) float, labels (8,) int64."""
    dtype = np.dtype(dtype)
    nn.seed(seed)
    with _default_dtype(dtype):
        model = _BatchNormCNN(3, seed)
    optimizer = nn.GD(model.vars, lr=0.1, momentum=0.9)
    teacher = _teacher(seed, 36, 3)

    def step(images, labels):
        return _trained(nn.SoftmaxCELoss(model(images), labels), optimizer)

    def make(rng):
        images = rng.standard_normal((8, 1, 6, 6)) + 0.5      # off-centre: BatchNorm's stats move
        return (images.astype(dtype),
                (images.reshape(8, 36) @ teacher).argmax(axis=1).astype(np.int64))

    def state():
        stats = model.norm.stats
        return _state([model], optimizer, np.int64(stats.num_batches_tracked))

    return Built("bn_cnn", dtype, step, _batches(seed, make), state, model, optimizer)


def build_dqn(dtype, seed=0, sync_inside=True):
    """A DQN update: an online Q-network 4 → 16 → 2 and its target network (a deep copy),
    the TD target r + γ·(1 − end)·max_a' Q_target(s', a') computed under ``no_grad``, the
    Huber loss on Q(s, a) of the actions taken, Adam. The target is synced from the online
    network inside ``step``, at the end of every ``sync_every``-th call (5): ``step`` holds
    Python state, a call counter, which ``state()`` includes (with the target's weights).
    Inputs: states (16, 4) float, actions (16,) int64 in {0, 1}, rewards (16,) float,
    next_states (16, 4) float, ends (16,) float, 1 where the episode terminated."""
    dtype = np.dtype(dtype)
    B, gamma, sync_every = 16, 0.9, 5
    nn.seed(seed)
    with _default_dtype(dtype):
        q = nn.layers.Sequential(nn.layers.Linear(4, 16, seed=seed), nn.ReLU,
                                 nn.layers.Linear(16, 2, seed=seed + 1))
    target = copy.deepcopy(q)
    optimizer = nn.Adam(q.vars, lr=0.005)
    rows = np.arange(B)
    calls = [0]     # Python state held by step: how many updates ran (the sync's clock)

    def update(states, actions, rewards, next_states, ends):
        with nn.no_grad():      # the TD target is a constant
            best_next = target(next_states).max(axis=1)
            # in ops, not NumPy on the input arrays, so the arithmetic is part of the graph
            td_target = (best_next - best_next * ends) * gamma + rewards
        loss = nn.HuberLoss(q(states)[rows, actions], td_target)
        loss.back()
        optimizer.step()
        return loss

    def step(*inputs):
        loss = update(*inputs)
        sync()
        return loss

    def sync():
        calls[0] += 1
        if calls[0] % sync_every == 0:
            target.load_state(q.state())

    def make(rng):
        states = rng.standard_normal((B, 4))
        actions = rng.integers(0, 2, B).astype(np.int64)
        rewards = np.where(actions == (states[:, 0] > 0), 1.0, 0.0)
        next_states = states + 0.1 * rng.standard_normal((B, 4))
        ends = (rng.random(B) < 0.1).astype(np.float64)
        return (states.astype(dtype), actions, rewards.astype(dtype),
                next_states.astype(dtype), ends.astype(dtype))

    return Built("dqn", dtype, step if sync_inside else update, _batches(seed, make),
                 lambda: _state([q, target], optimizer, np.int64(calls[0])), q, optimizer,
                 None if sync_inside else sync)


if __name__ == "__main__":
    # python -m tests.replay.models: the CPU time of 1,000 eager steps of each model (set
    # OMP_NUM_THREADS=1 first: these models are far too small for several BLAS threads)
    import time
    for dtype in (np.float32, np.float64):
        for kind in KINDS:
            built = build(kind, dtype)
            inputs = built.batches(1000)
            start = time.process_time()
            for batch in inputs:
                built.step(*batch)
            print(f"{kind:12s} {np.dtype(dtype).name}: 1,000 eager steps in "
                  f"{time.process_time() - start:.2f} s of CPU")
