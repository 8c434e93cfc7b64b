"""nn.grad: gradients as values, without touching .g, and gradients of gradients (create_graph).

The per-op second derivatives are checked by test_gradgradcheck_every_op
(tests/ops/test_every_op.py) and in the "Second derivatives" section of each family's
tests/ops/test_<family>.py; this file checks the engine's part: seeds, several outputs,
intermediate and unused inputs, the .g it must leave alone, the graph it must not keep, the
errors, higher orders, and gradgradcheck itself.
"""
import gc
import weakref

import numpy as np
import pytest

import nnkit as nn


def var(rng, *shape):
    return nn.NetVar(rng.standard_normal(shape))


# ----------------------------------------------------------------------------- first order

def test_grad_equals_back_and_leaves_every_g_as_it_was(rng):
    x, w = var(rng, 3, 4), var(rng, 4, 2)
    h = nn.Multiply(x, w)
    y = (h * h + h).sum()
    y.back()
    expected_x, expected_w = x.g.copy(), w.g.copy()
    before = {id(n): n._g for n in (x, w, h, y)}
    x.g = 7.0                      # a gradient the user set must survive too
    set_x = x._g
    gx, gw = nn.grad(y, [x, w])
    np.testing.assert_allclose(gx, expected_x, rtol=1e-12)
    np.testing.assert_allclose(gw, expected_w, rtol=1e-12)
    assert x._g is set_x and (x.g == 7.0).all()
    assert w._g is before[id(w)] and h._g is before[id(h)] and y._g is before[id(y)]
    assert type(gx) is np.ndarray and gx.shape == x.shape


def test_several_outputs_with_seeds_and_an_intermediate_input(rng):
    x = var(rng, 2, 3)
    h = x.tanh()
    a, b = (h * 2.0).sum(axis=1), (h * h)
    seed_b = rng.standard_normal(b.shape)
    gx, gh = nn.grad([a, b], [x, h], g=[np.array([1.0, -2.0]), seed_b])
    dh = np.array([[1.0], [-2.0]]) * 2.0 + 2 * h.data * seed_b
    np.testing.assert_allclose(gh, dh, rtol=1e-12)
    np.testing.assert_allclose(gx, dh * (1 - h.data ** 2), rtol=1e-12)


def test_an_unused_input_gets_zeros_and_a_repeated_input_its_gradient_twice(rng):
    x, unused = var(rng, 2, 2), var(rng, 1, 3)
    gx, gu, gx2 = nn.grad((x * x).sum(), [x, unused, x])
    np.testing.assert_allclose(gx, 2 * x.data)
    np.testing.assert_array_equal(gu, np.zeros((1, 3)))
    np.testing.assert_array_equal(gx2, gx)
    gu, = nn.grad((x * x).sum(), [unused], create_graph=True)
    assert isinstance(gu, nn.NetVar) and not gu.requires_grad and (gu.data == 0).all()


def test_an_unused_input_gets_zeros_whatever_gradient_it_holds_from_a_back_before(rng):
    # a leaf and an intermediate node, each holding .g from an earlier back(): not the answer
    x, z = var(rng, 1, 2), var(rng, 1, 2)
    (z * z).sum().back()
    h = x.tanh()
    h.sum().back()
    held_z, held_h = z.g.copy(), h.g.copy()
    for create_graph in (False, True):
        gx, gz, gh = nn.grad((x * 3.0).sum(), [x, z, h], create_graph=create_graph)
        values = [getattr(g, "data", g) for g in (gx, gz, gh)]
        np.testing.assert_array_equal(values[0], np.full((1, 2), 3.0))
        np.testing.assert_array_equal(values[1], np.zeros((1, 2)))
        np.testing.assert_array_equal(values[2], np.zeros((1, 2)))
    np.testing.assert_array_equal(z.g, held_z)        # the .g they hold is left as it was
    np.testing.assert_array_equal(h.g, held_h)


def test_a_node_read_by_three_consumers_gets_all_three_contributions(rng):
    x = var(rng, 1, 1)
    y = x * x + x.exp() + 3.0 * x
    gx, = nn.grad(y, [x], create_graph=True)
    np.testing.assert_allclose(gx.data, 2 * x.data + np.exp(x.data) + 3.0)
    hx, = nn.grad(gx, [x])
    np.testing.assert_allclose(hx, 2 + np.exp(x.data))


