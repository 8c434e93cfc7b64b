"""Classify variable-length sequences with an LSTM: which sign wins?

    python examples/sequence_classify.py

Each sequence (length 5..100) is a stream of mostly-zero steps with a few +1 and -1 marks
scattered anywhere in it; its label is 1 when the +1 marks outnumber the -1 marks. The answer
depends on every step, so the model has to count through the whole sequence and read the
result from its final state. Sequences are padded and bucketed by length; the fused LSTM skips
the padding. Ends by printing one line: ``test accuracy: 0.XXXX``.
"""
import argparse

import numpy as np

import nnkit as nn


def make_data(n, rng, min_length=5, max_length=100, marks=0.08):
    seqs, labels = [], []
    while len(seqs) < n:
        length = int(rng.integers(min_length, max_length + 1))
        values = np.where(rng.random(length) < marks, rng.choice([-1.0, 1.0], length), 0.0)
        values[rng.integers(length)] = rng.choice([-1.0, 1.0])     # at least one mark
        total = values.sum()
        if total == 0:
            continue                                                # no ties
        seqs.append(values[:, None].astype(np.float32))             # (length, 1) features
        labels.append(int(total > 0))
    return seqs, np.array(labels)


def train_and_test(model, train_x, train_y, test_x, test_y, epochs, batch, lr, quiet=False):
    """Adam (gradient norm clipped at 1) on bucketed minibatches, the learning rate × 0.75 after
    each epoch; returns the test accuracy, which it prints."""
    optimizer = nn.Adam(model.vars, lr=lr, modifiers=[nn.ClipGradNorm(1.0)])
    for epoch in range(epochs):
        total, count = 0.0, 0
        for x, lengths, t in nn.minibatches(train_x, train_y, batch_size=batch, bucket=8):
            loss = nn.SoftmaxCELoss(model(x, lengths), t)
            loss.back()
            optimizer.step()
            total += loss.item() * len(t)
            count += len(t)
        optimizer.lr *= 0.75                       # settle into the minimum found
        if not quiet:
            print(f"epoch {epoch + 1}: train loss {total / count:.4f}")
    correct = 0
    with nn.no_grad():
        for x, lengths, t in nn.minibatches(test_x, test_y, batch_size=256, shuffle=False):
            correct += int((model(x, lengths).data.argmax(axis=1) == t).sum())
    accuracy = correct / len(test_y)
    print(f"test accuracy: {accuracy:.4f}")
    return accuracy


def main(epochs=8, train=2000, test=1000, hidden=24, batch=32, lr=0.01, seed=0, quiet=False):
    nn.seed(seed)
    rng = np.random.default_rng(seed)
    train_x, train_y = make_data(train, rng)
    test_x, test_y = make_data(test, rng)
    model = nn.SequenceModel(1, hidden, 2, cell="lstm", per_step=False)
    return train_and_test(model, train_x, train_y, test_x, test_y, epochs, batch, lr, quiet)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--train", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    main(epochs=args.epochs, train=args.train, seed=args.seed)
