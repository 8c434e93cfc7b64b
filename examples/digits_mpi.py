"""The digits MLP of examples/digits.py, trained data-parallel over MPI.

    mpiexec -n 2 python examples/digits_mpi.py [output-directory [epochs]]
    python examples/digits_mpi.py                 # the same script on one process

Every process (rank) builds the model and reads the data; ``DataParallel`` gives every rank
rank 0's weights, each rank computes the gradient of its shard of every batch, the gradients are
averaged, and every copy takes the same Adam step. The validation and test rows are sharded too:
the Trainer sums the validation loss over the ranks, and the test accuracy is summed with
``dist.allreduce``. Only rank 0 shows the progress bar, writes the best model to
``digits-best.npz`` in the output directory (a new temporary directory by default) and prints,
as its last line, ``test accuracy: 0.XXXX``.
"""
import os
import sys
import tempfile

import numpy as np

import nnkit as nn
import nnkit.distributed as dist
from digits import load                   # examples/digits.py: the same data and split


def main(out=None, epochs=100, batch=64, seed=0):
    nn.seed(seed + dist.rank())           # any seeds: DataParallel broadcasts rank 0's weights
    X_train, y_train, X_test, y_test = load(seed)
    cut = int(0.85 * len(X_train))
    X_fit, y_fit, X_val, y_val = X_train[:cut], y_train[:cut], X_train[cut:], y_train[cut:]
    model = nn.layers.Sequential(nn.layers.Linear(64, 128), nn.ReLU, nn.layers.Linear(128, 10))

    def step(batch):
        x, y = batch
        z = model(x)
        return nn.SoftmaxCELoss(z, y), z, y

    rng = np.random.default_rng(seed)     # the same shuffle on every rank

    def train_batches():                  # each rank's shard of every batch of 64
        order = rng.permutation(len(X_fit))
        return [(X_fit[dist.shard(rows)], y_fit[dist.shard(rows)])
                for rows in np.array_split(order, range(batch, len(order), batch))]

    if dist.rank() == 0:                  # rank 0 alone writes (SaveBest runs there only)
        out = out or tempfile.mkdtemp(prefix="nnkit-digits-mpi-")
        os.makedirs(out, exist_ok=True)
    best_path = os.path.join(out or "", "digits-best.npz")
    saver = nn.SaveBest(best_path, metric="val_loss", model=model, restore=True)
    hooks = [dist.DataParallel(model), nn.StopOnNaN(), nn.EarlyStopping("val_loss", patience=5),
             saver]
    try:
        hooks.insert(0, nn.ProgressBar())  # shown by rank 0 only
    except ImportError:
        pass
    trainer = nn.Trainer(step, nn.Adam(model.vars, lr=0.003), hooks=hooks,
                         metrics={"accuracy": nn.Accuracy()})
    history = trainer.fit(train_batches, epochs=epochs,
                          val=[(dist.shard(X_val), dist.shard(y_val))])

    with nn.no_grad():                    # every rank scores its shard of the test rows
        predicted = model(dist.shard(X_test)).data.argmax(axis=1)
    correct = dist.allreduce(int((predicted == dist.shard(y_test)).sum()))
    accuracy = correct / len(X_test)
    if dist.rank() == 0:
        print(f"{dist.size()} process(es) trained {len(history['epoch'])} epochs; best "
              f"val_loss {saver.monitor.best:.4f} at epoch {saver.best_epoch}, saved to "
              f"{best_path}")
        print(f"test accuracy: {accuracy:.4f}")
    return accuracy


if __name__ == "__main__":
    main(*sys.argv[1:2], *map(int, sys.argv[2:3]))
