"""sequence_mask and Attention. Gradients are checked in float64 against finite differences;
values, gradients and second derivatives against PyTorch (scaled_dot_product_attention with a
boolean mask). SoftMax and LogSoftmax are tested with the activations (test_activation.py),
Einsum in test_einsum.py."""
import tracemalloc

import numpy as np
import pytest

import nnkit as nn
from tests.conftest import var64
from tests.ops.helpers import assert_matches_pytorch, assert_same_hvp, keep_mask


# ----------------------------------------------------------------------------- sequence_mask

def test_sequence_mask_values_and_layouts():
    lengths = np.array([2, 0, 3, 1])
    mask = nn.sequence_mask(lengths, 3)
    assert mask.dtype == bool and mask.shape == (3, 4)
    np.testing.assert_array_equal(mask, np.arange(3)[:, None] < lengths[None, :])
    batch_first = nn.sequence_mask(lengths, 3, time_major=False)
    np.testing.assert_array_equal(batch_first, mask.T)
    np.testing.assert_array_equal(nn.sequence_mask([2, 0, 3, 1], 3), mask)
    np.testing.assert_array_equal(nn.sequence_mask(nn.NetVar(lengths), 3), mask)   # (1, 4) floats
    np.testing.assert_array_equal(nn.sequence_mask(lengths[:, None], 3), mask)
    assert nn.sequence_mask(np.zeros(0, dtype=int), 3).shape == (3, 0)
    assert nn.sequence_mask([0, 0], 0).shape == (0, 2)


def test_sequence_mask_follows_the_device_of_lengths(backend):
    mask = nn.sequence_mask(backend.array([2, 4, 1]), 4, time_major=False)
    assert nn.backend.array_module(mask) is backend.xp
    np.testing.assert_array_equal(backend.host(mask), np.arange(4)[None, :] < [[2], [4], [1]])


@pytest.mark.parametrize("lengths,T,time_major,error,message", [
    ([1, 4], 3, True, ValueError, r"lengths must be integers in \[0, 3\] \(the steps\), got 4"),
    ([-1, 2], 3, True, ValueError, r"lengths must be integers in \[0, 3\].*got -1"),
    ([1.5, 2], 3, True, ValueError, r"lengths must be integers in \[0, 3\].*got 1.5"),
    ([np.nan, 2], 3, True, ValueError, r"lengths must be integers in \[0, 3\].*got nan"),
    ([True, False], 3, True, TypeError, r"lengths must be integers, got bool values"),
    (["1", "2"], 3, True, TypeError, r"lengths must be integers, got <U1 values"),
    (np.ones((2, 2), dtype=int), 3, True, ValueError,
     r"lengths of shape \(2, 2\) must be one axis \(B,\) of sequence lengths"),
    ([1, 2], 3.0, True, TypeError, r"T must be an integer >= 0, got float 3.0"),
    ([1, 2], -1, True, ValueError, r"T must be an integer >= 0, got -1"),
    ([1, 2], 3, "no", TypeError, r"time_major must be True or False, got str 'no'"),
], ids=["above-T", "negative", "fraction", "nan", "bool", "str", "two-axes", "T-float",
        "T-negative", "time_major-str"])
def test_sequence_mask_refuses_bad_lengths(lengths, T, time_major, error, message):
    with pytest.raises(error, match="^sequence_mask: " + message):
        nn.sequence_mask(lengths, T, time_major)


def test_losses_still_take_lengths(rng):
    p, t = var64(rng, 3, 2, 4), var64(rng, 3, 2, 4)
    mask = nn.sequence_mask([3, 1], 3)
    assert nn.MSELoss(p, t, lengths=np.array([3, 1])).item() == pytest.approx(
        nn.MSELoss(p, t, mask=mask).item())
    with pytest.raises(TypeError, match=r"MSELoss: lengths must be integers, got bool"):
        nn.MSELoss(p, t, lengths=np.array([True, False]))


# ----------------------------------------------------------------------------- Attention

