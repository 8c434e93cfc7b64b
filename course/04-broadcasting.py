# %% [markdown]
# # Chapter 4: Broadcasting and shapes
#
# A bias `b` of shape `(1, H)` is added to every row of a `(B, H)` batch. NumPy does that by
# *broadcasting*: it repeats `b` along the rows without copying it. The backward pass has to undo
# the repetition: `b` was used `B` times, so its gradient is the sum of the `B` row gradients.
# This chapter shows where that rule comes from, how nnkit applies it (`accumulate`), and the
# gradient-shape mistakes it refuses.
#
# You will learn
#
# - why a broadcast input's gradient is a sum over the broadcast axes;
# - how `node.accumulate(g)` sums a gradient back to the node's shape, and what it refuses;
# - why `x.g += g` can be silently wrong, and how `gradcheck` catches it anyway.

# %%
import numpy as np
import nnkit as nn

rng = np.random.default_rng(0)

# %% [markdown]
# ## A broadcast is a copy, and a copy's gradient is a sum
#
# `x + b` with `x` `(4, 3)` and `b` `(1, 3)` is the same as `x + B`, where `B` stacks four
# copies of `b`. Each copy receives its row of the upstream gradient, and the chain rule adds
# the shares of every use of `b`: `db = Σ_rows g`. The same holds for each axis NumPy
# broadcast, including axes NumPy prepended (`b` of shape `(3,)` against `(4, 3)`).
#
# | input | shape | broadcast to | gradient |
# |---|---|---|---|
# | `x` | `(4, 3)` | `(4, 3)` | `g` |
# | `b` | `(1, 3)` | `(4, 3)` | `g.sum(axis=0, keepdims=True)` |
# | `c` | `(4, 1)` | `(4, 3)` | `g.sum(axis=1, keepdims=True)` |
# | `s` | `(1, 1)` | `(4, 3)` | `g.sum()` as `(1, 1)` |

# %%
x = nn.NetVar(rng.standard_normal((4, 3)), name="x")
b = nn.NetVar(rng.standard_normal((1, 3)), name="b")
c = nn.NetVar(rng.standard_normal((4, 1)), name="c")
s = nn.NetVar(np.array([[2.0]]), name="s")
weights = nn.NetVar(rng.standard_normal((4, 3)), requires_grad=False, name="weights")
y = (x + b) * c * s
loss = (y * weights).sum()              # so that each element's upstream gradient differs
loss.back()
g = (weights.data * c.data * s.data)    # ∂loss/∂(x + b), element by element
assert np.allclose(b.g, g.sum(axis=0, keepdims=True))
assert np.allclose(c.g, (weights.data * (x.data + b.data) * s.data).sum(axis=1, keepdims=True))
assert b.g.shape == b.shape and c.g.shape == c.shape and s.g.shape == s.shape
b

# %% [markdown]
# The graph shows each gradient with its input's shape:

# %%
nn.draw(loss, show_grad=True)

# %% [markdown]
# ## `accumulate`: summing back, and refusing
#
# An op's `_back` computes its inputs' shares at the *output's* shape, and hands each one to
# `parent.accumulate(g)`, which sums it over the axes along which the parent was broadcast.
# A gradient that cannot be summed back is refused, with both shapes named: that is a wrong
# rule, and finding it at the op that made it is far easier than finding it from a model that
# trains badly.

# %%
target = nn.NetVar(np.zeros((3, 4)), name="target")
target.accumulate(np.ones((2, 3, 4)))        # broadcast over a new leading axis: summed
print(target.g)
target.reset()
for wrong in [np.ones((3, 5)), np.ones((1, 4))]:
    try:
        target.accumulate(wrong)
    except ValueError as error:
        print(error)

# %% [markdown]
# The second refusal matters most. NumPy's in-place `x.g += g` with a `g` of shape `(1, 4)`
# for an `x` of shape `(3, 4)` *broadcasts g over x*, the reverse of what a gradient needs, and
# says nothing. Here is an op that scales each column of `x` by a `(1, F)` row `k`, and a
# copy-paste mistake in its rule: `x`'s share summed over the rows, like `k`'s.

