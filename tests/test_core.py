"""The engine: NetVar, NetOp, back(), dtype policy, modes, graph lifetime."""
import copy
import gc
import pickle
import re
import sys
import weakref

import numpy as np
import pytest

import nnkit as nn
from tests.conftest import var64


# ---------------------------------------------------------------- NetVar and the dtype policy

def test_promotion_to_rows():
    assert nn.NetVar([1, 2]).shape == (1, 2)
    assert nn.NetVar(3).shape == (1, 1)
    assert nn.NetVar(np.ones((2, 3, 4))).shape == (2, 3, 4)


def test_dtype_policy():
    assert nn.NetVar([1, 2]).dtype == np.float32
    assert nn.NetVar(2.5).dtype == np.float32
    assert nn.NetVar(np.array([1, 2])).dtype == np.float32
    assert nn.NetVar(np.array([True])).dtype == np.float32
    assert nn.NetVar(np.ones(3, dtype=np.float64)).dtype == np.float64
    assert nn.NetVar(np.ones(3, dtype=np.float16)).dtype == np.float16
    labels = nn.NetVar([0, 2, 1], dtype=int)
    assert labels.dtype.kind == "i" and not labels.requires_grad


def test_default_dtype_is_settable():
    try:
        nn.dtype = np.float64
        assert nn.NetVar([1, 2]).dtype == np.float64
    finally:
        nn.dtype = np.float32
    assert nn.NetVar([1, 2]).dtype == np.float32
    with pytest.raises(TypeError, match="float"):
        nn.set_dtype(np.int32)


def test_python_scalar_operand_adopts_dtype():
    x32 = nn.NetVar(np.ones((2, 2), dtype=np.float32))
    x64 = nn.NetVar(np.ones((2, 2)))
    assert (x32 * 0.5).dtype == np.float32
    assert (x32 + 1).dtype == np.float32
    assert (1 - x32).dtype == np.float32
    assert (x64 / 3).dtype == np.float64
    assert (2.0 ** 0 * x64).dtype == np.float64


def test_bad_data_is_rejected_clearly():
    with pytest.raises(TypeError, match="NetVar"):
        nn.NetVar(["a", "b"])
    with pytest.raises(TypeError, match="NetVar"):
        nn.NetVar(np.array([object(), object()]))


def test_netvar_basics():
    x = nn.NetVar([[1.0, 2.0]], name="x")
    assert x.item.__doc__
    assert "x" in repr(x) and "(1, 2)" in repr(x) and "float32" in repr(x)
    assert nn.NetVar(7).item() == 7.0
    with pytest.raises(ValueError, match="2 elements"):
        x.item()
    assert np.array_equal(x.g, np.zeros((1, 2)))
    with pytest.raises(TypeError, match="ambiguous"):
        bool(x)


# ---------------------------------------------------------------- back()

def test_backward_of_article_graph_by_hand():
    x = nn.NetVar([1., 2.])
    w = nn.NetVar([[3., 4., 5.], [6., 7., 8.]])
    b = nn.NetVar([1., -100., 3.])
    y = nn.ReLU(nn.Add(nn.Multiply(x, w), b))
    y.back()
    mask = np.array([[1., 0., 1.]])      # the middle unit is cut by ReLU
    np.testing.assert_allclose(b.g, mask)
    np.testing.assert_allclose(w.g, x.data.T @ mask)
    np.testing.assert_allclose(x.g, mask @ w.data.T)


def test_diamond_fan_out_counts_each_path_once():
    # y = (x*x) + (x*x) built as a diamond with a shared middle node, depth 30:
    # every level doubles the value; gradient is 2^30 · d(x*x) / dx = 2^30 · 2x, not exponential in paths.
    x = nn.NetVar(np.array([[1.5]]))
    h = x * x
    for _ in range(30):
        h = h + h
    h.back()
    assert x.g.item() == pytest.approx(2 ** 30 * 2 * 1.5)


def test_shared_weight_gets_sum_of_both_uses():
    w = nn.NetVar(np.array([[2.0]]))
    x = nn.NetVar(np.array([[3.0]]), requires_grad=False)
    y = (x @ w) @ w            # y = x·w², dy/dw = 2xw = 12
    y.back()
    assert w.g.item() == pytest.approx(12.0)


def test_unrolled_rnn_with_a_loss_at_every_step_by_hand():
    # h_t = w·h_{t−1} + x_t, loss = Σ_t h_t; d loss / dw by hand = Σ_t Σ_{k<t} w^{t−1−k}... checked
    # against the closed form of the scalar recursion.
    w = nn.NetVar(np.array([[0.5]]))
    xs = [1.0, 2.0, -1.0, 3.0]
    h = nn.NetVar(np.array([[0.0]]), requires_grad=False)
    hs, total = [], None
    for x in xs:
        h = h * w + x
        hs.append(h)
        total = h if total is None else total + h
    total.back()
    # numeric derivative of the same recursion
    def loss(wv):
        hv, s = 0.0, 0.0
        for x in xs:
            hv = hv * wv + x
            s += hv
        return s
    eps = 1e-6
    assert w.g.item() == pytest.approx((loss(0.5 + eps) - loss(0.5 - eps)) / (2 * eps), rel=1e-6)


