"""Gradient and weight modifiers, and the order in which step() runs them."""
import copy as copy_module
import pickle

import numpy as np
import pytest

import nnkit as nn


def _param(values):
    return nn.NetVar(np.array(values, dtype=np.float64))


def _step(opt, grads):
    for p, g in zip(opt.params, grads):
        p.g = np.array(g, dtype=np.float64)
    opt.step()


def test_clip_value():
    p = _param([[1.0, 1.0, 1.0]])
    opt = nn.GD([p], lr=1.0, momentum=0.0, modifiers=[nn.ClipValue(0.5)])
    _step(opt, [[[2.0, -3.0, 0.25]]])
    np.testing.assert_allclose(p.data, [[0.5, 1.5, 0.75]])


def test_clip_grad_norm_is_global_and_leaves_small_gradients_alone():
    a, b = _param([[0.0, 0.0]]), _param([[0.0]])
    clip = nn.ClipGradNorm(1.0)
    opt = nn.GD([a, b], lr=1.0, momentum=0.0)
    opt.add_modifier(clip)
    _step(opt, [[[3.0, 0.0]], [[4.0]]])            # global norm 5
    assert clip.last_norm == pytest.approx(5.0)
    np.testing.assert_allclose(a.data, [[-0.6, 0.0]], rtol=1e-5)
    np.testing.assert_allclose(b.data, [[-0.8]], rtol=1e-5)
    _step(opt, [[[0.3, 0.0]], [[0.4]]])            # norm 0.5: unchanged
    np.testing.assert_allclose(b.data, [[-1.2]], rtol=1e-5)


def test_clip_grad_norm_matches_pytorch(torch, rng):
    grads = [rng.standard_normal((3, 4)), rng.standard_normal((1, 4))]
    ps = [_param(np.zeros_like(g)) for g in grads]
    opt = nn.GD(ps, lr=1.0, momentum=0.0, modifiers=[nn.ClipGradNorm(0.7)])
    _step(opt, grads)
    ts = [torch.zeros(g.shape, dtype=torch.float64, requires_grad=True) for g in grads]
    for t, g in zip(ts, grads):
        t.grad = torch.tensor(g)
    torch.nn.utils.clip_grad_norm_(ts, 0.7)
    for p, t in zip(ps, ts):
        np.testing.assert_allclose(-p.data, t.grad.numpy(), rtol=1e-12)


def test_decays_are_added_to_the_gradient_of_selected_params():
    w, b = _param([[2.0, -1.0]]), _param([[3.0]])
    opt = nn.GD([w, b], lr=1.0, momentum=0.0,
                modifiers=[nn.L2Decay(0.5, params=[w]), nn.L1Decay(0.1, params=[w])])
    _step(opt, [[[0.0, 0.0]], [[0.0]]])
    np.testing.assert_allclose(w.data, [[2.0 - 1.0 - 0.1, -1.0 + 0.5 + 0.1]])
    np.testing.assert_array_equal(b.data, [[3.0]])


def test_freeze_keeps_parameters_and_resets_their_gradient():
    w, b = _param([[1.0]]), _param([[1.0]])
    opt = nn.Adam([w, b], lr=0.1, modifiers=[nn.Freeze([w])])
    _step(opt, [[[1.0]], [[1.0]]])
    assert w.data[0, 0] == 1.0 and b.data[0, 0] < 1.0
    assert w._g is None and opt.state[0] == {}


def test_max_norm_constrains_columns_after_the_update():
    w, b = _param([[3.0, 0.1], [4.0, 0.1]]), _param([[10.0, 10.0]])
    opt = nn.GD([w, b], lr=1.0, momentum=0.0, modifiers=[nn.MaxNorm(1.0)])
    _step(opt, [[[0.0, 0.0], [0.0, 0.0]], [[0.0, 0.0]]])
    np.testing.assert_allclose(w.data, [[0.6, 0.1], [0.8, 0.1]])   # column 0 scaled to norm 1
    np.testing.assert_array_equal(b.data, [[10.0, 10.0]])           # biases skipped
    rows = nn.GD([w], lr=1.0, momentum=0.0, modifiers=[nn.MaxNorm(0.5, axis=1)])
    _step(rows, [[[0.0, 0.0], [0.0, 0.0]]])
    np.testing.assert_allclose(np.linalg.norm(w.data, axis=1), [0.5, 0.5])


