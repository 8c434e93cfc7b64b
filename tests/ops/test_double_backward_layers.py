"""Second derivatives of the layer ops (``grad(create_graph=True)``): Conv2D, the pools,
BatchNorm, LayerNorm, Embedding, Einsum and Attention, against PyTorch's double backward in
float64.

test_gradgradcheck_every_op checks each op alone against finite differences; these check
gradient penalties and Hessian-vector products through models built from them, the third
derivatives (the ops that Conv2D, the pools and Embedding build for their gradients are
differentiated again), padding rows and masks, and that BatchNorm's running statistics do not
move when its gradient graph is built.
"""
import numpy as np
import pytest

import nnkit as nn
from tests.ops.helpers import assert_same_hvp, hessian_vector_products

torch = pytest.importorskip("torch")
F = torch.nn.functional


def penalty_gradients(ours, theirs, arrays):
    """The gradient of the penalty ‖∂L/∂x‖² (x the first input) with respect to every input,
    L being ``ours(*nodes)`` and ``theirs(*tensors)``: (nnkit's list, PyTorch's list)."""
    nodes = [nn.NetVar(a) for a in arrays]
    tensors = [torch.tensor(a, requires_grad=True) for a in arrays]
    (dx,) = nn.grad(ours(*nodes), [nodes[0]], create_graph=True)
    mine = nn.grad((dx * dx).sum(), nodes)
    (dx,) = torch.autograd.grad(theirs(*tensors), [tensors[0]], create_graph=True)
    expected = torch.autograd.grad((dx * dx).sum(), tensors)
    return mine, [e.numpy() for e in expected]


# ----------------------------------------------------------------------------- convolution, pools

def test_gradient_penalty_through_conv_and_pools_matches_torch(rng):
    r = rng.standard_normal((2, 3, 3, 1))

    def ours(x, w, b):
        h = nn.Conv2D(x, w, b, stride=(1, 2), padding=1).tanh()                  # (2, 3, 5, 3)
        pooled = nn.AvgPool2D(h, 2, stride=1, padding=(1, 0), count_include_pad=False)
        return (nn.MaxPool2D(pooled, 3, 2, 1) ** 2 * r).sum()                    # (2, 3, 3, 1)

    def theirs(x, w, b):
        h = F.conv2d(x, w, b, stride=(1, 2), padding=1).tanh()
        pooled = F.avg_pool2d(h, 2, stride=1, padding=(1, 0), count_include_pad=False)
        return (F.max_pool2d(pooled, 3, 2, 1) ** 2 * torch.tensor(r)).sum()

    arrays = [rng.standard_normal((2, 2, 5, 5)), rng.standard_normal((3, 2, 3, 3)),
              rng.standard_normal(3)]
    mine, expected = penalty_gradients(ours, theirs, arrays)
    for m, e in zip(mine, expected):
        assert np.abs(e).max() > 1e-3
        np.testing.assert_allclose(m.reshape(e.shape), e, rtol=1e-9, atol=1e-12)


def test_conv_hvp_with_the_kernel_read_by_two_convs_matches_torch(rng):
    """w is read by two convolutions (and x by one of them and a square): the second
    derivatives mix x and w (the cross terms of the bilinear op)."""
    def ours(x, w):
        h = nn.Conv2D(x, w, stride=2)                                            # (1, 2, 3, 3)
        return (h * h).sum() + nn.Conv2D(h, w[:, :2], padding=1).sin().sum() + (x * x * x).sum()

    def theirs(x, w):
        h = F.conv2d(x, w, stride=2)
        return (h * h).sum() + F.conv2d(h, w[:, :2], padding=1).sin().sum() + (x * x * x).sum()

    assert_same_hvp(ours, theirs, [rng.standard_normal((1, 3, 7, 7)),
                                   rng.standard_normal((2, 3, 3, 3))], rng)


