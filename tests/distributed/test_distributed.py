"""nnkit.distributed: one process without MPI, argument checks, and data-parallel training on 2
and 3 processes launched with mpiexec (tests/distributed/mpi_scenarios.py), each launch bounded by a
timeout; those are skipped, with the reason, where mpi4py or mpiexec is missing."""
import sys
import types

import numpy as np
import pytest

import nnkit as nn
import nnkit.distributed as dist
from nnkit.distributed import connection
from nnkit.distributed.collectives import _bounds
from tests.distributed import mpi_scenarios as scenarios

NO_MPI = scenarios.why_no_mpi()
needs_mpi = pytest.mark.skipif(NO_MPI is not None, reason=str(NO_MPI))
TIMEOUT = 90          # seconds for one mpiexec launch; each takes a few


@pytest.fixture
def alone(monkeypatch):
    """nnkit.distributed in a process without mpi4py (as after ``pip install nnkit``)."""
    monkeypatch.setattr(connection, "_world", None)
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    for variable in connection._LAUNCHERS:
        monkeypatch.delenv(variable, raising=False)
    return dist


# ----------------------------------------------------------------------------- one process

def test_one_process_without_mpi_is_rank_0_of_1_and_collectives_return_at_once(alone):
    assert (dist.rank(), dist.size()) == (0, 1)
    dist.barrier()
    assert isinstance(connection._communicator(), connection._Alone)
    assert dist.allreduce(3) == 3 and isinstance(dist.allreduce(3), int)
    assert dist.allreduce(2.5, "mean") == 2.5 and dist.broadcast(7) == 7
    values = np.arange(4.0)
    summed = dist.allreduce(values, "max")
    assert summed is not values and np.array_equal(summed, values)
    assert list(dist.shard(5)) == [0, 1, 2, 3, 4] and dist.shard((1, 2)) == (1, 2)

    w = nn.NetVar(np.arange(6.0).reshape(2, 3))
    unused = nn.NetVar(np.zeros((1, 2)))
    (w * 2.0).sum().back()
    gradient = w.g
    dist.broadcast_vars([w, unused])
    dist.allreduce_grads([w, unused], weight=5)
    assert w.g is gradient and np.array_equal(w.g, np.full((2, 3), 2.0))
    assert unused._g is None and np.array_equal(w.data, np.arange(6.0).reshape(2, 3))


def test_minibatches_shard_in_one_process_gives_the_whole_batches(alone):
    seqs, targets = scenarios.sequence_data()
    whole = list(nn.minibatches(seqs, targets, 5, seed=3, bucket=2))
    sharded = list(nn.minibatches(seqs, targets, 5, seed=3, bucket=2, shard=True))
    assert len(whole) == len(sharded)
    for a, b in zip(whole, sharded):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_data_parallel_trainer_in_one_process_trains_as_without_it(alone):
    model, optimizer, trainer = scenarios.train_mlp(True)
    reference, _, reference_trainer = scenarios.train_mlp(False)
    for p, q in zip(model.vars, reference.vars):
        assert np.array_equal(p.data, q.data)
    assert trainer.parallel is not None and trainer.parallel not in trainer.hooks
    assert scenarios.history(trainer) == scenarios.history(reference_trainer)


def test_an_uncaught_exception_prints_then_aborts_every_rank(monkeypatch, capsys):
    calls = []
    comm = types.SimpleNamespace(Get_rank=lambda: 1, Get_size=lambda: 3,
                                 Abort=lambda code: calls.append(("abort", code)))
    monkeypatch.setattr(connection, "_world", comm)
    monkeypatch.setattr(connection, "_hooked", False)
    monkeypatch.setattr(sys, "excepthook", lambda *info: calls.append(("printed", info[0])))
    connection._abort_on_uncaught_exception()
    connection._abort_on_uncaught_exception()                   # installed once
    sys.excepthook(ValueError, ValueError("boom"), None)
    assert calls == [("printed", ValueError), ("abort", 1)]
    assert "rank 1 of 3 stopped on ValueError; aborting every rank" in capsys.readouterr().err


