"""The recorded backward pass of the article's Code 1: order, gradients, text and HTML."""
import numpy as np
import pytest

import nnkit as nn
from nnkit.trace import describe, local_rule, trace_back
from tests.test_viz import code1


def code1_with_loss():
    """Code 1 with its softmax input scaled down (the article's numbers saturate it) and a loss."""
    g = code1()
    g["scaled"] = g["add2"] * 0.01
    g["smax"] = nn.SoftMax(g["scaled"])
    g["loss"] = nn.CELoss(g["smax"], nn.NetVar([1, 0, 0], requires_grad=False))
    return g


def reachable_ops(root):
    ops, stack = {}, [root]
    while stack:
        node = stack.pop()
        if node.parents:
            ops[node.index] = node
            stack.extend(node.parents)
    return ops


@pytest.mark.parametrize("build, root", [(code1, "smax2"), (code1_with_loss, "loss")])
def test_trace_lists_every_op_once_in_reverse_creation_order(build, root):
    g = build()
    trace = g[root].back(trace=True)
    ops = reachable_ops(g[root])
    assert len(ops) == (6 if root == "smax2" else 8)
    assert sorted(s.node.index for s in trace) == sorted(ops)
    assert [s.node.index for s in trace] == sorted((s.node.index for s in trace), reverse=True)
    assert trace.root is g[root]


def test_trace_gradients_equal_back():
    g = code1_with_loss()
    trace = g["loss"].back(trace=True)
    reference = code1_with_loss()
    reference["loss"].back()
    by_index = {node.index: node for node in g.values()}
    for step in trace:                            # upstream g of each op = its .g after back()
        np.testing.assert_array_equal(step.upstream, step.node.g)
    for name, node in g.items():                  # and equal to an untraced back()
        np.testing.assert_allclose(node.g, reference[name].g, rtol=1e-6)
    known = trace.gradients()
    for index, gradient in known.items():
        if index in by_index and by_index[index].requires_grad:
            np.testing.assert_allclose(gradient, by_index[index].g, rtol=1e-6)
    assert np.abs(g["w1"].g).sum() > 0            # the scaled graph has non-trivial gradients


def test_added_is_what_each_step_contributed():
    w = nn.NetVar([[2.0, -1.0]])
    y = (w * w).sum()                             # Mul sees w twice: two contributions
    trace = y.back(trace=True)
    mul = trace[1]
    assert mul.parents == (w, w)
    np.testing.assert_array_equal(mul.added[0], 2 * w.data)    # the total, at each position
    np.testing.assert_array_equal(mul.added[1], 2 * w.data)
    np.testing.assert_array_equal(trace.gradients()[w.index], w.g)
    np.testing.assert_array_equal(trace.gradients(0).get(w.index), None)


def test_constants_get_nothing_added():
    x = nn.NetVar([[1.0, 2.0]], requires_grad=False)
    w = nn.NetVar([[1.0], [1.0]])
    trace = (x @ w).back(trace=True)
    assert trace[0].added[0] is None and trace[0].added[1].shape == (2, 1)
    assert "input 0 (NetVar #%d) += -" % x.index in str(trace)


def test_text_and_html():
    g = code1()
    trace = g["smax2"].back(trace=True)
    text = str(trace)
    assert text.count("step ") == 6 and text.startswith(f"step 0: SoftMax #{g['smax2'].index}")
    assert "rule: y = x @ w" in text and "dw = xᵀ @ g" in text
    page = trace._repr_html_()
    assert page.count("<tr>") == 7 and "upstream g" in page and "dx = g · [x &gt; 0]" in page
    assert nn.Trace([])._repr_html_().startswith("<p>")


def test_gradients_step_out_of_range():
    trace = code1()["smax2"].back(trace=True)
    with pytest.raises(IndexError, match="step 6 out of range"):
        trace.gradients(6)


def test_trace_back_leaves_gradients_alone():
    g = code1_with_loss()
    g["loss"].back()
    before = {name: node.g.copy() for name, node in g.items()}
    trace = trace_back(g["loss"])
    assert len(trace) == 8
    for name, node in g.items():
        np.testing.assert_array_equal(node.g, before[name])
    np.testing.assert_allclose(trace.gradients()[g["w1"].index], before["w1"], rtol=1e-6)


def test_local_rule_takes_formula_lines():
    assert local_rule(nn.Multiply).splitlines() == ["y = x @ w", "dx = g @ wᵀ", "dw = xᵀ @ g"]

    class Bare(nn.NetOp):
        pass
    assert local_rule(Bare) == "(no formula documented)"


def test_frames_from_a_recorded_trace():
    g = code1()
    trace = g["smax2"].back(trace=True)
    frames = nn.draw_trace(trace, show_data=True)
    assert len(frames) == len(trace) and frames.captions[0].startswith("step 0: SoftMax")
    assert [caption.split(": ")[1] for caption in frames.captions] == \
        [describe(step.node) for step in trace]
    highlighted = nn.draw(trace.root, step=3, trace=trace).source
    line = next(l for l in highlighted.splitlines() if 'fillcolor="#ffd966"' in l)
    assert line.lstrip().startswith(f"n{trace[3].node.index} ")



def test_trace_back_names_a_root_that_is_not_a_node():
    with pytest.raises(TypeError, match=r"trace_back: root must be a NetVar, got ndarray"):
        nn.trace_back(np.ones(3))


def test_local_rule_keeps_whole_formulas_and_leaves_the_prose_out():
    # every line with an "=" was kept: prose cut mid-sentence ("... (x must be finite"), and a
    # formula's continuation line without one was lost
    softmax = local_rule(nn.SoftMax).splitlines()
    assert [line.split(" =")[0] for line in softmax] == ["y", "dx"]
    clip = local_rule(nn.Clip).splitlines()
    assert clip[-1].strip() == "clamp)" and len(clip) == 3
    assert "shape" not in local_rule(nn.CELoss)
    # formulas after a prose paragraph, labelled ones, and a user op without a blank line
    assert local_rule(nn.Var).splitlines()[0].startswith("y = Σ_axis")
    assert "dW = G·Xᵀ" in local_rule(nn.Conv2D) and "evaluation" in local_rule(nn.Dropout)
    assert "backward (t = L−1 … 0):  dh_t" in local_rule(nn.LSTM)

    class Doubles(nn.NetOp):
        """Doubles.
        y = 2x
        dx = 2g"""
    assert local_rule(Doubles).splitlines() == ["y = 2x", "dx = 2g"]