def test_third_derivatives_through_conv_and_pool_gradients(rng):
    """The gradients of Conv2D and the pools are ops of their own (linear in each input);
    differentiating them twice more exercises their own backward rules."""
    x, w, g, h = (nn.NetVar(rng.standard_normal(shape)) for shape in
                  ((1, 1, 4, 4), (2, 1, 3, 3), (1, 2, 2, 2), (1, 1, 2, 2)))

    def conv_gradients(x, w, g):
        dx, dw = nn.grad(nn.Conv2D(x, w, padding=1, stride=2), [x, w], g=g, create_graph=True)
        return nn.Concat([dx.reshape(1, -1), dw.reshape(1, -1)], axis=1)

    assert nn.gradgradcheck(conv_gradients, x, w, g)

    def pool_gradients(x, g):
        y = nn.MaxPool2D(x, 3, 2, 1) * nn.AvgPool2D(x, 3, 2, 1, count_include_pad=False)
        return nn.grad(y, [x], g=g, create_graph=True)[0]

    assert nn.gradgradcheck(pool_gradients, x, h)


def test_max_pool_gradient_is_the_upstream_gradient_routed(rng):
    """y is piecewise linear in x: its gradient depends on g alone (a constant routing to each
    window's maximum), so with a constant g it is a constant, and its derivative with respect to
    g picks each window's maximum."""
    x = nn.NetVar(rng.standard_normal((1, 1, 4, 4)))
    (dx,) = nn.grad(nn.MaxPool2D(x, 2), [x], g=rng.standard_normal((1, 1, 2, 2)),
                    create_graph=True)
    assert not dx.requires_grad
    g = nn.NetVar(rng.standard_normal((1, 1, 2, 2)))
    (dx,) = nn.grad(nn.MaxPool2D(x, 2), [x], g=g, create_graph=True)
    v = rng.standard_normal((1, 1, 4, 4))
    windows = x.data.reshape(2, 2, 2, 2).transpose(0, 2, 1, 3).reshape(2, 2, 4)
    picked = np.take_along_axis(v.reshape(2, 2, 2, 2).transpose(0, 2, 1, 3).reshape(2, 2, 4),
                                windows.argmax(axis=2)[..., None], axis=2)
    np.testing.assert_array_equal(nn.grad((dx * v).sum(), [g])[0], picked.reshape(g.shape))


# ----------------------------------------------------------------------------- normalisation

def test_layer_norm_hvp_matches_torch(rng):
    r = rng.standard_normal((2, 3, 5))

    def ours(x, gamma, beta):
        return (nn.LayerNorm(x, gamma, beta).tanh() * r).sum()

    def theirs(x, gamma, beta):
        return (F.layer_norm(x, (5,), gamma, beta).tanh() * torch.tensor(r)).sum()

    assert_same_hvp(ours, theirs, [rng.standard_normal((2, 3, 5)), rng.standard_normal(5),
                                   rng.standard_normal(5)], rng)


def test_batch_norm_training_hvp_matches_torch(rng):
    r = rng.standard_normal((3, 2, 2, 3))

    def ours(x, gamma, beta):
        return (nn.BatchNorm(x, gamma, beta, nn.BatchNormState(2)) ** 3 * r).sum()

    def theirs(x, gamma, beta):
        y = F.batch_norm(x, None, None, gamma, beta, training=True, eps=1e-5)
        return (y ** 3 * torch.tensor(r)).sum()

    assert_same_hvp(ours, theirs, [rng.standard_normal((3, 2, 2, 3)), rng.standard_normal(2),
                                   rng.standard_normal(2)], rng)


def test_batch_norm_evaluation_uses_the_running_statistics_as_constants(rng):
    """In evaluation y is affine in x: the only second derivatives are the x–γ cross terms
    (and those of the cube), with the running statistics as constants."""
    state = nn.BatchNormState(3, eps=1e-3)
    state.running_mean = rng.standard_normal(3)
    state.running_var = np.abs(rng.standard_normal(3)) + 0.5
    mean, var = torch.tensor(state.running_mean), torch.tensor(state.running_var)
    r = rng.standard_normal((4, 3))

    def ours(x, gamma, beta):
        with nn.eval_mode():
            return (nn.BatchNorm(x, gamma, beta, state) ** 3 * r).sum()

    def theirs(x, gamma, beta):
        y = F.batch_norm(x, mean, var, gamma, beta, training=False, eps=1e-3)
        return (y ** 3 * torch.tensor(r)).sum()

    assert_same_hvp(ours, theirs, [rng.standard_normal((4, 3)), rng.standard_normal(3),
                                   rng.standard_normal(3)], rng)
    np.testing.assert_array_equal(state.running_mean, mean.numpy())     # never updated
    assert state.num_batches_tracked == 0


