"""Train an MLP (``nn.layers``: two ``Linear`` layers with a ReLU) on the 8x8 handwritten digits
that ship with scikit-learn, with the Trainer.

    python examples/digits.py [output-directory]

Holds out 20 % for testing and 15 % of the rest for validation. Training shows a progress bar
per epoch, stops early when the validation loss reaches a plateau, keeps the best model in
``digits-best.npz`` (and, with matplotlib, the loss/accuracy curves in ``digits-curves.png``)
in the output directory (a new temporary directory by default), and ends by printing one
line: ``test accuracy: 0.XXXX``.
"""
import os
import sys
import tempfile

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


def main(out=None, epochs=100, batch=64, seed=0):
    nn.seed(seed)
    X_train, y_train, X_test, y_test = load(seed)
    cut = int(0.85 * len(X_train))
    X_fit, y_fit, X_val, y_val = X_train[:cut], y_train[:cut], X_train[cut:], y_train[cut:]
    model = nn.layers.Sequential(           # 64 pixels → 128 hidden units → 10 class scores
        nn.layers.Linear(64, 128), nn.ReLU,
        nn.layers.Linear(128, 10),
    )

    def step(batch):
        x, y = batch
        z = model(x)                        # a NumPy batch becomes a constant node
        return nn.SoftmaxCELoss(z, y), z, y

    rng = np.random.default_rng(seed)

    def train_batches():          # a fresh shuffle every epoch
        order = rng.permutation(len(X_fit))
        return [(X_fit[rows], y_fit[rows])
                for rows in np.array_split(order, range(batch, len(order), batch))]

    out = out or tempfile.mkdtemp(prefix="nnkit-digits-")
    os.makedirs(out, exist_ok=True)
    best_path = os.path.join(out, "digits-best.npz")
    saver = nn.SaveBest(best_path, metric="val_loss", model=model, restore=True)
    stopper = nn.EarlyStopping("val_loss", patience=5)
    hooks = [nn.StopOnNaN(), stopper, saver]
    try:
        hooks.insert(0, nn.ProgressBar())      # first, so it ends its line before messages
    except ImportError:
        print("(install tqdm to see a progress bar)")
    try:
        plot = nn.PlotHistory(os.path.join(out, "digits-curves.png"))
        hooks.append(plot)
    except ImportError:
        plot = None                                     # no matplotlib: no curves
    trainer = nn.Trainer(step, nn.Adam(model.vars, lr=0.003), hooks=hooks,
                         metrics={"accuracy": nn.Accuracy()})
    history = trainer.fit(train_batches, epochs=epochs, val=[(X_val, y_val)])

    print(f"trained {len(history['epoch'])} epochs; best val_loss "
          f"{saver.monitor.best:.4f} at epoch {saver.best_epoch}, saved to {best_path}")
    if plot is not None:
        print(f"curves saved to {plot.path}")
    with nn.no_grad():
        predicted = model(X_test).data.argmax(axis=1)
    accuracy = float((predicted == y_test).mean())
    print(f"test accuracy: {accuracy:.4f}")
    return accuracy


if __name__ == "__main__":
    main(*sys.argv[1:2])
