"""Draw the pictures in README.md and the docs with nnkit itself (needs Graphviz's `dot`).

    python docs/make_figures.py [output folder, default docs/img]

article-graph.svg: the article's Code 1 with a cross-entropy loss on top, values and gradients
after back(). backward-step.svg: the same graph at step 3 of the backward pass.
"""
import pathlib
import sys

import nnkit as nn


ROOT = pathlib.Path(__file__).resolve().parents[1]


def code1():
    """The article's Code 1, run from examples/article.py as written: its nodes by name."""
    source = (ROOT / "examples" / "article.py").read_text().split("# ---- Code 2")[0]
    namespace = {"print": lambda *args, **kwargs: None}
    exec(compile(source, "examples/article.py", "exec"), namespace)
    return {name: node for name, node in namespace.items() if isinstance(node, nn.NetVar)}


def article_graph():
    """Code 1 with its softmax input scaled by 0.01 and a loss against class 0."""
    nodes = code1()
    del nodes["smax2"]                     # not an input of the loss
    nodes["probs"] = nn.SoftMax(nodes["add2"] * 0.01)
    nodes["target"] = nn.NetVar([1, 0, 0], requires_grad=False)
    nodes["loss"] = nn.CELoss(nodes["probs"], nodes["target"])
    return nodes["loss"], nodes


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
    main(sys.argv[1] if len(sys.argv) > 1 else ROOT / "docs" / "img")