def test_a_launch_that_mpi_cannot_see_is_refused(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)                  # no mpi4py at all
    assert isinstance(connection._connect({}), connection._Alone)
    with pytest.raises(RuntimeError, match=r"one of 4 processes \(PMI_SIZE=4\) but mpi4py "
                                           "cannot be used"):
        connection._connect({"PMI_SIZE": "4"})
    MPI = types.SimpleNamespace(COMM_WORLD=types.SimpleNamespace(Get_size=lambda: 1),
                                Get_library_version=lambda: "Some MPI 1.0\nmore")
    monkeypatch.setitem(sys.modules, "mpi4py", types.SimpleNamespace(MPI=MPI))
    with pytest.raises(RuntimeError, match=r"started 2 processes \(OMPI_COMM_WORLD_SIZE=2\) "
                                           r"but MPI sees 1: .*Some MPI 1.0"):
        connection._connect({"OMPI_COMM_WORLD_SIZE": "2"})


def test_a_world_of_several_processes_aborts_on_an_uncaught_exception(monkeypatch):
    monkeypatch.setattr(connection, "_hooked", False)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    before = sys.excepthook
    world = types.SimpleNamespace(Get_size=lambda: 2)
    monkeypatch.setitem(sys.modules, "mpi4py", types.SimpleNamespace(
        MPI=types.SimpleNamespace(COMM_WORLD=world)))
    monkeypatch.setattr(connection, "_MPI", None)
    assert connection._connect({}) is world
    assert connection._hooked and sys.excepthook is not before


@pytest.mark.parametrize("aware", [False, True], ids=["host-copies", "cuda-aware"])
def test_a_device_buffer_reaches_mpi_directly_when_cuda_aware_else_through_the_host(
        monkeypatch, aware):
    """The GPU half of every collective, with a stand-in for a CuPy array (no GPU here): the
    CUDA-aware path waits for the stream and hands MPI the device buffer itself; the other
    copies to the host once, calls MPI there, and copies back once to the buffer's device."""
    from nnkit import backend
    from nnkit.distributed import collectives
    events = []

    class DeviceArray:                       # what the collectives touch of a CuPy array
        device = types.SimpleNamespace(id=3)

        def __init__(self, values):
            self.values = values

    stream = types.SimpleNamespace(synchronize=lambda: events.append("synchronize"))
    xp = types.SimpleNamespace(cuda=types.SimpleNamespace(get_current_stream=lambda: stream))
    monkeypatch.setattr(backend, "array_module", lambda array: xp)
    monkeypatch.setattr(backend, "to_cpu",
                        lambda array: events.append("to host") or array.values.copy())
    monkeypatch.setattr(backend, "to_gpu",
                        lambda array, device: events.append(("to device", device)) or
                        DeviceArray(array))
    monkeypatch.setenv("NNKIT_MPI_CUDA_AWARE", "1" if aware else "0")

    def mpi(array):                          # an in-place MPI call: doubles what it is given
        events.append(("MPI", type(array).__name__))
        (array.values if isinstance(array, DeviceArray) else array)[...] *= 2

    buffer = DeviceArray(np.arange(3.0))
    result = collectives._through_mpi(buffer, mpi)
    np.testing.assert_array_equal(result.values, [0.0, 2.0, 4.0])
    if aware:
        assert events == ["synchronize", ("MPI", "DeviceArray")] and result is buffer
    else:
        assert events == ["to host", ("MPI", "ndarray"), ("to device", 3)]
    events.clear()
    host = np.arange(3.0)                     # a NumPy buffer: MPI gets it as it is, always
    assert collectives._through_mpi(host, mpi) is host and events == [("MPI", "ndarray")]


