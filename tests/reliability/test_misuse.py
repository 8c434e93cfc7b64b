"""The misuses every learner makes, one row each: a row either checks that nnkit gives the right
value, or that it refuses with a clear error (the message names the op or function and the
argument) and leaves the model, its gradients and its optimizer state exactly as they were.

The rows are the seams where nnkit once gave a wrong result with no error: a 0-d node read three
times, ``p.g = 0``, float64 data meeting float32 parameters, an op without ``_back``, composed
FFNs, losses on the wrong kind of input, gradients of the wrong shape, options out of range, and
PyTorch's spellings.
"""
import types

import numpy as np
import pytest

import nnkit as nn
from tests.reliability.helpers import assert_unchanged, snapshot


class Right:
    """The call returns a value and ``check(value)`` holds."""

    def __init__(self, check):
        self.check = check


class Refused:
    """The call raises ``error`` whose message matches ``message``; nothing changes
    (``prepare(m)``, if given, sets the scene before the state is recorded)."""

    def __init__(self, error, message, prepare=None):
        self.error, self.message, self.prepare = error, message, prepare


def _model():
    nn.seed(0)
    net = nn.FFN((nn.Multiply, nn.glorot(3, 2)), (nn.Add, nn.zeros(2)), (nn.Tanh,))
    m = types.SimpleNamespace(net=net, x=nn.NetVar(np.ones((4, 3), np.float32),
                                                   requires_grad=False))
    m.opt = nn.Adam(net.vars, lr=0.1)
    nn.Sum(net(m.x)).back()
    m.opt.step()
    nn.Sum(net(m.x)).back()                   # parameters hold gradients, Adam holds state
    m.params = net.vars
    return m


def _fan_out_of_a_scalar(m):
    x = nn.NetVar(np.ones((2, 3)))
    s = x.sum()
    (s * 2 + s * 3 + s * 4).back()
    return x.g


def _zero_grad_by_assignment(m):
    w = m.net.vars[0]
    w.g = 0
    nn.Sum(m.net(m.x)).back()
    return w.g


def _float64_data_float32_parameters(m):
    nn.Sum(m.net(nn.NetVar(np.ones((4, 3)), requires_grad=False))).back()
    return [(p.g.dtype, p.dtype) for p in m.net.vars]


class _NoBackward(nn.NetOp):
    def __init__(self, x):
        super().__init__(x.data * 2, x)


def _wrong_gradient_shape(m):
    m.net.vars[0]._g = np.ones((1, 2), np.float32)       # as a buggy user op could leave it


def _batch_of_scalars(m):
    """A DQN's q[range(B), a] has shape (B,): every loss counts B rows, as for (B, 1)."""
    q = nn.NetVar(np.arange(128.0).reshape(64, 2))
    picked = q[np.arange(64), np.zeros(64, int)]
    return [loss(picked, np.zeros(64)).item() == loss(nn.Reshape(picked, 64, 1),
                                                      np.zeros((64, 1))).item()
            for loss in (nn.L1Loss, nn.L2Loss, nn.HuberLoss)] + [True]


def _composed_ffn(m):
    """An autoencoder of two FFNs trains the parameters of both."""
    encoder = nn.FFN((nn.Multiply, nn.glorot(3, 2)), (nn.Add, nn.zeros(2)), (nn.Tanh,))
    decoder = nn.FFN((nn.Multiply, nn.glorot(2, 3)),)
    model = nn.FFN((encoder,), (decoder,))
    before = [p.data.copy() for p in model.vars]
    optimizer = nn.GD(model.vars)
    nn.L2Loss(model(m.x), m.x).back()
    optimizer.step()
    moved = all(not np.array_equal(p.data, old) for p, old in zip(model.vars, before))
    return len(model.vars), len(encoder.vars) + len(decoder.vars), moved


def _options(m, **changes):
    state = m.opt.state_dict()
    state["options"] = dict(state["options"], **changes)
    return state


def _step(m):
    def step(batch):
        x, t = batch
        return nn.L2Loss(m.net(nn.NetVar(x, requires_grad=False)), t)
    return step


def _grad_check(m):
    return m.net.vars[0].g


