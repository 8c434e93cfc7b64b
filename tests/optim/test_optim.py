"""GD and Adam against their formulas (and PyTorch's Adam when installed)."""
import copy

import numpy as np
import pytest

import nnkit as nn


def _quadratic_grads(p):
    """Gradient of Σ p² / 2 + Σ p³ / 3 at p (so it changes from step to step)."""
    return p + p * p


def _run(optimizer_cls, steps=10, **kwargs):
    start = np.array([[0.5, -1.0, 2.0]])
    p = nn.NetVar(start.copy())
    opt = optimizer_cls([p], **kwargs)
    for _ in range(steps):
        loss = (p * p).sum() * 0.5 + (p ** 3).sum() * (1 / 3)
        loss.back()
        opt.step()
    return start, p


def test_gd_momentum_formula():
    start, p = _run(nn.GD, lr=0.1, momentum=0.9)
    ref, m = start.copy(), np.zeros_like(start)
    for _ in range(10):
        m = 0.9 * m + 0.1 * _quadratic_grads(ref)
        ref = ref - 0.1 * m
    np.testing.assert_allclose(p.data, ref, rtol=1e-12)


def test_gd_without_momentum_is_plain_descent():
    start, p = _run(nn.GD, lr=0.05, momentum=0.0)
    ref = start.copy()
    for _ in range(10):
        ref = ref - 0.05 * _quadratic_grads(ref)
    np.testing.assert_allclose(p.data, ref, rtol=1e-12)


def test_adam_formula():
    start, p = _run(nn.Adam, lr=0.01, momentum=0.8, rms=0.99, eps=1e-6)
    ref, m, v = start.copy(), 0.0, 0.0
    for t in range(1, 11):
        g = _quadratic_grads(ref)
        m = 0.8 * m + 0.2 * g
        v = 0.99 * v + 0.01 * g * g
        ref = ref - 0.01 * (m / (1 - 0.8 ** t)) / (np.sqrt(v / (1 - 0.99 ** t)) + 1e-6)
    np.testing.assert_allclose(p.data, ref, rtol=1e-12)


def test_adam_matches_pytorch(torch):
    start, p = _run(nn.Adam, lr=0.01)
    q = torch.tensor(start, requires_grad=True)
    opt = torch.optim.Adam([q], lr=0.01, betas=(0.9, 0.999), eps=1e-8)
    for _ in range(10):
        opt.zero_grad()
        loss = (q * q).sum() * 0.5 + (q ** 3).sum() / 3
        loss.backward()
        opt.step()
    np.testing.assert_allclose(p.data, q.detach().numpy(), rtol=1e-10)


def test_step_resets_gradients_and_learnrate_alias():
    p = nn.NetVar(np.ones((1, 2)))
    opt = nn.GD([p])
    assert opt.learnRate == 0.1
    opt.learnRate = 0.5
    assert opt.lr == 0.5
    (p * p).sum().back()
    opt.step()
    np.testing.assert_array_equal(p.g, np.zeros((1, 2)))


def test_step_without_any_gradient_is_an_error():
    p = nn.NetVar(np.ones((1, 2)))
    with pytest.raises(RuntimeError, match="no parameter has a gradient"):
        nn.Adam([p]).step()


def test_parameters_without_gradient_are_left_alone():
    a, b = nn.NetVar(np.ones((1, 2))), nn.NetVar(np.ones((1, 2)))
    (a * a).sum().back()
    nn.GD([a, b], momentum=0.0).step()
    np.testing.assert_array_equal(b.data, np.ones((1, 2)))
    np.testing.assert_allclose(a.data, np.ones((1, 2)) - 0.2)


def test_bad_parameters_are_rejected():
    with pytest.raises(TypeError, match="parameter 1 is a ndarray"):
        nn.GD([nn.NetVar([1.0]), np.ones(2)])
    with pytest.raises(ValueError, match="momentum"):
        nn.GD([nn.NetVar([1.0])], momentum=1.0)


# ---------------------------------------------------------------- the other optimizers

