"""BatchNorm (train/eval, running statistics) and LayerNorm: gradchecks and PyTorch parity."""
import numpy as np
import pytest

import nnkit as nn
from tests.conftest import var64
from tests.ops.helpers import assert_matches_pytorch, assert_same_hvp


@pytest.mark.parametrize("shape", [(5, 3), (4, 2, 3, 3), (3, 4, 5)])
@pytest.mark.parametrize("training", [True, False])
def test_batchnorm_gradcheck(shape, training, rng):
    F = shape[1]
    x, gamma, beta = var64(rng, *shape), var64(rng, F), var64(rng, F)
    state = nn.BatchNormState(F)
    state.running_mean = rng.standard_normal(F)
    state.running_var = rng.random(F) + 0.5
    with nn.train_mode(training):
        nn.gradcheck(lambda v, a, b: nn.BatchNorm(v, a, b, state), x, gamma, beta)
        nn.gradcheck(lambda v: nn.BatchNorm(v, None, None, state), x)


def test_batchnorm_normalises_each_feature_in_training(rng):
    x = nn.NetVar(rng.standard_normal((64, 3, 4, 4)) * 5 + 2)
    y = nn.BatchNorm(x, None, None, nn.BatchNormState(3))
    np.testing.assert_allclose(y.data.mean(axis=(0, 2, 3)), 0, atol=1e-12)
    np.testing.assert_allclose(y.data.var(axis=(0, 2, 3)), 1, rtol=1e-3)


def test_batchnorm_running_statistics_and_eval(rng):
    state = nn.BatchNormState(2, momentum=0.5)
    gamma, beta = nn.NetVar(np.ones(2)), nn.zeros(2)
    batches = [rng.standard_normal((8, 2)) * 3 + 1 for _ in range(2)]
    mean, var = np.zeros(2), np.ones(2)
    for b in batches:
        nn.BatchNorm(nn.NetVar(b), gamma, beta, state)
        mean = 0.5 * mean + 0.5 * b.mean(0)
        var = 0.5 * var + 0.5 * b.var(0, ddof=1)
    np.testing.assert_allclose(state.running_mean, mean)
    np.testing.assert_allclose(state.running_var, var)
    assert state.num_batches_tracked == 2
    x = nn.NetVar(rng.standard_normal((1, 2)))     # one sample is fine in evaluation
    with nn.eval_mode():
        y = nn.BatchNorm(x, gamma, beta, state)
    np.testing.assert_allclose(y.data, (x.data - mean) / np.sqrt(var + 1e-5))
    assert state.num_batches_tracked == 2          # evaluation does not update
    assert not any(isinstance(v, nn.BatchNormState) for v in
                   nn.FFN((nn.BatchNorm, gamma, beta, state)).vars)
    assert nn.FFN((nn.BatchNorm, gamma, beta, state)).vars == [gamma, beta]


def test_batchnorm_errors(rng):
    state = nn.BatchNormState(3)
    with pytest.raises(ValueError, match=r"BatchNorm: x of shape \(4, 2\) needs \(B, 3, \.\.\.\)"):
        nn.BatchNorm(var64(rng, 4, 2), None, None, state)
    with pytest.raises(ValueError, match=r"BatchNorm: gamma of shape \(1, 2\) does not match "
                                         r"the 3 features"):
        nn.BatchNorm(var64(rng, 4, 3), var64(rng, 2), None, state)
    with pytest.raises(ValueError, match="more than one value per feature"):
        nn.BatchNorm(var64(rng, 1, 3), None, None, state)
    with pytest.raises(TypeError, match="BatchNorm: state must be a BatchNormState"):
        nn.BatchNorm(var64(rng, 4, 3), None, None, None)
    with pytest.raises(ValueError, match="BatchNormState: momentum must be in"):
        nn.BatchNormState(3, momentum=2)


def test_batchnorm_keeps_float32(rng):
    x = nn.NetVar(rng.standard_normal((4, 3, 2, 2)).astype(np.float32))
    state = nn.BatchNormState(3)
    y = nn.BatchNorm(x, nn.NetVar(np.ones(3, np.float32)), None, state)
    y.back()
    assert y.dtype == x.g.dtype == state.running_var.dtype == np.float32


