"""A ledger of the traps other autograd frameworks' users fell into, each tried on nnkit.

Every case comes from an issue or pull request of micrograd, tinygrad, Dezero, Chainer, HIPS
autograd, PyTorch or JAX (cited above it, with the trap in one line) and asserts either the right
value (closed forms or finite differences in float64) or a clear error naming the op or function,
the argument and the shapes. None accepts a silent wrong result. A case that nnkit cannot pass
without a change to the engine (``nnkit/core.py``) is marked ``xfail(strict=True)`` with the
change it needs, so that it turns into a failure (to be unmarked) the day the change lands.

Traps already covered elsewhere are not repeated: in-place edits of a parameter
(``test_inplace.py``), a 0-d node read three times and ``p.g = 0`` (``test_misuse.py``), a
100,000-op chain through ``back()`` (``tests/test_core.py``), the mean or max of an empty array
and out-of-range indices (``test_hostile_inputs.py``).
"""
import copy
import math
import pickle
import re

import numpy as np
import pytest

import nnkit as nn
from tests.reliability.helpers import leaf


def scalar(value):
    """A float64 parameter holding one number, shape (1, 1)."""
    return nn.NetVar(np.array([[float(value)]]))


# ============================================================================ graph structure

# Source: karpathy/micrograd#2 ("Incorrect gradient when non-leaf Values are re-used"); the graph
# is the one given in karpathy/micrograd#68.
# Trap: an intermediate node feeding several ops must pass on the sum of all its consumers' shares.
def test_an_intermediate_node_read_by_several_ops_gets_every_share():
    a, b = scalar(2.0), scalar(3.0)
    c, d = a + b, a * b
    y = (c + d) + c * d                   # y = c + d + c·d
    y.back()
    # dy/da = (1 + d)·1 + (1 + c)·b,  dy/db = (1 + d)·1 + (1 + c)·a
    assert a.g.item() == 7 + 6 * 3 and b.g.item() == 7 + 6 * 2


# Source: karpathy/micrograd#77 ("Is `y = x * x` an edge case?").
# Trap: one node given as both operands of an op must get both operands' gradients.
def test_a_node_used_as_both_operands_gets_both_shares():
    x = leaf([[-1.5, 0.5, 2.0]])
    (x * x).sum().back()
    np.testing.assert_array_equal(x.g, 2 * x.data)
    x.reset()
    (x * x * x).sum().back()
    np.testing.assert_allclose(x.g, 3 * x.data ** 2, rtol=1e-15)
    x.reset()
    (x / x + (x - x)).sum().back()        # constant in x: every share cancels
    np.testing.assert_array_equal(x.g, np.zeros((1, 3)))


# Source: sebgao/cTensor#5 (a leaf read along several paths got 7 instead of 6: a node shared by
# two consumers was backpropagated once per consumer).
# Trap: a node reached along many paths must run its backward rule once, with the summed gradient.
def test_a_leaf_read_along_three_paths_gets_the_exact_sum():
    x = scalar(1.0)
    a = nn.NetVar(np.array([[1.0]]), requires_grad=False)
    xa, x2 = x * a, x * x
    f = x * xa + x * xa + x2 * a          # f = 3x²a
    f.back()
    assert x.g.item() == 6.0


# Source: karpathy/micrograd#25 and karpathy/micrograd#102 (zero_grad() cleared only the leaves,
# so a second backward() on the same graph added the intermediates' stale gradients again).
# Trap: reusing a graph after resetting only the parameters must give the same gradient again.
def test_backpropagating_one_graph_again_after_resetting_the_leaves_repeats_the_gradient():
    rng = np.random.default_rng(0)
    w = leaf(rng.standard_normal((3, 2)))
    x = leaf(rng.standard_normal((4, 3)), requires_grad=False)

    def loss(w):
        h = nn.Tanh(x @ w)
        return (h * h).sum()

    graph = loss(w)
    graph.back()
    first = w.g.copy()
    w.reset()
    graph.back()
    np.testing.assert_array_equal(w.g, first)
    assert nn.gradcheck(loss, w)


# Source: karpathy/micrograd#53 ("Ensure backward() is idempotent": a second backward() on
# e = (a + b)·d gave a.grad 3 instead of 2 because the intermediate c kept its gradient) and
# tinygrad/tinygrad#5701 (a second backward "shouldn't silently return the wrong answer").
# Trap: calling back() twice must double each leaf's gradient exactly, not compound it.
def test_back_twice_doubles_the_leaves_exactly_and_recomputes_the_intermediates():
    a, b, d = scalar(3.0), scalar(2.0), scalar(1.0)
    c = a + b
    e = c * d
    e.back()
    e.back()
    assert (a.g.item(), b.g.item(), d.g.item()) == (2.0, 2.0, 10.0)
    assert c.g.item() == 1.0              # an op node's gradient is its last pass's, not a sum


# Source: bytetriper/RAE#67 and pytorch/torchtitan#3575 (gradients zeroed once per micro-batch
# instead of once per optimizer step, so only the last micro-batch was trained on);
# chainer/chainer#4695 (why backward always accumulates).
# Trap: back() on several micro-batches must add up until step(), which then starts afresh.
def test_micro_batches_accumulate_until_the_optimizer_step_clears_them():
    w = scalar(1.0)
    optimizer = nn.GD([w], lr=0.1, momentum=0.0)
    (w * 2.0).sum().back()
    (w * 3.0).sum().back()
    assert w.g.item() == 5.0
    optimizer.step()
    assert w.data.item() == pytest.approx(1.0 - 0.1 * 5.0, abs=1e-15)
    assert not w.g.any()                  # step() reset it: the next batch starts from zero
    (w * 4.0).sum().back()
    assert w.g.item() == 4.0


