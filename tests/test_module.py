"""nn.Module: parameters, buffers and submodules found by assignment; state, devices, copies."""
import copy
import gc
import weakref

import numpy as np
import pytest

import nnkit as nn
from nnkit.ops.normalization import BatchNormState


class Block(nn.Module):
    def __init__(self, rng, features, shared=None):
        self.W = nn.NetVar(rng.standard_normal((features, features)))
        self.b = nn.NetVar(np.zeros(features))
        self.scale = shared if shared is not None else nn.NetVar(np.ones((1, features)))

    def forward(self, x):
        return nn.Tanh(x @ self.W + self.b) * self.scale


class Net(nn.Module):
    def __init__(self, seed=0, features=3):
        rng = np.random.default_rng(seed)
        self.shared = nn.NetVar(np.full((1, features), 0.5))
        self.blocks = [Block(rng, features, self.shared), Block(rng, features, self.shared)]
        self.heads = {"out": nn.NetVar(rng.standard_normal((features, 2)))}
        self.stats = BatchNormState(features)
        self.mask = nn.NetVar(np.ones((1, features)), requires_grad=False)   # a constant
        self.steps = 0                                                     # not an array
        self.output = None

    def forward(self, x):
        h = x
        for block in self.blocks:
            h = block(h)
        h = nn.BatchNorm(h, nn.NetVar(np.ones(3), requires_grad=False),
                         nn.NetVar(np.zeros(3), requires_grad=False), self.stats)
        self.output = (h * self.mask) @ self.heads["out"]
        return self.output


NAMES = ["shared", "blocks.0.W", "blocks.0.b", "blocks.1.W", "blocks.1.b", "heads.out"]


def test_vars_are_found_by_assignment_each_once_in_order():
    net = Net()
    named = net.named_vars()
    assert list(named) == NAMES                 # blocks.*.scale is `shared`: listed once, first
    assert net.vars == list(named.values())
    assert len({id(p) for p in net.vars}) == len(net.vars)
    assert named["blocks.0.W"] is net.blocks[0].W
    assert list(net.named_buffers()) == ["stats.running_mean", "stats.running_var"]


def test_buffers_called_as_a_method_names_named_buffers():
    model = nn.layers.Sequential(nn.layers.Linear(4, 4, seed=0), nn.layers.BatchNorm(4))
    with pytest.raises(TypeError, match=r"^Sequential.buffers is a class attribute, the names "
                                        r"of the attributes that hold the class's own buffers "
                                        r"\(\), not a method: a model's buffers are "
                                        r"model.named_buffers\(\), a dict of dotted name"):
        model.buffers()
    assert list(model.named_buffers()) == ["layers.1.stats.running_mean",
                                           "layers.1.stats.running_var"]

    class Counter(nn.Module):
        buffers = ("count",)                # a plain tuple, as a subclass writes it
        def __init__(self):
            self.count = np.zeros(2)

    with pytest.raises(TypeError, match=r"^Counter.buffers is a class attribute, .*buffers "
                                        r"\('count',\), not a method"):
        Counter().buffers()
    # still the tuple of names that the walk and capture read (type(owner).buffers)
    assert Counter.buffers == ("count",) and isinstance(Counter.buffers, tuple)
    assert type(Counter.buffers + ("steps",)) is tuple
    assert list(Counter().named_buffers()) == ["count"] and "count" in Counter().state()


def test_constants_graphs_and_other_attributes_are_not_parameters():
    net = Net()
    out = net(np.ones((4, 3)))
    assert out.parents                          # the kept output is a graph node
    assert all(p is not net.mask and p is not out for p in net.vars)
    assert list(net.named_vars()) == NAMES


def test_a_module_reachable_twice_is_walked_once():
    net = Net()
    net.again = net.blocks[0]                   # the same block under a second name
    net.me = net                                # a cycle
    assert list(net.named_vars()) == NAMES


def test_forward_missing_names_the_class():
    class Empty(nn.Module):
        pass
    with pytest.raises(NotImplementedError, match="Empty defines no forward"):
        Empty()(1)


def test_state_round_trip_into_a_fresh_instance_gives_identical_outputs():
    trained, fresh = Net(seed=0), Net(seed=1)
    with nn.train_mode(True):
        trained(np.random.default_rng(2).standard_normal((5, 3)))      # moves the statistics
    state = trained.state()
    assert set(state) == set(NAMES) | {"mask", "stats.running_mean", "stats.running_var"}
    assert all(isinstance(a, np.ndarray) for a in state.values())
    keep = fresh.vars
    fresh.load_state(state)
    assert fresh.vars == keep and all(a is b for a, b in zip(fresh.vars, keep))  # identities kept
    x = np.random.default_rng(3).standard_normal((4, 3))
    with nn.eval_mode():
        np.testing.assert_array_equal(fresh(x).data, trained(x).data)
    np.testing.assert_array_equal(fresh.stats.running_var, trained.stats.running_var)
    assert fresh.blocks[1].scale is fresh.shared         # still shared after loading


