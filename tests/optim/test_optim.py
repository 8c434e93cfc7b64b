"""GD and Adam against their formulas (and PyTorch's Adam when installed)."""
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
    with pytest.raises(ValueError, match="momentum must be in"):
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