# Source: karpathy/micrograd#90 (backward() recursed and hit RecursionError beyond ~1000 ops).
# Trap: a chain built by rebinding in a Python loop must differentiate twice at the default
# recursion limit (back() on long chains is tested in tests/test_core.py; this is grad's
# create_graph path).
def test_a_20000_op_chain_built_in_a_loop_differentiates_twice():
    x = scalar(0.5)
    y = x * x
    for _ in range(20_000):
        y = y * 1.0001                    # y = x² · c^n, rebinding the name each time
    growth = 1.0001 ** 20_000
    slope, = nn.grad(y.sum(), [x], create_graph=True)
    curvature, = nn.grad(slope.sum(), [x])
    assert slope.item() == pytest.approx(2 * 0.5 * growth, rel=1e-9)
    assert curvature.item() == pytest.approx(2 * growth, rel=1e-9)


# Source: pytorch/pytorch#46669 ("Fix recursion depth issue on Graph deepcopy": copying a large
# graph recursed once per node) and karpathy/micrograd#90.
# Trap: copy.deepcopy or pickle of a node at the end of a long chain hits RecursionError.
def test_copying_or_pickling_the_end_of_a_long_chain():
    x = scalar(0.5)
    y = x
    for _ in range(3000):
        y = y * 1.0001
    twin = copy.deepcopy(y)
    twin_x = twin
    while twin_x.parents:
        twin_x = twin_x.parents[0]
    thawed_x, thawed = pickle.loads(pickle.dumps((x, y)))     # x stays thawed's leaf
    for node, leaf in ((twin, twin_x), (thawed, thawed_x)):
        assert node.data.item() == y.data.item() and node.index > node.parents[0].index
        node.back()
        assert leaf is not x and leaf.g.item() == pytest.approx(1.0001 ** 3000, rel=1e-12)
    assert not x.g.any()


# Source: pytorch/pytorch#9634 ('Model only has gradients when "x = x + bias" and not when
# "x += bias"').
# Trap: `h += b` on a node must train b (and never edit the array h held).
def test_plus_equals_on_a_node_builds_a_new_node_and_trains_the_bias():
    b = leaf(np.zeros((1, 2)))
    h = leaf(np.ones((3, 2)), requires_grad=False)
    before = h
    h += b
    h.sum().back()
    assert h is not before
    np.testing.assert_array_equal(b.g, [[3.0, 3.0]])
    np.testing.assert_array_equal(before.data, np.ones((3, 2)))


# Source: karpathy/micrograd#76 (`__radd__` written as `other + self` recursed forever) and
# KhawajaAbaid/micrograd_c#1 (the subtrahend's gradient had the wrong sign).
# Trap: Python's sum() starts from 0 (0 + node) and `c − x`, `c / x` reverse the operands: each
# must give the reflected op's gradient.
def test_builtin_sum_and_reflected_operators_give_the_right_gradient():
    x = leaf([[2.0, -0.5]])
    y = sum([x, 2.0 * x, 3.0 - x, 2.0 / x, x - 1.0])   # = 3x + 2/x + 2
    np.testing.assert_allclose(y.data, 3 * x.data + 2 / x.data + 2, rtol=1e-15)
    y.sum().back()
    np.testing.assert_allclose(x.g, 3 - 2 / x.data ** 2, rtol=1e-15)


# Source: oreilly-japan/deep-learning-from-scratch-3#16 (DeZero's second-derivative idiom
# gx = x.grad; x.cleargrad(); gx.backward() adds onto x.grad unless it is cleared first) and
# chainer/chainer#3015 (chainer.grad returns gradients instead of accumulating into .grad).
# Trap: taking a first derivative to differentiate it again must leave x.g alone, so that
# backpropagating the derivative gives x.g = the second derivative, nothing added to it.
def test_a_derivative_taken_to_differentiate_again_leaves_the_leaf_gradient_alone():
    x = leaf([[0.5, 2.0]])
    slope, = nn.grad((x ** 3).sum(), [x], create_graph=True)      # 3x²
    np.testing.assert_allclose(slope.data, 3 * x.data ** 2, rtol=1e-15)
    assert not x.g.any()
    slope.sum().back()
    np.testing.assert_allclose(x.g, 6 * x.data, rtol=1e-15)


# Source: tinygrad/tinygrad#799 ("Broadcasting discrepancies": (4, 3) @ (1, 3, 3, 3) gave (4, 9)
# where NumPy and PyTorch give (1, 3, 4, 3)).
# Trap: a matrix product must broadcast its batch axes as NumPy does, and sum each operand's
# gradient back to its own shape.
def test_a_batched_matrix_product_broadcasts_as_numpy_does():
    rng = np.random.default_rng(3)
    a, b = leaf(rng.standard_normal((4, 3))), leaf(rng.standard_normal((1, 3, 3, 3)))
    assert (a @ b).shape == np.matmul(a.data, b.data).shape == (1, 3, 4, 3)
    np.testing.assert_allclose((a @ b).data, np.matmul(a.data, b.data), rtol=1e-15)
    assert nn.gradcheck(lambda a, b: a @ b, a, b)


