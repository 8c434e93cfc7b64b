"""Writes the format-version-2 checkpoints that tests/io/test_checkpoints.py must keep loading.

Run once, with the nnkit of commit eac902d (before FFN became a Module walked like any other
and SequenceModel was made of layers):

    PYTHONPATH=$PWD .venv/bin/python tests/data/make_version2_checkpoints.py

It writes, next to itself, one file for each kind of model nnkit saved then:

- ``v2_ffn_adam.npz``: an FFN saved with its topology (a nested FFN, a weight shared between
  two entries, a BatchNorm entry with its running statistics, a tuple argument, a constant)
  and an Adam optimizer's state after two steps;
- ``v2_sequence_adam.npz``: a ``SequenceModel(cell='lstm', embedding=...)``, drawn from a
  seed, with Adam's state after two steps;
- ``v2_layers_adam.npz``: a Module of ``nn.layers`` (a Sequential of Linear, BatchNorm and
  ReLU, then a LayerNorm and a Linear) with Adam's state after two steps;
- ``v2_dict_rmsprop.npz``: a nested dict and list of parameters with RMSProp's state;
- ``v2_expected.npz``: plain NumPy arrays (no nnkit format) with what loading must give, keyed
  ``<file>/<what>``: each saved name's array (``<file>/param/<name>``,
  ``<file>/buffer/<name>``), each optimizer state array by parameter name
  (``<file>/opt/<name>/<key>``), the models' outputs on fixed inputs (``<file>/output``), and
  for the SequenceModel its parameters and output just after it was drawn from its seed
  (``sequence/init/<name>``, ``sequence/init_output``).

Everything is float64. The FFN, the layers and the dict take their values from np.linspace, so
the files are reproducible; the SequenceModel is drawn from its seed (that is what it checks).
Rerunning this script with a newer nnkit would write what the newer code writes: don't, the
point of the files is that they were written by the old code.
"""
import os

import numpy as np

import nnkit as nn

HERE = os.path.dirname(os.path.abspath(__file__))
F64 = np.float64
SEQUENCE_SEED = 11
SEQUENCE_SIZES = dict(inputs=7, hidden=5, outputs=7, cell="lstm", embedding=3)


def values(*shape, start=-1.0, stop=1.0):
    return np.linspace(start, stop, int(np.prod(shape)), dtype=F64).reshape(shape)


def ffn():
    """The FFN of v2_ffn_adam.npz (and of the tests that load it)."""
    shared = nn.NetVar(values(4, 4, start=-0.5, stop=0.7))
    encoder = nn.FFN((nn.Multiply, shared), (nn.Add, nn.NetVar(values(4, start=0.1, stop=0.4))),
                     (nn.Tanh,))
    state = nn.BatchNormState(4, momentum=0.2)
    return nn.FFN((encoder,), (nn.BatchNorm, nn.NetVar(values(4, start=0.8, stop=1.2)),
                               nn.NetVar(values(4, start=-0.1, stop=0.1)), state),
                  (nn.LReLU, 0.1), (nn.Multiply, shared), (nn.Transpose, (1, 0)),
                  (nn.Transpose, (1, 0)),
                  (nn.Multiply, nn.NetVar(values(4, 3, start=0.9, stop=-0.3))),
                  (nn.Add, nn.NetVar(values(3, start=-0.2, stop=0.2))),
                  (nn.Add, nn.NetVar(values(3, start=0.05, stop=0.15), requires_grad=False)))


def ffn_inputs():
    return values(6, 4, start=-2.0, stop=2.0), np.array([0, 1, 2, 0, 1, 2])


def sequence_model():
    """The SequenceModel of v2_sequence_adam.npz, drawn from its seed."""
    return nn.SequenceModel(**SEQUENCE_SIZES, seed=SEQUENCE_SEED)


def sequence_inputs():
    """Token ids (T, B) = (5, 3), their lengths, and the next-token targets."""
    ids = (np.arange(15).reshape(5, 3) * 4) % 7
    return ids, np.array([5, 3, 4]), (ids + 1) % 7


class LayersNet(nn.Module):
    """The Module of v2_layers_adam.npz: its names are ``body.layers.<i>.*``, ``norm.*`` and
    ``head.*``."""

    def __init__(self):
        self.body = nn.layers.Sequential(nn.layers.Linear(4, 6), nn.layers.BatchNorm(6),
                                         nn.ReLU)
        self.norm = nn.layers.LayerNorm(6)
        self.head = nn.layers.Linear(6, 3)
        for i, p in enumerate(self.vars):      # reproducible values, not draws
            p.data = values(*p.shape, start=-0.3 - 0.1 * i, stop=0.5 + 0.05 * i)

    def forward(self, x):
        return self.head(self.norm(self.body(x)))


