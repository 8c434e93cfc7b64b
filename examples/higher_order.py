"""Gradients of gradients with ``nn.grad(..., create_graph=True)``, three ways.

1. Newton's method, the learner's view: a step x ← x − f'(x) / f''(x) with both derivatives from
   nnkit, on a function of one variable and then on Rosenbrock's function of two, whose Hessian
   is built row by row from Hessian-vector products.
2. A Hessian-vector product H·v of a small network's loss with respect to its weights, in one
   extra backward pass, against finite differences of gradients.
3. A gradient penalty: a classifier trained with λ·mean |∂score/∂x|² added to its loss (the
   penalty is a function of a gradient, so training it needs second derivatives). It keeps the
   accuracy and makes the classifier's score change more slowly with its input.

Run: python examples/higher_order.py
"""
import numpy as np

import nnkit as nn


# ----------------------------------------------------------------------------- 1. Newton's method

def newton_1d(x0=2.0, steps=8):
    """Minimise f(x) = x⁴ − 3x² + x from x0: each step needs f' and f''."""
    x = nn.NetVar(np.array(x0))                   # float64, a (1, 1) node
    for _ in range(steps):
        f = (x ** 4 - 3.0 * x ** 2 + x).sum()
        slope, = nn.grad(f, [x], create_graph=True)     # f'(x) as a node of a new graph
        curvature, = nn.grad(slope, [x])                # f''(x), differentiating f'
        x = nn.NetVar(x.data - slope.data / curvature)
    slope, = nn.grad((x ** 4 - 3.0 * x ** 2 + x).sum(), [x])
    return float(x.data[0, 0]), float(slope[0, 0])


def rosenbrock(p):
    x, y = p[:, 0], p[:, 1]
    return ((1.0 - x) ** 2 + 100.0 * (y - x * x) ** 2).sum()


def newton_rosenbrock(start=(-1.2, 1.0), steps=8):
    """Newton on Rosenbrock's function: the Hessian row i is ∂(∇f · eᵢ)/∂p."""
    p = nn.NetVar(np.array([start]))
    for _ in range(steps):
        gradient, = nn.grad(rosenbrock(p), [p], create_graph=True)
        hessian = np.vstack([nn.grad((gradient * e).sum(), [p])[0] for e in np.eye(2)])
        p = nn.NetVar(p.data - np.linalg.solve(hessian, gradient.data[0]))
    return p.data[0]


# ----------------------------------------------------------------------------- 2. Hessian-vector

def two_moons(n, rng):
    """Two interleaved half circles with noise: points (n, 2) and labels (n,) in {0, 1}."""
    angle = rng.uniform(0, np.pi, n)
    label = rng.integers(0, 2, n)
    points = np.where(label[:, None] == 0,
                      np.stack([np.cos(angle), np.sin(angle)], 1),
                      np.stack([1 - np.cos(angle), 0.5 - np.sin(angle)], 1))
    return points + 0.1 * rng.standard_normal((n, 2)), label


def hessian_vector_product(rng):
    """H·v of a tiny network's loss over its weights, against (∇L(w + εv) − ∇L(w − εv)) / 2ε."""
    points, labels = two_moons(64, rng)
    x, t = nn.NetVar(points, requires_grad=False), nn.NetVar(labels[:, None] * 1.0,
                                                              requires_grad=False)
    w1, w2 = nn.NetVar(rng.standard_normal((2, 8))), nn.NetVar(rng.standard_normal((8, 1)))

    def loss():
        return nn.SigmoidCELoss(nn.Multiply(nn.Multiply(x, w1).tanh(), w2), t)

    v1, v2 = rng.standard_normal(w1.shape), rng.standard_normal(w2.shape)
    g1, g2 = nn.grad(loss(), [w1, w2], create_graph=True)
    h1, h2 = nn.grad((g1 * v1).sum() + (g2 * v2).sum(), [w1, w2])   # H·v, one more pass
    eps = 1e-5
    numeric = []
    for sign in (1, -1):
        w1.data += sign * eps * v1
        w2.data += sign * eps * v2
        numeric.append(nn.grad(loss(), [w1, w2]))
        w1.data -= sign * eps * v1
        w2.data -= sign * eps * v2
    fd = [(a - b) / (2 * eps) for a, b in zip(*numeric)]
    exact = np.concatenate([h1.ravel(), h2.ravel()])
    return np.abs(exact - np.concatenate([f.ravel() for f in fd])).max() / np.abs(exact).max()


# ----------------------------------------------------------------------------- 3. gradient penalty

def train_classifier(penalty, rng, steps=300):
    """A 2-16-1 tanh classifier on two moons; returns (test accuracy, mean |∂score/∂x|)."""
    points, labels = two_moons(256, rng)
    test_points, test_labels = two_moons(256, rng)
    nn.seed(0)
    model = nn.layers.Sequential(nn.layers.Linear(2, 16), nn.Tanh, nn.layers.Linear(16, 1))
    optimizer = nn.Adam(model.vars, lr=0.03)
    t = nn.NetVar(labels[:, None] * 1.0, requires_grad=False)
    for _ in range(steps):
        x = nn.NetVar(points)                        # the input needs a gradient here
        score = model(x)
        loss = nn.SigmoidCELoss(score, t)
        if penalty:
            dx, = nn.grad(score.sum(), [x], create_graph=True)     # ∂score_i/∂x_i per row
            loss = loss + penalty * (dx * dx).sum(axis=1).mean()
        loss.back()
        optimizer.step()
    x = nn.NetVar(test_points)
    score = model(x)
    dx, = nn.grad(score.sum(), [x])
    accuracy = float(((score.data[:, 0] > 0) == test_labels).mean())
    return accuracy, float(np.sqrt((dx ** 2).sum(axis=1)).mean())


def main():
    rng = np.random.default_rng(0)
    x, slope = newton_1d()
    print(f"newton 1-d: x* = {x:.12f}, f'(x*) = {slope:.2e}")
    p = newton_rosenbrock()
    print(f"newton rosenbrock: p* = ({p[0]:.10f}, {p[1]:.10f})")
    print(f"hessian-vector product: relative difference to finite differences "
          f"{hessian_vector_product(rng):.2e}")
    for penalty in (0.0, 0.1):
        accuracy, slope = train_classifier(penalty, np.random.default_rng(1))
        print(f"gradient penalty {penalty}: test accuracy {accuracy:.3f}, "
              f"mean |dscore/dx| {slope:.3f}")


if __name__ == "__main__":
    main()
