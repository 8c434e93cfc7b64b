"""Small parameters updated together (optim/flat.py): the same bits as one by one, whatever
happens to the state between steps, and only for an update that declares itself elementwise."""
import copy
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import nnkit as nn
from nnkit.optim import flat
from tests.reliability.helpers import PROPERTY

SHAPES = [(3, 4), (1, 4), (4, 2), (1, 2), (1, 1), (5,), (), (3, 4)]

OPTIMIZERS = {
    "GD": lambda ps: nn.GD(ps, lr=0.1, momentum=0.0),
    "GD momentum": lambda ps: nn.GD(ps, lr=0.1, momentum=0.9),
    "Nesterov": lambda ps: nn.Nesterov(ps, lr=0.05, momentum=0.9),
    "RMSProp": lambda ps: nn.RMSProp(ps, lr=0.01),
    "AdaGrad": lambda ps: nn.AdaGrad(ps, lr=0.1),
    "Adam": lambda ps: nn.Adam(ps, lr=0.01),
    "AdamW groups": lambda ps: nn.AdamW([{"params": ps[:4]},
                                         {"params": ps[4:], "weight_decay": 0.0, "lr": 0.02}],
                                        lr=0.01, weight_decay=0.1),
}


class _Apart:
    """flat.runs giving every parameter a run of its own: the update one by one."""

    def __enter__(self):
        self.runs, flat.runs = flat.runs, lambda optimizer, items: [[i] for i in items]

    def __exit__(self, *exc):
        flat.runs = self.runs


def _model(dtype, seed=0):
    rng = np.random.default_rng(seed)
    return [nn.NetVar(rng.standard_normal(shape).astype(dtype)) for shape in SHAPES]


def _step(optimizer, params, rng, skip=()):
    for position, p in enumerate(params):
        if position not in skip:
            p.g = rng.standard_normal(p.shape).astype(p.dtype)
    optimizer.step()


def _same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _assert_same(params, other_params, optimizer, other):
    for p, q in zip(params, other_params):
        assert _same(p.data, q.data)
    for state, theirs in zip(optimizer.state, other.state):
        assert sorted(state) == sorted(theirs)
        for key, value in state.items():
            assert _same(value, theirs[key]) if isinstance(value, np.ndarray) \
                else value == theirs[key]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_small_parameters_updated_together_give_the_same_bits(name, dtype):
    ours, theirs = _model(dtype), _model(dtype)
    fused, apart = OPTIMIZERS[name](ours), OPTIMIZERS[name](theirs)
    rng_a, rng_b = np.random.default_rng(1), np.random.default_rng(1)
    for step in range(12):
        skip = (2,) if step in (3, 4) else ()           # one parameter without a gradient
        if step == 6:
            for optimizer in (fused, apart):            # one state forgotten by hand
                optimizer.state[1] = {}
        if step == 8:
            for optimizer in (fused, apart):            # a checkpoint of both, loaded back
                optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
        if step == 10:
            for optimizer in (fused, apart):            # a state array edited in place
                key = sorted(k for k in optimizer.state[0] if k != "t")
                if key:
                    optimizer.state[0][key[0]][...] *= 0.5
        _step(fused, ours, rng_a, skip)
        with _Apart():
            _step(apart, theirs, rng_b, skip)
        _assert_same(ours, theirs, fused, apart)
    assert flat.elementwise(fused)
    assert any(len(run.positions) > 1 for run in fused._flat_runs.runs.values())


def test_a_copy_or_a_pickle_of_the_optimizer_gathers_its_runs_again():
    params = _model(np.float64)
    optimizer = nn.Adam(params, lr=0.01)
    rng = np.random.default_rng(2)
    for _ in range(3):
        _step(optimizer, params, rng)
    # the copy's states hold copies of the views: updating its own flat arrays would leave them
    twin = copy.deepcopy((optimizer, params))
    unpickled = pickle.loads(pickle.dumps((optimizer, params)))
    reference = copy.deepcopy((optimizer, params))
    for (opt, ps), seed in ((twin, 3), (unpickled, 3), (reference, 3)):
        rng = np.random.default_rng(seed)
        if opt is reference[0]:
            with _Apart():
                _step(opt, ps, rng)
                _step(opt, ps, rng)
        else:
            _step(opt, ps, rng)
            _step(opt, ps, rng)
    for opt, ps in (twin, unpickled):
        _assert_same(ps, reference[1], opt, reference[0])


class NormalizedSteps(nn.GD):
    """Not elementwise: each parameter moves by lr along its gradient's direction."""

    def _update(self, p, g, state):
        p._data -= self.lr * g / np.sqrt((g * g).sum())


def test_an_update_that_does_not_declare_itself_elementwise_runs_one_by_one():
    params = _model(np.float64)
    optimizer = NormalizedSteps(params, lr=0.1)
    assert not flat.elementwise(optimizer)      # GD's promise is not inherited with a new rule
    before = [p.data.copy() for p in params]
    grads = [np.random.default_rng(4).standard_normal(p.shape) for p in params]
    for p, g in zip(params, grads):
        p.g = g
    optimizer.step()
    for p, start, g in zip(params, before, grads):
        np.testing.assert_allclose(p.data, start - 0.1 * g / np.sqrt((g * g).sum()), rtol=1e-12)


