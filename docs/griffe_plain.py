"""Griffe extension for the docs build: nnkit's docstrings are plain text with formulas
(``x[t, b]``, ``a * b``, ``y_t``), not Markdown, so escape what Markdown would reinterpret.
Code spans in backticks are left alone; line breaks are kept by the ``nl2br`` extension.
"""
import re

import griffe

CODE = re.compile(r"(``.+?``|`[^`\n]+`)")
SPECIAL = re.compile(r"([\\\[\]*_>#{}()!+])")


def plain(text):
    parts = CODE.split(text)
    for k in range(0, len(parts), 2):         # even parts are outside code spans
        parts[k] = SPECIAL.sub(r"\\\1", parts[k]).replace("<", "&lt;")
    return "".join(parts)


class PlainDocstrings(griffe.Extension):
    """Escape Markdown syntax in every docstring."""

    def on_instance(self, *, obj, **kwargs):
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)