def _formula(update, steps=10):
    """Apply ``update(p, g, state, t)`` (NumPy) ``steps`` times to the test quadratic."""
    ref, state = np.array([[0.5, -1.0, 2.0]]), {}
    for t in range(1, steps + 1):
        ref = update(ref, _quadratic_grads(ref), state, t)
    return ref


def _nesterov(p, g, s, t, lr=0.05, mu=0.8):
    s["v"] = mu * s.get("v", 0) + g
    return p - lr * (g + mu * s["v"])


def _rmsprop(p, g, s, t, lr=0.01, rho=0.9, eps=1e-6):
    s["v"] = rho * s.get("v", 0) + (1 - rho) * g * g
    return p - lr * g / (np.sqrt(s["v"]) + eps)


def _adagrad(p, g, s, t, lr=0.1, eps=1e-10):
    s["s"] = s.get("s", 0) + g * g
    return p - lr * g / (np.sqrt(s["s"]) + eps)


def _adamw(p, g, s, t, lr=0.01, b1=0.9, b2=0.999, eps=1e-8, wd=0.1):
    p = p * (1 - lr * wd)
    s["m"] = b1 * s.get("m", 0) + (1 - b1) * g
    s["v"] = b2 * s.get("v", 0) + (1 - b2) * g * g
    return p - lr * (s["m"] / (1 - b1 ** t)) / (np.sqrt(s["v"] / (1 - b2 ** t)) + eps)


CASES = {
    "Nesterov": (dict(lr=0.05, momentum=0.8), _nesterov,
                 lambda torch, q: torch.optim.SGD([q], lr=0.05, momentum=0.8, nesterov=True)),
    "RMSProp": (dict(lr=0.01, rms=0.9, eps=1e-6), _rmsprop,
                lambda torch, q: torch.optim.RMSprop([q], lr=0.01, alpha=0.9, eps=1e-6)),
    "AdaGrad": (dict(lr=0.1), _adagrad,
                lambda torch, q: torch.optim.Adagrad([q], lr=0.1)),
    "AdamW": (dict(lr=0.01, weight_decay=0.1), _adamw,
              lambda torch, q: torch.optim.AdamW([q], lr=0.01, weight_decay=0.1)),
}


@pytest.mark.parametrize("name", CASES)
def test_optimizer_matches_its_formula(name):
    kwargs, update, _ = CASES[name]
    start, p = _run(getattr(nn, name), **kwargs)
    expected = _formula(update)
    assert not np.allclose(expected, start)
    np.testing.assert_allclose(p.data, expected, rtol=1e-12)


@pytest.mark.parametrize("name", CASES)
def test_optimizer_matches_pytorch(torch, name):
    kwargs, _, make = CASES[name]
    start, p = _run(getattr(nn, name), **kwargs)
    q = torch.tensor(start, requires_grad=True)
    opt = make(torch, q)
    for _ in range(10):
        opt.zero_grad()
        ((q * q).sum() * 0.5 + (q ** 3).sum() / 3).backward()
        opt.step()
    np.testing.assert_allclose(p.data, q.detach().numpy(), rtol=1e-10)


def test_adamw_without_decay_is_adam():
    _, a = _run(nn.AdamW, lr=0.01, weight_decay=0.0)
    _, b = _run(nn.Adam, lr=0.01)
    np.testing.assert_array_equal(a.data, b.data)


# ---------------------------------------------------------------- groups and state

def test_parameter_groups_override_options():
    w, b = nn.NetVar(np.ones((2, 2))), nn.NetVar(np.ones((1, 2)))
    opt = nn.AdamW([{"params": [w]}, {"params": [b], "weight_decay": 0.0, "lr": 0.5}],
                   lr=0.1, weight_decay=0.5)
    assert opt.params == [w, b]
    w.g, b.g = np.zeros((2, 2)), np.zeros((1, 2))
    opt.step()
    np.testing.assert_allclose(w.data, np.full((2, 2), 1 - 0.1 * 0.5))   # decayed
    np.testing.assert_array_equal(b.data, np.ones((1, 2)))              # exempt
    assert opt.lr == 0.1 and opt.weight_decay == 0.5                    # defaults restored