def test_double_back_doubles_leaf_gradients_and_recomputes_intermediates():
    x = var64(np.random.default_rng(0), 3, 4)
    h = nn.Tanh(x)
    y = (h * h).sum()
    y.back()
    g1, h1 = x.g.copy(), h.g.copy()
    y.back()
    np.testing.assert_allclose(x.g, 2 * g1)
    np.testing.assert_allclose(h.g, h1)          # intermediate: recomputed, not accumulated
    x.reset()
    np.testing.assert_array_equal(x.g, np.zeros_like(g1))


def test_back_on_subgraph_and_on_a_leaf():
    x = nn.NetVar(np.array([[2.0]]))
    y = x * x
    z = y * 3.0
    y.back()
    assert x.g.item() == 4.0
    x.reset()
    z.back()
    assert x.g.item() == 12.0
    x.back()
    assert x.g.item() == 13.0


def test_seed_gradient():
    x = nn.NetVar(np.array([[1.0, 2.0]]))
    y = x * 3.0
    y.back(np.array([[1.0, 10.0]]))
    np.testing.assert_allclose(x.g, [[3.0, 30.0]])
    with pytest.raises(ValueError, match=r"back\(\): the seed gradient of Mul #\d+ of shape "
                                         r"\(1, 2\): .* node's shape \(1, 2\), got \(3,\)"):
        y.back(np.ones(3))
    for seed, error, message in [("abc", TypeError, r"back\(\): the seed gradient .* not str"),
                                 (np.ones((1, 2), complex), TypeError, r"not complex128"),
                                 ([[True, False]], TypeError, r"not bool")]:
        with pytest.raises(error, match=message):
            y.back(seed)
    assert x.g[0, 1] == 30.0                                 # refused seeds changed nothing
    x.reset()
    y.back(2.0)                                              # a number fills the node's shape
    np.testing.assert_allclose(x.g, [[6.0, 6.0]])


def test_data_assignment_is_checked_and_a_new_shape_drops_the_gradient():
    w = nn.NetVar(np.ones((2, 2)))
    (w * 2.0).sum().back()
    with pytest.raises(TypeError, match=r"\.data of NetVar #\d+ of shape \(2, 2\): cannot make"):
        w.data = "abc"
    with pytest.raises(TypeError, match=r"\.data of NetVar .*cannot hold an array of dtype <U1"):
        w.data = np.array([["a"]])
    assert w.shape == (2, 2) and w.g[0, 0] == 2.0            # refused: nothing changed
    w.data = [[1, 2], [3, 4]]                                 # a list takes the node's dtype
    assert w.dtype == np.float64 and w.g[0, 0] == 2.0
    w.data = nn.NetVar(np.full((2, 2), 5.0))                 # a node gives its values
    assert type(w.data) is np.ndarray and w.data[0, 0] == 5.0
    w.data = np.ones((3, 2))
    assert w._g is None and w.g.shape == (3, 2)              # a gradient of the old shape is gone
    with pytest.raises(TypeError, match=r"NetVar: requires_grad must be True or False, got 'no'"):
        nn.NetVar([1.0], requires_grad="no")


def test_seed_array_is_not_modified():
    x = nn.NetVar(np.array([[1.0, 2.0]]))
    seed = np.array([[1.0, 1.0]])
    y = x + x
    y.back(seed)
    y.back(seed)
    np.testing.assert_array_equal(seed, [[1.0, 1.0]])
    np.testing.assert_allclose(x.g, [[4.0, 4.0]])


def test_gradient_buffers_are_not_aliased_between_nodes():
    # Add passes its gradient through unchanged; editing one node's .g must not change another's.
    a = nn.NetVar(np.ones((1, 2)))
    b = nn.NetVar(np.ones((1, 2)))
    s = a + b
    s.back()
    a.g += 5
    np.testing.assert_array_equal(b.g, [[1.0, 1.0]])
    np.testing.assert_array_equal(s.g, [[1.0, 1.0]])


def test_back_requires_a_graph():
    x = nn.NetVar([1.0], requires_grad=False)
    with pytest.raises(RuntimeError, match="does not require a gradient"):
        (x * 2.0).back()
    w = nn.NetVar([1.0])
    with nn.no_grad():
        y = w * 2.0
    assert y.parents == () and not y.requires_grad
    with pytest.raises(RuntimeError, match="no_grad"):
        y.back()


def test_no_grad_records_nothing_and_is_a_decorator():
    w = nn.NetVar([1.0, 2.0])

    @nn.no_grad()
    def f():
        return nn.Tanh(w * w)

    assert f().parents == ()
    assert nn.is_grad_enabled()
    with nn.no_grad():
        with nn.enable_grad():
            assert (w * w).parents
        assert not (w * w).parents