def test_batchnorm_matches_pytorch(torch, rng):
    import torch.nn.functional as F
    for shape in [(6, 3), (4, 3, 5, 5)]:
        x = rng.standard_normal(shape) * 2 + 0.5
        gamma, beta = rng.standard_normal(3), rng.standard_normal(3)
        state = nn.BatchNormState(3, momentum=0.2)
        rm, rv = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
        for training in (True, True, False):
            with nn.train_mode(training):
                assert_matches_pytorch(
                    torch, lambda *nodes: nn.BatchNorm(*nodes, state),
                    lambda v, a, b: F.batch_norm(v, rm, rv, a, b, training=training,
                                                 momentum=0.2, eps=1e-5),
                    x, gamma, beta, rng=rng, atol=1e-12, grad_atol=1e-10)
            np.testing.assert_allclose(state.running_mean, rm.numpy())
            np.testing.assert_allclose(state.running_var, rv.numpy())


@pytest.mark.parametrize("shape", [(4, 5), (1, 3), (2, 3, 4)])
def test_layernorm_gradcheck(shape, rng):
    D = shape[-1]
    x, gamma, beta = var64(rng, *shape), var64(rng, D), var64(rng, D)
    nn.gradcheck(nn.LayerNorm, x, gamma, beta)
    nn.gradcheck(lambda v: nn.LayerNorm(v, eps=1e-3), x)
    training = nn.LayerNorm(x, gamma, beta).data
    with nn.eval_mode():        # the same in evaluation: no running statistics
        np.testing.assert_allclose(nn.LayerNorm(x, gamma, beta).data, training)


def test_layernorm_matches_pytorch(torch, rng):
    import torch.nn.functional as F
    x = rng.standard_normal((3, 4, 6))
    gamma, beta = rng.standard_normal(6), rng.standard_normal(6)
    nodes = assert_matches_pytorch(torch, nn.LayerNorm,
                                   lambda v, a, b: F.layer_norm(v, (6,), a, b, eps=1e-5),
                                   x, gamma, beta, rng=rng, atol=1e-12, grad_atol=1e-10)
    with pytest.raises(ValueError, match=r"LayerNorm: gamma of shape \(1, 5\) does not match"):
        nn.LayerNorm(nodes[0], nn.NetVar(np.ones(5)))


# -- a refused call leaves the running statistics exactly as they were

def _trained_state(rng, features=3):
    state = nn.BatchNormState(features, momentum=0.3)
    nn.BatchNorm(nn.NetVar(rng.standard_normal((6, features)) * 2 + 1), None, None, state)
    return state


def _statistics(state):
    return (np.array(state.running_mean, copy=True), np.array(state.running_var, copy=True),
            state.num_batches_tracked, state.momentum, state.eps)


def _assert_same_statistics(state, before):
    mean, var, batches, momentum, eps = before
    np.testing.assert_array_equal(state.running_mean, mean)
    np.testing.assert_array_equal(state.running_var, var)
    assert (state.num_batches_tracked, state.momentum) == (batches, momentum)
    assert state.eps == eps or (np.isnan(state.eps) and np.isnan(eps))


@pytest.mark.parametrize("training", [True, False])
def test_batchnorm_refuses_wrong_parameters_before_touching_the_statistics(training, rng):
    state = _trained_state(rng)
    x = nn.NetVar(rng.standard_normal((4, 3)) * 5 + 2)
    bad_calls = [
        (lambda: nn.BatchNorm(x, nn.NetVar(np.ones(2)), None, state), ValueError,
         r"BatchNorm: gamma of shape \(1, 2\) does not match the 3 features of x of shape "
         r"\(4, 3\)"),
        (lambda: nn.BatchNorm(x, None, nn.NetVar(np.ones(4)), state), ValueError,
         r"BatchNorm: beta of shape \(1, 4\) does not match the 3 features"),
        (lambda: nn.BatchNorm(x, np.ones(3), None, state), TypeError,
         r"BatchNorm: gamma must be a NetVar or None, got ndarray"),
        (lambda: nn.BatchNorm(x, None, [0.0, 0.0, 0.0], state), TypeError,
         r"BatchNorm: beta must be a NetVar or None, got list"),
    ]
    with nn.train_mode(training):
        for call, error, message in bad_calls:
            before = _statistics(state)
            with pytest.raises(error, match=message):
                call()
            _assert_same_statistics(state, before)


