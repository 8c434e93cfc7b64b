# %% [markdown]
# # Chapter 7: Attention
#
# A recurrent network carries everything it has read in one state vector. Attention lets each
# position look at every other position directly: it scores each *query* against every *key*,
# turns the scores into weights with a softmax, and returns the weighted mean of the *values*.
# In this chapter you write masked attention from ops, compare it with nnkit's fused
# `nn.Attention`, use multi-head attention, and train a small Transformer on a toy task.
#
# You will learn
#
# - `softmax(q·kᵀ/√d)·v`, written out, and why masked keys must get exactly zero weight;
# - that the fused op gives the same values and gradients as one node that keeps only the
#   weights for its backward pass;
# - a Transformer encoder layer, and padding-aware pooling for ragged batches.

# %%
import numpy as np
import nnkit as nn

rng = np.random.default_rng(0)
Bt, Tq, Tk, d = 2, 4, 5, 8                                      # batch, queries, keys, width
q = nn.NetVar(rng.standard_normal((Bt, Tq, d)), name="q")
k = nn.NetVar(rng.standard_normal((Bt, Tk, d)), name="k")
v = nn.NetVar(rng.standard_normal((Bt, Tk, d)), name="v")
key_lengths = [5, 3]                                            # sequence 1 has 3 real keys
keep = nn.sequence_mask(key_lengths, Tk, time_major=False)[:, None, :]   # (B, 1, Tk)
print(keep.astype(int))

# %% [markdown]
# ## Masked softmax by hand
#
# Scores `s = q·kᵀ/√d` are `(B, Tq, Tk)`: one row of key scores per query. The softmax along the
# keys is `exp(sᵢ) / Σⱼ exp(sⱼ)`; a masked key must contribute nothing, so its `exp` is
# multiplied by 0. Subtracting each row's maximum first keeps `exp` from overflowing and changes
# nothing (a softmax does not change when a constant is added to a row), so the maximum can be
# a constant, outside the graph.

# %%
def attention_by_hand(q, k, v, keep):
    scores = q @ k.transpose(0, 2, 1) * (1 / np.sqrt(d))       # (B, Tq, Tk)
    largest = np.where(keep, scores.data, -np.inf).max(axis=-1, keepdims=True)
    weights = (scores - largest).exp() * keep.astype(float)   # masked keys: exactly 0
    weights = weights / weights.sum(axis=-1, keepdims=True)
    return weights @ v, weights


by_hand, weights = attention_by_hand(q, k, v, keep)
by_hand.sum().back()
hand_grads = [t.g.copy() for t in (q, k, v)]
print("weights of sequence 1's first query:", weights.data[1, 0].round(3))
nn.draw(by_hand.sum(), names={"q": q, "k": k, "v": v, "weights": weights}, rankdir="TB")

# %% [markdown]
# ## The fused op
#
# `nn.Attention(q, k, v, mask=keep)` is the same computation as one node. It keeps only the
# weights for its backward pass (the scores and the exponentials are not stored), and its rule
# is the softmax's: `ds = w ⊙ (dw − Σ w ⊙ dw)`.

# %%
for t in (q, k, v):
    t.reset()
context = nn.Attention(q, k, v, mask=keep)
context.sum().back()
assert np.allclose(context.data, by_hand.data)
for name, t, expected in zip("qkv", (q, k, v), hand_grads):
    assert np.allclose(t.g, expected), name
print("masked keys get no gradient:", not k.g[1, 3:].any())
nn.draw(context.sum(), names={"q": q, "k": k, "v": v, "context": context})

# %% [markdown]
# The values of one query, as a table:

# %%
context[1:2, 0]

# %% [markdown]
# ## Multi-head attention
#
# `nn.layers.MultiHeadAttention(dim, heads)` projects a sequence to queries, keys and values
# (`x @ Wq + bq`, ...), splits the width into `heads` parts that attend separately, and
# projects the joined result back (`Wo`). Sequences are time-major, `(T, B, dim)`, with their
# `lengths`, like the recurrent layers; keys past each length are masked.

