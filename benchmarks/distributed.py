"""W9: the W3 step data-parallel over MPI, on 1 and 2 processes (weak scaling).

Each process trains the W3 MLP (784-1024-1024-10, Adam, float32) on its own batch of 256 rows,
so 2 processes do twice the work of 1 in the same step time when scaling is perfect. nnkit's
step is the hand-written loop of ``nnkit.distributed``: ``back()``, ``allreduce_grads(params,
weight=256)`` (a small all-reduce of the weights, the 6 gradients scaled into one buffer, one
MPI all-reduce of it; the gradients become views of it), Adam. The NumPy baseline computes its
gradients straight into one flat buffer (no packing), all-reduces it in place and scales it. Each configuration runs in its own ``mpiexec`` launch (1, 2, 2, 1 processes, so
that a drift of the machine weighs on both), each round after a barrier. Every time is taken
with both clocks: the table uses the suite's ``--clock`` (process CPU time by default, which
leaves out the time other programs hold the cores; MPI's busy waiting for the other rank still
counts) and the note gives both. The all-reduce is also timed inside the step (communication
plus waiting for the other rank) and alone. The rows need mpi4py and an mpiexec
(``pip install nnkit[mpi]``) and are skipped with a printed reason otherwise.

    python -m benchmarks --only W9                # the table rows
    mpiexec -n 2 python -m benchmarks.distributed --worker --rounds 9 --number 3   # raw JSON
"""
import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
GRADIENT_MB = (784 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10) * 4 / 1e6


def _mpiexec():
    beside = pathlib.Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.is_file() else shutil.which("mpiexec")


# ----------------------------------------------------------------------------- in each process

def worker(rounds, number):
    """Time the steps on this process (one of ``size()``); rank 0 prints one JSON line."""
    import numpy as np
    from mpi4py import MPI

    import nnkit.distributed as dist

    from . import mlp
    from .harness import check_close

    comm, rank, size = MPI.COMM_WORLD, dist.rank(), dist.size()
    layers, _, _ = mlp.big_mlp_data()
    _, x, y = mlp.big_mlp_data(seed=1 + rank)          # each rank its own batch of 256

    ours = mlp.NnkitMLP(layers)
    baseline = mlp.NumpyMLP(layers)
    flat = np.empty(sum(p.size for p in baseline.params), np.float32)
    offsets = np.cumsum([0] + [p.size for p in baseline.params])
    baseline.grads = [flat[a:b].reshape(p.shape)                # gradients written in place
                      for a, b, p in zip(offsets, offsets[1:], baseline.params)]
    spent = {"nnkit": np.zeros(2), "numpy": np.zeros(2)}      # (wall, cpu) seconds

    def now():
        return np.array([time.perf_counter(), time.process_time()])

    def reduce_ours():
        start = now()
        dist.allreduce_grads(ours.params, weight=len(x))
        spent["nnkit"] += now() - start

    def reduce_baseline():
        start = now()
        if size > 1:
            comm.Allreduce(MPI.IN_PLACE, flat)
            np.multiply(flat, 1 / size, out=flat)
        spent["numpy"] += now() - start

    def nnkit_step():
        ours.loss(x, y).back()
        reduce_ours()
        ours.optimizer.step()

    def numpy_step():
        baseline.gradients(x, y)
        reduce_baseline()
        baseline.t += 1
        for p, g, m, v in zip(baseline.params, baseline.grads, baseline.m, baseline.v):
            mlp.adam_numpy(p, g, m, v, baseline.t)

    ours.loss(x, y).back()                     # the same averaged gradients before any timing
    reduce_ours()
    baseline.gradients(x, y)
    reduce_baseline()
    check_close("W9", [p.g.reshape(-1) for p in ours.params],
                [g.reshape(-1) for g in baseline.grads])
    for p in ours.params:
        p.reset()

    def timed(function, count):
        """Seconds per call, [wall, cpu]."""
        comm.Barrier()
        start = now()
        for _ in range(count):
            function()
        return ((now() - start) / count).tolist()

    steps = {"nnkit": nnkit_step, "numpy": numpy_step}
    for function in steps.values():
        function()                                            # warm up
    times = {name: [] for name in steps}
    inside = {name: [] for name in steps}
    for round_number in range(rounds):
        for name in (steps if round_number % 2 == 0 else list(steps)[::-1]):
            spent[name][:] = 0
            times[name].append(timed(steps[name], number))
            inside[name].append((spent[name] / number).tolist())

    ours.loss(x, y).back()
    alone = [timed(lambda: dist.allreduce_grads(ours.params, weight=len(x)), number)
             for _ in range(rounds)]
    mpi_only = [timed(lambda: comm.Allreduce(MPI.IN_PLACE, flat), number) for _ in range(rounds)]
    hook = dist.DataParallel()
    agreements = [timed(lambda: (hook.agree(False, True, False), hook.agree(False)), 200)
                  for _ in range(rounds)]
    if rank == 0:
        print("W9-RESULT " + json.dumps({
            "size": size, "step": times, "allreduce_in_step": inside,
            "allreduce_grads_alone": alone, "mpi_allreduce_alone": mpi_only,
            "agreements": agreements}), flush=True)


# ----------------------------------------------------------------------------- the table rows

