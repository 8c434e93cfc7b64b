"""Gradient checking: analytic gradients from ``back()`` against central finite differences.

``gradcheck(f, *inputs)`` returns True or raises GradcheckError naming the worst element;
``verbose=True`` also prints, per input, the analytic and numeric gradient side by side with
the wrong elements marked, so a learner writing a NetOp sees exactly what is off. The same
report is ``error.report`` on a GradcheckError (an HTML table in Jupyter).
"""
import html
import math

import numpy

from . import backend, checks
from .core import NetVar
from .modes import no_grad

__all__ = ['gradcheck', 'GradcheckError', 'GradcheckReport']


class GradcheckError(AssertionError):
    """An analytic gradient disagrees with the numeric one; ``.report`` shows every element."""

    def __init__(self, message, report=None):
        super().__init__(message)
        self.report = report


class _Input:
    """One checked input: where it is, its name, and both gradients (NumPy arrays)."""

    def __init__(self, position, x, analytic, numeric, atol, rtol):
        self.position = position
        self.name = f" '{x.name}'" if x.name else ""
        self.shape = tuple(x.shape)
        self.analytic = None if analytic is None else numpy.asarray(backend.to_cpu(analytic))
        self.numeric = None if numeric is None else numpy.asarray(backend.to_cpu(numeric))
        if self.numeric is None:
            self.excess = None
        else:
            self.excess = (numpy.abs(self.analytic - self.numeric)
                           - (atol + rtol * numpy.abs(self.numeric)))

    @property
    def checked(self):
        return self.numeric is not None

    @property
    def wrong(self):
        """The number of elements outside the tolerance."""
        return int((self.excess > 0).sum()) if self.checked else 0

    @property
    def title(self):
        head = f"input {self.position}{self.name} of shape {self.shape}"
        if not self.checked:
            return f"{head}: needs no gradient (not checked)"
        return f"{head}: {self.wrong} of {self.excess.size} elements wrong"

    def failure(self):
        """The error line for the worst element (the format GradcheckError has always had)."""
        index = numpy.unravel_index(int(self.excess.argmax()), self.shape)
        return (f"gradcheck: input {self.position}{self.name} of shape {self.shape}: worst "
                f"element {tuple(int(i) for i in index)} has analytic "
                f"{float(self.analytic[index]):.8g} but numeric {float(self.numeric[index]):.8g}")

    def rows(self, limit):
        """(index, analytic, numeric, |difference|, wrong) for up to ``limit`` elements.

        All of them for a small input, else the ``limit`` worst, in index order.
        """
        if not self.checked:
            return []
        flat = numpy.arange(self.excess.size)
        if self.excess.size > limit:
            flat = numpy.sort(numpy.argsort(-self.excess.reshape(-1), kind="stable")[:limit])
        rows = []
        for k in flat:
            index = numpy.unravel_index(int(k), self.shape)
            a, n = float(self.analytic[index]), float(self.numeric[index])
            rows.append((tuple(int(i) for i in index), a, n, abs(a - n),
                         bool(self.excess[index] > 0)))
        return rows


_WRONG = ' style="background:#f8c9c4"'


class GradcheckReport:
    """Analytic vs numeric gradient of every input, side by side (``print`` it, or show it
    in Jupyter). ``ok`` is True when every element is within atol + rtol·|numeric|; ``limit``
    caps the elements listed per input (the worst ones are kept).
    """

    def __init__(self, inputs, limit=24):
        self.inputs = inputs
        self.limit = limit

    @property
    def ok(self):
        return all(entry.wrong == 0 for entry in self.inputs)

    def __bool__(self):
        return self.ok

    def failures(self):
        """One line per failing input, naming its worst element."""
        return [entry.failure() for entry in self.inputs if entry.wrong]

    def __str__(self):
        lines = [f"gradcheck: {'OK' if self.ok else 'WRONG GRADIENTS'}"]
        for entry in self.inputs:
            lines.append(entry.title)
            rows = entry.rows(self.limit)
            if not rows:
                continue
            if len(rows) < entry.excess.size:
                lines.append(f"  (the {len(rows)} worst elements)")
            lines.append(f"  {'element':<14}{'analytic':>16}{'numeric':>16}{'|difference|':>14}")
            for index, a, n, difference, wrong in rows:
                mark = "  <-- wrong" if wrong else ""
                lines.append(f"  {str(index):<14}{a:>16.8g}{n:>16.8g}{difference:>14.2e}{mark}")
        return "\n".join(lines)

    def _repr_html_(self):
        parts = [f"<p><b>gradcheck: {'OK' if self.ok else 'wrong gradients'}</b></p>"]
        for entry in self.inputs:
            parts.append(f"<p>{html.escape(entry.title, quote=False)}</p>")
            rows = "".join(
                f"<tr{_WRONG if wrong else ''}><td>{index}</td>"
                f"<td>{a:.8g}</td><td>{n:.8g}</td><td>{difference:.2e}</td></tr>"
                for index, a, n, difference, wrong in entry.rows(self.limit))
            if rows:
                parts.append("<table><tr><th>element</th><th>analytic</th><th>numeric</th>"
                             f"<th>|difference|</th></tr>{rows}</table>")
        return "".join(parts)


