"""W1 (per-op overhead of a chain of tiny ops) and W5 (a 20,000-step unrolled chain)."""
import statistics

import numpy as np

import nnkit as nn

from . import harness
from .harness import Replay, Row, check_close, check_replay, interleaved, optional_torch

KINDS = ("add", "mul", "tanh")


def run_chain(h, kinds, a, b, tanh):
    """The W1 chain on nodes of any framework (NumPy's needs its own backward, below)."""
    for kind in kinds:
        if kind == "add":
            h = h + a
        elif kind == "mul":
            h = h * b
        else:
            h = tanh(h)
    return h


def run_unrolled(h, W, b, tanh, steps):
    """W5's h ← tanh(h·W + b), ``steps`` times, on nodes of any framework."""
    for _ in range(steps):
        h = tanh(h @ W + b)
    return h


def tiny_chain(rounds, ops=1000, number=20):
    """W1: x + a, · b, tanh repeated on shape (4,), forward + backward; µs per op; then the same
    step captured with ``nn.capture`` and replayed, timed against NumPy's again.

    a and b are parameters shared by every step, so each backward step also adds into their
    gradients (as the weights of a network do).
    """
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((1, 4)).astype(np.float32)     # a (1, 4) row, as nnkit stores (4,)
    a0 = np.full((1, 4), 0.1, np.float32)
    b0 = np.full((1, 4), 0.9, np.float32)
    kinds = [KINDS[i % 3] for i in range(ops)]
    x, a, b = nn.NetVar(x0), nn.NetVar(a0), nn.NetVar(b0)

    def nnkit_step():
        x.reset()
        a.reset()
        b.reset()
        run_chain(x, kinds, a, b, nn.Tanh).back()
        return [x.g, a.g, b.g]

    def numpy_step():
        h, saved = x0, []
        for kind in kinds:
            if kind == "add":
                h = h + a0
            elif kind == "mul":
                saved.append(h)
                h = h * b0
            else:
                h = np.tanh(h)
                saved.append(h)
        g, ga, gb = np.ones_like(h), np.zeros_like(a0), np.zeros_like(b0)
        for kind in reversed(kinds):
            if kind == "add":
                ga += g
            elif kind == "mul":
                gb += g * saved.pop()
                g = g * b0
            else:
                y = saved.pop()
                g = g * (1 - y * y)
        return [g, ga, gb]

    contenders = {"nnkit": nnkit_step, "numpy": numpy_step}
    reference = numpy_step()
    check_close("W1", nnkit_step(), reference)
    torch = optional_torch()
    if torch is not None:
        xt, at, bt = (torch.tensor(v, requires_grad=True) for v in (x0, a0, b0))

        def torch_step():
            xt.grad = at.grad = bt.grad = None
            h = run_chain(xt, kinds, at, bt, torch.tanh)
            h.backward(torch.ones_like(h))
            return [xt.grad, at.grad, bt.grad]

        check_close("W1 (PyTorch)", [v.numpy() for v in torch_step()], reference)
        contenders["torch"] = torch_step
    times = interleaved(contenders, rounds, number)
    eager = Row("W1 chain of 1,000 tiny ops, fwd+bwd", "µs/op", 1e6 / ops, times, target=2.1)
    replay, ones = captured_chain(kinds, x0, a0, b0, [g.copy() for g in nnkit_step()])
    times = replay.measure(lambda: replay(ones), {"numpy": numpy_step}, rounds, number)
    return [eager, replay.row("W1 the same, captured (nn.capture) and replayed", "µs/op",
                              1e6 / ops, times, target=1.2)]


def captured_chain(kinds, x0, a0, b0, eager_gradients):
    """W1's step captured, on nodes of its own, returning the chain's output. Its input is the gradient ``back``
    starts from (ones, as ``back()``'s): the chain forgets its start, so recording with twice
    that seed is what makes a replay that left the recording's values in place differ from
    eager (``eager_gradients``: x, a and b's)."""
    x, a, b = nn.NetVar(x0), nn.NetVar(a0), nn.NetVar(b0)

    def chain_step(seed):
        x.reset()
        a.reset()
        b.reset()
        h = run_chain(x, kinds, a, b, nn.Tanh)
        h.back(seed)
        return h

    ones = np.ones_like(x0)

    def check(step):
        step(2 * ones)                      # records
        step(ones)                          # records again: the gradients now exist
        step(ones)                          # replays (checked against eager by capture too)
        note = check_replay("W1", ["x.g", "a.g", "b.g"], [x.g, a.g, b.g], eager_gradients)
        return note
    return Replay(chain_step, check), ones


def tiny_chain_plain(rounds, ops=1000, number=20):
    """W1 with plain operands, two rows: x + A (a NumPy array), then · 0.9 (a Python number) or
    · B (a NumPy array), tanh; µs per op.

    Only x needs a gradient. The constants are what a user writes inline (``h * 0.9``,
    ``h + mask``): nnkit must make them cost no more than node operands. A Python number is
    converted at every operation, by the hand-written NumPy too (which slows both sides); the
    second row, with an array on both operators, shows nnkit's own cost of a plain operand.
    """
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((1, 4)).astype(np.float32)
    a0 = np.full((1, 4), 0.1, np.float32)
    kinds = [KINDS[i % 3] for i in range(ops)]
    rows = []
    for b, label in ((0.9, "a NumPy array and a Python number"),
                     (np.full((1, 4), 0.9, np.float32), "NumPy arrays on + and ×")):
        times = _plain_chain_times(rounds, number, kinds, x0, a0, b)
        rows.append(Row(f"W1 the same with {label} as operands", "µs/op", 1e6 / ops, times,
                        target=2.3))
    return rows


