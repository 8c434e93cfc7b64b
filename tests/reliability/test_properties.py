"""Property-based tests of the engine (hypothesis, derandomized so every run sees the same cases).

- every elementwise op, on random broadcast pairs: the gradient of each input equals the
  full-shape gradient (central differences, all elements at once since the op is elementwise)
  summed over the axes that input was broadcast along;
- random DAGs of ops with fan-out (nodes read by three and more consumers), over leaves of every
  awkward shape (0-d, (1, 1), rows, columns), full reductions and Python / NumPy scalar
  operands: back() agrees with float64 finite differences;
- the same DAGs with some float32 leaves: every gradient has its node's shape and dtype and
  agrees with the float64 run;
- linearity: back(a·f + b·g) = a·back(f) + b·back(g), and back(f); back(g) accumulates f + g;
- no_grad records nothing.
"""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, mutually_broadcastable_shapes

import nnkit as nn
from tests.reliability.helpers import PROPERTY, leaf, sum_to_shape

EPS = 1e-6
SEEDS = st.integers(0, 2 ** 32 - 1)


def _normal(rng, shape):
    return rng.standard_normal(shape)


def _away_from_zero(rng, shape):
    """|x| ≥ 0.5 with a random sign (divisors, negative powers)."""
    return (np.abs(rng.standard_normal(shape)) + 0.5) * rng.choice([-1.0, 1.0], size=shape)


def _positive(rng, shape):
    return np.abs(rng.standard_normal(shape)) + 0.5


# (op, how to draw each input). Elementwise ops only; new ones join these tables.
BINARY = {
    "Add": (nn.Add, _normal, _normal),
    "Sub": (nn.Sub, _normal, _normal),
    "Mul": (nn.Mul, _normal, _normal),
    "Div": (nn.Div, _normal, _away_from_zero),
    "Maximum": (nn.Maximum, _normal, _normal),
    "Minimum": (nn.Minimum, _normal, _normal),
    "Where": (lambda a, b: nn.Where(a.data > 0, a, b), _normal, _normal),
}
UNARY = {
    "Neg": (nn.Neg, _normal),
    "Exp": (nn.Exp, _normal),
    "Log": (nn.Log, _positive),
    "ReLU": (nn.ReLU, _normal),
    "LReLU": (lambda x: nn.LReLU(x, 0.1), _normal),
    "Sigmoid": (nn.Sigmoid, _normal),
    "Tanh": (nn.Tanh, _normal),
    "Pow2": (lambda x: nn.Pow(x, 2), _normal),
    "Pow3": (lambda x: nn.Pow(x, 3), _normal),
    "Pow-1": (lambda x: nn.Pow(x, -1), _away_from_zero),
    "Pow0.5": (lambda x: nn.Pow(x, 0.5), _positive),
    "Abs": (nn.Abs, _normal),
    "Sqrt": (nn.Sqrt, _positive),
    "Sin": (nn.Sin, _normal),
    "Cos": (nn.Cos, _normal),
    "Clip": (lambda x: nn.Clip(x, -0.5, 0.7), _normal),
    "HardTanh": (nn.HardTanh, _normal),
    "ELU": (nn.ELU, _normal),
    "SELU": (nn.SELU, _normal),
    "GELU": (nn.GELU, _normal),
    "SiLU": (nn.SiLU, _normal),
    "Softplus": (nn.Softplus, _normal),
}


def _forward(op, *arrays):
    with nn.no_grad():
        return op(*[leaf(a, requires_grad=False) for a in arrays]).data


def _elementwise_derivative(op, arrays, position):
    """∂op/∂input[position], element by element, by central differences on full-shape inputs."""
    plus = [a.copy() for a in arrays]
    minus = [a.copy() for a in arrays]
    plus[position] += EPS
    minus[position] -= EPS
    return (_forward(op, *plus) - _forward(op, *minus)) / (2 * EPS)


@pytest.mark.parametrize("name", sorted(BINARY))
@PROPERTY
@given(shapes=mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=3),
       seed=SEEDS)
