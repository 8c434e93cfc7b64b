"""Train a small convolutional network on the 8x8 handwritten digits that ship with scikit-learn.

    python examples/digits_cnn.py

Conv2D (16 filters of 3x3, padding 1) -> ReLU -> MaxPool2D (2x2) -> affine -> SoftmaxCELoss,
on the images as (N, 1, 8, 8) arrays. Holds out 20 % for testing and ends by printing one line:
``test accuracy: 0.XXXX``.
"""
import numpy as np
from sklearn.datasets import load_digits

import nnkit as nn


def load(seed=0):
    digits = load_digits()
    X = (digits.data / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(X))
    X, y = X[order], y[order]
    split = int(0.8 * len(X))
    return X[:split], y[:split], X[split:], y[split:]


def main(epochs=15, batch=32, seed=0, verbose=True):
    """Train, print the test accuracy and return (accuracy, mean training loss per epoch)."""
    nn.seed(seed)
    X_train, y_train, X_test, y_test = load(seed)
    K, b1 = nn.he(16, 1, 3, 3), nn.zeros(16)
    W2, b2 = nn.he(16 * 4 * 4, 10), nn.zeros(10)
    params = [K, b1, W2, b2]

    def logits(x):
        h = nn.MaxPool2D(nn.ReLU(nn.Conv2D(x, K, b1, padding=1)), 2)
        return h.flatten() @ W2 + b2

    optimizer = nn.Adam(params, lr=0.003)
    rng = np.random.default_rng(seed)
    losses = []
    for epoch in range(epochs):
        order = rng.permutation(len(X_train))
        total = 0.0
        for start in range(0, len(order), batch):
            rows = order[start:start + batch]
            x = nn.NetVar(X_train[rows], requires_grad=False)
            loss = nn.SoftmaxCELoss(logits(x), y_train[rows])
            loss.back()
            optimizer.step()
            total += loss.item() * len(rows)
        losses.append(total / len(X_train))
        if verbose and epoch % 5 == 4:
            print(f"epoch {epoch + 1}: train loss {losses[-1]:.4f}")
    with nn.no_grad():
        predicted = logits(nn.NetVar(X_test, requires_grad=False)).argmax(axis=1).data
    accuracy = float((predicted == y_test).mean())
    print(f"test accuracy: {accuracy:.4f}")
    return accuracy, losses


if __name__ == "__main__":
    main()