# %%
steps = rng.standard_normal((6, 3, 16)).astype(np.float32)    # (T, B, dim)
step_lengths = [6, 4, 2]
mha = nn.layers.MultiHeadAttention(16, 4, seed=0)
attended = mha(steps, step_lengths)
print(mha)
print(attended.shape)

# %% [markdown]
# ## A small Transformer on a toy task
#
# The task: sequences of 6 to 12 tokens from {0, 1, 2, 3}; the label says whether token 1
# occurs more often than token 2. Order does not matter, counting does, which attention does
# well. The model: an embedding of each token, the Transformer's positional encoding, one
# pre-norm encoder layer (`x + MHA(LayerNorm(x))`, then a feed-forward block), the mean over
# each sequence's real steps (`mean_over_time` leaves the padding out), and a linear classifier.

# %%
def make_batch(n, seed):
    r = np.random.default_rng(seed)
    seqs, labels = [], []
    while len(seqs) < n:
        seq = r.integers(0, 4, size=r.integers(6, 13))
        ones, twos = (seq == 1).sum(), (seq == 2).sum()
        if ones != twos:
            seqs.append(seq)
            labels.append(int(ones > twos))
    tokens, lengths = nn.pad_sequences(seqs)            # (T, B) token ids, (B,) lengths
    return tokens.astype(np.int64), lengths, np.array(labels)


class Classifier(nn.Module):
    def __init__(self, dim=16, seed=0):
        self.embed = nn.layers.Embedding(4, dim, seed=seed)
        self.encoder = nn.layers.TransformerEncoderLayer(dim, 2, 32, seed=seed + 1)
        self.head = nn.layers.Linear(dim, 2, seed=seed + 2)
        self.dim = dim

    def forward(self, tokens, lengths):
        x = self.embed(tokens) + nn.positional_encoding(len(tokens), self.dim)[:, None, :]
        x = self.encoder(x, lengths)
        return self.head(nn.layers.mean_over_time(x, lengths))


model = Classifier()
optimizer = nn.Adam(model.vars, lr=0.01)
losses = []
for step in range(150):
    tokens, lengths, labels = make_batch(32, seed=step)
    loss = nn.SoftmaxCELoss(model(tokens, lengths), labels)
    loss.back()
    optimizer.step()
    losses.append(loss.item())

test_tokens, test_lengths, test_labels = make_batch(500, seed=10_000)
with nn.no_grad(), nn.eval_mode():
    predicted = model(test_tokens, test_lengths).data.argmax(axis=1)
test_accuracy = float((predicted == test_labels).mean())
print(f"loss {np.mean(losses[:10]):.3f} -> {np.mean(losses[-10:]):.3f}; "
      f"test accuracy {test_accuracy:.3f}")

# %% [markdown]
# ## Exercises
#
# 1. With a mask that keeps every key, `nn.Attention` must equal `nn.Attention` with no mask.
#    Which `keep` array does that? Give it.
# 2. A *causal* mask lets query `i` see keys `0..i` only (a language model must not read
#    ahead). Build the `(Tq, Tq)` boolean mask for self-attention of 4 steps.
# 3. What share of the weight does the first query of sequence 1 put on its 3 real keys,
#    together? And on the 2 padded keys?

# %%
answer_1 = np.ones((Bt, 1, Tk), dtype=bool)
answer_2 = np.tril(np.ones((4, 4), dtype=bool))
answer_3 = (1.0, 0.0)

# %%
assert np.allclose(nn.Attention(q, k, v, mask=answer_1).data, nn.Attention(q, k, v).data)
x4 = nn.NetVar(rng.standard_normal((1, 4, d)))
assert np.allclose(nn.Attention(x4, x4, x4, mask=answer_2).data,
                   nn.Attention(x4, x4, x4, causal=True).data), "query i sees keys 0..i"
assert np.isclose(weights.data[1, 0, :3].sum(), answer_3[0])
assert weights.data[1, 0, 3:].sum() == answer_3[1], "masked keys get exactly zero"
assert test_accuracy > 0.8, "the toy Transformer learned to count"
print("all answers check")
