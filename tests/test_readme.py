"""The README's Python snippets run, in order, in one namespace, so they never rot."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def python_blocks(text):
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_snippets_run(capsys):
    blocks = python_blocks((ROOT / "README.md").read_text())
    assert len(blocks) >= 3
    namespace = {"__name__": "readme"}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)
    assert "net" in namespace
    final = namespace["net"](namespace["x"]).data
    assert final[0].argmax() == 2
