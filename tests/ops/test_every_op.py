"""Every public op of nnkit, gradchecked in float64 on each backend (NumPy, and CuPy on a GPU).

One table lists, per op, a function building it from NetVars and the input shapes (several per
op, broadcast shapes and edge cases included). On CuPy each case is also compared with the
same case on NumPy, so a GPU-only bug in a forward value shows even where the gradient is
consistent with it. ``test_the_table_covers_every_public_op`` keeps the table complete: a new
op needs a row here (docs/contributing.md). On a GPU machine docs/gpu.md runs this file with
tests/gpu/.
"""
import numpy as np
import pytest

import nnkit as nn
from nnkit import ops


class Pos(tuple):
    """An input shape whose data is positive (|N(0, 1)| + 0.5): logs, roots, divisors."""


class Case:
    def __init__(self, name, f, *shapes, same_value=True):
        self.name, self.f, self.shapes, self.same_value = name, f, shapes, same_value

    def inputs(self, backend, seed):
        rng = np.random.default_rng(seed)
        return [backend.var64(rng, *shape, positive=isinstance(shape, Pos))
                for shape in self.shapes]


def _dropout(b, x):
    nn.seed(7)      # the same mask at every evaluation, so finite differences are meaningful
    return nn.Dropout(x, 0.3)


def _recurrent(kind, final=None, lengths=(3, 1)):
    def build(b, x, W, R, bias, h0):
        op = getattr(nn, kind)(x, W, R, bias, h0, lengths=np.array(lengths))
        return op if final is None else getattr(op, final)
    return build


C = Case
P = Pos
def _embedding_with_padding(b, t):
    """Embedding with padding_idx 2, a row that is picked, so the op's padding path runs on
    the device. That row is held constant in the table fed to the op (its gradient is zero by
    design, not by calculus); tests/ops/test_embedding.py checks that it gets exactly none."""
    keep = b.array([[1.0], [1.0], [0.0], [1.0]])
    table = t * keep + b.array(np.full((4, 3), 0.5)) * (1 - keep)
    return nn.Embedding(np.array([[0, 2], [2, 3]]), table, padding_idx=2)


# The mask of the masked softmax cases (along axis 0): column 1 keeps nothing.
_KEEP = np.array([[True, False, True, True],
                  [True, False, False, True],
                  [False, False, True, True]])


