"""The engine's fast paths make the same nodes and gradients as the general ones.

``a + b`` (and − × ÷) builds its node with ``object.__new__`` and ``core.link`` instead
of running the op's constructor; back() calls ``_back`` with one or two parents spelled out;
elementwise one-input ops hand their gradient over with ``accumulate_same_shape``, which
skips the shape and dtype tests. Each test below compares a fast path with the
general one, or with numbers worked out by hand, on a case where a mistake would show.
"""
import operator

import numpy as np
import pytest

import nnkit as nn
from nnkit import core

OPERATORS = [(operator.add, nn.Add), (operator.sub, nn.Sub), (operator.mul, nn.Mul),
             (operator.truediv, nn.Div)]
NODE_SLOTS = ("requires_grad", "_g", "_pversion", "name")


def _rows(seed, *shapes):
    rng = np.random.default_rng(seed)
    return [rng.uniform(0.5, 2.0, shape) for shape in shapes]


@pytest.mark.parametrize("function, op", OPERATORS, ids=lambda v: getattr(v, "__name__", ""))
@pytest.mark.parametrize("needs", [(True, True), (True, False), (False, True), (False, False)])
def test_operator_node_equals_constructor_node(function, op, needs):
    a0, b0 = _rows(0, (3, 4), (1, 4))
    a, b = nn.NetVar(a0, requires_grad=needs[0]), nn.NetVar(b0, requires_grad=needs[1])
    fast, slow = function(a, b), op(a, b)
    assert type(fast) is op
    np.testing.assert_array_equal(fast.data, slow.data)
    for slot in NODE_SLOTS:
        assert getattr(fast, slot, None) == getattr(slow, slot, None), slot
    assert fast.parents == ((a, b) if any(needs) else ())
    assert fast.index == slow.index - 1          # numbered in creation order like any node


@pytest.mark.parametrize("function, op", OPERATORS, ids=lambda v: getattr(v, "__name__", ""))
def test_operator_gradients_equal_constructor_gradients_with_broadcasting(function, op):
    a0, b0 = _rows(1, (3, 1, 4), (2, 1))
    grads = []
    for build in (function, op):
        a, b = nn.NetVar(a0), nn.NetVar(b0)
        build(a, b).back()
        grads.append((a.g, b.g))
    for fast, slow in zip(*grads):
        np.testing.assert_array_equal(fast, slow)
    assert grads[0][0].shape == (3, 1, 4) and grads[0][1].shape == (2, 1)


def test_operator_under_no_grad_records_no_parents():
    a, b = nn.NetVar([1.0, 2.0]), nn.NetVar([3.0, 4.0])
    with nn.no_grad():
        y = a * b
    assert y.parents == () and not y.requires_grad


@pytest.mark.parametrize("function, op", OPERATORS, ids=lambda v: getattr(v, "__name__", ""))
def test_operator_with_plain_operands_and_bad_shapes_takes_the_constructor(function, op):
    a = nn.NetVar(np.ones((2, 3)))
    y = function(a, 2.0)                       # the op keeps the number, as its constructor does
    reference = op(a, 2.0)
    assert type(y) is op and y.parents == reference.parents == (a,)
    assert y.constant == reference.constant == 2.0
    assert y.requires_grad and reference.requires_grad
    with pytest.raises(ValueError, match=rf"{op.__name__}: cannot broadcast \(2, 3\) with \(4,\)"):
        function(a, nn.NetVar(np.ones((1, 4))).reshape(4))
    with pytest.raises(ValueError, match=rf"{op.__name__}: cannot broadcast \(2, 3\) with \(4,\)"):
        function(a, np.ones(4))


def test_anomaly_mode_checks_nodes_built_by_the_operators():
    a, b = nn.NetVar([0.0, 1.0]), nn.NetVar([0.0, 1.0])
    with nn.detect_anomaly():
        with pytest.raises(nn.AnomalyError, match="forward of Div"):
            with np.errstate(invalid="ignore", divide="ignore"):
                a / b


