"""Gradients as values: ``grad(outputs, inputs)``, and gradients of gradients.

``back()`` stores gradients in ``.g``; ``grad`` returns them instead and leaves every ``.g`` as it
was. With ``create_graph=False`` it runs the same ``_back`` pass as ``back()`` and returns arrays.
With ``create_graph=True`` it runs each op's ``_grads``, the same backward rule written with ops
on nodes, so the gradients it returns are nodes of a new graph: ``back()`` or ``grad`` through
them gives second derivatives, and so on to any order.

An op supports ``create_graph=True`` in one of two ways (docs/contributing.md):

- ``_grads(self, g, *parents)`` returns each parent's gradient as a node built from ops (None
  for a parent that gets none), ``g`` being the upstream gradient as a node. A gradient may keep
  the broadcast shape; ``grad`` sums it back to the parent's shape with ops.
- ``_composite(self, *parents)`` rebuilds the op's value from ops that have ``_grads`` (a fused
  op, a loss); its gradients are then those of that composite.
"""
from . import backend
from .core import (NO_GRAD_CAUSES, NetVar, Output, check_edits, check_versions, collect, constant,
                   propagate)
from .gradients import gradient_copy, hold_gradients, restore_gradients, seed_gradient
from .modes import enable_grad
from .ops.reduce import Sum
from .ops.shape import AsType, Reshape

__all__ = ['grad']


def grad(outputs, inputs, g=None, create_graph=False):
    """The gradients of ``outputs`` with respect to each of ``inputs``, as a list in their order.

    ``outputs`` is a node or a list of nodes; with several, the gradient is that of
    Σ_k ⟨g_k, output_k⟩. ``g`` seeds each output's gradient (ones by default): one per output,
    each a number, an array of the output's shape or, with ``create_graph=True``, a node (the
    result is then differentiable with respect to it too). ``inputs`` is a node or a list of
    nodes that require a gradient: leaves or intermediate nodes. No node's ``.g`` is read or
    changed.

    With ``create_graph=False`` the gradients are arrays (NumPy or CuPy, each of its input's
    shape and dtype) and no graph is kept. With ``create_graph=True`` they are nodes whose graph
    reaches back to the inputs, so they can be backpropagated again (``back()`` or ``grad``), to
    any order; an op without a differentiable backward is refused naming it. An input the
    outputs do not depend on gets a zero gradient.
    """
    single = isinstance(outputs, NetVar)
    outputs = [outputs] if single else _listed("outputs", outputs)
    if isinstance(inputs, NetVar):
        inputs = [inputs]
    inputs = _listed("inputs", inputs)
    if not isinstance(create_graph, bool):
        raise TypeError(f"grad(): create_graph must be True or False, got {create_graph!r}")
    for position, y in enumerate(outputs):
        if not y.requires_grad:
            raise RuntimeError(f"grad(): output {position}, {y._describe()}, does not require a "
                               f"gradient ({NO_GRAD_CAUSES}; or from a gradient that "
                               "grad(..., create_graph=True) found constant, as a linear "
                               "function's is: its own derivative is 0)")
    for position, x in enumerate(inputs):
        if not x.requires_grad:
            raise ValueError(f"grad(): input {position}, {x._describe()}, does not require a "
                             "gradient, so the outputs cannot be differentiated with respect to it")
    seeds = _seeds(outputs, g, single, create_graph)
    if create_graph:
        found = _graph_pass(outputs, seeds, inputs)
        return [found[k] if found[k] is not None else constant(_zeros(x)) for k, x in
                enumerate(inputs)]
    return _array_pass(outputs, seeds, inputs)


def _listed(what, nodes):
    if not isinstance(nodes, (list, tuple)) or not nodes:
        raise TypeError(f"grad(): {what} must be a node or a non-empty list of nodes, got "
                        f"{type(nodes).__name__}")
    for position, node in enumerate(nodes):
        if not isinstance(node, NetVar):
            raise TypeError(f"grad(): {what}[{position}] is a {type(node).__name__}, not a node")
    return list(nodes)


def _seeds(outputs, g, single, create_graph):
    """One seed per output: an array, or with create_graph a node (constants for arrays)."""
    if g is None:
        given = [None] * len(outputs)
    elif single:
        given = [g]
    elif not isinstance(g, (list, tuple)) or len(g) != len(outputs):
        got = f"{len(g)}" if isinstance(g, (list, tuple)) else f"a {type(g).__name__}"
        raise ValueError(f"grad(): g must be a list of {len(outputs)} seeds, one per output, got "
                         f"{got}")
    else:
        given = list(g)
    seeds = []
    for position, (y, seed) in enumerate(zip(outputs, given)):
        where = f"grad(): the seed of output {position}, {y._describe()}"
        if isinstance(seed, NetVar) and create_graph:
            if seed.shape != y.shape:
                raise ValueError(f"{where}: the seed must have the output's shape "
                                 f"{tuple(y.shape)}, got {tuple(seed.shape)}")
            if seed.dtype.kind != "f":
                raise TypeError(f"{where}: a seed must hold real floats, got {seed.dtype}")
            seeds.append(seed if seed.dtype == y.dtype else AsType(seed, y.dtype))
            continue
        else:                     # checked and copied as back() checks and copies its seed
            seed = seed_gradient(seed, y, where)
        seeds.append(constant(seed) if create_graph else seed)
    return seeds


def _zeros(x):
    return backend.array_module(x._data).zeros_like(x._data)


def _reachable(outputs):
    """The outputs and every node they depend on that requires a gradient (leaves included),
    children before parents (the engine's walk, ``core.collect``)."""
    return [node for node in collect(outputs, every=True) if node.requires_grad]


