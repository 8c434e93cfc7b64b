"""Gradient checking: analytic gradients from ``back()`` against central finite differences."""
import numpy

from . import backend
from .core import NetVar, no_grad


class GradcheckError(AssertionError):
    """An analytic gradient disagrees with the numeric one."""


def _weighted_sum(out, weights):
    return float(backend.to_cpu((out.data * weights).sum()))


def gradcheck(f, *inputs, eps=1e-6, atol=1e-6, rtol=1e-5, seed=0, raise_on_error=True):
    """Check ``f(*inputs)``'s gradients against central finite differences, in float64.

    ``f`` takes the NetVars in ``inputs`` and returns a node. The output is reduced to a
    scalar with fixed random weights R (so every output element is checked): the analytic
    gradient comes from ``f(*inputs).back(R)``, the numeric one from
    (F(x + eps) − F(x − eps)) / 2eps with F = Σ R·f. Inputs with ``requires_grad=False`` are
    skipped. On a mismatch raises GradcheckError naming the input, the worst element and both
    values; returns True otherwise (or False with ``raise_on_error=False``).
    """
    inputs = list(inputs)
    for position, x in enumerate(inputs):
        if not isinstance(x, NetVar):
            raise TypeError(f"gradcheck: input {position} is a {type(x).__name__}, not a NetVar")
        if x.requires_grad and x.dtype != numpy.float64:
            raise TypeError(f"gradcheck: input {position} has dtype {x.dtype}; finite "
                            "differences need float64 inputs")
    for x in inputs:
        x.reset()
    out = f(*inputs)
    xp = backend.array_module(out.data)
    weights = xp.asarray(numpy.random.default_rng(seed).standard_normal(out.shape),
                         dtype=out.dtype)
    out.back(weights)
    analytic = [None if not x.requires_grad else x.g.copy() for x in inputs]
    for x in inputs:
        x.reset()

    report = []
    with no_grad():
        for position, x in enumerate(inputs):
            if not x.requires_grad:
                continue
            data = x._data
            flat = data.reshape(-1)
            numeric = xp.zeros(data.size, dtype=numpy.float64)
            for k in range(data.size):
                saved = flat[k].copy()
                flat[k] = saved + eps
                plus = _weighted_sum(f(*inputs), weights)
                flat[k] = saved - eps
                minus = _weighted_sum(f(*inputs), weights)
                flat[k] = saved
                numeric[k] = (plus - minus) / (2 * eps)
            numeric = numeric.reshape(data.shape)
            error = xp.abs(analytic[position] - numeric) - (atol + rtol * xp.abs(numeric))
            worst = int(backend.to_cpu(error).argmax()) if error.size else 0
            if error.size and float(error.reshape(-1)[worst]) > 0:
                index = numpy.unravel_index(worst, data.shape)
                name = f" '{x.name}'" if x.name else ""
                report.append(
                    f"gradcheck: input {position}{name} of shape {tuple(data.shape)}: worst "
                    f"element {tuple(int(i) for i in index)} has analytic "
                    f"{float(analytic[position][index]):.8g} but numeric "
                    f"{float(numeric[index]):.8g}")
    if report:
        if raise_on_error:
            raise GradcheckError("\n".join(report))
        return False
    return True