def test_batch_norm_statistics_do_not_move_when_its_gradients_are_differentiated(rng):
    state = nn.BatchNormState(2, momentum=0.3)
    x, gamma = nn.NetVar(rng.standard_normal((4, 2, 3))), nn.NetVar(rng.standard_normal(2))
    y = nn.BatchNorm(x, gamma, None, state)                 # the one update
    after_forward = state.running_mean.copy(), state.running_var.copy()
    assert state.num_batches_tracked == 1
    dx, dgamma = nn.grad((y * y * y).sum(), [x, gamma], create_graph=True)
    (dx.sum() + (dgamma * dgamma).sum()).back()
    assert np.abs(x.g).max() > 1e-3
    np.testing.assert_array_equal(state.running_mean, after_forward[0])
    np.testing.assert_array_equal(state.running_var, after_forward[1])
    assert state.num_batches_tracked == 1


def test_batch_norm_gradients_follow_the_mode_it_was_built_in(rng):
    """A node built in training keeps normalising with its batch statistics when its
    gradients are built under eval_mode() (and the reverse)."""
    data, v = rng.standard_normal((5, 2)), rng.standard_normal((5, 2))
    state = nn.BatchNormState(2)
    for training in (True, False):
        found = []
        for grad_in_eval in (False, True):
            x = nn.NetVar(data)
            with nn.train_mode(training):
                y = nn.BatchNorm(x, None, None, state)
            with nn.train_mode(not grad_in_eval):
                (dx,) = nn.grad((y * y * y).sum(), [x], create_graph=True)
            found.append(nn.grad((dx * v).sum(), [x])[0])
        np.testing.assert_array_equal(found[0], found[1])


# ----------------------------------------------------------------------------- embedding

def test_embedding_hvp_with_padding_matches_torch(rng):
    tokens = np.array([[0, 2, 3], [2, 2, 1]])              # row 2 is the padding, read 3 times

    def ours(table):
        rows = nn.Embedding(tokens, table, padding_idx=2)
        return (rows * rows * rows).sum() + nn.Embedding(tokens[:, 2:], table).exp().sum()

    def theirs(table):
        rows = F.embedding(torch.tensor(tokens), table, padding_idx=2)
        return (rows ** 3).sum() + F.embedding(torch.tensor(tokens[:, 2:]), table).exp().sum()

    table = rng.standard_normal((5, 3))
    assert_same_hvp(ours, theirs, [table], rng)
    directions = [rng.standard_normal(table.shape)]
    mine, _ = hessian_vector_products(ours, theirs, [table], directions)
    assert not np.any(mine[0][2]) and not np.any(mine[0][4])  # padding row; an unused row


def test_embedding_padding_row_gets_exactly_nothing_at_every_order(rng):
    tokens = np.array([1, 2, 2, 0])
    table = nn.NetVar(rng.standard_normal((3, 4)))
    g = nn.NetVar(rng.standard_normal((4, 4)))
    y = nn.Embedding(tokens, table, padding_idx=-1)        # row 2
    np.testing.assert_array_equal(y.data[1], table.data[2])  # the value is the row itself
    (dtable,) = nn.grad(y * y, [table], g=g, create_graph=True)
    assert not np.any(dtable.data[2])
    v = rng.standard_normal((3, 4))
    dt, dg = nn.grad((dtable * v).sum(), [table, g])
    assert not np.any(dt[2]) and not np.any(dg[1:3])       # padding lookups: nothing, not g·v
    np.testing.assert_allclose(dg[[0, 3]], 2 * table.data[[1, 0]] * v[[1, 0]], rtol=1e-12)
    np.testing.assert_allclose(dt[[0, 1]], 2 * g.data[[3, 0]] * v[[0, 1]], rtol=1e-12)

    def table_gradient(table, g):
        rows = nn.Embedding(tokens, table, padding_idx=2)
        return nn.grad(rows * rows, [table], g=g, create_graph=True)[0]

    assert nn.gradgradcheck(table_gradient, table, g)     # third derivatives


