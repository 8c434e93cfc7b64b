# %% [markdown]
# # Chapter 1: Values, nodes and the graph
#
# A neural network is a function built from small pieces, and backpropagation is the chain rule
# applied to those pieces in the right order. In this chapter you build the NNKit article's
# 3-class classifier (its Code 1) by hand, read its forward values, draw it, and watch
# `back()` fill in every gradient.
#
# You will learn
#
# - what a node (`nn.NetVar`) and an op (`nn.NetOp`) are, and why there is no graph object;
# - how to read a node's value (`.data`) and gradient (`.g`);
# - how to draw a graph with `nn.draw` and step through the backward pass.
#
# Pictures need Graphviz's `dot` program (`apt-get install graphviz`, `brew install graphviz` or
# `conda install graphviz`); without it the graphs show as text and everything else runs.

# %%
import numpy as np
import nnkit as nn

# %% [markdown]
# ## The article's graph, built by hand
#
# Every node is a `NetVar`. An op, such as `Multiply`, `Add` or `ReLU`, is a node too: it
# computes its value the moment it is built, from its parents, and remembers them. Those
# references are the whole graph. Vectors are rows, so `NetVar([1, 2])` has shape `(1, 2)`.

# %%
# Variables:
x = nn.NetVar([1, 2])
w1 = nn.NetVar([[3, 4, 5], [6, 7, 8]])
b1 = nn.NetVar([1, 2, 3])
w2 = nn.NetVar([[1, 2, 3], [3, 4, 5], [6, 7, 8]])
b2 = nn.NetVar([1, 2, 3])

# Layer 1 operators:
mul1 = nn.Multiply(x, w1)
add1 = nn.Add(mul1, b1)
relu1 = nn.ReLU(add1)

# Layer 2 operators:
mul2 = nn.Multiply(relu1, w2)
add2 = nn.Add(mul2, b2)
smax2 = nn.SoftMax(add2)

# %% [markdown]
# The forward pass has already happened (the article's Figure 3): each op's `data` holds its
# value. In a notebook a node shows as a small table: what it is, its shape and its data.

# %%
print("mul1 =", mul1.data, " add1 =", add1.data)
add1

# %% [markdown]
# `x @ w1 + b1` builds the same nodes as `nn.Add(nn.Multiply(x, w1), b1)`: the operators are
# spellings of the ops.

# %%
assert np.array_equal((x @ w1 + b1).data, add1.data)
print("output:", smax2.data)

# %% [markdown]
# ## The picture
#
# `nn.draw(root)` draws everything `root` was computed from. Parameters (leaves that need a
# gradient) are orange, ops blue, constants dashed grey; the root has a double border.
# `names=globals()` labels each node with the Python variable that holds it, and
# `show_data=True` prints the values on the nodes.

# %%
nn.draw(smax2, show_data=True, names=globals())

# %% [markdown]
# ## The backward pass
#
# `back()` runs every op's backward rule once, children before parents, and fills `.g` of every
# node: `.g` is the derivative of the root with respect to that node, with the node's shape.
# With the article's numbers the softmax input is `[221, 282, 343]`: the output is one-hot to
# float precision, its derivative is zero, and so is every gradient below it. A saturated
# softmax teaches nothing, which is one reason we scale logits and train against a loss.

# %%
smax2.back()
print("w1.g =", w1.g)

# %% [markdown]
# So put a loss on top of the same graph, with the logits scaled down by 0.01 and the target
# class 0. `reset()` first clears the previous gradients: a leaf's gradient accumulates across
# `back()` calls until it is reset (an op's starts from zero at each `back()`).

# %%
for v in (x, w1, b1, w2, b2):
    v.reset()
probs = nn.SoftMax(add2 * 0.01)
target = nn.NetVar([1, 0, 0], requires_grad=False)      # a constant: it needs no gradient
loss = nn.CELoss(probs, target)
loss.back()
print("loss =", loss.item())
w1

# %% [markdown]
# The same picture with the gradients (the article's Figure 4). `smax2` is gone: it is not an
# input of `loss`, so `draw(loss)` does not see it.

# %%
nn.draw(loss, show_data=True, show_grad=True, names=globals())

# %% [markdown]
# ## One step at a time
#
# `back(trace=True)` records each step: which op ran, the upstream gradient `g` it received, its
# local rule (from the op's docstring), and what it added to each input's gradient. In a notebook
# the trace is a table.

# %%
for v in (x, w1, b1, w2, b2):
    v.reset()
trace = loss.back(trace=True)
trace

# %% [markdown]
# `nn.draw(root, step=k)` highlights the op processed at step `k` and shows only the gradients
# known after it; the red edges carry the gradient it just sent to its inputs.
# `nn.draw_trace(root)` gives every step: drag the slider to run the backward pass.

# %%
nn.draw_trace(loss, names=globals())

# %% [markdown]
# The trace agrees with `back()`: the upstream gradient of each step is that op's `.g`, and what
# the steps added to `w1` is `w1.g`.

# %%
assert all(np.array_equal(step.upstream, step.node.g) for step in trace)
assert np.allclose(trace.gradients()[w1.index], w1.g)

# %% [markdown]
# ## Exercises
#
# Fill in each answer, then run the check cell below it: it fails on a wrong answer. (The
# answers given here are the solutions: cover them, work them out, then compare.)
#
# 1. By hand: the value of `add1` for the article's numbers, `x·w1 + b1`.
# 2. `Add` passes its upstream gradient through unchanged. Which node's gradient equals
#    `b2.g`? Give the node.
# 3. How many steps does the trace of `loss` have? (One per op that needs a gradient.)
# 4. Change `x` to `[2, 1]` and rebuild the graph: what is the class the network predicts
#    (the index of the largest probability of `SoftMax(add2 * 0.01)`)?

# %%
answer_1 = [[1 * 3 + 2 * 6 + 1, 1 * 4 + 2 * 7 + 2, 1 * 5 + 2 * 8 + 3]]
answer_2 = add2
answer_3 = 8                    # CELoss, SoftMax, the · 0.01, Add, Multiply, ReLU, Add, Multiply
x2 = nn.NetVar([2, 1])
probs2 = nn.SoftMax((nn.ReLU(x2 @ w1 + b1) @ w2 + b2) * 0.01)
answer_4 = int(probs2.data.argmax())

# %%
assert np.array_equal(answer_1, add1.data), "add1 is x·w1 + b1, row times matrix plus row"
assert answer_2 is add2 and np.array_equal(answer_2.g, b2.g), "Add hands g on unchanged"
assert answer_3 == len(trace), "count the ops from loss down to x, the scaling by 0.01 included"
assert answer_4 == 2, "the third logit is the largest"
print("all answers check")