CASES = [
    # arithmetic
    C("Multiply", lambda b, x, w: nn.Multiply(x, w), (3, 4), (4, 2)),
    C("Multiply", lambda b, x, w: nn.Multiply(x, w), (1, 4), (4, 3)),
    C("Add", lambda b, x, y: nn.Add(x, y), (3, 4), (1, 4)),
    C("Add", lambda b, x, y: nn.Add(x, y), (2, 3, 4), (3, 1)),
    C("Sub", lambda b, x, y: nn.Sub(x, y), (3, 4), (3, 4)),
    C("Sub", lambda b, x, y: nn.Sub(x, y), (3, 1), (1, 4)),
    C("Mul", lambda b, x, y: nn.Mul(x, y), (3, 4), (3, 1)),
    C("Div", lambda b, x, y: nn.Div(x, y), (3, 4), P((1, 4))),
    C("Mul", lambda b, x: x * 2.5 + 0.5 * x - x / 4.0 + np.full((1, 4), 0.3) * x, (3, 4)),
    C("RSub", lambda b, x, y: nn.RSub(x, y), (3, 1), (1, 4)),
    C("RSub", lambda b, x: 2.5 - x - np.arange(4.0) + (1 - x) * x, (3, 4)),
    C("RDiv", lambda b, x, y: nn.RDiv(x, y), P((3, 4)), (1, 4)),
    C("RDiv", lambda b, x: 3.0 / x + np.arange(1.0, 5.0) / x * (2 / x), P((3, 4))),
    C("Neg", lambda b, x: nn.Neg(x), (2, 5)),
    C("Pow", lambda b, x: nn.Pow(x, 3), (3, 4)),
    C("Pow", lambda b, x: nn.Pow(x, 0.5), P((3, 4))),
    C("Exp", lambda b, x: nn.Exp(x), (3, 4)),
    C("Log", lambda b, x: nn.Log(x), P((3, 4))),
    # reductions
    C("Sum", lambda b, x: nn.Sum(x), (3, 4)),
    C("Sum", lambda b, x: nn.Sum(x, axis=1, keepdims=True), (2, 3, 4)),
    C("Mean", lambda b, x: nn.Mean(x, axis=0), (3, 4)),
    C("Max", lambda b, x: nn.Max(x, axis=1), (3, 4)),
    C("Min", lambda b, x: nn.Min(x), (3, 4)),
    C("LogSumExp", lambda b, x: nn.LogSumExp(x, axis=-1), (3, 4)),
    C("Var", lambda b, x: nn.Var(x, axis=0, ddof=1), (4, 3)),
    C("Norm", lambda b, x: nn.Norm(x, axis=1), (3, 4)),
    # shapes and indexing
    C("Reshape", lambda b, x: nn.Reshape(x, 4, 3), (3, 4)),
    C("Transpose", lambda b, x: nn.Transpose(x, (1, 0, 2)), (2, 3, 4)),
    C("AsType", lambda b, x: nn.AsType(x * x, np.float64) * nn.AsType(x, "float64"), (3, 4)),
    C("Flatten", lambda b, x: nn.Flatten(x), (2, 3, 4)),
    C("GetItem", lambda b, x: nn.GetItem(x, b.array([0, 2, 2])), (3, 4)),
    C("GetItem", lambda b, x: nn.GetItem(x, (slice(None, None, -1), 1)), (3, 4)),
    C("GetItem", lambda b, x: nn.GetItem(x, b.array([[True, False, True, False]] * 3)),
      (3, 4)),
    C("Concat", lambda b, x, y: nn.Concat([x, y], axis=1), (3, 2), (3, 4)),
    C("Stack", lambda b, x, y: nn.Stack([x, y], axis=1), (3, 4), (3, 4)),
    C("Split", lambda b, x: nn.Mul(*nn.Split(x, 2, axis=1)), (3, 4)),
    C("Pad", lambda b, x: nn.Pad(x, ((1, 0), (0, 2)), value=0.5), (3, 4)),
    C("Broadcast", lambda b, x: nn.Broadcast(x, (2, 3, 4)), (1, 4)),
    # elementwise math
    C("Sqrt", lambda b, x: nn.Sqrt(x), P((3, 4))),
    C("Abs", lambda b, x: nn.Abs(x), (3, 4)),
    C("Clip", lambda b, x: nn.Clip(x, -0.5, 0.7), (3, 4)),
    C("Where", lambda b, x, y: nn.Where(b.array([[True, False, True, True]]), x, y),
      (3, 4), (3, 1)),
    C("Maximum", lambda b, x, y: nn.Maximum(x, y), (3, 4), (1, 4)),
    C("Minimum", lambda b, x, y: nn.Minimum(x, y), (3, 4), (3, 4)),
    C("Sin", lambda b, x: nn.Sin(x), (3, 4)),
    C("Cos", lambda b, x: nn.Cos(x), (3, 4)),
    # activations
    C("ReLU", lambda b, x: nn.ReLU(x), (3, 4)),
    C("LReLU", lambda b, x: nn.LReLU(x, 0.1), (3, 4)),
    C("Sigmoid", lambda b, x: nn.Sigmoid(x), (3, 4)),
    C("Tanh", lambda b, x: nn.Tanh(x), (2, 3, 4)),
    C("SoftMax", lambda b, x: nn.SoftMax(x), (3, 4)),
    C("Softmax", lambda b, x: nn.Softmax(x), (2, 3, 4)),
    C("LogSoftmax", lambda b, x: nn.LogSoftmax(x), (3, 4)),
    C("SoftMax", lambda b, x: nn.SoftMax(x, axis=0, mask=b.array(_KEEP)), (3, 4)),
    C("LogSoftmax", lambda b, x: nn.Where(b.array(_KEEP), nn.LogSoftmax(x, 0, b.array(_KEEP)),
                                          0.0), (3, 4)),
    C("ELU", lambda b, x: nn.ELU(x, 0.7), (3, 4)),
    C("SELU", lambda b, x: nn.SELU(x), (3, 4)),
    C("Softplus", lambda b, x: nn.Softplus(x), (3, 4)),
    C("GELU", lambda b, x: nn.GELU(x), (3, 4)),
    C("SiLU", lambda b, x: nn.SiLU(x), (3, 4)),
    C("Swish", lambda b, x: nn.Swish(x), (3, 4)),
    C("HardTanh", lambda b, x: nn.HardTanh(x, -0.8, 0.6), (3, 4)),
    # losses
    C("L1Loss", lambda b, p, t: nn.L1Loss(p, t), (3, 4), (3, 4)),
    C("L2Loss", lambda b, p, t: nn.L2Loss(p, t), (3, 4), (3, 4)),
    C("HuberLoss", lambda b, p, t: nn.HuberLoss(p, t, 0.5), (3, 4), (3, 4)),
    C("CELoss", lambda b, p, t: nn.CELoss(nn.Softmax(p), nn.Softmax(t)), (3, 4), (3, 4)),
    C("MSELoss", lambda b, p, t: nn.MSELoss(p, t), (3, 4), (3, 4)),
    C("MSELoss", lambda b, p, t: nn.MSELoss(p, t, lengths=np.array([4, 2, 3])),
      (4, 3, 2), (4, 3, 2)),
    C("SoftmaxCELoss", lambda b, z: nn.SoftmaxCELoss(z, b.array([0, 2, 1], dtype=np.int64)),
      (3, 4)),
    C("SoftmaxCELoss", lambda b, z: nn.SoftmaxCELoss(
        z, b.array([[0, 2, 1], [3, 3, 0]], dtype=np.int64), lengths=np.array([2, 1, 2]),
        weight=b.array([1.0, 2.0, 0.5, 1.5])), (2, 3, 4)),
    C("SoftmaxCELoss", lambda b, z, t: nn.SoftmaxCELoss(z, nn.Softmax(t)), (3, 4), (3, 4)),
    C("NLLLoss", lambda b, z: nn.NLLLoss(nn.LogSoftmax(z), b.array([1, 0, 3], dtype=np.int64),
                                         ignore_index=0), (3, 4)),
    C("SigmoidCELoss", lambda b, z, t: nn.SigmoidCELoss(z, nn.Sigmoid(t)), (3, 4), (3, 4)),
    C("KLDivLoss", lambda b, x, t: nn.KLDivLoss(nn.LogSoftmax(x), nn.Softmax(t)),
      (3, 4), (3, 4)),
    C("KLDivLoss", lambda b, x, t: nn.KLDivLoss(nn.LogSoftmax(x), nn.LogSoftmax(t),
                                                log_target=True), (3, 4), (3, 4)),
    C("CosineSimilarity", lambda b, x, y: nn.CosineSimilarity(x, y), (3, 4), (1, 4)),
    # regularization and normalization
    C("Dropout", _dropout, (4, 5), same_value=False),
    C("L2Reg", lambda b, x, w: nn.L2Reg(nn.Sum(nn.Multiply(x, w)), [w], 0.1, batch_size=3),
      (3, 4), (4, 2)),
    C("BatchNorm", lambda b, x, g, s: nn.BatchNorm(x, g, s, nn.BatchNormState(3)),
      (6, 3), (3,), (3,)),
    C("BatchNorm", lambda b, x: nn.BatchNorm(x, None, None, nn.BatchNormState(2)),
      (3, 2, 3, 3)),
    C("LayerNorm", lambda b, x, g, s: nn.LayerNorm(x, g, s), (3, 4), (4,), (4,)),
    C("Embedding", lambda b, t: nn.Embedding(np.array([[0, 2], [1, 2]]), t), (4, 3)),
    C("Embedding", _embedding_with_padding, (4, 3)),
    # convolution and pooling
    C("Conv2D", lambda b, x, w, c: nn.Conv2D(x, w, c, padding=1), (2, 2, 4, 4), (3, 2, 3, 3),
      (3,)),
    C("Conv2D", lambda b, x, w: nn.Conv2D(x, w, stride=2), (1, 2, 5, 5), (2, 2, 3, 3)),
    C("MaxPool2D", lambda b, x: nn.MaxPool2D(x, 2), (1, 2, 4, 4)),
    C("MaxPool2D", lambda b, x: nn.MaxPool2D(x, 3, 2, 1), (1, 2, 5, 5)),
    C("AvgPool2D", lambda b, x: nn.AvgPool2D(x, 2, stride=1), (1, 2, 3, 3)),
    C("AvgPool2D", lambda b, x: nn.AvgPool2D(x, 3, 1, (1, 0), False), (1, 2, 4, 4)),
    # recurrent
    C("RNN", _recurrent("RNN"), (3, 2, 2), (2, 3), (3, 3), (3,), (2, 3)),
    C("LSTM", _recurrent("LSTM", lengths=(2, 3)), (3, 2, 2), (2, 12), (3, 12), (12,),
      (1, 3)),
    C("GRU", _recurrent("GRU"), (3, 2, 2), (2, 9), (3, 9), (2, 9), (2, 3)),
    C("RecurrentState", _recurrent("GRU", final="final"), (3, 2, 2), (2, 9), (3, 9), (2, 9),
      (2, 3)),
    C("RecurrentState", _recurrent("LSTM", final="final_c"), (3, 2, 2), (2, 12), (3, 12),
      (12,), (2, 3)),
    C("RNNCell", lambda b, x, h, W, R, c: nn.RNNCell(x, h, W, R, c), (2, 2), (2, 3), (2, 3),
      (3, 3), (3,)),
    C("LSTMCell", lambda b, x, h, W, R, c: nn.Mul(*nn.LSTMCell(x, h, h, W, R, c)),
      (2, 2), (2, 3), (2, 12), (3, 12), (12,)),
    C("GRUCell", lambda b, x, h, W, R, c: nn.GRUCell(x, h, W, R, c), (2, 2), (2, 3), (2, 9),
      (3, 9), (2, 9)),
    # einsum and attention
    C("Einsum", lambda b, x, w: nn.Einsum("ij,jk->ik", x, w), (3, 4), (4, 2)),
    C("Einsum", lambda b, x, w: nn.Einsum("...ij,...jk->...ik", x, w), (1, 3, 4), (2, 4, 2)),
    C("Einsum", lambda b, x, y: nn.Einsum("ii->i", x) * nn.Einsum("ij->i", y), (3, 3), (3, 2)),
    C("Einsum", lambda b, x, y, z: nn.Einsum("ij,jk,kl->il", x, y, z), (2, 3), (3, 4), (4, 2)),
    C("Attention", lambda b, q, k, v: nn.Attention(q, k, v), (3, 4), (5, 4), (5, 2)),
    C("Attention", lambda b, q, k, v: nn.Attention(
        q, k, v, mask=nn.sequence_mask(b.array([4, 2, 0]), 4, time_major=False)[:, None, :],
        causal=True), (3, 4, 2), (3, 4, 2), (1, 4, 3)),
]

