"""Einsum: NumPy's Einstein summation over one, two or more operands, with its backward.

Notation: operands x₁ … xₙ with subscripts s₁ … sₙ, output y with subscripts o, upstream
gradient g (subscripts o). The gradient of each operand is another einsum: g and the other
operands, summed to that operand's subscripts.
"""

__all__ = ['Einsum']
import string

import numpy

from .. import backend
from ..core import NetOp, NetVar, constant

_LETTERS = string.ascii_letters


def _shapes(shapes):
    return ", ".join(str(tuple(s)) for s in shapes)


class _Subscripts:
    """Subscripts parsed and checked against the operands' shapes as NumPy's einsum checks them,
    with every axis named by a letter: ``terms`` (one string per operand), ``output``, the
    ``spare`` letters no axis uses, and ``text``, the subscripts in that form (explicit output,
    each '...' replaced by letters of its own, right-aligned as broadcasting aligns axes)."""

    def __init__(self, subscripts, shapes):
        self.given, self.shapes = subscripts, shapes
        if not isinstance(subscripts, str):
            raise TypeError(f"Einsum: subscripts must be a string such as 'ij,jk->ik', got "
                            f"{type(subscripts).__name__} {subscripts!r}")
        text = subscripts.replace(" ", "")
        left, arrow, right = text.partition("->")
        if "-" in left + right or ">" in left + right:
            self.fail("'->' may appear once, between the inputs and the output")
        parts = [self.split(term, f"operand {k}") for k, term in enumerate(left.split(","))]
        if len(parts) != len(shapes):
            self.fail(f"they name {len(parts)} operand{'s' * (len(parts) != 1)}, "
                      f"{len(shapes)} given")
        spare = [c for c in _LETTERS if c not in text]
        extra = []          # the number of '...' axes of each operand
        for k, ((before, after, dots), shape) in enumerate(zip(parts, shapes)):
            named = len(before) + len(after)
            if len(shape) < named or (not dots and len(shape) != named):
                row = (" (NetVar makes 1-D data a (1, n) row: reshape it to (n,), or name its "
                       "first axis too)" if len(shape) == named + 1 and shape[0] == 1 else "")
                self.fail(f"operand {k} of shape {tuple(shape)} has {len(shape)} axes, its "
                          f"subscripts {before + '...' * dots + after!r} name {named}"
                          f"{' and more with ...' if dots else ''}{row}")
            extra.append(len(shape) - named)
        ellipsis = max(extra, default=0)
        repeats = max((len(b + a) - len(set(b + a)) for b, a, _ in parts), default=0)
        if ellipsis + repeats > len(spare):
            self.fail(f"'...' stands for {ellipsis} axes, more than the {len(spare)} letters "
                      "no subscript uses")
        dots_letters, self.spare = "".join(spare[:ellipsis]), "".join(spare[ellipsis:])
        self.ellipsis = set(dots_letters)
        self.terms = [before + dots_letters[ellipsis - e:] + after
                      for (before, after, _), e in zip(parts, extra)]
        used = "".join(self.terms)
        if arrow:
            before, after, dots = self.split(right, "the output")
            for c in before + after:
                if (before + after).count(c) > 1:
                    self.fail(f"the output names {c!r} twice")
                if c not in used:
                    self.fail(f"the output names {c!r}, which no operand has")
            if ellipsis and not dots:
                self.fail(f"the operands' '...' stands for {ellipsis} axes, which the output "
                          "must keep: write '...' in the output")
            self.output = before + dots_letters + after
        else:          # NumPy's implicit output: '...', then the letters used once, sorted
            self.output = dots_letters + "".join(sorted(
                c for c in set(used) - self.ellipsis if used.count(c) == 1))
        self.check_sizes()
        self.text = ",".join(self.terms) + "->" + self.output

    def fail(self, detail):
        raise ValueError(f"Einsum: subscripts {self.given!r} with operands of shapes "
                         f"({_shapes(self.shapes)}): {detail}")

    def split(self, term, what):
        """(letters before '...', letters after it, whether there is one)."""
        before, dots, after = term.partition("...")
        if "." in before + after:
            self.fail(f"{what}'s subscripts {term!r} hold a '.' that is not part of one '...'")
        for c in before + after:
            if c not in _LETTERS:
                self.fail(f"{what}'s subscripts {term!r} hold {c!r}; subscripts are letters "
                          "a-z, A-Z")
        return before, after, bool(dots)

    def name(self, c):
        return "an axis of '...'" if c in self.ellipsis else f"index {c!r}"

    def check_sizes(self):
        """Each letter has one size on every axis it names in one operand (a diagonal), and
        across operands one size or 1 (broadcast)."""
        sizes = {}
        for k, (term, shape) in enumerate(zip(self.terms, self.shapes)):
            mine = {}
            for c, n in zip(term, shape):
                if mine.setdefault(c, n) != n:
                    self.fail(f"{self.name(c)} names axes of sizes {mine[c]} and {n} in "
                              f"operand {k} of shape {tuple(shape)}; a repeated index takes a "
                              "diagonal, whose axes must have one size")
            for c, n in mine.items():
                seen, first = sizes.get(c, (1, None))
                if n != 1 and seen != 1 and n != seen:
                    self.fail(f"{self.name(c)} has size {seen} in operand {first} of shape "
                              f"{tuple(self.shapes[first])} and {n} in operand {k} of shape "
                              f"{tuple(shape)}")
                if n != 1 or c not in sizes:
                    sizes[c] = (n, k)

    def gradient(self, k, shape):
        """(subscripts, eyes, renamed, kept) of operand k's gradient: g and the other operands
        summed to operand k's letters. A letter repeated in the operand (a diagonal) is renamed
        at its later axes and tied to its first by an identity matrix (``eyes`` lists their
        sizes); ``renamed`` is the operand's letters so renamed, and ``kept`` those of them the
        inputs of the gradient have (a letter only operand k has is summed in the forward pass:
        its gradient is constant along that axis)."""
        spare, renamed, inputs, eyes = iter(self.spare), [], [self.output], []
        inputs += [term for j, term in enumerate(self.terms) if j != k]
        for axis, c in enumerate(self.terms[k]):
            if c in renamed:
                twin = next(spare)
                inputs.append(c + twin)
                eyes.append(shape[axis])
                c = twin
            renamed.append(c)
        present = set("".join(inputs))
        kept = "".join(c for c in renamed if c in present)
        return ",".join(inputs) + "->" + kept, eyes, "".join(renamed), kept