def test_parameters_sharing_memory_are_updated_apart_in_order():
    shared = np.zeros((1, 3))
    first, second = nn.NetVar(shared), nn.NetVar(shared)    # two nodes over one array
    third = nn.NetVar(np.zeros((1, 3)))
    if first.data is not second.data:
        pytest.skip("NetVar copies its data")
    optimizer = nn.GD([first, second, third], lr=1.0, momentum=0.0)
    for p in (first, second, third):
        p.g = np.ones((1, 3))
    optimizer.step()        # one by one: the second update starts from the first's result
    np.testing.assert_array_equal(shared, -2 * np.ones((1, 3)))
    np.testing.assert_array_equal(third.data, -np.ones((1, 3)))


EVENTS = ("step", "skip one", "forget a state", "load a checkpoint", "edit a state",
          "change lr", "edit a parameter", "add a group", "replace a parameter's data",
          "float64 data", "share another's array")


@PROPERTY
@given(st.lists(st.sampled_from(EVENTS), min_size=1, max_size=14),
       st.sampled_from(sorted(OPTIMIZERS)), st.integers(0, 2 ** 16))
def test_any_sequence_of_steps_and_edits_gives_the_bits_of_one_by_one(events, name, seed):
    ours, theirs = _model(np.float32, seed), _model(np.float32, seed)
    fused, apart = OPTIMIZERS[name](ours), OPTIMIZERS[name](theirs)
    rngs = np.random.default_rng(seed), np.random.default_rng(seed)
    pick = np.random.default_rng(seed + 1)
    for event in events + ["step"]:
        choice = int(pick.integers(0, len(ours)))
        for optimizer, params, rng, alone in ((fused, ours, rngs[0], False),
                                              (apart, theirs, rngs[1], True)):
            if event in ("step", "skip one"):
                skip = (choice,) if event == "skip one" else ()
                if alone:
                    with _Apart():
                        _step(optimizer, params, rng, skip)
                else:
                    _step(optimizer, params, rng, skip)
            elif event == "forget a state":
                optimizer.state[choice] = {}
            elif event == "load a checkpoint":
                optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
            elif event == "edit a state":
                for key, value in optimizer.state[choice].items():
                    if isinstance(value, np.ndarray):
                        value[...] *= 0.5
            elif event == "change lr":
                optimizer.param_groups[-1]["lr"] = 0.003
            elif event == "edit a parameter":
                params[choice].data[...] += 1.0
            elif event == "add a group":
                extra = nn.NetVar(np.full((2, 2), 0.5, np.float32))
                params.append(extra)
                optimizer.add_param_group({"params": [extra]})
            elif event == "replace a parameter's data":
                params[choice].data = params[choice].data * 1.5
            elif event == "float64 data":
                params[choice].data = params[choice].data.astype(np.float64)
            else:                                   # two parameters over one array
                same = [k for k, p in enumerate(params)
                        if p.shape == params[choice].shape and k != choice]
                if same:
                    params[choice].data = params[same[0]].data
        _assert_same(ours, theirs, fused, apart)


def test_a_parameter_given_anothers_array_between_steps_is_updated_apart():
    ours, theirs = _model(np.float32), _model(np.float32)
    fused, apart = nn.Adam(ours, lr=0.01), nn.Adam(theirs, lr=0.01)
    rng_a, rng_b = np.random.default_rng(5), np.random.default_rng(5)
    for step in range(4):
        if step == 2:               # the last (3, 4) parameter now updates the first's array
            ours[-1].data, theirs[-1].data = ours[0].data, theirs[0].data
        _step(fused, ours, rng_a)
        with _Apart():
            _step(apart, theirs, rng_b)
        _assert_same(ours, theirs, fused, apart)


@pytest.mark.parametrize("alias", ["data through DLPack", "data as a strided view",
                                   "one state array for two"])
def test_memory_shared_another_way_is_updated_apart(alias):
    # a parameter's array whose base is no array (np.from_dlpack, as_strided) passed the check
    # by base, and a state array two parameters held was split in two: other bits than one by
    # one (the run wrote back over the first parameter's update)
    ours, theirs = _model(np.float64), _model(np.float64)
    fused, apart = nn.Adam(ours, lr=0.01), nn.Adam(theirs, lr=0.01)
    rng_a, rng_b = np.random.default_rng(5), np.random.default_rng(5)
    for step in range(4):
        if step == 1:
            for params, optimizer in ((ours, fused), (theirs, apart)):
                if alias == "data through DLPack":
                    params[3].data = np.from_dlpack(params[1].data[:, :2])
                elif alias == "data as a strided view":
                    params[3].data = np.lib.stride_tricks.as_strided(params[1].data, (1, 2))
                else:
                    optimizer.state[3]["m"] = optimizer.state[1]["m"][:, :2]
        _step(fused, ours, rng_a)
        with _Apart():
            _step(apart, theirs, rng_b)
        for p, q in zip(ours, theirs):
            assert _same(p.data, q.data)


def test_the_runs_gathered_again_keep_their_parameters_together():
    # (the state arrays of a run are views into one flat array: disjoint, not shared)
    params = _model(np.float32)
    optimizer = nn.Adam(params[:4], lr=0.01)
    _step(optimizer, params[:4], np.random.default_rng(0))
    optimizer.add_param_group({"params": params[4:]})
    _step(optimizer, params, np.random.default_rng(1))
    assert optimizer._flat_runs.lengths == [4, 4]          # a run per group, as before
