"""MkDocs hook: expands ``<!-- nnkit-reference: nnkit.ops nnkit.core -->`` into one mkdocstrings
block per module, found on disk, so a new module appears in the reference without editing a page.
"""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!-- nnkit-reference: ([\w. ]+) -->")


def modules(name):
    """``name`` itself when it is a module, else every module of the package (sorted)."""
    path = ROOT.joinpath(*name.split("."))
    if path.with_suffix(".py").is_file():
        return [name]
    if not (path / "__init__.py").is_file():
        raise ValueError(f"docs: no module or package named {name} under {ROOT}")
    return [f"{name}.{child.stem}" for child in sorted(path.glob("*.py"))
            if not child.stem.startswith("_")]


def expand(match):
    return "\n\n".join(f"::: {module}" for name in match.group(1).split()
                       for module in modules(name))


def on_page_markdown(markdown, **kwargs):
    return MARKER.sub(expand, markdown)