REFUSED = [
    ("allreduce_grads", lambda w: dist.allreduce_grads([w, "W2"]), TypeError,
     r"params\[1\] is str 'W2', not a parameter \(a NetVar\), a Module"),
    ("allreduce_grads", lambda w: dist.allreduce_grads([w * 2.0]), TypeError,
     r"params\[0\] .* is computed by an op"),
    ("allreduce_grads", lambda w: dist.allreduce_grads([w], average="yes"), TypeError,
     "average must be True or False"),
    ("allreduce_grads", lambda w: dist.allreduce_grads([w], weight=-1), ValueError,
     "weight must be >= 0"),
    ("allreduce_grads", lambda w: dist.allreduce_grads([w], weight=float("nan")), ValueError,
     "weight must be finite"),
    ("allreduce_grads", lambda w: dist.allreduce_grads([w], weight=0), ValueError,
     "every rank gave weight 0"),
    ("allreduce", lambda w: dist.allreduce(1.0, op="prod"), ValueError,
     "op must be one of 'sum', 'mean', 'max', 'min'"),
    ("allreduce", lambda w: dist.allreduce("3"), TypeError, "must be a number or an array"),
    ("allreduce", lambda w: dist.allreduce(np.ones(2, bool)), TypeError,
     "an array of numbers, got bool"),
    ("broadcast", lambda w: dist.broadcast(1.0, root=1), ValueError,
     r"root must be a rank, 0 … 0, got 1"),
    ("broadcast_vars", lambda w: dist.broadcast_vars([w], root=-1), ValueError,
     "root must be an integer >= 0"),
    ("broadcast_vars", lambda w: dist.broadcast_vars({"w": [w, 3]}), TypeError,
     r"broadcast_vars: params\['w'\]\[1\] is int 3, not a parameter \(a NetVar\), a Module"),
    ("shard", lambda w: dist.shard(-1), ValueError, "count must be an integer >= 0"),
    ("shard", lambda w: dist.shard({"a": 1}), TypeError, "give a count or a sequence"),
    ("shard", lambda w: dist.shard(2.0), TypeError, "give a count or a sequence"),
    ("minibatches", lambda w: nn.minibatches([[1, 2]], shard=1), TypeError,
     "shard must be True or False"),
    ("DataParallel", lambda w: dist.DataParallel(average=None), TypeError,
     "average must be True or False"),
    ("DataParallel", lambda w: dist.DataParallel(model=42), TypeError,
     "DataParallel: params is int 42, not a parameter"),
    ("Trainer", lambda w: nn.Trainer(lambda b: w.sum(), nn.GD([w]),
                                     hooks=[dist.DataParallel(), dist.DataParallel()]),
     ValueError, "hooks hold 2 DataParallel hooks"),
]


@pytest.mark.parametrize("name, call, error, message", REFUSED,
                         ids=[f"{row[0]}-{k}" for k, row in enumerate(REFUSED)])
def test_refused_arguments_change_nothing(alone, name, call, error, message):
    w = nn.NetVar(np.arange(4.0).reshape(2, 2))
    w.g = 1.5
    with pytest.raises(error, match=message):
        call(w)
    assert np.array_equal(w.data, np.arange(4.0).reshape(2, 2))
    assert np.array_equal(w.g, np.full((2, 2), 1.5))


def test_data_parallel_refuses_a_metric_it_cannot_sum_before_training(alone):
    class Median:
        def update(self, predictions, targets):
            pass

        def reset(self):
            pass

        value = 0.0

    w = nn.NetVar(np.ones((2, 2)))
    trainer = nn.Trainer(lambda b: ((w * 1.0).sum(), w, w), nn.GD([w]),
                         hooks=[dist.DataParallel()], metrics={"median": Median()})
    with pytest.raises(TypeError, match=r"metrics\['median'\] \(Median\) has no numeric total"):
        trainer.fit([1])
    assert trainer.steps == 0 and np.array_equal(w.data, np.ones((2, 2)))


@pytest.mark.parametrize("n, size", [(10, 3), (2, 3), (0, 2), (9, 3), (7, 1)])
def test_shards_are_contiguous_balanced_and_cover_everything(n, size):
    bounds = [_bounds(n, r, size) for r in range(size)]
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    lengths = [stop - start for start, stop in bounds]
    assert max(lengths) - min(lengths) <= 1 and lengths == sorted(lengths, reverse=True)


# ----------------------------------------------------------------------------- under mpiexec

def _launch(tmp_path_factory, ranks, scenario, timeout=TIMEOUT):
    folder = tmp_path_factory.mktemp(f"{scenario}-{ranks}")
    status, output = scenarios.run_scenario(ranks, scenario, folder, timeout)
    assert status is not None, f"{scenario} on {ranks} ranks did not end within {timeout} s " \
                               f"(a rank left waiting?):\n{output[-3000:]}"
    return status, output, folder


@pytest.fixture(scope="module", params=[2, 3], ids=["2-ranks", "3-ranks"])
def equality(request, tmp_path_factory):
    if NO_MPI:
        pytest.skip(NO_MPI)
    status, output, folder = _launch(tmp_path_factory, request.param, "equality")
    assert status == 0, output[-3000:]
    return scenarios.results(folder, "equality", request.param), folder


