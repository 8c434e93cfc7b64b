"""nnkit.get_rng_state / set_rng_state: the global generator's state as plain data, restored
exactly, and refused (generator unchanged) when it is not a state."""
import json
import re

import numpy as np
import pytest

import nnkit as nn
from nnkit import backend


def draws(count=5):
    """What nnkit's random users see: a dropout mask and a shuffle from the global stream."""
    with nn.train_mode():
        mask = nn.Dropout(nn.NetVar(np.ones((2, count))), p=0.5).data
    order = next(iter(nn.minibatches([[k] for k in range(count)], batch_size=count)))[0]
    return mask, order


def test_a_state_continues_the_stream_after_a_json_round_trip():
    nn.seed(11)
    draws()
    state = nn.get_rng_state()
    expected = draws()
    draws()                                              # the stream moves on
    nn.set_rng_state(json.loads(json.dumps(state)))      # as read back from a checkpoint
    again = draws()
    assert all(np.array_equal(a, b) for a, b in zip(expected, again))


def test_the_state_is_a_copy_and_plain_data():
    nn.seed(2)
    state = nn.get_rng_state()
    assert json.loads(json.dumps(state)) == state
    state["state"]["state"] = 0                          # editing the copy changes nothing
    assert nn.get_rng_state() != state
    assert nn.get_rng_state() is not nn.get_rng_state()


def test_setting_a_state_forgets_the_gpu_generators(monkeypatch):
    """They cannot be saved: they are derived again from the restored stream."""
    monkeypatch.setitem(backend._gpu_rngs, "a CuPy module", object())
    nn.set_rng_state(nn.get_rng_state())
    assert backend._gpu_rngs == {}


def good():
    return np.random.PCG64(5).state


@pytest.mark.parametrize("state, error, message", [
    ([1, 2], TypeError, "state must be the dict get_rng_state() returns, got list"),
    ({**good(), "bit_generator": "Nope"}, ValueError,
     "state['bit_generator'] must name a NumPy bit generator such as 'PCG64', got 'Nope'"),
    ({**good(), "bit_generator": "BitGenerator"}, ValueError, "is a base class"),
    ({k: v for k, v in good().items() if k != "uinteger"}, ValueError,
     "state must have the keys ['bit_generator', 'has_uint32', 'state', 'uinteger']"),
    ({**good(), "state": {"state": 1.5, "inc": 3}}, ValueError,
     "state['state']['state'] must be an int, got float 1.5"),
    ({**good(), "state": {"state": 1, "inc": True}}, ValueError,
     "state['state']['inc'] must be an int, got bool True"),
    ({**good(), "state": {"state": -1, "inc": 3}}, ValueError, "NumPy's PCG64 refuses the state"),
    ({**good(), "bit_generator": "MT19937"}, ValueError,
     "state must have the keys ['bit_generator', 'state']"),
], ids=["list", "unknown-generator", "base-class", "missing-key", "float", "bool",
        "negative", "another-generators-layout"])
def test_a_wrong_state_is_refused_and_the_generator_is_unchanged(state, error, message):
    nn.seed(7)
    before = nn.get_rng_state()
    with pytest.raises(error) as caught:
        nn.set_rng_state(state)
    assert message in str(caught.value) and "set_rng_state" in str(caught.value)
    assert nn.get_rng_state() == before



@pytest.mark.parametrize("name, edit, message", [
    ("MT19937", lambda state: state["state"].update(pos=100_000),
     "state['state']['pos'] must be in 0..624, got 100000"),
    ("MT19937", lambda state: state["state"].update(pos=-1),
     "state['state']['pos'] must be in 0..624, got -1"),
    ("Philox", lambda state: state.update(buffer_pos=10 ** 6),
     "state['buffer_pos'] must be in 0..4, got 1000000"),
])
def test_a_position_outside_the_generators_buffer_is_refused(name, edit, message):
    # NumPy takes such a state and then draws from memory outside the generator's buffer
    # (garbage, or a crash): a corrupted checkpoint's state gave another stream silently
    nn.seed(7)
    before = nn.get_rng_state()
    state = getattr(np.random, name)(1).state
    edit(state)
    with pytest.raises(ValueError, match=re.escape(f"set_rng_state: {message}")):
        nn.set_rng_state(state)
    assert nn.get_rng_state() == before


@pytest.mark.parametrize("name", ["MT19937", "Philox"])
def test_the_state_of_a_generator_holding_arrays_is_plain_data_and_saves(name, tmp_path):
    # once set to such a state, get_rng_state returned NumPy arrays and every nn.save (which
    # stores the state by default) raised "extra (or an option) is not JSON-able"
    nn.set_rng_state(getattr(np.random, name)(3).state)
    try:
        state = nn.get_rng_state()
        assert json.loads(json.dumps(state)) == state
        model = nn.layers.Linear(2, 2, seed=0)
        for path in (tmp_path / "model.npz", tmp_path / "model.safetensors"):
            nn.save(path, model)
            expected = draws()
            nn.load(path, model, rng=True)
            assert all(np.array_equal(a, b) for a, b in zip(expected, draws()))
    finally:
        nn.seed(0)

def test_another_bit_generators_state_is_taken():
    state = np.random.MT19937(1).state
    state["state"]["key"] = state["state"]["key"].tolist()      # as JSON gives it back
    nn.set_rng_state(state)
    try:
        assert backend.rng().random() == np.random.Generator(np.random.MT19937(1)).random()
    finally:
        nn.seed(0)
