"""Hostile input: one row per bad call, with the exception type it must raise and a regex of the
message (naming the op or function, the argument and the shapes). After every failed call the
model's parameters, their gradients and edit stamps are exactly as before.

Rows call ``case(m)`` with ``m`` a small trained-once model (an FFN with its optimizer, recurrent,
embedding, convolution and normalisation parameters), so that calls that could touch a model do
so with the real one.
"""
import types

import numpy as np
import pytest

import nnkit as nn
from nnkit import backend
from tests.reliability.helpers import assert_unchanged, leaf, snapshot


def V(*shape):
    return nn.NetVar(np.random.default_rng(len(shape)).standard_normal(shape))


def grad_free(*shape):
    return nn.NetVar(np.ones(shape), requires_grad=False)


@pytest.fixture
def m(tmp_path):
    nn.seed(0)
    w, b = nn.glorot(3, 2), nn.zeros(2)
    net = nn.FFN((nn.Multiply, w), (nn.Add, b), (nn.Tanh,))
    model = types.SimpleNamespace(
        net=net, opt=nn.Adam(net.vars, lr=0.1), x=grad_free(4, 3),
        W=nn.glorot(3, 4), R=nn.orthogonal(4, 4), bias=nn.zeros(4), table=nn.glorot(5, 3),
        kernel=nn.he(2, 1, 3, 3), gamma=nn.NetVar(np.ones(3)), bn=nn.BatchNormState(3),
        idle=nn.zeros(2, 2), tmp=tmp_path)
    nn.Sum(net(model.x)).back()                                  # parameters hold gradients
    nn.Sum(nn.RNN(V(5, 2, 3), model.W, model.R, model.bias)).back()
    nn.Sum(nn.Embedding(np.array([0, 4]), model.table)).back()
    model.params = net.vars + [model.W, model.R, model.bias, model.table, model.kernel,
                               model.gamma, model.idle]
    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint")
    model.text = str(text)
    np.savez(tmp_path / "arrays.npz", a=np.ones(3))
    model.npz = str(tmp_path / "arrays.npz")
    other = nn.FFN((nn.Multiply, nn.glorot(3, 5)), (nn.Add, nn.zeros(5)), (nn.Tanh,))
    model.other = nn.save(str(tmp_path / "other.npz"), other)
    return model


def _no_grad_node(m):
    with nn.no_grad():
        return nn.Tanh(m.net(m.x))


class _Device:
    id = 1


class FakeGPUArray(np.ndarray):
    """Stands for an array on a second device: NumPy refuses to compute with it."""
    device = _Device()

    def __array_ufunc__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed")

    def __array_function__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed")


@pytest.fixture
def second_device(monkeypatch):
    """Make FakeGPUArray look like a GPU array to nnkit's backend (no GPU needed)."""
    device_of, array_module = backend.device_of, backend.array_module
    fake_module = types.SimpleNamespace(name="fake gpu module")
    monkeypatch.setattr(backend, "device_of", lambda a: "gpu:1" if isinstance(a, FakeGPUArray)
                        else device_of(a))
    monkeypatch.setattr(backend, "array_module", lambda a: fake_module if isinstance(
        a, FakeGPUArray) else array_module(a))


def on_gpu(*shape):
    node = nn.NetVar(np.ones(shape))
    node._data = np.ones(shape).view(FakeGPUArray)       # as node.to_gpu() would leave it
    return node


SHAPES = r"\(\d+(, \d+)*\)"

