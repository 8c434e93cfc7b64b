"""Graph pictures: the DOT text of the article's Code 1, SVG/PNG through `dot`, node tables."""
import importlib.util
import pathlib
import re
import shutil

import numpy as np
import pytest

import nnkit as nn
from nnkit import viz

ROOT = pathlib.Path(__file__).resolve().parents[1]
needs_dot = pytest.mark.skipif(shutil.which("dot") is None,
                               reason="Graphviz's `dot` is not installed (apt-get install graphviz)")


def load_script(relative):
    """A script of this repository (docs/, examples/) as a module."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def code1():
    """The article's Code 1 (from examples/article.py), returning its nodes by name."""
    return load_script("docs/make_figures.py").code1()


def parse(source):
    """{node id: label} and [(parent id, child id)] from the DOT text."""
    nodes = dict(re.findall(r'^  (n\d+) \[.*?label="((?:[^"\\]|\\.)*)"', source, flags=re.M))
    edges = re.findall(r"^  (n\d+) -> (n\d+)", source, flags=re.M)
    return nodes, edges


def test_code1_dot_structure():
    g = code1()
    source = nn.draw(g["smax2"]).source
    nodes, edges = parse(source)
    assert source.startswith("digraph") and source.rstrip().endswith("}")
    assert len(nodes) == 11                     # 5 variables + 6 ops
    assert len(edges) == 10                     # 2 inputs for each Multiply/Add, 1 for ReLU/SoftMax
    ids = {name: f"n{node.index}" for name, node in g.items()}
    expected = {("x", "mul1"), ("w1", "mul1"), ("mul1", "add1"), ("b1", "add1"),
                ("add1", "relu1"), ("relu1", "mul2"), ("w2", "mul2"), ("mul2", "add2"),
                ("b2", "add2"), ("add2", "smax2")}
    assert set(edges) == {(ids[p], ids[c]) for p, c in expected}
    titles = sorted(label.split("\\n")[0] for label in nodes.values())
    assert titles == ["Add", "Add", "Multiply", "Multiply", "ReLU", "SoftMax"] + ["parameter"] * 5
    assert nodes[ids["w1"]].split("\\n")[1] == "(2, 3)"
    assert "data" not in source and "g =" not in source


def test_kinds_have_distinct_styles():
    x = nn.NetVar([[1.0, -2.0]], requires_grad=False)
    w = nn.NetVar([[1.0], [2.0]])
    y = nn.ReLU(x @ w)
    source = nn.draw(y).source
    line = {kind: next(l for l in source.splitlines() if f"  n{node.index} [" in l)
            for kind, node in (("constant", x), ("parameter", w), ("op", y))}
    assert 'shape="ellipse"' in line["parameter"] and "dashed" not in line["parameter"]
    assert 'shape="ellipse"' in line["constant"] and "dashed" in line["constant"]
    assert 'shape="box"' in line["op"] and 'peripheries="2"' in line["op"]   # the root
    assert len({re.search(r'fillcolor="([^"]+)"', l).group(1) for l in line.values()}) == 3


def test_names_data_and_gradients_on_the_nodes():
    g = code1()
    source = nn.draw(g["smax2"], show_data=True, names=g).source
    nodes, _ = parse(source)
    assert nodes[f"n{g['add1'].index}"] == "add1 = Add\\n(1, 3)\\ndata = [[16., 20., 24.]]"
    assert nodes[f"n{g['x'].index}"] == "x\\n(1, 2)\\ndata = [[1., 2.]]"
    loss = nn.CELoss(g["smax2"], nn.NetVar([0, 1, 0], requires_grad=False))
    loss.back()
    source = nn.draw(loss, show_grad=True).source
    nodes, _ = parse(source)
    expected = np.array2string(g["b2"].g, precision=3, separator=", ")
    assert nodes[f"n{g['b2'].index}"].endswith(f"g = {expected}")
    assert "g =" not in nodes[[k for k, v in nodes.items() if v.startswith("constant")][0]]


def test_small_values_are_never_drawn_or_traced_as_zeros():
    # a vanishing gradient of 1e-6 read "g = [[0., 0.]]" in drawings and traces
    z = nn.NetVar(np.array([[1e-4, 2.0]]))
    out = (z * 1e-6).sum()
    trace = out.back(trace=True)
    assert "g = [[1.e-06, 1.e-06]]" in nn.draw(out, show_grad=True).source
    assert "data = [[1.e-04, 2.e+00]]" in nn.draw(out, show_data=True).source
    assert "+= [[1.e-06, 1.e-06]]" in str(trace)


def test_large_arrays_are_summarised():
    w = nn.NetVar(np.arange(100.0).reshape(10, 10))
    source = nn.draw(nn.Tanh(w), show_data=True, inline=12).source
    assert "data: min 0  mean 49.5  max 99" in source
    assert "[[" not in source.split(f"n{w.index} [")[1].splitlines()[0]


def test_quotes_in_names_are_escaped():
    w = nn.NetVar([1.0], name='say "hi"')
    source = nn.draw(nn.Exp(w)).source
    assert 'label="say \\"hi\\"\\n(1, 1)"' in source


class Unrolled(nn.NetOp):
    """A stand-in for a fused recurrent op: loops over T steps inside one node.

    y = cumsum over time of x
    """

    def __init__(self, x):
        self.steps = x.shape[0]
        super().__init__(np.cumsum(x.data, axis=0), x)