@pytest.mark.parametrize("attribute,value,error,message", [
    ("eps", float("nan"), ValueError, r"BatchNorm: state\.eps must be finite, got nan"),
    ("eps", -1e-5, ValueError, r"BatchNorm: state\.eps must be > 0, got -1e-05"),
    ("eps", float("inf"), ValueError, r"BatchNorm: state\.eps must be finite, got inf"),
    ("eps", "1e-5", TypeError, r"BatchNorm: state\.eps must be a number, got str"),
    ("momentum", 2.0, ValueError, r"BatchNorm: state\.momentum must be in \[0, 1\], got 2"),
    ("momentum", float("nan"), ValueError, r"BatchNorm: state\.momentum must be finite, "
                                           r"got nan"),
    ("momentum", None, TypeError, r"BatchNorm: state\.momentum must be a number, got NoneType"),
    ("running_mean", np.zeros(4), ValueError, r"BatchNorm: state\.running_mean of shape \(4,\) "
                                              r"does not match its 3 features"),
    ("running_var", np.ones((1, 3)), ValueError, r"BatchNorm: state\.running_var of shape "
                                                 r"\(1, 3\) does not match its 3 features"),
])
@pytest.mark.parametrize("training", [True, False])
def test_batchnorm_refuses_a_state_edited_into_nonsense(attribute, value, error, message,
                                                        training, rng):
    state = _trained_state(rng)
    setattr(state, attribute, value)
    before = _statistics(state)
    with nn.train_mode(training), pytest.raises(error, match=message):
        nn.BatchNorm(nn.NetVar(rng.standard_normal((4, 3))), None, None, state)
    _assert_same_statistics(state, before)


def test_batchnorm_refused_by_detect_anomaly_leaves_the_statistics(rng):
    state = _trained_state(rng)
    data = rng.standard_normal((4, 3))
    data[:, 2] = [1e308, 1e308, -1e308, 1e308]        # finite, but the batch mean overflows
    before = _statistics(state)
    with nn.detect_anomaly(), np.errstate(all="ignore"), pytest.raises(nn.AnomalyError):
        nn.BatchNorm(nn.NetVar(data), None, None, state)
    _assert_same_statistics(state, before)


@pytest.mark.parametrize("options,error,message", [
    (dict(eps=float("nan")), ValueError, r"BatchNormState: eps must be finite, got nan"),
    (dict(eps=float("inf")), ValueError, r"BatchNormState: eps must be finite, got inf"),
    (dict(eps=0.0), ValueError, r"BatchNormState: eps must be > 0, got 0"),
    (dict(eps="small"), TypeError, r"BatchNormState: eps must be a number, got str"),
    (dict(momentum=float("nan")), ValueError, r"BatchNormState: momentum must be finite, "
                                              r"got nan"),
    (dict(momentum=None), TypeError, r"BatchNormState: momentum must be a number, got NoneType"),
    (dict(features=True), ValueError, r"BatchNormState: features must be a positive int, "
                                      r"got True"),
    (dict(features=3.0), ValueError, r"BatchNormState: features must be a positive int, "
                                     r"got 3.0"),
])
def test_batchnorm_state_options_are_checked(options, error, message):
    options = dict(dict(features=3), **options)
    with pytest.raises(error, match=message):
        nn.BatchNormState(**options)


@pytest.mark.parametrize("eps,error,message", [
    (float("nan"), ValueError, r"LayerNorm: eps must be finite, got nan"),
    (-1e-5, ValueError, r"LayerNorm: eps must be > 0, got -1e-05"),
    (0, ValueError, r"LayerNorm: eps must be > 0, got 0"),
    (float("inf"), ValueError, r"LayerNorm: eps must be finite, got inf"),
    ("1e-5", TypeError, r"LayerNorm: eps must be a number, got str"),
])
def test_layernorm_eps_must_be_positive_and_finite(eps, error, message, rng):
    with pytest.raises(error, match=message):
        nn.LayerNorm(var64(rng, 2, 3), eps=eps)


