"""Gradchecks of the arithmetic ops, including broadcast shapes."""
import numpy as np
import pytest

import nnkit as nn
from tests.conftest import var64

BROADCAST_PAIRS = [((3, 4), (3, 4)), ((3, 4), (1, 4)), ((3, 4), (3, 1)), ((3, 4), (1, 1)),
                   ((2, 3, 4), (4,)), ((2, 3, 4), (3, 1)), ((1, 4), (3, 1))]


@pytest.mark.parametrize("op", [nn.Add, nn.Sub, nn.Mul, nn.Div])
@pytest.mark.parametrize("shapes", BROADCAST_PAIRS)
def test_binary_elementwise_gradcheck(op, shapes, rng):
    a = var64(rng, *shapes[0])
    # keep divisors away from zero
    b = var64(rng, *shapes[1], positive=op is nn.Div)
    if len(shapes[1]) == 1:   # a true 1-D operand, not promoted to a row
        b = nn.constant(b.data.reshape(shapes[1]))
        b.requires_grad = True
    nn.gradcheck(op, a, b)


@pytest.mark.parametrize("op", [nn.Add, nn.Sub, nn.Mul, nn.Div])
def test_binary_ops_with_python_scalars(op, rng):
    a = var64(rng, 2, 3, positive=True)
    nn.gradcheck(lambda x: op(x, 2.0), a)
    nn.gradcheck(lambda x: op(3.0, x), a)


def test_operators_build_the_right_ops(rng):
    a, b = var64(rng, 2, 2, positive=True), var64(rng, 2, 2, positive=True)
    assert isinstance(a + b, nn.Add) and isinstance(a - b, nn.Sub)
    assert isinstance(a * b, nn.Mul) and isinstance(a / b, nn.Div)
    assert isinstance(a @ b, nn.Multiply) and isinstance(-a, nn.Neg)
    assert isinstance(a ** 2, nn.Pow)
    np.testing.assert_allclose((2 - a).data, 2 - a.data)
    np.testing.assert_allclose((2 / a).data, 2 / a.data)
    np.testing.assert_allclose((np.ones((2, 2)) + a).data, 1 + a.data)


@pytest.mark.parametrize("shapes", [((2, 3), (3, 4)), ((1, 3), (3, 1)), ((5, 2, 3), (3, 4)),
                                    ((2, 2, 3), (2, 3, 4)), ((2, 3), (5, 3, 4))])
def test_multiply_gradcheck(shapes, rng):
    nn.gradcheck(nn.Multiply, var64(rng, *shapes[0]), var64(rng, *shapes[1]))


@pytest.mark.parametrize("layout", ["C", "transposed"])
def test_multiply_of_a_stack_by_one_matrix_equals_numpy(layout, rng):
    # a C-ordered stack goes through one 2-D product over all its rows; another layout does not
    x = rng.standard_normal((2, 5, 3, 4))
    if layout == "transposed":
        x = x.transpose(1, 0, 2, 3)
    xn, wn = nn.NetVar(x), nn.NetVar(rng.standard_normal((4, 6)))
    y = nn.Multiply(xn, wn)
    np.testing.assert_allclose(y.data, x @ wn.data, rtol=1e-12)
    g = rng.standard_normal(y.shape)
    y.back(g)
    np.testing.assert_allclose(xn.g, g @ wn.data.T, rtol=1e-12)
    np.testing.assert_allclose(wn.g, x.reshape(-1, 4).T @ g.reshape(-1, 6), rtol=1e-12)
    nn.gradcheck(nn.Multiply, nn.NetVar(x[:, :2]), wn)


def test_multiply_rejects_vectors():
    with pytest.raises(ValueError, match="at least 2-D"):
        nn.Multiply(nn.constant(np.ones(3)), nn.NetVar(np.ones((3, 2))))


@pytest.mark.parametrize("p", [2, 3, 0.5, -1.5])
def test_pow_gradcheck(p, rng):
    nn.gradcheck(lambda x: nn.Pow(x, p), var64(rng, 3, 4, positive=True))


def test_pow_rejects_node_exponent(rng):
    with pytest.raises(TypeError, match="Pow: the exponent"):
        var64(rng, 2, 2) ** var64(rng, 1, 1)


@pytest.mark.parametrize("p, error, message", [
    ("2", TypeError, r"Pow: the exponent must be a number, got str"),      # was taken as 2
    (True, TypeError, r"got bool"),
    (np.array([2.0]), TypeError, r"got ndarray"),
    (float("nan"), ValueError, r"Pow: the exponent must be finite, got nan"),
    (float("inf"), ValueError, r"finite, got inf")])
