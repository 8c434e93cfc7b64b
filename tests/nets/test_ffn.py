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
