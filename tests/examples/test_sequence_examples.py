"""The sequence examples run and reach their stated results."""
import runpy

from tests.examples.helpers import ROOT, reported_accuracy, run_example


def test_char_rnn_quick_run_learns_and_samples(capsys):
    main = runpy.run_path(str(ROOT / "examples" / "char_rnn.py"))["main"]
    losses, text = main(epochs=4, hidden=32, embedding=16, sample_length=40, progress=False)
    assert losses[-1] < losses[0] - 0.5
    assert text.startswith("Shall ") and len(text) == 46
    out = capsys.readouterr().out
    assert "epoch 4: loss" in out and "sample:" in out


def test_char_rnn_command_line_quick():
    out = run_example("char_rnn.py", "--quick", "--epochs", "2", timeout=120)
    assert "epoch 2: loss" in out and "epoch 3" not in out
    assert out.split("sample:\n")[1].startswith("Shall ")      # the prompt, then the sample


def test_sequence_classify_reaches_95_percent():
    assert reported_accuracy("sequence_classify.py") >= 0.95