def test_layernorm_parameters_must_be_netvars_of_the_right_size(rng):
    x = var64(rng, 2, 3)
    with pytest.raises(TypeError, match=r"LayerNorm: gamma must be a NetVar or None, got ndarray"):
        nn.LayerNorm(x, np.ones(3))
    with pytest.raises(ValueError, match=r"LayerNorm: beta of shape \(1, 2\) does not match the "
                                         r"3 features"):
        nn.LayerNorm(x, None, nn.NetVar(np.ones(2)))


def test_evaluation_reads_the_statistics_in_the_datas_dtype_and_stores_nothing(rng):
    # an evaluation of float16 data rounded the stored float32 statistics for good
    state = nn.BatchNormState(3)
    with nn.train_mode():
        nn.BatchNorm(nn.NetVar(rng.standard_normal((8, 3)).astype(np.float32)), None, None, state)
    mean, var = state.running_mean.copy(), state.running_var.copy()
    with nn.eval_mode():
        y = nn.BatchNorm(nn.NetVar(rng.standard_normal((4, 3)).astype(np.float16)), None, None,
                         state)
    assert y.dtype == np.float16 and state.running_mean.dtype == np.float32
    np.testing.assert_array_equal(state.running_mean, mean)
    np.testing.assert_array_equal(state.running_var, var)


def test_a_negative_or_non_finite_running_statistic_is_refused_by_load_state():
    class Net(nn.Module):
        def __init__(self):
            self.stats = nn.BatchNormState(2)

    net = Net()
    for name, bad, message in (("stats.running_var", np.array([1.0, -0.5], np.float32),
                                "running_var holds negative values"),
                               ("stats.running_mean", np.array([np.nan, 0.0], np.float32),
                                "running_mean holds values that are not finite")):
        state = net.state()
        state[name] = bad
        with pytest.raises(ValueError, match=f"load_state: '{name}': the BatchNorm {message}"):
            net.load_state(state)
        np.testing.assert_array_equal(net.stats.running_var, [1.0, 1.0])
        np.testing.assert_array_equal(net.stats.running_mean, [0.0, 0.0])


# ----------------------------------------------------------------------------- Second derivatives
# Hessian-vector products (grad(create_graph=True)) against PyTorch's double backward in float64,
# and BatchNorm's running statistics do not move when its gradient graph is built.

def test_layer_norm_hvp_matches_torch(torch, rng):
    F = torch.nn.functional
    r = rng.standard_normal((2, 3, 5))

    def ours(x, gamma, beta):
        return (nn.LayerNorm(x, gamma, beta).tanh() * r).sum()

    def theirs(x, gamma, beta):
        return (F.layer_norm(x, (5,), gamma, beta).tanh() * torch.tensor(r)).sum()

    assert_same_hvp(ours, theirs, [rng.standard_normal((2, 3, 5)), rng.standard_normal(5),
                                   rng.standard_normal(5)], rng)


def test_batch_norm_training_hvp_matches_torch(torch, rng):
    F = torch.nn.functional
    r = rng.standard_normal((3, 2, 2, 3))

    def ours(x, gamma, beta):
        return (nn.BatchNorm(x, gamma, beta, nn.BatchNormState(2)) ** 3 * r).sum()

    def theirs(x, gamma, beta):
        y = F.batch_norm(x, None, None, gamma, beta, training=True, eps=1e-5)
        return (y ** 3 * torch.tensor(r)).sum()

    assert_same_hvp(ours, theirs, [rng.standard_normal((3, 2, 2, 3)), rng.standard_normal(2),
                                   rng.standard_normal(2)], rng)


def test_batch_norm_evaluation_uses_the_running_statistics_as_constants(torch, rng):
    """In evaluation y is affine in x: the only second derivatives are the x–γ cross terms
    (and those of the cube), with the running statistics as constants."""
    F = torch.nn.functional
    state = nn.BatchNormState(3, eps=1e-3)
    state.running_mean = rng.standard_normal(3)
    state.running_var = np.abs(rng.standard_normal(3)) + 0.5
    mean, var = torch.tensor(state.running_mean), torch.tensor(state.running_var)
    r = rng.standard_normal((4, 3))

    def ours(x, gamma, beta):
        with nn.eval_mode():
            return (nn.BatchNorm(x, gamma, beta, state) ** 3 * r).sum()

    def theirs(x, gamma, beta):
        y = F.batch_norm(x, mean, var, gamma, beta, training=False, eps=1e-3)
        return (y ** 3 * torch.tensor(r)).sum()

    assert_same_hvp(ours, theirs, [rng.standard_normal((4, 3)), rng.standard_normal(3),
                                   rng.standard_normal(3)], rng)
    np.testing.assert_array_equal(state.running_mean, mean.numpy())     # never updated
    assert state.num_batches_tracked == 0