def test_parameter_groups_are_validated():
    p = nn.NetVar(np.ones((1, 2)))
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['rms'\]"):
        nn.GD([{"params": [p], "rms": 0.9}])
    with pytest.raises(ValueError, match=r"momentum in parameter group 0 must be in \[0, 1\)"):
        nn.GD([{"params": [p], "momentum": 2.0}])
    with pytest.raises(ValueError, match="listed twice"):
        nn.GD([p, p])
    with pytest.raises(ValueError, match="learning rate"):
        nn.Adam([p], lr=-1)


@pytest.mark.parametrize("cls", [nn.GD, nn.Adam, nn.Nesterov, nn.RMSProp, nn.AdaGrad, nn.AdamW])
def test_state_dict_round_trip_resumes_exactly(cls):
    def train(opt, p, steps):
        for _ in range(steps):
            ((p * p).sum() * 0.5 + (p ** 3).sum() * (1 / 3)).back()
            opt.step()

    start = np.array([[0.5, -1.0, 2.0]])
    p = nn.NetVar(start.copy())
    opt = cls([p], lr=0.01)
    train(opt, p, 10)
    q = nn.NetVar(start.copy())
    first = cls([q], lr=0.01)
    train(first, q, 5)
    saved = first.state_dict()
    resumed = cls([nn.NetVar(q.data.copy())], lr=0.5)
    resumed.load_state_dict(saved)
    assert resumed.lr == 0.01
    assert all(a is not b for a, b in zip(resumed.state[0].values(), saved["state"][0].values())
               if hasattr(a, "shape"))
    train(resumed, resumed.params[0], 5)
    np.testing.assert_array_equal(resumed.params[0].data, p.data)


def test_load_state_dict_refuses_a_mismatch_and_changes_nothing():
    p = nn.NetVar(np.ones((1, 3)))
    opt = nn.Adam([p])
    (p * p).sum().back()
    opt.step()
    saved = opt.state_dict()
    other = nn.Adam([nn.NetVar(np.ones((2, 3)))], lr=0.5)
    with pytest.raises(ValueError, match=r"state 'm' of parameter 0 has shape \(1, 3\)"):
        other.load_state_dict(saved)
    assert other.lr == 0.5 and other.state == [{}]
    with pytest.raises(ValueError, match="of a Adam optimizer"):
        nn.GD([p]).load_state_dict(saved)


class _StateOnAnotherDevice:
    """Stands for a GPU array left in the state after its parameter moved to the host."""

    def __init__(self, array):
        self.array, self.shape, self.dtype = array, array.shape, array.dtype
        self.device = type("Device", (), {"id": 1})()

    def get(self):
        return self.array


@pytest.mark.parametrize("cls", [nn.GD, nn.Adam, nn.Nesterov, nn.RMSProp, nn.AdaGrad])
def test_state_left_on_another_device_follows_the_parameter(cls):
    _, p = _run(cls, steps=10, lr=0.01)
    start = np.array([[0.5, -1.0, 2.0]])
    q = nn.NetVar(start.copy())
    opt = cls([q], lr=0.01)
    for step in range(10):
        if step == 5:      # q "moved back to the host": its state arrays are still elsewhere
            opt.state[0] = {key: _StateOnAnotherDevice(value) if hasattr(value, "shape")
                            else value for key, value in opt.state[0].items()}
        ((q * q).sum() * 0.5 + (q ** 3).sum() * (1 / 3)).back()
        opt.step()
    assert all(isinstance(value, np.ndarray) for value in opt.state[0].values()
               if not isinstance(value, int))
    np.testing.assert_array_equal(q.data, p.data)


# ---------------------------------------------------------------- refusals that change nothing

ALL = [nn.GD, nn.Adam, nn.Nesterov, nn.RMSProp, nn.AdaGrad, nn.AdamW]


def _trained(cls, **kwargs):
    """An optimizer over two named parameters after one step (so it has state)."""
    a = nn.NetVar(np.ones((3, 2)), name="w")
    b = nn.NetVar(np.full((1, 2), 0.5))
    opt = cls([a, b], lr=0.01, **kwargs)
    ((a * a).sum() + (b * b).sum()).back()
    opt.step()
    return opt, a, b


