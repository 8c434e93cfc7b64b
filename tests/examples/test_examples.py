"""The examples run (so they never rot) and reach their stated results."""
import runpy

import pytest

from tests.examples.helpers import ROOT, reported_accuracy


def test_article_example_converges(capsys):
    runpy.run_path(str(ROOT / "examples" / "article.py"), run_name="__main__")
    out = capsys.readouterr().out
    final = [line for line in out.splitlines() if line.startswith("final loss:")]
    assert final and float(final[0].split(":")[1]) < 0.01
    # Codes 2 and 3, a user's op and optimizer as the article writes them: g of w is xᵀ·1,
    # and one step of momentum 0.9 from m = 0 moves w by lr·0.1·g (lr = 0.1, the default)
    assert "Code 2 gradient of w: [[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]" in out
    step = [line for line in out.splitlines() if line.startswith("Code 3 step:")]
    assert step and sum(eval(step[0].split(":")[1]), []) == pytest.approx(
        [2.99, 3.99, 4.99, 5.98, 6.98, 7.98])


def test_digits_example_reaches_97_percent():
    pytest.importorskip("sklearn")
    assert reported_accuracy("digits.py") >= 0.97
