"""Seeing the graph: ``draw(root)`` pictures, node tables in Jupyter, the backward pass animated.

nnkit writes Graphviz's DOT language itself, so ``.source`` and ``.save("graph.dot")`` need
nothing installed. SVG and PNG are rendered by Graphviz's ``dot`` program: install it with
``apt-get install graphviz`` (Debian/Ubuntu), ``brew install graphviz`` (macOS) or
``conda install graphviz``. (The ``graphviz`` pip package is a wrapper that also needs ``dot``.)

Node styles: ops are rounded boxes (blue), parameters, i.e. leaves that need a gradient, are
orange ellipses, constants (leaves with ``requires_grad=False``) are dashed grey ellipses, and the
root has a double border. A fused op that runs a loop over time is a 3-D box labelled ``T=<n>``:
an op says so by holding an integer ``steps`` (its number of time steps).
"""
import html
import pathlib
import shutil
import subprocess
import uuid

import numpy

from . import backend, checks
from .arraylike import preview
from .core import NetOp, NetVar
from .trace import Trace, describe, reachable, trace_back

__all__ = ['draw', 'draw_trace', 'Graph', 'Frames']

_STYLE = {
    "op": {"shape": "box", "style": "rounded,filled", "fillcolor": "#dbe9f6"},
    "fused": {"shape": "box3d", "style": "filled", "fillcolor": "#dbe9f6"},
    "parameter": {"shape": "ellipse", "style": "filled", "fillcolor": "#fde5c0"},
    "constant": {"shape": "ellipse", "style": "filled,dashed", "fillcolor": "#eeeeee"},
}
_CURRENT = {"fillcolor": "#ffd966", "color": "#c00000", "penwidth": "3"}
_INSTALL = ("install Graphviz's `dot` program: `apt-get install graphviz` (Debian/Ubuntu), "
            "`brew install graphviz` (macOS) or `conda install graphviz` (the `graphviz` pip "
            "package, `pip install graphviz`, also needs this system package)")


class Graph:
    """A drawn graph: DOT text in ``.source``, SVG in Jupyter, ``.save(path)`` to a file."""

    def __init__(self, source):
        self.source = source

    def pipe(self, format="svg"):
        """The picture as bytes in ``format`` ("svg", "png", ...), rendered by ``dot``."""
        dot = shutil.which("dot")
        if dot is None:
            raise RuntimeError(f"draw: rendering {format.upper()} needs Graphviz; {_INSTALL}. "
                               "The DOT text works without it: .source or .save('graph.dot')")
        done = subprocess.run([dot, f"-T{format}"], input=self.source.encode(),
                              capture_output=True, check=False)
        if done.returncode:
            raise RuntimeError(f"draw: dot -T{format} failed: {done.stderr.decode().strip()}")
        return done.stdout

    def save(self, path):
        """Write ``path`` as .dot (always works), .svg or .png (need ``dot``); returns the path."""
        path = pathlib.Path(path)
        format = path.suffix.lower().lstrip(".")
        if format in ("dot", "gv"):
            path.write_text(self.source, encoding="utf-8")
        elif format in ("svg", "png", "pdf"):
            path.write_bytes(self.pipe(format))
        else:
            raise ValueError(f"Graph.save: unknown file type {path.suffix!r} in {str(path)!r}; "
                             "use .dot, .svg, .png or .pdf")
        return path

    def _repr_svg_(self):
        # Jupyter falls back to the text repr when this returns None (no `dot` installed).
        return self.pipe("svg").decode() if shutil.which("dot") else None

    def __repr__(self):
        nodes = self.source.count('label="')
        hint = "" if shutil.which("dot") else f" (no SVG: {_INSTALL})"
        return f"<nnkit Graph of {nodes} nodes; .source, .save(path){hint}>"


