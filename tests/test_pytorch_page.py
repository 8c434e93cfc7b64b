"""docs/pytorch.md ("Coming from PyTorch"): its snippets run, in order, in one namespace, and
the equivalences it states hold against PyTorch itself (where torch is installed)."""
import pathlib
import re

import numpy as np
import pytest

import nnkit as nn

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "pytorch.md"


@pytest.fixture
def float32():
    previous = nn.get_dtype()
    nn.set_dtype("float32")
    yield
    nn.set_dtype(previous)


def test_the_page_snippets_run(float32):
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) >= 6
    namespace = {"__name__": "pytorch_page"}
    for block in blocks:
        exec(compile(block, str(PAGE), "exec"), namespace)
    assert namespace["opt"].params == namespace["model"].vars


def test_the_page_is_in_the_site_navigation():
    assert "pytorch.md" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")


def test_every_pytorch_name_the_table_answers_for_nnkit_is_on_the_page():
    text = PAGE.read_text(encoding="utf-8")
    for name in ("CrossEntropyLoss", "BCEWithLogitsLoss", "SGD", "RMSprop", "Adagrad"):
        assert name in text


# ----------------------------------------------------------------------------- against PyTorch

torch = pytest.importorskip("torch")


def run_nnkit(make, steps=5):
    w = nn.NetVar(np.array([3.0, -6.0]), dtype=np.float64)
    opt = make([w])
    for _ in range(steps):
        (w * w).sum().back()
        opt.step()
    return w.data.reshape(-1)          # (a 1-D NetVar is a (1, n) row)


def run_torch(make, steps=5):
    w = torch.tensor([3.0, -6.0], dtype=torch.float64, requires_grad=True)
    opt = make([w])
    for _ in range(steps):
        opt.zero_grad()
        (w * w).sum().backward()
        opt.step()
    return w.detach().numpy()


@pytest.mark.parametrize("lr, beta", [(0.01, 0.9), (0.1, 0.5), (0.03, 0.0)])
def test_gd_with_lr_over_1_minus_beta_is_sgd_with_momentum(lr, beta):
    ours = run_nnkit(lambda p: nn.GD(p, lr=lr / (1 - beta), momentum=beta))
    theirs = run_torch(lambda p: torch.optim.SGD(p, lr=lr, momentum=beta))
    np.testing.assert_allclose(ours, theirs, rtol=1e-13, atol=1e-14)


def test_gd_with_the_same_lr_is_not_sgd_with_momentum():
    """The trap the page warns of: the same numbers give another trajectory."""
    ours = run_nnkit(lambda p: nn.GD(p, lr=0.1, momentum=0.9))
    theirs = run_torch(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))
    assert np.abs(ours - theirs).max() > 0.5


@pytest.mark.parametrize("make_ours, make_theirs", [
    (lambda p: nn.Adam(p, lr=0.1, momentum=0.9, rms=0.98, eps=1e-8),
     lambda p: torch.optim.Adam(p, lr=0.1, betas=(0.9, 0.98), eps=1e-8)),
    (lambda p: nn.AdamW(p, lr=0.1, momentum=0.8, rms=0.99, eps=1e-6, weight_decay=0.1),
     lambda p: torch.optim.AdamW(p, lr=0.1, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    (lambda p: nn.Nesterov(p, lr=0.01, momentum=0.9),
     lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9, nesterov=True)),
    (lambda p: nn.RMSProp(p, lr=0.01, rms=0.9, eps=1e-8),
     lambda p: torch.optim.RMSprop(p, lr=0.01, alpha=0.9, eps=1e-8)),
    (lambda p: nn.AdaGrad(p, lr=0.1, eps=1e-10),
     lambda p: torch.optim.Adagrad(p, lr=0.1, eps=1e-10)),
    (lambda p: nn.GD(p, lr=0.05, momentum=0, modifiers=[nn.L2Decay(0.1)]),
     lambda p: torch.optim.SGD(p, lr=0.05, weight_decay=0.1)),
])
def test_the_optimizer_table_rows_equal_pytorch(make_ours, make_theirs):
    np.testing.assert_allclose(run_nnkit(make_ours), run_torch(make_theirs), rtol=1e-12,
                               atol=1e-13)


def test_softmax_ce_is_cross_entropy_and_linear_w_is_weight_t():
    rng = np.random.default_rng(0)
    z, t = rng.normal(size=(4, 3)), np.array([0, 2, 1, 2])
    ours = nn.SoftmaxCELoss(nn.NetVar(z, dtype=np.float64), t).item()
    theirs = torch.nn.CrossEntropyLoss()(torch.tensor(z), torch.tensor(t)).item()
    assert ours == pytest.approx(theirs, rel=1e-14)
    previous = nn.get_dtype()
    nn.set_dtype("float64")
    try:
        linear, reference = nn.layers.Linear(3, 2), torch.nn.Linear(3, 2).double()
        linear.W.data = reference.weight.detach().numpy().T.copy()
        linear.b.data = reference.bias.detach().numpy()[None].copy()
        x = rng.normal(size=(5, 3))
        np.testing.assert_allclose(linear(x).data, reference(torch.tensor(x)).detach().numpy(),
                                   rtol=1e-14)
    finally:
        nn.set_dtype(previous)


def test_the_loss_reductions_the_page_states():
    rng = np.random.default_rng(1)
    p, t = rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
    F = 3

    def ours(loss, *args):
        return loss(nn.NetVar(p, dtype=np.float64), t, *args).item()

    def theirs(loss):
        return loss(torch.tensor(p), torch.tensor(t)).item()

    assert ours(nn.MSELoss) == pytest.approx(theirs(torch.nn.MSELoss()), rel=1e-14)
    assert ours(nn.L1Loss) == pytest.approx(F * theirs(torch.nn.L1Loss()), rel=1e-14)
    assert ours(nn.L2Loss) == pytest.approx(F / 2 * theirs(torch.nn.MSELoss()), rel=1e-14)
    assert ours(nn.HuberLoss, 0.5) == pytest.approx(
        F * theirs(torch.nn.HuberLoss(delta=0.5)), rel=1e-14)
    assert ours(nn.HuberLoss, 0.5) / 0.5 == pytest.approx(
        F * theirs(torch.nn.SmoothL1Loss(beta=0.5)), rel=1e-14)


def test_the_same_spelling_rows_hold():
    """Each row of "Same spelling, another meaning": the spelling differs, the page's remedy
    is PyTorch's value."""
    F = torch.nn.functional
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=(2, 3, 6)), rng.normal(size=(2, 3, 6))
    x, t = nn.NetVar(a, dtype=np.float64), torch.tensor(a)
    y, u = nn.NetVar(b, dtype=np.float64), torch.tensor(b)

    def same(ours, theirs):
        return np.allclose(np.asarray(ours.data).reshape(-1), theirs.numpy().reshape(-1),
                           rtol=1e-12, atol=1e-14) and ours.shape == tuple(theirs.shape)

    assert not same(x.var(), t.var()) and same(x.var(ddof=1), t.var())
    assert same(x.norm(1), t.norm(dim=1)) and abs(x).sum().item() == pytest.approx(
        t.norm(1).item(), rel=1e-13)
    assert same(x.flatten(), torch.nn.Flatten()(t)) and same(x.flatten(0), t.flatten())
    assert [part.shape for part in nn.Split(x, 2, axis=2)] == [(2, 3, 3)] * 2
    assert all(same(p, q) for p, q in zip(nn.Split(x, [2, 4], axis=2), t.split(2, 2)))
    assert not nn.CosineSimilarity(x, y).shape == tuple(F.cosine_similarity(t, u).shape)
    assert same(nn.CosineSimilarity(x, y, axis=1), F.cosine_similarity(t, u))
    assert same(nn.GELU(x), F.gelu(t, approximate="tanh"))
    grid = np.linspace(-6, 6, 20001)
    gap = np.abs(nn.GELU(nn.NetVar(grid, dtype=np.float64)).data.reshape(-1)
                 - F.gelu(torch.tensor(grid)).numpy())
    assert 4e-4 < gap.max() < 5e-4
    assert nn.Pad(x, (1, 2)).shape == (5, 6, 9) != tuple(F.pad(t, (1, 2)).shape)
    assert same(nn.Pad(x, ((0, 0), (0, 0), (1, 2))), F.pad(t, (1, 2)))


