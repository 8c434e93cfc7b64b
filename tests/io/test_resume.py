"""Exact resume: a training with Dropout, minibatches shuffled by nnkit's generator and a
learning-rate schedule, saved at epoch k and resumed in a fresh process, is bit-identical to the
uninterrupted run (the data-parallel version: tests/distributed/test_distributed.py, scenario
``resume_random``); what the checkpoint holds for it, and what load refuses."""
import json
import re
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import nnkit as nn
from nnkit.io.fileformat import META_KEY

ROOT = pathlib.Path(__file__).resolve().parents[2]
EPOCHS = 4


def data():
    rng = np.random.default_rng(21)
    X = rng.standard_normal((30, 4))
    y = (X[:, 0] - X[:, 1] * X[:, 2] > 0).astype(np.int64) + (X[:, 3] > 0.5)
    return [row[None, :] for row in X], y       # sequences of one step, for nn.minibatches


def build(seed, parallel=False):
    """The model (Dropout between two Linear layers, initialized from nnkit's generator),
    Adam, an exponential schedule stepped per epoch and a Trainer over batches reshuffled
    each epoch from nnkit's generator; ``parallel``: with DataParallel, each rank training
    on its shard of rank 0's batches with its own dropout masks."""
    nn.seed(seed)
    model = nn.layers.Sequential(nn.layers.Linear(4, 12), nn.Tanh, nn.layers.Dropout(0.3),
                                 nn.layers.Linear(12, 3))
    for p in model.vars:
        p.data = p.data.astype(np.float64)
    optimizer = nn.Adam(model.vars, lr=0.05)
    schedule = nn.ExponentialLR(optimizer, 0.8)

    def step(batch):
        x, _, t = batch
        z = model(nn.NetVar(x[0], requires_grad=False))
        return nn.SoftmaxCELoss(z, t), z, t

    hooks = [nn.LRSchedule(schedule)] + ([nn.distributed.DataParallel(model)] if parallel
                                         else [])
    trainer = nn.Trainer(step, optimizer, hooks=hooks, metrics={"accuracy": nn.Accuracy()})
    seqs, labels = data()
    return model, optimizer, schedule, trainer, lambda: nn.minibatches(seqs, labels, 8,
                                                                       shard=parallel)


def outcome(model, optimizer, trainer):
    """Every array the run ends with (parameters, optimizer state) and its logs (but time)."""
    arrays = {f"param.{name}": p.data for name, p in model.named_vars().items()}
    for position, entry in enumerate(optimizer.state_dict()["state"]):
        arrays.update({f"opt.{position}.{key}": value for key, value in entry.items()
                       if hasattr(value, "shape")})
    logs = {key: values for key, values in trainer.history.items() if key != "time"}
    return arrays, {"logs": logs, "lr": optimizer.lr, "epoch": trainer.epoch,
                    "steps": trainer.steps, "rng": nn.get_rng_state()}


def run(phase, folder, k=0):
    """One phase, in its own process: ``straight`` trains EPOCHS epochs; ``first`` trains k
    and saves; ``resumed`` builds the model anew (other weights), loads and trains the rest."""
    folder = pathlib.Path(folder)
    checkpoint = folder / f"at-{k}.npz"
    if phase == "straight":
        model, optimizer, schedule, trainer, batches = build(seed=5)
        trainer.fit(batches, epochs=EPOCHS)
    elif phase == "first":
        model, optimizer, schedule, trainer, batches = build(seed=5)
        trainer.fit(batches, epochs=k)
        nn.save(checkpoint, model, optimizer=optimizer, schedule=schedule, trainer=trainer)
        return
    else:
        model, optimizer, schedule, trainer, batches = build(seed=99)
        nn.load(checkpoint, model, optimizer=optimizer, schedule=schedule, trainer=trainer,
                rng=True)
        trainer.fit(batches, epochs=EPOCHS - k)
    arrays, numbers = outcome(model, optimizer, trainer)
    np.savez(folder / f"{phase}-{k}.npz", **arrays)
    (folder / f"{phase}-{k}.json").write_text(json.dumps(numbers))