def _einsum(xp, subscripts, arrays):
    # NumPy's einsum contracts pairs with BLAS (tensordot, batched matmul) only when asked to
    # optimize; one operand has nothing to order.
    return xp.einsum(subscripts, *arrays, optimize=len(arrays) > 1)


class Einsum(NetOp):
    """Einstein summation, as ``numpy.einsum(subscripts, *operands)``.

    y = einsum(s₁,…,sₙ->o, x₁, …, xₙ)
    dxₖ = einsum(o,s₁,…(without sₖ)…,sₙ->sₖ, g, x₁, …(without xₖ)…, xₙ)
    (a diagonal 'ii' gets its gradient on the diagonal; along an index only xₖ has, summed in
    the forward pass, the gradient is copied; an operand broadcast along '...' or along an
    index of size 1 gets its gradient summed back to its shape.)

    ``subscripts``: NumPy's, letters a-z and A-Z, ',' between operands, spaces ignored:
    ``'ij,jk->ik'``, ``'bhqd,bhkd->bhqk'``, ``'ii->i'`` (a diagonal), ``'ii'`` (a trace),
    ``'...ij,...jk->...ik'`` (batch axes, broadcast). Both of NumPy's modes: explicit with
    ``->`` (the output lists its indices; every '...' axis must appear there), or implicit
    without it (the output is '...' then the indices used once, in alphabetical order, upper
    case first: ``'ij,jk'`` is ``'ij,jk->ik'``, ``'ji'`` transposes). Repeated indices within
    one operand take a diagonal (its axes must have one size); across operands an index has
    one size, or 1 (broadcast). Operands are NetVars or arrays (constants); errors name the
    subscripts and every operand's shape. Contractions of two or more operands run through
    NumPy's (or CuPy's) optimized path: BLAS products where the subscripts allow.
    """
    __slots__ = ("parsed",)

    def __init__(self, subscripts, *operands):
        like = next((x for x in operands if isinstance(x, NetVar)), None)
        # plain operands as the arithmetic ops take them: integers in a node operand's dtype
        operands = tuple(x if isinstance(x, NetVar) else constant(x, like) for x in operands)
        arrays = [x._data for x in operands]
        if not operands:
            raise ValueError(f"Einsum: subscripts {subscripts!r} with no operand; give one or "
                             "more")
        xp = backend.array_module(arrays[0])
        if any(backend.array_module(a) is not xp for a in arrays):
            backend.check_same_device("Einsum", *arrays)
        self.parsed = parsed = _Subscripts(subscripts, [a.shape for a in arrays])
        super().__init__(_einsum(xp, parsed.text, arrays), *operands)

    def _back(self, *operands):
        g = self._g
        xp = backend.array_module(g)
        for k, x in enumerate(operands):
            if not x.requires_grad:
                continue
            shape = x._data.shape
            subscripts, eyes, renamed, kept = self.parsed.gradient(k, shape)
            arrays = [g] + [y._data for j, y in enumerate(operands) if j != k]
            arrays += [xp.eye(n, dtype=g.dtype) for n in eyes]
            dx = _einsum(xp, subscripts, arrays)
            if len(kept) < len(renamed):      # axes only x has: length 1 here, copied below
                dx = dx.reshape(tuple(dx.shape[kept.index(c)] if c in kept else 1
                                      for c in renamed))
            if dx.shape != shape:             # copied along them, summed where x was broadcast
                dx = xp.broadcast_to(dx, numpy.broadcast_shapes(dx.shape, shape))
            x.accumulate(dx)

    def _grads(self, g, *operands):
        # The same einsums as _back, each built as an Einsum node: every gradient is again
        # differentiable (with respect to g and to the other operands).
        grads = []
        for k, x in enumerate(operands):
            if not x.requires_grad:
                grads.append(None)
                continue
            shape = x._data.shape
            subscripts, eyes, renamed, kept = self.parsed.gradient(k, shape)
            xp = backend.array_module(x._data)
            others = [y for j, y in enumerate(operands) if j != k]
            dx = Einsum(subscripts, g, *others, *(xp.eye(n, dtype=g._data.dtype) for n in eyes))
            if len(kept) < len(renamed):      # axes only x has: length 1 here, copied below
                dx = dx.reshape(tuple(dx.shape[kept.index(c)] if c in kept else 1
                                      for c in renamed))
            if dx.shape != shape:             # copied along them (grad sums broadcast axes back)
                dx = dx.broadcast_to(numpy.broadcast_shapes(dx.shape, shape))
            grads.append(dx)
        return tuple(grads)