@pytest.fixture(scope="module")
def one_process():
    """The same training in this process on the whole batches (no MPI involved)."""
    norms = scenarios.GradientNorms()
    model, optimizer, trainer = scenarios.train_mlp(False, hooks=[norms])
    arrays, numbers = scenarios.state(model, optimizer)
    numbers.update(history=scenarios.history(trainer), gradient_norms=norms.norms)
    model, optimizer, trainer = scenarios.train_sequences(False)
    more, counts = scenarios.state(model, optimizer)
    arrays.update({f"seq.{key}": value for key, value in more.items()})
    numbers.update({f"seq.{key}": value for key, value in counts.items()},
                   seq_history=scenarios.history(trainer))
    return arrays, numbers


@needs_mpi
def test_ranks_end_with_equal_parameters_and_optimizer_state(equality):
    ranks, _ = equality
    first, first_numbers = ranks[0]
    assert any(key.startswith("opt.") for key in first) and any(
        key.startswith("seq.opt.") for key in first)
    for arrays, numbers in ranks[1:]:
        assert arrays.keys() == first.keys()
        for key, value in arrays.items():
            assert np.array_equal(value, first[key]), key          # bit for bit
        assert {k: v for k, v in numbers.items() if "opt." in k} == \
            {k: v for k, v in first_numbers.items() if "opt." in k}


@needs_mpi
def test_shards_on_n_ranks_train_as_one_process_on_the_whole_batches(equality, one_process):
    """float64, rtol 1e-10: each rank's loss is a mean over its shard and its gradient is
    weighted by the shard's rows (the MLP: 7 rows cut 4 + 3 or 3 + 2 + 2) or valid positions
    (the LSTM: padded sequences of lengths 2..9, bucketed and shuffled) before the average,
    which makes it the gradient of the mean over the whole batch; gradient clipping sees that
    global gradient."""
    reference, reference_numbers = one_process
    ranks, _ = equality
    for arrays, numbers in ranks:
        assert arrays.keys() == reference.keys()
        for key, value in arrays.items():
            np.testing.assert_allclose(value, reference[key], rtol=1e-10, atol=1e-13,
                                       err_msg=key)
        for name in ("history", "seq_history"):        # logs summed over the ranks
            assert numbers[name].keys() == reference_numbers[name].keys()
            for key, values in numbers[name].items():
                np.testing.assert_allclose(values, reference_numbers[name][key], rtol=1e-10,
                                           err_msg=f"{name}[{key}]")
        assert numbers["samples"] == [24] * 3 and all(type(n) is int for n in numbers["samples"])
        np.testing.assert_allclose(numbers["gradient_norms"],     # what the hooks saw
                                   reference_numbers["gradient_norms"], rtol=1e-10)


@needs_mpi
def test_only_rank_0_runs_the_output_hooks(equality):
    ranks, folder = equality
    best_epochs = [numbers["best_epoch"] for _, numbers in ranks]
    assert best_epochs[0] is not None and best_epochs[1:] == [None] * (len(ranks) - 1)
    assert [numbers["root_only_epochs"] for _, numbers in ranks] == [3] + [0] * (len(ranks) - 1)
    checkpoint = nn.load(folder / "best.npz")
    assert checkpoint.extra["epoch"] == best_epochs[0]


@needs_mpi
def test_a_checkpoint_from_rank_0_resumes_bit_identically_and_loads_in_one_process(
        tmp_path_factory):
    status, output, folder = _launch(tmp_path_factory, 2, "resume")
    assert status == 0, output[-3000:]
    ranks = scenarios.results(folder, "resume", 2)
    for arrays, numbers in ranks:
        straight = {k[len("straight."):]: v for k, v in arrays.items() if k.startswith("straight.")}
        resumed = {k[len("resumed."):]: v for k, v in arrays.items() if k.startswith("resumed.")}
        assert straight.keys() == resumed.keys() and any(k.startswith("opt.") for k in straight)
        for key in straight:
            assert np.array_equal(straight[key], resumed[key]), key
        assert numbers["straight"] == numbers["resumed"]
    saved = {k[len("saved."):]: v for k, v in ranks[0][0].items() if k.startswith("saved.")}
    model = scenarios.mlp(5)
    optimizer = nn.Adam(model.vars, lr=0.05)
    checkpoint = nn.load(folder / "resume.npz", model, optimizer=optimizer)
    assert checkpoint.extra == {"epoch": 2}
    loaded, _ = scenarios.state(model, optimizer)
    assert loaded.keys() == saved.keys()
    for key in saved:
        assert np.array_equal(loaded[key], saved[key]), key