def in_fresh_process(phase, folder, k=0):
    command = [sys.executable, "-c", f"from tests.io.test_resume import run; "
                                     f"run({phase!r}, {str(folder)!r}, {k})"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
                               "OPENBLAS_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    if phase != "first":
        with np.load(folder / f"{phase}-{k}.npz") as saved:
            arrays = dict(saved)
        return arrays, json.loads((folder / f"{phase}-{k}.json").read_text())


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    folder = tmp_path_factory.mktemp("straight")
    return in_fresh_process("straight", folder)


@pytest.mark.parametrize("k", [1, 3])
def test_a_run_resumed_in_a_fresh_process_is_bit_identical_to_the_uninterrupted_one(
        straight, tmp_path, k):
    in_fresh_process("first", tmp_path, k)
    arrays, numbers = in_fresh_process("resumed", tmp_path, k)
    expected_arrays, expected = straight
    assert arrays.keys() == expected_arrays.keys() and len(arrays) == 12
    differing = [key for key in arrays if not np.array_equal(arrays[key], expected_arrays[key])]
    assert differing == [], f"{len(differing)} of {len(arrays)} arrays differ: {differing}"
    assert numbers == expected            # logs of every epoch, lr, counts, generator state
    assert numbers["logs"]["epoch"] == [1, 2, 3, 4] and numbers["lr"] == 0.05 * 0.8 ** 4


def saved_run(tmp_path, **save):
    model, optimizer, schedule, trainer, batches = build(seed=5)
    trainer.fit(batches, epochs=2)
    path = nn.save(tmp_path / "run.npz", model, optimizer=optimizer, **save)
    return path, (model, optimizer, schedule, trainer, batches)


def meta(path):
    with np.load(path) as file:
        return json.loads(bytes(file[META_KEY]).decode())


def test_the_file_holds_the_generator_state_by_default_as_plain_data(tmp_path):
    path, (model, optimizer, schedule, trainer, _) = saved_run(tmp_path)
    described = meta(path)
    assert described["rng"] == [nn.get_rng_state()]
    assert "schedule" not in described and "trainer" not in described
    path = nn.save(tmp_path / "none.npz", model, rng=False)
    assert "rng" not in meta(path)
    path = nn.save(tmp_path / "all.npz", model, schedule=schedule, trainer=trainer)
    described = meta(path)
    assert described["schedule"] == {"type": "ExponentialLR", "state": schedule.state_dict()}
    assert described["trainer"]["state"]["epoch"] == 2
    assert described["trainer"]["state"]["history"]["epoch"] == [1, 2]


def test_loading_weights_leaves_the_random_stream_alone_unless_asked(tmp_path):
    path, (model, *_) = saved_run(tmp_path)
    nn.seed(123)
    before = nn.get_rng_state()
    nn.load(path, model)
    assert nn.get_rng_state() == before
    nn.load(path, model, rng=True)
    assert nn.get_rng_state() == meta(path)["rng"][0]


@pytest.mark.parametrize("saved, loaded, message", [
    ({"rng": False}, {"rng": True}, "has no random generator state (saved with rng=False"),
    ({}, {"schedule": True}, "has no schedule state (saved without schedule="),
    ({}, {"trainer": True}, "has no trainer state"),
    ({"schedule": "step"}, {"schedule": True}, "holds the state of a StepLR, not of a "
                                               "ExponentialLR"),
    ({"rng": [nn.get_rng_state(), nn.get_rng_state()]}, {"rng": True},
     "holds the random generator states of 2 process(es), this job has 1"),
], ids=["no-rng", "no-schedule", "no-trainer", "another-schedule", "two-ranks"])
def test_load_refuses_what_the_file_lacks_before_changing_anything(
        tmp_path, saved, loaded, message):
    path, (model, optimizer, schedule, trainer, _) = saved_run(tmp_path)
    if saved.get("schedule") == "step":
        saved = {"schedule": nn.StepLR(optimizer, 2)}
    path = nn.save(tmp_path / "other.npz", model, optimizer=optimizer, **saved)
    for p in model.vars:
        p.data = p.data + 1.0
    kept = [p.data.copy() for p in model.vars], optimizer.lr, schedule.t, trainer.epoch
    rng_before = nn.get_rng_state()
    keywords = {key: {"schedule": schedule, "trainer": trainer}.get(key, value)
                for key, value in loaded.items()}
    with pytest.raises(nn.CheckpointError, match=message.replace("(", r"\(").replace(")", r"\)")):
        nn.load(path, model, optimizer=optimizer, **keywords)
    assert all(np.array_equal(p.data, q) for p, q in zip(model.vars, kept[0]))
    assert (optimizer.lr, schedule.t, trainer.epoch) == kept[1:]
    assert nn.get_rng_state() == rng_before


def test_a_corrupted_schedule_or_generator_state_is_refused_naming_it(tmp_path):
    path, (model, optimizer, schedule, trainer, _) = saved_run(tmp_path)
    bad = {"bit_generator": "PCG64", "state": {"state": 1.5, "inc": 1}, "has_uint32": 0,
           "uinteger": 0}
    with pytest.raises(ValueError, match=r"save: rng\[0\]: state\['state'\]\['state'\] must "
                                         "be an int"):
        nn.save(tmp_path / "bad.npz", model, rng=[bad])
    with pytest.raises(TypeError, match="save: rng must be True"):
        nn.save(tmp_path / "bad.npz", model, rng="yes")
    with pytest.raises(TypeError, match="save: schedule must be an nnkit schedule"):
        nn.save(tmp_path / "bad.npz", model, schedule=optimizer.lr)
    assert not (tmp_path / "bad.npz").exists()
    schedule.t = -1                       # a state no schedule takes
    path = nn.save(tmp_path / "neg.npz", model, optimizer=optimizer, schedule=schedule)
    schedule.t = 2
    with pytest.raises(nn.CheckpointError, match="its schedule state does not fit: "
                                                 "ExponentialLR.load_state_dict: t"):
        nn.load(path, model, optimizer=optimizer, schedule=schedule)
    assert schedule.t == 2
    with pytest.raises(TypeError, match="load: rng must be True or False"):
        nn.load(path, model, rng=1)


def test_old_checkpoints_and_files_without_the_new_entries_keep_loading(tmp_path):
    version1 = nn.load(ROOT / "tests" / "data" / "v1_ffn_adam.npz")
    assert version1.model is not None
    with pytest.raises(nn.CheckpointError, match="has no random generator state"):
        nn.load(ROOT / "tests" / "data" / "v1_dict.npz", rng=True)
    path, (model, optimizer, *_) = saved_run(tmp_path, rng=False)      # as files were
    assert not {"rng", "schedule", "trainer"} & meta(path).keys()
    assert nn.load(path, model, optimizer=optimizer).model is model


def test_a_trainer_state_is_checked_before_it_is_taken():
    *_, trainer, batches = build(seed=5)
    trainer.fit(batches, epochs=1)
    state = trainer.state_dict()
    assert state["epoch"] == 1 and state["steps"] == 4 and state["history"]["samples"] == [30]
    for bad, error, message in [
            ({**state, "epoch": -1}, ValueError, "epoch"),
            ({**state, "steps": 2.5}, TypeError, "steps"),
            ({k: v for k, v in state.items() if k != "history"}, ValueError,
             r"missing \['history'\]"),
            ({**state, "history": {"epoch": [1], "loss": []}}, ValueError, "lengths")]:
        with pytest.raises(error, match=message):
            trainer.load_state_dict(bad)
        assert trainer.state_dict() == state
    trainer.load_state_dict({"epoch": 7, "steps": 3, "history": {"epoch": [7]}})
    assert (trainer.epoch, trainer.steps, dict(trainer.history)) == (7, 3, {"epoch": [7]})


def test_the_resuming_page_runs():
    """docs/resuming.md's first snippet resumes bit-identically (its asserts); the second
    needs MPI ranks and is the scenario of test_distributed.py."""
    text = (ROOT / "docs" / "resuming.md").read_text()
    first = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]
    exec(compile(first, "docs/resuming.md", "exec"), {"__name__": "resuming"})


