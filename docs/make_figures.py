"""Draw the pictures in README.md and the docs with nnkit itself (needs Graphviz's `dot`).

    python docs/make_figures.py [output folder, default docs/img]

article-graph.svg: the article's Code 1 with a cross-entropy loss on top, values and gradients
after back(). backward-step.svg: the same graph at step 3 of the backward pass.
"""
import pathlib
import sys

import nnkit as nn


def article_graph():
    """The article's Code 1, softmax input scaled by 0.01, and a loss against class 0."""
    x = nn.NetVar([1, 2])
    w1 = nn.NetVar([[3, 4, 5], [6, 7, 8]])
    b1 = nn.NetVar([1, 2, 3])
    w2 = nn.NetVar([[1, 2, 3], [3, 4, 5], [6, 7, 8]])
    b2 = nn.NetVar([1, 2, 3])
    mul1 = nn.Multiply(x, w1)
    add1 = nn.Add(mul1, b1)
    relu1 = nn.ReLU(add1)
    mul2 = nn.Multiply(relu1, w2)
    add2 = nn.Add(mul2, b2)
    probs = nn.SoftMax(add2 * 0.01)
    target = nn.NetVar([1, 0, 0], requires_grad=False)
    loss = nn.CELoss(probs, target)
    return loss, locals()


def main(folder):
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    loss, names = article_graph()
    loss.back()
    written = [nn.draw(loss, show_data=True, show_grad=True, names=names)
               .save(folder / "article-graph.svg"),
               nn.draw(loss, step=3, names=names).save(folder / "backward-step.svg")]
    for path in written:
        print(path)
    return written


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent / "img")