def test_long_chain_at_default_recursion_limit():
    assert sys.getrecursionlimit() == 1000
    x = nn.NetVar(np.array([[0.3]]))
    y = x
    for i in range(100_000):
        y = nn.Tanh(y) if i % 2 else y * 1.0
    y.back()
    assert np.isfinite(x.g).all() and x.g.item() != 0.0


def test_20000_step_rnn_with_per_step_losses():
    rng = np.random.default_rng(0)
    W = nn.NetVar(rng.standard_normal((4, 4)) * 0.3)
    h = nn.NetVar(np.zeros((1, 4)), requires_grad=False)
    total = None
    for t in range(20_000):
        h = nn.Tanh(h @ W + 0.1)
        step_loss = (h * h).sum()
        total = step_loss if total is None else total + step_loss
    total.back()
    assert W.g.shape == (4, 4) and np.isfinite(W.g).all()


def _build_chain(depth):
    x = nn.NetVar(np.array([[1.0]]))
    y = x
    for _ in range(depth):
        y = nn.Tanh(y)
    return x, y


@pytest.mark.parametrize("collect", [False, True])
def test_graph_freed_by_reference_counting(collect):
    was_enabled = gc.isenabled()
    if not collect:
        gc.disable()
    try:
        x, y = _build_chain(1000)
        y.back()
        probe = weakref.ref(y.parents[0])
        del y
        assert probe() is None     # freed at once, without the cycle collector
        x, y = _build_chain(100_000)
        del y                      # a 100,000-deep graph dies without crashing
    finally:
        if was_enabled:
            gc.enable()


def test_user_op_written_like_the_article():
    class Multiply(nn.NetOp):
        """Multiplication.

        y = xw
        """
        def __init__(self, x, w):
            super().__init__(x.data @ w.data, x, w)

        def _back(self, x, w):
            x.g += self.g @ w.data.T
            w.g += x.data.T @ self.g
            super()._back()

    rng = np.random.default_rng(3)
    x, w = var64(rng, 2, 3), var64(rng, 3, 4)
    nn.gradcheck(lambda a, b: nn.Tanh(Multiply(a, b)), x, w)
    # fan-out through a user op accumulates exactly like a built-in op
    y = Multiply(x, w)
    z = nn.Add(y, y)
    z.back()
    np.testing.assert_allclose(w.g, 2 * x.data.T @ np.ones((2, 4)))


# ---------------------------------------------------------------- in-place edits and anomalies

def test_in_place_edit_after_use_is_detected_at_back():
    w = nn.NetVar(np.ones((2, 2)))
    x = nn.NetVar(np.ones((1, 2)))
    y = (x @ w).sum()
    w.data += 1.0
    with pytest.raises(nn.InplaceEditError, match="Multiply"):
        y.back()
    y = (x @ w).sum()          # rebuilt after the edit: fine
    y.back()


def test_optimizer_step_after_back_is_allowed_then_stale_graph_is_refused():
    w = nn.NetVar(np.ones((2, 2)))
    x = nn.NetVar(np.ones((1, 2)), requires_grad=False)
    y = (x @ w).sum()
    y.back()
    nn.GD([w], lr=0.1).step()
    with pytest.raises(nn.InplaceEditError):
        y.back()


def test_detect_anomaly_names_the_op():
    x = nn.NetVar(np.array([[-1.0, 1.0]]))
    with nn.detect_anomaly():
        with pytest.raises(nn.AnomalyError, match=r"forward of Log #\d+"):
            nn.Log(x)
    y = nn.Log(nn.NetVar(np.array([[0.0, 1.0]])) * 1.0)   # -inf in forward, outside the mode
    with nn.detect_anomaly():
        a = nn.NetVar(np.array([[0.0, 1.0]]))
        with pytest.raises(nn.AnomalyError, match="Sqrt|Pow"):
            nn.Pow(a, 0.5).sum().back()
    assert y is not None


def test_train_mode_switch():
    assert nn.is_training()
    with nn.train_mode(False):
        assert not nn.is_training()
        with nn.train_mode(True):
            assert nn.is_training()
    with nn.eval_mode():
        assert not nn.is_training()
    assert nn.is_training()


def test_broadcast_mismatch_names_op_and_shapes():
    with pytest.raises(ValueError, match=r"Add: cannot broadcast \(4, 3\) with \(2, 5\)"):
        nn.NetVar(np.ones((4, 3))) + nn.NetVar(np.ones((2, 5)))
    with pytest.raises(ValueError, match=r"Multiply: cannot multiply \(4, 3\) by \(2, 5\)"):
        nn.Multiply(nn.NetVar(np.ones((4, 3))), nn.NetVar(np.ones((2, 5))))


def test_nan_propagates_without_clipping():
    x = nn.NetVar(np.array([[np.nan, 1.0]]))
    assert np.isnan(nn.Tanh(x).data[0, 0])
    assert np.isnan(nn.Sigmoid(x).data[0, 0])
    assert np.isnan((x * 2.0).data[0, 0])


