"""NetVar's surface (nnkit/ops/surface.py): operators with plain operands, comparisons, the table."""
import operator
import warnings

import numpy as np
import pytest

import nnkit as nn
from nnkit.ops.surface import SURFACE
from tests.conftest import var64

PLAIN = [2.5, 3, np.full((1, 4), 0.5), np.arange(1.0, 5.0)]


SWAPPED = {"add": nn.Add, "sub": nn.RSub, "mul": nn.Mul, "truediv": nn.RDiv}


@pytest.mark.parametrize("operand", PLAIN, ids=["float", "int", "row", "1-D array"])
@pytest.mark.parametrize("name, cls, function", [
    ("add", nn.Add, np.add), ("sub", nn.Sub, np.subtract), ("mul", nn.Mul, np.multiply),
    ("truediv", nn.Div, np.divide)])
def test_a_plain_operand_makes_the_node_the_constructor_makes(name, cls, function, operand, rng):
    x = var64(rng, 3, 4, positive=True)
    kept = getattr(x, f"__{name}__")(operand)               # x − 2.5: the op keeps 2.5
    first = getattr(x, f"__r{name}__")(operand)             # 2.5 − x: kept too, operands swapped
    for node in (kept, first):
        assert node.parents == (x,)
        if isinstance(operand, np.ndarray):
            assert node.constant is operand
        else:                                   # a number: a 0-d array of the node's dtype
            assert node.constant.shape == () and node.constant.dtype == np.float64
            assert node.constant == operand
    assert type(first) is SWAPPED[name]
    # the references: the constructor with the number kept, and with a constant node first
    for node, reference, values in [(kept, cls(x, operand), function(x.data, operand)),
                                     (first, cls(operand, x), function(operand, x.data))]:
        assert node.dtype == reference.dtype == np.float64
        np.testing.assert_allclose(node.data, values, rtol=1e-15)
        np.testing.assert_array_equal(node.data, reference.data)
        g = rng.standard_normal(node.shape)
        x.reset()
        node.back(g)
        mine = x.g.copy()
        x.reset()
        reference.back(g)
        np.testing.assert_array_equal(mine, x.g)
    nn.gradcheck(lambda v: getattr(v, f"__{name}__")(operand), x)
    nn.gradcheck(lambda v: getattr(v, f"__r{name}__")(operand), x)


def test_an_array_library_that_defers_to_array_ufunc_none_gets_the_node():
    # CuPy hands `gpu_array + x` to x.__radd__ only when x.__array_ufunc__, read from the node,
    # is None (NumPy reads it from the class, where it is the function that refuses np.exp(x))
    class DefersAsCuPyDoes:
        def __add__(self, other):
            if getattr(other, "__array_ufunc__", 0) is None:
                return other.__radd__(np.full((1, 2), 3.0))
            raise TypeError("Unsupported type")
    x = nn.NetVar(np.ones((1, 2)))
    y = DefersAsCuPyDoes() + x
    assert isinstance(y, nn.NetVar) and y.parents == (x,)
    np.testing.assert_array_equal(y.data, [[4.0, 4.0]])


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("number", [0.1, 3, 1e-8, 2 ** 70, 1e300])
def test_a_kept_number_computes_as_numpy_computes_with_it(dtype, number):
    # NumPy casts a Python number to the array's float dtype; the op keeps that cast number,
    # so every value, result dtype and warning is NumPy's own, in both operand orders
    data = np.array([[1.5, -2.25, 3e-3, 7.0]], dtype)
    x = nn.NetVar(data)
    for function in (operator.add, operator.sub, operator.mul, operator.truediv):
        with np.errstate(all="ignore"):
            for node, values in [(function(x, number), function(data, number)),
                                 (function(number, x), function(number, data))]:
                assert node.dtype == values.dtype
                np.testing.assert_array_equal(node.data, values)


def test_a_number_operand_keeps_the_nodes_dtype_and_an_array_promotes():
    x = nn.NetVar(np.ones((1, 2), np.float32))
    assert (x * 0.5).dtype == (0.5 - x).dtype == (x * np.float64(0.5)).dtype == np.float32
    assert (x + np.ones((1, 2))).dtype == np.float64
    assert (x + np.ones((1, 2), np.float32)).dtype == np.float32


