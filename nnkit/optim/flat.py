"""Small parameters updated together, as one flat array.

An optimizer whose ``_update`` treats each element alone (``elementwise = True``, declared by
the class that defines ``_update``) has ``step()`` update a run of small parameters of one
group, array type and dtype with a single ``_update`` call on their concatenation: a dozen NumPy
calls for the run instead of a dozen per parameter, which is most of a small model's update.
Each element goes through the same operations with the same numbers, so the parameters and
their state come out the same bits as updated one by one.

The run's state arrays live in flat arrays, and each parameter's ``state`` holds views into
them, so ``optimizer.state`` looks as it always does. A state array assigned anew (a checkpoint
loaded, ``state[i] = {}``, a copy of the optimizer) is seen at the next step: the run is
gathered again from what the states hold.
"""
from .. import backend

SMALL = 1 << 15         # elements: a parameter up to this size joins a run
RUN_MOST = 1 << 18      # elements in one run (its flat copies of gradients and parameters)


class FlatParameter:
    """What ``_update(p, g, state)`` reads of a parameter: ``p._data``, here the run's (the
    parameters of a run, as one; ``nn.capture`` takes it as a parameter, not a setting)."""
    __slots__ = ("_data",)


def elementwise(optimizer):
    """Whether the class that defines ``optimizer``'s ``_update`` declares it elementwise (a
    subclass that rewrites ``_update`` does not inherit the promise)."""
    for cls in type(optimizer).__mro__:
        if "_update" in vars(cls):
            return vars(cls).get("elementwise") is True
    return False


def runs(optimizer, items):
    """``items`` cut into runs updated together: consecutive small parameters of one group,
    array type and dtype (their gradients too), in distinct memory, whose states hold the same
    keys and counts (or nothing yet) and arrays of their own shape, type and dtype. The runs of
    the last step are taken again while each parameter and state is what it was."""
    kept = vars(optimizer).get("_flat_runs")
    if kept is not None and kept.still(optimizer, items):
        return kept.cut(items)
    if not elementwise(optimizer):
        return [[item] for item in items]
    lengths, previous, size = [], None, 0
    apart = _sharing([[item[1]._data] + [value for value in optimizer.state[item[0]].values()
                                         if backend.is_array(value)] for item in items])
    for index, item in enumerate(items):
        key = None if index in apart else _key(optimizer, item)
        n = item[1]._data.size
        if key is not None and key == previous and size + n <= RUN_MOST:
            lengths[-1] += 1
            size += n
        else:
            lengths.append(1)
            size = n
        previous = key
    optimizer._flat_runs = _Plan(optimizer, items, lengths)
    return optimizer._flat_runs.cut(items)


def _key(optimizer, item):
    """What the parameters of one run share, or None for a parameter updated alone."""
    position, p, group, g = item
    data = p._data
    kind = type(data)
    if data.size > SMALL or type(g) is not kind or g.dtype != data.dtype:
        return None
    entries = []
    for name, value in optimizer.state[position].items():
        if name in optimizer.state_counts and type(value) is int:
            entries.append((name, value))
        elif type(value) is kind and value.shape == data.shape and value.dtype == data.dtype:
            entries.append((name, None))
        else:
            return None
    return id(group), kind, data.dtype, tuple(sorted(entries))


def _sharing(arrays):
    """The positions of the lists of ``arrays`` (a parameter's data and state arrays each) that
    may share memory with another list's or among themselves, by their byte ranges, whatever
    their bases (a view through DLPack or ``as_strided``, one state array for two): those
    parameters are updated alone, in order, as one at a time."""
    spans = sorted((type(array).__name__, *bounds, position)
                   for position, group in enumerate(arrays) for array in group
                   if (bounds := _bounds(array)) is not None)
    apart, cluster, kind, end = set(), [], None, 0
    for this_kind, low, high, position in spans + [(None, 0, 0, None)]:
        if this_kind != kind or low >= end:         # a new cluster of overlapping ranges
            if len(cluster) > 1:
                apart.update(cluster)
            cluster, kind, end = [], this_kind, high
        cluster.append(position)
        end = max(end, high)
    return apart


def _bounds(array):
    """The bytes ``array`` spans, ``(low, high)``; None when empty (it shares nothing)."""
    if array.size == 0:
        return None
    low = high = array.data.ptr if hasattr(array.data, "ptr") else \
        array.__array_interface__["data"][0]            # (CuPy's address, NumPy's)
    for n, stride in zip(array.shape, array.strides):
        if stride < 0:
            low += (n - 1) * stride
        else:
            high += (n - 1) * stride
    return low, high + array.itemsize


def _forgotten():
    return None


