"""The prepared GPU run (tests/gpu/run.sh) and the GPU benchmark rows stay runnable between the
rare sessions with a GPU: the script parses, every path it names exists, and the W7 rows that
need no CuPy of their own run here with NumPy standing in for CuPy."""
import pathlib
import re
import shutil
import subprocess

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "gpu" / "run.sh"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_gpu_run_script_parses():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_every_path_the_gpu_run_names_exists():
    text = SCRIPT.read_text(encoding="utf-8")
    paths = set(re.findall(r"tests/[\w/.*-]+", text)) - {"tests/gpu/run.sh"}
    assert len(paths) >= 10, paths
    for path in sorted(paths):
        matches = list(ROOT.glob(path)) if "*" in path else [ROOT / path]
        assert matches and all(m.exists() for m in matches), f"run.sh names {path}: not found"
    assert "--only W7" in text


def test_the_w7_chain_and_attention_rows_run_with_numpy_standing_in_for_cupy():
    from benchmarks import gpu, harness
    saved = harness.clock
    harness.use_clock("wall")
    try:
        rows = gpu._chain_row(np, None, 1, lambda: None, ops=30) + \
            gpu._attention_row(np, None, 1, lambda: None)
    finally:
        harness.clock = saved
    assert [row.workload.split(":")[1].split()[0] for row in rows] == ["W1", "W8"]
    assert all(row.ratio is not None and row.ratio > 0 for row in rows)


def test_a_w7_row_whose_baseline_computes_otherwise_is_refused(monkeypatch):
    """The rows compare nnkit's gradients with the hand-written ones before timing anything:
    a baseline off by a factor stops the row instead of timing other work."""
    from benchmarks import chain, gpu
    right = chain.chain_by_hand
    monkeypatch.setattr(chain, "chain_by_hand", lambda *args: [2 * g for g in right(*args)])
    with pytest.raises(AssertionError, match="W7 GPU: W1"):
        gpu._chain_row(np, None, 1, lambda: None, ops=30)
