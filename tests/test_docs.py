"""The docs: every snippet of README.md and docs/*.md runs, every guide page is in the site and
linked from its home page, the API reference covers every public name, and every public name has
a docstring."""
import inspect
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

import nnkit
from tests import snippets
from tests.test_viz import load_script

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Public callables that had no docstring when this test was written (their modules belong to
# others); a name missing from here and from the docs fails the test.
KNOWN_UNDOCUMENTED = set()


@pytest.mark.parametrize("page", snippets.pages(), ids=snippets.shown)
def test_page_snippets_run(page, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)          # a snippet that writes a file (SaveBest) writes it here
    dtype = nnkit.get_dtype()
    try:
        snippets.run_page(page)
    except ImportError as error:       # a page showing an optional package: skipped without it
        missing = _optional_missing(error)
        if missing is None:
            raise
        pytest.skip(f"{page} shows {missing}, an optional package not installed here")
    finally:
        nnkit.set_dtype(dtype)


OPTIONAL = {"torch", "tqdm", "matplotlib", "graphviz", "safetensors", "sklearn", "mpi4py",
            "cupy", "jupytext"}


def _optional_missing(error):
    """The optional package whose absence raised ``error`` (directly, or under nnkit's own
    ImportError naming the extra to install), or None for any other import error."""
    while error is not None:
        name = (getattr(error, "name", None) or "").split(".")[0]
        if isinstance(error, ModuleNotFoundError) and name in OPTIONAL:
            return name
        error = error.__cause__ or error.__context__
    return None


def test_only_a_missing_optional_package_skips_a_page():
    torch = ModuleNotFoundError("No module named 'torch'", name="torch")
    assert _optional_missing(torch) == "torch"
    try:
        raise ImportError("ProgressBar needs tqdm") from ModuleNotFoundError(name="tqdm")
    except ImportError as wrapped:                  # nnkit's message over the missing module
        assert _optional_missing(wrapped) == "tqdm"
    assert _optional_missing(ModuleNotFoundError(name="nnkit.gone")) is None
    assert _optional_missing(ImportError("cannot import name 'x' from 'torch'")) is None


def test_a_broken_snippet_fails_naming_its_page_and_line(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n```python\nvalue = 1\n```\n\nText.\n\n```python\n"
                    "assert value == 1\nvalue.missing\n```\n")
    with pytest.raises(AttributeError) as caught:
        snippets.run_page(page)
    assert (caught.traceback[-1].path.name, caught.traceback[-1].lineno + 1) == ("page.md", 11)


def test_a_block_marked_not_run_is_skipped_and_a_mistyped_fence_is_refused(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- not run: a fragment -->\n```python\n    def _back(self, x):\n"
                    "        raise AssertionError\n```\n```python\nran = True\n```\n")
    assert snippets.run_page(page)["ran"]
    page.write_text("<!-- not run -->\n```python\npass\n```\n")
    with pytest.raises(AssertionError, match="page.md:1: write <!-- not run: the reason -->"):
        snippets.run_page(page)
    page.write_text("Text.\n\n```py\nraise SystemExit\n```\n")
    with pytest.raises(AssertionError, match="page.md:3: a ```py fence"):
        snippets.run_page(page)


def test_every_not_run_marker_sits_above_a_python_block():
    for page in snippets.pages():
        markers = sum(bool(snippets.NOT_RUN.fullmatch(line.strip()))
                      for line in page.read_text().splitlines())
        skipped = sum(reason is not None for _, _, reason in snippets.python_blocks(page))
        assert markers == skipped, f"{snippets.shown(page)}: a not-run marker above no python block"


def test_every_guide_page_is_in_the_site_and_linked_from_the_home_page():
    nav = set(re.findall(r":\s*(\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), flags=re.M))
    home = (ROOT / "docs" / "index.md").read_text()
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert page.name in nav, f"docs/{page.name} is missing from the nav of mkdocs.yml"
        if page.name != "index.md":
            assert f"]({page.name})" in home, f"docs/index.md does not link to {page.name}"


def test_the_site_builds_without_a_warning(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    # Not --quiet: it hides the warnings from --strict (mkdocs#4126), and a broken link would pass.
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path)]
    build = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    # MkDocs' own warnings (a kernel executing a course chapter logs warnings of its own)
    warnings = [line for line in build.stderr.splitlines() if line.startswith("WARNING")]
    assert build.returncode == 0 and not warnings, build.stderr[-3000:]


def load_hooks():
    return load_script("docs/hooks.py")


def public_callables():
    for name in sorted(vars(nnkit)):
        obj = getattr(nnkit, name)
        if not name.startswith("_") and callable(obj) and not inspect.ismodule(obj):
            yield name, obj


def own_docstring(obj):
    doc = vars(obj).get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    return (doc or "").strip()


def test_every_public_callable_has_a_docstring():
    missing = sorted(name for name, obj in public_callables() if not own_docstring(obj))
    assert set(missing) <= KNOWN_UNDOCUMENTED, f"public names without a docstring: {missing}"


def test_reference_pages_cover_every_module_and_public_name():
    hooks = load_hooks()
    pages = "".join(p.read_text() for p in (ROOT / "docs" / "reference").glob("*.md"))
    listed = {module for marker in hooks.MARKER.finditer(pages)
              for name in marker.group(1).split() for module in hooks.modules(name)}
    on_disk = {".".join(path.relative_to(ROOT).with_suffix("").parts)
               for path in (ROOT / "nnkit").rglob("*.py") if path.name != "__init__.py"}
    assert on_disk <= listed, f"modules missing from docs/reference: {sorted(on_disk - listed)}"
    for name, obj in public_callables():
        module = getattr(obj, "__module__", "")
        if module.startswith("nnkit"):
            assert module in listed, f"nnkit.{name} is defined in {module}, not in the reference"


def test_hook_expands_markers():
    hooks = load_hooks()
    text = hooks.on_page_markdown("a\n<!-- nnkit-reference: nnkit.trace nnkit.optim -->\nb")
    assert text.startswith("a\n::: nnkit.trace\n\n::: nnkit.optim.")
    assert "::: nnkit.optim.adam" in text and "::: nnkit.optim.__init__" not in text
    with pytest.raises(ValueError, match="no module or package named nnkit.nothing"):
        hooks.modules("nnkit.nothing")


def test_docstring_escaping():
    griffe = pytest.importorskip("griffe")
    assert griffe
    plain = load_script("docs/griffe_plain.py")
    assert plain.plain("x[t, b] = a * b_t <0 ``x[t]``") == \
        r"x\[t, b\] = a \* b\_t &lt;0 ``x[t]``"


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's `dot` is not installed")
def test_make_figures(tmp_path):
    paths = load_script("docs/make_figures.py").main(tmp_path)
    svg = paths[0].read_text()
    assert svg.count('class="node"') == 15 and svg.count('class="edge"') == 14
    assert ">w1<" in svg and "g = [[0.014" in svg
    assert (ROOT / "docs" / "img" / "article-graph.svg").is_file()
    committed = (ROOT / "docs" / "img" / "article-graph.svg").read_text()
    assert committed.count('class="node"') == 15


def test_readme_shows_the_picture_and_links_the_course():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Seeing the graph")[1].split("\n## ")[0]
    pictures = re.findall(r"!\[[^]]*\]\(([^)]+)\)", section)
    assert pictures and all((ROOT / p).is_file() for p in pictures)
    assert "(course/README.md)" in section and (ROOT / "course" / "README.md").is_file()