ROWS = [
    # -- gradients at every shape
    ("0-d node read three times", _fan_out_of_a_scalar,
     Right(lambda g: np.array_equal(g, np.full((2, 3), 9.0)))),
    ("p.g = 0 then back()", _zero_grad_by_assignment,
     Right(lambda g: type(g) is np.ndarray and g.shape == (3, 2) and g.dtype == np.float32
           and np.abs(g).sum() > 0)),
    ("p.g = None", lambda m: setattr(m.net.vars[0], "g", None) or _grad_check(m),
     Right(lambda g: g.shape == (3, 2) and not g.any())),
    ("p.g of another shape", lambda m: setattr(m.net.vars[0], "g", np.zeros((2, 3))),
     Refused(ValueError, r"\.g of NetVar #\d+ of shape \(3, 2\): the gradient must have the "
                         r"node's shape \(3, 2\), got \(2, 3\)")),
    ("p.g = 'zero'", lambda m: setattr(m.net.vars[0], "g", "zero"),
     Refused(TypeError, r"\.g of NetVar #\d+ .*not str")),
    ("float64 data, float32 parameters", _float64_data_float32_parameters,
     Right(lambda pairs: all(g == p == np.float32 for g, p in pairs))),
    ("op without _back", lambda m: nn.Sum(_NoBackward(m.net.vars[0])).back(),
     Refused(NotImplementedError, r"back\(\): _NoBackward defines no _back")),
    ("accumulate of a wrong shape", lambda m: m.net.vars[0].accumulate(np.ones((1, 2))),
     Refused(ValueError, r"accumulate\(\): a gradient of shape \(1, 2\) cannot be summed back "
                         r"to NetVar #\d+ of shape \(3, 2\)")),
    ("back() seed of a string", lambda m: m.net(m.x).back("ones"),
     Refused(TypeError, r"back\(\): the seed gradient of Tanh #\d+ of shape \(4, 2\)")),
    ("optimizer step with a wrong-shaped gradient", lambda m: m.opt.step(),
     Refused(ValueError, r"Adam.*\(1, 2\).*\(3, 2\)", prepare=_wrong_gradient_shape)),
    # -- losses on the wrong kind of input
    ("CELoss on logits", lambda m: nn.CELoss(m.net(m.x) * 3.0, np.tile([[1.0, 0.0]], (4, 1))),
     Refused(ValueError, r"CELoss: prediction of shape \(4, 2\): values in .* outside \[0, 1\]"
                         r".*for logits use SoftmaxCELoss")),
    ("L2Loss on a batch of scalars", _batch_of_scalars,
     Right(lambda losses: len(set(losses)) == 1)),
    ("L2Loss (B,) against (B, 1)", lambda m: nn.L2Loss(m.net(m.x)[:, 0], np.zeros((4, 1))),
     Refused(ValueError, r"L2Loss: prediction of shape \(4,\) and target of shape \(4, 1\) "
                         r"differ")),
    # -- options and arguments out of range
    ("Transpose axes out of range", lambda m: nn.Transpose(nn.NetVar(np.ones((2, 3, 4))), (0, 5, 1)),
     Refused(ValueError, r"Transpose: axis 5 .* out of range for x of shape \(2, 3, 4\)")),
    ("LayerNorm eps NaN", lambda m: nn.LayerNorm(m.x, nn.NetVar(np.ones(3)),
                                                 nn.NetVar(np.zeros(3)), eps=float("nan")),
     Refused(ValueError, r"LayerNorm: eps must be finite, got nan")),
    ("minibatches bucket=0.5", lambda m: list(nn.minibatches(np.ones((8, 3)), np.ones((8, 2)),
                                                             batch_size=4, bucket=0.5)),
     Refused(TypeError, r"minibatches: bucket must be .*, got float 0.5")),
    ("minibatches batch_size=None", lambda m: list(nn.minibatches(np.ones((8, 3)), np.ones((8, 2)),
                                                                  batch_size=None)),
     Refused(TypeError, r"minibatches: batch_size must be a positive integer, got NoneType")),
    ("a hook class", lambda m: nn.Trainer(_step(m), m.opt, hooks=[nn.EarlyStopping]),
     Refused(TypeError, r"Trainer: hooks\[0\] is the class EarlyStopping; pass an instance")),
    ("a hook that is a number", lambda m: nn.Trainer(_step(m), m.opt, hooks=[42]),
     Refused(TypeError, r"Trainer: hooks\[0\] must be a hook .*got int 42")),
    ("a one-shot iterator for two epochs",
     lambda m: nn.Trainer(_step(m), m.opt).fit(iter([(np.ones((4, 3)), np.ones((4, 2)))]),
                                               epochs=2),
     Refused(TypeError, r"Trainer.fit: train_batches is an iterator .* exhausted after one "
                        r"epoch")),
    ("a GRU given an LSTM's (h, c)",
     lambda m: nn.SequenceModel(3, 4, 2, cell="gru")(np.ones((5, 2, 3)),
                                                      state=(np.zeros((2, 4)), np.zeros((2, 4)))),
     Refused(ValueError, r"SequenceModel\(cell='gru'\): state must be \(h,\) or h")),
    ("mean(dim=1)", lambda m: m.net(m.x).mean(dim=1),
     Refused(TypeError, r"mean\(\): nnkit spells the axis argument axis=, not dim=")),
    ("a composed FFN", _composed_ffn, Right(lambda counts: counts == (3, 3, True))),
    ("load_state_dict with lr NaN", lambda m: m.opt.load_state_dict(_options(m, lr=float("nan"))),
     Refused(ValueError, r"Adam.load_state_dict: learning rate must be finite, got nan")),
    ("load_state_dict with momentum 1.5",
     lambda m: m.opt.load_state_dict(_options(m, momentum=1.5)),
     Refused(ValueError, r"Adam.load_state_dict: .*1.5")),
    ("an optimizer of nothing", lambda m: nn.GD([]),
     Refused(ValueError, r"GD: got an empty parameter list")),
    ("a parameter listed twice", lambda m: nn.Adam(m.net.vars + m.net.vars[:1]),
     Refused(ValueError, r"Adam: parameter 2 \(NetVar #\d+ of shape \(3, 2\)\) is listed twice")),
    # -- PyTorch habits
    ("loss.backward()", lambda m: nn.Sum(m.net(m.x)).backward(),
     Refused(AttributeError, r"no attribute 'backward': nnkit spells it back\(\)")),
    ("p.grad", lambda m: m.net.vars[0].grad,
     Refused(AttributeError, r"no attribute 'grad': nnkit spells it \.g")),
    ("p.grad = None", lambda m: setattr(m.net.vars[0], "grad", None),
     Refused(AttributeError, r"nnkit spells it \.g")),
    ("float(loss)", lambda m: float(nn.Sum(m.net(m.x))), Right(lambda v: type(v) is float)),
    ("float of many values", lambda m: float(m.net.vars[0]),
     Refused(ValueError, r"float\(\): NetVar #\d+ of shape \(3, 2\) holds 6 elements")),
    ("x.tolist()", lambda m: m.x.tolist(), Right(lambda v: v == [[1.0] * 3] * 4)),
    ("np.asarray(x)", lambda m: np.asarray(m.x),
     Right(lambda v: v.dtype == np.float32 and v.shape == (4, 3))),
    ("x[0] = 1", lambda m: m.net.vars[0].__setitem__(0, 1.0),
     Refused(TypeError, r"NetVar #\d+ of shape \(3, 2\) does not support item assignment")),
]


@pytest.mark.parametrize("name, call, expect", ROWS, ids=[row[0] for row in ROWS])
def test_a_misuse_gives_the_right_value_or_a_clear_error(name, call, expect):
    m = _model()
    if isinstance(expect, Right):
        value = call(m)
        assert expect.check(value), f"{name}: {value!r}"
        return
    if expect.prepare is not None:
        expect.prepare(m)
    before = snapshot(m.params)
    optimizer_state = [{key: np.copy(value) for key, value in state.items()}
                       for state in m.opt.state]
    with pytest.raises(expect.error, match=expect.message) as caught:
        call(m)
    assert type(caught.value) is expect.error, f"{name}: {caught.value!r}"
    assert_unchanged(m.params, before)
    for state, saved in zip(m.opt.state, optimizer_state):
        assert state.keys() == saved.keys()
        for key in saved:
            np.testing.assert_array_equal(state[key], saved[key])