def test_fused_op_is_one_node_with_its_time_length():
    x = nn.NetVar(np.ones((7, 2, 3)))
    source = nn.draw(Unrolled(x)).source
    nodes, edges = parse(source)
    assert len(nodes) == 2 and len(edges) == 1
    line = next(l for l in source.splitlines() if "Unrolled" in l)
    assert "Unrolled  T=7" in line and 'shape="box3d"' in line


def test_transpose_property_is_not_mistaken_for_a_time_length():
    w = nn.NetVar(np.ones((2, 3)))
    assert viz._time_length(nn.Tanh(w)) is None


def test_step_highlights_the_node_and_shows_known_gradients():
    g = code1()
    loss = nn.CELoss(g["smax2"], nn.NetVar([0, 1, 0], requires_grad=False))
    source = nn.draw(loss, step=2).source          # steps: CELoss, SoftMax, Add #2, ...
    current = next(l for l in source.splitlines() if f"  n{g['add2'].index} [" in l)
    assert 'fillcolor="#ffd966"' in current and "g = " in current
    nodes, _ = parse(source)
    assert nodes[f"n{g['mul1'].index}"].endswith("g: (not yet)")
    assert "g = " in nodes[f"n{g['b2'].index}"]                   # just added by Add #2
    flowing = [l for l in source.splitlines() if f"-> n{g['add2'].index} [" in l]
    assert len(flowing) == 2 and all("dir=" in l for l in flowing)
    assert g["w1"]._g is None                      # drawing a step changed no gradient


def test_draw_step_on_a_leaf_and_bad_root():
    with pytest.raises(ValueError, match="no steps"):
        nn.draw(nn.NetVar([1.0]), step=0)
    with pytest.raises(TypeError, match="NetVar"):
        nn.draw(np.ones(3))


def test_dot_export_works_without_dot(tmp_path, monkeypatch):
    monkeypatch.setattr(viz.shutil, "which", lambda name: None)
    graph = nn.draw(code1()["smax2"])
    path = graph.save(tmp_path / "graph.dot")
    assert path.read_text() == graph.source
    with pytest.raises(RuntimeError, match="apt-get install graphviz.*pip install graphviz"):
        graph.save(tmp_path / "graph.svg")
    assert graph._repr_svg_() is None
    assert "apt-get install graphviz" in repr(graph)
    with pytest.raises(ValueError, match=r"\.dot, \.svg"):
        graph.save(tmp_path / "graph.txt")


@needs_dot
def test_svg_and_png(tmp_path):
    g = code1()
    graph = nn.draw(g["smax2"], show_data=True, names=g)
    svg = graph._repr_svg_()
    assert svg.lstrip().startswith("<?xml") or "<svg" in svg[:500]
    assert svg.count('class="node"') == 11 and svg.count('class="edge"') == 10
    assert ">relu1 = ReLU<" in svg
    png = graph.save(tmp_path / "graph.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


@needs_dot
def test_frames_slider_html(tmp_path):
    g = code1()
    frames = nn.draw_trace(g["smax2"])
    assert len(frames) == 6
    page = frames._repr_html_()
    assert page.count("<svg") == 6 and "type='range'" in page
    paths = frames.save(str(tmp_path / "step-{k}.svg"))
    assert [p.name for p in paths] == [f"step-{k}.svg" for k in range(6)]


def test_frames_save_needs_a_step_placeholder():
    frames = nn.draw_trace(code1()["smax2"])
    with pytest.raises(ValueError, match="{k}"):
        frames.save("frame.svg")


def test_node_html_table():
    w = nn.NetVar([[1.0, 2.0]], name="w")
    y = (w * 3.0).sum()
    assert "<table>" in w._repr_html_() and "NetVar 'w'" in w._repr_html_()
    assert ">g<" not in w._repr_html_()
    y.back()
    page = w._repr_html_()
    assert ">g<" in page and "[[3., 3.]]" in page
    assert "op, needs gradient" in y._repr_html_()


def test_fused_recurrent_layer_is_one_node(rng):
    if not hasattr(nn, "RNN"):
        pytest.skip("nnkit.ops.recurrent has no RNN yet")
    x = nn.NetVar(rng.standard_normal((5, 2, 3)), requires_grad=False)
    W, R, b = (nn.NetVar(rng.standard_normal(s)) for s in ((3, 4), (4, 4), (4,)))
    y = nn.RNN(x, W, R, b)
    source = nn.draw(y.sum()).source
    nodes, edges = parse(source)
    inputs = len(y.parents)                                # x, W, R, b (and an initial state)
    assert len(nodes) == inputs + 2 and len(edges) == inputs + 1     # one RNN node, one Sum
    assert nodes[f"n{y.index}"].startswith("RNN  T=5\\n(5, 2, 4)")
    assert 'shape="box3d"' in next(l for l in source.splitlines() if f"  n{y.index} [" in l)


def test_a_trace_of_another_graph_is_refused():
    # it was drawn with every node "g: (not yet)" and nothing highlighted
    x = nn.NetVar(np.ones((1, 2)))
    first, second = (x * 2.0).sum(), (x * 3.0).sum()
    trace = first.back(trace=True)
    with pytest.raises(ValueError, match=r"draw: the trace records the backward pass from Sum "
                                         r"#\d+, not from Sum #\d+"):
        nn.draw(second, step=0, trace=trace)
    assert nn.draw(first, step=0, trace=trace).source
