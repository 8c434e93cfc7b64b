"""The course's build: chapters from their text sources to executed notebooks and site pages.

Each chapter is a Python file in jupytext's "percent" format (``# %%`` starts a code cell,
``# %% [markdown]`` a prose cell): the text file is the source, so a diff of a chapter reads
as prose. This file is three things:

- a library: ``notebook(path)`` reads a chapter as a notebook, ``execute(path)`` runs it in a
  fresh kernel (nbclient; a cell that raises stops it with the cell's traceback) and keeps the
  executed notebook in ``course/_build/``, ``page(notebook)`` renders one as Markdown with its
  outputs (graphs as inline SVG, tables as HTML, plots as PNG);
- a MkDocs hook (``mkdocs.yml`` lists it): the site gets one page per chapter under
  ``course/``, from the executed notebook in ``course/_build/`` when it was made from the
  same chapter text and the same nnkit sources, else executed now, and the executed
  ``.ipynb`` beside it to download;
- a command: ``python course/build.py [chapter ...]`` writes each chapter's notebook,
  executed, to ``course/_build/`` (``--no-execute``: without outputs) and prints its time.
"""
import base64
import hashlib
import html
import json
import os
import pathlib
import re
import shutil
import sys
import time

COURSE = pathlib.Path(__file__).resolve().parent
ROOT = COURSE.parent
BUILD = COURSE / "_build"
TIMEOUT = 300                       # seconds a cell may run before the chapter fails


def chapters():
    """The chapter sources in order: course/NN-name.py."""
    return sorted(COURSE.glob("[0-9][0-9]-*.py"))


def notebook(path):
    """The chapter at ``path`` as an nbformat notebook, without outputs."""
    import jupytext
    return jupytext.read(path, fmt="py:percent")


def fingerprint(path):
    """A hash of the chapter text, of nnkit's sources and of whether Graphviz draws pictures: an
    executed notebook with the same fingerprint shows what the chapter shows today."""
    digest = hashlib.sha256(pathlib.Path(path).read_bytes())
    digest.update(b"dot" if shutil.which("dot") else b"no dot")
    for source in sorted((ROOT / "nnkit").rglob("*.py")):
        digest.update(source.relative_to(ROOT).as_posix().encode())
        digest.update(source.read_bytes())
    return digest.hexdigest()


def execute(path, timeout=TIMEOUT, build=BUILD):
    """Run the chapter top to bottom in a fresh kernel that imports this checkout's nnkit;
    write the executed notebook to ``build``/NAME.ipynb (course/_build) and return it. A cell
    that raises raises nbclient's CellExecutionError, naming the cell and showing its
    traceback."""
    import nbclient
    import nbformat
    path = pathlib.Path(path)
    nb = notebook(path)
    # The kernel imports this checkout's nnkit; one BLAS thread: the chapters' arrays are
    # small, and threads only fight over a shared CPU.
    path_list = [str(ROOT), os.environ.get("PYTHONPATH")]
    settings = {"PYTHONPATH": os.pathsep.join(filter(None, path_list)),
                "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "1"),
                "MKL_NUM_THREADS": os.environ.get("MKL_NUM_THREADS", "1")}
    previous = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        started = time.perf_counter()
        nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": str(COURSE)}}).execute()
        seconds = time.perf_counter() - started
    finally:
        for name, value in previous.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
    nb.metadata["nnkit_course"] = {"fingerprint": fingerprint(path), "seconds": round(seconds, 2)}
    build = pathlib.Path(build)
    build.mkdir(exist_ok=True)
    nbformat.write(nb, build / f"{path.stem}.ipynb")
    return nb


def executed(path):
    """The executed notebook of a chapter: course/_build's copy when it is current, else run."""
    import nbformat
    path = pathlib.Path(path)
    kept = BUILD / f"{path.stem}.ipynb"
    if kept.is_file():
        nb = nbformat.read(kept, as_version=4)
        if nb.metadata.get("nnkit_course", {}).get("fingerprint") == fingerprint(path):
            return nb
    return execute(path)


# ----------------------------------------------------------------------------- rendering

_STARTS_BLOCK = re.compile(r"\s*([-*+] |\d+\. |#|\||>|<|```|\$\$)")
_ENDS_BLOCK = re.compile(r"\s*(#|\||>|<|```|\$\$)")


def _unwrap(markdown):
    """Join the lines of each paragraph and list item: the site's Markdown turns every newline
    into a line break (the reference's formulas need it), and prose is wrapped at 100 columns."""
    lines, fenced = [], False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif (not fenced and lines and lines[-1].strip() and line.strip()
              and not _STARTS_BLOCK.match(line) and not _ENDS_BLOCK.match(lines[-1])):
            lines[-1] = f"{lines[-1].rstrip()} {line.strip()}"
            continue
        lines.append(line)
    return "\n".join(lines)


