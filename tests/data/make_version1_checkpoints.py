"""Writes the format-version-1 checkpoints that tests/io/test_checkpoints.py must keep loading.

Run once, with the nnkit of commit 316f128 (the last io.py that wrote version 1):

    .venv/bin/python tests/data/make_version1_checkpoints.py

It writes, next to itself:
- ``v1_ffn_adam.npz``: a composed FFN (a nested FFN, a weight shared between two entries, a
  tuple argument, a constant) with the state of an Adam optimizer after two steps and extra
  data;
- ``v1_dict.npz``: a dict name -> NetVar;
- ``v1_expected.npz``: plain NumPy arrays (no nnkit format) with the values the loaded
  checkpoints must give: parameters, Adam's m and v, and the FFN's output on a fixed input.

Every initial value is computed from np.linspace, not drawn, so the files are reproducible.
Rerunning this script with a newer nnkit would write the newer format: don't, the point of
the files is that they were written by the old code.
"""
import json
import os

import numpy as np

import nnkit as nn

HERE = os.path.dirname(os.path.abspath(__file__))


def values(*shape, start=-1.0, stop=1.0):
    return np.linspace(start, stop, int(np.prod(shape)), dtype=np.float32).reshape(shape)


def ffn():
    shared = nn.NetVar(values(4, 4, start=-0.5, stop=0.7))
    encoder = nn.FFN((nn.Multiply, shared), (nn.Add, nn.NetVar(values(4, start=0.1, stop=0.4))),
                     (nn.Tanh,))
    return nn.FFN((encoder,), (nn.LReLU, 0.1), (nn.Multiply, shared),
                  (nn.Transpose, (1, 0)), (nn.Transpose, (1, 0)),
                  (nn.Multiply, nn.NetVar(values(4, 3, start=0.9, stop=-0.3))),
                  (nn.Add, nn.NetVar(values(3, start=-0.2, stop=0.2))),
                  (nn.Add, nn.NetVar(values(3, start=0.05, stop=0.15), requires_grad=False)))


def inputs():
    return values(6, 4, start=-2.0, stop=2.0)


def main():
    net = ffn()
    opt = nn.Adam(net.vars, lr=0.01)
    x, y = inputs(), np.array([0, 1, 2, 0, 1, 2])
    for _ in range(2):
        nn.SoftmaxCELoss(net(nn.NetVar(x, requires_grad=False)), y).back()
        opt.step()
    nn.save(os.path.join(HERE, "v1_ffn_adam.npz"), net, optimizer=opt,
            extra={"epoch": 2, "note": "written by format version 1"})

    w = nn.NetVar(values(3, 2, start=1.0, stop=2.0))
    b = nn.NetVar(values(2, start=-3.0, stop=-2.5))
    nn.save(os.path.join(HERE, "v1_dict.npz"), {"w": w, "b": b}, extra={"kind": "dict"})

    expected = {f"param{i}": p.data for i, p in enumerate(net.vars)}
    expected.update({f"m{i}": state["m"] for i, state in enumerate(opt.state)})
    expected.update({f"v{i}": state["v"] for i, state in enumerate(opt.state)})
    expected["output"] = net(nn.NetVar(x, requires_grad=False)).data
    expected["w"], expected["b"] = w.data, b.data
    np.savez(os.path.join(HERE, "v1_expected.npz"), **expected)
    with np.load(os.path.join(HERE, "v1_ffn_adam.npz")) as archive:
        print(json.dumps(json.loads(bytes(archive["__nnkit__"]).decode()), indent=1)[:3000])


if __name__ == "__main__":
    main()
