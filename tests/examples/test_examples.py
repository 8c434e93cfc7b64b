"""The examples run (so they never rot) and reach their stated results."""
import runpy

import pytest

from tests.examples.helpers import ROOT, reported_accuracy


def test_article_example_converges(capsys):
    runpy.run_path(str(ROOT / "examples" / "article.py"), run_name="__main__")
    out = capsys.readouterr().out
    final = [line for line in out.splitlines() if line.startswith("final loss:")]
    assert final and float(final[0].split(":")[1]) < 0.01


def test_digits_example_reaches_97_percent():
    pytest.importorskip("sklearn")
    assert reported_accuracy("digits.py") >= 0.97