def _array_pass(outputs, seeds, inputs):
    """``back()`` from every output at once, with each node's ``.g`` put back afterwards."""
    nodes = _reachable(outputs)
    order = [node for node in nodes if node._parents]
    check_edits(order)                  # before any gradient changes
    held = hold_gradients(nodes)
    try:
        for node in nodes:
            node._g = None
        for y, seed in zip(outputs, seeds):
            y.accumulate(seed)
        propagate(order)
        # a copy where the gradient may be a seed or another node's array; an input the
        # outputs do not reach gets zeros, not the .g an earlier back() left it
        reached = set(map(id, nodes))
        return [gradient_copy(x) if id(x) in reached else
                backend.array_module(x._data).zeros_like(x._data) for x in inputs]
    finally:
        restore_gradients(held)


def _graph_pass(outputs, seeds, inputs, leaves=False):
    """The gradient of each input as a node (None where the outputs do not depend on it).

    Children before parents, as in ``back()``: each op whose gradient is known hands its
    parents theirs through ``_grads`` (or its composite), built with grad mode on. It walks the
    engine's collection (``core.collect``) but runs a loop of its own, not ``core.propagate``:
    its gradients are nodes kept in a dict (``.g`` holds arrays), and an ``Output`` hands its
    gradient to its op here as the engine does in ``back()``. With
    ``leaves`` the inputs are taken as leaves: their gradients are not passed on to what they
    were computed from (a composite's pass, whose caller passes them on).
    """
    nodes = _reachable(outputs)
    wanted = set(inputs)
    # The nodes on a path to an input: an input, or a node with such a parent.
    relevant = set()
    for node in reversed(nodes):
        if node in wanted or any(parent in relevant for parent in node._parents):
            relevant.add(node)
    grads = {}
    handed = {}       # op -> {k: gradient of its output k}, as back() hands them over
    with enable_grad():
        for y, seed in zip(outputs, seeds):
            _add(grads, y, seed)
        for node in nodes:
            if node not in relevant:
                continue
            g = grads.get(node)
            if isinstance(node, Output):
                if g is not None and not (leaves and node in wanted):
                    further = handed.setdefault(node._parents[0], {})
                    mine = further.get(node.k)        # two nodes of one output add up
                    further[node.k] = g if mine is None else mine + g
                continue
            if node._parents and node.n_outputs > 1:
                further = handed.pop(node, {})
                if g is None and not further:
                    continue
                g = (g,) + tuple(further.get(k) for k in range(1, node.n_outputs))
            if g is None or not node._parents or leaves and node in wanted:
                continue
            check_versions(node)
            parents = node._parents
            try:
                found = _op_grads(node, g, parents)
            except FloatingPointError as error:      # detect_anomaly() inside the rule's ops
                raise type(error)(f"{error} (while grad(create_graph=True) ran the gradient "
                                  f"rule of {node._describe()})") from error
            if len(found) != len(parents):
                raise ValueError(f"grad(): {type(node).__name__}._grads returned {len(found)} "
                                 f"gradients for {len(parents)} inputs")
            for parent, contribution in zip(parents, found):
                if contribution is not None and parent in relevant:
                    _add(grads, parent, contribution)
    return [grads.get(x) for x in inputs]


def _op_grads(node, g, parents):
    composite = getattr(node, "_composite", None)
    if composite is None:
        return tuple(node._grads(g, *parents))
    results, seeds = [composite(*parents)], [g]
    if node.n_outputs > 1:            # the outputs that got a gradient, with theirs
        results, seeds = zip(*[(y, gk) for y, gk in zip(results[0], g) if gk is not None])
    # A node given as two inputs gets its whole gradient once, at its first position. The
    # parents are leaves of this pass: an input computed from another input (a recurrent op's
    # initial state from the same weights) hands its gradient on in the caller's pass, once.
    wanted = list({id(parent): parent for parent in parents if parent.requires_grad}.values())
    found = _graph_pass(list(results), list(seeds), wanted, leaves=True) if wanted else []
    by_parent = dict(zip(map(id, wanted), found))
    return tuple(by_parent.pop(id(parent), None) for parent in parents)


def _add(grads, node, contribution):
    """Add a gradient node to ``node``'s, summed back to its shape with ops."""
    if not isinstance(contribution, NetVar):
        contribution = constant(contribution, node)
    if contribution.shape != node.shape:
        contribution = _sum_to(contribution, node.shape, node)
    if contribution.dtype != node.dtype:          # in the node's dtype, as back() keeps it
        contribution = AsType(contribution, node.dtype)
    mine = grads.get(node)
    grads[node] = contribution if mine is None else mine + contribution


def _sum_to(g, shape, node=None):
    """The node ``g`` summed over the axes along which an input of ``shape`` was broadcast (the
    differentiable ``unbroadcast``); refused when ``g`` cannot have come from broadcasting."""
    shape = tuple(shape)
    extra = g.ndim - len(shape)
    ok = extra >= 0 and all(n == 1 or n == m for n, m in zip(shape, g.shape[extra:]))
    if not ok:
        target = node._describe() if node is not None else f"shape {shape}"
        raise ValueError(f"grad(): a gradient of shape {tuple(g.shape)} cannot be summed back "
                         f"to {target}: an op's _grads returned a gradient of the wrong shape")
    axes = tuple(range(extra)) + tuple(
        extra + i for i, n in enumerate(shape) if n == 1 and g.shape[extra + i] != 1)
    if axes:
        g = Sum(g, axis=axes, keepdims=True)
    if extra or g.shape != shape:
        g = Reshape(g, shape)
    return g
