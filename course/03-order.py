# %% [markdown]
# # Chapter 3: Why the order matters
#
# Chapter 1 said `back()` runs every op's rule "once, children before parents". This chapter
# shows why both halves of that sentence matter. You write the backward pass the obvious way, a
# recursion from the root, watch it give wrong gradients as soon as a node is used twice, then
# write the version nnkit uses, and run it on a chain of 100,000 ops.
#
# You will learn
#
# - why a node's gradient is complete only after *all* its consumers have run their rules;
# - what a topological order is, and how nnkit gets one from creation order;
# - why the backward pass must not be recursive.

# %%
import sys
import time

import numpy as np
import nnkit as nn

# %% [markdown]
# ## The obvious backward pass
#
# Each op adds its parents' shares to their `.g`, then the pass goes on into each parent: a
# depth-first recursion from the root. The article's ops end with `super()._back()`, and in the
# original NNKit that call went on into the parents in just this way. Here it is as a function;
# `node._back(*node.parents)` is the op's own rule from chapter 2.

# %%
def collect(root):
    """Every node `root` depends on, itself included (an explicit stack: no recursion)."""
    seen, stack = {id(root): root}, [root]
    while stack:
        for parent in stack.pop().parents:
            if id(parent) not in seen:
                seen[id(parent)] = parent
                stack.append(parent)
    return list(seen.values())


def naive_back(root):
    for node in collect(root):
        node.reset()
    root.g = np.ones_like(root.data)
    runs = {}

    def visit(node):
        if node.parents:                            # an op: its rule, then its parents'
            runs[node] = runs.get(node, 0) + 1
            node._back(*node.parents)
            for parent in node.parents:
                visit(parent)

    visit(root)
    return runs

# %% [markdown]
# On the article's graph (chapter 1) every node feeds exactly one op: the graph is a chain, and
# the recursion gives the same gradients as `back()`.

# %%
x = nn.NetVar([1, 2])
w1 = nn.NetVar([[3, 4, 5], [6, 7, 8]])
b1 = nn.NetVar([1, 2, 3])
w2 = nn.NetVar([[1, 2, 3], [3, 4, 5], [6, 7, 8]])
b2 = nn.NetVar([1, 2, 3])
relu1 = nn.ReLU(x @ w1 + b1)
add2 = relu1 @ w2 + b2
loss = nn.CELoss(nn.SoftMax(add2 * 0.01), nn.NetVar([1, 0, 0], requires_grad=False))

loss.back()
right = w1.g.copy()
naive_back(loss)
print("back():\n", right.round(4), "\nnaive:\n", w1.g.round(4))
assert np.allclose(w1.g, right)

# %% [markdown]
# ## A shared node
#
# Now give the article's network a skip connection, as a ResNet would: the second layer's
# output plus `relu1` itself. `relu1` has two consumers, so its gradient is the sum of two
# shares. The recursion reaches `relu1` once through each consumer, and each time pushes
# *everything `relu1.g` holds by then* down into the first layer: the first layer's gradients
# are counted again.

# %%
skip = add2 + relu1
loss = nn.CELoss(nn.SoftMax(skip * 0.01), nn.NetVar([1, 0, 0], requires_grad=False))
for v in (x, w1, b1, w2, b2):
    v.reset()