CASES = [
    # -- NetVar, constant, dtype
    ("NetVar of objects", lambda m: nn.NetVar(np.array([object()])), TypeError,
     r"NetVar: cannot hold an array of dtype object"),
    ("NetVar of a string", lambda m: nn.NetVar("abc"), TypeError,
     r"NetVar: cannot make a numeric array from str"),
    ("NetVar of None", lambda m: nn.NetVar(None), TypeError, r"NetVar: data is None"),
    ("NetVar ragged list", lambda m: nn.NetVar([[1, 2], [3]]), TypeError,
     r"NetVar: cannot make a numeric array from list"),
    ("NetVar dtype=str", lambda m: nn.NetVar([1.0], dtype=str), TypeError,
     r"NetVar: dtype must be a number type"),
    ("constant of objects", lambda m: nn.constant(np.array([None, 1])), TypeError,
     r"constant: cannot hold an array of dtype object"),
    ("set_dtype(int)", lambda m: nn.set_dtype(int), TypeError,
     r"set_dtype: nnkit's default dtype must be a float type"),
    ("item() of many", lambda m: m.W.item(), ValueError,
     r"item\(\): NetVar #\d+ of shape \(3, 4\)"),
    ("truth value", lambda m: bool(m.W), TypeError, r"truth value of NetVar #\d+ .* ambiguous"),
    ("to_gpu without CuPy", lambda m: nn.NetVar([1.0]).to_gpu() if not nn.gpu_available()
     else pytest.skip("a GPU is present"), RuntimeError, r"to_gpu\(\): CuPy"),
    # -- back()
    ("back() under no_grad", lambda m: _no_grad_node(m).back(), RuntimeError,
     r"back\(\): Tanh #\d+ of shape \(4, 2\) does not require a gradient .*no_grad"),
    ("back() of a constant", lambda m: (m.x * 2.0).back(), RuntimeError,
     r"back\(\): Mul #\d+ .* does not require a gradient"),
    ("back() seed shape", lambda m: m.net(m.x).back(np.ones(3)), ValueError,
     r"back\(\): the seed gradient of Tanh #\d+ of shape \(4, 2\): the gradient must have the "
     r"node's shape \(4, 2\), got \(3,\)"),
    ("FFN.back() before a call", lambda m: nn.FFN((nn.ReLU,)).back(), RuntimeError,
     r"FFN.back\(\): call the network on an input first"),
    # -- arithmetic, shapes, ranks
    ("Add broadcast", lambda m: m.W + V(3, 5), ValueError,
     r"Add: cannot broadcast \(3, 4\) with \(3, 5\)"),
    ("Multiply 1-D", lambda m: nn.Multiply(leaf([1.0, 2.0, 3.0]), m.W), ValueError,
     r"Multiply: operands must be at least 2-D, got \(3,\) and \(3, 4\)"),
    ("Multiply inner sizes", lambda m: m.W @ m.W, ValueError,
     r"Multiply: cannot multiply \(3, 4\) by \(3, 4\)"),
    ("Pow exponent node", lambda m: nn.Pow(m.W, m.R), TypeError, r"Pow: the exponent must be a "),
    ("Reshape", lambda m: nn.Reshape(m.W, 5, 2), ValueError,
     r"Reshape: cannot reshape \(3, 4\) into \(5, 2\)"),
    ("Transpose axes", lambda m: nn.Transpose(m.W, (0, 0)), ValueError,
     r"Transpose: axes \(0, 0\) are not a permutation"),
    ("Flatten span", lambda m: nn.Flatten(m.kernel, start=3, end=1), ValueError,
     r"Flatten: axes 3..1 do not span x of shape \(2, 1, 3, 3\)"),
    ("Broadcast", lambda m: nn.Broadcast(m.W, (2, 4)), ValueError,
     r"Broadcast: cannot broadcast x of shape \(3, 4\) to \(2, 4\)"),
    ("Concat nothing", lambda m: nn.Concat([]), TypeError, r"Concat: give a non-empty list"),
    ("Concat shapes", lambda m: nn.Concat([m.W, m.R], axis=1), ValueError,
     r"Concat: input 1 of shape \(4, 4\) does not match input 0 of shape \(3, 4\) outside "
     r"axis 1"),
    ("Stack shapes", lambda m: nn.Stack([m.W, m.R]), ValueError,
     r"Stack: input 1 of shape \(4, 4\) differs from input 0 of shape \(3, 4\)"),
    ("Split uneven", lambda m: nn.Split(m.W, 2), ValueError,
     r"Split: cannot split axis 0 of length 3 of x of shape \(3, 4\) into 2 equal parts"),
    ("GetItem out of range", lambda m: m.W[7], IndexError,
     r"GetItem: cannot index x of shape \(3, 4\) with 7"),
    ("Pad negative", lambda m: nn.Pad(m.W, -1), ValueError, r"Pad: pad_width -1 has a negative"),
    ("Where shapes", lambda m: nn.Where(np.ones((4, 4), bool), m.W, m.W), ValueError,
     r"Where: cannot broadcast cond of shape \(4, 4\), a of shape \(3, 4\)"),
    ("Maximum shapes", lambda m: nn.Maximum(m.W, m.R), ValueError,
     r"Maximum: cannot broadcast a of shape \(3, 4\) with b of shape \(4, 4\)"),
    ("Clip bounds", lambda m: nn.Clip(m.W, 1, -1), ValueError,
     r"Clip: the lower bound 1 exceeds the upper bound -1"),
    # -- reductions (empty arrays, axes)
    ("Sum axis range", lambda m: nn.Sum(m.W, axis=2), ValueError,
     r"Sum: axis 2 is out of range for an input of 2 dimensions"),
    ("Sum axis float", lambda m: nn.Sum(m.W, axis=1.5), TypeError,
     r"Sum: axis must be an int, a tuple of ints or None, got 1.5"),
    ("Mean of empty", lambda m: nn.Mean(V(0, 3)), ValueError,
     r"Mean: x of shape \(0, 3\) has no element along the reduced axes \(0, 1\)"),
    ("Max of empty", lambda m: nn.Max(V(0, 3), axis=0), ValueError,
     r"Max: axis 0 of x of shape \(0, 3\) has no values"),
    ("Min of empty", lambda m: nn.Min(V(0, 3)), ValueError,
     r"Min: axis 0 of x of shape \(0, 3\) has no values"),
    ("ArgMax of empty", lambda m: nn.ArgMax(V(0, 3), axis=0), ValueError,
     r"ArgMax: x of shape \(0, 3\) has no element"),
    ("LogSumExp of empty", lambda m: nn.LogSumExp(V(0, 3), axis=0), ValueError,
     r"LogSumExp: x of shape \(0, 3\) has no element"),
    ("Var no dof", lambda m: nn.Var(V(1, 3), axis=0, ddof=1), ValueError,
     r"Var: 1 values over axes \(0,\) of x of shape \(1, 3\) leave no degrees of freedom"),
    # -- activations
    ("SoftMax empty row", lambda m: nn.SoftMax(V(3, 0)), ValueError,
     r"SoftMax: x of shape \(3, 0\) has an empty last axis"),
    ("LogSoftmax empty row", lambda m: nn.LogSoftmax(V(3, 0)), ValueError,
     r"LogSoftmax: x of shape \(3, 0\) has an empty last axis"),
    ("SoftMax float mask", lambda m: nn.SoftMax(m.W, mask=np.ones((3, 4))), TypeError,
     r"SoftMax: mask of shape \(3, 4\) and dtype float64 must be boolean \(True = keep\)"),
    ("LogSoftmax mask shape", lambda m: nn.LogSoftmax(m.W, mask=np.ones((4, 3), bool)),
     ValueError, r"LogSoftmax: mask of shape \(4, 3\) does not broadcast to x of shape "
                 r"\(3, 4\)"),
    ("SoftMax axis", lambda m: nn.SoftMax(m.W, axis=2), ValueError,
     r"SoftMax: axis 2 is out of range for x of shape \(3, 4\)"),
    # -- einsum and attention
    ("Einsum sizes", lambda m: nn.Einsum("ij,jk->ik", m.W, m.table), ValueError,
     r"Einsum: subscripts 'ij,jk->ik' with operands of shapes \(\(3, 4\), \(5, 3\)\): "
     r"index 'j' has size 4 in operand 0"),
    ("Einsum output", lambda m: nn.Einsum("ij->ik", m.W), ValueError,
     r"Einsum: subscripts 'ij->ik' .*: the output names 'k', which no operand has"),
    ("Attention d", lambda m: nn.Attention(m.W, m.table, m.table), ValueError,
     r"Attention: q of shape \(3, 4\), k of shape \(5, 3\) and v of shape \(5, 3\): q and "
     r"k must have one size d"),
    ("Attention float mask", lambda m: nn.Attention(m.table, m.table, m.table,
                                                    mask=np.ones((5, 5))), TypeError,
     r"Attention: mask of shape \(5, 5\) and dtype float64 must be boolean"),
    ("Attention causal", lambda m: nn.Attention(m.table, m.table, m.table, causal="yes"),
     TypeError, r"Attention: causal must be True or False, got str 'yes'"),
    ("sequence_mask lengths", lambda m: nn.sequence_mask([1, 6], 5), ValueError,
     r"sequence_mask: lengths must be integers in \[0, 5\]"),
    ("LReLU slope", lambda m: nn.LReLU(m.W, "steep"), TypeError,
     r"LReLU: the slope s must be a number, got str"),
    ("ELU alpha NaN", lambda m: nn.ELU(m.W, alpha=float("nan")), ValueError,
     r"ELU: alpha must be finite, got nan"),
    ("HardTanh bounds", lambda m: nn.HardTanh(m.W, lo=1, hi=-1), ValueError,
     r"HardTanh: lo \(1\) must be below hi \(-1\)"),
    ("Dropout p", lambda m: nn.Dropout(m.W, 1.5), ValueError, r"Dropout: p must be in \[0, 1\)"),
    ("Dropout p NaN", lambda m: nn.Dropout(m.W, float("nan")), ValueError,
     r"Dropout: p must be finite, got nan"),
    # -- convolution and pooling
    ("Conv2D rank", lambda m: nn.Conv2D(V(1, 5, 5), m.kernel), ValueError,
     r"Conv2D: x must be \(N, C, H, W\), got shape \(1, 5, 5\)"),
    ("Conv2D channels", lambda m: nn.Conv2D(V(1, 2, 5, 5), m.kernel), ValueError,
     r"Conv2D: w of shape \(2, 1, 3, 3\) expects 1 input channels, x of shape \(1, 2, 5, 5\)"),
    ("Conv2D window", lambda m: nn.Conv2D(V(1, 1, 2, 2), m.kernel), ValueError,
     r"Conv2D: a 3×3 window does not fit an input of spatial size 2×2"),
    ("Conv2D stride", lambda m: nn.Conv2D(V(1, 1, 5, 5), m.kernel, stride=0), ValueError,
     r"Conv2D: stride must be an int or a pair of ints ≥ 1, got 0"),
    ("Conv2D empty batch", lambda m: nn.Conv2D(V(0, 1, 5, 5), m.kernel), ValueError,
     r"Conv2D: x of shape \(0, 1, 5, 5\) has no sample or no channel"),
    ("MaxPool2D rank", lambda m: nn.MaxPool2D(V(4, 4), 2), ValueError,
     r"MaxPool2D: x must be \(N, C, H, W\), got shape \(4, 4\)"),
    ("AvgPool2D size", lambda m: nn.AvgPool2D(V(1, 1, 4, 4), 0), ValueError,
     r"AvgPool2D: size must be an int or a pair of ints ≥ 1, got 0"),
    # -- normalisation
    ("BatchNorm one sample", lambda m: nn.BatchNorm(V(1, 3), m.gamma, None, m.bn), ValueError,
     r"BatchNorm: training needs more than one value per feature, x has shape \(1, 3\)"),
    ("BatchNorm gamma", lambda m: nn.BatchNorm(V(4, 5), m.gamma, None, nn.BatchNormState(5)),
     ValueError, r"BatchNorm: gamma of shape \(1, 3\) does not match the 5 features"),
    ("BatchNorm state", lambda m: nn.BatchNorm(V(4, 5), None, None, m.bn), ValueError,
     r"BatchNorm: x of shape \(4, 5\) needs \(B, 3, ...\) for a state of 3 features"),
    ("BatchNorm no state", lambda m: nn.BatchNorm(V(4, 3), m.gamma, None, None), TypeError,
     r"BatchNorm: state must be a BatchNormState, got NoneType"),
    ("LayerNorm gamma", lambda m: nn.LayerNorm(V(4, 5), m.gamma), ValueError,
     r"LayerNorm: gamma of shape \(1, 3\) does not match the 5 features"),
    ("LayerNorm empty", lambda m: nn.LayerNorm(V(4, 0)), ValueError,
     r"LayerNorm: x of shape \(4, 0\) has no last axis to normalise"),
    ("BatchNormState size", lambda m: nn.BatchNormState(0), ValueError,
     r"BatchNormState: features must be a positive int, got 0"),
    # -- embedding
    ("Embedding float ids", lambda m: nn.Embedding(np.array([0.5]), m.table), TypeError,
     r"Embedding: indices must have an integer dtype, got float64"),
    ("Embedding object ids", lambda m: nn.Embedding(np.array([0, None]), m.table), TypeError,
     r"Embedding: indices must have an integer dtype, got object"),
    ("Embedding range", lambda m: nn.Embedding(np.array([0, 9]), m.table), ValueError,
     r"Embedding: index 9 is out of range for a table of 5 rows"),
    ("Embedding negative", lambda m: nn.Embedding(np.array([-1]), m.table), ValueError,
     r"Embedding: index -1 is out of range"),
    ("Embedding table rank", lambda m: nn.Embedding(np.array([0]), leaf([1.0, 2.0])), ValueError,
     r"Embedding: table must be \(V, D\), got shape \(2,\)"),
    # -- recurrent layers: ranks, zero-length sequences, lengths
    ("RNN rank", lambda m: nn.RNN(V(5, 3), m.W, m.R, m.bias), ValueError,
     r"RNN: x of shape \(5, 3\) must be 3-D \(T, B, F\)"),
    ("RNN no steps", lambda m: nn.RNN(V(0, 2, 3), m.W, m.R, m.bias), ValueError,
     r"RNN: x of shape \(0, 2, 3\) holds no step \(T = 0\)"),
    ("RNN zero length", lambda m: nn.RNN(V(5, 2, 3), m.W, m.R, m.bias, lengths=[0, 3]),
     ValueError, r"RNN: lengths must lie in 1..T = 1..5 .* got min 0"),
    ("RNN length > T", lambda m: nn.RNN(V(5, 2, 3), m.W, m.R, m.bias, lengths=[6, 3]),
     ValueError, r"RNN: lengths must lie in 1..T = 1..5 .* max 6"),
    ("RNN lengths count", lambda m: nn.RNN(V(5, 2, 3), m.W, m.R, m.bias, lengths=[5]),
     ValueError, r"RNN: lengths of shape \(1,\) must be \(B,\) = \(2,\)"),
    ("RNN float lengths", lambda m: nn.RNN(V(5, 2, 3), m.W, m.R, m.bias, lengths=[2.5, 3]),
     ValueError, r"RNN: lengths must be integers"),
    ("RNN W rows", lambda m: nn.RNN(V(5, 2, 2), m.W, m.R, m.bias), ValueError,
     r"RNN: W of shape \(3, 4\) must be \(F, 1·H\) = \(2, 4\)"),
    ("RNN h0", lambda m: nn.RNN(V(5, 2, 3), m.W, m.R, m.bias, h0=V(3, 4)), ValueError,
     r"RNN: h0 of shape \(3, 4\) must be \(B, H\) = \(2, 4\) or \(1, 4\)"),
    ("RNN activation", lambda m: nn.RNN(V(5, 2, 3), m.W, m.R, m.bias, activation="cube"),
     ValueError, r"RNN: activation must be one of"),
    ("LSTM R", lambda m: nn.LSTM(V(5, 2, 3), m.W, m.R, m.bias), ValueError,
     r"LSTM: R of shape \(4, 4\) must be \(H, 4·H\)"),
    ("GRU b", lambda m: nn.GRU(V(5, 2, 3), V(3, 12), V(4, 12), V(12)), ValueError,
     r"GRU: b of shape \(1, 12\) must be \(2, 12\) for H = 4"),
    ("RNNCell h", lambda m: nn.RNNCell(V(2, 3), V(2, 5), m.W, m.R, m.bias), ValueError,
     r"RNNCell: h of shape \(2, 5\) must be \(B, H\) = \(2, 4\) or \(1, 4\)"),
    ("LSTMCell R", lambda m: nn.LSTMCell(V(2, 3), V(2, 4), V(2, 4), m.W, m.R, m.bias),
     ValueError, r"LSTMCell: R of shape \(4, 4\) must be \(H, 4·H\)"),
    ("GRUCell W", lambda m: nn.GRUCell(V(2, 3), V(2, 4), V(5, 12), V(4, 12), V(2, 12)),
     ValueError, r"GRUCell: W of shape \(5, 12\) must be \(F, 3·H\) = \(3, 12\)"),
    ("RecurrentState of a leaf", lambda m: nn.RecurrentState(m.W), TypeError,
     r"RecurrentState: op must be an RNN, LSTM or GRU node, got NetVar"),
    ("recurrent_weights size", lambda m: nn.recurrent_weights("lstm", 0, 4), ValueError,
     r"recurrent_weights: inputs must be a positive integer, got 0"),
    ("recurrent_weights cell", lambda m: nn.recurrent_weights("xyz", 3, 4), ValueError,
     r"recurrent_weights: cell must be one of"),
    ("SequenceModel cell", lambda m: nn.SequenceModel(3, 4, 2, cell="xyz"), ValueError,
     r"SequenceModel: cell must be one of"),
    # -- losses
    ("L2Loss shapes", lambda m: nn.L2Loss(m.net(m.x), V(2, 4)), ValueError,
     r"L2Loss: prediction of shape \(4, 2\) and target of shape \(2, 4\) differ"),
    ("CELoss string target", lambda m: nn.CELoss(m.net(m.x), "abc"), TypeError,
     r"constant: cannot make a numeric array from str"),
    ("HuberLoss d", lambda m: nn.HuberLoss(m.W, m.W, d=-1), ValueError,
     r"HuberLoss: the threshold d must be > 0, got -1"),
    ("SoftmaxCELoss class", lambda m: nn.SoftmaxCELoss(m.W, np.array([0, 1, 4])), ValueError,
     r"SoftmaxCELoss: class index 4 is out of range for 4 classes"),
    ("SoftmaxCELoss count", lambda m: nn.SoftmaxCELoss(m.W, np.array([0])), ValueError,
     r"SoftmaxCELoss: class indices of shape \(1,\) do not match logits of shape \(3, 4\)"),
    ("SoftmaxCELoss float labels", lambda m: nn.SoftmaxCELoss(m.W, np.array([0.0, 1.0, 2.0])),
     ValueError, r"SoftmaxCELoss: target probabilities of shape \(3,\) do not match logits .*"
                 r"integer dtype"),
    ("NLLLoss float labels", lambda m: nn.NLLLoss(m.W, np.array([0.5, 1.0, 2.0])), ValueError,
     r"NLLLoss: targets must be class indices of an integer dtype, got float64"),
    ("KLDivLoss reduction", lambda m: nn.KLDivLoss(m.W, m.W, reduction="avg"), ValueError,
     r"KLDivLoss: reduction must be one of"),
    ("SigmoidCELoss shapes", lambda m: nn.SigmoidCELoss(m.W, V(4, 3)), ValueError,
     r"SigmoidCELoss: prediction of shape \(3, 4\) and target of shape \(4, 3\) differ"),
    ("MSELoss mask", lambda m: nn.MSELoss(m.W, m.W, mask=np.ones(5)), ValueError,
     r"MSELoss: mask of shape \(5,\) does not match the positions \(3,\)"),
    ("L2Reg rate", lambda m: nn.L2Reg(nn.Sum(m.W), [m.W], -1.0), ValueError,
     r"L2Reg: the rate r must be >= 0, got -1.0"),
    ("L2Reg loss shape", lambda m: nn.L2Reg(m.W, [m.W], 0.1), ValueError,
     r"L2Reg: loss must hold one value, got shape \(3, 4\)"),
    ("CosineSimilarity", lambda m: nn.CosineSimilarity(m.W, m.R), ValueError,
     r"CosineSimilarity: cannot broadcast a of shape \(3, 4\) with b of shape \(4, 4\)"),
    # -- optimizers, modifiers, schedules
    ("step without gradients", lambda m: nn.GD([m.idle]).step(), RuntimeError,
     r"GD.step\(\): no parameter has a gradient; call back\(\) on the loss before step\(\)"),
    ("Adam step without gradients", lambda m: nn.Adam([m.idle]).step(), RuntimeError,
     r"Adam.step\(\): no parameter has a gradient"),
    ("optimizer of one NetVar", lambda m: nn.GD(m.W), TypeError,
     r"GD: params must be a list of NetVars, got one NetVar \(NetVar #\d+ of shape \(3, 4\)\)"),
    ("optimizer of an op result", lambda m: nn.Adam([m.W * 2.0]), TypeError,
     r"Adam: parameter 0 \(Mul #\d+ of shape \(3, 4\)\) is computed by an op"),
    ("optimizer of an array", lambda m: nn.GD([m.W.data]), TypeError,
     r"GD: parameter 0 is a ndarray, not a NetVar"),
    ("optimizer of int data", lambda m: nn.GD([nn.NetVar([1, 2], dtype=int)]), TypeError,
     r"GD: parameter 0 has dtype int64; parameters must be float arrays"),
    ("optimizer listed twice", lambda m: nn.GD([m.W, m.W]), ValueError,
     r"GD: parameter 1 \(NetVar #\d+ of shape \(3, 4\)\) is listed twice"),
    ("learning rate NaN", lambda m: nn.GD(m.net.vars, lr=float("nan")), ValueError,
     r"GD: learning rate must be finite, got nan"),
    ("momentum 1", lambda m: nn.GD(m.net.vars, momentum=1.0), ValueError,
     r"GD: momentum must be in \[0, 1\), got 1.0"),
    ("Adam rms", lambda m: nn.Adam(m.net.vars, rms=1.5), ValueError,
     r"Adam: rms must be in \[0, 1\), got 1.5"),
    ("AdamW decay", lambda m: nn.AdamW(m.net.vars, weight_decay=-1), ValueError,
     r"AdamW: weight_decay must be >= 0, got -1"),
    ("Freeze of one NetVar", lambda m: nn.Freeze(m.W), TypeError,
     r"Freeze: params must be a list of NetVars, got one NetVar"),
    ("ClipValue of an array", lambda m: nn.ClipValue(1.0, params=[m.W.data]), TypeError,
     r"ClipValue: parameter 0 is a ndarray, not a NetVar"),
    ("ClipGradNorm", lambda m: nn.ClipGradNorm(-1), ValueError,
     r"ClipGradNorm: max_norm must be > 0, got -1"),
    ("StepLR", lambda m: nn.StepLR(m.opt, 0), ValueError,
     r"StepLR: step_size must be a positive integer, got 0"),
    ("ExponentialLR NaN", lambda m: nn.ExponentialLR(m.opt, float("nan")), ValueError,
     r"ExponentialLR: gamma must be finite, got nan"),
    ("ReduceOnPlateau", lambda m: nn.ReduceOnPlateau(m.opt, factor=2), ValueError,
     r"ReduceOnPlateau: factor must be in \[0, 1\), got 2"),
    # -- initializers
    ("initializer float size", lambda m: nn.glorot(2.5, 3), TypeError,
     r"glorot_uniform: shape must be positive integers, got \(2.5, 3\)"),
    ("initializer NaN size", lambda m: nn.he(float("nan"), 3), TypeError,
     r"he_normal: shape must be positive integers, got \(nan, 3\)"),
    ("initializer zero size", lambda m: nn.rand2(0, 3), ValueError,
     r"rand2: shape must be positive integers, got \(0, 3\)"),
    ("gaussian std", lambda m: nn.gaussian(2, 3, std=-1), ValueError,
     r"gaussian: std must be >= 0, got -1"),
    # -- data
    ("pad_sequences nothing", lambda m: nn.pad_sequences([]), ValueError,
     r"pad_sequences: no sequences given"),
    ("pad_sequences zero-length", lambda m: nn.pad_sequences([[1, 2], []]), ValueError,
     r"pad_sequences: sequence 1 is empty \(shape \(0,\)\)"),
    ("pad_sequences features", lambda m: nn.pad_sequences([np.ones((2, 3)), np.ones((2, 4))]),
     ValueError, r"pad_sequences: sequence 1 has steps of shape \(4,\), sequence 0 has \(3,\)"),
    ("pad_sequences objects", lambda m: nn.pad_sequences([np.array([None, 1])]), TypeError,
     r"pad_sequences: sequence 0 has dtype object"),
    ("minibatches size", lambda m: list(nn.minibatches([[1, 2]], batch_size=0)), ValueError,
     r"minibatches: batch_size must be a positive integer, got 0"),
    ("minibatches targets", lambda m: list(nn.minibatches([[1, 2], [3]], targets=[1])),
     ValueError, r"minibatches: 1 targets for 2 sequences"),
    # -- files
    ("load a text file", lambda m: nn.load(m.text, model=m.net, optimizer=m.opt),
     nn.CheckpointError, r"load: '.*notes.txt' is truncated or corrupted"),
    ("load plain arrays", lambda m: nn.load(m.npz, model=m.net), nn.CheckpointError,
     r"load: '.*arrays.npz' is not an nnkit checkpoint"),
    ("load another model", lambda m: nn.load(m.other, model=m.net, optimizer=m.opt),
     nn.CheckpointError, r"load: '.*other.npz' does not match the model: parameter '.*' is "
                         r"float32 \(3, 5\) in the file, float32 \(3, 2\) in the model"),
    ("load a directory", lambda m: nn.load(str(m.tmp)), nn.CheckpointError,
     r"load: '.*' is truncated or corrupted"),
    ("load a missing file", lambda m: nn.load(str(m.tmp / "none.npz"), model=m.net),
     FileNotFoundError, r"load: no checkpoint at '.*none.npz'"),
    ("save into a missing folder", lambda m: nn.save(str(m.tmp / "no" / "x.npz"), m.net),
     FileNotFoundError, r"save: the directory '.*no' does not exist"),
    ("save a number", lambda m: nn.save(str(m.tmp / "x.npz"), 42), TypeError,
     r"save: the model must be a Module \(an FFN, .*\), or a dict or list of parameters "
     r"\(NetVars\) and Modules, got int 42"),
    # -- networks, training
    ("FFN entry", lambda m: nn.FFN((1, 2)), TypeError,
     r"FFN: topology entry 0 starts with 1, which is not an op class"),
    ("FFN input width", lambda m: m.net(np.ones((2, 4))), ValueError,
     r"FFN: topology entry 0 \(Multiply\): Multiply: cannot multiply \(2, 4\) by \(3, 2\)"),
    ("Trainer step_fn", lambda m: nn.Trainer(42, m.opt), TypeError,
     r"Trainer: step_fn must be callable, got int"),
    ("Trainer optimizer", lambda m: nn.Trainer(lambda batch: None, 42), TypeError,
     r"Trainer: optimizer must be an nnkit optimizer, got int"),
    ("fit no epochs", lambda m: nn.Trainer(lambda b: None, m.opt).fit([], epochs=0), ValueError,
     r"Trainer.fit: epochs must be a positive integer, got 0"),
    ("fit no batches", lambda m: nn.Trainer(lambda b: nn.Sum(m.net(m.x)), m.opt).fit([]),
     ValueError, r"Trainer.fit: train_batches holds no batches"),
    ("EarlyStopping patience", lambda m: nn.EarlyStopping(patience=0), ValueError,
     r"EarlyStopping: patience must be a positive integer, got 0"),
    ("Accuracy shapes", lambda m: nn.Accuracy().update(np.ones((2, 3)), np.array([1, 2, 0])),
     ValueError, r"Accuracy: predictions of shape \(2, 3\) do not match targets of shape \(3,\)"),
    ("gradcheck float32", lambda m: nn.gradcheck(nn.Tanh, m.W), TypeError,
     r"gradcheck: input 0 has dtype float32; finite differences need float64 inputs"),
    ("draw a number", lambda m: nn.draw(42), TypeError, r"draw: root must be a NetVar, got int"),
]