def attention_reference(q, k, v, mask=None, causal=False, scale=None):
    """Attention in NumPy, written out (fully masked rows give 0)."""
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = scale * q @ np.swapaxes(k, -1, -2)
    keep = np.ones(s.shape[-2:], dtype=bool)
    if causal:
        keep = np.tri(*s.shape[-2:], dtype=bool)
    if mask is not None:
        keep = keep & mask
    keep = np.broadcast_to(keep, s.shape)
    s = np.where(keep, s, -np.inf)
    top = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0))
    total = e.sum(axis=-1, keepdims=True)
    return (e / np.where(total == 0, 1, total)) @ v


def ragged_self_attention_mask(lengths, T):
    """Key padding from sequence_mask, (B, 1, 1, T): broadcast over heads and queries."""
    return nn.sequence_mask(lengths, T, time_major=False)[:, None, None, :]


@pytest.mark.parametrize("shapes,options", [
    (((3, 4), (5, 4), (5, 2)), {}),
    (((2, 3, 4), (2, 5, 4), (2, 5, 3)), {"scale": 0.7}),
    (((1, 1), (1, 1), (1, 1)), {}),
    (((1, 1), (1, 1), (1, 1)), {"causal": True}),
    (((2, 1, 3, 4), (1, 2, 3, 4), (1, 2, 3, 2)), {}),        # broadcast batch axes
    (((2, 3, 4), (5, 4), (1, 5, 2)), {}),                     # k without batch axes
    (((4, 4), (4, 4), (4, 3)), {"causal": True}),
    (((3, 4), (5, 4), (5, 2)), {"causal": True}),             # Tq < Tk
    (((5, 4), (3, 4), (3, 2)), {"causal": True}),             # Tq > Tk
])
def test_attention_gradcheck(shapes, options, rng):
    q, k, v = (var64(rng, *s) for s in shapes)
    y = nn.Attention(q, k, v, **options)
    np.testing.assert_allclose(y.data, attention_reference(q.data, k.data, v.data, **options),
                               rtol=1e-12, atol=1e-14)
    assert nn.gradcheck(lambda a, b, c: nn.Attention(a, b, c, **options), q, k, v)


def test_attention_gradcheck_with_masks_and_fully_masked_rows(rng):
    q, k, v = var64(rng, 2, 4, 3), var64(rng, 2, 5, 3), var64(rng, 2, 5, 2)
    mask = keep_mask(rng, (2, 4, 5))
    mask[0, 1] = False                              # query 1 of batch 0 attends to nothing
    y = nn.Attention(q, k, v, mask=mask)
    np.testing.assert_allclose(y.data, attention_reference(q.data, k.data, v.data, mask),
                               rtol=1e-12, atol=1e-14)
    assert np.all(y.data[0, 1] == 0)
    assert nn.gradcheck(lambda a, b, c: nn.Attention(a, b, c, mask=mask), q, k, v)
    for broadcast in (mask[:1], mask[:, :1], mask[0, 0]):         # (1, Tq, Tk), (B, 1, Tk), (Tk,)
        assert nn.gradcheck(lambda a, b, c: nn.Attention(a, b, c, mask=broadcast), q, k, v)


def test_attention_mask_with_leading_axes_only_the_values_have(rng):
    # q and k shared by a batch of values, a mask per value: the scores were (Tq, Tk) and
    # softmax failed with NumPy's "non-broadcastable output operand"
    q, k, v = var64(rng, 3, 4), var64(rng, 5, 4), var64(rng, 2, 5, 6)
    mask = keep_mask(rng, (2, 3, 5))
    y = nn.Attention(q, k, v, mask=mask)
    wide = nn.NetVar(np.broadcast_to(q.data, (2, 3, 4)).copy())
    np.testing.assert_array_equal(y.data, nn.Attention(wide, k, v, mask=mask).data)
    np.testing.assert_allclose(y.data, attention_reference(wide.data, k.data, v.data, mask),
                               rtol=1e-12, atol=1e-14)
    assert nn.gradcheck(lambda a, b, c: nn.Attention(a, b, c, mask=mask), q, k, v)
    assert nn.gradgradcheck(lambda a, b, c: nn.Attention(a, b, c, mask=mask), q, k, v)