class Frozen(nn.Module):
    def __init__(self, seed):
        self.emb = nn.layers.Embedding(5, 3, seed=seed)
        self.emb.table.requires_grad = False           # frozen, the PyTorch way
        self.fc = nn.layers.Linear(3, 2, seed=seed)

    def forward(self, tokens):
        return self.fc(self.emb(tokens))


def test_a_frozen_weight_is_saved_loaded_and_refused_when_missing_but_never_trained(tmp_path):
    # it was left out of state() and of the file, and a load kept the fresh model's own table
    trained, fresh = Frozen(0), Frozen(1)
    assert list(trained.named_vars()) == ["fc.W", "fc.b"]
    assert list(trained.named_constants()) == ["emb.table"]
    assert set(trained.state()) == {"emb.table", "fc.W", "fc.b"}
    nn.save(tmp_path / "frozen.npz", trained)
    nn.load(tmp_path / "frozen.npz", fresh)
    np.testing.assert_array_equal(fresh.emb.table.data, trained.emb.table.data)
    assert not fresh.emb.table.requires_grad
    tokens = np.array([[0, 4], [2, 2]])
    np.testing.assert_array_equal(fresh(tokens).data, trained(tokens).data)
    other = Frozen(2)
    state = trained.state()
    del state["emb.table"]
    with pytest.raises(KeyError, match="the state has no 'emb.table'"):
        other.load_state(state)


def test_an_output_kept_from_a_no_grad_call_is_not_state(tmp_path):
    # a node computed under no_grad() has no parents: it was taken for a constant, so state()
    # and every checkpoint written after an evaluation held it, and a fresh model refused them
    class Keeps(nn.Module):
        def __init__(self, seed):
            self.fc = nn.layers.Linear(3, 2, seed=seed)
            self.last = None

        def forward(self, x):
            self.last = self.fc(x)
            return self.last

    model, fresh = Keeps(0), Keeps(1)
    with nn.no_grad():
        model(np.ones((4, 3)))
    assert set(model.state()) == {"fc.W", "fc.b"} and model.named_constants() == {}
    nn.save(tmp_path / "m.npz", model)
    nn.load(tmp_path / "m.npz", fresh)
    np.testing.assert_array_equal(fresh.fc.W.data, model.fc.W.data)
    assert copy.deepcopy(model).last is None


def test_state_is_a_copy():
    net = Net()
    state = net.state()
    state["shared"][...] = 7
    assert not np.any(net.shared.data == 7)
    net.load_state(state)
    state["shared"][...] = 9                    # the model does not keep the state's arrays
    assert np.all(net.shared.data == 7)


@pytest.mark.parametrize("edit, error, message", [
    (lambda s: s.pop("blocks.1.b"), KeyError, "no 'blocks.1.b'"),
    (lambda s: s.update(extra=np.zeros(1)), KeyError, "has 'extra', which the model does not"),
    (lambda s: s.update({"blocks.0.W": np.zeros((3, 4))}), ValueError,
     r"'blocks.0.W' has shape \(3, 4\) in the state and \(3, 3\) in the model"),
    (lambda s: s.update({"stats.running_var": np.ones(3, dtype=int)}), TypeError,
     "'stats.running_var' has dtype int64 in the state and float64"),
    (lambda s: s.update({"blocks.1.W": s["blocks.1.W"].astype(np.float32)}), TypeError,
     "'blocks.1.W' has dtype float32 in the state and float64"),
    (lambda s: s.update({"heads.out": [[1.0, 2.0]] * 3}), TypeError,
     "'heads.out' must be an array"),
])
def test_a_mismatching_state_is_refused_and_changes_nothing(edit, error, message):
    net = Net()
    net(np.ones((2, 3))).back()
    before = {name: (p.data.copy(), p.g.copy()) for name, p in net.named_vars().items()}
    buffers = {name: a.copy() for name, a in net.named_buffers().items()}
    state = Net(seed=5).state()
    state["shared"] = state["shared"] + 1       # a valid entry that must not be assigned
    edit(state)
    with pytest.raises(error, match=message):
        net.load_state(state)
    for name, p in net.named_vars().items():
        np.testing.assert_array_equal(p.data, before[name][0])
        np.testing.assert_array_equal(p.g, before[name][1])
    for name, a in net.named_buffers().items():
        np.testing.assert_array_equal(a, buffers[name])