def _copy_state(opt):
    return (opt.state_dict(), [{key: value.copy() if hasattr(value, "copy") else value
                                for key, value in state.items()} for state in opt.state],
            [p.data.copy() for p in opt.params],
            [copy.deepcopy(p._g) for p in opt.params],
            [dict(group) for group in opt.param_groups])


def _assert_same_state(opt, before):
    options, states, datas, grads, groups = before
    now = _copy_state(opt)
    assert now[0]["options"] == options["options"] and now[0]["groups"] == options["groups"]
    for mine, theirs in zip(now[1], states):
        assert mine.keys() == theirs.keys()
        for key in mine:
            np.testing.assert_array_equal(mine[key], theirs[key])
    for mine, theirs in zip(now[2], datas):
        np.testing.assert_array_equal(mine, theirs)
    for mine, theirs in zip(now[3], grads):
        assert (mine is None) == (theirs is None)
        if mine is not None:
            np.testing.assert_array_equal(mine, theirs)
    assert now[4] == groups


@pytest.mark.parametrize("cls", ALL)
def test_empty_parameter_list_is_refused(cls):
    with pytest.raises(ValueError, match=f"{cls.__name__}: .*empty parameter list"):
        cls([])
    with pytest.raises(ValueError, match=f"{cls.__name__}: .*empty parameter list"):
        cls([{"params": []}])
    with pytest.raises(ValueError, match=f"{cls.__name__}: .*empty parameter list"):
        cls(nn.FFN((nn.ReLU,)).vars)


def test_a_parameter_in_two_groups_is_refused_and_a_bad_group_adds_nothing():
    w, b = nn.NetVar(np.ones((2, 2)), name="w"), nn.NetVar(np.ones((1, 2)))
    with pytest.raises(ValueError, match=r"GD: parameter 1 \(NetVar 'w' .*\) is listed twice"):
        nn.GD([{"params": [w]}, {"params": [w], "lr": 0.5}])
    opt = nn.GD([w])
    with pytest.raises(ValueError, match=r"parameter 2 .* is listed twice"):
        opt.add_param_group({"params": [b, w]})
    with pytest.raises(TypeError, match="parameter 2 is a str"):
        opt.add_param_group({"params": [b, "w"]})
    assert opt.params == [w] and len(opt.param_groups) == 1 and len(opt.state) == 1
    with pytest.raises(TypeError, match="write \\[w\\]"):
        opt.add_param_group({"params": b})
    opt.add_param_group({"params": [b], "lr": 0.5})       # still consistent: b trains
    w.g, b.g = np.ones((2, 2)), np.ones((1, 2))
    opt.step()
    np.testing.assert_allclose(b.data, np.full((1, 2), 1 - 0.5 * 0.1))


def test_a_constant_is_refused():
    c = nn.NetVar(np.ones((1, 2)), requires_grad=False)
    with pytest.raises(ValueError, match=r"Adam: parameter 1 .* does not require a gradient"):
        nn.Adam([nn.NetVar(np.ones((1, 2))), c])


@pytest.mark.parametrize("cls", ALL)
def test_gradient_of_the_wrong_shape_is_refused_before_any_update(cls):
    opt, a, b = _trained(cls)
    (a * a).sum().back()
    b._g = np.ones((1, 2))          # b is fine; a gets what a faulty op's _back might leave
    a._g = np.ones((1, 2))
    before = _copy_state(opt)
    with pytest.raises(ValueError, match=rf"{cls.__name__}.step\(\): the gradient of parameter "
                                         r"0 \(NetVar 'w' #\d+ of shape \(3, 2\)\) has shape "
                                         r"\(1, 2\)"):
        opt.step()
    _assert_same_state(opt, before)
    if cls is nn.Adam:
        assert opt.state[0]["t"] == 1


@pytest.mark.parametrize("bad", [np.ones((1, 2), dtype=complex), np.ones((1, 2), dtype=object),
                                 np.float64(1.0), 1.0, [[1.0, 1.0]]])