def test_batch_norm_statistics_do_not_move_when_its_gradients_are_differentiated(rng):
    state = nn.BatchNormState(2, momentum=0.3)
    x, gamma = nn.NetVar(rng.standard_normal((4, 2, 3))), nn.NetVar(rng.standard_normal(2))
    y = nn.BatchNorm(x, gamma, None, state)                 # the one update
    after_forward = state.running_mean.copy(), state.running_var.copy()
    assert state.num_batches_tracked == 1
    dx, dgamma = nn.grad((y * y * y).sum(), [x, gamma], create_graph=True)
    (dx.sum() + (dgamma * dgamma).sum()).back()
    assert np.abs(x.g).max() > 1e-3
    np.testing.assert_array_equal(state.running_mean, after_forward[0])
    np.testing.assert_array_equal(state.running_var, after_forward[1])
    assert state.num_batches_tracked == 1


def test_batch_norm_gradients_follow_the_mode_it_was_built_in(rng):
    """A node built in training keeps normalising with its batch statistics when its
    gradients are built under eval_mode() (and the reverse)."""
    data, v = rng.standard_normal((5, 2)), rng.standard_normal((5, 2))
    state = nn.BatchNormState(2)
    for training in (True, False):
        found = []
        for grad_in_eval in (False, True):
            x = nn.NetVar(data)
            with nn.train_mode(training):
                y = nn.BatchNorm(x, None, None, state)
            with nn.train_mode(not grad_in_eval):
                (dx,) = nn.grad((y * y * y).sum(), [x], create_graph=True)
            found.append(nn.grad((dx * v).sum(), [x])[0])
        np.testing.assert_array_equal(found[0], found[1])


@pytest.mark.parametrize("op", ["LayerNorm", "BatchNorm", "BatchNorm eval"])
@pytest.mark.parametrize("with_gamma", [False, True])
def test_normalization_backward_leaves_the_shared_upstream_gradient_alone(op, with_gamma, rng):
    # the backward works in place in dx̂'s array: without γ that array is the upstream gradient,
    # which an Add hands on shared with its other input
    x = nn.NetVar(rng.standard_normal((6, 4)))
    other = nn.NetVar(rng.standard_normal((6, 4)))
    gamma = nn.NetVar(rng.standard_normal((1, 4))) if with_gamma else None
    if op == "LayerNorm":
        y = nn.LayerNorm(x, gamma, None)
    elif op == "BatchNorm":
        y = nn.BatchNorm(x, gamma, None, nn.BatchNormState(4))
    else:
        with nn.eval_mode():
            y = nn.BatchNorm(x, gamma, None, nn.BatchNormState(4))
    seed = rng.standard_normal((6, 4))
    (y + other).back(seed)
    np.testing.assert_array_equal(other.g, seed)
    np.testing.assert_array_equal(y.g, seed)


def test_batchnorm_statistics_of_two_dtypes_follow_the_data_each():
    # a float64 running_var beside a float32 running_mean (each taken by load_state) passed
    # through unconverted: the float32 layer's evaluation came out float64
    bn = nn.layers.BatchNorm(3)
    state = bn.state()
    state["stats.running_var"] = np.array([1.0, 2.0, 3.0])
    bn.load_state(state)
    x = np.ones((2, 3), np.float32)
    with nn.eval_mode():
        y = bn(x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y.data, np.ones((2, 3)) / np.sqrt(np.array([1.0, 2.0, 3.0]) +
                                                                 bn.stats.eps), rtol=1e-6)
    bn(x)                               # training: the update follows the data too
    assert bn.stats.running_mean.dtype == bn.stats.running_var.dtype == np.float32
