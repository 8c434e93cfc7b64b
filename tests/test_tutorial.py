"""The tutorial notebook is stored without outputs and runs top to bottom."""
import os
import pathlib
import shutil

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "tutorial.ipynb"
nbformat = pytest.importorskip("nbformat")


def test_tutorial_outputs_are_stripped():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert len(code) >= 10
    assert all(cell.outputs == [] and cell.execution_count is None for cell in code)


def test_tutorial_runs(monkeypatch):
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("sklearn")
    pytest.importorskip("matplotlib")
    pytest.importorskip("tqdm")
    # the kernel imports this checkout's nnkit, installed or not
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    outputs = [output for cell in notebook.cells if cell.cell_type == "code"
               for output in cell.outputs]
    text = "".join(output.get("text", "") for output in outputs)
    accuracy = float(text.split("test accuracy: ")[1].split()[0])
    assert accuracy > 0.9
    assert "step 0: CELoss" in text and "<-- wrong" in text and "gradcheck: OK" in text
    assert "f'(2) = 21.0  f''(2) = 42.0" in text                # the second-order section
    newton = [line for line in text.splitlines() if line.startswith("newton step 7")]
    assert newton and abs(float(newton[0].split("f'(t) = ")[1])) < 1e-12
    kinds = [kind for output in outputs for kind in output.get("data", {})]
    assert "image/png" in kinds                               # the loss curve
    assert "text/html" in kinds                               # node and trace tables
    if shutil.which("dot"):
        assert kinds.count("image/svg+xml") == 4              # the four draw() pictures