class Frames(list):
    """Graph pictures of a backward pass, one per step; a slider in Jupyter.

    ``frames.save("out/step-{k}.svg")`` writes every frame (``{k}`` is the step number).
    """

    def __init__(self, graphs, captions):
        super().__init__(graphs)
        self.captions = list(captions)

    def save(self, pattern):
        """Write each frame to ``pattern.format(k=step)``; returns the paths."""
        if "{k" not in pattern:
            raise ValueError(f"Frames.save: the pattern {pattern!r} needs a {{k}} for the step")
        return [graph.save(pattern.format(k=k)) for k, graph in enumerate(self)]

    def _repr_html_(self):
        if not shutil.which("dot") or not self:
            return None
        key = f"nnkit-{uuid.uuid4().hex}"
        frames = "".join(
            f"<div class='{key}' data-caption='{html.escape(caption, quote=True)}'"
            f"{'' if k == 0 else ' style=display:none'}>{graph._repr_svg_()}</div>"
            for k, (graph, caption) in enumerate(zip(self, self.captions)))
        script = (f"var f=document.getElementsByClassName('{key}');for(var i=0;i<f.length;i++)"
                  "{f[i].style.display=(i==this.value)?'':'none';}"
                  f"document.getElementById('{key}-c').textContent=f[this.value].dataset.caption;")
        return (f"<div><input type='range' min='0' max='{len(self) - 1}' value='0' "
                f"style='width:60%' oninput=\"{script}\"> "
                f"<span id='{key}-c'>{html.escape(self.captions[0])}</span>{frames}</div>")

    def __repr__(self):
        return f"<nnkit Frames: {len(self)} steps of a backward pass>"


def draw(root, show_data=False, show_grad=False, step=None, trace=None, names=None,
         rankdir="LR", inline=12):
    """Draw the graph that ``root`` was computed from; returns a Graph.

    ``show_data`` / ``show_grad`` print each node's value / gradient on it: arrays of at most
    ``inline`` elements in full, larger ones as shape, min, mean and max. ``step=k`` highlights
    the node processed at step k of the backward pass from ``root`` and shows the gradients
    known after that step (the pass is recorded with ``trace_back``, which leaves every ``.g``
    as it was, unless ``trace`` gives a recorded Trace). ``names`` maps names to nodes, e.g.
    ``names=globals()``, to label them (a node's own ``name`` is used otherwise). ``rankdir``
    is Graphviz's layout direction ("LR" left to right, "TB" top to bottom). Edges go from
    parent to child.
    """
    if not isinstance(root, NetVar):
        raise TypeError(f"draw: root must be a NetVar, got {type(root).__name__}")
    labels = {id(node): name for name, node in (names or {}).items()
              if isinstance(node, NetVar) and not name.startswith("_")}
    nodes = reachable(root)
    current = None
    gradients = None
    if step is not None:
        trace = trace_back(root) if trace is None else trace
        if trace and trace.root is not root:
            raise ValueError(f"draw: the trace records the backward pass from "
                             f"{describe(trace.root)}, not from {describe(root)}; draw "
                             "trace.root, or record this root's pass")
        if not trace:
            raise ValueError(f"draw: step={step} but the backward pass from {describe(root)} "
                             "has no steps (the root is a leaf)")
        gradients = trace.gradients(step)
        current = trace[step].node
    elif show_grad:
        gradients = {node.index: node._g for node in nodes if node._g is not None}
    lines = [f"digraph nnkit {{\n  rankdir={rankdir};",
             '  node [fontname="Helvetica", fontsize=11];',
             '  edge [color="#555555", arrowsize=0.7];']
    for node in nodes:
        attributes = dict(_STYLE[_kind(node)], tooltip=_escape(describe(node)))
        attributes["label"] = _label(node, labels.get(id(node)), show_data, gradients, inline)
        if node is root:
            attributes["peripheries"] = "2"
        if node is current:
            attributes.update(_CURRENT)
        listed = ", ".join(f'{key}="{value}"' for key, value in attributes.items())
        lines.append(f"  n{node.index} [{listed}];")
    for node in nodes:
        for parent in node.parents:
            flowing = ' [color="#c00000", penwidth=2, dir=back]' if node is current else ""
            lines.append(f"  n{parent.index} -> n{node.index}{flowing};")
        kept = getattr(node, "constant", None)       # a number or array the op keeps (x * 0.5)
        if kept is not None:
            value = numpy.asarray(kept)             # a Python number or a NumPy array
            text = ["constant", str(value.shape)] + (
                _values("data", value, inline) if show_data else [])
            listed = ", ".join(f'{key}="{value}"' for key, value in dict(
                _STYLE["constant"], label="\\n".join(_escape(t) for t in text)).items())
            lines.append(f"  k{node.index} [{listed}];")
            lines.append(f"  k{node.index} -> n{node.index};")
    lines.append("}")
    return Graph("\n".join(lines) + "\n")


