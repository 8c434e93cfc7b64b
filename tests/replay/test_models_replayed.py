"""Each model of the zoo (tests/replay/models.py) trained 1,000 steps eagerly and captured, from
the same seed on the same batches: the same bits at every step (the loss) and at the end
(parameters, optimizer state, running statistics, the generator), in float32 and float64.
Each run must really replay: a capture that fell back to eager would pass for nothing."""
import numpy as np
import pytest

import nnkit as nn

from .models import KINDS, build, same_state

STEPS = 1000
OPTIONS = {"lstm": {"patterns": [(8, 5, 3, 8, 2, 6), (4, 4, 7, 2, 8, 3), (6, 6, 6, 6, 6, 6)]},
           "dqn": {"sync_inside": False}}


def train(kind, dtype, captured):
    built = build(kind, dtype, 0, **OPTIONS.get(kind, {}))
    step = nn.capture(built.step) if captured else built.step
    losses = []
    for inputs in built.batches(STEPS):
        losses.append(np.array(step(*inputs).data))
        if built.between is not None:
            built.between()
    return losses, built.state(), step


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", KINDS)
def test_a_replay_trains_as_eager_does_bit_for_bit(kind, dtype):
    eager_losses, eager_state, _ = train(kind, dtype, False)
    losses, state, step = train(kind, dtype, True)
    first = next((i for i, (a, b) in enumerate(zip(eager_losses, losses))
                  if a.tobytes() != b.tobytes()), None)
    assert first is None, f"{kind}: the losses differ from step {first} on"
    assert same_state(eager_state, state)
    # the DQN's target network is synced every 5 calls: its new data records again
    assert step.replays >= STEPS * (0.79 if kind == "dqn" else 0.95), (kind, step)
