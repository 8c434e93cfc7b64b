"""Every chapter of the course runs top to bottom, and its exercises' checks pass.

Each chapter is executed in a fresh Jupyter kernel (nbclient); a cell that raises fails the test
with that cell's traceback. The executed notebooks are kept in course/_build/, where the site's
build (course/build.py as a MkDocs hook) finds them instead of running the chapters again.
"""
import importlib.util
import pathlib
import shutil

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
pytest.importorskip("jupytext")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")


def load_build():
    spec = importlib.util.spec_from_file_location("course_build", ROOT / "course" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = load_build()
CHAPTERS = build.chapters()


def outputs(nb):
    return [output for cell in nb.cells if cell.cell_type == "code" for output in cell.outputs]


def test_the_course_has_its_eight_chapters_in_the_site_and_the_readme():
    names = [path.stem for path in CHAPTERS]
    assert names == ["01-graph", "02-writing-an-op", "03-order", "04-broadcasting", "05-mlp",
                     "06-sequences", "07-attention", "08-higher-order"]
    navigation = (ROOT / "mkdocs.yml").read_text()
    readme = (ROOT / "course" / "README.md").read_text()
    for name in names:
        assert f"course/{name}.md" in navigation, f"{name} is not in mkdocs.yml's nav"
        assert f"]({name}.py)" in readme, f"{name} is not in course/README.md's table"


@pytest.mark.parametrize("path", CHAPTERS, ids=[path.stem for path in CHAPTERS])
def test_chapter_runs_and_checks_its_exercises(path):
    pytest.importorskip("sklearn")
    pytest.importorskip("matplotlib")
    pytest.importorskip("tqdm")
    source = build.notebook(path)
    headings = [cell.source for cell in source.cells if cell.cell_type == "markdown"]
    assert headings[0].startswith("# Chapter "), "a chapter starts with its title"
    assert any("\n## Exercises" in "\n" + text for text in headings)
    assert "assert" in source.cells[-1].source, "the last cell checks the exercises' answers"

    nb = build.execute(path)            # raises CellExecutionError at a failing cell

    shown = outputs(nb)
    text = "".join(output.get("text", "") for output in shown)
    assert text.rstrip().endswith("all answers check")
    kinds = [kind for output in shown for kind in output.get("data", {})]
    assert "text/html" in kinds, "a node or trace table"
    if shutil.which("dot"):
        assert "image/svg+xml" in kinds, "a graph drawn with nn.draw"
    page = build.page(nb)
    assert "<svg" in page or not shutil.which("dot")
    assert "<table" in page or "\n|---|" in page


def test_a_failing_cell_fails_the_chapter(tmp_path):
    nbclient = pytest.importorskip("nbclient")
    broken = tmp_path / "99-broken.py"
    broken.write_text("# %% [markdown]\n# # Broken\n\n# %%\nimport nnkit as nn\n\n"
                      "# %%\nassert nn.NetVar([1.0]).item() == 2.0, 'a wrong answer'\n\n"
                      "# %%\nprint('never reached')\n")
    with pytest.raises(nbclient.exceptions.CellExecutionError, match="a wrong answer"):
        build.execute(broken, build=tmp_path)


def test_page_renders_outputs_and_unwraps_prose():
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Title\n\nOne sentence\nwrapped.\n\n- an item\n  going on\n"
                                      "- another\n\n| a | b |\n|---|---|\n| 1 | 2 |"),
        nbformat.v4.new_code_cell("draw()", outputs=[
            nbformat.v4.new_output("display_data", data={
                "image/svg+xml":
                    '<?xml version="1.0"?>\n<!DOCTYPE svg>\n<svg>\n\n<g class="node"/></svg>',
                "text/plain": "<Graph>"}),
            nbformat.v4.new_output("stream", name="stderr", text="10%\r50%\r100%\ndone\n"),
            nbformat.v4.new_output("display_data", data={
                "application/vnd.jupyter.widget-view+json": {"model_id": "box"},
                "text/plain": "0%"})]),
    ]
    state = {"box": {"model_name": "HBoxModel",
                     "state": {"children": ["IPY_MODEL_label", "IPY_MODEL_bar"]}},
             "label": {"model_name": "HTMLModel", "state": {"value": "epoch 1"}},
             "bar": {"model_name": "FloatProgressModel", "state": {"value": 5.0, "max": 5.0}}}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": state}}
    page = build.page(nb)
    assert "One sentence wrapped." in page and "- an item going on\n- another" in page
    assert "| a | b |\n|---|---|\n| 1 | 2 |" in page
    assert '<div class="course-graph"><svg>\n<g class="node"/></svg></div>' in page
    assert "<?xml" not in page and "DOCTYPE" not in page
    assert "100%\ndone" in page and "50%" not in page
    assert '<span>epoch 1</span> <progress value="5.0" max="5.0"></progress>' in page
    with pytest.raises(RuntimeError, match="a cell raised ValueError: bad"):
        build.page(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x", outputs=[
            nbformat.v4.new_output("error", ename="ValueError", evalue="bad", traceback=[])])]))