def test_attention_explains_a_node_made_from_a_boolean_mask(rng):
    q = var64(rng, 2, 3)
    with pytest.raises(TypeError, match=r"a NetVar made from a boolean array holds floats .*"
                                        r"NetVar\(mask, dtype=bool\)"):
        nn.Attention(q, q, q, mask=nn.NetVar(np.array([[True, False], [True, True]])))
    mask = nn.NetVar(np.array([[True, False], [True, True]]), dtype=bool)
    assert nn.Attention(q, q, q, mask=mask).shape == (2, 3)


def test_attention_causal_with_ragged_lengths_gradcheck(rng):
    B, H, T, d = 3, 2, 4, 3
    lengths = np.array([4, 2, 0])                   # the last sequence is empty: no key at all
    q, k, v = var64(rng, B, H, T, d), var64(rng, B, H, T, d), var64(rng, B, 1, T, 2)
    mask = ragged_self_attention_mask(lengths, T)
    seed = rng.standard_normal((B, H, T, 2))
    with np.errstate(all="raise"):
        y = nn.Attention(q, k, v, mask=mask, causal=True)
        y.back(seed)
    np.testing.assert_allclose(
        y.data, attention_reference(q.data, k.data, v.data, mask, causal=True), atol=1e-14)
    assert np.all(y.data[2] == 0)
    for x in (q, k, v):
        assert np.isfinite(x.g).all()
    assert np.all(q.g[2] == 0) and np.all(k.g[2] == 0) and np.all(v.g[2] == 0)
    assert np.all(k.g[1, :, 2:] == 0) and np.all(v.g[1, :, 2:] == 0)    # padded keys
    assert nn.gradcheck(lambda a, b, c: nn.Attention(a, b, c, mask=mask, causal=True), q, k, v)


def test_attention_weights_sum_to_one_over_kept_keys(rng):
    q, k, v = var64(rng, 2, 5, 3), var64(rng, 2, 5, 3), var64(rng, 2, 5, 4)
    mask = keep_mask(rng, (2, 5, 5)) | np.eye(5, dtype=bool)
    y = nn.Attention(q, k, v, mask=mask, causal=True)
    keep = mask & np.tri(5, dtype=bool)
    assert np.all(y.weights[~keep] == 0)
    np.testing.assert_allclose(y.weights.sum(axis=-1), 1.0)
    np.testing.assert_allclose(y.data, y.weights @ v.data)


def sdpa_inputs(rng, batch, Tq, Tk, d, dv):
    return (rng.standard_normal(batch + (Tq, d)), rng.standard_normal(batch + (Tk, d)),
            rng.standard_normal(batch + (Tk, dv)))


@pytest.mark.parametrize("batch,Tq,Tk,options", [
    ((2, 3), 4, 6, {}),
    ((2, 3), 4, 6, {"mask": True}),
    ((2, 3), 5, 5, {"causal": True}),
    ((2,), 3, 6, {"causal": True}),                 # Tq < Tk: aligned at the start
    ((2,), 6, 3, {"causal": True}),                 # Tq > Tk
    ((2, 3), 5, 5, {"causal": True, "mask": True}),
    ((2, 3), 4, 6, {"mask": True, "scale": 0.3}),
    ((), 1, 1, {}),
])
def test_attention_matches_pytorch_sdpa(torch, batch, Tq, Tk, options, rng):
    F = torch.nn.functional
    q, k, v = sdpa_inputs(rng, batch, Tq, Tk, 4, 3)
    mask = None
    if options.get("mask"):
        mask = keep_mask(rng, batch[:1] + (1, Tq, Tk)[len(batch) == 1:], 0.6)
        mask[..., 0] = True                      # every query keeps key 0: no row fully masked
    causal, scale = options.get("causal", False), options.get("scale")
    torch_mask = None
    if mask is not None:
        torch_mask = torch.tensor(mask if not causal else mask & np.tri(Tq, Tk, dtype=bool))
    assert_matches_pytorch(
        torch, lambda a, b, c: nn.Attention(a, b, c, mask=mask, causal=causal, scale=scale),
        lambda a, b, c: F.scaled_dot_product_attention(
            a, b, c, attn_mask=torch_mask, is_causal=causal and mask is None, scale=scale),
        q, k, v, rng=rng, rtol=1e-10, atol=1e-12)