# Source: karpathy/micrograd#17 (`__pow__` takes only an int/float exponent) and
# karpathy/micrograd#36 (adding `__rpow__` so that a number raised to a Value works).
# Trap: `2.0 ** x` fails with Python's "unsupported operand type(s)", naming no way out; it must
# name nnkit's spelling, which then gives the right value and gradient.
def test_a_number_raised_to_a_node_names_the_way_to_write_it():
    x = leaf([[0.5, 3.0]])
    with pytest.raises(TypeError, match=r"2\.0 \*\* x: .*NetVar #\d+ of shape \(1, 2\).*"
                                        r"\(x \* math\.log\(2\.0\)\)\.exp\(\)"):
        2.0 ** x
    y = (x * math.log(2.0)).exp()
    y.sum().back()
    np.testing.assert_allclose(y.data, 2.0 ** x.data, rtol=1e-15)
    np.testing.assert_allclose(x.g, 2.0 ** x.data * math.log(2.0), rtol=1e-15)


# ============================================================================ NumPy on nodes

# Source: HIPS/autograd#85 and HIPS/autograd#373 (np.sum on a traced value failed with
# "unexpected keyword argument 'dtype'" / "'out'", an error that named neither cause nor cure).
# Trap: a NumPy reduction given a trained node must name nnkit's spelling, not fail inside the
# node's method; given a constant it must give the value.
@pytest.mark.parametrize("function, spelling", [
    (np.sum, r"x\.sum\(axis\)"), (np.mean, r"x\.mean\(axis\)"), (np.max, r"x\.max\(axis\)")])
def test_a_numpy_reduction_of_a_node_names_nnkits_method(function, spelling):
    x = leaf([[0.5, -1.0, 2.0]])
    with pytest.raises(TypeError, match=rf"numpy\.{function.__name__}\(\): NetVar #\d+ of shape "
                                        rf"\(1, 3\) is a node.*{spelling}"):
        function(x)
    assert function(leaf(x.data, requires_grad=False)) == function(x.data)


# Source: HIPS/autograd#8 (`w.T.dot(x)` on a traced x returned a plain array, so the gradient
# came back as zeros without an error).
# Trap: a NumPy function that would compute on a trained node's values must not hand back an
# array that silently drops the gradient; np.asarray(x) (the values, on purpose), np.shape and
# comparisons still work, and constants (nothing to lose) still compute on their values.
@pytest.mark.parametrize("call, spelling", [
    (lambda x: np.dot(np.ones((2, 1)), x), r"a @ b"),
    (lambda x: np.concatenate([x, x]), r"nn\.Concat"),
    (lambda x: np.where(np.array([[True, False, True]]), x, 0.0), r"nn\.Where"),
    (lambda x: np.clip(x, 0.0, 1.0), r"x\.clip\(lo, hi\)"),
    (lambda x: np.reshape(x, (3, 1)), r"x\.reshape"),
    (lambda x: np.linalg.norm(x), r"x\.norm\(axis\)"),
], ids=["dot", "concatenate", "where", "clip", "reshape", "linalg.norm"])
def test_a_numpy_function_that_would_drop_the_gradient_is_refused(call, spelling):
    x = leaf([[0.5, -1.0, 2.0]])
    with pytest.raises(TypeError, match=rf"numpy\.\w+(\.\w+)?\(\): NetVar #\d+ of shape \(1, 3\) "
                                        rf"is a node.*{spelling}"):
        call(x)
    np.testing.assert_array_equal(np.asarray(x), [[0.5, -1.0, 2.0]])
    assert np.shape(x) == (1, 3) and np.ndim(x) == 2 and np.size(x) == 3
    assert np.allclose(x, [[0.5, -1.0, 2.0]]) and np.argmax(x) == 2
    constant = leaf(x.data, requires_grad=False)
    np.testing.assert_array_equal(call(constant), call(x.data))


# Source: HIPS/autograd#436 and HIPS/autograd#416 (np.exp on a traced value: "'ArrayBox' object
# has no attribute 'exp'", which users could not act on).
# Trap: a NumPy ufunc given a node raises NumPy's "operand 'NetVar' does not support ufuncs",
# naming neither the function, the node's shape nor nnkit's op.
def test_a_numpy_ufunc_of_a_node_names_the_function_and_nnkits_op():
    x = leaf([[0.5, -1.0, 2.0]])
    with pytest.raises(TypeError, match=r"numpy\.exp\(\): NetVar #\d+ of shape \(1, 3\).*"
                                        r"x\.exp\(\)"):
        np.exp(x)
    for call, spelling in ((np.tanh, r"numpy\.tanh\(\): .*x\.tanh\(\)"),
                           (lambda v: np.maximum(v, 0.0), r"numpy\.maximum\(\): .*nn\.Maximum"),
                           (np.add.reduce, r"numpy\.add\.reduce\(\): .*x\.sum\(axis\)"),
                           (lambda v: np.add(v, 1.0, dtype=np.float32), r"numpy\.add\(\): ")):
        with pytest.raises(TypeError, match=spelling + r".*np\.asarray\(x\) gives the values"):
            call(x)
    a = np.array([[2.0, 4.0, 8.0]])
    with pytest.raises(TypeError, match=r"numpy\.add\(\): NetVar #\d+ .*a = a \+ x"):
        a += x                            # would write x's values into a, dropping the gradient
    # the operators' ufuncs are the node's operators: an array on the left gives a node
    for node, values in ((a + x, a + x.data), (a - x, a - x.data), (a * x, a * x.data),
                         (a / x, a / x.data), (np.ones((2, 1)) @ x, np.ones((2, 1)) @ x.data),
                         (np.float64(3.0) * x, 3.0 * x.data), (np.negative(x), -x.data),
                         (np.abs(x), abs(x.data))):
        assert isinstance(node, nn.NetVar) and node.requires_grad
        np.testing.assert_array_equal(node.data, values)
    assert type(a < x) is nn.NetVar and not (a < x).requires_grad
    np.testing.assert_array_equal((a < x).data, a < x.data)
    (a * x).sum().back()
    np.testing.assert_array_equal(x.g, a)
    # constants (nothing to lose) compute on their values, as NumPy's functions do
    constant = leaf(x.data, requires_grad=False)
    np.testing.assert_array_equal(np.exp(constant), np.exp(x.data))
    assert np.isnan(x).tolist() == [[False, False, False]]


