"""Scenarios that run under ``mpiexec`` for tests/distributed/test_distributed.py, and how to launch them.

    mpiexec -n 2 python -m tests.distributed.mpi_scenarios <scenario> <folder>

Each rank writes what the tests compare to ``<folder>/<scenario>-<rank>.npz`` (arrays) and
``.json`` (numbers and messages); the tests compute their single-process references with the
same functions in the pytest process (``parallel=False``, which never touches MPI).
"""
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import weakref

import numpy as np

import nnkit as nn
import nnkit.distributed as dist
from nnkit.distributed import connection

ROOT = pathlib.Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- launching

def mpiexec():
    """The mpiexec of the MPI that mpi4py uses: the one beside this Python (a venv with the
    ``mpich`` wheel), else the first on PATH; None when there is none."""
    beside = pathlib.Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.is_file() else shutil.which("mpiexec")


def why_no_mpi():
    """Why the MPI tests cannot run here, or None."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed (pip install 'nnkit[mpi]', or mpi4py with a system MPI)"
    if mpiexec() is None:
        return "mpi4py is installed but no mpiexec was found beside Python or on PATH"
    return None


def launch(ranks, arguments, timeout):
    """Run ``python <arguments>`` on ``ranks`` processes from the repository root, one BLAS
    thread each; returns ``(exit status, stdout, stderr)``, the status None when the job did not
    end within ``timeout`` seconds (then every process of it is killed)."""
    command = [mpiexec(), "-n", str(ranks)]
    version = subprocess.run([command[0], "--version"], capture_output=True, text=True).stdout
    if "Open MPI" in version or "OpenRTE" in version:          # 3 ranks on 2 cores; CI as root
        command += ["--oversubscribe"] + (["--allow-run-as-root"] if os.getuid() == 0 else [])
    command += [sys.executable, *map(str, arguments)]
    environment = {key: value for key, value in os.environ.items()
                   if not key.startswith(("PMI_", "PMIX_", "OMPI_", "MPIR_", "HYDRA_"))}
    environment.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
                       PYTHONPATH=str(ROOT), NNKIT_EXPECTED_RANKS=str(ranks))
    process = subprocess.Popen(command, cwd=ROOT, env=environment, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
        return process.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return (None, *process.communicate())


def run_scenario(ranks, scenario, folder, timeout):
    """``launch`` of a scenario of this module; returns ``(status, stdout + stderr)``."""
    status, out, err = launch(ranks, ["-m", "tests.distributed.mpi_scenarios", scenario, folder], timeout)
    return status, out + err


def results(folder, scenario, ranks):
    """``[(arrays, numbers)]`` written by each rank."""
    out = []
    for r in range(ranks):
        with np.load(pathlib.Path(folder) / f"{scenario}-{r}.npz") as saved:
            arrays = dict(saved)
        numbers = json.loads((pathlib.Path(folder) / f"{scenario}-{r}.json").read_text())
        out.append((arrays, numbers))
    return out


def _write(folder, scenario, arrays, numbers):
    path = pathlib.Path(folder) / f"{scenario}-{dist.rank()}"
    np.savez(path.with_suffix(".npz"), **arrays)
    path.with_suffix(".json").write_text(json.dumps(numbers))


# ----------------------------------------------------------------------------- the models

def mlp_data():
    """24 training rows in batches of 7, 7, 7 and 3 (uneven shards on 2 and 3 ranks), and 5
    validation rows."""
    rng = np.random.default_rng(7)
    X = rng.standard_normal((29, 5))
    y = (X[:, 0] + X[:, 1] * X[:, 2] > 0).astype(np.int64) + (X[:, 3] > 1)
    X_train, y_train = X[:24], y[:24]
    batches = [(X_train[i:i + 7], y_train[i:i + 7]) for i in range(0, 24, 7)]
    return batches, (X[24:], y[24:])


def mlp(seed):
    rng = np.random.default_rng(seed)
    return nn.FFN((nn.Multiply, nn.NetVar(rng.standard_normal((5, 8)) * 0.6)),
                  (nn.Add, nn.NetVar(rng.standard_normal((1, 8)) * 0.1)), (nn.Tanh,),
                  (nn.Multiply, nn.NetVar(rng.standard_normal((8, 3)) * 0.6)),
                  (nn.Add, nn.NetVar(np.zeros((1, 3)))))


def train_mlp(parallel, epochs=3, hooks=(), gpu=False):
    """The float64 MLP trained with Adam and gradient clipping (active: the clipped norm is
    the global gradient's); with ``parallel`` each rank gets its shard of every batch and of the
    validation rows, and the ranks start from different weights (rank 0's are broadcast).
    ``gpu``: model and data on the GPU (CuPy). Returns ``(model, optimizer, trainer)``."""
    batches, (X_val, y_val) = mlp_data()
    model = mlp(dist.rank() if parallel else 0)
    if parallel:
        batches = [(dist.shard(x), dist.shard(y)) for x, y in batches]
        X_val, y_val = dist.shard(X_val), dist.shard(y_val)
    if gpu:
        model.to_gpu()
        batches = [(nn.backend.to_gpu(x), nn.backend.to_gpu(y)) for x, y in batches]
        X_val, y_val = nn.backend.to_gpu(X_val), nn.backend.to_gpu(y_val)
    optimizer = nn.Adam(model.vars, lr=0.05, modifiers=[nn.ClipGradNorm(0.3)])

    def step(batch):
        x, y = batch
        z = model(nn.NetVar(x, requires_grad=False))
        return nn.SoftmaxCELoss(z, y), z, y

    hooks = list(hooks) + ([dist.DataParallel(model)] if parallel else [])
    trainer = nn.Trainer(step, optimizer, hooks=hooks, metrics={"accuracy": nn.Accuracy()})
    trainer.fit(batches, epochs=epochs, val=[(X_val, y_val)])
    return model, optimizer, trainer


def sequence_data():
    rng = np.random.default_rng(3)
    seqs = [rng.integers(0, 6, rng.integers(2, 10)) for _ in range(27)]
    return seqs, [np.roll(s, -1) for s in seqs]          # the next token, as a target


def train_sequences(parallel, epochs=2):
    """A float64 LSTM language model on padded, bucketed, shuffled minibatches; the loss is a
    mean over the valid positions, which differ in number from shard to shard."""
    seqs, targets = sequence_data()
    model = nn.SequenceModel(6, 5, 6, cell="lstm", embedding=4,
                             seed=dist.rank() if parallel else 0)
    for p in model.vars:
        p.data = p.data.astype(np.float64)
    optimizer = nn.Adam(model.vars, lr=0.02)

    def step(batch):
        x, lengths, t = batch
        z = model(x, lengths)
        mask = np.arange(len(x))[:, None] < lengths[None, :]
        return nn.SoftmaxCELoss(z, t, lengths=lengths), z, t, mask

    hooks = [dist.DataParallel(model)] if parallel else []
    trainer = nn.Trainer(step, optimizer, hooks=hooks, metrics={"accuracy": nn.Accuracy()})
    trainer.fit(lambda: nn.minibatches(seqs, targets, 6, seed=trainer.epoch, bucket=2,
                                       shard=parallel), epochs=epochs)
    return model, optimizer, trainer


def state(model, optimizer):
    """Copies of the parameters and optimizer state as named arrays; counts as numbers."""
    host = nn.backend.to_cpu
    arrays = {f"param.{name}": host(p.data).copy() for name, p in model.named_vars().items()}
    numbers = {}
    for position, entry in enumerate(optimizer.state_dict()["state"]):
        for key, value in entry.items():
            if hasattr(value, "shape"):
                arrays[f"opt.{position}.{key}"] = host(value).copy()
            else:
                numbers[f"opt.{position}.{key}"] = value
    return arrays, numbers


def history(trainer):
    return {key: [float(v) for v in values] for key, values in trainer.history.items()
            if key != "time"}


# ----------------------------------------------------------------------------- the scenarios

class GradientNorms(nn.Hook):
    """The norm of the gradient that every step's hooks see (after the all-reduce)."""

    def __init__(self):
        self.norms = []

    def on_before_step(self, trainer, loss):
        self.norms.append(float(np.sqrt(sum((nn.backend.to_cpu(p.g) ** 2).sum()
                                            for p in trainer.params))))


class _Epochs(nn.Hook):
    """A hook of one's own that only rank 0 runs."""
    root_only = True

    def __init__(self):
        self.seen = 0

    def on_epoch_end(self, trainer, logs):
        self.seen += 1


def equality(folder):
    """The MLP and the sequence model, trained data-parallel (saved for comparison with one
    process), with a SaveBest, a ProgressBar and a hook of one's own that only rank 0 runs."""
    saver = nn.SaveBest(pathlib.Path(folder) / "best.npz", metric="val_loss")
    bar, epochs, norms = nn.ProgressBar(file=sys.stdout), _Epochs(), GradientNorms()
    model, optimizer, trainer = train_mlp(True, hooks=[norms, bar, saver, epochs])
    arrays, numbers = state(model, optimizer)
    numbers.update(history=history(trainer), steps=trainer.steps, best_epoch=saver.best_epoch,
                   samples=trainer.history["samples"],
                   root_only_epochs=epochs.seen, gradient_norms=norms.norms)
    sequence_model, sequence_optimizer, sequence_trainer = train_sequences(True)
    more, counts = state(sequence_model, sequence_optimizer)
    arrays.update({f"seq.{key}": value for key, value in more.items()})
    numbers.update({f"seq.{key}": value for key, value in counts.items()},
                   seq_history=history(sequence_trainer))
    _write(folder, "equality", arrays, numbers)


def resume(folder):
    """Train 2 epochs, rank 0 saves model and optimizer, train 2 more; then fresh models (other
    weights, no optimizer state), rank 0 alone loads the checkpoint, and 2 epochs again."""
    path = pathlib.Path(folder) / "resume.npz"
    model, optimizer, trainer = train_mlp(True, epochs=2)
    if dist.rank() == 0:
        nn.save(path, model, optimizer=optimizer, extra={"epoch": 2})
    saved, _ = state(model, optimizer)
    shards = [(dist.shard(x), dist.shard(y)) for x, y in mlp_data()[0]]
    trainer.fit(shards, epochs=2)
    straight, straight_counts = state(model, optimizer)
    dist.barrier()                                  # the checkpoint is written

    fresh = mlp(100 + dist.rank())
    fresh_optimizer = nn.Adam(fresh.vars, lr=0.05, modifiers=[nn.ClipGradNorm(0.3)])
    if dist.rank() == 0:
        nn.load(path, fresh, optimizer=fresh_optimizer)

    def step(batch):
        x, y = batch
        z = fresh(nn.NetVar(x, requires_grad=False))
        return nn.SoftmaxCELoss(z, y), z, y

    again = nn.Trainer(step, fresh_optimizer, hooks=[dist.DataParallel(fresh)],
                       metrics={"accuracy": nn.Accuracy()})
    again.fit(shards, epochs=2)
    resumed, resumed_counts = state(fresh, fresh_optimizer)
    arrays = {**{f"saved.{k}": v for k, v in saved.items()},
              **{f"straight.{k}": v for k, v in straight.items()},
              **{f"resumed.{k}": v for k, v in resumed.items()}}
    _write(folder, "resume", arrays, {"straight": straight_counts, "resumed": resumed_counts})


def resume_random_first(folder):
    """tests/io/test_resume.py's training (Dropout, shuffled minibatches, a schedule) under
    DataParallel, each rank seeded differently: 4 epochs straight; then from the same seeds 2
    epochs, and rank 0 saves with every rank's generator state."""
    from tests.io import test_resume
    model, optimizer, schedule, trainer, batches = test_resume.build(5 + dist.rank(), True)
    trainer.fit(batches, epochs=test_resume.EPOCHS)
    arrays, numbers = test_resume.outcome(model, optimizer, trainer)
    model, optimizer, schedule, trainer, batches = test_resume.build(5 + dist.rank(), True)
    trainer.fit(batches, epochs=2)
    states = dist.rng_states()
    if dist.rank() == 0:
        nn.save(pathlib.Path(folder) / "resume_random.npz", model, optimizer=optimizer,
                schedule=schedule, trainer=trainer, rng=states)
    _write(folder, "resume_random_first", arrays, numbers)


def resume_random_rest(folder):
    """Fresh processes (other seeds): every rank loads the checkpoint, its own generator state
    included, and trains the last 2 epochs."""
    from tests.io import test_resume
    model, optimizer, schedule, trainer, batches = test_resume.build(99 + dist.rank(), True)
    nn.load(pathlib.Path(folder) / "resume_random.npz", model, optimizer=optimizer,
            schedule=schedule, trainer=trainer, rng=True)
    trainer.fit(batches, epochs=test_resume.EPOCHS - 2)
    _write(folder, "resume_random_rest", *test_resume.outcome(model, optimizer, trainer))


def unlike_weights(folder):
    """A hand-written loop whose ranks build their model from different seeds and never call
    broadcast_vars: the first allreduce_grads raises on every rank. Then, from equal weights,
    one rank's parameter drifts before the second loop's 2nd call: with
    check_parameters_every(3) the process's calls 1, 4, 7, ... check, so its 3rd raises."""
    X, y = mlp_data()[0][0]
    errors = {}

    def train(model, steps, drift_at=None):
        optimizer = nn.GD(model.vars, lr=0.1)
        for number in range(1, steps + 1):
            if number == drift_at and dist.rank() == 1:
                model.vars[-1].data = model.vars[-1].data + 1e-3
            nn.SoftmaxCELoss(model(nn.NetVar(dist.shard(X), requires_grad=False)),
                             dist.shard(y)).back()
            try:
                dist.allreduce_grads(model, weight=len(dist.shard(X)))
            except ValueError as error:
                return number, str(error)
            optimizer.step()
        return None, None

    nn.seed(dist.rank())
    model = nn.layers.Sequential(nn.layers.Linear(5, 4), nn.Tanh, nn.layers.Linear(4, 3))
    errors["seeds"] = train(model, 3)
    nn.seed(0)
    model = nn.layers.Sequential(nn.layers.Linear(5, 4), nn.Tanh, nn.layers.Linear(4, 3))
    before = dist.check_parameters_every()
    dist.check_parameters_every(3)
    try:
        errors["drift"] = train(model, 6, drift_at=2)
        dist.check_parameters_every(0)
        nn.seed(dist.rank())
        model = nn.layers.Sequential(nn.layers.Linear(5, 4), nn.Tanh, nn.layers.Linear(4, 3))
        errors["unchecked"] = train(model, 2)
    finally:
        dist.check_parameters_every(before)
    errors["default"] = before
    _write(folder, "unlike_weights", {}, errors)


class _Counting:
    """The communicator, counting the all-reduce calls, the dtypes of their buffers and how
    many of the ``watched`` arrays (weak references) are still alive at each call."""

    def __init__(self, comm, watched=()):
        self.comm, self.calls, self.dtypes, self.watched, self.alive = comm, 0, [], watched, []

    def Allreduce(self, send, receive, *args, **keywords):
        self.calls += 1
        self.dtypes.append(str(receive.dtype))
        self.alive.append(sum(reference() is not None for reference in self.watched))
        return self.comm.Allreduce(send, receive, *args, **keywords)

    def __getattr__(self, name):
        return getattr(self.comm, name)


class _StopOn(nn.Hook):
    """Stops on one rank only, at one batch, in one callback."""

    def __init__(self, where, rank, batch):
        self.where, self.rank, self.batch = where, rank, batch

    def _maybe(self, trainer):
        if dist.rank() == self.rank and trainer.steps + (self.where == "on_before_step") \
                == self.batch:
            trainer.stop(f"stopped by rank {self.rank}'s hook in {self.where}")

    def on_before_step(self, trainer, loss):
        if self.where == "on_before_step":
            self._maybe(trainer)

    def on_batch_end(self, trainer, logs):
        if self.where == "on_batch_end":
            self._maybe(trainer)


def train_batchnorm(parallel):
    """A float64 BatchNorm layer with momentum 1 (the running mean is the last batch's mean)
    and lr 0, over two batches of 6 rows; returns the running mean after one epoch."""
    rng = np.random.default_rng(5)
    X = rng.standard_normal((12, 4))
    stats = nn.BatchNormState(3, momentum=1.0)
    net = nn.FFN((nn.Multiply, nn.NetVar(rng.standard_normal((4, 3)))),
                 (nn.BatchNorm, None, None, stats))
    batches = [X[:6], X[6:]]
    if parallel:
        batches = [dist.shard(x) for x in batches]

    def step(x):
        return nn.L2Loss(net(nn.NetVar(x, requires_grad=False)), np.zeros((len(x), 3)))

    hooks = [dist.DataParallel(net)] if parallel else []
    nn.Trainer(step, nn.GD(net.vars, lr=0.0), hooks=hooks).fit(batches)
    return stats.running_mean


def train_summed(parallel):
    """A linear model trained for two epochs with DataParallel(average=False): the loss is
    each rank's share of the batch's mean (Σ over its rows / the batch's rows), 7 and 5 rows
    cut unevenly; returns (epoch losses, W)."""
    rng = np.random.default_rng(11)
    X, Y = rng.standard_normal((12, 3)), rng.standard_normal((12, 2))
    W = nn.NetVar(np.zeros((3, 2)))
    batches = [(X[:7], Y[:7], 7), (X[7:], Y[7:], 5)]
    if parallel:
        batches = [(dist.shard(x), dist.shard(y), n) for x, y, n in batches]

    def step(batch):
        x, y, rows = batch
        r = nn.NetVar(x, requires_grad=False) @ W - y
        return (r * r).sum() * (1 / rows), r, y

    hooks = [dist.DataParallel(average=False)] if parallel else []
    trainer = nn.Trainer(step, nn.GD([W], lr=0.1), hooks=hooks)
    trainer.fit(batches, epochs=2)
    return trainer.history["loss"], W.data


def train_batchnorm_uneven(parallel):
    """BatchNorm with momentum 1 over one batch of 7 rows (3, 2 and 2 on 3 ranks): the running
    mean averaged by rows is the batch's mean."""
    rng = np.random.default_rng(6)
    X = rng.standard_normal((7, 3))
    stats = nn.BatchNormState(3, momentum=1.0)
    net = nn.FFN((nn.BatchNorm, nn.NetVar(np.ones(3)), None, stats))

    def step(x):
        return nn.L2Loss(net(nn.NetVar(x, requires_grad=False)), np.zeros((len(x), 3)))

    hooks = [dist.DataParallel(net)] if parallel else []
    nn.Trainer(step, nn.GD(net.vars, lr=0.0), hooks=hooks).fit(
        [dist.shard(X) if parallel else X])
    return stats.running_mean


def train_batchnorm_ignored(parallel):
    """As ``train_batchnorm_uneven``, with a loss whose weights are not the rows (most targets
    ignored): the running mean is still the batch's mean, rows weighing the ranks."""
    rng = np.random.default_rng(7)
    X = rng.standard_normal((7, 3))
    labels = np.array([0, -1, -1, 1, -1, 2, 1])
    stats = nn.BatchNormState(3, momentum=1.0)
    net = nn.FFN((nn.BatchNorm, nn.NetVar(np.ones(3)), None, stats))

    def step(batch):
        x, t = batch
        return nn.SoftmaxCELoss(net(nn.NetVar(x, requires_grad=False)), t, ignore_index=-1)

    hooks = [dist.DataParallel(net)] if parallel else []
    nn.Trainer(step, nn.GD(net.vars, lr=0.0), hooks=hooks).fit(
        [(dist.shard(X), dist.shard(labels)) if parallel else (X, labels)])
    return stats.running_mean


def collectives(folder):
    """The functions one by one, and the refusals that every rank must make alike."""
    r, n = dist.rank(), dist.size()
    numbers = {"rank": r, "size": n}
    arrays = {}
    dist.barrier()
    numbers["sum"] = dist.allreduce(r + 1)
    numbers["mean"] = dist.allreduce(float(r), "mean")
    numbers["max"] = dist.allreduce(r, "max")
    numbers["min"] = dist.allreduce(-r, "min")
    counting = connection._world = _Counting(connection._communicator())
    try:
        arrays["array_sum"] = dist.allreduce(np.arange(4, dtype=np.float16) * (r + 1))
    finally:
        connection._world = counting.comm
    numbers["float16_reduced_as"] = counting.dtypes
    arrays["int_sum"] = dist.allreduce(np.full((2, 2), r, dtype=np.int32))
    arrays["broadcast"] = dist.broadcast(np.array([r, 10 * r]), root=n - 1)
    numbers["shard_count"] = list(dist.shard(10))
    numbers["shard_list"] = dist.shard(list("abcdefg"))

    # broadcast_vars: a Module with buffers, from the last rank
    net = nn.FFN((nn.Multiply, nn.NetVar(np.full((2, 3), float(r)))),
                 (nn.BatchNorm, nn.NetVar(np.ones(3, np.float32) * r), None,
                  nn.BatchNormState(3)))
    net.topology[1][3].running_mean[...] = r
    dist.broadcast_vars(net, root=n - 1)
    arrays["bcast_W"] = net.vars[0].data
    arrays["bcast_gamma"] = net.vars[1].data
    arrays["bcast_running_mean"] = net.topology[1][3].running_mean

    # allreduce_grads: two dtypes, one call each; gradients missing on some ranks or on all
    W64 = nn.NetVar(np.zeros((3, 2)))
    b64 = nn.NetVar(np.zeros((1, 2)))
    W32 = nn.NetVar(np.zeros((2, 2), np.float32))
    some = nn.NetVar(np.zeros((1, 3)))            # a gradient on rank 0 only
    none = nn.NetVar(np.zeros((1, 3)))            # no gradient anywhere
    W64.g, b64.g, W32.g = r + 1.0, 2.0 * (r + 1), r + 1.0
    if r == 0:
        some.g = 6.0
    counting = _Counting(connection._communicator(),
                         [weakref.ref(p._g) for p in (W64, W32, b64)])
    connection._world = counting
    try:
        dist.allreduce_grads([W64, W32, b64, some, none], weight=r + 1)
    finally:
        connection._world = counting.comm
    numbers["grad_calls"] = counting.dtypes
    numbers["grads_alive_at_calls"] = counting.alive
    arrays.update(g_W64=W64.g, g_b64=b64.g, g_W32=W32.g, g_some=some.g)
    numbers["none_has_grad"] = none._g is not None
    numbers["g_W32_dtype"] = str(W32.g.dtype)

    # minibatches(shard=True): unseeded generators that differ, the batches still rank 0's
    nn.seed(1000 + r)
    seqs = [[k] * (1 + k % 3) for k in range(17)]
    local = [batch[0][0].tolist() for batch in nn.minibatches(seqs, batch_size=5, shard=True)]
    numbers["minibatch_rows"] = local
    # with bucketing too: the 2 rows too few for 3 ranks are a random 2, not the 2 longest
    seqs = [[k] * (1 + k) for k in range(17)]
    numbers["bucketed_rows"] = [
        sorted(sum((batch[0][0].astype(int).tolist() for batch in nn.minibatches(
            seqs, batch_size=5, shard=True, bucket=True, seed=epoch)), []))
        for epoch in range(6)]

    # refusals made alike on every rank (caught: no rank is left waiting)
    refusals = {}
    try:
        dist.allreduce_grads([W64], weight=0)
    except ValueError as error:
        refusals["weight"] = str(error)
    try:
        nn.minibatches(seqs, batch_size=n - 1, shard=True)
    except ValueError as error:
        refusals["batch_size"] = str(error)
    try:
        dist.broadcast_vars([nn.NetVar(np.zeros((2, 2 + (r == 1))))])
    except ValueError as error:
        refusals["broadcast_vars"] = str(error)
    try:
        nn.minibatches(seqs[:17 - (r == 1)], batch_size=5, shard=True)
    except ValueError as error:
        refusals["minibatches"] = str(error)
    numbers["refusals"] = refusals

    # a rank whose shard counts for nothing (weight 0, its loss 0/0 = NaN) adds zeros
    lost = nn.NetVar(np.zeros((1, 2)))
    lost.g = np.full((1, 2), np.nan) if r == 0 else np.full((1, 2), r + 1.0)
    dist.allreduce_grads([lost], weight=0 if r == 0 else 1)
    arrays["g_weight0"] = lost.g
    # numbers of different kinds are summed as floats; arrays of different shapes are refused
    numbers["mixed_sum"] = dist.allreduce(0 if r == 0 else 2.5)
    try:
        dist.allreduce(np.zeros(2 + (r == 1)))
    except ValueError as error:
        refusals["allreduce_shapes"] = str(error)
    try:
        dist.allreduce(np.zeros(2, dtype=np.int64 if r == 0 else np.float64))
    except ValueError as error:
        refusals["allreduce_dtypes"] = str(error)

    # the epoch's loss with average=False: each batch's summed shares, weighed by its size
    numbers["summed_loss"], arrays["summed_W"] = train_summed(True)

    # BatchNorm's running statistics averaged over the ranks at the epoch's end
    arrays["running_mean"] = train_batchnorm(True)
    arrays["running_mean_uneven"] = train_batchnorm_uneven(True)
    arrays["running_mean_ignored"] = train_batchnorm_ignored(True)

    # SaveBest(restore=True) restores on rank 0 alone; the others take rank 0's values
    saver = nn.SaveBest(pathlib.Path(folder) / "restored.npz", "loss", mode="max", restore=True)
    model, optimizer, trainer = train_mlp(True, hooks=[saver])
    arrays["restored"] = model.vars[0].data
    numbers["restored_epoch"] = saver.best_epoch

    # evaluate: a rank without validation batches (2 rows on 3 ranks) still gets the whole loss
    X_val, y_val = mlp_data()[1]
    x, y = dist.shard(X_val[:2]), dist.shard(y_val[:2])
    numbers["evaluated"] = trainer.evaluate([(x, y)] if len(x) else [])
    with nn.no_grad():
        whole = nn.SoftmaxCELoss(model(nn.NetVar(X_val[:2], requires_grad=False)), y_val[:2])
    numbers["whole_loss"] = whole.item()

    # a hook stopping on one rank only: every rank stops at the same step, before the update
    # (on_before_step, at the second batch) or after it (on_batch_end, at the epoch's last)
    for where, batch in (("on_before_step", 2), ("on_batch_end", 4)):
        model, optimizer, trainer = train_mlp(True, hooks=[_StopOn(where, n - 1, batch)])
        arrays[f"stop_{where}"] = model.vars[0].data
        numbers[f"stop_{where}"] = {"steps": trainer.steps, "reason": trainer.stop_reason,
                                    "epochs": len(trainer.history.get("epoch", []))}
    _write(folder, "collectives", arrays, numbers)


class _Fail(nn.Hook):
    def on_before_step(self, trainer, loss):
        if dist.rank() == 1 and trainer.steps == 2:
            raise ValueError("injected failure on rank 1")


def failing_rank(folder):
    """Rank 1 raises in its third step, while the others wait in the next collective."""
    train_mlp(True, epochs=50, hooks=[_Fail()])


def uneven_batches(folder):
    """Rank 0 has one batch more than the others: every rank raises, none waits."""
    model = mlp(0)
    batches = [b for b in mlp_data()[0]]
    if dist.rank() == 0:
        batches = batches + batches[:1]

    def step(batch):
        x, y = batch
        return nn.SoftmaxCELoss(model(nn.NetVar(x, requires_grad=False)), y)

    trainer = nn.Trainer(step, nn.GD(model.vars), hooks=[dist.DataParallel(model)])
    try:
        trainer.fit(batches)
    except ValueError as error:
        _write(folder, "uneven_batches", {}, {"error": str(error)})


def unlike_fits(folder):
    """Rank 1 asks fit for one epoch more (then a validation set rank 0 does not give): every
    rank raises, naming it, instead of failing inside MPI."""
    model = mlp(0)
    batches = list(mlp_data()[0])

    def step(batch):
        x, y = batch
        return nn.SoftmaxCELoss(model(nn.NetVar(x, requires_grad=False)), y)

    errors = {}
    for name, (epochs, val) in {"epochs": (1 + dist.rank(), None),
                                "val": (1, batches[:1] if dist.rank() == 1 else None)}.items():
        trainer = nn.Trainer(step, nn.GD(model.vars), hooks=[dist.DataParallel(model)])
        try:
            trainer.fit(batches, epochs=epochs, val=val)
        except ValueError as error:
            errors[name] = str(error)
    _write(folder, "unlike_fits", {}, errors)


def gpu_equality(folder):
    """The MLP of ``equality`` with model and data on the GPU (the gradients reduced through
    host buffers, or directly with NNKIT_MPI_CUDA_AWARE=1)."""
    model, optimizer, trainer = train_mlp(True, gpu=True)
    arrays, numbers = state(model, optimizer)
    numbers.update(history=history(trainer))
    _write(folder, "gpu_equality", arrays, numbers)


def early_failure(folder):
    """Rank 1 raises before it has called nnkit.distributed at all (MPI not even started),
    while rank 0 waits in a barrier."""
    if os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK")) == "1":
        raise ValueError("early failure on rank 1")
    dist.barrier()


SCENARIOS = {f.__name__: f for f in (equality, resume, resume_random_first,
                                     resume_random_rest, unlike_weights, collectives,
                                     failing_rank,
                                     uneven_batches, unlike_fits, gpu_equality, early_failure)}


if __name__ == "__main__":
    if sys.argv[1] != "early_failure":
        expected = int(os.environ.get("NNKIT_EXPECTED_RANKS", dist.size()))
        if dist.size() != expected:
            raise SystemExit(f"MPI sees {dist.size()} processes, {expected} were launched: "
                             "mpi4py and mpiexec belong to different MPI installations")
    SCENARIOS[sys.argv[1]](sys.argv[2])
