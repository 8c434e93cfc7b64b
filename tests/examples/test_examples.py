"""The examples run (so they never rot) and reach their stated results."""
import pathlib
import runpy
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_article_example_converges(capsys):
    runpy.run_path(str(ROOT / "examples" / "article.py"), run_name="__main__")
    out = capsys.readouterr().out
    final = [line for line in out.splitlines() if line.startswith("final loss:")]
    assert final and float(final[0].split(":")[1]) < 0.01


def test_digits_example_reaches_97_percent():
    pytest.importorskip("sklearn")
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "digits.py")],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("test accuracy: ")
    assert float(last.split(": ")[1]) >= 0.97