def test_device_mixing_error_names_both_devices():
    class FakeGPUArray:
        shape = (2,)
        device = type("Device", (), {"id": 0})()

    from nnkit import backend
    with pytest.raises(ValueError, match=r"cpu.*gpu:0"):
        backend.check_same_device("Add", np.ones(2), FakeGPUArray())


def test_cupy_is_optional():
    if nn.gpu_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="CuPy"):
        nn.NetVar([1.0]).to_gpu()


def test_mode_switches_as_decorators_set_their_own_mode():
    w = nn.NetVar([1.0, 2.0])

    @nn.enable_grad()
    def recorded():
        return w * w

    @nn.train_mode(False)
    def evaluating():
        return nn.is_training()

    with nn.no_grad():
        assert recorded().parents          # enable_grad() as a decorator turns recording on
        assert not (w * w).parents
    assert evaluating() is False and nn.is_training()
    assert recorded.__name__ == "recorded"


# ---------------------------------------------------------------- gradients at the seams

@pytest.mark.parametrize("reduce", [
    lambda x: x.sum(), lambda x: x.mean(), lambda x: x.max(), lambda x: x.norm(),
    lambda x: nn.Sum(x, axis=(0, 1), keepdims=True)])       # 0-d and (1, 1)
@pytest.mark.parametrize("consumers", [3, 5])
def test_a_scalar_read_by_many_consumers_gets_every_contribution(reduce, consumers, rng):
    x = var64(rng, 2, 3)
    m = reduce(x)
    total = m * 2.0
    for k in range(3, consumers + 2):
        total = total + m * float(k)
    total.sum().back()
    weight = sum(range(2, consumers + 2))
    reference = var64(rng, 2, 3)
    reference.data[...] = x.data
    (reduce(reference) * float(weight)).sum().back()
    np.testing.assert_allclose(x.g, reference.g, rtol=1e-12)
    assert type(m.g) is np.ndarray and m.g.shape == m.shape and m.g.dtype == m.dtype
    assert m.g.item() == weight


def test_a_scalar_loss_used_twice_and_the_issue_example():
    x = nn.NetVar(np.ones((2, 3)))
    m = x.sum()
    (m * 2 + m * 3 + m * 4).back()
    np.testing.assert_array_equal(x.g, np.full((2, 3), 9.0))


def test_zero_grad_by_assignment_keeps_training(rng):
    """micrograd's idiom: `p.g = 0` between steps, then back() and a step that moves p."""
    w = var64(rng, 3, 2)
    x = var64(rng, 4, 3, requires_grad=False)
    optimizer = nn.GD([w], lr=0.1)
    losses = []
    for _ in range(20):
        w.g = 0
        loss = nn.L2Loss(x @ w, np.zeros((4, 2)))
        loss.back()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert type(w.g) is np.ndarray and w.g.shape == (3, 2) and w.g.dtype == np.float64


def test_what_a_user_assigns_to_g_is_taken_correctly_or_refused():
    p = nn.NetVar(np.ones((2, 3), np.float32))
    p.g = 1.5
    np.testing.assert_array_equal(p.g, np.full((2, 3), 1.5, np.float32))
    assert p.g.dtype == np.float32
    p.g = None
    assert p._g is None and not p.g.any()
    p.g = np.arange(6.0).reshape(2, 3)                      # float64 in: float32 kept
    assert p.g.dtype == np.float32 and p.g[1, 2] == 5.0
    p.g = [[1, 2, 3], [4, 5, 6]]
    assert p.g.dtype == np.float32 and p.g.sum() == 21
    p.g[...] = 0                                            # in place still works
    assert not p.g.any()
    mine = np.ones((2, 3), np.float32)
    p.g = mine
    (p * 2.0).sum().back()                                  # accumulates into a copy, not mine
    np.testing.assert_array_equal(mine, np.ones((2, 3)))
    np.testing.assert_array_equal(p.g, np.full((2, 3), 3.0))
    before = p.g.copy()
    for value, error, message in [
            (np.ones((1, 3)), ValueError, r"\.g of NetVar #\d+ of shape \(2, 3\): the gradient "
                                          r"must have the node's shape \(2, 3\), got \(1, 3\)"),
            (np.ones(6), ValueError, r"got \(6,\)"),
            ("zero", TypeError, r"\.g of NetVar #\d+ .*not str"),
            (True, TypeError, r"not bool"),
            (np.array(["a"]), TypeError, r"not <U1"),
            (np.ones((2, 3), complex), TypeError, r"not complex128")]:
        with pytest.raises(error, match=message):
            p.g = value
        np.testing.assert_array_equal(p.g, before)          # a refused assignment changes nothing


def test_article_style_g_plus_equals_edits_the_nodes_own_gradient(rng):
    x = var64(rng, 2, 2)
    (x * 3.0).sum().back()
    g = x.g
    x.g += 1.0
    assert x.g is g and x.g[0, 0] == 4.0