def layers_inputs():
    return values(5, 4, start=-1.5, stop=2.5), np.array([0, 1, 2, 1, 0])


def parameters():
    """The nested dict of v2_dict_rmsprop.npz: names ``enc.w``, ``layers.0``, ``layers.1``."""
    return {"enc": {"w": nn.NetVar(values(3, 2, start=1.0, stop=2.0))},
            "layers": [nn.NetVar(values(2, start=-3.0, stop=-2.5)),
                       nn.NetVar(values(2, 2, start=0.3, stop=0.6))]}


def dict_loss(params):
    x = nn.NetVar(values(4, 3, start=-1.0, stop=1.0), requires_grad=False)
    h = nn.Add(nn.Multiply(x, params["enc"]["w"]), params["layers"][0])
    return nn.Sum(nn.Multiply(h, params["layers"][1]) ** 2)


def _record(expected, key, model, opt, named):
    """The saved names' arrays and the optimizer's state by parameter name."""
    for name, p in named.items():
        expected[f"{key}/param/{name}"] = p.data.copy()
    if isinstance(model, nn.Module):
        for name, array in model.named_buffers().items():
            expected[f"{key}/buffer/{name}"] = np.array(array)
    names = {id(p): name for name, p in named.items()}
    for p, state in zip(opt.params, opt.state):
        for item, value in state.items():
            if isinstance(value, np.ndarray):
                expected[f"{key}/opt/{names[id(p)]}/{item}"] = value.copy()


def train_and_save(name, model, opt, loss, extra):
    """Two steps of ``opt`` on ``loss()``, then ``model`` and ``opt`` saved as ``name``."""
    for _ in range(2):
        loss().back()
        opt.step()
    nn.save(os.path.join(HERE, name), model, optimizer=opt, extra=extra)


def main():
    nn.set_dtype(F64)
    expected = {}

    net = ffn()
    opt = nn.Adam(net.vars, lr=0.01)
    x, y = ffn_inputs()
    train_and_save("v2_ffn_adam.npz", net, opt, lambda: nn.SoftmaxCELoss(net(x), y),
                   {"epoch": 2})
    _record(expected, "ffn", net, opt, {**net.named_vars(), **net.named_constants()})
    with nn.eval_mode():
        expected["ffn/output"] = net(x).data

    model = sequence_model()
    ids, lengths, targets = sequence_inputs()
    for name, p in model.named_vars().items():
        expected[f"sequence/init/{name}"] = p.data.copy()
    expected["sequence/init_output"] = model(ids, lengths=lengths).data
    opt = nn.Adam(model.vars, lr=0.05)
    train_and_save("v2_sequence_adam.npz", model, opt, lambda: nn.SoftmaxCELoss(
        model(ids, lengths=lengths), targets, lengths=lengths), {"epoch": 2})
    _record(expected, "sequence", model, opt, model.named_vars())
    expected["sequence/output"] = model(ids, lengths=lengths).data
    expected["sequence/final_h"] = model.final_state[0].data
    expected["sequence/final_c"] = model.final_state[1].data

    layers = LayersNet()
    opt = nn.Adam(layers.vars, lr=0.02)
    x, y = layers_inputs()
    train_and_save("v2_layers_adam.npz", layers, opt, lambda: nn.SoftmaxCELoss(layers(x), y),
                   {"epoch": 2})
    _record(expected, "layers", layers, opt, layers.named_vars())
    with nn.eval_mode():
        expected["layers/output"] = layers(x).data

    params = parameters()
    flat = {"enc.w": params["enc"]["w"], "layers.0": params["layers"][0],
            "layers.1": params["layers"][1]}
    opt = nn.RMSProp(list(flat.values()), lr=0.01)
    train_and_save("v2_dict_rmsprop.npz", params, opt, lambda: dict_loss(params),
                   {"kind": "dict"})
    _record(expected, "dict", params, opt, flat)

    assert all(array.dtype != np.float32 for array in expected.values())
    np.savez(os.path.join(HERE, "v2_expected.npz"), **expected)


if __name__ == "__main__":
    main()