def _widget(widgets, model_id):
    """A widget as its final state, in plain HTML: text, and progress bars as <progress> (a
    progress bar from tqdm is a box of a label, a bar and a label)."""
    model = widgets.get(model_id)
    if model is None:
        return None
    state = model["state"]
    if "children" in state:
        parts = [_widget(widgets, child.replace("IPY_MODEL_", "")) for child in state["children"]]
        return None if None in parts else " ".join(parts)
    if model["model_name"] in ("FloatProgressModel", "IntProgressModel"):
        value, top = state.get("value", 0), state.get("max", 100)
        return f'<progress value="{value}" max="{top}"></progress>'
    if model["model_name"] in ("HTMLModel", "LabelModel"):
        return f"<span>{state.get('value', '')}</span>"
    return None


def _output(output, widgets=None):
    """One cell output as an HTML block."""
    kind = output.get("output_type")
    if kind == "stream":
        # a progress bar redraws its line with \r: show each line as it was left
        text = "\n".join(line.split("\r")[-1] for line in output["text"].split("\n"))
        return f'<pre class="course-output">{html.escape(text.rstrip(), quote=False)}</pre>'
    if kind == "error":
        raise RuntimeError(f"course: a cell raised {output['ename']}: {output['evalue']}")
    data = output.get("data", {})
    view = data.get("application/vnd.jupyter.widget-view+json")
    shown = view and _widget(widgets or {}, view.get("model_id"))
    if shown:
        return f'<div class="course-widget">{shown}</div>'
    if "image/svg+xml" in data:
        svg = "".join(data["image/svg+xml"])
        svg = svg[svg.find("<svg"):]                  # no XML prolog or DOCTYPE inside HTML
        return f'<div class="course-graph">{svg}</div>'
    if "text/html" in data:
        return f'<div class="course-html">{"".join(data["text/html"])}</div>'
    if "image/png" in data:
        return (f'<div class="course-plot"><img alt="plot" '
                f'src="data:image/png;base64,{"".join(data["image/png"]).strip()}"></div>')
    if "text/plain" in data:     # also a progress bar widget's text
        return ('<pre class="course-output">'
                f'{html.escape("".join(data["text/plain"]), quote=False)}</pre>')
    return ""


def _html_block(text):
    # Markdown ends a raw HTML block at a blank line: outputs have none
    return "\n".join(line for line in text.splitlines() if line.strip())


# Outputs set apart from the code; a graph wider than the page scrolls (scaled down to fit,
# its labels would be too small to read).
_STYLE = ("<style>"
          ".course-graph,.course-html,.course-plot,.course-widget{overflow-x:auto;margin:0 0 1em}"
          "pre.course-output{border-left:3px solid #9ec5e8;background:#f7fafd}</style>")


def page(nb, download=None):
    """The executed notebook ``nb`` as a Markdown page with its outputs."""
    parts = []
    widgets = nb.metadata.get("widgets", {}).get(
        "application/vnd.jupyter.widget-state+json", {}).get("state", {})
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            parts.append(_unwrap(cell.source))
            if download and cell.source.lstrip().startswith("# ") and len(parts) == 1:
                parts.append(f"[Download this chapter as a notebook]({download}) "
                             "(or open its `.py` source with jupytext).")
        elif cell.cell_type == "code" and cell.source.strip():
            parts.append(f"```python\n{cell.source}\n```")
            for output in cell.get("outputs", []):
                block = _html_block(_output(output, widgets))
                if block:
                    parts.append(block)
    return "\n\n".join(parts + [_STYLE]) + "\n"


# ----------------------------------------------------------------------------- MkDocs hook

def on_files(files, config, **kwargs):
    """Add course/NAME.md (rendered) and course/NAME.ipynb (executed) for every chapter, and
    the course's index page from course/README.md."""
    from mkdocs.structure.files import File
    import nbformat
    for path in chapters():
        nb = executed(path)
        files.append(File.generated(config, f"course/{path.stem}.md",
                                    content=page(nb, download=f"{path.stem}.ipynb")))
        files.append(File.generated(config, f"course/{path.stem}.ipynb",
                                    content=nbformat.writes(nb)))
    readme = (COURSE / "README.md").read_text(encoding="utf-8")
    files.append(File.generated(config, "course/index.md", content=_site_links(readme)))
    return files


def _site_links(text):
    # course/README.md links the chapter sources (NN-name.py); on the site, their pages
    return re.sub(r"\]\((\d\d-[\w-]+)\.py\)", r"](\1.md)", text)


def main(argv):
    import nbformat
    run = "--no-execute" not in argv
    names = [a for a in argv if not a.startswith("--")]
    paths = [p for p in chapters() if not names or any(n in p.name for n in names)]
    BUILD.mkdir(exist_ok=True)
    for path in paths:
        started = time.perf_counter()
        if run:
            execute(path)
        else:
            nbformat.write(notebook(path), BUILD / f"{path.stem}.ipynb")
        print(f"{path.name}: {time.perf_counter() - started:.1f} s -> "
              f"{(BUILD / f'{path.stem}.ipynb').relative_to(ROOT)}")


if __name__ == "__main__":
    main(sys.argv[1:])