@needs_mpi
def test_a_random_run_resumed_on_2_ranks_in_fresh_processes_is_bit_identical(
        tmp_path_factory):
    """Dropout (each rank its own stream), minibatches shuffled by rank 0's generator and a
    schedule: saved at epoch 2 of 4 with every rank's generator state, resumed by new
    processes seeded otherwise. Without the ranks' states the resumed arrays all differed."""
    status, output, folder = _launch(tmp_path_factory, 2, "resume_random_first")
    assert status == 0, output[-3000:]
    status, output = scenarios.run_scenario(2, "resume_random_rest", folder, TIMEOUT)
    assert status == 0, output[-3000:]
    straight = scenarios.results(folder, "resume_random_first", 2)
    resumed = scenarios.results(folder, "resume_random_rest", 2)
    for (arrays, numbers), (expected_arrays, expected) in zip(resumed, straight):
        assert arrays.keys() == expected_arrays.keys() and len(arrays) == 12
        differing = [k for k in arrays if not np.array_equal(arrays[k], expected_arrays[k])]
        assert differing == [], f"{len(differing)} of {len(arrays)} arrays differ: {differing}"
        assert numbers == expected                # logs, lr, counts, this rank's generator
    assert straight[0][1]["rng"] != straight[1][1]["rng"]        # two streams, each resumed


@needs_mpi
def test_ranks_whose_parameters_differ_all_raise_naming_the_first(tmp_path_factory):
    # a hand-written loop without broadcast_vars trained a different model on each rank and
    # ended with status 0
    status, output, folder = _launch(tmp_path_factory, 2, "unlike_weights")
    assert status == 0, output[-3000:]
    for _, errors in scenarios.results(folder, "unlike_weights", 2):
        step, message = errors["seeds"]
        assert step == 1
        assert ("allreduce_grads: the ranks hold different values of parameter 0 "
                "('layers.0.W', float32 (5, 4)): rank 1's differs from rank 0's (2 of 4 "
                "parameters differ)") in message
        assert "dist.broadcast_vars(model)" in message
        # calls 1 (the loop above), 4, 7 ... of the process check: the drift made before the
        # second loop's 2nd step (call 3) is seen at its 3rd (call 4)
        step, message = errors["drift"]
        assert step == 3 and "parameter 3 ('layers.2.b', float32 (1, 3))" in message
        assert "(1 of 4 parameters differ)" in message
        assert errors["unchecked"] == [None, None] and errors["default"] == 100


def test_check_parameters_every_takes_a_count(alone):
    assert dist.check_parameters_every() == 100
    with pytest.raises(TypeError, match="check_parameters_every: calls must be an int"):
        dist.check_parameters_every(2.5)
    with pytest.raises(ValueError, match="check_parameters_every: calls"):
        dist.check_parameters_every(-1)
    assert dist.check_parameters_every() == 100


@pytest.fixture(scope="module")
def collectives(tmp_path_factory):
    if NO_MPI:
        pytest.skip(NO_MPI)
    status, output, folder = _launch(tmp_path_factory, 3, "collectives")
    assert status == 0, output[-3000:]
    return scenarios.results(folder, "collectives", 3), output


@needs_mpi
def test_rank_size_allreduce_broadcast_and_shard(collectives):
    ranks, _ = collectives
    rows = []
    for r, (arrays, numbers) in enumerate(ranks):
        assert (numbers["rank"], numbers["size"]) == (r, 3)
        assert (numbers["sum"], numbers["mean"], numbers["max"], numbers["min"]) == (6, 1.0, 2, -2)
        assert arrays["array_sum"].dtype == np.float16
        assert numbers["float16_reduced_as"] == ["float32"]     # (not every MPI sums float16)
        assert np.array_equal(arrays["array_sum"], np.arange(4) * 6.0)
        assert arrays["int_sum"].dtype == np.int32 and np.array_equal(arrays["int_sum"],
                                                                       np.full((2, 2), 3))
        assert np.array_equal(arrays["broadcast"], [2, 20])
        rows.append((numbers["shard_count"], numbers["shard_list"]))
    assert rows == [([0, 1, 2, 3], ["a", "b", "c"]), ([4, 5, 6], ["d", "e"]),
                    ([7, 8, 9], ["f", "g"])]