def _launch(processes, rounds, number):
    command = [_mpiexec(), "-n", str(processes)]
    version = subprocess.run([command[0], "--version"], capture_output=True, text=True).stdout
    if "Open MPI" in version and os.getuid() == 0:
        command.append("--allow-run-as-root")
    command += [sys.executable, "-m", "benchmarks.distributed", "--worker",
                "--rounds", str(rounds), "--number", str(number)]
    environment = dict(os.environ, PYTHONPATH=str(ROOT))
    for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        environment.setdefault(variable, "1")          # (run.py's --threads sets them)
    result = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True,
                            timeout=600)
    lines = [line for line in result.stdout.splitlines() if line.startswith("W9-RESULT ")]
    if result.returncode != 0 or not lines:
        raise RuntimeError(f"W9: mpiexec -n {processes} failed:\n{result.stderr[-2000:]}")
    return json.loads(lines[0][len("W9-RESULT "):])


def _merge(runs, key, clock):
    """name -> seconds over every round of ``runs`` on ``clock`` (0 wall, 1 cpu)."""
    if isinstance(runs[0][key], list):
        return [t[clock] for run in runs for t in run[key]]
    return {name: [t[clock] for run in runs for t in run[key][name]] for name in runs[0][key]}


def _summary(runs, clock):
    """The medians the rows and notes need, on one clock."""
    median = statistics.median
    one, two = _merge(runs[1], "step", clock), _merge(runs[2], "step", clock)
    inside = _merge(runs[2], "allreduce_in_step", clock)
    efficiency = {name: [median(one[name]) / t for t in two[name]] for name in one}
    return {"one": one, "two": two, "inside": inside, "efficiency": efficiency,
            "eff": median(efficiency["nnkit"]), "eff_numpy": median(efficiency["numpy"]),
            "step": median(one["nnkit"]), "step2": median(two["nnkit"]),
            "share": median(inside["nnkit"]) / median(two["nnkit"]),
            "in_step": median(inside["nnkit"]),
            "alone": median(_merge(runs[2], "allreduce_grads_alone", clock)),
            "mpi": median(_merge(runs[2], "mpi_allreduce_alone", clock)),
            "agreements": median(_merge(runs[2], "agreements", clock))}


def estimate(nodes, gigabits, megabytes=GRADIENT_MB, latency=20e-6):
    """Seconds a ring all-reduce of ``megabytes`` takes on ``nodes`` nodes linked at
    ``gigabits`` Gb/s: each node sends and receives 2·(p − 1)/p of the data, in 2·(p − 1)
    steps of ``latency`` each."""
    return 2 * (nodes - 1) / nodes * megabytes * 1e6 * 8 / (gigabits * 1e9) \
        + 2 * (nodes - 1) * latency


def distributed_rows(rounds, number=3):
    """The W9 rows, or a printed reason for skipping them."""
    from .harness import Row
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        print("W9 skipped: mpi4py is not installed (pip install nnkit[mpi])")
        return []
    if _mpiexec() is None:
        print("W9 skipped: no mpiexec beside Python or on PATH")
        return []
    runs = {1: [], 2: []}
    for processes in (1, 2, 2, 1):
        runs[processes].append(_launch(processes, max(2, rounds // 2 + 1), number))
    from . import harness
    chosen = 1 if harness.clock is time.process_time else 0
    summaries = [_summary(runs, clock) for clock in (0, 1)]
    shown = summaries[chosen]
    notes = []
    for name, m in zip(("wall-clock", "CPU"), summaries):
        cost = {g: estimate(16, g) + (m["alone"] - m["mpi"]) for g in (10, 100)}
        notes.append(
            f"{name} time: efficiency {m['eff']:.0%} (NumPy's {m['eff_numpy']:.0%}; 1 process "
            f"{m['step'] * 1e3:.1f} ms, 2 processes {m['step2'] * 1e3:.1f} ms); all-reduce "
            f"{m['share']:.0%} of the 2-process step ({m['in_step'] * 1e3:.2f} ms with "
            f"waiting; alone {m['alone'] * 1e3:.2f} ms, of which MPI {m['mpi'] * 1e3:.2f} ms "
            f"for {GRADIENT_MB:.2f} MB, packing and scaling {(m['alone'] - m['mpi']) * 1e3:.2f} "
            f"ms); the Trainer's two small agreements {m['agreements'] * 1e6:.0f} µs per step; "
            f"16 nodes (ring: 2·15/16·{GRADIENT_MB:.2f} MB per node, 20 µs per message, plus "
            f"packing): {cost[10] * 1e3:.1f} ms at 10 Gb/s ({cost[10] / (m['step'] + cost[10]):.0%}"
            f" of a step), {cost[100] * 1e3:.1f} ms at 100 Gb/s "
            f"({cost[100] / (m['step'] + cost[100]):.0%})")
    return [
        Row("W9 W3 step data-parallel, 1 process", "ms", 1e3, shown["one"]),
        Row("W9 W3 step data-parallel, 2 processes, batch 256 each", "ms", 1e3, shown["two"]),
        Row("W9 all-reduce inside the 2-process step (incl. waiting)", "ms", 1e3,
            shown["inside"]),
        Row("W9 weak-scaling efficiency, 2 processes vs 1", "%", 100, shown["efficiency"],
            target=">= 80 %", met=shown["eff"] >= 0.8, note=" | ".join(notes)),
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m benchmarks.distributed")
    parser.add_argument("--worker", action="store_true", help="time this process (under mpiexec)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--number", type=int, default=3)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    arguments = parser.parse_args()
    if arguments.worker:
        worker(arguments.rounds, arguments.number)
    else:
        from .harness import table, use_clock
        use_clock(arguments.clock)
        rows = distributed_rows(arguments.rounds, arguments.number)
        print(table(rows))
        for row in rows:
            if row.note:
                print(f"{row.workload}: {row.note}")
