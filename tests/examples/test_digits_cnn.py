"""examples/digits_cnn.py: a Conv2D → ReLU → MaxPool2D → affine → SoftmaxCELoss network on the
scikit-learn digits as 1×8×8 images; its loss falls and it reaches ≥ 97 % test accuracy."""
import pathlib
import runpy

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def example():
    pytest.importorskip("sklearn")
    return runpy.run_path(str(ROOT / "examples" / "digits_cnn.py"), run_name="digits_cnn")


def test_cnn_loss_falls(example, capsys):
    accuracy, losses = example["main"](epochs=3, seed=1, verbose=False)
    assert len(losses) == 3
    assert losses[0] > losses[1] > losses[2]
    assert losses[2] < 0.5 * losses[0]
    assert accuracy > 0.9
    assert capsys.readouterr().out.strip().startswith("test accuracy: ")


def test_digits_cnn_example_reaches_97_percent(example, capsys):
    accuracy, losses = example["main"]()
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"test accuracy: {accuracy:.4f}"
    assert accuracy >= 0.97
    assert losses[-1] < losses[0]