# Mixed devices: a node "on a GPU" (FakeGPUArray, see second_device) meets host data.
DEVICE_CASES = [
    ("Add", lambda m: nn.Add(m.W, on_gpu(3, 4))),
    ("Sub", lambda m: on_gpu(3, 4) - m.W),
    ("Mul", lambda m: m.W * on_gpu(1, 4)),
    ("Div", lambda m: nn.Div(m.W, on_gpu(3, 4))),
    ("Multiply", lambda m: m.net(on_gpu(4, 3))),
    ("RNN", lambda m: nn.RNN(on_gpu(5, 2, 3), m.W, m.R, m.bias)),
    ("L2Loss", lambda m: nn.L2Loss(m.net(m.x), on_gpu(4, 2))),
    ("HuberLoss", lambda m: nn.HuberLoss(m.W, on_gpu(3, 4))),
    ("Einsum", lambda m: nn.Einsum("ij,jk->ik", m.W, on_gpu(4, 2))),
    ("Attention", lambda m: nn.Attention(m.table, on_gpu(5, 3), m.table)),
]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("case, call, error, message", CASES, ids=[c[0] for c in CASES])
def test_hostile_input_fails_clearly_and_changes_nothing(case, call, error, message, m):
    before = snapshot(m.params)
    options = (m.opt.lr, [dict(state) for state in m.opt.state])
    with pytest.raises(error, match=message) as caught:
        call(m)
    assert type(caught.value) is error, f"{case}: {type(caught.value).__name__}: {caught.value}"
    assert_unchanged(m.params, before)
    assert (m.opt.lr, [dict(state) for state in m.opt.state]) == options