def test_binary_gradient_is_the_broadcast_summed_gradient(name, shapes, seed):
    op, draw_a, draw_b = BINARY[name]
    rng = np.random.default_rng(seed)
    a_data = draw_a(rng, shapes.input_shapes[0])
    b_data = draw_b(rng, shapes.input_shapes[1])
    out_shape = shapes.result_shape
    g = rng.standard_normal(out_shape)

    a, b = leaf(a_data), leaf(b_data)
    y = op(a, b)
    assert y.shape == out_shape
    y.back(g)
    assert a.g.shape == a.shape and b.g.shape == b.shape

    full = [np.broadcast_to(a_data, out_shape).copy(), np.broadcast_to(b_data, out_shape).copy()]
    for position, node in enumerate((a, b)):
        expected = sum_to_shape(g * _elementwise_derivative(op, full, position), node.shape)
        np.testing.assert_allclose(node.g, expected, rtol=1e-5, atol=1e-6,
                                   err_msg=f"{name}: gradient of input {position}")


@pytest.mark.parametrize("name", sorted(UNARY))
@PROPERTY
@given(shape=array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=4), seed=SEEDS)
def test_unary_gradient_matches_elementwise_differences(name, shape, seed):
    op, draw = UNARY[name]
    rng = np.random.default_rng(seed)
    x_data = draw(rng, shape)
    g = rng.standard_normal(shape)
    x = leaf(x_data)
    y = op(x)
    assert y.shape == shape
    y.back(g)
    expected = g * _elementwise_derivative(op, [x_data], 0)
    np.testing.assert_allclose(x.g, expected, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- random DAGs

LEAF_SHAPES = {"X": (3, 3), "W": (3, 3), "b": (1, 3), "c": (3, 1), "s": (), "u": (1, 1)}


def _matmul(n, w):
    if n.ndim == 2 and n.shape[-1] == 3:
        return n @ w
    if n.ndim == 2 and n.shape[0] == 3:
        return w @ n
    return n * w                     # a 0-d or (1, 1) node: broadcast instead


def _keep_rank(reduce):
    """A reduction over one axis for 2-D nodes; 0-d nodes pass through it unchanged."""
    return lambda n, m, w: reduce(n) if n.ndim == 2 else n


# Each step takes two existing nodes (indices modulo the count, so nodes get reused: fan-out).
STEPS = {
    "add": lambda n, m, w: n + m,
    "sub": lambda n, m, w: n - m,
    "mul": lambda n, m, w: n * nn.Tanh(m),          # bounded factor: values stay O(steps)
    "div": lambda n, m, w: n / (1.5 + nn.Sigmoid(m)),
    "matmul": lambda n, m, w: _matmul(n, w),
    "tanh": lambda n, m, w: nn.Tanh(n),
    "sigmoid": lambda n, m, w: nn.Sigmoid(n),
    "neg": lambda n, m, w: -n,
    "exp": lambda n, m, w: nn.Exp(nn.Tanh(n)),
    "sum0": _keep_rank(lambda n: nn.Sum(n, axis=0, keepdims=True)),
    "mean1": _keep_rank(lambda n: nn.Mean(n, axis=1, keepdims=True)),
    "transpose": lambda n, m, w: nn.Transpose(n),
    "reshape": lambda n, m, w: nn.Reshape(nn.Reshape(n, -1), n.shape),
    "sum": lambda n, m, w: nn.Sum(n),                          # 0-d: a full reduction
    "mean": lambda n, m, w: nn.Mean(nn.Tanh(n)),
    "python_scalar": lambda n, m, w: 2.0 - n * 0.5 + 1,
    "numpy_scalar": lambda n, m, w: n * np.float64(0.75) - np.float64(0.25),
    "fan3": lambda n, m, w: n * 2.0 + n * m + nn.Tanh(n),    # n read three times here
}

PROGRAMS = st.lists(st.tuples(st.sampled_from(sorted(STEPS)), st.integers(0, 63),
                              st.integers(0, 63)), min_size=1, max_size=8)


def _run(program, leaves):
    """Every node of ``program`` applied to ``leaves`` (leaves first), in creation order."""
    nodes = list(leaves)
    w = leaves[1]
    for step, i, j in program:
        nodes.append(STEPS[step](nodes[i % len(nodes)], nodes[j % len(nodes)], w))
    return nodes


def _total(nodes):
    """Σ over every node's sum: each node feeds the root, most through several paths."""
    total = nn.Sum(nodes[0])
    for node in nodes[1:]:
        total = total + nn.Sum(node)
    return total


def _leaves(seed):
    rng = np.random.default_rng(seed)
    return [leaf(rng.standard_normal(shape)) for shape in LEAF_SHAPES.values()]


def _grads(leaves):
    return [x.g.copy() for x in leaves]


@PROPERTY
@given(program=PROGRAMS, seed=SEEDS)
def test_random_dag_matches_finite_differences(program, seed):
    leaves = _leaves(seed)
    assert nn.gradcheck(lambda *xs: _total(_run(program, xs)), *leaves)


# Programs that read a full reduction three and more times: the fan-out that lost gradient
# contributions when a 0-d gradient became a NumPy scalar.
FAN_OUT = [[("sum", 0, 0), ("fan3", 6, 6)], [("sum", 1, 0), ("fan3", 6, 0), ("add", 6, 7)],
           [("mean", 4, 0), ("fan3", 6, 5), ("fan3", 6, 7)], [("fan3", 4, 5), ("fan3", 5, 4)]]


@pytest.mark.parametrize("program", FAN_OUT)
def test_scalars_read_by_many_consumers_match_finite_differences(program):
    assert nn.gradcheck(lambda *xs: _total(_run(program, xs)), *_leaves(7))


@PROPERTY
@given(program=PROGRAMS, seed=SEEDS, low=st.sets(st.sampled_from(sorted(LEAF_SHAPES))))
def test_float32_leaves_get_float32_gradients_that_agree_with_float64(program, seed, low):
    """Mixed float dtypes: float64 data meets float32 parameters and scalars of both kinds."""
    reference = _leaves(seed)
    _total(_run(program, reference)).back()
    mixed = _leaves(seed)
    for name, node in zip(LEAF_SHAPES, mixed):
        if name in low:
            node.data = node.data.astype(np.float32)
    _total(_run(program, mixed)).back()
    for node, exact in zip(mixed, reference):
        assert node.g.dtype == node.dtype and node.g.shape == node.shape
        assert type(node.g) is np.ndarray
        np.testing.assert_allclose(node.g, exact.g, rtol=1e-3, atol=1e-3)


@PROPERTY
@given(first=PROGRAMS, second=PROGRAMS, a=st.floats(-3, 3), b=st.floats(-3, 3), seed=SEEDS)
def test_backward_is_linear(first, second, a, b, seed):
    leaves = _leaves(seed)
    f = _total(_run(first, leaves))
    g = _total(_run(second, leaves))
    f.back()
    grad_f = _grads(leaves)
    for x in leaves:
        x.reset()
    g.back()
    grad_g = _grads(leaves)
    for x in leaves:
        x.reset()
    (f * a + g * b).back()
    for x, gf, gg in zip(leaves, grad_f, grad_g):
        np.testing.assert_allclose(x.g, a * gf + b * gg, rtol=1e-9, atol=1e-9)


@PROPERTY
@given(program=PROGRAMS, cut=st.integers(1, 12), seed=SEEDS)
def test_leaf_gradients_accumulate_across_backs_through_shared_nodes(program, cut, seed):
    leaves = _leaves(seed)
    nodes = _run(program, leaves)
    f = _total(nodes[:cut])      # f and g share intermediate nodes
    g = _total(nodes)
    (f + g).back()
    together = _grads(leaves)
    for x in leaves:
        x.reset()
    f.back()
    g.back()                     # shared op nodes restart from zero; leaves accumulate
    for x, expected in zip(leaves, together):
        np.testing.assert_allclose(x.g, expected, rtol=1e-9, atol=1e-9)


@PROPERTY
@given(program=PROGRAMS, seed=SEEDS)
def test_no_grad_records_nothing(program, seed):
    leaves = _leaves(seed)
    with nn.no_grad():
        nodes = _run(program, leaves)
        root = _total(nodes)
    recorded = _run(program, leaves)
    for node, reference in zip(nodes, recorded):
        np.testing.assert_array_equal(node.data, reference.data)
    for node in nodes[len(leaves):] + [root]:
        assert node.parents == () and not node.requires_grad
    with pytest.raises(RuntimeError, match="no_grad"):
        root.back()
    assert all(x._g is None for x in leaves)