def test_gradient_that_is_not_a_float_array_is_refused(bad):
    opt, a, b = _trained(nn.Adam)
    a._g, b._g = np.ones((3, 2)), bad
    before = _copy_state(opt)
    with pytest.raises(ValueError, match=r"Adam.step\(\): the gradient of parameter 1 "):
        opt.step()
    _assert_same_state(opt, before)


def test_gradient_made_by_a_faulty_user_op_is_refused():
    class RowSum(nn.NetOp):      # its _back forgets to broadcast the gradient back
        def __init__(self, x):
            super().__init__(x.data.sum(axis=0, keepdims=True), x)

        def _back(self, x):
            x._g = self.g

    w = nn.NetVar(np.ones((3, 2)))
    opt = nn.GD([w], momentum=0.0)
    RowSum(w).sum().back()
    with pytest.raises(ValueError, match=r"GD.step\(\): the gradient of parameter 0 .* has "
                                         r"shape \(1, 2\); it must have the parameter's shape"):
        opt.step()
    np.testing.assert_array_equal(w.data, np.ones((3, 2)))


def test_a_modifier_returning_wrong_gradients_is_refused_before_any_update():
    class Truncate:
        def modify_gradients(self, params, grads):
            return grads[:1]

    class Reshape:
        def modify_gradients(self, params, grads):
            return [g.reshape(-1, 1) for g in grads]

    for modifier, message in ((Truncate(), "returned 1 gradients for 2 parameters"),
                              (Reshape(), "the gradient of parameter 0 .* returned by Reshape")):
        opt, a, b = _trained(nn.Adam)
        clip = opt.add_modifier(nn.ClipGradNorm(1.0))      # runs before the bad modifier
        ((a * a).sum() + (b * b).sum()).back()
        opt.step()
        norm = clip.last_norm
        ((a * a).sum() * 2 + (b * b).sum()).back()
        opt.add_modifier(modifier)
        before = _copy_state(opt)
        with pytest.raises(ValueError, match=message):
            opt.step()
        _assert_same_state(opt, before)
        assert clip.last_norm == norm       # the refused step's norm is not recorded


BAD_OPTIONS = [
    ("lr", float("nan"), "learning rate"), ("lr", float("inf"), "learning rate"),
    ("lr", -0.1, "learning rate"), ("momentum", 1.5, "momentum"), ("momentum", 1.0, "momentum"),
    ("momentum", float("nan"), "momentum"), ("rms", -0.1, "rms"), ("eps", 0.0, "eps"),
    ("eps", float("nan"), "eps"), ("weight_decay", -1.0, "weight_decay"),
    ("weight_decay", float("inf"), "weight_decay"),
]


@pytest.mark.parametrize("key, value, what", BAD_OPTIONS)
def test_bad_options_are_refused_everywhere(key, value, what):
    p = nn.NetVar(np.ones((1, 2)))
    with pytest.raises(ValueError, match=f"AdamW: {what} must be"):
        nn.AdamW([p], **{key: value})
    with pytest.raises(ValueError, match=f"AdamW: {what} in parameter group 0 must be"):
        nn.AdamW([{"params": [p], key: value}])
    opt, a, b = _trained(nn.AdamW)
    saved = opt.state_dict()
    saved["options"][key] = value
    before = _copy_state(opt)
    with pytest.raises(ValueError, match=f"AdamW.load_state_dict: {what} must be"):
        opt.load_state_dict(saved)
    saved = opt.state_dict()
    saved["groups"][0][key] = value
    with pytest.raises(ValueError,
                       match=f"AdamW.load_state_dict: {what} in parameter group 0 must be"):
        opt.load_state_dict(saved)
    _assert_same_state(opt, before)
    # set directly (opt.lr = ..., a group's dict): refused at the next step, before any update
    ((a * a).sum() + (b * b).sum()).back()
    before = _copy_state(opt)
    opt.param_groups[0][key] = value
    with pytest.raises(ValueError, match=f"AdamW.step\\(\\): {what} in parameter group 0 must be"):
        opt.step()
    del opt.param_groups[0][key]
    setattr(opt, key, value)
    with pytest.raises(ValueError, match=f"AdamW.step\\(\\): {what} must be"):
        opt.step()