def test_max_norm_skips_a_bias_of_two_rows_and_constrains_the_weights_of_its_shape():
    # a GRU's bias [b_i; b_h] is (2, 3H), as its R is when H = 2: it was rescaled as a weight
    gru = nn.layers.GRU(3, 2, seed=0)
    assert gru.b.shape == gru.R.shape == (2, 6)
    gru.b.data = np.full((2, 6), 2.0)
    gru.R.data = np.full((2, 6), 2.0)
    for copy in (lambda m: m, copy_module.deepcopy, lambda m: pickle.loads(pickle.dumps(m))):
        layer = copy(gru)
        opt = nn.GD(layer.vars, lr=0.0, modifiers=[nn.MaxNorm(1.0)])
        layer(np.ones((4, 5, 3))).sum().back()
        opt.step()
        np.testing.assert_array_equal(layer.b.data, np.full((2, 6), 2.0))
        np.testing.assert_allclose(np.linalg.norm(layer.R.data, axis=0), 1.0)


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_a_bias_keeps_its_mark_through_a_checkpoint_a_model_is_rebuilt_from(tmp_path, suffix):
    # nn.load without a model made fresh leaves: the rebuilt GRU's bias was rescaled again
    W, R, b = nn.recurrent_weights("gru", 3, 4, seed=0)
    b.data = np.full(b.shape, 5.0, dtype=b.data.dtype)
    for saved in (nn.FFN((nn.ops.GRU, W, R, b)), {"W": W, "R": R, "b": b}):
        path = str(tmp_path / f"m{suffix}")
        nn.save(path, saved)
        rebuilt = nn.load(path).model
        params = rebuilt.vars if isinstance(rebuilt, nn.FFN) else list(rebuilt.values())
        bias, = [p for p in params if getattr(p, "is_bias", False)]
        opt = nn.GD(params, lr=0.0, modifiers=[nn.MaxNorm(1.0)])
        for p in params:
            p.g = np.ones(p.shape)
        opt.step()
        np.testing.assert_array_equal(bias.data, np.full(b.shape, 5.0))


def test_max_norm_without_params_refuses_a_kernel_and_constrains_its_filters_when_asked():
    # attached without params it constrained a (O, C, kh, kw) kernel across output channels
    rng = np.random.default_rng(0)
    kernel, w = _param(rng.standard_normal((3, 2, 2, 2))), _param(rng.standard_normal((4, 3)))
    with pytest.raises(ValueError, match=r"GD: MaxNorm without params= would constrain NetVar "
                                         r"#\d+ of shape \(3, 2, 2, 2\) along axis 0"):
        nn.GD([kernel, w], modifiers=[nn.MaxNorm(1.0)])
    opt = nn.GD([kernel, w], lr=1.0, momentum=0.0,
                modifiers=[nn.MaxNorm(1.0, params=[w]),
                           nn.MaxNorm(1.0, axis=(1, 2, 3), params=[kernel])])
    _step(opt, [np.zeros((3, 2, 2, 2)), np.zeros((4, 3))])
    assert np.all(np.sqrt((kernel.data ** 2).sum(axis=(1, 2, 3))) <= 1 + 1e-12)
    assert np.all(np.linalg.norm(w.data, axis=0) <= 1 + 1e-12)


def test_order_gradient_modifiers_then_update_then_weight_modifiers():
    w = _param([[0.0, 0.0], [0.0, 0.0]])
    # clip first (to ±1), then decay adds nothing at w = 0; update moves by -g; MaxNorm last
    opt = nn.GD([w], lr=1.0, momentum=0.0,
                modifiers=[nn.MaxNorm(1.0), nn.ClipValue(1.0), nn.L2Decay(1.0)])
    _step(opt, [[[-5.0, 0.0], [-5.0, 0.0]]])
    np.testing.assert_allclose(w.data, [[np.sqrt(0.5), 0.0], [np.sqrt(0.5), 0.0]])
    assert w._version > 0     # the engine sees the edit


def test_bad_modifiers_are_rejected():
    p = _param([[1.0]])
    with pytest.raises(TypeError, match="is not a modifier"):
        nn.GD([p], modifiers=[object()])
    with pytest.raises(ValueError, match="ClipGradNorm: max_norm must be > 0"):
        nn.ClipGradNorm(0)


@pytest.mark.parametrize("make, message", [
    (lambda: nn.ClipGradNorm(float("nan")), "ClipGradNorm: max_norm must be > 0, got nan"),
    (lambda: nn.ClipGradNorm(-1.0), "ClipGradNorm: max_norm must be > 0"),
    (lambda: nn.ClipValue(0.0), "ClipValue: limit must be > 0"),
    (lambda: nn.MaxNorm(float("nan")), "MaxNorm: max_norm must be > 0"),
    (lambda: nn.L2Decay(float("inf")), "L2Decay: rate must be finite, got inf"),
    (lambda: nn.L1Decay(float("nan")), "L1Decay: rate must be finite, got nan"),
    (lambda: nn.L2Decay(-0.1), "L2Decay: rate must be > 0, got -0.1"),
    (lambda: nn.Freeze([]), "Freeze: params is empty"),
    (lambda: nn.ClipValue(1.0, params=[]), "ClipValue: params is empty"),
    (lambda: nn.MaxNorm(1.0, axis=2), r"MaxNorm: axis 2 is out of range for .*2-D"),
    (lambda: nn.MaxNorm(1.0, axis=1, params=[nn.NetVar(np.ones((2, 2, 2)))]), None),
    (lambda: nn.MaxNorm(1.0, axis=3, params=[nn.NetVar(np.ones((2, 2)), name="w")]),
     r"MaxNorm: axis 3 is out of range for NetVar 'w'"),
])
def test_bad_modifier_arguments_are_refused(make, message):
    if message is None:
        make()
        return
    with pytest.raises(ValueError, match=message):
        make()


