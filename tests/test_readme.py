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


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    test_command = [c.strip() for c in commands if "pytest" in c]
    assert len(test_command) == 1
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_command[0] + " \\" in ci_lines        # continued by `|| exit 1`