# ============================================================================ losses

# Source: pytorch/pytorch#16045, via pytorch/pytorch#18349 ("Added tensor size warning to
# F.mse_loss()": (n, 1) against (n,) broadcast to (n, n) and gave a wrong loss).
# Trap: every loss must refuse a (B, 1) prediction beside a (B,) target, and the reverse
# (tests/reliability/test_misuse.py checks L2Loss one way; this is every loss, both ways).
@pytest.mark.parametrize("loss", [nn.L1Loss, nn.L2Loss, nn.HuberLoss, nn.MSELoss,
                                  nn.SigmoidCELoss, nn.CELoss, nn.KLDivLoss])
def test_every_loss_refuses_a_column_beside_a_flat_target(loss):
    value = -0.5 if loss is nn.KLDivLoss else 0.5      # KLDivLoss takes log-probabilities
    for p_shape, t_shape in (((4, 1), (4,)), ((4,), (4, 1))):
        p, t = leaf(np.full(p_shape, value)), leaf(np.full(t_shape, 0.5), requires_grad=False)
        with pytest.raises(ValueError, match=rf"{loss.__name__}: prediction of shape "
                                             rf"{re.escape(str(p_shape))} and target of shape "
                                             rf"{re.escape(str(t_shape))} differ"):
            loss(p, t)


# Source: pytorch/pytorch#11752 ("nn.CrossEntropyLoss() yields wrong output for big logits":
# logits 1e8 gave loss 0 instead of ln 2).
# Trap: cross-entropy on huge logits must be exact in float32.
def test_cross_entropy_of_huge_logits_is_exact_in_float32():
    z = nn.NetVar(np.full((1, 2), 1e8, np.float32))
    loss = nn.SoftmaxCELoss(z, np.array([1]))
    loss.back()
    assert loss.item() == pytest.approx(np.log(2.0), rel=1e-6)
    np.testing.assert_allclose(z.g, [[0.5, -0.5]], rtol=1e-6)
    z = nn.NetVar(np.array([[1e8, 0.0]], np.float32))
    loss = nn.SoftmaxCELoss(z, np.array([1]))
    loss.back()
    assert loss.item() == 1e8
    np.testing.assert_array_equal(z.g, [[1.0, -1.0]])


# Source: FluxML/NNlib.jl#68 ("Softmax and crossentropy are prone to produce NaNs") and
# Theano/Theano#3162 (softmax then cross-entropy: NaN gradients for unbounded activations).
# Trap: a confidently wrong prediction must give the full loss and the gradient softmax − onehot.
def test_softmax_cross_entropy_of_a_confidently_wrong_prediction():
    z = leaf([[-431.0, 279.0, 427.0]])
    loss = nn.SoftmaxCELoss(z, np.array([0]))
    loss.back()
    assert loss.item() == pytest.approx(427.0 + np.log1p(np.exp(-148.0)) + 431.0, rel=1e-15)
    np.testing.assert_allclose(z.g, [[-1.0, np.exp(-148.0), 1.0]], rtol=1e-12, atol=1e-300)
    assert np.isfinite(z.g).all()


# Source: Oneflow-Inc/oneflow#3137 (log-softmax computed as SafeLog(softmax): a gap of 60
# clipped at −46.05 where the exact x − logsumexp gives −60).
# Trap: log-softmax of far-apart logits must be x − logsumexp(x), with no floor.
def test_log_softmax_of_far_apart_logits_has_no_floor():
    z = nn.NetVar(np.array([[-30.0, 30.0]], np.float32))
    np.testing.assert_array_equal(nn.LogSoftmax(z).data, [[-60.0, 0.0]])
    assert nn.SoftmaxCELoss(z, np.array([0])).item() == 60.0


# Source: borgwang/tinynn#7 ("Stable SigmoidCrossEntropyLoss": log(1 + exp(logits)) overflowed).
# Trap: binary cross-entropy and softplus on logits of ±1000 must be finite and exact.
def test_sigmoid_cross_entropy_and_softplus_of_huge_logits_are_exact():
    z = leaf([[-1000.0, 1000.0]])
    loss = nn.SigmoidCELoss(z, leaf([[1.0, 0.0]], requires_grad=False))
    loss.back()
    assert loss.item() == 1000.0                  # (1000 + 1000) / 2 elements
    np.testing.assert_array_equal(z.g, [[-0.5, 0.5]])
    z.reset()
    y = nn.Softplus(z)
    y.sum().back()
    np.testing.assert_array_equal(y.data, [[0.0, 1000.0]])
    np.testing.assert_array_equal(z.g, [[0.0, 1.0]])