def test_attention_matches_pytorch_with_ragged_key_padding(torch, rng):
    F = torch.nn.functional
    B, H, T, d = 3, 2, 5, 4
    lengths = np.array([5, 3, 0])           # the last sequence: no key, every row masked
    q, k, v = sdpa_inputs(rng, (B, H), T, T, d, d)
    mask = ragged_self_attention_mask(lengths, T)
    assert_matches_pytorch(
        torch, lambda a, b, c: nn.Attention(a, b, c, mask=mask, causal=True),
        lambda a, b, c: F.scaled_dot_product_attention(
            a, b, c, attn_mask=torch.tensor(mask & np.tri(T, dtype=bool))),
        q, k, v, rng=rng, rtol=1e-10, atol=1e-12)


def test_attention_fully_masked_query_gives_zeros_as_pytorch_sdpa_does(torch, rng):
    """PyTorch's scaled_dot_product_attention gives such a row 0 and no gradient since 2.5 (a
    plain softmax of a row of −inf gives NaN, as PyTorch's SDPA did before)."""
    F = torch.nn.functional
    q, k, v = sdpa_inputs(rng, (2,), 3, 4, 2, 2)
    mask = keep_mask(rng, (2, 3, 4))
    mask[1, 2] = False
    mask[0, 0] = False
    nodes = assert_matches_pytorch(
        torch, lambda a, b, c: nn.Attention(a, b, c, mask=mask),
        lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=torch.tensor(mask)),
        q, k, v, rng=rng, rtol=1e-10, atol=1e-12)
    y = nn.Attention(*nodes, mask=mask)
    assert np.all(y.data[1, 2] == 0) and np.all(y.data[0, 0] == 0)
    assert np.all(nodes[0].g[1, 2] == 0) and np.all(nodes[0].g[0, 0] == 0)
    assert torch.isnan(torch.softmax(torch.full((1, 2), -torch.inf), dim=-1)).all()


def test_attention_keeps_only_its_weights(rng):
    assert nn.Attention.__slots__ == ("weights", "scale")
    B, T, d = 4, 64, 8
    q, k, v = (nn.NetVar(rng.standard_normal((B, T, d))) for _ in range(3))
    mask = ragged_self_attention_mask(np.array([64, 50, 20, 1]), T)[:, 0]

    def composed(a, b, c):
        s = nn.Einsum("bqd,bkd->bqk", a, b) * (1 / np.sqrt(d))
        return nn.Einsum("bqk,bkd->bqd", nn.SoftMax(s, mask=mask), c)

    def retained(build):
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            y = build(q, k, v)
            return y, tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()

    y, fused = retained(lambda a, b, c: nn.Attention(a, b, c, mask=mask, causal=True))
    weights = B * T * T * 8
    assert y.weights.shape == (B, T, T) and y.weights.nbytes == weights
    assert fused < weights + y.data.nbytes + 16_000
    _, small_ops = retained(composed)
    assert small_ops > 2.5 * weights                       # scores, scaled scores, weights


def test_attention_is_one_box_in_a_drawing(rng):
    q, k, v = var64(rng, 3, 2, name="q"), var64(rng, 4, 2, name="k"), var64(rng, 4, 5, name="v")
    source = nn.draw(nn.Attention(q, k, v, causal=True)).source
    labels = [line for line in source.splitlines() if 'label="' in line]
    assert len(labels) == 4 and sum("Attention" in line for line in labels) == 1
    assert source.count(" -> ") == 3 and "T=" not in source


def test_attention_takes_arrays_and_float32(rng):
    q = rng.standard_normal((3, 4)).astype(np.float32)
    k = nn.NetVar(rng.standard_normal((5, 4)).astype(np.float32))
    v = nn.NetVar(rng.standard_normal((5, 2)).astype(np.float32))
    y = nn.Attention(q, k, v)
    y.back()
    assert y.dtype == k.g.dtype == v.g.dtype == np.float32
    assert not y.parents[0].requires_grad


