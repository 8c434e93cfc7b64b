import numpy as np
import pytest

import nnkit as nn


def _net(seed=0):
    return nn.FFN(
        (nn.Multiply, nn.rand2(2, 3, seed=seed)),
        (nn.Add, nn.rand2(3, seed=seed + 1)),
        (nn.ReLU,),
        (nn.Multiply, nn.rand2(3, 3, seed=seed + 2)),
        (nn.Add, nn.rand2(3, seed=seed + 3)),
        (nn.SoftMax,),
    )


def test_vars_lists_parameters_only():
    net = _net()
    assert len(net.vars) == 4
    target = nn.NetVar([0, 0, 1])
    net.topology.append((nn.CELoss, target))
    assert all(v is not target for v in net.vars) and len(net.vars) == 4
    constant = nn.NetVar([1.0, 1.0, 1.0], requires_grad=False)
    net.topology.insert(2, (nn.Mul, constant))
    assert all(v is not constant for v in net.vars)


def test_article_code4_converges():
    net = _net()
    optimizer = nn.GD(net.vars)
    net.topology.append((nn.CELoss, nn.NetVar([0, 0, 1])))
    x = nn.NetVar([1, 2])
    loss = float("inf")
    for _ in range(10_000):
        loss = net(x).item()
        if loss < 0.01:
            break
        net.back()
        optimizer.step()
    assert loss < 0.01
    net.topology.pop()
    assert net(x).data.argmax() == 2


def test_ffn_gradients_equal_the_hand_built_graph():
    net = _net()
    x = nn.NetVar(np.array([[0.5, -1.0]]))
    y = net(x)
    y.back(np.array([[1.0, -2.0, 0.5]]))
    w1, b1, w2, b2 = net.vars
    grads = [v.g.copy() for v in net.vars]
    for v in net.vars:
        v.reset()
    h = nn.SoftMax(nn.Add(nn.Multiply(nn.ReLU(nn.Add(nn.Multiply(x, w1), b1)), w2), b2))
    h.back(np.array([[1.0, -2.0, 0.5]]))
    for v, g in zip(net.vars, grads):
        np.testing.assert_allclose(v.g, g)


def test_bad_topology_entries():
    with pytest.raises(TypeError, match="topology entry 1"):
        nn.FFN((nn.ReLU,), nn.ReLU)
    net = nn.FFN((nn.ReLU,))
    net.topology.append(("Dense", 3))
    with pytest.raises(TypeError, match="topology entry 1"):
        net(nn.NetVar([1.0]))
    with pytest.raises(RuntimeError, match="call the network"):
        nn.FFN((nn.ReLU,)).back()
    net = nn.FFN((nn.Multiply, nn.NetVar(np.ones((4, 2)))))
    with pytest.raises(ValueError, match=r"topology entry 0 \(Multiply\).*\(1, 3\) by \(4, 2\)"):
        net(nn.NetVar([1.0, 2.0, 3.0]))


# ---------------------------------------------------------------- composed networks and topology

def _encoder_decoder():
    encoder = nn.FFN((nn.Multiply, nn.rand2(2, 4, seed=1)), (nn.Add, nn.rand2(4, seed=2)),
                     (nn.Tanh,))
    decoder = nn.FFN((nn.Multiply, nn.rand2(4, 3, seed=3)), (nn.Add, nn.rand2(3, seed=4)))
    return encoder, decoder


def test_a_composed_ffn_lists_and_trains_the_parameters_of_its_parts():
    encoder, decoder = _encoder_decoder()
    net = nn.FFN((encoder,), (nn.ReLU,), (decoder,))
    assert net.vars == encoder.vars + decoder.vars and len(net.vars) == 4
    before = [p.data.copy() for p in net.vars]
    optimizer = nn.GD(net.vars, lr=0.1, momentum=0.0)
    x = nn.NetVar(np.array([[0.5, -1.0]]), requires_grad=False)
    nn.SoftmaxCELoss(net(x), np.array([2])).back()
    optimizer.step()
    assert all(not np.array_equal(p.data, old) for p, old in zip(net.vars, before))
    again = nn.FFN((net,), (nn.SoftMax,))       # nested twice
    assert again.vars == net.vars