def test_options_of_the_wrong_type_are_refused():
    p = nn.NetVar(np.ones((1, 2)))
    for value in ("0.1", None, True, np.ones(2)):
        with pytest.raises(TypeError, match="GD: learning rate must be a number"):
            nn.GD([p], lr=value)
    with pytest.raises(ValueError, match="learning rate"):
        nn.GD([p]).learnRate = float("nan")
    assert nn.GD([p], lr=np.float32(0.5)).lr == 0.5


def test_load_state_dict_refuses_malformed_state_and_changes_nothing():
    opt, a, b = _trained(nn.Adam)
    good = opt.state_dict()
    cases = {
        "a list of 1 parameter states": lambda s: s.update(state=s["state"][:1]),
        "has 0 parameter groups' options": lambda s: s.update(groups=[]),
        r"unknown option\(s\) \['beta'\] in parameter group 0":
            lambda s: s["groups"][0].update(beta=0.5),
        r"state of parameter 1 has keys \['m', 't'\]": lambda s: s["state"][1].pop("v"),
        "state 't' of parameter 0 must be an int >= 1": lambda s: s["state"][0].update(t=-1),
        "state 'm' of parameter 0 must be a float array":
            lambda s: s["state"][0].update(m=np.ones((3, 2), dtype=int)),
        "missing 'options'": lambda s: s.pop("options"),
        # a corrupted state would make every later update NaN (sqrt of a negative v)
        "state 'v' of parameter 1 is a running square and holds negative values":
            lambda s: s["state"][1].update(v=-np.ones((1, 2))),
        "state 'm' of parameter 0 holds values that are not finite":
            lambda s: s["state"][0].update(m=np.full((3, 2), np.nan)),
    }
    for message, edit in cases.items():
        saved = {key: value for key, value in good.items()}
        saved["state"] = [dict(state) for state in good["state"]]
        saved["groups"] = [dict(group) for group in good["groups"]]
        edit(saved)
        before = _copy_state(opt)
        with pytest.raises(ValueError, match=f"Adam.load_state_dict: .*{message}"):
            opt.load_state_dict(saved)
        _assert_same_state(opt, before)


def test_modifier_for_a_parameter_the_optimizer_does_not_hold_is_refused():
    w, other = nn.NetVar(np.ones((1, 2))), nn.NetVar(np.ones((1, 2)), name="old_w")
    with pytest.raises(ValueError, match=r"GD: Freeze applies to NetVar 'old_w' .*, which this "
                                         "optimizer does not update"):
        nn.GD([w], modifiers=[nn.Freeze([other])])
    opt = nn.GD([w])
    clip = opt.add_modifier(nn.ClipValue(1.0))
    with pytest.raises(ValueError, match="GD: ClipValue.* is attached already"):
        opt.add_modifier(clip)
    with pytest.raises(TypeError, match=r"GD: modifiers must be a list.*write \[modifier\]"):
        nn.GD([w], modifiers=nn.ClipValue(1.0))
    with pytest.raises(ValueError, match="GD.remove_modifier: .* is not attached"):
        opt.remove_modifier(nn.ClipValue(1.0))
    assert opt.modifiers == [clip]


def test_a_gradient_of_another_array_type_is_refused():
    opt, a, b = _trained(nn.GD)
    a._g, b._g = np.ones((3, 2)), np.ma.masked_array(np.ones((1, 2)))
    with pytest.raises(ValueError, match="gradient of parameter 1 .* is a MaskedArray, the "
                                         "parameter's data a ndarray"):
        opt.step()