def test_modifier_arguments_of_the_wrong_type_are_refused():
    with pytest.raises(TypeError, match="ClipGradNorm: max_norm must be a number, got str"):
        nn.ClipGradNorm("1.0")
    with pytest.raises(TypeError, match="MaxNorm: axis must be an int or a tuple of ints"):
        nn.MaxNorm(1.0, axis=0.5)


def test_infinite_clipping_thresholds_clip_nothing_and_still_measure_the_norm():
    p = _param([[3.0, 4.0]])
    clip = nn.ClipGradNorm(float("inf"))
    opt = nn.GD([p], lr=1.0, momentum=0.0, modifiers=[clip, nn.ClipValue(float("inf"))])
    _step(opt, [[[3.0, 4.0]]])
    assert clip.last_norm == pytest.approx(5.0)
    np.testing.assert_array_equal(p.data, np.zeros((1, 2)))


def test_max_norm_takes_a_negative_axis():
    w = _param([[3.0, 0.1], [4.0, 0.1]])
    opt = nn.GD([w], lr=1.0, momentum=0.0, modifiers=[nn.MaxNorm(1.0, axis=-2)])
    _step(opt, [[[0.0, 0.0], [0.0, 0.0]]])
    np.testing.assert_allclose(np.linalg.norm(w.data, axis=0), [1.0, np.hypot(0.1, 0.1)])


def test_clip_grad_norm_of_float16_gradients_takes_squares_in_float32():
    # |g| = 300 squared overflowed float16: n = inf, and every gradient was scaled to 0
    p = nn.NetVar(np.zeros((1, 2), np.float16))
    opt = nn.GD([p], lr=1.0, momentum=0.0)
    clip = opt.add_modifier(nn.ClipGradNorm(1000.0))
    p.g = np.array([[300.0, 400.0]], np.float16)
    opt.step()
    assert clip.last_norm == pytest.approx(500.0)
    np.testing.assert_array_equal(p.data, np.array([[-300.0, -400.0]], np.float16))
    p.g = np.array([[300.0, 400.0]], np.float16)
    clip.max_norm = 50.0
    opt.step()
    np.testing.assert_allclose(p.data, [[-330.0, -440.0]], rtol=1e-3)


def test_clip_grad_norm_with_an_infinite_max_norm_leaves_every_gradient_as_it_is():
    # "max_norm=inf only measures n": an infinite gradient made n = inf and inf / inf = NaN
    p = nn.NetVar(np.zeros((1, 3)))
    opt = nn.GD([p], lr=1.0, momentum=0.0)
    clip = opt.add_modifier(nn.ClipGradNorm(float("inf")))
    p.g = np.array([[np.inf, 1.0, 2.0]])
    with np.errstate(all="ignore"):
        opt.step()
    assert clip.last_norm == float("inf")
    np.testing.assert_array_equal(p.data, [[-np.inf, -1.0, -2.0]])


def test_a_parameter_added_to_a_group_by_hand_is_refused_before_any_update():
    # the state is kept by position: the new parameter was updated with another's moments,
    # which it corrupted, and the next step of that other parameter raised IndexError
    a, b, c = _param([[1.0]]), _param([[2.0]]), _param([[3.0]])
    opt = nn.Adam([{"params": [a]}, {"params": [b], "lr": 0.5}])
    for _ in range(3):
        b.g = np.array([[100.0]])
        opt.step()
    state = copy_module.deepcopy(opt.state)
    opt.param_groups[0]["params"].append(c)
    c.g, b.g = np.array([[-1e-3]]), np.array([[1.0]])
    with pytest.raises(RuntimeError, match=r"Adam.step\(\): the parameters of param_groups are "
                                           r"no longer those it was given"):
        opt.step()
    assert c.data[0, 0] == 3.0 and opt.state[1]["t"] == state[1]["t"] == 3
    np.testing.assert_array_equal(opt.state[1]["m"], state[1]["m"])
    opt.param_groups[0]["params"].pop()
    opt.add_param_group({"params": [c]})
    opt.step()
    assert c.data[0, 0] > 3.0 and opt.state[2]["t"] == 1