def test_shared_parameters_are_listed_once():
    w = nn.rand2(3, 3)
    block = nn.FFN((nn.Multiply, w), (nn.Tanh,))
    net = nn.FFN((block,), (nn.Multiply, w), (block,))
    assert net.vars == [w]
    nn.GD(net.vars)         # an optimizer accepts it: no parameter listed twice


def test_topology_entries_that_are_not_ops_are_refused():
    with pytest.raises(TypeError, match="topology entry 0 starts with <class 'int'>, which is "
                                        "not an op class"):
        nn.FFN((int,))
    with pytest.raises(TypeError, match="topology entry 1 starts with 3"):
        nn.FFN((nn.ReLU,), (3,))
    with pytest.raises(TypeError, match=r"topology entry 0 starts with .*FFN'>, which is not"):
        nn.FFN((nn.FFN,))
    encoder, _ = _encoder_decoder()
    with pytest.raises(TypeError, match=r"topology entry 0 \(an FFN\) takes no arguments, got 1"):
        nn.FFN((encoder, 2))
    with pytest.raises(TypeError, match=r"topology entry 0 \(Multiply\): .*missing"):
        nn.FFN((nn.Multiply,))(nn.NetVar([1.0, 2.0]))


def test_a_callable_entry_must_return_a_netvar():
    net = nn.FFN((nn.ReLU,), (lambda node: node.data * 2,))
    with pytest.raises(TypeError, match=r"FFN: topology entry 1 \(<lambda>\) returned a "
                                        "ndarray, not a NetVar"):
        net(nn.NetVar([1.0, 2.0]))
    assert nn.FFN((nn.ReLU,), (lambda node: node * 2,))(nn.NetVar([1.0])).item() == 2.0


def test_an_ffn_inside_itself_is_refused():
    net = nn.FFN((nn.ReLU,))
    net.topology.append((net,))
    with pytest.raises(ValueError, match=r"FFN: model.topology.1.0 contains itself "
                                         r"\(model.topology.1.0 is model\)"):
        net.vars
    with pytest.raises(ValueError, match="FFN: topology entry 1 contains the network itself"):
        net(nn.NetVar([1.0]))
    inner = nn.FFN((nn.ReLU,))                  # a loop through another FFN
    net.topology[1] = (inner,)
    inner.topology.append((net,))
    with pytest.raises(ValueError, match=r"FFN: model.topology.1.0.topology.1.0 contains itself "
                                         r"\(model.topology.1.0.topology.1.0 is model\)"):
        net.vars


def test_a_computed_argument_that_needs_a_gradient_is_refused_by_vars():
    w = nn.rand2(2, 3)
    net = nn.FFN((nn.Multiply, w * 2.0))
    with pytest.raises(TypeError, match=r"FFN: model.topology.0.1 is a NetVar that is computed "
                                        r"by an op \(Mul #\d+ of shape \(2, 3\)\)"):
        net.vars
    with nn.no_grad():
        assert nn.FFN((nn.Multiply, w * 2.0)).vars == []     # a constant: fine


def test_weights_inside_a_list_argument_are_parameters():
    # vars looked only at NetVar arguments: w1 and w2 got gradients but no optimizer update
    rng = np.random.default_rng(0)
    w1, w2, w3 = (nn.NetVar(rng.standard_normal((2, 2))) for _ in range(3))

    def two_paths(x, weights):
        return x @ weights[0] + x @ weights[1]

    net = nn.FFN((two_paths, [w1, w2]), (nn.Multiply, w3))
    assert [id(p) for p in net.vars] == [id(w1), id(w2), id(w3)]
    assert list(net.named_vars()) == ["topology.0.1.0", "topology.0.1.1", "topology.1.1"]
    before = w1.data.copy()
    net(nn.NetVar(np.ones((1, 2)), requires_grad=False)).sum().back()
    nn.GD(net.vars, lr=0.1).step()
    assert not np.array_equal(w1.data, before)