# Public names that are not differentiable ops, each checked by its own test below.
NOT_GRADCHECKED = {
    "Loss": "the losses' base class",
    "BatchNormState": "running statistics, not an op (see the BatchNorm cases)",
    "ArgMax": "integer output (test_argmax_and_sequence_mask_values)",
    "sequence_mask": "a mask builder (test_argmax_and_sequence_mask_values)",
}


def test_the_table_covers_every_public_op():
    covered = {case.name for case in CASES} | set(NOT_GRADCHECKED)
    missing = sorted(set(ops.__all__) - covered)
    assert not missing, f"add gradcheck cases for {missing}"
    assert not covered - set(ops.__all__), "the table names ops nnkit does not export"


@pytest.mark.parametrize("case", CASES, ids=[f"{c.name}-{i}" for i, c in enumerate(CASES)])
def test_gradcheck_every_op(case, backend):
    inputs = case.inputs(backend, seed=len(case.name))
    assert nn.gradcheck(lambda *xs: case.f(backend, *xs), *inputs)
    out = case.f(backend, *inputs)
    assert nn.backend.array_module(out.data) is backend.xp, "the result left the device"
    assert out.dtype == np.float64
    if backend.gpu and case.same_value:
        from tests.conftest import Backend
        host = Backend("numpy")
        expected = case.f(host, *case.inputs(host, seed=len(case.name)))
        np.testing.assert_allclose(backend.host(out), expected.data, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("case", CASES, ids=[f"{c.name}-{i}" for i, c in enumerate(CASES)])
def test_gradgradcheck_every_op(case, backend):
    """Second derivatives against finite differences of the first: every op of the catalogue
    can be differentiated twice (docs/contributing.md, "Higher-order gradients")."""
    inputs = case.inputs(backend, seed=len(case.name))
    assert nn.gradgradcheck(lambda *xs: case.f(backend, *xs), *inputs)


def test_argmax_and_sequence_mask_values(backend, rng):
    data = rng.standard_normal((3, 5))
    y = nn.ArgMax(backend.var(data), axis=1)
    np.testing.assert_array_equal(backend.host(y).reshape(-1), data.argmax(axis=1))
    mask = nn.sequence_mask(backend.array([2, 4, 1]), 4)
    assert nn.backend.array_module(mask) is backend.xp
    np.testing.assert_array_equal(backend.host(mask),
                                  np.arange(4)[:, None] < np.array([2, 4, 1])[None, :])


@pytest.mark.parametrize("case", CASES, ids=[f"{c.name}-{i}" for i, c in enumerate(CASES)])
def test_every_op_replays_as_eager(case, backend):
    """The op contract's part for ``nn.capture`` (docs/contributing.md, "Capture"): an op
    computes with array operations on its parents' data, so a recorded forward and backward
    replayed on other inputs of the same shapes gives eager's bits: the value and each
    input's gradient."""
    if case.f is _dropout:
        pytest.skip("seeds the generator inside the step, a Python side effect")

    def step(seed, *arrays):
        xs = [nn.NetVar(a) for a in arrays]
        out = case.f(backend, *xs)
        out.back(seed)
        return [out] + [x.g for x in xs]

    captured = nn.capture(step)
    for trial in range(4):
        arrays = [x.data for x in case.inputs(backend, len(case.name) + trial)]
        shape = case.f(backend, *[nn.NetVar(a) for a in arrays]).shape
        seed = backend.array(np.random.default_rng(trial).standard_normal(shape))
        eager, replayed = step(seed, *arrays), captured(seed, *arrays)
        for a, b in zip(eager, replayed):
            np.testing.assert_array_equal(backend.host(a) if hasattr(a, "_data") else a,
                                          backend.host(b) if hasattr(b, "_data") else b)
    assert captured.replays >= 2, captured
