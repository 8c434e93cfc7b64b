"""Run the benchmark suite and print its table.

    python -m benchmarks [--rounds N] [--only W1,W3] [--threads T]
"""
import argparse
import os
import platform
import sys
import time


def _threads(argv):
    """The BLAS thread count, read before NumPy is imported (the BLAS fixes it at load time).

    One thread by default: on a small machine shared with other work, several BLAS threads
    spin against each other and the timings of small products swing tenfold.
    """
    for position, arg in enumerate(argv):
        if arg.startswith("--threads="):
            return arg.split("=", 1)[1]
        if arg == "--threads" and position + 1 < len(argv):
            return argv[position + 1]
    return "1"


THREADS = _threads(sys.argv[1:])
for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(variable, THREADS)

if __package__ in (None, ""):          # `python benchmarks/run.py` from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    __package__ = "benchmarks"

import numpy as np  # noqa: E402

from benchmarks import attention, chain, distributed, gpu, mlp, rnn, transformer  # noqa: E402
from benchmarks.harness import optional_torch, table, use_clock  # noqa: E402

WORKLOADS = {
    "W1": lambda rounds: chain.tiny_chain(rounds) + chain.tiny_chain_plain(rounds),
    "W2": lambda rounds: mlp.digits_epoch(rounds),
    "W3": lambda rounds: mlp.big_mlp_step(rounds),
    "W4": lambda rounds: rnn.rnn_rows(rounds),
    "W5": lambda rounds: chain.long_chain(max(3, rounds // 2)),
    "W6": lambda rounds: mlp.big_mlp_memory(),
    "W7": lambda rounds: gpu.gpu_rows(rounds),
    "W8": lambda rounds: attention.attention_rows(rounds),
    "W9": lambda rounds: distributed.distributed_rows(rounds),
    "W10": lambda rounds: transformer.transformer_rows(rounds),
    "W11": lambda rounds: mlp.small_mlp_step(rounds),
}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--rounds", type=int, default=9,
                        help="interleaved rounds per workload (medians are taken over them)")
    parser.add_argument("--only", default="", help="comma-separated workloads, e.g. W1,W3")
    parser.add_argument("--threads", type=int, default=int(THREADS),
                        help="BLAS and PyTorch threads (default 1)")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="process CPU time (default; robust on a shared machine) or wall time")
    args = parser.parse_args(argv)
    chosen = [w.strip().upper() for w in args.only.split(",") if w.strip()] or list(WORKLOADS)
    unknown = [w for w in chosen if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    use_clock(args.clock)
    torch = optional_torch()
    if torch is not None:
        torch.set_num_threads(args.threads)
    print(f"Python {platform.python_version()}, NumPy {np.__version__}, "
          f"PyTorch {torch.__version__ if torch else 'not installed'}, "
          f"{os.cpu_count()} CPUs, {args.threads} BLAS thread(s), "
          f"{args.clock} time, {args.rounds} rounds")
    rows = []
    for name in chosen:
        start = time.perf_counter()
        new = WORKLOADS[name](args.rounds)
        rows += new
        print(f"  {name}: {len(new)} row(s) in {time.perf_counter() - start:.1f} s", flush=True)
    print()
    print(table(rows))
    for row in rows:
        if row.note:
            print(f"{row.workload}: {row.note}")
    return rows


if __name__ == "__main__":          # `python benchmarks/run.py`, as the performance page says
    main()