@needs_mpi
def test_broadcast_vars_gives_roots_parameters_and_buffers(collectives):
    for arrays, _ in collectives[0]:
        assert np.array_equal(arrays["bcast_W"], np.full((2, 3), 2.0))
        assert arrays["bcast_gamma"].dtype == np.float32
        assert np.array_equal(arrays["bcast_gamma"], np.full((1, 3), 2.0))
        assert np.array_equal(arrays["bcast_running_mean"], np.full(3, 2.0))


@needs_mpi
def test_allreduce_grads_weights_and_packs_one_call_per_dtype(collectives):
    """Weights 1, 2, 3: Σ w·g / Σ w. After the small call that sums the weights, the float64
    parameters W, b and two without gradients on some or all ranks travel in one call, the
    float32 one in another. A gradient is let go once it is packed, before the call that
    reduces it (freed before MPI's own temporary buffer, its memory is reused; freed after, the
    heap is given back to the system and faulted in again next step: W9 ran at 41-74 %).
    Being the process's first call, it first compares the ranks' parameters: two small int64
    all-reduces (their shapes, then their checksums), before any gradient is let go."""
    for arrays, numbers in collectives[0]:
        assert numbers["grad_calls"] == ["int64", "int64", "float64", "float64", "float32"]
        assert numbers["grads_alive_at_calls"] == [3, 3, 3, 1, 0]   # (W64, W32, b64 watched)
        assert np.allclose(arrays["g_W64"], (1 * 1 + 2 * 2 + 3 * 3) / 6)
        assert np.allclose(arrays["g_b64"], 2 * (1 * 1 + 2 * 2 + 3 * 3) / 6)
        assert numbers["g_W32_dtype"] == "float32" and np.allclose(arrays["g_W32"], 14 / 6)
        assert np.allclose(arrays["g_some"], 6.0 * 1 / 6)      # zeros from ranks 1 and 2
        assert numbers["none_has_grad"] is False


@needs_mpi
def test_minibatches_shard_gives_each_rank_its_part_of_rank_0s_batches(collectives):
    ranks, _ = collectives
    parts = [numbers["minibatch_rows"] for _, numbers in ranks]
    assert len({len(p) for p in parts}) == 1           # the same number of batches everywhere
    batches = [sum((part[k] for part in parts), []) for k in range(len(parts[0]))]
    assert [len(b) for b in batches] == [5, 5, 5]     # 17 rows: the last 2 < 3 ranks dropped
    assert len(set(sum(batches, []))) == 15
    for k, batch in enumerate(batches):
        assert [len(part[k]) for part in parts] == [2, 2, 1]
    # bucketed: each epoch 15 distinct rows; the 2 left out were always the longest (15, 16)
    epochs = [sorted(sum((numbers["bucketed_rows"][e] for _, numbers in ranks), []))
              for e in range(6)]
    assert all(len(set(rows)) == len(rows) == 15 for rows in epochs)
    assert any(15 in rows or 16 in rows for rows in epochs)


@needs_mpi
def test_refusals_are_made_on_every_rank_alike(collectives):
    for arrays, numbers in collectives[0]:
        refusals = numbers["refusals"]
        assert "rank 0 has numpy:<f8:(2, 2), rank 1 has numpy:<f8:(2, 3)" in \
            refusals["broadcast_vars"]
        assert "needs the same sequences on every rank" in refusals["minibatches"]
        assert "every rank gave weight 0" in refusals["weight"]
        assert "cuts each batch into 3 parts, one per rank; batch_size 2" in \
            refusals["batch_size"]


@needs_mpi
def test_batchnorm_statistics_are_averaged_over_the_ranks(collectives):
    """Momentum 1 and equal shards: the average of the shards' means is the batch's mean."""
    alone_mean = scenarios.train_batchnorm(False)
    for arrays, _ in collectives[0]:
        np.testing.assert_allclose(arrays["running_mean"], alone_mean, rtol=1e-10)


