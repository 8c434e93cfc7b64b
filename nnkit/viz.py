"""Graph pictures: nnkit.draw(root) renders the graph with Graphviz."""

__all__ = []
