"""nnkit's benchmark suite: each workload timed against hand-written NumPy (and PyTorch).

Run it from the repository root with ``python -m benchmarks`` (``--help`` for options). Every
workload runs interleaved with its baselines in one process over several rounds; the table
reports median times and the median of the per-round ratios, which stay meaningful on a
loaded machine. Gradients are checked equal to the baselines' before anything is timed.
"""