# Source: pytorch/pytorch#116349 and pytorch/pytorch#70348 (cross-entropy when every target is
# ignore_index: the mean over no position is NaN, by design).
# Trap: PyTorch's default padding label −100 must be refused unless ignore_index says so, and a
# batch where every position is ignored must give NaN as the loss but no NaN in the gradient.
def test_ignore_index_minus_100_is_explicit_and_an_all_ignored_batch_poisons_no_weight():
    z = leaf(np.arange(12.0).reshape(4, 3) / 10)
    with pytest.raises(ValueError, match=r"SoftmaxCELoss: class index -100 is out of range for 3 "
                                         r"classes"):
        nn.SoftmaxCELoss(z, np.array([-100, 1, -100, 2]))
    some = nn.SoftmaxCELoss(z, np.array([-100, 1, -100, 2]), ignore_index=-100)
    kept = nn.SoftmaxCELoss(nn.NetVar(z.data[[1, 3]]), np.array([1, 2]))
    assert some.item() == pytest.approx(kept.item(), rel=1e-15)
    none = nn.SoftmaxCELoss(z, np.array([-100] * 4), ignore_index=-100)
    none.back()
    assert np.isnan(none.item())
    np.testing.assert_array_equal(z.g, np.zeros((4, 3)))


# Source: pytorch/pytorch#3670 ("multi-target not supported" for (N, 1) class indices) and
# pytorch/pytorch#56542 (the target shapes CrossEntropyLoss and BCEWithLogits expect differ).
# Trap: class indices given as a (B, 1) column must mean the same B positions as (B,).
def test_class_indices_as_a_column_mean_the_same_positions():
    z = leaf(np.arange(12.0).reshape(4, 3) / 10)
    flat = nn.SoftmaxCELoss(z, np.array([0, 1, 2, 0]))
    column = nn.SoftmaxCELoss(z, np.array([[0], [1], [2], [0]]))
    logp = z.data - np.log(np.exp(z.data).sum(axis=1, keepdims=True))
    expected = -logp[np.arange(4), [0, 1, 2, 0]].mean()
    assert flat.item() == pytest.approx(expected, rel=1e-15)
    assert column.item() == flat.item()


# ============================================================================ non-smooth points

# Source: pytorch/pytorch#2421 ("Gradient of zero norm is nan") and HIPS/autograd#151.
# Trap: the L2 norm at the zero vector must give the zero subgradient, not 0·∞ = NaN.
def test_the_norm_of_a_zero_vector_has_a_zero_gradient():
    x = leaf([[0.0, 0.0], [3.0, 4.0]])
    x.norm(axis=1).sum().back()
    np.testing.assert_array_equal(x.g, [[0.0, 0.0], [0.6, 0.8]])
    x.reset()
    x.norm().back()
    assert np.isfinite(x.g).all()


# Source: jax-ml/jax#347 and jax-ml/jax#5798 (gradients through np.where are NaN when the branch
# not taken is NaN: 0 · ∞ in the chain rule; the "double where" trick is the cure) and
# tinygrad/tinygrad#15806 (the same NaN through where's inactive sqrt branch).
# Trap: the NaN must be caught naming the op, and the double where must give the exact gradient.
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_nan_in_the_branch_where_does_not_take():
    x = leaf([[-1.0, 4.0]])
    with nn.detect_anomaly():
        with pytest.raises(nn.AnomalyError, match=r"forward of Sqrt #\d+ \(inputs of shapes "
                                                  r"\(1, 2\)\) produced NaN"):
            nn.Where(x > 0, x.sqrt(), 0.0)
    positive = x > 0
    safe = nn.Where(positive, x, 1.0)                     # the double where
    nn.Where(positive, safe.sqrt(), 0.0).sum().back()
    np.testing.assert_array_equal(x.g, [[0.0, 0.25]])


# Source: pytorch/pytorch#43519 ("Evenly distribute output grad into all matching inputs for
# min/max/median") and pytorch/pytorch#56734 (element-wise max of two tensors in case of equality).
# Trap: tied extremes must share the gradient, summing to the upstream gradient, not each take it.
def test_tied_extremes_split_the_gradient_evenly():
    for reduce, values in ((lambda x: x.max(), [1.0, 1.0, 0.0]),
                           (lambda x: x.max(axis=1).sum(), [1.0, 1.0, 0.0]),
                           (lambda x: x.min(), [-1.0, -1.0, 0.0])):
        x = leaf([values])
        reduce(x).back()
        np.testing.assert_array_equal(x.g, [[0.5, 0.5, 0.0]])
    a, b = leaf([[2.0, 1.0]]), leaf([[2.0, 3.0]])
    nn.Maximum(a, b).sum().back()
    np.testing.assert_array_equal(a.g + b.g, [[1.0, 1.0]])
    np.testing.assert_array_equal(a.g, [[0.5, 0.0]])