@pytest.mark.parametrize("seed_dtype", [np.float32, np.float64])
def test_gradient_has_the_dtype_of_its_node(seed_dtype, rng):
    w = nn.NetVar(rng.standard_normal((3, 2)).astype(np.float32))
    b = nn.NetVar(np.zeros((1, 2), np.float32))
    x = nn.NetVar(rng.standard_normal((4, 3)).astype(seed_dtype), requires_grad=False)
    h = x @ w + b                         # float64 data meets float32 parameters: float64 out
    assert h.dtype == np.result_type(seed_dtype, np.float32)
    loss = (h * h).sum() + (h * 2.0).sum() + h.sum()        # h read three times
    loss.back()
    for node in (w, b, h):
        assert node.g.dtype == node.dtype and node.g.shape == node.shape
    x64 = x.data.astype(np.float64)
    h64 = x64 @ w.data.astype(np.float64)
    np.testing.assert_allclose(w.g, x64.T @ (2 * h64 + 3), rtol=1e-5)
    s = nn.Sum(nn.constant(np.float32(2.0)) * nn.constant(np.ones((2, 2))))
    assert s.dtype == np.float64


def test_gradient_dtype_at_each_contribution():
    p = nn.constant(np.ones((2, 2), np.float32))
    p.requires_grad = True
    for step in range(3):                 # first, second (copied) and later (in place)
        p.accumulate(np.ones((2, 2), np.float64))
        assert p._g.dtype == np.float32, step
    p.reset()
    p.accumulate(np.ones((3, 2, 2), np.float64))       # broadcast and cast at the first
    assert p.g.dtype == np.float32 and p.g[0, 0] == 3.0


def test_an_op_without_a_backward_rule_refuses_to_backpropagate():
    class Double(nn.NetOp):
        def __init__(self, x):
            super().__init__(x.data * 2, x)

    x = nn.NetVar([1.0, 2.0])
    y = Double(x)
    with pytest.raises(NotImplementedError, match=r"back\(\): Double defines no _back"):
        nn.Sum(y).back()
    with nn.no_grad():                    # forward-only use stays fine
        assert Double(x).data[0, 1] == 4.0


def test_pytorch_spellings_name_nnkits():
    x = nn.NetVar([[1.0, 2.0]])
    for name, spelling in [("backward", r"back\(\)"), ("grad", r"\.g"),
                           ("zero_grad", r"reset\(\)"), ("cuda", r"to_gpu\(\)")]:
        with pytest.raises(AttributeError, match=rf"NetVar has no attribute '{name}': "
                                                 rf"nnkit spells it {spelling}"):
            getattr(x, name)
    with pytest.raises(AttributeError, match=r"nnkit spells it \.g"):
        x.grad = None
    assert not hasattr(x, "backward")
    with pytest.raises(AttributeError, match=r"'NetVar' object has no attribute 'nope'$"):
        x.nope
    loss = nn.Sum(x)
    assert float(loss) == 3.0 and int(loss) == 3 and isinstance(float(loss), float)
    assert x.tolist() == [[1.0, 2.0]]
    np.testing.assert_array_equal(np.asarray(x), [[1.0, 2.0]])
    assert np.asarray(x, dtype=np.float64).dtype == np.float64
    with pytest.raises(ValueError, match=r"float\(\): NetVar #\d+ of shape \(1, 2\) holds 2 "):
        float(x)
    with pytest.raises(TypeError, match=r"NetVar #\d+ of shape \(1, 2\) does not support item "
                                        r"assignment: .*nn.Where"):
        x[0, 1] = 5.0
    assert x.data[0, 1] == 2.0


@pytest.mark.parametrize("earlier", [0, 1, 2])      # first, second and later contributions
@pytest.mark.parametrize("wrong", [(1, 4), (), (4,), (3, 1), (2, 4), (2, 3, 5)])
def test_a_gradient_of_the_wrong_shape_is_refused_at_every_contribution(earlier, wrong):
    x = nn.constant(np.zeros((3, 4)))
    x.requires_grad = True
    for _ in range(earlier):
        x.accumulate(np.ones((3, 4)))
    before = x._g.copy() if x._g is not None else None
    with pytest.raises(ValueError, match=rf"accumulate\(\): a gradient of shape "
                                         rf"{re.escape(str(wrong))} cannot be summed back to "
                                         r"NetVar #\d+ of shape \(3, 4\)"):
        x.accumulate(np.ones(wrong))
    if before is not None:
        np.testing.assert_array_equal(x._g, before)


def test_a_gradient_missing_leading_unit_axes_is_taken():
    x = nn.constant(np.zeros((1, 1, 4)))
    x.requires_grad = True
    for _ in range(3):
        x.accumulate(np.arange(4.0))                  # (4,) for (1, 1, 4): the same elements
    np.testing.assert_array_equal(x.g, 3 * np.arange(4.0).reshape(1, 1, 4))
    x.accumulate(np.ones((5, 1, 4)))                  # broadcast along a new leading axis: summed
    np.testing.assert_array_equal(x.g[0, 0], 3 * np.arange(4.0) + 5)


