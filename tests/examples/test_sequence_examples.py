"""The sequence examples run and reach their stated results."""
import pathlib
import runpy
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_char_rnn_quick_run_learns_and_samples(capsys):
    main = runpy.run_path(str(ROOT / "examples" / "char_rnn.py"))["main"]
    losses, text = main(epochs=4, hidden=32, embedding=16, sample_length=40, progress=False)
    assert losses[-1] < losses[0] - 0.5
    assert text.startswith("Shall ") and len(text) == 46
    out = capsys.readouterr().out
    assert "epoch 4: loss" in out and "sample:" in out


def test_char_rnn_command_line_quick():
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "char_rnn.py"), "--quick",
                             "--epochs", "2"], capture_output=True, text=True, timeout=120,
                            cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "epoch 2: loss" in result.stdout and "sample:" in result.stdout


def test_sequence_classify_reaches_95_percent():
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "sequence_classify.py")],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("test accuracy: ")
    assert float(last.split(": ")[1]) >= 0.95