# Source: pytorch/pytorch#184572 (max(x, 0) spelled as relu, maximum, clamp_min and clamp gets
# the gradients 0, 0.5, 1 and 1 at x = 0).
# Trap: each op's subgradient at its kink must be the one its docstring states, equal to PyTorch's
# op of the same name: relu 0, maximum 0.5, clamp 1 inside the closed interval, hardtanh 0 at its
# bounds, abs 0, leaky relu its slope.
def test_subgradients_at_the_kinks_are_the_documented_ones():
    def gradient(op, values):
        x = leaf([values])
        op(x).sum().back()
        return x.g[0].tolist()

    assert gradient(nn.ReLU, [0.0]) == [0.0]
    assert gradient(lambda x: nn.Maximum(x, 0.0), [0.0]) == [0.5]
    assert gradient(lambda x: x.clip(0.0, 1.0), [0.0, 1.0, -0.5]) == [1.0, 1.0, 0.0]
    assert gradient(nn.HardTanh, [-1.0, 1.0, 0.0]) == [0.0, 0.0, 1.0]
    assert gradient(abs, [0.0]) == [0.0]
    assert gradient(nn.LReLU, [0.0]) == [0.01]


# Source: Theano/Theano#3210 ("relu second derivative not defined at zero": NaN at 0).
# Trap: second derivatives through ReLU (at 0 too) and through argmax must be finite and exact.
def test_second_derivatives_through_relu_and_argmax():
    x = leaf([[-1.0, 0.0, 2.0]])
    slope, = nn.grad((nn.ReLU(x) * x).sum(), [x], create_graph=True)   # 2x·[x > 0]
    curvature, = nn.grad(slope.sum(), [x])                              # 2·[x > 0]
    np.testing.assert_array_equal(slope.data, [[0.0, 0.0, 4.0]])
    np.testing.assert_array_equal(curvature, [[0.0, 0.0, 2.0]])
    winner = x.argmax(axis=1)                   # piecewise constant: no gradient of its own
    (winner * x).sum().back()
    np.testing.assert_array_equal(x.g, [[2.0, 2.0, 2.0]])


# Source: pytorch/pytorch#32304 ("Second derivative fails if first derivative happens to be
# constant": "element 0 of tensors does not require grad").
# Trap: differentiating a constant first derivative (of a linear function) must say why it cannot.
def test_the_second_derivative_of_a_linear_function_says_why_it_is_refused():
    x = leaf([[1.0, 2.0]])
    slope, = nn.grad((x * 2.0).sum(), [x], create_graph=True)
    np.testing.assert_array_equal(slope.data, [[2.0, 2.0]])
    with pytest.raises(RuntimeError, match=r"grad\(\): output 0, Sum #\d+ of shape \(\), does "
                                           r"not require a gradient .*create_graph=True.* "
                                           r"constant"):
        nn.grad(slope.sum(), [x])


# ============================================================================ dtypes

# Source: pytorch/pytorch#53466, pytorch/pytorch#7034 and tinygrad/tinygrad#9723 ("raise error
# when setting requires_grad=True on non-float tensors ... the result would be silently wrong").
# Trap: an integer leaf explicitly asked for a gradient is silently made a constant.
# The default (requires_grad not given) makes integer data with dtype=int a constant, as labels are.
def test_an_integer_leaf_asked_for_a_gradient_is_refused():
    for data, dtype in ((np.array([1, 2]), int), ([True, False], bool)):
        with pytest.raises(TypeError, match=rf"NetVar: .*{np.dtype(dtype)}.* requires_grad.*"
                                            r"float dtype"):
            nn.NetVar(data, dtype=dtype, requires_grad=True)
        assert not nn.NetVar(data, dtype=dtype).requires_grad
        assert not nn.NetVar(data, dtype=dtype, requires_grad=False).requires_grad
    assert nn.NetVar(np.array([1, 2]), requires_grad=True).dtype == nn.dtype
    with pytest.raises(TypeError, match=r"NetVar: requires_grad must be True or False, got 'y'"):
        nn.NetVar([1.0], requires_grad="y")


# Source: tinygrad/tinygrad#9723 (integer data given where floats were meant) and
# pytorch/pytorch#110854 (torch.square of a uint8 tensor wrapped 87² to 145).
# Trap: integer data without dtype= must become floats (so uint8 pixels never wrap) that train.
def test_integer_data_becomes_a_float_node_that_never_wraps():
    x = nn.NetVar(np.array([[200, 87]], np.uint8))
    assert x.dtype == nn.dtype and x.requires_grad
    np.testing.assert_array_equal((x * x).data, [[40000.0, 7569.0]])
    (x * x).sum().back()
    np.testing.assert_array_equal(x.g, [[400.0, 174.0]])


# Source: pytorch/pytorch#37680 ("We should not mark non-floating point Tensors as requiring
# gradients, ever": argmax's output required a gradient and `bad + 2` carried it on).
# Trap: argmax and comparisons must give constants; backpropagating from them must be refused.
def test_argmax_and_comparisons_give_constants_that_refuse_back():
    x = leaf([[0.5, 2.0, -1.0]])
    winner = x.argmax(axis=1)
    assert winner.dtype.kind == "i" and not winner.requires_grad
    assert not (winner + 2).requires_grad and not (x > 0).requires_grad
    with pytest.raises(RuntimeError, match=r"back\(\): Sum #\d+ of shape \(\) does not require a "
                                           r"gradient"):
        (winner + 2).sum().back()


# Source: pytorch/pytorch#2138 ("expected Double tensor (got Float tensor)" at backward when
# float32 and float64 met).
# Trap: mixing float32 and float64 leaves must give each leaf its gradient in its own dtype,
# equal to the all-float64 computation.
def test_float32_and_float64_leaves_each_get_their_gradient_in_their_dtype():
    rng = np.random.default_rng(1)
    x32 = nn.NetVar(rng.standard_normal((2, 3)).astype(np.float32))
    w = leaf(rng.standard_normal((3, 2)))
    (x32 @ w).tanh().sum().back()
    x64, w64 = leaf(x32.data.astype(np.float64)), leaf(w.data)
    (x64 @ w64).tanh().sum().back()
    assert x32.g.dtype == np.float32 and w.g.dtype == np.float64
    np.testing.assert_allclose(x32.g, x64.g, rtol=1e-6)
    np.testing.assert_array_equal(w.g, w64.g)