def test_a_user_op_handing_a_wrong_shape_fails_at_back():
    class RowSum(nn.NetOp):                           # bug: hands x its own (1, n) gradient
        def __init__(self, x):
            super().__init__(x.data.sum(axis=0, keepdims=True), x)

        def _back(self, x):
            x.accumulate(self.g)

    x = nn.NetVar(np.ones((3, 4)))
    with pytest.raises(ValueError, match=r"shape \(1, 4\) cannot be summed back to NetVar"):
        RowSum(x).sum().back()
    y = x * 1.0
    with pytest.raises(ValueError, match=r"shape \(1, 4\) cannot be summed back to Mul"):
        (RowSum(y) + y).sum().back()                  # y's second contribution: in place


def test_a_string_is_never_parsed_as_a_number():
    for make in (lambda: nn.NetVar("2"), lambda: nn.constant("2.5"),
                 lambda: nn.NetVar([1.0]) * "2"):
        with pytest.raises(TypeError, match=r"cannot make a numeric array from str '2"):
            make()


def test_editing_an_op_nodes_g_after_back_leaves_its_inputs_gradients_alone():
    # Add hands its own gradient array to both inputs: an edit through c.g reached a.g and b.g
    a, b = nn.NetVar(np.ones((1, 2))), nn.NetVar(np.ones((1, 2)))
    c = a + b
    (c * 1.0 + c).sum().back()
    c.g[...] = 100
    np.testing.assert_array_equal(c.g, [[100.0, 100.0]])
    np.testing.assert_array_equal(a.g, [[2.0, 2.0]])
    np.testing.assert_array_equal(b.g, [[2.0, 2.0]])


def test_a_seed_array_edited_after_back_changes_no_gradient():
    x = nn.NetVar(np.ones((1, 2)))
    seed = np.array([[1.0, 2.0]])
    (x + 0.0).back(seed)
    seed[...] = 99
    np.testing.assert_array_equal(x.g, [[1.0, 2.0]])


def test_integer_data_given_to_a_float_node_is_taken_as_floats():
    # the int64 data made int64 gradients: 0.5 each, truncated to 0
    w = nn.NetVar(np.ones((2, 2)))
    w.data = np.array([[1, 2], [3, 4]])
    assert w.dtype == np.float64
    (w * 0.5).sum().back()
    np.testing.assert_array_equal(w.g, np.full((2, 2), 0.5))
    w.data = np.ones((2, 2), np.float32)           # another float dtype: .g follows it
    assert w.g.dtype == np.float32


def test_a_deep_copy_has_its_own_creation_index():
    # a copied model's parameters kept their originals' indices: drawings merged the two and
    # Trace.gradients() (keyed by index) read one for the other
    w = nn.NetVar(np.ones((1, 2)), name="w")
    v = copy.deepcopy(w)
    assert v.index != w.index and v.name == "w" and v.data is not w.data
    np.testing.assert_array_equal(v.data, w.data)
    loss = (w * 2.0 - v).sum()
    gradients = loss.back(trace=True).gradients()
    np.testing.assert_array_equal(gradients[w.index], [[2.0, 2.0]])
    np.testing.assert_array_equal(gradients[v.index], [[-1.0, -1.0]])
    y = copy.deepcopy(w * 3.0)                       # an op node: after its copied parent
    assert y.index > y.parents[0].index and y.parents[0] is not w


def test_copy_and_pickle_give_a_node_its_own_index_and_data():
    # copy.copy and pickle kept the creation index (traces and drawings merged the two nodes:
    # x's trace gradient read 8 for 3) and copy.copy shared the data array
    x = nn.NetVar(np.ones((1, 2)))
    x.g = np.full((1, 2), 7.0)
    twin, thawed = copy.copy(x), pickle.loads(pickle.dumps(x))
    assert len({x.index, twin.index, thawed.index}) == 3
    assert twin.data is not x.data and twin.g is not x.g
    np.testing.assert_array_equal(thawed.data, x.data)
    np.testing.assert_array_equal(twin.g, x.g)
    x.reset()
    y = (x * 3.0 + twin * 5.0).sum()
    trace = y.back(trace=True)
    np.testing.assert_array_equal(trace.gradients()[x.index], [[3.0, 3.0]])
    np.testing.assert_array_equal(x.g, [[3.0, 3.0]])
    twin.data += 10                          # never x's data
    np.testing.assert_array_equal(x.data, [[1.0, 1.0]])


