# %% [markdown]
# # Chapter 2: Writing an op
#
# Every op in nnkit is written the same way, built-in or yours: the forward computation in the
# constructor, the backward rule in `_back`, and the formulas in the docstring. In this chapter
# you write the article's `Multiply` (its Code 2) yourself, check it against finite
# differences with `nn.gradcheck`, and watch `gradcheck` catch a wrong rule.
#
# You will learn
#
# - the two halves of an op: `__init__` computes the value, `_back` hands each parent its share
#   of the upstream gradient `self.g`;
# - how to derive a backward rule from the forward formula;
# - how `nn.gradcheck(..., verbose=True)` shows which element of which input is wrong.

# %%
import numpy as np
import nnkit as nn

# %% [markdown]
# ## The rule of an op
#
# An op `y = f(x, w)` receives, in `_back`, the gradient of the root with respect to its own
# value, `g = ∂L/∂y` (`self.g`, shaped like `y`). The chain rule gives each parent's share:
# `∂L/∂x = ∂L/∂y · ∂y/∂x`. For a matrix product `y = x·w` of a `(B, F)` batch and an `(F, H)`
# weight, written out element by element and summed, that is
#
# | input | forward | backward |
# |---|---|---|
# | `x` `(B, F)` | `y = x · w` | `dx = g · wᵀ` `(B, H)·(H, F)` |
# | `w` `(F, H)` | | `dw = xᵀ · g` `(F, B)·(B, H)` |
#
# The shapes are a good check: each gradient has the shape of its input. `_back` *adds* to
# `x.g` and `w.g` (`+=`) rather than setting them, because a node used by several ops receives a
# share from each (chapter 3 is about that).

# %%
class MyMultiply(nn.NetOp):
    """Multiplication.

    y = x @ w
    dx = g @ wᵀ
    dw = xᵀ @ g
    """
    def __init__(self, x, w):
        super().__init__(x.data @ w.data, x, w)     # the value, then the parents

    def _back(self, x, w):                          # the engine passes the parents
        x.g += self.g @ w.data.T
        w.g += x.data.T @ self.g
        super()._back()


rng = np.random.default_rng(0)
a = nn.NetVar(rng.standard_normal((2, 3)), name="a")     # float64: finite differences need it
b = nn.NetVar(rng.standard_normal((3, 2)), name="b")
product = MyMultiply(a, b)
product

# %% [markdown]
# Your op is a node like any other: it draws, and `back()` runs its rule.

# %%
loss = nn.Sum(nn.Tanh(product))
loss.back()
assert np.allclose(a.g, (1 - np.tanh(a.data @ b.data) ** 2) @ b.data.T)
nn.draw(loss, show_grad=True)

# %% [markdown]
# ## Checking a rule: finite differences
#
# A backward rule is easy to get wrong, and a wrong gradient trains a network slowly rather
# than not at all: it fails silently. `nn.gradcheck(Op, *inputs)` builds the op, backpropagates
# a random upstream gradient through it, and compares every element of every input's gradient
# with a central difference `(f(x + ε) − f(x − ε)) / 2ε`. Inputs must be float64.
# `verbose=True` prints both side by side.

# %%
nn.gradcheck(MyMultiply, a, b, verbose=True)

# %% [markdown]
# Now a rule with a mistake a tired person makes: a stray factor 2 in `dw`. The check marks
# every element of input 1 as wrong and leaves input 0 alone. `raise_on_error=False` returns
# `False` instead of raising.

# %%
class BuggyMultiply(MyMultiply):
    """y = x @ w, with a wrong dw = 2 · xᵀ @ g."""
    def _back(self, x, w):
        x.g += self.g @ w.data.T
        w.g += 2 * (x.data.T @ self.g)


ok = nn.gradcheck(BuggyMultiply, a, b, verbose=True, raise_on_error=False)
print("passed:", ok)
assert not ok

# %% [markdown]
# A forgotten transpose is caught the same way, or earlier: with a non-square `w` the shapes
# do not even fit, and NumPy says so when `_back` runs.
#
# ## An elementwise op
#
# For an op of one input applied element by element, `y = f(x)`, the rule is
# `dx = g · f′(x)`, an elementwise product. Here is `y = x³`; the `_back` reads the parent's
# `data` (the forward input), which the op keeps through its parents.

# %%
class Cube(nn.NetOp):
    """y = x³;  dx = g · 3x²"""
    def __init__(self, x):
        super().__init__(x.data ** 3, x)

    def _back(self, x):
        x.g += self.g * 3 * x.data ** 2
        super()._back()


v = nn.NetVar(np.array([[0.5, -2.0, 1.5]]))
assert nn.gradcheck(Cube, v)
Cube(v)

# %% [markdown]
# An op class with no `_back` cannot be backpropagated through: `back()` says so, naming the op,
# rather than passing on a zero gradient.

# %%
class Forgetful(nn.NetOp):
    """y = 2x, with no backward rule."""
    def __init__(self, x):
        super().__init__(2 * x.data, x)


try:
    nn.Sum(Forgetful(v)).back()
except NotImplementedError as error:
    print(error)

# %% [markdown]
# ## Exercises
#
# 1. Write `Softsign`, `y = x / (1 + |x|)`, whose derivative is `1 / (1 + |x|)²`, as an op,
#    and check it with `gradcheck`.
# 2. Write `Scale(x, s)`, `y = s · x` for a `(1, 1)` number `s` and any `x`: the gradient of
#    `s` is the sum of `g · x` over all elements.
# 3. Write a deliberately wrong `Softsign` (drop the square) and show that `gradcheck` fails it.

# %%
class Softsign(nn.NetOp):
    """y = x / (1 + |x|);  dx = g / (1 + |x|)²"""
    def __init__(self, x):
        super().__init__(x.data / (1 + np.abs(x.data)), x)

    def _back(self, x):
        x.g += self.g / (1 + np.abs(x.data)) ** 2


class Scale(nn.NetOp):
    """y = s · x;  dx = g · s;  ds = Σ g · x"""
    def __init__(self, x, s):
        super().__init__(s.data * x.data, x, s)

    def _back(self, x, s):
        x.g += self.g * s.data
        s.g += np.sum(self.g * x.data)


class WrongSoftsign(Softsign):
    """y = x / (1 + |x|), with dx = g / (1 + |x|), the square dropped."""
    def _back(self, x):
        x.g += self.g / (1 + np.abs(x.data))

# %%
points = nn.NetVar(np.array([[0.3, -1.2, 2.5], [-0.7, 0.1, 4.0]]))
assert np.allclose(Softsign(points).data, points.data / (1 + np.abs(points.data)))
assert nn.gradcheck(Softsign, points)
assert nn.gradcheck(Scale, points, nn.NetVar(np.array([[1.7]])))
assert not nn.gradcheck(WrongSoftsign, points, raise_on_error=False)
print("all answers check")
