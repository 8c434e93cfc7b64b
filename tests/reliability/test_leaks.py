"""No leaks: training for 2,000 steps keeps resident memory flat after warm-up, and no NetOp
outlives the loop (beyond the last graph, which a model keeps as its ``output`` until it is
dropped), with the cycle collector enabled and disabled.

"alive" counts the live NetOps whose creation index is past the counter's value at the test's
start: exactly the ops the test made, however they were built.
"""
import gc
import os
import resource

import numpy as np
import pytest

import nnkit as nn
from nnkit import core

STEPS = 2000
WARM_UP = 200
SAMPLE_EVERY = 10
TOLERANCE = 8 * 2 ** 20      # bytes; one leaked graph per step here is ~100 kB, ~180 MB in all


def _resident_bytes():
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:            # no /proc: the peak, which also stays flat when nothing leaks
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@pytest.fixture
def alive():
    """A function giving the number of NetOps built during the test that are still alive.

    Nodes are numbered by one creation counter, so the ops of this test are those with an
    index past the counter's value at its start, found among the objects the cycle collector
    tracks (it tracks them whether or not it is enabled). ``built()`` counts the nodes made.
    """
    start = next(core._counter)
    peeks = []                          # each peek at the counter takes a number too

    def count():
        return sum(isinstance(o, nn.NetOp) and o.index > start for o in gc.get_objects())

    def built():
        made = next(core._counter) - start - 1 - len(peeks)
        peeks.append(1)
        return made

    count.built = built
    return count


@pytest.fixture(params=["gc enabled", "gc disabled"])
def collector(request):
    was_enabled = gc.isenabled()
    gc.collect()
    if request.param == "gc disabled":
        gc.disable()
    yield request.param
    if was_enabled:
        gc.enable()


def _digits_like(rng, n=64, features=16, classes=10):
    x = rng.standard_normal((n, features)).astype(np.float32)
    labels = rng.integers(0, classes, n)
    return nn.NetVar(x, requires_grad=False), nn.NetVar(labels, dtype=int)


def test_ffn_training_2000_steps_keeps_memory_flat_and_frees_every_op(collector, alive):
    nn.seed(0)
    rng = np.random.default_rng(0)
    x, labels = _digits_like(rng)
    net = nn.FFN((nn.Multiply, nn.glorot(16, 64)), (nn.Add, nn.zeros(64)), (nn.Tanh,),
                 (nn.Multiply, nn.glorot(64, 10)), (nn.Add, nn.zeros(10)))
    optimizer = nn.Adam(net.vars, lr=0.01)
    samples = []
    losses = []
    setup = alive.built()                        # the data and parameters
    for step in range(STEPS):
        loss = nn.SoftmaxCELoss(net(x), labels)
        loss.back()
        optimizer.step()
        losses.append(loss.item())
        if step == 0:
            per_step = alive.built() - setup
        if step % SAMPLE_EVERY == 0:
            samples.append(_resident_bytes())
    assert losses[-1] < 0.5 * losses[0]          # it did train

    early = np.median(samples[WARM_UP // SAMPLE_EVERY:(WARM_UP + 400) // SAMPLE_EVERY])
    late = np.median(samples[-400 // SAMPLE_EVERY:])
    assert late - early < TOLERANCE, f"resident memory grew by {(late - early) / 2 ** 20:.1f} MiB"

    assert alive.built() - setup == STEPS * per_step
    assert alive() <= per_step                   # only the last graph (loss and net.output)
    del loss
    net.output = None
    assert alive() == 0, f"{alive()} NetOps still alive ({collector})"


def test_sequence_model_with_trainer_frees_every_op(collector, alive):
    nn.seed(1)
    rng = np.random.default_rng(1)
    T, B, F, classes = 6, 8, 4, 3
    batches = [(rng.standard_normal((T, B, F)).astype(np.float32), rng.integers(0, classes, B))
               for _ in range(4)]
    model = nn.SequenceModel(F, 8, classes, cell="lstm", per_step=False, seed=1)

    def step(batch):
        features, targets = batch
        z = model(nn.NetVar(features, requires_grad=False))
        return nn.SoftmaxCELoss(z, targets), z, targets

    trainer = nn.Trainer(step, nn.Adam(model.vars, lr=0.01), metrics={"accuracy": nn.Accuracy()})
    history = trainer.fit(batches, epochs=25, val=batches[:1])
    assert len(history["loss"]) == 25 and all(np.isfinite(history["loss"]))
    assert alive.built() > 100 * 4
    del trainer, history, step
    model.recurrent = model.output = None
    assert alive() == 0, f"{alive()} NetOps still alive after training ({collector})"


def test_evaluation_under_no_grad_keeps_no_graph(alive):
    w = nn.NetVar(np.ones((4, 4)))
    x = nn.NetVar(np.ones((2, 4)), requires_grad=False)
    with nn.no_grad():
        y = x
        for _ in range(100):
            y = nn.Tanh(y @ w)
        assert y.parents == ()
        assert alive() == 1          # every intermediate was freed at once
