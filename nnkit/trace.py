"""A recorded backward pass: what ``node.back(trace=True)`` returns.

Each step is one op's ``_back``, in execution order: the node, the upstream gradient g it
received, the local rule (the formulas of its docstring) and what it added to each
parent's gradient. A Trace prints as text and shows as an HTML table in Jupyter; ``nnkit.viz``
draws it (``draw(root, step=k, trace=trace)``, ``draw_trace(trace)``), and this module does not
import viz: viz sits above it.
"""
import html
import inspect
import re

from . import core
from .arraylike import preview
from .core import NetVar
from .gradients import hold_gradients, restore_gradients

__all__ = ['Trace', 'TraceStep', 'trace_back']


def local_rule(op_class):
    """The formulas of an op's docstring: each line stating ``... = ...`` (``y = ...``,
    ``dx = ...``, ``training:  y = ...``) and the indented lines continuing one, not the prose
    around them; the lines after the summary when there is no formula."""
    lines = inspect.cleandoc(op_class.__doc__ or "").splitlines()
    body = lines[lines.index("") + 1:] if "" in lines else lines[1:]
    rule, above = [], None          # above: the indent of the formula a line may continue
    for line in lines:
        indent = len(line) - len(line.lstrip())
        if _states(line):
            rule.append(line.rstrip())
            above = indent
        elif above is not None and indent > above and line.strip():
            rule.append(line.rstrip())
        else:
            above = None
    return "\n".join(rule or [line.strip() for line in body if line.strip()]) or \
        "(no formula documented)"


_LABEL = re.compile(r"[A-Za-z][\w ]*(\([^)]*\))?[\w ]*:")      # "training:", "backward (t ...):"


def _states(line):
    """Whether a docstring line states a formula: after an optional label (``training:``),
    what comes before its first `` = `` is math, with no word of prose in it."""
    text = line.strip()
    label = _LABEL.match(text)
    if label:
        text = text[label.end():]
    if " = " not in text:
        return False
    before = text.split(" = ")[0].strip()
    return len(before) <= 48 and not re.search(r"[a-z]{4,}", before)


def describe(node):
    """``Multiply #12`` or ``NetVar 'w1' #3``: the node's kind, name and creation index."""
    name = f" '{node.name}'" if node.name else ""
    return f"{type(node).__name__}{name} #{node.index}"


class TraceStep:
    """One step of a backward pass: ``node._back`` ran with upstream gradient ``upstream``.

    ``added[i]`` is what it added to the gradient of ``node.parents[i]`` (None for an input
    that needs no gradient; an input used twice, as in ``x * x``, shows the total added to it
    at each of its positions).
    """
    __slots__ = ("node", "upstream", "added")

    def __init__(self, node, upstream, added):
        self.node = node
        self.upstream = upstream
        self.added = added

    @property
    def parents(self):
        return self.node.parents

    @property
    def rule(self):
        """The op's local rule, from its docstring."""
        return local_rule(type(self.node))

    def __repr__(self):
        return f"<TraceStep {describe(self.node)} g={preview(self.upstream)}>"