loss.back()
right = {name: v.g.copy() for name, v in [("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2)]}
runs = naive_back(loss)
print("relu1's rule ran", runs[relu1], "times; b1.g naive", b1.g.round(5),
      "right", right["b1"].round(5))
assert runs[relu1] == 2 and not np.allclose(b1.g, right["b1"])
assert np.allclose(w2.g, right["w2"]) and np.allclose(b2.g, right["b2"])   # above relu1: right

# %% [markdown]
# The picture shows the wrong gradients the recursion left (orange nodes are the parameters;
# `relu1` has two arrows out):

# %%
nn.draw(loss, show_grad=True, names=globals(), rankdir="TB")

# %% [markdown]
# | node | consumers | recursion runs its rule | its gradient |
# |---|---|---|---|
# | `w2`, `b2`, `add2` | one, above `relu1` | once | right |
# | `relu1` | two: `add2`'s matrix product and `skip` | twice | right when read at the end |
# | `w1`, `b1`, `x` | one, below `relu1` | twice | over-counted |
#
# The fix is not "run each rule once": if the recursion skipped `relu1` the second time, it would
# have pushed down only the share it had when first reached. A node's rule may run only when
# its gradient is complete, that is after **every** consumer has run. An order of the nodes in
# which each node comes after all its consumers is a (reverse) *topological order*.
#
# ## The topological order
#
# Every op is built after its parents, and nnkit numbers nodes as they are built
# (`node.index`). So descending creation index is a topological order, for free: no consumer
# counting, no recursion. That is the whole of nnkit's `back()`:

# %%
def topological_back(root):
    nodes = [node for node in collect(root) if node.parents]     # the ops
    nodes.sort(key=lambda node: node.index, reverse=True)        # children before parents
    for node in collect(root):
        node.reset()
    root.g = np.ones_like(root.data)
    for node in nodes:
        node._back(*node.parents)
    return [type(node).__name__ for node in nodes]


order = topological_back(loss)
print(" -> ".join(order))
for name, v in [("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2)]:
    assert np.allclose(v.g, right[name]), name

# %% [markdown]
# `back(trace=True)` shows the same order, one row per op:

# %%
for v in (x, w1, b1, w2, b2):
    v.reset()
loss.back(trace=True)

# %% [markdown]
# ## A chain of 100,000 ops
#
# The recursion has a second problem: every op on a path adds a frame to Python's stack, and
# Python allows about a thousand. Here is a chain of 100,000 multiplications by `1 + 10⁻⁵`.
# Its derivative is `(1 + 10⁻⁵)^100000 ≈ e`.

# %%
t = nn.NetVar(np.array([[1.0]]))
y = t
for _ in range(100_000):
    y = y * (1 + 1e-5)

try:
    naive_back(y)
except RecursionError as error:
    print("naive recursion:", type(error).__name__, "after", sys.getrecursionlimit(), "frames")

t.reset()
started = time.perf_counter()
y.back()
print(f"back(): t.g = {t.g.item():.6f} (e = {np.e:.6f}) in {time.perf_counter() - started:.2f} s")
assert np.isclose(t.g.item(), (1 + 1e-5) ** 100_000)

# %% [markdown]
# `back()` collects the nodes with a list that grows as it is read (no recursion) and sorts them
# once, so the chain costs a few hundred milliseconds, and its memory is the nodes themselves.
#
# ## Exercises
#
# 1. A diamond: `d = a + a` uses `a` twice. Build a stack of `k = 10` diamonds,
#    `a₀ = t`, `aᵢ₊₁ = aᵢ + aᵢ`. What is the right `t.g` for the top?
# 2. How many times does `naive_back` run the rule of the bottom diamond (`a₁`) on that stack?
#    (Each diamond's node is reached once through each of its two uses, for each time the node
#    above it is reached.)
# 3. Another topological order: count each op's consumers, and run an op when its count drops to
#    zero (Kahn's algorithm). Write `kahn_order(root)` returning the ops in an order whose every
#    op comes after all its consumers; the check runs it on the skip graph above.

# %%
k = 10
answer_1 = 2.0 ** k
answer_2 = 2 ** (k - 1)


def kahn_order(root):
    ops = [node for node in collect(root) if node.parents]
    consumers = {id(node): 0 for node in ops}
    for node in ops:
        for parent in node.parents:
            if id(parent) in consumers:
                consumers[id(parent)] += 1
    ready, order = [root], []
    while ready:
        node = ready.pop()
        order.append(node)
        for parent in node.parents:
            if id(parent) in consumers:
                consumers[id(parent)] -= 1
                if consumers[id(parent)] == 0:
                    ready.append(parent)
    return order

# %%
t = nn.NetVar(np.array([[1.0]]))
a, diamonds = t, []
for _ in range(k):
    a = a + a
    diamonds.append(a)
a.back()
assert answer_1 == t.g.item(), "each diamond doubles the gradient"
assert answer_2 == naive_back(a)[diamonds[0]], "count the paths from the top to a₁"
order = kahn_order(loss)
position = {id(node): i for i, node in enumerate(order)}
assert len(order) == len([n for n in collect(loss) if n.parents]), "every op once"
assert all(position[id(node)] > position[id(consumer)]
           for consumer in order for node in consumer.parents if node.parents), \
    "an op comes after each of its consumers"
print("all answers check")