@needs_mpi
def test_batchnorm_statistics_are_weighed_by_each_ranks_rows(collectives):
    """One batch of 7 rows cut 3, 2, 2: an even mean of the shards' means was off by ~9 %."""
    alone_mean = scenarios.train_batchnorm_uneven(False)
    for arrays, _ in collectives[0]:
        np.testing.assert_allclose(arrays["running_mean_uneven"], alone_mean, rtol=1e-10)
    # weighed by the loss's weights (the targets not ignored) they were off
    alone_mean = scenarios.train_batchnorm_ignored(False)
    for arrays, _ in collectives[0]:
        np.testing.assert_allclose(arrays["running_mean_ignored"], alone_mean, rtol=1e-10)


@needs_mpi
def test_a_rank_of_weight_0_adds_zeros_and_allreduce_checks_what_ranks_give(collectives):
    ranks, _ = collectives
    for arrays, numbers in ranks:
        # rank 0's NaN gradient, weighed 0, made every rank's NaN; ranks 1 and 2 give 2 and 3
        np.testing.assert_allclose(arrays["g_weight0"], [[2.5, 2.5]])
        assert numbers["mixed_sum"] == 5.0             # an int here, floats there: floats
        refusals = numbers["refusals"]
        assert ("allreduce: every rank must give the same shape and dtype; rank 0: an array "
                "of dtype float64 and shape (2,); rank 1: an array of dtype float64 and shape "
                "(3,)") in refusals["allreduce_shapes"]
        assert "rank 0: an array of dtype int64" in refusals["allreduce_dtypes"]


@needs_mpi
def test_summed_gradients_log_the_loss_one_process_logs(collectives):
    """DataParallel(average=False): the logged loss was the batch's divided by the ranks."""
    alone_loss, alone_W = scenarios.train_summed(False)
    for arrays, numbers in collectives[0]:
        np.testing.assert_allclose(numbers["summed_loss"], alone_loss, rtol=1e-12)
        np.testing.assert_allclose(arrays["summed_W"], alone_W, rtol=1e-12)


@needs_mpi
def test_savebest_restore_on_rank_0_reaches_every_rank(collectives):
    ranks, _ = collectives
    restored_epoch = ranks[0][1]["restored_epoch"]
    assert restored_epoch is not None and restored_epoch < 3
    for arrays, _ in ranks:
        assert np.array_equal(arrays["restored"], ranks[0][0]["restored"])


@needs_mpi
def test_evaluate_sums_over_ranks_some_of_which_have_no_batch(collectives):
    for _, numbers in collectives[0]:
        assert numbers["evaluated"]["loss"] == pytest.approx(numbers["whole_loss"], rel=1e-12)
        assert numbers["evaluated"]["accuracy"] in (0.0, 0.5, 1.0)


@needs_mpi
@pytest.mark.parametrize("where, steps", [("on_before_step", 1), ("on_batch_end", 4)])
def test_a_stop_on_one_rank_stops_every_rank_at_the_same_step(collectives, where, steps):
    ranks, output = collectives
    first = ranks[0][0][f"stop_{where}"]
    for arrays, numbers in ranks:
        assert numbers[f"stop_{where}"] == {
            "steps": steps, "epochs": 0,
            "reason": f"rank 2: stopped by rank 2's hook in {where}"}
        assert np.array_equal(arrays[f"stop_{where}"], first)
    assert output.count(f"rank 2: stopped by rank 2's hook in {where}") == 1   # rank 0 prints


@needs_mpi
@pytest.mark.parametrize("scenario, error", [
    ("failing_rank", "injected failure on rank 1"),       # in a step, rank 0 in the all-reduce
    ("early_failure", "early failure on rank 1"),         # before MPI has started on rank 1
])
def test_a_rank_that_raises_ends_the_job_naming_the_error(tmp_path_factory, scenario, error):
    status, output, _ = _launch(tmp_path_factory, 2, scenario, timeout=60)
    assert status != 0
    assert f"ValueError: {error}" in output
    assert "rank 1 of 2 stopped on ValueError; aborting every rank" in output


@needs_mpi
def test_ranks_with_different_numbers_of_batches_all_raise(tmp_path_factory):
    status, output, folder = _launch(tmp_path_factory, 2, "uneven_batches")
    assert status == 0, output[-3000:]
    for _, numbers in scenarios.results(folder, "uneven_batches", 2):
        assert "rank 1 ran out of batches after 4 in epoch 1 while other ranks have more" in \
            numbers["error"]


