"""docs/weights.md runs: its Python snippets, in order, in one namespace."""
import pathlib
import re

import pytest

PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "weights.md"


def test_the_weights_page_runs(tmp_path, monkeypatch):
    pytest.importorskip("torch", reason="the page's worked example starts in PyTorch")
    import nnkit as nn
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
    assert len(blocks) >= 8
    monkeypatch.chdir(tmp_path)
    previous = nn.get_dtype()
    namespace = {}
    try:
        for number, block in enumerate(blocks):
            exec(compile(block, f"{PAGE.name}, snippet {number + 1}", "exec"), namespace)
    finally:
        nn.set_dtype(previous)
    assert (tmp_path / "classifier.pt").is_file()
    assert (tmp_path / "classifier.safetensors").is_file()