def test_cosine_lr_equals_cosine_annealing_until_its_total_only():
    ours = nn.Adam([nn.NetVar([1.0])], lr=0.1)
    schedule = nn.CosineLR(ours, total=4, min_lr=0.01)
    theirs = torch.optim.Adam([torch.zeros(1, requires_grad=True)], lr=0.1)
    reference = torch.optim.lr_scheduler.CosineAnnealingLR(theirs, T_max=4, eta_min=0.01)
    rates = []
    for _ in range(8):
        schedule.step()
        theirs.step()
        reference.step()
        rates.append((ours.lr, theirs.param_groups[0]["lr"]))
    assert all(mine == pytest.approx(other, rel=1e-12) for mine, other in rates[:4])
    assert [mine for mine, _ in rates[4:]] == [0.01] * 4
    assert rates[-1][1] == pytest.approx(0.1)           # PyTorch's is back at the base lr


@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
@pytest.mark.parametrize("optimizer", ["SGD", "Adam"])
def test_one_bias_with_twice_the_lr_trains_as_pytorchs_two(kind, optimizer):
    previous = nn.get_dtype()
    nn.set_dtype("float64")
    try:
        ours = getattr(nn.layers, kind)(2, 3, seed=0)
        theirs = getattr(torch.nn, kind)(2, 3).double()
        theirs.load_state_dict({name: torch.from_numpy(np.asarray(value))
                                for name, value in nn.torch_state(ours).items()})
        x = np.random.default_rng(0).standard_normal((4, 1, 2))
        for bias_lr, equal in ((0.1, False), (0.2, True)):
            model = getattr(nn.layers, kind)(2, 3, seed=0)
            model.load_state(ours.state())
            reference = getattr(torch.nn, kind)(2, 3).double()
            reference.load_state_dict(theirs.state_dict())
            others = [p for p in model.vars if p is not model.b]
            groups = [{"params": others}, {"params": [model.b], "lr": bias_lr}]
            if optimizer == "SGD":
                mine = nn.GD(groups, lr=0.1, momentum=0)
                other = torch.optim.SGD(reference.parameters(), lr=0.1)
            else:
                mine = nn.Adam(groups, lr=0.1)
                other = torch.optim.Adam(reference.parameters(), lr=0.1)
            for _ in range(4):
                (model(x) ** 2).sum().back()
                mine.step()
                other.zero_grad()
                (reference(torch.from_numpy(x))[0] ** 2).sum().backward()
                other.step()
            summed = (reference.bias_ih_l0 + reference.bias_hh_l0).detach().numpy()
            assert np.allclose(model.b.data.reshape(-1), summed, rtol=1e-12, atol=1e-13) is equal
    finally:
        nn.set_dtype(previous)