def test_load_state_refuses_what_is_not_a_dict():
    with pytest.raises(TypeError, match="Net.load_state: state must be a dict"):
        Net().load_state([np.zeros(3)])


def test_deepcopy_copies_parameters_and_buffers_not_the_graph():
    net = Net()
    out = net(np.ones((2, 3)))
    target = copy.deepcopy(net)
    assert target.output is None and net.output is out
    assert list(target.named_vars()) == NAMES
    for mine, theirs in zip(net.vars, target.vars):
        assert mine is not theirs and mine.data is not theirs.data
        np.testing.assert_array_equal(mine.data, theirs.data)
    assert target.blocks[0].scale is target.shared            # sharing kept within the copy
    assert target.stats is not net.stats
    target.shared.data = target.shared.data + 1                # independent afterwards
    assert not np.array_equal(target.shared.data, net.shared.data)
    # the original graph is not kept alive by the copy
    probe = weakref.ref(out)
    del out
    net.output = None
    gc.collect()
    assert probe() is None


def test_to_cpu_returns_the_model_and_drops_the_last_graph():
    net = Net()
    net(np.ones((2, 3)))
    keep = net.vars
    assert net.to_cpu() is net
    assert net.output is None and net.vars == keep


def test_to_gpu_without_a_gpu_fails_before_anything_moves():
    if nn.gpu_available():
        pytest.skip("a GPU is present")
    net = Net()
    net(np.ones((2, 3)))
    with pytest.raises(RuntimeError):
        net.to_gpu()
    assert net.output is not None               # nothing was touched


def test_repr_is_a_tree_with_shapes_and_a_count():
    text = repr(Net())
    assert text.startswith("Net(\n")
    assert "  (blocks.0): Block(\n    (W): (3, 3) float64" in text
    assert "(stats.running_mean): buffer (3,)" in text
    assert "# 33 parameters" in text            # 3 + 2·(9 + 3) + 6, shared counted once
    assert Net()._repr_html_().startswith("<pre>Net(")


def test_ffn_names_its_parameters_by_entry_and_argument_and_saves_batchnorm_statistics():
    W, b = nn.NetVar(np.ones((2, 3))), nn.NetVar(np.zeros(3))
    stats = BatchNormState(3)
    inner = nn.FFN((nn.Multiply, nn.NetVar(np.ones((3, 3)))))
    net = nn.FFN((nn.Multiply, W), (nn.Add, b), (nn.BatchNorm, nn.NetVar(np.ones(3)),
                                                 nn.NetVar(np.zeros(3)), stats),
                 (inner,), (nn.ReLU,))
    assert list(net.named_vars())[:2] == ["topology.0.1", "topology.1.1"]
    assert "topology.3.0.topology.0.1" in net.named_vars()
    assert net.vars == list(net.named_vars().values())
    assert list(net.named_buffers()) == ["topology.2.3.running_mean", "topology.2.3.running_var"]
    assert "(3): FFN(" in repr(net) and "(0): Multiply (2, 3)" in repr(net)


def test_sequence_model_is_a_module():
    model = nn.SequenceModel(3, 4, 2, embedding=5, seed=0)
    assert list(model.named_vars()) == ["embedding.table", "rnn.W", "rnn.R", "rnn.b", "head.W",
                                        "head.b"]
    assert isinstance(model.embedding, nn.layers.Embedding)
    assert isinstance(model.rnn, nn.layers.LSTM) and isinstance(model.head, nn.layers.Linear)
    model(np.zeros((2, 1), dtype=int))
    clone = copy.deepcopy(model)
    assert clone.recurrent is None and clone.output is None
    with pytest.raises(RuntimeError, match="final_state: call the model on a batch first"):
        clone.final_state


def test_two_parameters_under_one_dotted_name_are_refused():
    class Clash(nn.Module):
        def __init__(self):
            self.a = {"b": nn.NetVar(np.ones(2))}
            self.params = {"a.b": nn.NetVar(np.zeros(2))}
            self.__dict__["a.b"] = nn.NetVar(np.zeros(2))     # an attribute named with a dot

    with pytest.raises(ValueError, match=r"Clash: model.a\['b'\] and model.a.b would both be "
                                         r"named 'a.b'; rename one"):
        Clash().state()


# ----------------------------------------------------------------------------- the walk