# Source: pytorch/pytorch#50010 and pytorch/pytorch#2436 (torch.var's default is unbiased, NumPy's
# is not: 8.5 against 7.4375 for the same data) and pandas-dev/pandas#10242 (a variance lost to
# cancellation).
# Trap: var() must be NumPy's (ddof=0) unless ddof=1 is asked, and exact when the mean is large.
def test_variance_is_numpys_by_default_and_survives_a_large_mean_in_float32():
    x = leaf([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 10.0]])
    assert x.var().item() == 7.4375 and x.var(ddof=1).item() == 8.5
    x.var().back()
    np.testing.assert_allclose(x.g, 2 * (x.data - x.data.mean()) / 8, rtol=1e-15)
    shifted = nn.NetVar((1e4 + np.arange(4.0)).astype(np.float32).reshape(1, 4))
    assert shifted.var().item() == 1.25
    np.testing.assert_allclose(nn.LayerNorm(shifted).data,
                               [(np.arange(4.0) - 1.5) / np.sqrt(1.25 + 1e-5)], rtol=1e-5)


# ============================================================================ modes and layers

# Source: pytorch/pytorch#11999 ("Dropout still active in .eval() mode": the functional form
# ignored the module's mode) and karpathy/nanoGPT#240 (dropout applied at evaluation).
# Trap: the Dropout op itself, not only the layer, must be the identity in evaluation, and in
# training its gradient must be the same mask, scaled by 1/(1 − p), as its output.
def test_dropout_is_the_identity_in_evaluation_and_consistent_in_training():
    x = leaf(np.full((200, 10), 2.0))
    with nn.eval_mode():
        y = nn.Dropout(x, 0.25)
        np.testing.assert_array_equal(nn.layers.Dropout(0.25)(x).data, x.data)
    y.sum().back()
    np.testing.assert_array_equal(y.data, x.data)
    np.testing.assert_array_equal(x.g, np.ones((200, 10)))
    x.reset()
    nn.seed(0)
    y = nn.Dropout(x, 0.25)
    y.sum().back()
    assert set(np.unique(y.data)) == {0.0, 2.0 / 0.75}
    np.testing.assert_array_equal(x.g, y.data / 2.0)


# Source: pytorch/pytorch#4534 and pytorch/pytorch#13223 (BatchNorm on a batch of one: "Expected
# more than 1 value per channel when training").
# Trap: in evaluation a batch of one must be normalised with the running statistics, exactly
# (training refuses it: tests/reliability/test_hostile_inputs.py).
def test_batchnorm_normalises_a_single_sample_with_the_running_statistics_in_evaluation():
    stats = nn.BatchNormState(3)
    gamma, beta = leaf([[1.0, 2.0, 0.5]]), leaf([[0.0, 1.0, -1.0]])
    batch = leaf(np.random.default_rng(2).standard_normal((8, 3)), requires_grad=False)
    for _ in range(3):
        nn.BatchNorm(batch, gamma, beta, stats)
    sample = leaf([[0.3, -0.2, 1.5]])
    with nn.eval_mode():
        y = nn.BatchNorm(sample, gamma, beta, stats)
    scale = 1 / np.sqrt(stats.running_var.astype(np.float64) + stats.eps)
    expected = (sample.data - stats.running_mean) * scale * gamma.data + beta.data
    np.testing.assert_allclose(y.data, expected, rtol=1e-6)
    y.sum().back()
    np.testing.assert_allclose(sample.g, gamma.data * scale, rtol=1e-6)


# Source: pytorch/pytorch#26302 ("Gradient for embedding vector at padding_idx is not zero").
# Trap: the padding row must get no gradient however often it is read (a negative padding_idx
# counts from the end, as in PyTorch), repeated tokens must add up, and a padding_idx outside the
# table must be refused naming it.
def test_the_embedding_padding_row_gets_no_gradient():
    for padding_idx, padded in ((1, 1), (-1, 3)):
        table = leaf(np.arange(12.0).reshape(4, 3))
        ids = np.array([0, padded, 2, padded, 2, 2])
        nn.Embedding(ids, table, padding_idx=padding_idx).sum().back()
        expected = np.zeros((4, 3))
        expected[0], expected[2] = 1.0, 3.0
        np.testing.assert_array_equal(table.g, expected)
    with pytest.raises(ValueError, match=r"Embedding: padding_idx 9 is out of range \[-4, 4\) for "
                                         r"a table of 4 rows"):
        nn.Embedding(np.array([0, 1]), leaf(np.ones((4, 3))), padding_idx=9)