@pytest.mark.parametrize("make,error,message", [
    (lambda q, k, v: nn.Attention(q.data[0, 0], k, v), ValueError,
     r"Attention: q of shape \(4,\), k of shape \(2, 5, 4\) and v of shape \(2, 5, 3\): each "
     r"must have at least two axes"),
    (lambda q, k, v: nn.Attention(q, k[..., :3], v), ValueError,
     r"q of shape \(2, 3, 4\), k of shape \(2, 5, 3\) and v of shape \(2, 5, 3\): q and k "
     r"must have one size d on their last axis"),
    (lambda q, k, v: nn.Attention(q, k, v[:, :4]), ValueError,
     r"k and v must hold one number of keys Tk"),
    (lambda q, k, v: nn.Attention(q, k[:, :0], v[:, :0]), ValueError,
     r"there must be at least one key \(Tk > 0\) and d > 0"),
    (lambda q, k, v: nn.Attention(q[..., :0], k[..., :0], v), ValueError,
     r"there must be at least one key \(Tk > 0\) and d > 0"),
    (lambda q, k, v: nn.Attention(q, nn.Concat([k, k, k], axis=0), v), ValueError,
     r"k of shape \(6, 5, 4\) .*: their leading axes do not broadcast together"),
    (lambda q, k, v: nn.Attention(q, k, v, mask=np.ones((3, 5))), TypeError,
     r"Attention: mask of shape \(3, 5\) and dtype float64 must be boolean"),
    (lambda q, k, v: nn.Attention(q, k, v, mask=np.ones((3, 4), dtype=bool)), ValueError,
     r"Attention: mask of shape \(3, 4\) does not broadcast to the scores \(..., Tq, Tk\) = "
     r"\(2, 3, 5\) of q of shape \(2, 3, 4\)"),
    (lambda q, k, v: nn.Attention(q, k, v, mask=np.ones((4, 2, 3, 5), dtype=bool)), ValueError,
     r"Attention: mask of shape \(4, 2, 3, 5\) does not broadcast to the scores"),
    (lambda q, k, v: nn.Attention(q, k, v, causal=1), TypeError,
     r"Attention: causal must be True or False, got int 1"),
    (lambda q, k, v: nn.Attention(q, k, v, scale="0.5"), TypeError,
     r"Attention: scale must be a number, got str"),
    (lambda q, k, v: nn.Attention(q, k, v, scale=float("inf")), ValueError,
     r"Attention: scale must be finite, got inf"),
    (lambda q, k, v: nn.Attention([[1.0]], k, v), TypeError,
     r"Attention: q must be a NetVar or an array, got list"),
], ids=["q-one-axis", "d-differs", "Tk-differs", "no-key", "d-zero", "batch", "mask-float",
        "mask-shape", "mask-enlarges", "causal-int", "scale-str", "scale-inf", "q-list"])
def test_attention_refuses_bad_arguments(make, error, message, rng):
    q, k, v = var64(rng, 2, 3, 4), var64(rng, 2, 5, 4), var64(rng, 2, 5, 3)
    with pytest.raises(error, match=message):
        make(q, k, v)


# ----------------------------------------------------------------------------- Second derivatives
# Hessian-vector products (grad(create_graph=True)) against PyTorch's double backward in float64
# (test_gradgradcheck_every_op checks each op alone against finite differences): causal and
# padding masks, one node as q, k and v, a query with no key.

def _masked_attention(q, k, v, keep):
    import torch
    s = q @ k.transpose(-1, -2) / np.sqrt(q.shape[-1])
    return torch.softmax(s.masked_fill(~torch.tensor(keep), -torch.inf), dim=-1) @ v


def test_causal_attention_hvp_matches_torch(torch, rng):
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


def test_self_attention_over_a_layer_norm_read_three_times_matches_torch(torch, rng):
    """h is q, k and v at once, and read by an einsum too: four consumers of one node."""
    F = torch.nn.functional
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