def test_a_batch_whose_every_target_is_ignored_trains_as_without_data_parallel(alone):
    # every rank's weight 0: allreduce_grads raised after the first update (the plain Trainer
    # trains on: NaN loss, zero gradient); a hand-written call with weight 0 still raises
    x = np.random.default_rng(0).standard_normal((20, 3))
    labels = np.random.default_rng(1).integers(0, 3, 20)
    labels[10:] = -1

    def run(hooks):
        model = nn.layers.Linear(3, 3, seed=0)

        def step(batch):
            z = model(batch[0])
            return nn.SoftmaxCELoss(z, batch[1], ignore_index=-1), z, batch[1]
        trainer = nn.Trainer(step, nn.GD(model.vars, lr=0.1), hooks=hooks(model))
        trainer.fit([(x[:10], labels[:10]), (x[10:], labels[10:])], epochs=2)
        return model.W.data, trainer.history["loss"]

    (W, loss), (W_dp, loss_dp) = run(lambda m: []), run(lambda m: [dist.DataParallel(m)])
    np.testing.assert_array_equal(W, W_dp)
    assert loss == loss_dp
    p = nn.NetVar(np.ones((1, 2)))
    p.g = np.ones((1, 2))
    with pytest.raises(ValueError, match="every rank gave weight 0"):
        dist.allreduce_grads([p], weight=0)


@pytest.mark.parametrize("parallel", [False, True], ids=["plain", "data-parallel"])
def test_samples_counts_rows_or_valid_positions_as_an_int(alone, parallel):
    # a float mask made it a float on one process, and the sum over ranks one on two
    x = np.random.default_rng(0).standard_normal((6, 3))
    labels = np.array([0, 1, 2, 0, 1, 2])
    mask = np.array([1.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    model = nn.layers.Linear(3, 3, seed=0)

    def step(batch):
        z = model(batch[0])
        return nn.SoftmaxCELoss(z, batch[1]), z, batch[1], batch[2]

    hooks = [dist.DataParallel(model)] if parallel else []
    trainer = nn.Trainer(step, nn.GD(model.vars, lr=0.1), hooks=hooks)
    trainer.fit([(x[:3], labels[:3], mask[:3]), (x[3:], labels[3:], mask[3:])], epochs=2)
    assert trainer.history["samples"] == [4, 4]
    assert all(type(n) is int for n in trainer.history["samples"])


def test_data_parallel_refuses_an_empty_validation_set_before_training(alone):
    # one rank's share may be empty, but every rank's empty trained an epoch, then raised
    model = nn.layers.Linear(3, 3, seed=0)
    before = model.W.data.copy()
    x, labels = np.ones((4, 3)), np.array([0, 1, 2, 0])
    trainer = nn.Trainer(lambda batch: nn.SoftmaxCELoss(model(batch[0]), batch[1]),
                         nn.GD(model.vars, lr=0.1), hooks=[dist.DataParallel(model)])
    with pytest.raises(ValueError, match="Trainer.fit: val holds no batches on any rank"):
        trainer.fit([(x, labels)], epochs=2, val=[])
    np.testing.assert_array_equal(model.W.data, before)
    assert trainer.epoch == 0 and trainer.steps == 0


@needs_mpi
def test_ranks_that_call_fit_unlike_all_raise_naming_it(tmp_path_factory):
    # another number of epochs, or val on one rank only, failed inside MPI (a truncated
    # message), or left a rank waiting
    status, output, folder = _launch(tmp_path_factory, 2, "unlike_fits")
    assert status == 0, output[-3000:]
    for _, errors in scenarios.results(folder, "unlike_fits", 2):
        for name in ("epochs", "val"):
            assert "DataParallel: the ranks called fit differently" in errors[name]


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, np.int64])
def test_the_parameter_checksum_changes_with_any_one_element(dtype):
    # the checksum kept the low 62 bits of a sum of 64-bit words: a float64 element that
    # differed only in sign (bit 63) or in its top exponent bit (bit 62) checked as equal
    from nnkit.distributed.collectives import _checksum
    base = np.array([1.5, -2.0, 3.0], dtype=dtype)
    flipped_sign = base.copy()
    flipped_sign[1] = -flipped_sign[1]
    top_bit = base.copy()
    words = top_bit.view(f"u{base.itemsize}")
    words[0] ^= np.array(1 << (8 * base.itemsize - 2)).astype(words.dtype)
    assert _checksum(flipped_sign) != _checksum(base)
    assert _checksum(top_bit) != _checksum(base)