def test_the_seed_is_never_edited_and_results_do_not_alias_it(rng):
    x = var(rng, 2, 3)
    seed = rng.standard_normal((2, 3))
    kept = seed.copy()
    gx, = nn.grad(x + 0.0, [x], g=seed)
    gx += 1.0
    np.testing.assert_array_equal(seed, kept)


def test_no_graph_is_kept_after_grad_without_create_graph(rng):
    x = var(rng, 3, 3)
    h = x.exp()
    y = (h * h).sum()
    alive = weakref.ref(h)
    found = nn.grad(y, [x])
    del h, y
    gc.collect()
    assert alive() is None, "grad() kept the graph alive"
    assert all(type(g) is np.ndarray for g in found)


# ----------------------------------------------------------------------------- higher orders

def test_third_order_of_a_scalar_function_against_the_closed_form():
    x = nn.NetVar(np.array(0.7))                # a (1, 1) leaf, read as a 0-d node below
    s = x.sum()
    y = s ** 5 - 3.0 * s * s + s.exp()          # y''' = 60 x² + eˣ
    d1, = nn.grad(y, [x], create_graph=True)
    d2, = nn.grad(d1, [x], create_graph=True)
    d3, = nn.grad(d2, [x], create_graph=True)
    d4, = nn.grad(d3, [x])
    v = 0.7
    np.testing.assert_allclose(d1.data, 5 * v ** 4 - 6 * v + np.exp(v), rtol=1e-13)
    np.testing.assert_allclose(d2.data, 20 * v ** 3 - 6 + np.exp(v), rtol=1e-13)
    np.testing.assert_allclose(d3.data, 60 * v ** 2 + np.exp(v), rtol=1e-13)
    np.testing.assert_allclose(d4, 120 * v + np.exp(v), rtol=1e-13)


def test_hessian_vector_product_of_a_quadratic_form(rng):
    a = rng.standard_normal((4, 4))
    x, v = var(rng, 1, 4), rng.standard_normal((1, 4))
    y = nn.Multiply(nn.Multiply(x, nn.constant(a)), x.transpose()) * 0.5
    gx, = nn.grad(y, [x], create_graph=True)
    hv, = nn.grad((gx * v).sum(), [x])
    np.testing.assert_allclose(hv, v @ (a + a.T) / 2, rtol=1e-12)


def test_back_through_a_gradient_fills_g_as_usual(rng):
    x = var(rng, 2, 2)
    gx, = nn.grad((x ** 3).sum(), [x], create_graph=True)     # 3x²
    (gx * gx).sum().back()                                     # d/dx Σ 9x⁴ = 36x³
    np.testing.assert_allclose(x.g, 36 * x.data ** 3, rtol=1e-12)


def test_a_seed_node_makes_the_gradient_differentiable_in_it(rng):
    x, w = var(rng, 3, 2), var(rng, 2, 4)
    y = nn.Multiply(x, w)
    u = var(rng, 3, 4)                       # the upstream gradient as a node
    gx, = nn.grad(y, [x], g=u, create_graph=True)              # u @ wᵀ
    v = rng.standard_normal((3, 2))
    gu, = nn.grad((gx * v).sum(), [u])                          # v @ w
    np.testing.assert_allclose(gu, v @ w.data, rtol=1e-12)


def test_a_gradient_penalty_trains_the_weights_it_depends_on(rng):
    x = nn.NetVar(rng.standard_normal((5, 3)), requires_grad=True)
    w = var(rng, 3, 1)
    score = nn.Multiply(x, w) ** 2
    gx, = nn.grad(score.sum(), [x], create_graph=True)         # 2 (x w) wᵀ
    penalty = (gx * gx).sum()
    gw, = nn.grad(penalty, [w])
    xw = x.data @ w.data
    # penalty = 4 Σ_i (x_i w)² |w|², so its gradient is 8 |w|² Xᵀ(Xw) + 8 Σ(xw)² w
    expected = 8 * (w.data ** 2).sum() * x.data.T @ xw + 8 * (xw ** 2).sum() * w.data
    np.testing.assert_allclose(gw, expected, rtol=1e-12)


