"""Running the Python snippets of README.md and docs/*.md, so that none of them rots.

The convention (docs/contributing.md, "Documentation"): every ```python block of a page runs, in
the page's order, in one namespace per page, so a block may use what an earlier block of the
same page defined. A block meant as a fragment (a method shown on its own, code that needs
several MPI processes) is preceded on the line just above its fence by
``<!-- not run: the reason -->``. Any other fence that names a language must name one of
``OTHER_LANGUAGES``, so that a typo (```py, ```Python) cannot take a block out of the run.
"""
import pathlib
import re
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[1]
OTHER_LANGUAGES = {"bash", "text", "console", "ini", "toml", "json", "yaml"}
NOT_RUN = re.compile(r"<!-- not run: (\S.*?) -->")


def pages():
    """README.md and every page of docs/ written by hand (the reference is generated)."""
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def shown(path):
    """``path`` as a message shows it: relative to the repository when it lies inside."""
    path = pathlib.Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def python_blocks(path):
    """``(first_line, code, reason_not_run)`` for each ```python block of ``path``, in order;
    ``first_line`` counts from 1 and is the block's first line of code."""
    lines = path.read_text().splitlines()
    name = shown(path)
    blocks, fence, start = [], None, None
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if fence is None:
            if stripped.startswith("```"):
                fence = stripped[3:].strip()
                start = number
                if fence not in {"", "python"} | OTHER_LANGUAGES:
                    raise AssertionError(f"{name}:{number}: a ```{fence} fence: write ```python "
                                         f"(run by the tests) or one of {sorted(OTHER_LANGUAGES)}")
        elif stripped == "```":
            if fence == "python":
                above = lines[start - 2].strip() if start >= 2 else ""
                marker = NOT_RUN.fullmatch(above)
                if above.startswith("<!-- not run") and not marker:
                    raise AssertionError(f"{name}:{start - 1}: write <!-- not run: the reason -->")
                code = textwrap.dedent("\n".join(lines[start:number - 1]) + "\n")
                blocks.append((start + 1, code, marker.group(1) if marker else None))
            fence = None
    if fence is not None:
        raise AssertionError(f"{name}:{start}: a code fence that is never closed")
    return blocks


def run_page(path):
    """Run every ```python block of ``path`` not marked ``not run``, in order, in one namespace
    (returned). A failing block's traceback names the page and the line in it."""
    namespace = {"__name__": "__snippets__"}
    for first_line, code, reason in python_blocks(path):
        if reason is None:
            # Padding with blank lines makes the traceback's line numbers the page's.
            source = "\n" * (first_line - 1) + code
            exec(compile(source, shown(path), "exec"), namespace)
    return namespace
