"""Running an example script the way a user does, for the example tests."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run_example(name, *arguments, timeout=300):
    """The standard output of ``python examples/<name> <arguments>`` run from the repository
    root in a fresh interpreter; a non-zero exit fails the test with the script's stderr."""
    result = subprocess.run([sys.executable, str(ROOT / "examples" / name), *arguments],
                            capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return result.stdout


def reported_accuracy(name, *arguments):
    """The accuracy an example prints as its last line, ``test accuracy: 0.XXXX``."""
    last = run_example(name, *arguments).strip().splitlines()[-1]
    assert last.startswith("test accuracy: ")
    return float(last.split(": ")[1])
