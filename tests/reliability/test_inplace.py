"""In-place edits of data an op used: back() raises InplaceEditError naming the op and the input
instead of giving a wrong gradient; the optimizer's own update after back() stays allowed.

Edits through the ``.data`` setter (``w.data = ...``, ``w.data += 1``) and ``mark_edited()`` are
caught always (a version stamp, checked once per back()). Item assignment on the array
(``w.data[i] = v``) never reaches NetVar, so it is caught only under ``detect_anomaly()``, which
hashes each op's inputs when the op is built and again at back().
"""
import copy

import numpy as np
import pytest

import nnkit as nn
from nnkit import instrument


def _graph():
    rng = np.random.default_rng(0)
    w = nn.NetVar(rng.standard_normal((3, 2)), name="w")
    x = nn.NetVar(rng.standard_normal((4, 3)), requires_grad=False, name="x")
    h = x @ w
    return w, x, h, nn.Sum(nn.Tanh(h))


EDITS = {
    "assigned an array": lambda node: setattr(node, "data", node.data + 1.0),
    "assigned a list": lambda node: setattr(node, "data", np.zeros(node.shape).tolist()),
    "mark_edited": lambda node: node.mark_edited(),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_editing_a_parameter_after_use_raises_naming_the_op_and_input(edit):
    w, x, h, loss = _graph()
    EDITS[edit](w)
    with pytest.raises(nn.InplaceEditError,
                       match=rf"input 1 of Multiply #{h.index} of shape \(4, 2\) "
                             rf"\(NetVar 'w' #{w.index} of shape \(3, 2\)\) was changed"):
        loss.back()


def test_plus_equals_on_the_data_attribute_is_an_edit():
    w, x, h, loss = _graph()
    w.data += 1.0                 # reads the array, adds in place, assigns back via the setter
    with pytest.raises(nn.InplaceEditError, match="Multiply"):
        loss.back()


def test_editing_a_constant_input_is_caught_too():
    w, x, h, loss = _graph()      # w's gradient is xᵀ·g: it needs x as it was
    x.data = x.data * 2.0
    with pytest.raises(nn.InplaceEditError, match=r"input 0 of Multiply .*NetVar 'x'"):
        loss.back()


def test_editing_an_intermediate_node_is_caught():
    w, x, h, loss = _graph()
    h.data = h.data * 0.0
    with pytest.raises(nn.InplaceEditError, match=rf"input 0 of Tanh .*Multiply #{h.index}"):
        loss.back()


def test_edits_outside_the_graph_do_not_matter():
    w, x, h, loss = _graph()
    other = nn.NetVar(np.ones((2, 2)))
    side = other * 2.0
    other.data += 1.0             # `side` is stale, `loss` is not
    loss.back()
    assert np.any(w.g != 0)
    with pytest.raises(nn.InplaceEditError, match="Mul"):
        side.back()


@pytest.mark.parametrize("optimizer", [nn.GD, nn.Adam])
def test_optimizer_step_after_back_is_allowed_and_a_stale_graph_is_refused(optimizer):
    w, x, h, loss = _graph()
    opt = optimizer([w])
    before = w.data.copy()
    loss.back()
    opt.step()                    # the update itself edits w in place: allowed
    assert not np.array_equal(w.data, before)
    with pytest.raises(nn.InplaceEditError, match="Multiply"):
        loss.back()               # the old graph saw the old w
    for _ in range(5):            # rebuilt graphs train normally
        loss = nn.Sum(nn.Tanh(x @ w))
        loss.back()
        opt.step()


def test_a_refused_back_changes_no_gradient():
    w, x, h, loss = _graph()
    loss.back()
    g, hg, lg = w.g.copy(), h.g.copy(), loss.g.copy()
    w.mark_edited()
    with pytest.raises(nn.InplaceEditError):
        loss.back()
    np.testing.assert_array_equal(w.g, g)     # the leaf gradient was not touched
    # nor the op nodes' (they were cleared, and the root seeded, before the check)
    np.testing.assert_array_equal(h.g, hg)
    np.testing.assert_array_equal(loss.g, lg)


# ----------------------------------------------------------------------------- item assignment

ITEM_EDITS = {
    "item": lambda array: array.__setitem__((0, 0), 5.0),
    "slice times": lambda array: array[1:].__imul__(2.0),
    "copyto": lambda array: np.copyto(array, array + 1.0),
}


@pytest.mark.parametrize("edit", sorted(ITEM_EDITS))
def test_item_assignment_is_caught_under_detect_anomaly(edit):
    with nn.detect_anomaly():
        w, x, h, loss = _graph()
        ITEM_EDITS[edit](w.data)
        with pytest.raises(nn.InplaceEditError,
                           match=rf"input 1 of Multiply #{h.index} .*NetVar 'w'.* edited in place"):
            loss.back()


def test_item_assignment_to_an_input_or_intermediate_under_detect_anomaly():
    with nn.detect_anomaly():
        w, x, h, loss = _graph()
        x.data[2, 1] = 0.0
        with pytest.raises(nn.InplaceEditError, match=r"input 0 of Multiply .*NetVar 'x'"):
            loss.back()
        w, x, h, loss = _graph()
        h.data[0] = 1.0
        with pytest.raises(nn.InplaceEditError, match=r"input 0 of Tanh"):
            loss.back()


def test_detect_anomaly_training_loop_has_no_false_alarm():
    w, x, h, loss = _graph()
    opt = nn.Adam([w], lr=0.01)
    with nn.detect_anomaly():
        for _ in range(5):
            loss = nn.Sum(nn.Tanh(x @ w))
            loss.back()
            opt.step()
            w.data[0, 0] = 0.5    # edits between graphs are fine
        loss = nn.Sum(nn.Tanh(x @ w))
        w.data[0, 0] = w.data[0, 0]   # same value written back: the gradient is still right
        loss.back()
    checked = w.g.copy()
    w.reset()
    nn.Sum(nn.Tanh(x @ w)).back()
    np.testing.assert_array_equal(checked, w.g)


def test_item_assignment_costs_nothing_outside_detect_anomaly(monkeypatch):
    def called(*args):
        raise AssertionError("data was hashed with detect_anomaly off")

    monkeypatch.setattr(instrument, "digests", called)
    w, x, h, loss = _graph()
    w.data[0, 0] = 5.0            # not seen outside the mode (the documented trade-off)
    loss.back()


def test_an_array_an_op_keeps_edited_in_place_is_caught_in_anomaly_mode():
    x = nn.NetVar(np.ones((1, 3)))
    scale = np.full((1, 3), 2.0)
    with nn.detect_anomaly():
        y = nn.Sum(x * scale)                 # Mul keeps `scale` as its constant: no node
        scale[0, 1] = 5.0                     # the gradient would use the edited value
        with pytest.raises(nn.InplaceEditError, match=r"keeps beside its inputs \(constant\)"):
            y.back()
        z = nn.Sum(x * scale)                 # rebuilt after the edit: fine
        z.back()
    np.testing.assert_array_equal(x.g, [[2.0, 5.0, 2.0]])


def test_a_back_refused_late_in_the_pass_leaves_every_leaf_gradient_as_it_was():
    # b's branch runs before the edited a's op is reached: b.g used to be filled already
    a, b = nn.NetVar(np.ones((1, 2))), nn.NetVar(np.ones((1, 2)))
    loss = (a * 2.0).sum() + (b * 3.0).sum()
    a.data = a.data + 1
    with pytest.raises(nn.InplaceEditError, match="input 0 of Mul"):
        loss.back()
    assert a._g is None and b._g is None


def test_editing_an_ops_own_output_after_it_was_computed_is_refused():
    # Tanh's rule reads its output: an edited one gave a silently wrong gradient
    x = nn.NetVar(np.array([[0.5, 1.0]]))
    y = nn.Tanh(x)
    y.data = np.zeros((1, 2))
    with pytest.raises(nn.InplaceEditError, match=r"the data of Tanh #\d+ of shape \(1, 2\) was "
                                                  r"changed after the op computed it"):
        y.back()
    assert x._g is None


def test_an_edit_through_a_copy_of_a_node_never_changes_the_data_its_graph_used():
    # detach(), NetVar(w) and w.data = v shared one array between two nodes: an edit through
    # one went unseen by the other's graph, whose gradient then used the new values
    for make in (lambda w: w.detach(), lambda w: nn.NetVar(w)):
        w = nn.NetVar(np.array([[1.0, 2.0]]))
        y = (w * w).sum()
        other = make(w)
        other.data += 1
        y.back()
        np.testing.assert_array_equal(w.g, [[2.0, 4.0]])
        np.testing.assert_array_equal(w.data, [[1.0, 2.0]])
    w, v = nn.NetVar(np.array([[0.0, 0.0]])), nn.NetVar(np.array([[4.0, 4.0]]))
    w.data = v
    y = (w * w).sum()
    v.data += 1
    y.back()
    np.testing.assert_array_equal(w.g, [[8.0, 8.0]])


KEPT_ARRAYS = {      # op built from the table and a kept array, the edit, the attribute named
    "Embedding ids": (lambda t, a: nn.Embedding(nn.NetVar(a, dtype=int), t),
                      np.array([0, 1]), (0,), "idx"),
    "GetItem index": (lambda t, a: t[a], np.array([0, 1]), (0,), "key"),
    "Where cond": (lambda t, a: nn.Where(a, t, 0.0), np.array([[True, False, True]]), (0, 1),
                   "cond"),
    "Clip bound": (lambda t, a: nn.Clip(t, a), np.zeros((1, 3)), (0, 0), "lo, hi"),
    "SoftMax mask": (lambda t, a: nn.SoftMax(t, -1, a) * np.arange(12.0).reshape(4, 3),
                     np.array([[True, True, False]]), (0, 2), "mask"),
}


@pytest.mark.parametrize("case", list(KEPT_ARRAYS))
def test_an_index_mask_or_bound_an_op_keeps_edited_in_place_is_caught_in_anomaly_mode(case):
    # only the parents and Mul's constant were hashed: these edits moved the gradient silently
    build, array, where, names = KEPT_ARRAYS[case]
    table = nn.NetVar(np.arange(12.0).reshape(4, 3))
    with nn.detect_anomaly():
        y = build(table, array)
        array[where] = 3 if array.dtype.kind == "i" else 100 if array.dtype.kind == "f" else True
        with pytest.raises(nn.InplaceEditError, match=rf"keeps beside its inputs \({names}\)"):
            y.sum().back()
    assert table._g is None


@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy])
def test_a_copy_of_an_op_built_before_an_edit_is_refused_beside_newer_ops(how):
    """A copy gets a newer creation index than ops built after the edit, but keeps the stamp of
    the op it copies: back() skipped its check when the graph's oldest op was built after the
    edit, and x.g was 2 + 2·x_new (8, 10), a gradient of no graph that was ever built."""
    x = nn.NetVar(np.array([[1.0, 2.0]]))
    y = x * x
    x.data = np.array([[3.0, 4.0]])
    z = x * 2.0                       # built after the edit: the oldest op of the graph below
    stale = how(y)
    with pytest.raises(nn.InplaceEditError, match="was changed after the op used it"):
        (z + stale).sum().back()
    assert x._g is None