# ----------------------------------------------------------------------------- einsum, attention

def test_einsum_hvp_with_diagonals_broadcasting_and_a_0d_operand_matches_torch(rng):
    def ours(x, y, z, c):
        t = nn.Einsum("ii->i", x) * nn.Einsum("ij,jk,kl->il", x, y, z).sum(1)     # (3,)
        batched = nn.Einsum("...ij,...jk->...ik", y.reshape(1, 3, 2),                # (2, 3, 1)
                            z.reshape(2, 2, 1) * x[:2, :2].reshape(2, 2, 1))
        s = nn.Einsum(",i->", c.reshape(()), t.sin())                              # 0-d
        return s * nn.Einsum("ii", x) + (batched * batched).sum()

    def theirs(x, y, z, c):
        t = torch.einsum("ii->i", x) * torch.einsum("ij,jk,kl->il", x, y, z).sum(1)
        batched = torch.einsum("...ij,...jk->...ik", y.reshape(1, 3, 2),
                               z.reshape(2, 2, 1) * x[:2, :2].reshape(2, 2, 1))
        s = torch.einsum(",i->", c.reshape(()), t.sin())
        return s * torch.einsum("ii", x) + (batched * batched).sum()

    assert_same_hvp(ours, theirs, [rng.standard_normal((3, 3)), rng.standard_normal((3, 2)),
                                   rng.standard_normal((2, 2)), rng.standard_normal((1, 1))],
                    rng)


def _masked_attention(q, k, v, keep):
    s = q @ k.transpose(-1, -2) / np.sqrt(q.shape[-1])
    return torch.softmax(s.masked_fill(~torch.tensor(keep), -torch.inf), dim=-1) @ v


def test_causal_attention_hvp_matches_torch(rng):
    lengths = np.array([4, 2])
    padding = nn.sequence_mask(lengths, 4, time_major=False)[:, None, :]    # (2, 1, 4)
    keep = padding & np.tri(4, dtype=bool)
    r = rng.standard_normal((2, 4, 3))

    def ours(q, k, v):
        return (nn.Attention(q, k, v, mask=padding, causal=True).tanh() * r).sum()

    def theirs(q, k, v):
        return (_masked_attention(q, k, v, keep).tanh() * torch.tensor(r)).sum()

    assert_same_hvp(ours, theirs, [rng.standard_normal((2, 4, 2)),
                                   rng.standard_normal((2, 4, 2)),
                                   rng.standard_normal((1, 4, 3))], rng)


def test_self_attention_over_a_layer_norm_read_three_times_matches_torch(rng):
    """h is q, k and v at once, and read by an einsum too: four consumers of one node."""
    keep = np.array([[True, True, False], [True, True, True], [False, True, True]])

    def ours(x, gamma):
        h = nn.LayerNorm(x, gamma)
        y = nn.Attention(h, h, h, mask=keep, scale=0.7)
        return (y * y).sum() + nn.Einsum("ij,ij->", h, x)

    def theirs(x, gamma):
        h = F.layer_norm(x, (4,), gamma)
        s = torch.softmax((h @ h.T * 0.7).masked_fill(~torch.tensor(keep), -torch.inf), -1)
        y = s @ h
        return (y * y).sum() + torch.einsum("ij,ij->", h, x)

    assert_same_hvp(ours, theirs, [rng.standard_normal((3, 4)), rng.standard_normal(4)], rng)


def test_attention_query_with_no_key_gets_no_gradient_at_any_order(rng):
    keep = np.array([[True, True], [False, False], [True, False]])
    q, k, v = (nn.NetVar(rng.standard_normal(shape)) for shape in ((3, 2), (2, 2), (2, 3)))
    y = nn.Attention(q, k, v, mask=keep)
    dq, dk, dv = nn.grad((y * y * y).sum(), [q, k, v], create_graph=True)
    assert not np.any(dq.data[1])
    second = nn.grad((dq * dq).sum() + (dk * dv[:, :2]).sum(), [q, k, v])
    assert not np.any(second[0][1])                        # the empty query's row
    assert all(np.abs(s).max() > 1e-3 for s in second)
    assert nn.gradgradcheck(lambda q, k, v: nn.Attention(q, k, v, mask=keep), q, k, v)
