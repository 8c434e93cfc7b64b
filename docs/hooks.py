"""MkDocs hook: expands ``<!-- nnkit-reference: nnkit.ops nnkit.core -->`` into one mkdocstrings
block per module, found on disk, so a new module appears in the reference without editing a page.
"""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!-- nnkit-reference: ([\w. ]+) -->")


def modules(name):
    """``name`` itself when it is a module, else every module of the package (sorted), after
    the package itself when its ``__init__`` defines names."""
    path = ROOT.joinpath(*name.split("."))
    if path.with_suffix(".py").is_file():
        return [name]
    if not (path / "__init__.py").is_file():
        raise ValueError(f"docs: no module or package named {name} under {ROOT}")
    # a package whose __init__ defines public names of its own (nnkit.replay) is a page too
    own = [name] if re.search(r"^(def|class) [A-Za-z]", (path / "__init__.py").read_text(),
                              flags=re.M) else []
    return own + [f"{name}.{child.stem}" for child in sorted(path.glob("*.py"))
                  if not child.stem.startswith("_")]


def expand(match):
    return "\n\n".join(f"::: {module}" for name in match.group(1).split()
                       for module in modules(name))


def on_page_markdown(markdown, **kwargs):
    return MARKER.sub(expand, markdown)