class _Plan:
    """The last step's runs: which positions, with which arrays, and each run's buffers.

    A copy or a pickle of the optimizer leaves it behind (``_forgotten``): the copied states
    hold copies of the views, which view nothing, so the copy gathers its runs again."""

    def __reduce__(self):
        return _forgotten, ()

    def __init__(self, optimizer, items, lengths):
        self.positions = [item[0] for item in items]
        self.data = [item[1]._data for item in items]
        self.groups = [item[2] for item in items]
        self.lengths = lengths
        self.runs = {}          # first position of a run of several -> _Run

    def still(self, optimizer, items):
        """Whether ``items`` are the parameters, arrays and groups these runs were cut for, and
        every state of a run still holds its views (and the run's counts)."""
        if len(items) != len(self.positions):
            return False
        for (position, p, group, g), known, data, in_group in zip(
                items, self.positions, self.data, self.groups):
            if position != known or p._data is not data or group is not in_group or \
                    type(g) is not type(data) or g.dtype != data.dtype:
                return False
        return all(run.intact(optimizer) for run in self.runs.values())    # (the views)

    def cut(self, items):
        runs, start = [], 0
        for length in self.lengths:
            runs.append(items[start:start + length])
            start += length
        return runs


class _Run:
    """A run's flat buffers: its gradients, its parameters, and each state array."""

    def __init__(self, run):
        data = [item[1]._data for item in run]
        xp = backend.array_module(data[0])
        self.positions = [item[0] for item in run]
        self.shapes = [d.shape for d in data]
        self.sizes = [d.size for d in data]
        total = sum(self.sizes)
        self.grads = xp.empty(total, data[0].dtype)
        self.params = xp.empty(total, data[0].dtype)
        self.grad_views, self.param_views = self.split(self.grads), self.split(self.params)
        self.flats = {}         # state name -> the flat array the parameters' states view
        self.views = {}         # state name -> those views
        self.counts = {}        # state count name -> its value, the same for every parameter

    def split(self, flat):
        views, start = [], 0
        for shape, n in zip(self.shapes, self.sizes):
            views.append(flat[start:start + n].reshape(shape))
            start += n
        return views

    def intact(self, optimizer):
        """Whether every state of the run holds the run's views and counts, and nothing else."""
        entries = len(self.views) + len(self.counts)
        for index, position in enumerate(self.positions):
            state = optimizer.state[position]
            if len(state) != entries:
                return False
            for name, views in self.views.items():
                if state.get(name) is not views[index]:
                    return False
            for name, count in self.counts.items():
                if state.get(name) != count:
                    return False
        return True

    def keep(self, name, flat, states):
        self.flats[name] = flat
        self.views[name] = self.split(flat)
        for state, view in zip(states, self.views[name]):
            state[name] = view


def recount(optimizer):
    """Each run's counts taken again from its parameters' states, where they agree: after the
    states were put back in place (a replay's check against eager runs a step twice from one
    state), the runs and the states they view stay one."""
    plan = vars(optimizer).get("_flat_runs")
    for run in plan.runs.values() if plan is not None else ():
        for name in run.counts:
            values = {optimizer.state[position].get(name) for position in run.positions}
            if len(values) == 1:
                run.counts[name] = values.pop()


def gradient_homes(optimizer):
    """id(parameter) -> the view of the flat gradient array of its run (the last step's runs),
    where ``update`` finds the gradient without copying it when it is that very view: a
    replayed step computes it there (``replay/schedule.py``)."""
    plan = vars(optimizer).get("_flat_runs")
    if plan is None:
        return {}
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return {id(params[position]): view for run in plan.runs.values()
            for position, view in zip(run.positions, run.grad_views)}


def update(optimizer, run):
    """One ``_update`` call for the parameters of ``run`` (of ``runs``): their gradients and
    data copied into the run's flat buffers, the update, the data copied back."""
    plan = optimizer._flat_runs
    states = [optimizer.state[item[0]] for item in run]
    kept = plan.runs.get(run[0][0])
    if kept is None:                # (the states of a run kept are intact: Plan.still)
        kept = plan.runs[run[0][0]] = _Run(run)
        xp = backend.array_module(kept.params)
        for name, value in states[0].items():       # gathered from what the states hold
            if name in optimizer.state_counts:
                kept.counts[name] = value
            else:
                kept.keep(name, xp.concatenate([state[name].reshape(-1) for state in states]),
                          states)
    state = {**kept.flats, **kept.counts}
    for item, into, at in zip(run, kept.grad_views, kept.param_views):
        if into is not item[3]:     # (a replay computes it there: gradient_homes)
            into[...] = item[3]     # (a copy per array: faster than concatenate's out=)
        at[...] = item[1]._data
    flat = FlatParameter()
    flat._data = kept.params
    optimizer._update(flat, kept.grads, state)
    updated = kept.param_views if flat._data is kept.params else kept.split(flat._data)
    for item, new in zip(run, updated):
        item[1]._data[...] = new
    for name, value in state.items():
        if name in optimizer.state_counts:
            kept.counts[name] = value
            for each in states:
                each[name] = value
        elif value is not kept.flats.get(name):     # made by this update (the first step)
            kept.keep(name, value, states)