def _plain_chain_times(rounds, number, kinds, x0, a0, b):
    """Interleaved times of W1's chain with the plain operands a0 (on +) and b (on ×)."""
    x = nn.NetVar(x0)

    def nnkit_step():
        x.reset()
        run_chain(x, kinds, a0, b, nn.Tanh).back()
        return [x.g]

    def numpy_step():
        return chain_by_hand(kinds, x0, a0, b)

    contenders = {"nnkit": nnkit_step, "numpy": numpy_step}
    reference = numpy_step()
    check_close("W1 plain operands", nnkit_step(), reference)
    torch = optional_torch()
    if torch is not None:
        xt, at = torch.tensor(x0, requires_grad=True), torch.tensor(a0)
        bt = torch.tensor(b) if isinstance(b, np.ndarray) else b

        def torch_step():
            xt.grad = None
            h = run_chain(xt, kinds, at, bt, torch.tanh)
            h.backward(torch.ones_like(h))
            return [xt.grad]

        check_close("W1 plain operands (PyTorch)", [v.numpy() for v in torch_step()], reference)
        contenders["torch"] = torch_step
    return interleaved(contenders, rounds, number)


def chain_by_hand(kinds, x0, a0, b, xp=np):
    """W1's chain with plain operands by hand, forward then backward: [dx] (on CuPy arrays with
    ``xp=cupy``, for W7)."""
    h, saved = x0, []
    for kind in kinds:
        if kind == "add":
            h = h + a0
        elif kind == "mul":
            h = h * b
        else:
            h = xp.tanh(h)
            saved.append(h)
    g = xp.ones_like(h)
    for kind in reversed(kinds):
        if kind == "mul":
            g = g * b
        elif kind == "tanh":
            y = saved.pop()
            g = g * (1 - y * y)
    return [g]


def _unrolled(batch, hidden, seed=0):
    """Parameters of h ← tanh(h·W + b) and the three ways to run it for ``steps`` steps."""
    rng = np.random.default_rng(seed)
    h0 = rng.standard_normal((batch, hidden)).astype(np.float32)
    W0 = (rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)
    b0 = (0.1 * rng.standard_normal((1, hidden))).astype(np.float32)
    W, b = nn.NetVar(W0), nn.NetVar(b0)
    h_in = nn.NetVar(h0, requires_grad=False)

    def nnkit_forward(steps):
        return [run_unrolled(h_in, W, b, nn.Tanh, steps)]

    def nnkit_backward(holder):
        W.reset()
        b.reset()
        holder.pop().back()          # the graph is freed here, when its root is dropped
        return [W.g, b.g]

    def numpy_forward(steps):
        hs = [h0]
        for _ in range(steps):
            z = hs[-1] @ W0
            z += b0
            hs.append(np.tanh(z, out=z))
        return [hs]

    def numpy_backward(holder):
        hs = holder.pop()
        dW, db = np.zeros_like(W0), np.zeros_like(b0)
        g = np.ones_like(h0)
        for t in range(len(hs) - 1, 0, -1):
            y = hs[t]
            gz = g * (1 - y * y)
            dW += hs[t - 1].T @ gz
            db += gz.sum(axis=0, keepdims=True)
            g = gz @ W0.T
        return [dW, db]

    runs = {"nnkit": (nnkit_forward, nnkit_backward), "numpy": (numpy_forward, numpy_backward)}
    torch = optional_torch()
    if torch is not None:
        Wt = torch.tensor(W0, requires_grad=True)
        bt = torch.tensor(b0, requires_grad=True)
        ht = torch.tensor(h0)

        def torch_forward(steps):
            return [run_unrolled(ht, Wt, bt, torch.tanh, steps)]

        def torch_backward(holder):
            Wt.grad = bt.grad = None
            h = holder.pop()
            h.backward(torch.ones_like(h))
            return [Wt.grad.numpy(), bt.grad.numpy()]

        runs["torch"] = (torch_forward, torch_backward)
    return runs


def long_chain(rounds, steps=(5000, 20000), batch=4, hidden=16):
    """W5: forward and backward seconds of an unrolled tanh chain, and their growth in steps."""
    runs = _unrolled(batch, hidden)
    reference = runs["numpy"][1](runs["numpy"][0](50))
    for name, (forward, backward) in runs.items():
        check_close(f"W5 ({name})", backward(forward(50)), reference, rtol=1e-3)
    times = {n: {name: ([], []) for name in runs} for n in steps}
    for round_number in range(rounds):
        order = list(runs.items())
        for n in steps:
            for name, (forward, backward) in (order if round_number % 2 == 0 else order[::-1]):
                start = harness.clock()
                holder = forward(n)
                middle = harness.clock()
                backward(holder)
                end = harness.clock()
                times[n][name][0].append(middle - start)
                times[n][name][1].append(end - middle)
    small, large = steps
    rows = []
    for phase, label in ((0, "forward"), (1, "backward")):
        per_name = {name: times[large][name][phase] for name in runs}
        row = Row(f"W5 {large:,}-step chain, {label}", "s", 1.0, per_name)
        if "torch" in runs and label == "backward":
            faster = row.values["nnkit"] < row.values["torch"]
            row.target, row.met = "< PyTorch", faster
        rows.append(row)
    growth = {name: [b / a / (large / small) for a, b in zip(times[small][name][1],
                                                              times[large][name][1])]
              for name in runs}
    row = Row(f"W5 backward time per step, {large:,} / {small:,} steps", "ratio", 1.0, growth,
              target="<= 1.25 (linear)", met=statistics.median(growth["nnkit"]) <= 1.25)
    row.ratio = row.torch_ratio = None
    rows.append(row)
    return rows