@pytest.mark.parametrize("cls", ALL)
def test_a_read_only_parameter_is_refused_before_any_update(cls):
    # e.g. data from np.load(mmap_mode="r") or np.broadcast_to: the first parameter was
    # updated, every gradient dropped and the read-only one's state advanced before NumPy raised
    opt, a, b = _trained(cls)
    b.data = np.broadcast_to(np.full((1, 2), 0.5), (1, 2))
    ((a * a).sum() + (b * b).sum()).back()
    before = _copy_state(opt)
    with pytest.raises(ValueError, match=rf"{cls.__name__}.step\(\): parameter 1 \(NetVar #\d+ "
                                         r"of shape \(1, 2\)\) holds a read-only array"):
        opt.step()
    _assert_same_state(opt, before)
    assert a._g is not None and b._g is not None


@pytest.mark.parametrize("cls", ALL)
def test_state_dict_is_a_snapshot_that_later_steps_do_not_change(cls):
    def step(p):
        ((p * p).sum() * 0.5 + (p ** 3).sum() * (1 / 3)).back()
        opt.step()

    p = nn.NetVar(np.array([[0.5, -1.0, 2.0]]))
    opt = cls([p], lr=0.01)
    for _ in range(3):
        step(p)
    saved, value = opt.state_dict(), p.data.copy()
    step(p)
    expected = p.data.copy()
    p.data = value                     # roll back to the snapshot, then take the same step
    opt.load_state_dict(saved)
    step(p)
    np.testing.assert_array_equal(p.data, expected)


def test_load_state_dict_gives_the_state_the_parameters_dtype():
    p = nn.NetVar(np.ones((1, 3)))
    opt = nn.Adam([p])
    (p * p).sum().back()
    opt.step()
    saved = opt.state_dict()
    saved["state"][0] = {key: value.astype(np.float16) if hasattr(value, "astype") else value
                         for key, value in saved["state"][0].items()}
    opt.load_state_dict(saved)
    assert opt.state[0]["m"].dtype == opt.state[0]["v"].dtype == np.float64


@pytest.mark.parametrize("cls", [nn.GD, nn.Adam, nn.RMSProp, nn.AdaGrad])
def test_a_parameter_given_data_of_another_shape_is_refused_before_any_update(cls):
    # its state no longer fit: the step failed inside NumPy after updating the first parameter
    # (its count advanced) and dropping every gradient
    opt, a, b = _trained(cls, **({"momentum": 0.9} if cls is nn.GD else {}))
    b.data = np.ones((1, 4))
    ((a * a).sum() + (b * b).sum()).back()
    before = _copy_state(opt)
    with pytest.raises(ValueError, match=rf"{cls.__name__}.step\(\): state '\w+' of parameter 1 "
                                         r"\(NetVar #\d+ of shape \(1, 4\)\) has shape \(1, 2\), "
                                         r"the parameter's data now \(1, 4\)"):
        opt.step()
    _assert_same_state(opt, before)
    opt.state[1] = {}
    opt.step()                                       # the way out the message gives
    assert b._g is None


def test_load_state_dict_refuses_values_its_cast_makes_infinite_and_malformed_lists():
    opt, a, b = _trained(nn.Adam)
    a.data, b.data = a.data.astype(np.float32), b.data.astype(np.float32)
    opt.state = [{key: v.astype(np.float32) if hasattr(v, "astype") else v
                  for key, v in s.items()} for s in opt.state]
    good = opt.state_dict()
    huge = {**good, "state": [{**good["state"][0], "m": np.full((3, 2), 1e300)},
                              good["state"][1]]}          # finite in float64, inf in float32
    before = _copy_state(opt)
    with pytest.raises(ValueError, match="state 'm' of parameter 0 holds values that are not "
                                         "finite"):
        opt.load_state_dict(huge)
    for key, bad in (("sizes", 1), ("groups", [5]), ("state", "x")):
        with pytest.raises(ValueError, match=f"Adam.load_state_dict: the state's '{key}' is "
                                             "malformed"):
            opt.load_state_dict({**good, key: bad})
    _assert_same_state(opt, before)