def draw_trace(root, **options):
    """The backward pass from ``root``, one picture per step: Frames (Figure 4, animated).

    ``root`` is a node (its pass is recorded with ``trace_back``, which leaves every ``.g`` as it
    was) or a recorded Trace, e.g. from ``back(trace=True)``. Options are those of ``draw``.
    """
    trace = root if isinstance(root, Trace) else trace_back(root)
    return Frames([draw(trace.root, step=k, trace=trace, **options) for k in range(len(trace))],
                  [f"step {k}: {describe(step.node)}" for k, step in enumerate(trace)])


def _kind(node):
    if isinstance(node, NetOp):
        return "fused" if _time_length(node) is not None else "op"
    return "parameter" if node.requires_grad else "constant"


def _time_length(node):
    """The number of time steps a fused op runs over (its integer ``steps``), or None for an
    ordinary op: viz asks the node and knows no op class."""
    steps = getattr(node, "steps", None)
    return int(steps) if checks.is_integer(steps) else None


def _label(node, name, show_data, gradients, inline):
    """The node's text: title, shape, then optionally data and gradient (escaped for DOT)."""
    name = name or node.name
    if isinstance(node, NetOp):
        title = type(node).__name__ if not name else f"{name} = {type(node).__name__}"
        steps = _time_length(node)
        if steps is not None:
            title += f"  T={steps}"
    else:
        title = name or ("parameter" if node.requires_grad else "constant")
    lines = [title, str(tuple(node.shape))]
    if show_data:
        lines += _values("data", node._data, inline)
    if gradients is not None and node.requires_grad:
        gradient = gradients.get(node.index)
        lines += ["g: (not yet)"] if gradient is None else _values("g", gradient, inline)
    return "\\n".join(_escape(line) for line in lines)


def _values(title, array, inline):
    array = numpy.asarray(backend.to_cpu(array))
    if array.size <= inline:
        text = numpy.array2string(array, precision=3, suppress_small=False, separator=", ")
        rows = [row.strip() for row in text.splitlines()]
        return [f"{title} = {rows[0]}"] + rows[1:]
    return [f"{title}: min {array.min():.3g}  mean {array.mean():.3g}  max {array.max():.3g}"]


def _escape(text):
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _node_html(node):
    """A NetVar in Jupyter: a compact table with its data and, after back(), its gradient."""
    kind = "parameter" if node.requires_grad else "constant"
    if node.parents or isinstance(node, NetOp):
        kind = "op, needs gradient" if node.requires_grad else "op, no gradient"
    rows = [("node", html.escape(describe(node), quote=False)),
            ("shape", f"{tuple(node.shape)} {node.dtype} ({kind})"), ("data", _pre(node._data))]
    if node._g is not None:
        rows.append(("g", _pre(node._g)))
    body = "".join(f"<tr><th style='text-align:left'>{key}</th>"
                   f"<td style='text-align:left'>{value}</td></tr>" for key, value in rows)
    return f"<table>{body}</table>"


def _pre(array):
    text = preview(array, threshold=60, one_line=False)
    return f"<pre style='margin:0'>{html.escape(text, quote=False)}</pre>"


NetVar._repr_html_ = _node_html