@pytest.mark.parametrize("case, call", DEVICE_CASES, ids=[c[0] for c in DEVICE_CASES])
def test_mixed_devices_name_the_op_and_both_devices(case, call, m, second_device):
    before = snapshot(m.params)
    pattern = (rf"{case}: inputs live on different devices "
               rf"\({SHAPES} on (cpu|gpu:1), {SHAPES} on (cpu|gpu:1)")
    with pytest.raises(ValueError, match=pattern) as caught:
        call(m)
    assert " on cpu" in str(caught.value) and " on gpu:1" in str(caught.value)   # both named
    assert_unchanged(m.params, before)


def test_a_mask_on_another_device_is_named(m, second_device):
    mask = np.ones((3, 4), dtype=bool).view(FakeGPUArray)
    for op in (nn.SoftMax, nn.LogSoftmax):
        with pytest.raises(ValueError, match=rf"{op.__name__}: mask of shape \(3, 4\) lives on "
                                             r"gpu:1 and the data on cpu"):
            op(m.W, mask=mask)


def test_check_same_device_names_every_input(second_device):
    with pytest.raises(ValueError, match=r"Conv2D: inputs live on different devices "
                                         r"\(\(2, 3\) on cpu, \(3,\) on gpu:1, \(1,\) on cpu\)"):
        backend.check_same_device("Conv2D", np.ones((2, 3)), np.ones(3).view(FakeGPUArray),
                                  np.ones(1))


def test_optimizer_step_with_some_gradients_leaves_the_others_alone(m):
    m.idle.reset()
    optimizer = nn.GD([m.idle] + m.net.vars)
    idle = m.idle.data.copy()
    trained = [p.data.copy() for p in m.net.vars]
    optimizer.step()
    np.testing.assert_array_equal(m.idle.data, idle)     # no gradient: not updated
    assert all(not np.array_equal(p.data, old) for p, old in zip(m.net.vars, trained))


def test_nan_data_is_kept_not_clipped():
    x = nn.NetVar(np.array([[np.nan, 1.0, np.inf]]))
    assert np.isnan(nn.Tanh(x).data[0, 0]) and nn.Tanh(x).data[0, 2] == 1.0
    loss = nn.SoftmaxCELoss(x, np.array([1]))
    assert np.isnan(loss.data).all()                       # NaN in, NaN out: never hidden