class Trace(list):
    """The steps of one backward pass, in the order they ran (children before parents).

    ``str(trace)`` is a text listing, ``trace._repr_html_()`` a table for Jupyter,
    ``trace.gradients(k)`` the gradients known after step k. Pictures come from ``nnkit.viz``:
    ``nn.draw(trace.root, step=k, trace=trace)`` highlights step k, ``nn.draw_trace(trace)``
    draws every step.
    """

    def __init__(self, steps=()):
        super().__init__(TraceStep(*s) if isinstance(s, tuple) else s for s in steps)

    @property
    def root(self):
        """The node ``back()`` started from (the first step's node), or None when empty."""
        return self[0].node if self else None

    def gradients(self, step=None):
        """``{node.index: gradient}`` known once step ``step`` has run (all steps when None).

        The root holds its seed from the start; every other node holds the sum of what the
        steps so far added to it.
        """
        if not self:
            return {}
        last = len(self) - 1 if step is None else step
        if not -len(self) <= last < len(self):
            raise IndexError(f"Trace: step {step} out of range for a trace of {len(self)} steps")
        last %= len(self)
        known = {self.root.index: self[0].upstream}
        for done in self[:last + 1]:
            counted = set()
            for parent, added in zip(done.parents, done.added):
                if added is None or parent.index in counted:
                    continue      # an input used twice (x * x) shows its total at each position
                counted.add(parent.index)
                old = known.get(parent.index)
                known[parent.index] = added if old is None else old + added
        return known

    def __str__(self):
        lines = []
        for k, step in enumerate(self):
            node = step.node
            lines.append(f"step {k}: {describe(node)} shape={tuple(node.shape)}")
            lines.append(f"    upstream g = {preview(step.upstream)}")
            rule = step.rule.splitlines()
            lines.append(f"    rule: {rule[0]}")
            lines.extend(f"          {line}" for line in rule[1:])
            for position, (parent, added) in enumerate(zip(node.parents, step.added)):
                lines.append(f"    -> input {position} ({describe(parent)}) += {preview(added)}")
        return "\n".join(lines)

    def _repr_html_(self):
        def pre(text):
            return f"<pre style='margin:0'>{html.escape(text)}</pre>"

        rows = []
        for k, step in enumerate(self):
            node = step.node
            added = "".join(
                f"<div>input {position} ({html.escape(describe(parent))}) +=</div>"
                f"{pre(preview(gradient, threshold=12))}"
                for position, (parent, gradient) in enumerate(zip(node.parents, step.added)))
            rows.append(f"<tr><td>{k}</td><td>{html.escape(describe(node))}<br>"
                        f"{tuple(node.shape)}</td><td>{pre(preview(step.upstream, 12))}</td>"
                        f"<td>{pre(step.rule)}</td><td>{added}</td></tr>")
        head = ("<tr><th>step</th><th>node</th><th>upstream g</th><th>local rule</th>"
                "<th>added to each input</th></tr>")
        return (f"<table style='text-align:left'>{head}{''.join(rows)}</table>"
                if rows else "<p>(empty trace: the root is a leaf)</p>")


class Recorder:
    """The engine observer of ``back(trace=True)``: notes each step's upstream gradient and what
    it added to each parent's gradient, and gives them as a Trace."""
    checks_values = False

    def __init__(self):
        self.steps = []
        self._before = None

    def forward(self, node, parents):
        pass

    def before(self, node):
        self._before = [None if p._g is None else p._g.copy() for p in node._parents]
        self._upstream = node._g.copy()

    def after(self, node):
        added = []
        for parent, old in zip(node._parents, self._before):
            if parent._g is None or not parent.requires_grad:
                added.append(None)
            elif old is None:
                added.append(parent._g.copy())
            else:
                added.append(parent._g - old)
        self.steps.append((node, self._upstream, tuple(added)))

    def trace(self):
        return Trace(self.steps)


core.recorder = Recorder      # back(trace=True) records with it (the engine imports no observer)


def trace_back(root, g=None):
    """Record ``root.back(g)`` as a Trace, leaving every node's gradient as it was.

    The same steps as ``root.back(g, trace=True)``, but leaf gradients do not accumulate and
    the gradients of a previous ``back()`` stay in place, so pictures can be drawn at any time.
    """
    if not isinstance(root, NetVar):
        raise TypeError(f"trace_back: root must be a NetVar, got {type(root).__name__}")
    nodes = core.collect((root,), every=True)
    held = hold_gradients(nodes)
    for node in nodes:
        node._g = None
    try:
        return root.back(g, trace=True)
    finally:
        restore_gradients(held)


def reachable(root):
    """Every node ``root`` depends on (itself included), in creation order."""
    return core.collect((root,), every=True)[::-1]
