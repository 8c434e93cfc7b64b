"""Train an MLP on the 8x8 handwritten digits that ship with scikit-learn.

    python examples/digits.py

Holds out 20 % for testing and ends by printing one line: ``test accuracy: 0.XXXX``.
"""
import numpy as np
from sklearn.datasets import load_digits

import nnkit as nn


def load(seed=0):
    digits = load_digits()
    X = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(X))
    X, y = X[order], y[order]
    split = int(0.8 * len(X))
    return X[:split], y[:split], X[split:], y[split:]


def main(epochs=30, batch=64, seed=0):
    nn.seed(seed)
    X_train, y_train, X_test, y_test = load(seed)
    W1, b1 = nn.he(64, 128), nn.zeros(128)
    W2, b2 = nn.he(128, 10), nn.zeros(10)
    params = [W1, b1, W2, b2]

    def logits(x):
        return nn.ReLU(x @ W1 + b1) @ W2 + b2

    optimizer = nn.Adam(params, lr=0.003)
    rng = np.random.default_rng(seed)
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
        if epoch % 10 == 9:
            print(f"epoch {epoch + 1}: train loss {total / len(X_train):.4f}")
    with nn.no_grad():
        predicted = logits(nn.NetVar(X_test, requires_grad=False)).data.argmax(axis=1)
    accuracy = float((predicted == y_test).mean())
    print(f"test accuracy: {accuracy:.4f}")
    return accuracy


if __name__ == "__main__":
    main()