def test_the_walk_lists_modules_parameters_constants_and_buffers_each_once():
    from nnkit.module import walk
    net = Net()
    entries = walk(net)
    assert entries[0] == ("", "module", net)
    assert [(name, kind) for name, kind, _ in entries] == [
        ("", "module"), ("shared", "var"), ("blocks.0", "module"), ("blocks.0.W", "var"),
        ("blocks.0.b", "var"), ("blocks.1", "module"), ("blocks.1.W", "var"),
        ("blocks.1.b", "var"), ("heads.out", "var"), ("stats.running_mean", "buffer"),
        ("stats.running_var", "buffer"), ("mask", "constant")]
    assert dict((name, value) for name, _, value in entries)["stats.running_var"] == \
        (net.stats, "running_var")
    # without descending, the modules below the root are listed and not looked into
    assert [name for name, _, _ in walk(net, descend=False)] == [
        "", "shared", "blocks.0", "blocks.1", "heads.out", "stats.running_mean",
        "stats.running_var", "mask"]
    # a collection: names by key and index; a NetVar alone is named ""
    w = nn.NetVar(np.ones(2))
    assert [(n, k) for n, k, _ in walk({"a": [w, net.blocks[0]], "b": (w,)})] == [
        ("a.0", "var"), ("a.1", "module"), ("a.1.W", "var"), ("a.1.b", "var"),
        ("a.1.scale", "var")]
    assert walk(w) == [("", "var", w)]


@pytest.mark.parametrize("root, error, message", [
    ({"w": nn.NetVar(np.ones(2)), "n": 3}, TypeError,
     r"where: model\['n'\] is int 3, not a parameter \(a NetVar\), a Module, or a list"),
    ([nn.NetVar(np.ones(2)) * 2], TypeError,
     r"where: model\[0\] is a NetVar that is computed by an op \(Mul #\d+ of shape \(1, 2\)\)"),
    ({"a.b": nn.NetVar(np.ones(2)), "a": {"b": nn.NetVar(np.ones(2))}}, ValueError,
     r"where: model\['a.b'\] and model\['a'\]\['b'\] would both be named 'a.b'; rename one"),
    ({"s": {nn.NetVar(np.ones(2))}}, TypeError,
     r"where: model\['s'\] is a set holding a NetVar; a set has no order"),
    ({"s": {"a", "b"}}, TypeError, r"where: model\['s'\] is a set; a set has no order"),
    (42, TypeError, r"where: model is int 42, not a parameter"),
])
def test_the_walk_words_each_refusal_once_naming_the_place(root, error, message):
    from nnkit.module import walk
    with pytest.raises(error, match=message):
        walk(root, "where")


def test_the_walk_refuses_a_collection_inside_itself():
    from nnkit.module import walk
    loop = [nn.NetVar(np.ones(2))]
    loop.append({"again": loop})
    with pytest.raises(ValueError, match=r"where: model\[1\]\['again'\] contains itself "
                                         r"\(model\[1\]\['again'\] is model\)"):
        walk(loop, "where")


@pytest.mark.parametrize("kind", [set, frozenset])
def test_layers_or_parameters_kept_in_a_set_are_refused_naming_the_attribute(kind):
    # a set of layers was ignored: its parameters were never listed, trained or saved
    class Bag(nn.Module):
        def __init__(self):
            self.head = nn.layers.Linear(2, 2, seed=0)
            self.blocks = kind([nn.layers.Linear(2, 2, seed=1)])
            self.tags = kind(["a", "b"])                # a set of anything else is fine

    bag = Bag()
    for call in (lambda: bag.vars, bag.state, lambda: nn.Adam(bag.vars), bag.to_cpu):
        with pytest.raises(TypeError, match=rf"Bag: model.blocks is a {kind.__name__} holding a "
                                            r"Linear; a set has no order .* use a list or a dict"):
            call()


def test_load_state_takes_the_npz_file_numpy_load_returns(tmp_path):
    # load_state(np.load(path)) was refused: "state must be a dict"
    trained, fresh = Net(seed=0), Net(seed=1)
    with nn.train_mode(True):
        trained(np.random.default_rng(2).standard_normal((5, 3)))
    path = tmp_path / "state.npz"
    np.savez(path, **trained.state())
    with np.load(path) as archive:
        assert fresh.load_state(archive) is fresh
    for name, array in trained.state().items():
        np.testing.assert_array_equal(fresh.state()[name], array, err_msg=name)
    np.savez(path, **{**trained.state(), "blocks.0.W": np.zeros((2, 2))})
    before = fresh.state()
    with np.load(path) as archive, pytest.raises(ValueError, match=r"Net.load_state: "
                                                 r"'blocks.0.W' has shape \(2, 2\)"):
        fresh.load_state(archive)
    for name, array in before.items():
        np.testing.assert_array_equal(fresh.state()[name], array, err_msg=name)