def test_pow_refuses_exponents_that_are_not_finite_numbers(p, error, message, rng):
    with pytest.raises(error, match=message):
        nn.Pow(var64(rng, 2, 2), p)


def test_pow_takes_numpy_numbers(rng):
    x = var64(rng, 2, 2, positive=True)
    np.testing.assert_allclose(nn.Pow(x, np.int64(3)).data, x.data ** 3)
    np.testing.assert_allclose(nn.Pow(x, np.float32(0.5)).data, x.data ** 0.5)


@pytest.mark.parametrize("op,positive", [(nn.Neg, False), (nn.Exp, False), (nn.Log, True)])
def test_unary_gradcheck(op, positive, rng):
    nn.gradcheck(op, var64(rng, 3, 5, positive=positive))
    nn.gradcheck(op, var64(rng, 2, 3, 4, positive=positive))


def test_an_integer_array_operand_takes_the_float_nodes_dtype_exactly():
    # it became a float32 constant: 123456789 → 123456792 beside float64 data
    x = nn.NetVar(np.array([[0.0]]))
    assert (x + np.array([[123456789]])).item() == 123456789.0
    assert (np.array([[16777217]]) - x).item() == 16777217.0
    assert nn.L2Loss(nn.NetVar(np.array([[16777217.0]])), np.array([[16777217]])).item() == 0.0
    h = nn.NetVar(np.ones((1, 2), np.float32))
    assert (h * np.array([[2, 3]])).dtype == np.float32      # the node's dtype, as documented


@pytest.mark.parametrize("data, operand", [
    ([[1, 2, 3]], [0.5, 1.0, 2.0]), ([[1, 2, 3]], np.float64(0.5)), ([[1, 2, 3]], np.float32(0.5)),
    ([[True, False]], [2, 3]), ([[True, False]], np.int64(3)), ([[True, False]], 2.5)])
def test_an_operand_beside_integer_or_boolean_data_keeps_its_values(data, operand):
    # it took the node's dtype: labels * [0.5, 1, 2] gave [0, 2, 6], labels * np.float64(0.5)
    # zeros, mask + [2, 3] [True, True]; NumPy's own result is the reference
    data = np.array(data)
    node = nn.NetVar(data, dtype=data.dtype)
    for got, want in ((node * operand, data * np.asarray(operand)),
                      (node + operand, data + np.asarray(operand))):
        np.testing.assert_array_equal(got.data, want)
        assert got.dtype.kind == want.dtype.kind


def test_where_and_maximum_keep_a_float_beside_integer_data():
    labels = nn.NetVar([1, 2, 3], dtype=int)      # Where(...) gave [0, 2, 3], Maximum [1, 2, 3]
    np.testing.assert_array_equal(nn.Where(labels > 1, labels, 0.5).data, [[0.5, 2, 3]])
    np.testing.assert_array_equal(nn.Maximum(labels, 1.5).data, [[1.5, 2, 3]])


# ----------------------------------------------------------------------------- Second derivatives
# Every derivative of a power against PyTorch's (test_gradgradcheck_every_op checks each op alone
# against finite differences).

def test_powers_at_zero_have_the_derivatives_of_polynomials(torch):
    # d/dx x⁰ = 0 everywhere (p·x^(p−1) would be 0·∞ = NaN at 0), so every derivative of x²
    # and x³ at 0 is finite and equals PyTorch's
    x = nn.NetVar(np.array([[0.0, 1.5, -2.0]]))
    t = torch.tensor(x.data, requires_grad=True)
    np.testing.assert_array_equal(nn.grad((x ** 0).sum(), [x])[0], [[0.0, 0.0, 0.0]])
    for p in (1, 2, 3):
        mine, ref = (x ** p).sum(), (t ** p).sum()
        for order in range(1, p + 2):            # the last one is 0
            mine, = nn.grad(mine, [x], create_graph=True)
            ref, = torch.autograd.grad(ref, t, create_graph=True, allow_unused=True,
                                       materialize_grads=True)
            np.testing.assert_allclose(mine.data, ref.detach().numpy(), rtol=1e-12,
                                       err_msg=f"x ** {p}, order {order}")
            mine, ref = mine.sum(), ref.sum()
        assert not mine.requires_grad and not ref.requires_grad     # a constant, 0, in both