def test_an_op_class_keeps_its_own_accumulate_and_its_subclasses_inherit_it():
    # each op class gets a copy of NetVar's accumulate methods (specialize.own_code), never over
    # one the class defines itself
    seen = []

    class Logged(nn.NetOp):
        def __init__(self, x):
            super().__init__(x.data * 2, x)

        def _back(self, x):
            x.accumulate(self.g * 2)

        def accumulate(self, g):
            seen.append(type(self).__name__)
            super().accumulate(g)

    class Child(Logged):
        pass

    x = nn.NetVar([[1.0, 2.0]])
    y = Child(Logged(x))
    y.back()
    assert seen == ["Child", "Logged"]       # the root seeded, then its input
    np.testing.assert_array_equal(x.g, [[4.0, 4.0]])
    assert nn.Tanh.accumulate is not nn.NetVar.accumulate
    assert nn.Tanh.accumulate.__code__ is not nn.Sigmoid.accumulate.__code__


def test_the_per_class_accumulate_copies_keep_keyword_defaults_and_pickle():
    import pickle

    class Base(nn.NetOp):
        def accumulate(self, g, *, scale=1.0):
            nn.NetVar.accumulate(self, g * scale)

    class Doubles(Base):
        def __init__(self, x):
            super().__init__(x.data * 2, x)

        def _back(self, x):
            x.accumulate(self.g * 2)

    x = nn.NetVar([[1.0, 2.0]])
    (Doubles(x) * 3.0).sum().back()        # Doubles.accumulate is a copy of Base's
    np.testing.assert_array_equal(x.g, [[6.0, 6.0]])
    assert pickle.loads(pickle.dumps(nn.Exp.accumulate)) is nn.Exp.accumulate


def test_an_op_classs_own_accumulate_is_used_by_every_consumer_but_create_graph():
    # one-input elementwise consumers call accumulate_same_shape, which skipped it
    class Halved(nn.NetOp):
        def __init__(self, x):
            super().__init__(x.data * 1.0, x)

        def _back(self, x):
            x.accumulate(self.g)

        def accumulate(self, g):
            nn.NetVar.accumulate(self, g * 0.5)

    for consumer in (lambda h: h + 0.0, nn.Tanh, nn.Exp, nn.Neg, nn.Sum):
        x = nn.NetVar([[0.0, 0.0]])
        consumer(Halved(x)).sum().back()
        plain = nn.NetVar([[0.0, 0.0]])
        consumer(plain * 1.0).sum().back()
        np.testing.assert_allclose(x.g, plain.g * 0.5)


def test_a_complex_gradient_reaching_a_real_node_is_refused():
    # gradients through complex operands are not conjugated: |x·1j| gave −sign(x)
    x = nn.NetVar([[1.0, -2.0]])
    with pytest.raises(TypeError, match="back\\(\\): a complex gradient reached NetVar .* real"):
        (x * 1j).abs().sum().back()


def test_an_unpickled_graph_counts_as_built_in_this_process():
    # another process's edit stamps compared with this one's: an edit made after loading went
    # unseen; stamps far ahead of this process's count stand in for that process
    import pickle
    w = nn.NetVar([[1.0, 2.0]])
    y = (w * w).sum()
    w._version = 10 ** 9
    for node in (y, y.parents[0]):
        node._pversion = 10 ** 9 + 1
    w2, y2 = pickle.loads(pickle.dumps((w, y)))
    w2.data = np.array([[10.0, 20.0]])
    with pytest.raises(nn.InplaceEditError):
        y2.back()
    w3, y3 = pickle.loads(pickle.dumps((w, y)))
    y3.back()
    np.testing.assert_array_equal(w3.g, [[2.0, 4.0]])


def test_a_long_chain_pickled_beside_its_middle_pickles_again_alone():
    # pickling lays a graph out oldest first, noting the nodes it hands pickle; the ones pickle
    # had met already (the middle's graph) must be forgotten, or pickling the middle alone later
    # recursed through its 2000 parents again
    import pickle
    middle = nn.NetVar([[1.0]])
    for _ in range(2000):
        middle = middle * 1.0001
    y = middle
    for _ in range(1000):
        y = y * 1.0001
    blob = pickle.dumps((middle, y))
    thawed_middle, thawed = pickle.loads(blob)
    assert thawed.parents[0].parents[0] is not middle
    node = thawed
    while node is not thawed_middle:      # the middle is the thawed chain's own node
        node = node.parents[0]
    assert pickle.loads(pickle.dumps(middle)).data.item() == middle.data.item()


@pytest.mark.parametrize("bias", [None, np.ones((1, 2))])
def test_a_user_op_given_a_parent_that_is_not_a_node_is_refused_naming_it(bias):
    # accepted when built (the parent loop stopped at the first that needs a gradient), it
    # failed in back() or grad() with an AttributeError naming neither the op nor the input
    class Affine(nn.NetOp):
        def __init__(self, x, w, b):
            super().__init__(x.data @ w.data, x, w, b)

        def _back(self, x, w, b):
            w.accumulate(x.data.T @ self.g)

    x, w = nn.NetVar([[1.0, 2.0]], requires_grad=False), nn.NetVar(np.eye(2))
    y = Affine(x, w, bias)
    message = rf"Affine: parent 2 given to super\(\).__init__ is {type(bias).__name__}, not a node"
    with pytest.raises(TypeError, match=message):
        y.back()
    with pytest.raises(TypeError, match=message):
        nn.grad(y, [w])
    with pytest.raises(TypeError, match=message), nn.detect_anomaly():
        Affine(x, w, bias)
    with pytest.raises(TypeError, match=message):
        Affine(nn.NetVar([[1.0, 2.0]], requires_grad=False),
               nn.NetVar(np.eye(2), requires_grad=False), bias)