def test_plain_operands_that_do_not_fit_fail_naming_the_op(rng):
    x = var64(rng, 3, 4)
    with pytest.raises(ValueError, match=r"Add: cannot broadcast \(3, 4\) with \(5,\)"):
        x + np.ones(5)
    # the swapped ops name the shapes in the order the user wrote them: c − x, c / x
    with pytest.raises(ValueError, match=r"RSub: cannot broadcast \(2,\) with \(3, 4\)"):
        np.ones(2) - x
    with pytest.raises(ValueError, match=r"RDiv: cannot broadcast \(5,\) with \(3, 4\)"):
        np.ones(5) / x
    with pytest.raises(ValueError, match=r"RSub: cannot broadcast \(2, 2\) with \(3, 4\)"):
        nn.ops.arithmetic.RSub(x, var64(rng, 2, 2))           # two nodes: b − a
    with pytest.raises(TypeError, match=r"constant: cannot make a numeric array from str"):
        x * "2"
    assert (x + [1.0, 2.0, 3.0, 4.0]).shape == (3, 4)        # a list: through the constructor
    assert type(x + True) is nn.Add                           # a bool: through the constructor


@pytest.mark.parametrize("symbol, function", [
    ("<", np.less), ("<=", np.less_equal), (">", np.greater), (">=", np.greater_equal),
    ("==", np.equal), ("!=", np.not_equal)])
def test_comparisons_give_boolean_constants(symbol, function, rng):
    x = nn.NetVar(np.array([[-1.0, 0.0, 2.0]]))
    y = nn.NetVar(np.array([[0.0, 0.0, 1.0]]))
    for other, values in [(0.0, function(x.data, 0.0)), (y, function(x.data, y.data)),
                          (y.data, function(x.data, y.data))]:
        mask = eval(f"x {symbol} other")
        assert isinstance(mask, nn.NetVar) and mask.dtype == bool and not mask.requires_grad
        np.testing.assert_array_equal(mask.data, values)


def test_a_comparison_is_a_mask_for_where_and_indexing():
    x = nn.NetVar(np.array([[-1.0, 0.5, 2.0]]))
    y = nn.Where((x > 0).data, x, x * 0.1)
    y.sum().back()
    np.testing.assert_allclose(x.g, [[0.1, 1.0, 1.0]])
    np.testing.assert_array_equal(x[(x > 0).data].data, [0.5, 2.0])


def test_equality_is_elementwise_but_nodes_stay_hashable_by_identity():
    a, b = nn.NetVar([1.0, 2.0]), nn.NetVar([1.0, 2.0])
    assert (a == b).data.all() and not (a != b).data.any()
    assert len({a, b}) == 2 and {a: 1, b: 2}[b] == 2           # dicts and sets use identity


def test_the_table_holds_every_method_that_builds_an_op():
    x = nn.NetVar(np.array([[1.0, 4.0]]))
    for name, entry in SURFACE.items():
        assert vars(nn.NetVar)[name] is entry, name
    assert isinstance(x.sqrt(), nn.Sqrt) and isinstance(x.T, nn.Transpose)
    assert isinstance(abs(x), nn.Abs) and isinstance(x.sum(axis=1), nn.Sum)
    with pytest.raises(TypeError, match=r"sum\(\): nnkit spells the axis argument axis=, not dim="):
        x.sum(dim=1)


def test_a_number_with_integer_data_is_kept_as_the_number():
    # NumPy promotes int data times a Python float to float64; casting the number to the
    # data's integer dtype would silently give 0
    x = nn.NetVar(np.array([[1, 2, 3]]), dtype=int)
    for node, values in [(x * 0.5, np.array([[1, 2, 3]]) * 0.5),
                         (0.5 - x, 0.5 - np.array([[1, 2, 3]])),
                         (1 / x, 1 / np.array([[1, 2, 3]]))]:
        assert node.dtype == np.float64
        np.testing.assert_array_equal(node.data, values)


@pytest.mark.parametrize("number", [1 + 2j, np.complex128(1 + 2j), np.complex64(2j)])
def test_a_complex_number_operand_stays_complex_as_in_numpy(number):
    # a NumPy complex scalar was cast to the node's real dtype: x + 5j gave x, with a warning
    a = np.array([[1.0, 2.0, 3.0]])
    x = nn.NetVar(a)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for node, expected in ((x * number, a * number), (x + number, a + number),
                               (number - x, number - a)):
            np.testing.assert_array_equal(node.data, expected)
