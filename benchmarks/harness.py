"""Timing helpers: interleaved rounds, medians of per-round ratios, and the printed table."""
import statistics
import time

import numpy as np


CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
clock = time.process_time


def use_clock(name):
    """Time with ``"cpu"`` (this process's CPU time, the default) or ``"wall"`` time.

    CPU time leaves out the time other processes hold the cores, which on a shared 2-core
    machine swings wall times several-fold; with one BLAS thread the two agree when idle.
    """
    global clock
    clock = CLOCKS[name]


def seconds_per_call(function, number):
    """Mean time of ``function()`` over ``number`` calls (garbage collector left on, as a
    user runs it)."""
    start = clock()
    for _ in range(number):
        function()
    return (clock() - start) / number


def interleaved(contenders, rounds, number):
    """Time each callable of ``contenders`` (name -> function) once per round, in turns.

    The order alternates between rounds so that a slow drift of the machine (other processes,
    clock boost) weighs on every contender alike. Returns name -> list of seconds per call.
    """
    for function in contenders.values():
        function()                                    # warm caches and lazy state
    times = {name: [] for name in contenders}
    items = list(contenders.items())
    for round_number in range(rounds):
        for name, function in (items if round_number % 2 == 0 else items[::-1]):
            times[name].append(seconds_per_call(function, number))
    return times


def median_ratio(numerator, denominator):
    """The median over rounds of numerator[r] / denominator[r]."""
    return statistics.median(a / b for a, b in zip(numerator, denominator))


class Row:
    """One line of the table: medians of nnkit, NumPy and PyTorch, ratios and the target."""

    def __init__(self, workload, unit, scale, times, target=None, met=None, note=""):
        self.workload, self.unit, self.target, self.note = workload, unit, target, note
        self.values = {name: statistics.median(t) * scale for name, t in times.items()}
        self.ratio = self.torch_ratio = None
        if "numpy" in times:
            self.ratio = median_ratio(times["nnkit"], times["numpy"])
            if "torch" in times:
                self.torch_ratio = median_ratio(times["torch"], times["numpy"])
        if met is None and isinstance(target, float) and self.ratio is not None:
            met = self.ratio <= target
        self.met = met


def check_close(name, ours, theirs, rtol=1e-4, atol=1e-6):
    """Raise unless every pair of gradient arrays agrees (the benchmarks compare equal work)."""
    from nnkit.backend import to_cpu          # GPU rows compare device arrays on the host
    for position, (a, b) in enumerate(zip(ours, theirs)):
        a = np.asarray(to_cpu(a), dtype=np.float64)
        b = np.asarray(to_cpu(b), dtype=np.float64)
        if a.shape != b.shape or not np.allclose(a, b, rtol=rtol, atol=atol):
            worst = np.abs(a - b).max() if a.shape == b.shape else f"shape {a.shape} vs {b.shape}"
            raise AssertionError(f"{name}: gradient {position} differs from the baseline "
                                 f"(max |difference| {worst})")


def _number(value):
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}" if value < 1 else f"{value:.2f}"


def table(rows):
    """The results as a Markdown table (readable in a terminal and pasteable in the README)."""
    lines = ["| workload | unit | nnkit | NumPy | PyTorch | nnkit / NumPy | PyTorch / NumPy "
             "| target | met |",
             "|---|---|---:|---:|---:|---:|---:|---|---|"]
    for row in rows:
        ratio = "-" if row.ratio is None else f"{row.ratio:.2f}x"
        torch_ratio = "-" if row.torch_ratio is None else f"{row.torch_ratio:.2f}x"
        target = row.target if isinstance(row.target, str) else (
            "-" if row.target is None else f"<= {row.target:.2f}x")
        met = {True: "yes", False: "NO", None: "-"}[row.met]
        lines.append(f"| {row.workload} | {row.unit} | {_number(row.values.get('nnkit'))} | "
                     f"{_number(row.values.get('numpy'))} | {_number(row.values.get('torch'))} | "
                     f"{ratio} | {torch_ratio} | {target} | {met} |")
    return "\n".join(lines)


def optional_torch():
    """PyTorch when it is installed (the PyTorch columns), else None; never a dependency."""
    try:
        import torch
    except ImportError:
        return None
    return torch