def test_a_modifier_returning_another_float_dtype_updates_in_the_parameters_dtype():
    # float16 gradients from a modifier for float64 parameters: taken in the parameter's dtype,
    # as the .g setter takes them (Adam computed its whole update in float16: NaN and -inf)
    class Half:
        def modify_gradients(self, params, grads):
            return [g.astype(np.float16) for g in grads]

    g = np.array([[0.0, 0.5, 1e-3]])
    p, q = nn.NetVar(np.array([[1.0, 2.0, 3.0]])), nn.NetVar(np.array([[1.0, 2.0, 3.0]]))
    opt = nn.Adam([p], lr=0.1, modifiers=[Half()])
    reference = nn.Adam([q], lr=0.1)
    p.g = g
    q.g = g.astype(np.float16)          # the setter casts to float64
    opt.step()
    reference.step()
    np.testing.assert_array_equal(p.data, q.data)
    assert p.data.dtype == np.float64 and opt.state[0]["m"].dtype == np.float64


@pytest.mark.parametrize("eps", [1e-7, 5e-7, 1e-6])
def test_adam_on_float16_keeps_an_eps_that_float16_can_hold(eps):
    # √v̂ + eps as written: folding eps into eps·√(1 − β2ᵗ) underflowed to 0 in float16, and
    # an element whose gradient is 0 became 0/0 = NaN (PyTorch keeps it)
    p = nn.NetVar(np.array([[1.0, 2.0]], dtype=np.float16))
    opt = nn.Adam([p], lr=0.01, eps=eps)
    p.g = np.array([[0.0, 0.5]], dtype=np.float16)
    opt.step()
    assert p.data[0, 0] == 1.0
    assert abs(float(p.data[0, 1]) - (2.0 - 0.01)) < 2e-3


@pytest.mark.parametrize("make", [nn.Adam, nn.AdamW, nn.RMSProp, nn.AdaGrad])
def test_an_eps_that_is_0_in_a_parameters_dtype_is_refused_before_any_update(make):
    # the default 1e-8 is 0 in float16: a zero-gradient element became 0/0 = NaN, silently
    a = nn.NetVar(np.array([[1.0, 2.0]]))
    p = nn.NetVar(np.array([[1.0, 2.0, 3.0]], dtype=np.float16))
    opt = make([a, p])
    a.g = np.ones((1, 2))
    p.g = np.array([[0.0, 1e-4, 1.0]], dtype=np.float16)
    before = _copy_state(opt)
    with pytest.raises(ValueError, match=r"eps 1e-\d+ is 0 in float16, the dtype of parameter "
                                         r"1 .* nothing was updated"):
        opt.step()
    _assert_same_state(opt, before)
    np.testing.assert_array_equal(a.data, [[1.0, 2.0]])
    assert p.g is not None and a._g is not None
    opt.param_groups[0]["eps"] = 1e-4
    opt.step()
    assert np.isfinite(p.data).all()


def test_reading_a_gradient_never_makes_an_optimizer_move_a_weight():
    # p.g stored zeros on a read, which step() took for a gradient: Adam's momentum moved a
    # frozen weight, AdamW decayed an unused one
    used, unused = nn.NetVar(np.ones((1, 2))), nn.NetVar(np.ones((1, 3)))
    opt = nn.AdamW([used, unused], lr=0.1, weight_decay=0.1)
    for _ in range(2):
        (used * used).sum().back()
        print(unused.g)                       # logging every gradient
        opt.step()
    np.testing.assert_array_equal(unused.data, np.ones((1, 3)))
    unused.g[0, 1] = 5.0                      # an edit through the read array is a gradient
    opt.step()
    assert unused.data[0, 1] < 1.0 and unused.data[0, 0] < 1.0     # (AdamW decays it all)


def test_the_zeros_a_read_made_are_not_kept_after_a_step_or_a_reset():
    # the node remembered the array it handed out on a read: one gradient-sized array per
    # parameter stayed alive after step() and reset()
    import weakref
    p, q = nn.NetVar(np.ones((1, 3))), nn.NetVar(np.ones((1, 3)))
    opt = nn.GD([p, q], lr=0.1)
    seen = [weakref.ref(p.g), weakref.ref(q.g)]
    (p * p).sum().back()                  # into p's read array, in place
    opt.step()
    q.reset()
    assert [ref() for ref in seen] == [None, None]