def test_a_frozen_weight_of_an_ffn_is_saved_loaded_and_rebuilt_frozen(tmp_path):
    # FFN kept its constants out of state(): a load into a model left the frozen weight as
    # the fresh model's own, silently
    def build(seed):
        nn.seed(seed)
        net = nn.FFN((nn.Multiply, nn.glorot(3, 4)), (nn.Add, nn.zeros(4)), (nn.Tanh,),
                     (nn.Multiply, nn.glorot(4, 2)))
        net.topology[0][1].requires_grad = False
        return net

    trained, fresh = build(0), build(1)
    assert list(trained.named_constants()) == ["topology.0.1"]
    assert set(trained.state()) == {"topology.0.1", "topology.1.1", "topology.3.1"}
    path = tmp_path / "frozen.npz"
    nn.save(path, trained)
    nn.load(path, fresh)
    x = nn.NetVar(np.ones((2, 3), np.float32), requires_grad=False)
    np.testing.assert_array_equal(fresh(x).data, trained(x).data)
    other = build(2)
    other.load_state(trained.state())
    np.testing.assert_array_equal(other(x).data, trained(x).data)
    rebuilt = nn.load(path).model
    np.testing.assert_array_equal(rebuilt(x).data, trained(x).data)
    assert not rebuilt.topology[0][1].requires_grad and len(rebuilt.vars) == 2


def _ffns_with_modules():
    """FFNs whose parameters sit in a model entry's arguments and in models passed as
    arguments (plain, in a list, in a nested FFN)."""
    layer = nn.layers.Linear(3, 3, seed=0)
    rnn = nn.layers.RNN(3, 3, seed=1)
    h0 = nn.NetVar(np.full((1, 3), 0.1))              # a learned initial state

    def apply(x, module):
        return module(x)

    inner = nn.FFN((apply, layer), (nn.Tanh,))
    return {
        "model entry with an argument": nn.FFN((rnn, None, h0), (lambda y: y[-1],)),
        "model as an argument": nn.FFN((apply, layer), (nn.Multiply, nn.NetVar(np.eye(3)))),
        "model in a list argument": nn.FFN((lambda x, ms: ms[0](x), [layer]),),
        "FFN as an argument": nn.FFN((apply, inner),),
    }


@pytest.mark.parametrize("case", list(_ffns_with_modules()))
def test_vars_are_what_named_vars_names(case):
    # vars walked only NetVar arguments: a layer passed to a function and an RNN layer's h0
    # argument got gradients, but no optimizer over vars updated them (and h0 was not saved)
    net = _ffns_with_modules()[case]
    assert [id(p) for p in net.vars] == [id(p) for p in net.named_vars().values()]
    x = np.random.default_rng(0).standard_normal((2, 1, 3)) if "entry" in case else \
        np.random.default_rng(0).standard_normal((1, 3))
    net(nn.NetVar(x, requires_grad=False)).sum().back()
    before = [p.data.copy() for p in net.vars]
    nn.GD(net.vars, lr=0.1, momentum=0.0).step()
    assert all(not np.array_equal(p.data, b) for p, b in zip(net.vars, before))
    assert all(p._g is None for p in net.named_vars().values())


def test_a_model_entrys_argument_is_saved_and_loaded(tmp_path):
    net = _ffns_with_modules()["model entry with an argument"]
    h0 = net.topology[0][2]
    assert "topology.0.2" in net.named_vars()
    h0.data = h0.data + 1.0
    nn.save(tmp_path / "net.npz", net)
    fresh = _ffns_with_modules()["model entry with an argument"]
    nn.load(tmp_path / "net.npz", fresh)
    np.testing.assert_array_equal(fresh.topology[0][2].data, h0.data)
