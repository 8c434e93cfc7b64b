# %% [markdown]
# # Chapter 8: Gradients of gradients
#
# `back()` computes a gradient as arrays. If instead the backward pass *builds a graph*, out of
# the same ops, the gradient is a node like any other, and can be differentiated again. That
# gives second derivatives: the curvature Newton's method needs, Hessian-vector products, and
# penalties on a gradient, as in WGAN-GP. In this chapter you use all three, and draw the graph
# a backward pass builds.
#
# You will learn
#
# - `nn.grad(f, inputs, create_graph=True)`: gradients as nodes;
# - Newton's method from `f′` and `f″`;
# - a Hessian-vector product in two backward passes, without the Hessian;
# - a loss on a gradient, and how its gradient reaches the weights.

# %%
import numpy as np
import nnkit as nn

# %% [markdown]
# ## Gradients as nodes
#
# `nn.grad(f, [t])` returns `∂f/∂t` and leaves every `.g` as it was. By default it returns
# arrays, like `back()`; with `create_graph=True` it returns nodes, built by each op's
# differentiable backward rule (`_grads`), and those reach back to `t`. Here
# `f(t) = t⁴ − 3t² + t`, so `f′(t) = 4t³ − 6t + 1` and `f″(t) = 12t² − 6`.

# %%
t = nn.NetVar(np.array(2.0), name="t")                 # a float64 (1, 1) leaf
f = (t ** 4 - 3.0 * t ** 2 + t).sum()
slope, = nn.grad(f, [t], create_graph=True)            # a node
curvature, = nn.grad(slope, [t])                        # an array
print("f'(2) =", slope.item(), " f''(2) =", curvature.item())
slope

# %% [markdown]
# The graph of `f′(t)`: the ops the backward rules built, from `t` (and the seed, a constant
# 1) to the slope. Differentiating it is an ordinary backward pass.

# %%
nn.draw(slope, names={"t": t, "slope": slope})

# %% [markdown]
# ## Newton's method
#
# To find where `f′(t) = 0`, Newton's method steps `t ← t − f′(t) / f″(t)`: it jumps to the
# zero of the tangent of `f′`. Near a root the number of correct digits doubles each step.

# %%
for step in range(7):
    f = (t ** 4 - 3.0 * t ** 2 + t).sum()
    slope, = nn.grad(f, [t], create_graph=True)
    curvature, = nn.grad(slope, [t])
    t = nn.NetVar(t.data - slope.data / curvature)
    print(f"step {step}: t = {t.item():.15f}   f'(t) before the step = {slope.item():.2e}")

# %% [markdown]
# ## A Hessian-vector product
#
# For a function of many parameters `w`, the Hessian `H = ∂²L/∂w²` has `n²` entries: too many
# for a network. But `H·v` for one direction `v` is the gradient of `⟨∇L, v⟩`, a number: one
# backward pass that builds `∇L` as nodes, one more through it. Check it against finite
# differences of the gradient, `(∇L(w + εv) − ∇L(w − εv)) / 2ε`.

# %%
rng = np.random.default_rng(0)
inputs = nn.NetVar(rng.standard_normal((6, 3)), requires_grad=False)
w = nn.NetVar(rng.standard_normal((3, 2)), name="w")


def loss_of(w):
    return (nn.Multiply(inputs, w).tanh() ** 2).sum()


direction = rng.standard_normal((3, 2))
g_w, = nn.grad(loss_of(w), [w], create_graph=True)
hvp, = nn.grad((g_w * direction).sum(), [w])

eps = 1e-6


def gradient_at(values):
    leaf = nn.NetVar(values)
    return nn.grad(loss_of(leaf), [leaf])[0]


numeric = (gradient_at(w.data + eps * direction)
           - gradient_at(w.data - eps * direction)) / (2 * eps)
print(np.round(hvp, 5))
assert np.allclose(hvp, numeric, atol=1e-6)

# %% [markdown]
# ## A penalty on a gradient
#
# WGAN-GP trains a critic whose gradient with respect to its *input* should have norm 1: the loss
# includes `(‖∂score/∂x‖ − 1)²`. The gradient is a node (`create_graph=True`), so the penalty is
# a node, and `back()` on the total reaches the critic's weights through the backward rules:
# second derivatives, mixed between inputs and weights.

# %%
points = nn.NetVar(np.random.default_rng(1).standard_normal((5, 2)), name="points")
critic = nn.layers.Linear(2, 1, seed=0)
score = critic(points).tanh()
d_points, = nn.grad(score.sum(), [points], create_graph=True)     # (5, 2): one row per point
penalty = ((d_points * d_points).sum(axis=1) ** 0.5 - 1.0) ** 2
total = score.mean() + 10.0 * penalty.mean()
total.back()
print("critic.W.g =", critic.W.g.ravel())
nn.draw(total, names={"W": critic.W, "b": critic.b, "points": points, "penalty": penalty})

# %% [markdown]
# `nn.gradgradcheck(f, *inputs)` checks second derivatives against finite differences of first
# ones, as `gradcheck` checks first derivatives (chapter 2); it also checks that an op's
# `_grads` keeps the upstream gradient in the graph.

# %%
assert nn.gradgradcheck(lambda x: (x.tanh() ** 2).sum(axis=1),
                        nn.NetVar(rng.standard_normal((2, 3))))

# %% [markdown]
# ## Exercises
#
# 1. For `L(x) = ½ xᵀAx` with a symmetric `A`, the Hessian is `A`. Compute the full Hessian of
#    that `L` at a random `x` from Hessian-vector products with the unit vectors `e₁, e₂, e₃`.
# 2. Newton's method on a quadratic converges in one step. From `t = 5`, where does one step on
#    `f(t) = (t − 3)²` land?
# 3. The penalty above is zero when every row of `d_points` has norm 1. For a *linear* critic
#    `score = x·W + b` (no tanh), `∂score/∂x` is `Wᵀ` in every row: which norm of `W` makes the
#    penalty zero?

# %%
A = np.array([[2.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 4.0]])
x = nn.NetVar(rng.standard_normal((1, 3)))
L = 0.5 * ((x @ nn.NetVar(A, requires_grad=False)) * x).sum()
g_x, = nn.grad(L, [x], create_graph=True)
answer_1 = np.concatenate([nn.grad((g_x * e).sum(), [x])[0] for e in np.eye(3)[:, None, :]])
answer_2 = 3.0
answer_3 = 1.0

# %%
assert np.allclose(answer_1, A), "row i is H·eᵢ"
s = nn.NetVar(np.array(5.0))
first, = nn.grad(((s - 3.0) ** 2).sum(), [s], create_graph=True)
assert np.isclose(s.item() - first.item() / nn.grad(first, [s])[0].item(), answer_2)
linear = nn.layers.Linear(2, 1, seed=3)
linear.W.data = linear.W.data / np.linalg.norm(linear.W.data) * answer_3
d_lin, = nn.grad(linear(points).sum(), [points], create_graph=True)
assert np.allclose(((d_lin * d_lin).sum(axis=1) ** 0.5 - 1.0).data, 0, atol=1e-6)
print("all answers check")