# %%
class ColumnScale(nn.NetOp):
    """y = x · k, k a (1, F) row scaling each column;  dx = g · k;  dk = Σ_rows g · x"""
    def __init__(self, x, k):
        super().__init__(x.data * k.data, x, k)

    def _back(self, x, k):
        x.accumulate(self.g * k.data)
        k.accumulate(self.g * x.data)          # (B, F), summed back to (1, F) by accumulate


class WrongColumnScaleInPlace(ColumnScale):
    """dx summed over the rows by mistake, added with +=."""
    def _back(self, x, k):
        x.g += (self.g * k.data).sum(axis=0, keepdims=True)   # (1, F) into (B, F): no error
        k.g += (self.g * x.data).sum(axis=0, keepdims=True)


class WrongColumnScale(ColumnScale):
    """The same mistake, handed to accumulate."""
    def _back(self, x, k):
        x.accumulate((self.g * k.data).sum(axis=0, keepdims=True))
        k.accumulate(self.g * x.data)


inputs = nn.NetVar(rng.standard_normal((3, 4)), name="inputs")
scales = nn.NetVar(rng.standard_normal((1, 4)), name="scales")
assert nn.gradcheck(ColumnScale, inputs, scales)
nn.Sum(WrongColumnScaleInPlace(inputs, scales)).back()
print("+= accepted a wrong gradient of shape", inputs.g.shape)
inputs.reset()
try:
    nn.Sum(WrongColumnScale(inputs, scales)).back()
except ValueError as error:
    print("accumulate refused it:", error)

# %% [markdown]
# `gradcheck` catches the wrong rule either way, from the values: the wrong rule sums the
# gradient over the rows and hands that one row to every row, so each element of input 0 gets
# the sum of its column's right values (the three numeric values of a column add up to the
# analytic value repeated in it):

# %%
inputs.reset()
nn.gradcheck(WrongColumnScaleInPlace, inputs, scales, verbose=True, raise_on_error=False)

# %% [markdown]
# ## Shapes in a layer
#
# A dense layer on a batch, `relu(x @ W + b)`, uses all three rules: the matrix product's
# (chapter 2), the broadcast bias's, and the elementwise ReLU's. In the table of a node, the
# gradient always has the node's shape.

# %%
batch = nn.NetVar(rng.standard_normal((5, 4)), requires_grad=False, name="batch")
W = nn.NetVar(rng.standard_normal((4, 3)), name="W")
bias = nn.NetVar(np.zeros((1, 3)), name="bias")
hidden = nn.ReLU(batch @ W + bias)
hidden.sum().back()
bias

# %% [markdown]
# ## Exercises
#
# 1. For `hidden` above, `bias.g` counts something about the batch. What, for each unit? Give
#    the array.
# 2. Write `RowScale(x, r)`: `y = x · r` for a `(B, 1)` column `r` scaling each row, with a
#    `_back` that uses `accumulate`, and check it with `gradcheck`.
# 3. What shape does `accumulate` give the gradient of a parameter of shape `(3,)` used in
#    `x + p` with `x` of shape `(2, 3)`, given an upstream `(2, 3)`? (The engine keeps nodes
#    at least 2-D: look at `p.shape` first.)

# %%
answer_1 = ((batch.data @ W.data + bias.data) > 0).sum(axis=0, keepdims=True)


class RowScale(nn.NetOp):
    """y = x · r, r a (B, 1) column scaling each row;  dx = g · r;  dr = Σ_columns g · x"""
    def __init__(self, x, r):
        super().__init__(x.data * r.data, x, r)

    def _back(self, x, r):
        x.accumulate(self.g * r.data)
        r.accumulate(self.g * x.data)       # (B, F) summed back to (B, 1) by accumulate


p = nn.NetVar(np.zeros(3))
answer_3 = (1, 3)

# %%
assert np.array_equal(answer_1, bias.g), "ReLU passes g where its input was positive"
assert nn.gradcheck(RowScale, inputs, nn.NetVar(rng.standard_normal((3, 1))))
(nn.NetVar(np.ones((2, 3)), requires_grad=False) + p).sum().back()
assert answer_3 == p.g.shape == p.shape, "a gradient has its node's shape"
print("all answers check")