def _weighted_sum(out, weights):
    return float(backend.to_cpu((out.data * weights).sum()))


def gradcheck(f, *inputs, eps=1e-6, atol=1e-6, rtol=1e-5, seed=0, raise_on_error=True,
              verbose=False):
    """Check ``f(*inputs)``'s gradients against central finite differences, in float64.

    ``f`` takes the NetVars in ``inputs`` and returns a node. The output is reduced to a
    scalar with fixed random weights R (so every output element is checked): the analytic
    gradient comes from ``f(*inputs).back(R)``, the numeric one from
    (F(x + eps) − F(x − eps)) / 2eps with F = Σ R·f. An element passes when
    |analytic − numeric| ≤ atol + rtol·|numeric|. Inputs with ``requires_grad=False`` are
    skipped. On a mismatch raises GradcheckError naming the input, the worst element and both
    values (its ``.report`` lists every element); returns True otherwise (or False with
    ``raise_on_error=False``). ``verbose=True`` prints the GradcheckReport: per input, analytic
    and numeric gradients side by side with the wrong elements marked.
    """
    for name, value in (("eps", eps), ("atol", atol), ("rtol", rtol)):
        if not (checks.is_number(value) and math.isfinite(value)
                and (value > 0 if name == "eps" else value >= 0)):
            bound = "> 0" if name == "eps" else ">= 0"
            raise ValueError(f"gradcheck: {name} must be a finite number {bound}, got {value!r}")
    inputs = list(inputs)
    for position, x in enumerate(inputs):
        if not isinstance(x, NetVar):
            raise TypeError(f"gradcheck: input {position} is a {type(x).__name__}, not a NetVar")
        if x.requires_grad and x.dtype != numpy.float64:
            raise TypeError(f"gradcheck: input {position} has dtype {x.dtype}; finite "
                            "differences need float64 inputs")
    for x in inputs:
        x.reset()
    if not any(x.requires_grad for x in inputs):
        raise ValueError("gradcheck: no input requires a gradient, so nothing would be checked")
    out = f(*inputs)
    if not isinstance(out, NetVar):
        raise TypeError(f"gradcheck: f must return a node, got {type(out).__name__}")
    xp = backend.array_module(out.data)
    weights = xp.asarray(numpy.random.default_rng(seed).standard_normal(out.shape),
                         dtype=out.dtype)
    out.back(weights)
    analytic = [None if not x.requires_grad else x.g.copy() for x in inputs]
    for x in inputs:
        x.reset()

    checked = []
    with no_grad():
        for position, x in enumerate(inputs):
            numeric = None
            if x.requires_grad:
                flat = x._data.reshape(-1)
                numeric = xp.zeros(x.size, dtype=numpy.float64)
                for k in range(x.size):
                    saved = flat[k].copy()
                    flat[k] = saved + eps
                    plus = _weighted_sum(f(*inputs), weights)
                    flat[k] = saved - eps
                    minus = _weighted_sum(f(*inputs), weights)
                    flat[k] = saved
                    numeric[k] = (plus - minus) / (2 * eps)
                numeric = numeric.reshape(x.shape)
            checked.append(_Input(position, x, analytic[position], numeric, atol, rtol))
    report = GradcheckReport(checked)
    if verbose:
        print(report)
    if not report.ok:
        if raise_on_error:
            raise GradcheckError("\n".join(report.failures()), report)
        return False
    return True
