# %% [markdown]
# # Chapter 6: Sequences: backpropagation through time
#
# A recurrent network reads a sequence one step at a time and carries a state `h` from step to
# step: `hₜ = tanh(xₜ·W + hₜ₋₁·R + b)`. Unrolled over `T` steps it is an ordinary graph, deep in
# time, and `back()` on it is *backpropagation through time* (BPTT). In this chapter you unroll a
# recurrent network from cells, compare it with nnkit's fused op, which runs the whole loop as
# one node, and handle a batch of sequences of different lengths.
#
# You will learn
#
# - why the weights' gradient is a sum over time steps (the weights are shared, chapter 3);
# - that a fused op is one node with the same values and gradients as the unrolled graph;
# - masks and lengths: how a padded batch keeps each sequence's state at its own last step.

# %%
import numpy as np
import nnkit as nn

rng = np.random.default_rng(0)
T, B, F, H = 5, 3, 2, 4                              # time steps, batch, inputs, hidden units
series = rng.standard_normal((T, B, F))              # time-major: (T, B, F)
W, R, b = nn.recurrent_weights("rnn", F, H, seed=0)  # W (F, H), R (H, H), b (1, H)
print(W.shape, R.shape, b.shape)

# %% [markdown]
# ## Unrolled from cells
#
# `nn.RNNCell(x, h, W, R, b)` is one step, built from ordinary ops. A loop over time builds the
# unrolled graph; the same `W`, `R` and `b` are used at every step.

# %%
def unrolled(series, h0):
    h, states = h0, []
    for t in range(len(series)):
        h = nn.RNNCell(nn.NetVar(series[t], requires_grad=False), h, W, R, b)
        states.append(h)
    return states


h0 = nn.NetVar(np.zeros((B, H)), requires_grad=False)
states = unrolled(series, h0)
loss = sum((h * h).sum() for h in states)            # any loss on every step's output
loss.back()
cell_grads = [p.g.copy() for p in (W, R, b)]
print("ops in the unrolled graph:", len(loss.back(trace=True)))

# %% [markdown]
# Drawn for two steps (five would not fit on a page), the unrolled graph shows the weights
# feeding every step: each step adds its share to `W.g`, `R.g` and `b.g`.

# %%
for p in (W, R, b):
    p.reset()
two = unrolled(series[:2], h0)
nn.draw((two[-1] * two[-1]).sum(), names={"W": W, "R": R, "b": b})

# %% [markdown]
# ## The fused op
#
# `nn.RNN(x, W, R, b)` runs the same loop inside one node, for the whole batch, and its backward
# rule runs BPTT in one pass, step `T` down to step 1. It is one box in the picture, labelled
# with its number of time steps.

# %%
for p in (W, R, b):
    p.reset()
fused = nn.RNN(series, W, R, b)                      # (T, B, H): every step's output
fused_loss = (fused * fused).sum()
fused_loss.back()
assert np.allclose(fused.data, np.stack([h.data for h in states]))
for name, p, expected in zip("WRb", (W, R, b), cell_grads):
    assert np.allclose(p.g, expected), name
print("same values, same gradients")
nn.draw(fused_loss, names={"W": W, "R": R, "b": b, "fused": fused})

# %% [markdown]
# ## BPTT step by step
#
# Why is it called "through time"? The gradient that reaches `hₜ` comes from the loss at step
# `t` *and* from every later step, through `R`. The trace of the unrolled graph shows the
# backward pass walking back in time: the last step's cell runs first. Here is the trace of
# two steps:

# %%
for p in (W, R, b):
    p.reset()
two_loss = (two[-1] * two[-1]).sum() + (two[0] * two[0]).sum()
two_loss.back(trace=True)

# %% [markdown]
# ## Ragged batches: masks and lengths
#
# Real sequences have different lengths. A batch pads them to the longest, and the network must
# ignore the padding: each sequence's state must stop at its own last step. With cells, a mask
# `m` (1 while a sequence is running, 0 after) keeps the state: `h = m·cell(xₜ, h) + (1 − m)·h`.
# `nn.sequence_mask(lengths, T)` gives it, `(T, B)`.

# %%
lengths = [5, 2, 3]
mask = nn.sequence_mask(lengths, T).astype(float)   # (T, B): 1 where the step is real
print(mask.T)


def unrolled_masked(series, h0, mask):
    h = h0
    for t in range(len(series)):
        m = nn.NetVar(mask[t][:, None], requires_grad=False)     # (B, 1)
        new = nn.RNNCell(nn.NetVar(series[t], requires_grad=False), h, W, R, b)
        h = m * new + (1.0 - m) * h
    return h


for p in (W, R, b):
    p.reset()
final = unrolled_masked(series, h0, mask)
final.sum().back()
masked_grads = [p.g.copy() for p in (W, R, b)]

# %% [markdown]
# The fused op takes `lengths` instead: it sorts the batch by length and computes each step
# only on the sequences still running, so padding costs nothing. Its outputs are zero past each
# length, and `op.final` is each sequence's state at its own last step.

# %%
for p in (W, R, b):
    p.reset()
ragged = nn.RNN(series, W, R, b, lengths=lengths)
ragged.final.sum().back()
assert np.allclose(ragged.final.data, final.data)
for name, p, expected in zip("WRb", (W, R, b), masked_grads):
    assert np.allclose(p.g, expected), name
print("padding after each length is all zeros:", not ragged.data[2:, 1].any())
ragged.final

# %% [markdown]
# ## Exercises
#
# 1. For the ragged batch, the final state of sequence 1 (length 2) is one of the unmasked
#    states computed earlier (`states`, without lengths): which step's (0-based)?
# 2. Changing the padded inputs must not change anything. Build `series2`, a copy of `series`
#    with random values in sequence 1's padding (steps 2 and later), and give `ragged.final` for
#    it.
# 3. An LSTM's fused op is `nn.LSTM(x, W, R, b, lengths=...)`, with weights from
#    `nn.recurrent_weights("lstm", F, H)`. What is the shape of its `W`? (Four gates side by
#    side.)

# %%
answer_1 = 1
series2 = series.copy()
series2[2:, 1] = rng.standard_normal((T - 2, F))
answer_2 = nn.RNN(series2, W, R, b, lengths=lengths).final.data
answer_3 = (F, 4 * H)

# %%
assert np.allclose(ragged.final.data[1], states[answer_1].data[1]), "sequence 1 has 2 steps"
assert np.allclose(answer_2, ragged.final.data), "the padding is ignored"
assert answer_3 == nn.recurrent_weights("lstm", F, H, seed=0)[0].shape
print("all answers check")