@pytest.mark.parametrize("arity", [1, 2, 3])
def test_back_passes_every_parent_whatever_their_number(arity):
    xs = [nn.NetVar(v) for v in _rows(2, *[(2, 3)] * arity)]
    y = nn.Concat(xs, axis=0) if arity == 3 else (nn.Tanh(xs[0]) if arity == 1
                                                 else xs[0] / xs[1])
    seed = np.arange(y.size, dtype=float).reshape(y.shape)
    y.back(seed)
    if arity == 3:
        expected = np.split(seed, 3, axis=0)
    elif arity == 1:
        expected = [seed * (1 - np.tanh(xs[0].data) ** 2)]
    else:
        expected = [seed / xs[1].data, -seed * xs[0].data / xs[1].data ** 2]
    for x, g in zip(xs, expected):
        np.testing.assert_allclose(x.g, g, rtol=1e-12)


def test_elementwise_gradient_into_a_shared_buffer_copies_it():
    # s = x + tanh(x): Add hands the same array to x and to t, so x's first gradient is shared
    # with t's; tanh's contribution must then go into a new array, never into t's gradient.
    a = nn.NetVar(_rows(3, (2, 3))[0])
    x = a * nn.NetVar(np.full((2, 3), 0.5))
    t = nn.Tanh(x)
    s = x + t
    s.back()
    y = np.tanh(x.data)
    np.testing.assert_array_equal(t.g, np.ones((2, 3)))
    np.testing.assert_allclose(x.g, 1 + (1 - y * y), rtol=1e-12)
    np.testing.assert_allclose(a.g, 0.5 * (2 - y * y), rtol=1e-12)


def test_elementwise_gradient_into_an_owned_buffer_adds_in_place():
    # x feeds three tanh nodes: the first contribution is kept, the second makes an owned
    # array, the third is added into it in place; every one must count once.
    x = nn.NetVar(_rows(4, (1, 5))[0])
    y = nn.Tanh(x) + nn.Tanh(x) + nn.Tanh(x)
    y.back()
    np.testing.assert_allclose(x.g, 3 * (1 - np.tanh(x.data) ** 2), rtol=1e-12)


def test_accumulate_sums_a_broadcast_gradient_at_every_contribution():
    b = nn.NetVar(np.zeros((1, 3)))
    b.accumulate(np.ones((4, 3)))                # first: summed over the broadcast rows
    np.testing.assert_array_equal(b.g, np.full((1, 3), 4.0))
    b.reset()
    g = np.ones((1, 3))
    b.accumulate(g)                              # kept, shared
    b.accumulate(np.ones((2, 3)))                # second: summed, into a new array
    np.testing.assert_array_equal(b.g, np.full((1, 3), 3.0))
    np.testing.assert_array_equal(g, np.ones((1, 3)))        # the caller's array untouched
    b.accumulate(np.ones((5, 3)))                # later: summed, in place
    np.testing.assert_array_equal(b.g, np.full((1, 3), 8.0))


def test_operator_built_nodes_count_as_ops_for_graph_collection():
    # a graph built only by operators is collected, ordered and freed like any other
    x = nn.NetVar(np.ones((1, 2)))
    h = x
    for _ in range(50):
        h = h * x + x
    nodes = core.collect((h,))
    assert len(nodes) == 100
    assert [n.index for n in nodes] == sorted((n.index for n in nodes), reverse=True)


def test_an_op_node_edited_after_use_is_caught_though_it_starts_without_a_version():
    a = nn.NetVar(np.ones((1, 3)))
    h = a * a                                    # an op node: no _version until edited
    y = nn.Tanh(h)
    h.data = h.data * 2
    with pytest.raises(nn.InplaceEditError, match="input 0 of Tanh"):
        y.back()


def test_op_nodes_are_unnamed_until_named():
    a = nn.NetVar(np.ones((1, 3)), name="a")
    h = a + a
    assert a.name == "a" and h.name is None
    h.name = "sum"
    assert h.name == "sum" and "'sum'" in repr(h)
