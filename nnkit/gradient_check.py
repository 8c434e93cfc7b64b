"""Gradient checking: analytic gradients from ``back()`` against central finite differences.

``gradcheck(f, *inputs)`` returns True or raises GradcheckError naming the worst element;
``gradgradcheck(f, *inputs)`` does the same for second derivatives (``grad(create_graph=True)``);
``verbose=True`` also prints, per input, the analytic and numeric gradient side by side with
the wrong elements marked, so a learner writing a NetOp sees exactly what is off. The same
report is ``error.report`` on a GradcheckError (an HTML table in Jupyter).
"""
import html
import math

import numpy

from . import backend, checks
from .autodiff import grad
from .core import NetVar
from .gradients import hold_gradients, restore_gradients
from .ops.shape import Reshape

__all__ = ['gradcheck', 'gradgradcheck', 'GradcheckError', 'GradcheckReport']


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
        else:           # NaN (a NaN or an infinite gradient on either side) counts as wrong
            excess = (numpy.abs(self.analytic - self.numeric)
                      - (atol + rtol * numpy.abs(self.numeric)))
            self.excess = numpy.where(numpy.isnan(excess), numpy.inf, excess)

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

    def failure(self, title="gradcheck"):
        """The error line for the worst element (the format GradcheckError has always had)."""
        index = numpy.unravel_index(int(self.excess.argmax()), self.shape)
        return (f"{title}: input {self.position}{self.name} of shape {self.shape}: worst "
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

    def __init__(self, inputs, limit=24, title="gradcheck"):
        self.inputs = inputs
        self.limit = limit
        self.title = title

    @property
    def ok(self):
        return all(entry.wrong == 0 for entry in self.inputs)

    def __bool__(self):
        return self.ok

    def failures(self):
        """One line per failing input, naming its worst element."""
        return [entry.failure(self.title) for entry in self.inputs if entry.wrong]

    def __str__(self):
        lines = [f"{self.title}: {'OK' if self.ok else 'WRONG GRADIENTS'}"]
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
        parts = [f"<p><b>{self.title}: {'OK' if self.ok else 'wrong gradients'}</b></p>"]
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


def _check_arguments(check, eps, atol, rtol, inputs):
    for name, value in (("eps", eps), ("atol", atol), ("rtol", rtol)):
        if not (checks.is_number(value) and math.isfinite(value)
                and (value > 0 if name == "eps" else value >= 0)):
            bound = "> 0" if name == "eps" else ">= 0"
            raise ValueError(f"{check}: {name} must be a finite number {bound}, got {value!r}")
    for position, x in enumerate(inputs):
        if not isinstance(x, NetVar):
            raise TypeError(f"{check}: input {position} is a {type(x).__name__}, not a NetVar")
        if x.requires_grad and x.dtype != numpy.float64:
            raise TypeError(f"{check}: input {position} has dtype {x.dtype}; finite "
                            "differences need float64 inputs")
    if not any(x.requires_grad for x in inputs):
        raise ValueError(f"{check}: no input requires a gradient, so nothing would be checked")


def _output(check, out):
    if not isinstance(out, NetVar):
        raise TypeError(f"{check}: f must return a node, got {type(out).__name__}")
    return out


def _central_differences(x, evaluate, eps, xp):
    """(F(x + eps) − F(x − eps)) / 2eps for each element of x in turn, F being ``evaluate()``."""
    data = x._data             # (indexed in place: a reshape of a strided array is a copy)
    numeric = xp.zeros(x.size, dtype=numpy.float64)
    for k in range(x.size):
        at = numpy.unravel_index(k, x.shape)
        saved = data[at].copy()
        try:
            data[at] = saved + eps
            plus = evaluate()
            data[at] = saved - eps
            minus = evaluate()
        finally:                # f may raise: the input is put back all the same
            data[at] = saved
        numeric[k] = (plus - minus) / (2 * eps)
    return numeric.reshape(x.shape)


def _verdict(report, verbose, raise_on_error):
    if verbose:
        print(report)
    if not report.ok:
        if raise_on_error:
            raise GradcheckError("\n".join(report.failures()), report)
        return False
    return True


def gradcheck(f, *inputs, eps=1e-6, atol=1e-6, rtol=1e-5, seed=0, raise_on_error=True,
              verbose=False):
    """Check ``f(*inputs)``'s gradients against central finite differences, in float64.

    ``f`` takes the NetVars in ``inputs`` and returns a node. The output is reduced to a
    scalar with fixed random weights R (so every output element is checked): the analytic
    gradient comes from ``f(*inputs).back(R)``, the numeric one from
    (F(x + eps) − F(x − eps)) / 2eps with F = Σ R·f. An element passes when
    |analytic − numeric| ≤ atol + rtol·|numeric| (a NaN or infinite gradient never passes).
    Before that, ``back(R)`` onto a gradient each leaf input already holds must add the same
    gradient to it (an op that assigns ``x.g = ...`` instead of adding loses another
    consumer's share, which no single pass from zero shows). Inputs with
    ``requires_grad=False`` are skipped. On a mismatch raises GradcheckError naming the input,
    the worst element and both values (its ``.report`` lists every element); returns True
    otherwise (or False with ``raise_on_error=False``). ``verbose=True`` prints the
    GradcheckReport: per input, analytic and numeric gradients side by side with the wrong
    elements marked. f runs 2 + 2·(the inputs' sizes) times, in the grad mode of the caller
    (f may take gradients itself): state it changes, such as BatchNorm's running statistics in
    training mode, changes as often; check such ops in ``eval_mode()`` or on a copy.
    """
    inputs = list(inputs)
    _check_arguments("gradcheck", eps, atol, rtol, inputs)
    out = _output("gradcheck", f(*inputs))
    xp = backend.array_module(out.data)
    weights = xp.asarray(numpy.random.default_rng(seed).standard_normal(out.shape),
                         dtype=out.dtype)
    found = iter(grad(out, [x for x in inputs if x.requires_grad], g=weights))   # .g untouched
    analytic = [next(found) if x.requires_grad else None for x in inputs]

    added = _added_by_back(f, inputs, weights, seed)
    if added is not None:
        report = GradcheckReport(
            [_Input(position, x, added[position], analytic[position], atol, rtol)
             for position, x in enumerate(inputs) if added[position] is not None],
            title="gradcheck (what back() added to a gradient the input held, against grad())")
        if not report.ok:
            return _verdict(report, verbose, raise_on_error)

    checked = []        # (f runs with grad mode as it is: it may take gradients itself)
    for position, x in enumerate(inputs):
        numeric = None
        if x.requires_grad:
            numeric = _central_differences(
                x, lambda: _weighted_sum(f(*inputs), weights), eps, xp)
        checked.append(_Input(position, x, analytic[position], numeric, atol, rtol))
    return _verdict(GradcheckReport(checked), verbose, raise_on_error)


def _added_by_back(f, inputs, weights, seed):
    """What ``f(*inputs).back(weights)`` adds to the gradient each leaf input already holds
    (None for the others), with every ``.g`` put back afterwards; None when f's output needs
    no gradient. An op's ``_back`` that assigns ``x.g = ...`` instead of adding gives the right
    gradient to an input that starts from none (what ``grad()`` and the finite differences
    see) but loses what another consumer, or an earlier ``back()``, had put there."""
    xp = backend.array_module(weights)
    rng = numpy.random.default_rng(seed + 1)
    leaves = [x for x in inputs if x.requires_grad and not x._parents]
    saved = hold_gradients(leaves)
    try:
        held = {}
        for x in leaves:
            held[id(x)] = xp.asarray(rng.standard_normal(x.shape), dtype=x.dtype)
            x.g = held[id(x)].copy()
        out = f(*inputs)
        if not (isinstance(out, NetVar) and out.requires_grad):
            return None
        out.back(weights)
        return [x._g - held[id(x)] if id(x) in held else None for x in inputs]
    finally:
        restore_gradients(saved)


def gradgradcheck(f, *inputs, eps=1e-6, atol=1e-5, rtol=1e-4, seed=0, raise_on_error=True,
                  verbose=False):
    """Check ``f(*inputs)``'s second derivatives: finite differences of the analytic gradient
    against the analytic second derivative from ``grad(create_graph=True)``, in float64.

    With fixed random weights R (shaped like the output) and V_i (like each input x_i), the
    checked function is the scalar F = Σ_i ⟨V_i, ∂⟨R, f⟩/∂x_i⟩. Its analytic gradient comes
    from backpropagating through the gradients that ``grad(..., create_graph=True)`` built; its
    numeric gradient from central differences of F, each F computed with first-order
    gradients (``create_graph=False``, the ops' ``_back``). Both are compared for every input
    and for R itself (listed last, as "the upstream gradient": it checks how each ``_grads``
    uses its upstream gradient ``g``). First, the first-order gradients that
    ``grad(create_graph=True)`` builds must equal those of ``_back`` (a rule off by a constant
    would pass the second-order test, and a gradient penalty uses these values): a mismatch is
    reported as "gradgradcheck (first order, create_graph=True against back())". The report,
    return value and errors are those of ``gradcheck``.
    """
    inputs = list(inputs)
    _check_arguments("gradgradcheck", eps, atol, rtol, inputs)
    wanted = [x for x in inputs if x.requires_grad]
    out = _output("gradgradcheck", f(*inputs))
    xp = backend.array_module(out.data)
    rng = numpy.random.default_rng(seed)
    weights = xp.asarray(rng.standard_normal(out.shape), dtype=out.dtype)
    directions = [xp.asarray(rng.standard_normal(x.shape), dtype=x.dtype) for x in wanted]
    upstream = NetVar(weights.reshape(out.shape if out.ndim >= 2 else (1, -1)),
                      name="the upstream gradient")

    def first_order(seed_weights):
        found = grad(f(*inputs), wanted, g=seed_weights)
        return float(sum(backend.to_cpu((g * v).sum()) for g, v in zip(found, directions)))

    found = grad(out, wanted, g=Reshape(upstream, out.shape), create_graph=True)
    plain = grad(out, wanted, g=weights)
    first = GradcheckReport(
        [_Input(position, x, node.data, array, atol, rtol) for position, x, node, array
         in zip([k for k, x in enumerate(inputs) if x.requires_grad], wanted, found, plain)],
        title="gradgradcheck (first order, create_graph=True against back())")
    if not first.ok:
        return _verdict(first, verbose, raise_on_error)
    total = sum(((g * v).sum() for g, v in zip(found, directions)))
    everything = wanted + [upstream]
    if total.requires_grad:
        analytic = grad(total, everything)
    else:                       # every gradient is a constant: the second derivatives are 0
        analytic = [xp.zeros_like(x._data) for x in everything]
    by_input = dict(zip(map(id, everything), analytic))

    checked = []
    for position, x in enumerate(inputs + [upstream]):
        numeric = None
        if x.requires_grad:
            if x is upstream:
                evaluate = lambda: first_order(upstream._data.reshape(out.shape))  # noqa: E731
            else:
                evaluate = lambda: first_order(weights)  # noqa: E731
            numeric = _central_differences(x, evaluate, eps, xp)
        checked.append(_Input(position, x, by_input.get(id(x)), numeric, atol, rtol))
    return _verdict(GradcheckReport(checked, title="gradgradcheck"), verbose, raise_on_error)
