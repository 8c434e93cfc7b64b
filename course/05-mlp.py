# %% [markdown]
# # Chapter 5: An MLP, from scratch and with layers
#
# The pieces of chapters 1 to 4 are all a network needs. In this chapter you train a
# multi-layer perceptron on the handwritten digits that ship with scikit-learn: first from bare
# parameters and ops, with a training loop you write; then the same network with `nn.layers`;
# then two optimizers side by side; then the `Trainer`, which writes the loop for you.
#
# You will learn
#
# - a training step: forward, loss, `back()`, `optimizer.step()` (which also resets `.g`);
# - gradient descent with momentum and Adam, and what their loss curves look like;
# - `nn.layers.Sequential`, `nn.Trainer` and its progress bar.

# %%
# %matplotlib inline
import matplotlib.pyplot as plt
import numpy as np
from sklearn.datasets import load_digits

import nnkit as nn

digits = load_digits()
X = (digits.data / 16.0).astype(np.float32)          # 1797 images of 8×8 pixels, in [0, 1]
y = digits.target
order = np.random.default_rng(0).permutation(len(X))
X, y = X[order], y[order]
split = int(0.8 * len(X))
X_train, y_train, X_test, y_test = X[:split], y[:split], X[split:], y[split:]
print(X_train.shape, y_train[:10])

# %% [markdown]
# ## From scratch
#
# Two layers: 64 pixels → 128 ReLU units → 10 class scores ("logits"). `nn.he` draws a weight
# with He's scaling (variance 2 / inputs, right for ReLU), `nn.zeros` a bias.
# `nn.SoftmaxCELoss(logits, classes)` is the softmax and the cross-entropy of chapter 1 fused
# into one op, averaged over the batch; its gradient is simply `(softmax − one_hot) / B`, and
# it never saturates the way chapter 1's separate softmax did.

# %%
nn.seed(0)
W1, b1 = nn.he(64, 128), nn.zeros(128)
W2, b2 = nn.he(128, 10), nn.zeros(10)


def logits(inputs):
    return nn.ReLU(inputs @ W1 + b1) @ W2 + b2


sample = nn.SoftmaxCELoss(logits(X_train[:4]), y_train[:4])     # a NumPy batch is a constant
nn.draw(sample, names=globals())

# %% [markdown]
# The loop: shuffle, cut into batches of 64, and for each batch build the graph, backpropagate,
# step. `optimizer.step()` updates each parameter from its `.g` and then resets it, so the next
# `back()` starts from zero.

# %%
def train(optimizer, params, epochs=6, batch=64, seed=0):
    rng = np.random.default_rng(seed)
    losses = []
    for epoch in range(epochs):
        shuffled = rng.permutation(len(X_train))
        for start in range(0, len(shuffled), batch):
            rows = shuffled[start:start + batch]
            loss = nn.SoftmaxCELoss(logits(X_train[rows]), y_train[rows])
            loss.back()
            optimizer.step()
            losses.append(loss.item())
    return losses


def accuracy():
    with nn.no_grad():                       # no graph kept: evaluation only
        return float((logits(X_test).data.argmax(axis=1) == y_test).mean())


adam_losses = train(nn.Adam([W1, b1, W2, b2], lr=0.003), [W1, b1, W2, b2])
adam_accuracy = accuracy()
print(f"Adam: test accuracy {adam_accuracy:.4f}")

# %% [markdown]
# ## Two optimizers side by side
#
# | optimizer | update of a parameter `p` with gradient `g` |
# |---|---|
# | `nn.GD(params, lr, momentum)` | `m ← β·m + (1−β)·g` (β = momentum);  `p ← p − lr · m` |
# | `nn.Adam(params, lr, momentum, rms)` | `m ← β₁m + (1−β₁)g`;  `s ← β₂s + (1−β₂)g²`;  `p ← p − lr · m̂ / (√ŝ + ε)` (m̂, ŝ corrected for their start at 0) |
#
# Gradient descent with momentum (the article's Code 3) moves along a running average of
# gradients (PyTorch's SGD adds them up instead, so its steps are 1/(1−β) = 10 times larger at
# β = 0.9); Adam also divides each parameter's step by a running size of its gradients, so each
# parameter gets a step of about `lr` whatever the scale of its gradient. Train the same
# network from the same start with each:

# %%
nn.seed(0)
W1, b1, W2, b2 = nn.he(64, 128), nn.zeros(128), nn.he(128, 10), nn.zeros(10)
gd_losses = train(nn.GD([W1, b1, W2, b2], lr=0.05, momentum=0.9), [W1, b1, W2, b2])
gd_accuracy = accuracy()
print(f"GD with momentum: test accuracy {gd_accuracy:.4f}; Adam: {adam_accuracy:.4f}")


def smooth(values, width=20):
    return np.convolve(values, np.ones(width) / width, mode="valid")


