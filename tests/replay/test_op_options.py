"""Never stale: arrays an op is given as options (a loss's class weights), not as nodes.

An op reads such an array beside its parents' data; a replay must read it as eager does: the
entries the labels of this call pick, and the values the array holds at this call. Each test
runs the same calls eagerly and captured from one seed and compares every loss and parameter
bit for bit, and checks that the captured run replayed.
"""
import warnings

import numpy as np
import pytest

import nnkit as nn

LABELS = [np.array([0, 1, 2, 0, 1, 2]),        # recorded
          np.array([2, 2, 1, 0, 0, 1]),        # the first replay, checked: weights 1 again
          np.array([3, 3, 3, 0, 1, 2]),        # the rare class shows up
          np.array([3, 0, 3, 1, 3, 2]),
          np.array([1, 3, 0, 2, 2, 3])]
X = np.random.default_rng(0).standard_normal((6, 5))


def run(captured, loss, weight, dtype, edit=None):
    nn.seed(0)
    model = nn.layers.Linear(5, 4)
    for p in model.vars:
        p.data = p.data.astype(dtype)
    opt = nn.GD(model.vars, lr=0.1)

    def step(x, labels):
        out = loss(model(x), labels, weight)
        out.back()
        opt.step()
        return out
    if captured:
        step = nn.capture(step)
    losses = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, labels in enumerate(LABELS):
            if edit is not None:
                edit(i, weight)
            losses.append(step(X.astype(dtype), labels).data.copy())
    return losses, [p.data.copy() for p in model.vars], step


def _edit_in_place(i, weight):
    if i == 3:
        weight[1] = 2.5


LOSSES = {
    "SoftmaxCELoss": lambda z, t, w: nn.SoftmaxCELoss(z, t, weight=w),
    "NLLLoss": lambda z, t, w: nn.NLLLoss(nn.LogSoftmax(z), t, weight=w),
    "SoftmaxCELoss, ignore_index": lambda z, t, w: nn.SoftmaxCELoss(z, t, weight=w,
                                                                    ignore_index=2),
}


@pytest.mark.parametrize("loss", LOSSES, ids=list(LOSSES))
@pytest.mark.parametrize("weight_dtype, dtype", [(np.float32, np.float32),
                                                 (np.float64, np.float32),
                                                 (np.float64, np.float64)])
@pytest.mark.parametrize("edit", [None, _edit_in_place], ids=["kept", "edited in place"])
def test_class_weights_given_as_an_array_follow_each_calls_labels(loss, weight_dtype, dtype,
                                                                   edit):
    # the op gathered weight[labels] with NumPy's indexing of the array it was given, which
    # the recording does not see: every replay kept the recording's gathered weights, silently
    # when the checked first replay's labels gathered the same ones
    results = [run(captured, LOSSES[loss], np.array([1.0, 1.0, 1.0, 5.0], weight_dtype),
                   dtype, edit) for captured in (False, True)]
    (eager_losses, eager_params, _), (losses, params, step) = results
    for k, (a, b) in enumerate(zip(eager_losses + eager_params, losses + params)):
        assert np.array_equal(a, b), f"result {k} differs from eager ({step})"
    assert step.replays >= 2, step