def test_a_gradient_reaching_an_integer_node_is_refused():
    # requires_grad set by hand on integer data: the gradient was cast to int (0 for 0.5)
    a = nn.NetVar(np.array([[1, 2]]), dtype=int)
    a.requires_grad = True
    with pytest.raises(TypeError, match="back\\(\\): a gradient reached NetVar .* int64 data"):
        (a * 0.5).sum().back()


# ---------------------------------------------------------------- several outputs, observers

from nnkit.core import NetOp, Output  # noqa: E402


class SquareAndCube(NetOp):
    """y₀ = x², y₁ = x³ (output 1);  dx = g₀ · 2x + g₁ · 3x² (docs/contributing.md's example)"""
    n_outputs = 2

    def __new__(cls, x):
        op = super().__new__(cls)
        op.__init__(x)
        return op, Output(op, 1, x.data ** 3)

    def __init__(self, x):
        super().__init__(x.data ** 2, x)

    def _back(self, x):
        dx = self.g * 2 * x.data
        cube = self.output_grads().get(1)          # None when the cube was not used
        x.accumulate(dx if cube is None else dx + cube * 3 * x.data ** 2)


@pytest.mark.parametrize("used", ["both", "square", "cube"])
def test_an_op_with_two_outputs_gets_each_outputs_gradient(used, rng):
    x = var64(rng, 2, 3)
    square, cube = SquareAndCube(x)
    assert cube.parents == (square,) and square.parents == (x,)
    loss = {"both": lambda: (square * 2.0).sum() + cube.sum(),
            "square": lambda: (square * 2.0).sum(),
            "cube": lambda: cube.sum()}[used]
    loss().back()
    expected = {"both": 4 * x.data + 3 * x.data ** 2, "square": 4 * x.data,
                "cube": 3 * x.data ** 2}[used]
    np.testing.assert_allclose(x.g, expected, rtol=1e-13)
    np.testing.assert_allclose(nn.grad(loss(), [x])[0], expected, rtol=1e-13)
    nn.gradcheck(lambda v: (lambda s, c: s * c + c)(*SquareAndCube(v)), x)


def test_a_second_pass_sees_only_its_own_outputs_gradients(rng):
    # pass 1 uses the cube, pass 2 only the square: nothing of the cube's is left for pass 2
    x = var64(rng, 2, 3)
    square, cube = SquareAndCube(x)
    cube.sum().back()
    x.reset()
    square.sum().back()
    np.testing.assert_allclose(x.g, 2 * x.data, rtol=1e-13)


def test_the_observer_of_the_contributing_guide_sees_every_backward_step(rng):
    from nnkit import core

    class CountSteps:
        checks_values = False

        def __init__(self):
            self.counts = {}

        def forward(self, node, parents):
            pass

        def before(self, node):
            pass

        def after(self, node):
            name = type(node).__name__
            self.counts[name] = self.counts.get(name, 0) + 1

    counter = CountSteps()
    core.observers.append(counter)
    try:
        x = var64(rng, 2, 3)
        (nn.Tanh(x) * x).sum().back()
    finally:
        core.observers.remove(counter)
    assert counter.counts == {"Tanh": 1, "Mul": 1, "Sum": 1}


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shape, to", [((2048, 64), (1, 64)), ((2048, 64), (64,)),
                                       ((5, 3, 4), (4,)), ((5, 3, 4), (1, 1, 4)),
                                       ((5, 3, 4), (3, 1)), ((5, 3, 4), (5, 1, 4)),
                                       ((0, 4), (1, 4)), ((4, 1), (1, 1)), ((6, 4), (6, 4))])
def test_unbroadcast_sums_the_broadcast_axes_as_numpy_does(shape, to, dtype):
    # a bias's gradient (every axis but the last) is one vector-matrix product; other axes and
    # dtypes NumPy's sum; both within a few ulps of the sum in float64
    from nnkit.gradients import unbroadcast
    g = np.random.default_rng(1).standard_normal(shape).astype(dtype)
    for given in (g, np.asfortranarray(g)):
        found = unbroadcast(given, to)
        assert found.shape == to and found.dtype == g.dtype
        extra = len(shape) - len(to)
        axes = tuple(range(extra)) + tuple(extra + i for i, n in enumerate(to)
                                           if n == 1 and shape[extra + i] != 1)
        exact = given.astype(np.float64).sum(axis=axes).reshape(to)
        tol = {np.float16: 5e-3, np.float32: 2e-4, np.float64: 1e-12}[dtype]
        np.testing.assert_allclose(found.astype(np.float64), exact, rtol=tol, atol=tol)