def test_composite_second_order_problem_matches_pytorch(rng):
    """tanh(x W) cubed and summed, plus Σ sin(x)·x; then the squared norm of its gradient."""
    torch = pytest.importorskip("torch")
    xd, wd = rng.standard_normal((3, 4)), rng.standard_normal((4, 5))
    x, w = nn.NetVar(xd), nn.NetVar(wd)
    f = (nn.Multiply(x, w).tanh() ** 3).sum() + (x.sin() * x).sum()
    gx, gw = nn.grad(f, [x, w], create_graph=True)
    ((gx * gx).sum() + (gw * gw).sum()).back()

    tx = torch.tensor(xd, requires_grad=True)
    tw = torch.tensor(wd, requires_grad=True)
    tf = (torch.tanh(tx @ tw) ** 3).sum() + (torch.sin(tx) * tx).sum()
    tgx, tgw = torch.autograd.grad(tf, [tx, tw], create_graph=True)
    ((tgx * tgx).sum() + (tgw * tgw).sum()).backward()
    np.testing.assert_allclose(gx.data, tgx.detach().numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(x.g, tx.grad.numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(w.g, tw.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_create_graph_records_the_new_graph_even_under_no_grad(rng):
    x = var(rng, 2, 2)
    y = (x * x * x).sum()
    with nn.no_grad():
        gx, = nn.grad(y, [x], create_graph=True)
    assert gx.requires_grad
    hx, = nn.grad(gx.sum(), [x])
    np.testing.assert_allclose(hx, 6 * x.data, rtol=1e-12)


# ----------------------------------------------------------------------------- user ops

class Cube(nn.NetOp):
    """A user's op written as the article writes them: first order only."""

    def __init__(self, x):
        super().__init__(x.data ** 3, x)

    def _back(self, x):
        x.g += self.g * 3 * x.data ** 2
        super()._back()


class CubeTwice(Cube):
    """The same op opting in to higher orders."""

    def _grads(self, g, x):
        return (g * 3.0 * x * x,)


class CubeComposite(Cube):
    """Opting in through a composite of built-in ops."""

    def _composite(self, x):
        return x * x * x


def test_a_first_order_user_op_works_with_grad_and_refuses_create_graph(rng):
    x = var(rng, 2, 2)
    gx, = nn.grad(Cube(x).sum(), [x])
    np.testing.assert_allclose(gx, 3 * x.data ** 2, rtol=1e-12)
    with pytest.raises(NotImplementedError, match=r"Cube defines no _grads.*create_graph=False"):
        nn.grad(Cube(x).sum(), [x], create_graph=True)


@pytest.mark.parametrize("op", [CubeTwice, CubeComposite])
def test_a_user_op_opts_in_with_grads_or_a_composite(op, rng):
    x = var(rng, 2, 3)
    assert nn.gradgradcheck(lambda x: op(x), x)
    gx, = nn.grad(op(x).sum(), [x], create_graph=True)
    hx, = nn.grad(gx.sum(), [x])
    np.testing.assert_allclose(hx, 6 * x.data, rtol=1e-12)


# ----------------------------------------------------------------------------- refusals

def test_refused_calls_name_the_problem(rng):
    x = var(rng, 2, 2)
    y = (x * x).sum()
    c = nn.NetVar(np.ones((2, 2)), requires_grad=False)
    with pytest.raises(RuntimeError, match="output 0.*does not require a gradient"):
        nn.grad(c * 2.0, [x])
    with pytest.raises(ValueError, match="input 1.*does not require a gradient"):
        nn.grad(y, [x, c])
    with pytest.raises(TypeError, match=r"inputs\[0\] is a ndarray"):
        nn.grad(y, [x.data])
    with pytest.raises(TypeError, match="inputs must be a node or a non-empty list"):
        nn.grad(y, [])
    with pytest.raises(ValueError, match="g must be a list of 2 seeds"):
        nn.grad([y, y], [x], g=[1.0])
    with pytest.raises(ValueError, match=r"seed of output 0.*shape \(\)"):
        nn.grad(y, [x], g=np.ones(3))
    with pytest.raises(ValueError, match=r"seed of output 0.*shape \(2, 2\)"):
        nn.grad(x * 1.0, [x], g=var(rng, 1, 2), create_graph=True)
    with pytest.raises(TypeError, match="create_graph must be True or False"):
        nn.grad(y, [x], create_graph=1)


def test_an_edit_after_use_is_refused_and_leaves_every_g_as_it_was(rng):
    x = var(rng, 2, 2)
    h = x * x
    y = (h * 2.0).sum()
    y.back()
    saved = x.g.copy()
    x.data += 1.0
    for create_graph in (False, True):
        with pytest.raises(nn.InplaceEditError):
            nn.grad(y, [x], create_graph=create_graph)
        np.testing.assert_array_equal(x.g, saved)


# ----------------------------------------------------------------------------- gradgradcheck

class WrongSecond(Cube):
    def _grads(self, g, x):
        return (g * 3.0 * x,)               # a wrong rule (x, not x²): its derivative is off


class IgnoresUpstream(Cube):
    def _grads(self, g, x):
        return (nn.constant(g.data) * 3.0 * x * x,)      # g cut from the graph


def test_detect_anomaly_names_the_op_whose_rule_made_a_nan_in_create_graph():
    # √x at 0: the first-order rule's g / (2y) is infinite. grad(create_graph=True) builds it
    # from ops (a Div the user never wrote): the error must also name the op whose rule it is.
    x = nn.NetVar(np.array([[0.0, 1.0]]))
    with nn.detect_anomaly(), np.errstate(divide="ignore"):
        y = x.sqrt().sum()
        with pytest.raises(nn.AnomalyError, match=r"forward of Div .* produced NaN or Inf "
                           r"\(while grad\(create_graph=True\) ran the gradient rule of Sqrt "
                           r"#\d+ of shape \(1, 2\)\)"):
            nn.grad(y, [x], create_graph=True)
        with pytest.raises(nn.AnomalyError, match=r"backward of Sqrt"):    # as back() says it
            nn.grad(y, [x])


def test_create_graph_keeps_each_gradient_in_its_nodes_dtype_as_back_does(rng):
    x = nn.NetVar(rng.standard_normal((2, 3)).astype(np.float32))
    w = nn.NetVar(rng.standard_normal((2, 3)))                          # float64
    y = ((x * w) ** 2).sum()
    first, = nn.grad(y, [x])
    gx, = nn.grad(y, [x], create_graph=True)
    assert first.dtype == gx.dtype == np.float32
    np.testing.assert_array_equal(gx.data, first)
    gw, = nn.grad(gx.sum(), [w])                    # through the cast: d/dw Σ 2xw² = 4xw
    assert gw.dtype == np.float64
    np.testing.assert_allclose(gw, 4 * x.data.astype(np.float64) * w.data, rtol=1e-6)
    # a seed node is taken in the output's dtype, as a seed array is; a complex one is refused
    seed = nn.NetVar(np.full((2, 3), 0.1, np.float32))
    z = w * w
    gz, = nn.grad(z, [w], g=seed, create_graph=True)
    assert gz.dtype == np.float64
    np.testing.assert_array_equal(gz.data, nn.grad(z, [w], g=seed.data)[0])
    with pytest.raises(TypeError, match=r"grad\(\): the seed of output 0, .*: a seed must hold "
                                        r"real floats, got complex128"):
        nn.grad(z, [w], g=nn.NetVar(np.full((2, 3), 1 + 1j), requires_grad=False),
                create_graph=True)


def test_gradgradcheck_finds_a_wrong_rule_and_names_the_input(rng):
    x = var(rng, 2, 2)
    with pytest.raises(nn.GradcheckError, match=r"gradgradcheck .*: input 0") as error:
        nn.gradgradcheck(lambda x: WrongSecond(x), x)
    assert "WRONG GRADIENTS" in str(error.value.report)


def test_gradgradcheck_finds_a_rule_that_cuts_the_upstream_gradient(rng):
    x = var(rng, 2, 2)
    report = None
    with pytest.raises(nn.GradcheckError, match="the upstream gradient") as error:
        nn.gradgradcheck(lambda x: IgnoresUpstream(x), x)
    report = error.value.report
    assert report.inputs[0].wrong == 0 and report.inputs[1].wrong > 0


def test_gradgradcheck_compares_the_first_order_values_of_both_rules(rng):
    # a _grads off by a constant has the right second derivatives: it passed
    class OffByOne(nn.NetOp):
        def __init__(self, x):
            super().__init__(x.data ** 3, x)

        def _back(self, x):
            x.accumulate(self.g * 3 * x.data ** 2)

        def _grads(self, g, x):
            return (g * 3.0 * x * x + 1.0,)

    x = var(rng, 1, 2)
    assert nn.gradcheck(lambda x: OffByOne(x), x)
    with pytest.raises(nn.GradcheckError, match=r"gradgradcheck \(first order, create_graph="
                                                r"True against back\(\)\): input 0"):
        nn.gradgradcheck(lambda x: OffByOne(x), x)


def test_gradgradcheck_verbose_report_and_return_value(rng, capsys):
    x = var(rng, 1, 3)
    assert nn.gradgradcheck(lambda x: (x * x * x).exp(), x, verbose=True)
    shown = capsys.readouterr().out
    assert shown.startswith("gradgradcheck: OK") and "input 1 'the upstream gradient'" in shown
    assert nn.gradgradcheck(lambda x: WrongSecond(x), x, raise_on_error=False) is False
    with pytest.raises(TypeError, match="gradgradcheck: input 0 has dtype float32"):
        nn.gradgradcheck(lambda x: x * x, nn.NetVar(np.ones((1, 2)), dtype=np.float32))


def test_a_composite_op_given_one_node_as_two_inputs_counts_its_gradient_once(rng):
    x = var(rng, 2, 3)
    y = CubeProduct(x, x)                    # x·x·x with x read twice: dy/dx = 3x²
    first, = nn.grad(y.sum(), [x])
    second, = nn.grad(y.sum(), [x], create_graph=True)
    np.testing.assert_allclose(first, 3 * x.data ** 2, rtol=1e-12)
    np.testing.assert_allclose(second.data, first, rtol=1e-12)


def test_a_composite_op_whose_input_depends_on_another_input_counts_each_path_once(rng):
    # the composite's own pass went on past its inputs: b = a + c reached a there, and again
    # in the outer pass (CosineSimilarity(v, v + c), a recurrent layer applied twice, a chunk
    # starting from the previous chunk's final state: wrong first-order values)
    v = var(rng, 2, 3)
    offset = rng.standard_normal((2, 3))
    cosine = nn.CosineSimilarity(v, v + offset).sum()
    np.testing.assert_allclose(nn.grad(cosine, [v], create_graph=True)[0].data,
                               nn.grad(cosine, [v])[0], rtol=1e-12)
    x = var(rng, 2, 3)
    y = CubeProduct(x, x * 2.0)
    np.testing.assert_allclose(nn.grad(y.sum(), [x], create_graph=True)[0].data,
                               6 * x.data ** 2, rtol=1e-12)           # y = 2x³
    layer = nn.layers.RNN(3, 3, seed=0)
    for p in layer.vars:
        p.data = p.data.astype(np.float64)
    steps = nn.NetVar(rng.standard_normal((4, 2, 3)), requires_grad=False)
    twice = layer(layer(steps)).sum()
    np.testing.assert_allclose(nn.grad(twice, [layer.W], create_graph=True)[0].data,
                               nn.grad(twice, [layer.W])[0], rtol=1e-10, atol=1e-12)


class CubeProduct(nn.NetOp):
    """a·a·b, first order by _back, higher orders through a composite."""

    def __init__(self, a, b):
        super().__init__(a.data * a.data * b.data, a, b)

    def _back(self, a, b):
        a.accumulate(self.g * 2 * a.data * b.data)
        b.accumulate(self.g * a.data * a.data)

    def _composite(self, a, b):
        return a * a * b


def test_an_op_given_no_parents_is_named_among_the_causes():
    class Square(nn.NetOp):
        def __init__(self, x):
            super().__init__(x.data ** 2)       # the input is not listed as a parent

        def _back(self, x):
            x.g += 2 * x.data * self.g

    x = nn.NetVar(np.ones((2, 3)))
    for call in (lambda: Square(x).sum().back(),
                 lambda: nn.gradcheck(lambda v: Square(v).sum(), x)):
        with pytest.raises(RuntimeError, match=r"does not require a gradient .*from an op "
                                               r"whose super\(\).__init__\(value, \*parents\) "
                                               "was given no parents"):
            call()