def test_a_schedule_checks_a_saved_state_without_changing_anything():
    first = nn.CosineLR(nn.GD([nn.NetVar(np.ones(2))], lr=1.0), total=10, min_lr=0.1)
    first.step()
    state = first.state_dict()
    other = nn.CosineLR(nn.GD([nn.NetVar(np.ones(2))], lr=2.0), total=10, min_lr=0.1)
    kept = other.state_dict(), other.optimizer.lr
    other.check_state_dict(state)
    for bad, message in [({**state, "t": -1}, "t"), ({**state, "base": float("inf")}, "base"),
                         ({k: v for k, v in state.items() if k != "t"}, "missing")]:
        with pytest.raises(ValueError, match=message):
            other.check_state_dict(bad)
    assert (other.state_dict(), other.optimizer.lr) == kept
    other.load_state_dict(state)
    assert other.optimizer.lr == first.optimizer.lr and other.t == 1


@pytest.mark.parametrize("entry, value, keywords", [
    ("schedule", 5, {"schedule": True}),
    ("trainer", {"type": "Trainer"}, {"trainer": True}),
    ("rng", {"bit_generator": "PCG64"}, {"rng": True}),
    ("rng", [{"bit_generator": "PCG64"}], {"rng": True}),
], ids=["schedule-not-a-dict", "trainer-without-state", "rng-not-a-list", "rng-malformed"])
def test_a_tampered_resume_entry_is_a_corrupted_file(tmp_path, entry, value, keywords):
    path, (model, optimizer, schedule, trainer, _) = saved_run(tmp_path)
    path = nn.save(path, model, optimizer=optimizer, schedule=schedule, trainer=trainer)
    with np.load(path) as file:
        arrays = dict(file)
    described = json.loads(bytes(arrays[META_KEY]).decode())
    described[entry] = value
    arrays[META_KEY] = np.frombuffer(json.dumps(described).encode(), dtype=np.uint8)
    np.savez(path, **arrays)
    keywords = {key: {"schedule": schedule, "trainer": trainer}.get(key, flag)
                for key, flag in keywords.items()}
    before = nn.get_rng_state(), schedule.state_dict(), trainer.state_dict()
    with pytest.raises(nn.CheckpointError, match="corrupted"):
        nn.load(path, model, optimizer=optimizer, **keywords)
    assert (nn.get_rng_state(), schedule.state_dict(), trainer.state_dict()) == before


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_every_checkpoint_format_stores_and_restores_the_resume_state(tmp_path, suffix):
    """nn.save / nn.load pick the format by suffix: the schedule, the Trainer's epoch and the
    generator state go through each format alike (a safetensors save refused the keywords)."""
    model, optimizer, schedule, trainer, batches = build(3)
    trainer.fit(batches, epochs=1)
    schedule.step()
    path = tmp_path / f"run{suffix}"
    nn.save(path, model, optimizer=optimizer, schedule=schedule, trainer=trainer)
    expected = nn.get_rng_state()
    later_model, later_optimizer, later_schedule, later_trainer, _ = build(4)
    nn.load(path, later_model, optimizer=later_optimizer, schedule=later_schedule,
            trainer=later_trainer, rng=True)
    assert nn.get_rng_state() == expected
    assert later_trainer.epoch == trainer.epoch == 1
    assert later_optimizer.lr == optimizer.lr != 0.05


def test_a_pytorch_state_dict_holds_no_resume_state(tmp_path):
    """A .pt file has no generator state: asking for it is refused, not silently skipped."""
    path = tmp_path / "weights.pt"
    path.write_bytes(b"")
    model = build(3)[0]
    with pytest.raises(nn.CheckpointError, match="generator state"):
        nn.load(path, model, rng=True)
