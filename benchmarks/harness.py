"""Timing helpers: interleaved rounds, medians of per-round ratios, and the printed table."""
import gc
import statistics
import time
import warnings

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


class Replay:
    """``nn.capture(fn)`` as a contender, checked against eager before it is timed.

    Made after the eager rows of its workload are timed, and released once it is timed: a
    capture holds its buffers, and a process holding them gave W10's eager step up to 1.5x its
    time (glibc's malloc handed the step fresh pages more often).

    ``check(step)`` calls the captured step beside the eager step, so that it records and then
    replays, and raises (``check_replay``) unless the replay gives eager's values: a broken
    capture fails loudly instead of timing something else. What nn.capture raised (then the row
    is left empty) or warned, a step it runs eagerly say, goes into the row's note rather than
    stopping the other rows.
    """

    def __init__(self, fn, check):
        import nnkit as nn
        self.step, notes = None, []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                step = nn.capture(fn)
                notes.append(check(step) or "")
                self.step = step
            except AssertionError:
                raise
            except Exception as error:
                notes.append(f"nn.capture raised {type(error).__name__}: {error}")
        notes += [f"nn.capture warned: {w.message}" for w in caught if "capture" in str(w.message)]
        if self.step is not None and self.step.replays == 0:
            notes.append(f"the checked calls never replayed ({self.step.records} recordings)")
        self.note = "; ".join(note for note in notes if note)
        self.failed = self.step is None
        self.timed = None           # (replays, recordings) of the timed calls

    def __call__(self, *inputs):
        return self.step(*inputs)

    def measure(self, call, baselines, rounds, number):
        """Times of ``call`` (a call of the captured step) as ``"replayed"``, interleaved with
        ``baselines`` (name -> function), or None when the capture failed; then the capture is
        released."""
        if self.failed:
            return None
        records, replays = self.step.records, self.step.replays
        times = interleaved({"replayed": call, **baselines}, rounds, number)
        self.timed = (self.step.replays - replays, self.step.records - records)
        self.step = None
        gc.collect()                # the capture's buffers go before the next workload runs
        return times

    def columns(self, times, baseline="numpy"):
        """The replay row's times: the ``"replayed"`` contender of ``times`` as nnkit's column,
        ``baseline`` (a name in ``times``) as NumPy's, PyTorch's as it is."""
        columns = {"nnkit": times["replayed"], "numpy": times[baseline]}
        if "torch" in times:
            columns["torch"] = times["torch"]
        return columns

    def annotate(self, row):
        """Add to ``row``'s note the replays and recordings of the timed calls: a recording
        there means what was timed was not only replays, and the row is not met."""
        replays, records = self.timed
        row.note = "; ".join(n for n in (self.note, row.note, f"timed calls: {replays} "
                                         f"replays, {records} recordings") if n)
        if (records or not replays) and row.target not in (None, "-"):
            row.met = False
        return row

    def row(self, workload, unit, scale, times, target=None, baseline="numpy"):
        """The row of ``measure``'s ``times`` (``columns``), or an empty one saying why there
        are none."""
        if self.failed:
            return Row(workload, unit, scale, {}, target=target, met=False, note=self.note)
        return self.annotate(Row(workload, unit, scale, self.columns(times, baseline),
                                 target=target))


def check_replay(name, labels, replayed, eager):
    """Raise unless each of the replay's arrays agrees with eager's (as ``check_close``, tightly:
    rtol 1e-5); ``labels`` name them in the message. Arrays that agree without being the same
    bits (capture promises the same bits) are named in the returned note."""
    inexact = []
    for label, ours, theirs in zip(labels, replayed, eager):
        a, b = (np.asarray(v, dtype=np.float64) for v in (ours, theirs))
        if a.shape != b.shape or not np.allclose(a, b, rtol=1e-5, atol=1e-7):
            worst = np.abs(a - b).max() if a.shape == b.shape else f"shape {a.shape} vs {b.shape}"
            raise AssertionError(f"{name}: the replay's {label} differs from eager's "
                                 f"(max |difference| {worst})")
        if not np.array_equal(a, b):
            inexact.append(label)
    if not inexact:
        return ""
    return f"the replay is close to eager but not bit-identical in {', '.join(inexact[:3])}" + (
        f" and {len(inexact) - 3} more" if len(inexact) > 3 else "")


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