plt.figure(figsize=(7, 3))
plt.plot(smooth(gd_losses), label="GD, momentum 0.9, lr 0.05")
plt.plot(smooth(adam_losses), label="Adam, lr 0.003")
plt.xlabel("step")
plt.ylabel("training loss (mean of 20)")
plt.yscale("log")
plt.legend()
plt.show()

# %% [markdown]
# ## The same network with layers
#
# `nn.layers.Linear(inputs, outputs)` owns a weight `W` and a bias `b` and applies `x @ W + b`;
# `nn.layers.Sequential` chains layers, op classes such as `nn.ReLU`, and functions. `vars`
# lists the parameters for an optimizer. The graph it builds is the one you built by hand.

# %%
model = nn.layers.Sequential(
    nn.layers.Linear(64, 128, seed=0), nn.ReLU,
    nn.layers.Linear(128, 10, seed=1),
)
print(model)
print([name for name in model.named_vars()])
model.vars[0]

# %% [markdown]
# ## The Trainer
#
# `nn.Trainer(step, optimizer, hooks, metrics)` runs the loop: for each batch it calls your
# `step(batch)`, which returns the loss (and the logits and targets, for the metrics), then
# `back()` and the optimizer's step. Hooks add behaviour: a progress bar, early stopping,
# keeping the best checkpoint. `fit` returns the history of each epoch.

# %%
def step(batch):
    inputs, classes = batch
    scores = model(inputs)
    return nn.SoftmaxCELoss(scores, classes), scores, classes


shuffler = np.random.default_rng(0)


def batches():                  # a fresh shuffle every epoch
    rows = shuffler.permutation(len(X_train))
    return [(X_train[part], y_train[part])
            for part in np.array_split(rows, range(64, len(rows), 64))]


trainer = nn.Trainer(step, nn.Adam(model.vars, lr=0.003), hooks=[nn.ProgressBar()],
                     metrics={"accuracy": nn.Accuracy()})
history = trainer.fit(batches, epochs=5, val=[(X_test, y_test)])
print("validation accuracy by epoch:", np.round(history["val_accuracy"], 3))

# %% [markdown]
# ## Faster small steps: capture
#
# On a network this small, much of each step's time goes to Python bookkeeping (building the
# nodes, ordering the graph for `back()`) rather than to arithmetic. `nn.capture(train_step)`
# records the array operations of a whole step (forward, `back()`, the optimizer's update) at
# its first call, and at later calls with batches of the same shape replays just those
# operations, into arrays allocated once. The weights come out the same to the bit as the
# eager loop's; the guide's page "Capture and replay" says what a replay checks.

# %%
def fresh_network():
    net = nn.layers.Sequential(nn.layers.Linear(64, 128, seed=0), nn.ReLU,
                               nn.layers.Linear(128, 10, seed=1))
    optimizer = nn.Adam(net.vars, lr=0.003)

    def train_step(inputs, classes):
        loss = nn.SoftmaxCELoss(net(inputs), classes)
        loss.back()
        optimizer.step()
        return loss
    return net, train_step


eager_net, eager_step = fresh_network()
captured_net, train_step = fresh_network()
fast_step = nn.capture(train_step)
for start in range(0, len(X_train) // 64 * 64, 64):     # whole batches: one shape
    rows = slice(start, start + 64)
    eager_step(X_train[rows], y_train[rows])
    fast_step(X_train[rows], y_train[rows])
print(fast_step)
assert all(np.array_equal(a.data, b.data) for a, b in zip(eager_net.vars, captured_net.vars))

# %% [markdown]
# ## Exercises
#
# 1. How many parameters (numbers) does the 64-128-10 network have?
# 2. Which optimizer reached the lower training loss over the last 50 steps, in the runs above:
#    `"gd"` or `"adam"`?
# 3. Train a fresh layers model with the Trainer (no progress bar) for 5 epochs with
#    `nn.GD(model.vars, lr=answer_3)` (momentum 0.9): pick a learning rate with which it reaches
#    a validation accuracy above 0.9. (0.05 does not get there in 5 epochs.)

# %%
answer_1 = 64 * 128 + 128 + 128 * 10 + 10
answer_2 = "adam" if np.mean(adam_losses[-50:]) < np.mean(gd_losses[-50:]) else "gd"
model = nn.layers.Sequential(nn.layers.Linear(64, 128, seed=0), nn.ReLU,
                             nn.layers.Linear(128, 10, seed=1))
answer_3 = 0.2
gd_history = nn.Trainer(step, nn.GD(model.vars, lr=answer_3),
                        metrics={"accuracy": nn.Accuracy()}).fit(
    batches, epochs=5, val=[(X_test, y_test)])


# %%
assert answer_1 == sum(p.data.size for p in model.vars), "count W1, b1, W2 and b2"
assert answer_2 == min(("gd", np.mean(gd_losses[-50:])), ("adam", np.mean(adam_losses[-50:])),
                       key=lambda pair: pair[1])[0]
assert gd_history["val_accuracy"][-1] > 0.9, "a larger step: 5 epochs are few"
assert adam_accuracy > 0.95 and history["val_accuracy"][-1] > 0.9
print("all answers check")