# Source: pytorch/pytorch#70348 (the mean over no element: "If you pass an empty tensor to this
# function it'll return NaNs, since this operation does not have an identity").
# Trap: a sum over nothing must be 0 with a gradient of the input's (empty) shape; a loss over
# no row must be refused naming the op and the shape, not averaged into NaN.
def test_a_sum_over_nothing_is_zero_and_a_loss_over_no_row_is_refused():
    x = leaf(np.zeros((0, 3)))
    total = x.sum()
    total.back()
    assert total.item() == 0.0 and x.g.shape == (0, 3)
    columns = x.sum(axis=0)
    np.testing.assert_array_equal(columns.data, np.zeros(3))
    for loss, message in ((lambda: nn.SoftmaxCELoss(x, np.zeros(0, int)), r"SoftmaxCELoss: "
                           r"logits of shape \(0, 3\) have no rows"),
                          (lambda: nn.MSELoss(x, np.zeros((0, 3))), r"MSELoss: prediction of "
                           r"shape \(0, 3\) has no values")):
        with pytest.raises(ValueError, match=message):
            loss()


# Source: jax-ml/jax#9033 (the straight-through estimator x + stop_gradient(f(x) − x) is not f(x)
# in floating point; written zero + stop_gradient(f(x)) it is).
# Trap: detach() must stop exactly one path, and a straight-through round must equal round(x)
# bit for bit with gradient 1.
def test_detach_stops_one_path_and_a_straight_through_round_is_exact():
    x = leaf([[0.3, 1.7, 2.5, -0.49999999999999994]])
    (x * x.detach()).sum().back()
    np.testing.assert_array_equal(x.g, x.data)          # d(x·c)/dx = c = x
    x.reset()
    zero = x - x.detach()                               # value 0, gradient 1
    rounded = zero + np.round(x.data)
    np.testing.assert_array_equal(rounded.data, np.round(x.data))
    rounded.sum().back()
    np.testing.assert_array_equal(x.g, np.ones((1, 4)))
    assert not x.detach().requires_grad


# Source: pytorch/pytorch#6597 (review: "if the Tensor is needed in backward, but the NumPy array
# that shares storage is modified, we can't track it").
# Trap: NetVar(array) shares the array's memory; refilling that array (a reused batch buffer)
# between forward and back must be caught under detect_anomaly(), and a copy must be immune.
def test_refilling_the_numpy_array_an_input_was_built_from_is_caught_in_anomaly_mode():
    buffer = np.array([[1.0, 2.0]])
    w = leaf([[3.0, 4.0]])
    with nn.detect_anomaly():
        inputs = nn.NetVar(buffer, requires_grad=False)
        loss = (inputs * w).sum()
        buffer[0, 0] = 100.0                            # the next batch, written in place
        with pytest.raises(nn.InplaceEditError, match=r"input 0 of Mul #\d+ of shape \(1, 2\) "
                                                      r".*edited in place"):
            loss.back()
    copied = nn.NetVar(buffer.copy(), requires_grad=False)
    loss = (copied * w).sum()
    buffer[0, 0] = -7.0
    loss.back()
    np.testing.assert_array_equal(w.g, [[100.0, 2.0]])


# Source: pytorch/pytorch#39321 (MultiheadAttention's key_padding_mask: True means "masked out")
# and lucidrains/x-transformers#164 ("Attention mask, is True True?": one convention, True =
# attend, kept across a codebase).
# Trap: every nnkit op that takes a mask must read it one way, True = keep, so that one
# sequence_mask serves softmax, attention and the losses alike.
def test_every_mask_means_true_is_kept():
    lengths, T = [3, 1], 3
    keep = nn.sequence_mask(lengths, T, time_major=False)           # (B, T), True = keep
    scores = leaf(np.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]]))
    weights = nn.SoftMax(scores, mask=keep).data
    np.testing.assert_allclose(weights.sum(axis=1), [1.0, 1.0], rtol=1e-15)
    assert weights[1, 0] == 1.0 and not weights[1, 1:].any()
    values = leaf(np.arange(12.0).reshape(2, 3, 2))                 # (B, Tk, dv)
    query = leaf(np.zeros((2, 1, 2)))                               # equal scores: a plain mean
    attended = nn.Attention(query, leaf(np.ones((2, 3, 2))), values, mask=keep[:, None, :])
    np.testing.assert_allclose(attended.data[:, 0], [values.data[0].mean(axis=0),
                                                     values.data[1, 0]], rtol=1e-15)
    predictions = leaf(np.arange(6.0).reshape(T, 2, 1))             # time-major (T, B, 1)
    valid = nn.sequence_mask(lengths, T)                            # (T, B)
    squared = (predictions.data[..., 0] ** 2)[valid]
    assert nn.MSELoss(predictions, np.zeros((T, 2, 1)), lengths=lengths).item() == \
        pytest.approx(squared.mean(), rel=1e-15)
    logits = leaf(np.arange(18.0).reshape(T, 2, 3) / 7)
    targets = np.array([[0, 1], [2, 0], [1, 2]])
    logp = logits.data - np.log(np.exp(logits.data).sum(axis=-1, keepdims=True))
    picked = np.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    assert nn.SoftmaxCELoss(logits, targets, mask=valid).item() == \
        pytest.approx(-picked[valid].mean(), rel=1e-14)


# Source: cybertronai/autograd-hacks#8 (PyTorch: "grad can be implicitly created only for scalar
# outputs" when backward() is called on a vector).
# Trap: back() on a non-scalar node must be the gradient of its sum (ones as the seed), as
# back()'s docstring states, not a gradient of some element.
def test_back_on_a_vector_is_the_gradient_of_its_sum():
    x = leaf([[1.0, -2.0, 3.0]])
    (x * x).back()
    by_vector = x.g.copy()
    x.reset()
    (x * x).sum().back()
    np.testing.assert_array_equal(by_vector, x.g)
    np.testing.assert_array_equal(by_vector, 2 * x.data)
