"""The guards: how a replay checks that what its step read is as it was when it recorded
(``guard`` makes one, ``failed_guard`` checks them all, ``changed`` compares two snapshots of
the Modules' attributes). ``world.py`` finds what to guard."""
import array
import collections.abc
import types

import numpy

from .instructions import exact

_ndarray = numpy.ndarray
_VALUES = (int, float, complex, bool, str, bytes, type(None), numpy.generic, numpy.dtype)
_SEQUENCES = (collections.deque, array.array, bytearray)     # compared by contents
_MISSING = object()
_LONGEST = 1000     # a longer list or dict read by the step is checked by identity only


def guard(where, read, value):
    """The guard on what ``read()`` gives, ``value`` now: ``(where, read, expected, how)``,
    ``how`` the way ``failed_guard`` compares: numbers, strings and tuples of them by value
    bit for bit (``exact``), arrays by identity and bytes, lists, dicts, sets, mappings and
    sequences of values by identity and items, a method by equality (it is made anew at each
    reading), anything else by identity."""
    if isinstance(value, _VALUES) or _plain_tuple(value):
        return (where, read, value, "value")
    if isinstance(value, _ndarray):
        return (where, read, (value, value.copy()), "array")
    if isinstance(value, (list, dict)) and all(
            isinstance(item, _VALUES) for item in _items(value).values()):
        return (where, read, (value, _exact_items(value)), "values")
    if isinstance(value, set) and all(isinstance(item, _VALUES) for item in value):
        return (where, read, (value, frozenset(value)), "set")
    if isinstance(value, collections.abc.Mapping) and not isinstance(value, dict):
        return (where, read, (value, _exact_items(value)), "mapping")
    if isinstance(value, memoryview):
        return (where, read, (value, value.tobytes()), "bytes")
    if isinstance(value, _SEQUENCES):
        return (where, read, (value, list(map(exact, value))), "sequence")
    if isinstance(value, (types.MethodType, types.BuiltinMethodType,
                          types.MethodWrapperType)):
        return (where, read, value, "equal")
    if isinstance(value, (list, dict)) and len(value) <= _LONGEST:
        return (where, read, (value, _in_order(value)), "items")
    return (where, read, value, "is")


def changed(before, after, ignore=()):
    """``(holder, name)`` of each attribute that differs between two snapshots (``ignore``: the
    ``(id(holder), name)`` a step changes by design)."""
    differences, earlier = [], {id(holder): old for holder, old in before}
    for holder, new in after:           # (holders found while the step ran: not in before)
        old = earlier.get(id(holder), new)
        for name in set(old) | set(new):
            if (id(holder), name) not in ignore and old.get(name, _MISSING) != new.get(name, _MISSING):
                differences.append((holder, name))
    return differences


def failed_guard(guards):
    """The description of the first guard that no longer holds, or None."""
    for where, read, expected, how in guards:
        try:
            value = read()
        except (KeyError, ValueError, AttributeError):
            return f"{where} is gone"
        if how == "is":
            if value is not expected:
                return f"{where} now holds another object"
        elif how == "values":       # a list or dict of numbers and strings, bit for bit
            container, items = expected
            if value is not container or _exact_items(value) != items:
                return f"{where} (a {type(container).__name__}) changed"
        elif how == "set":
            container, items = expected
            if value is not container or value != items:
                return f"{where} (a set) changed"
        elif how == "equal":        # a method: the same function (of the same object)
            if value != expected:
                return f"{where} is another function"
        elif how == "items":
            container, items = expected
            if value is not container or len(value) != len(items) or \
                    _in_order(value) != items:
                return f"{where} (a {type(container).__name__}) changed"
        elif how == "mapping":      # a UserDict, ChainMap, mappingproxy, os.environ
            container, items = expected
            if value is not container or _exact_items(value) != items:
                return f"{where} (a {type(container).__name__}) changed"
        elif how == "bytes":        # a memoryview: the bytes it shows
            container, contents = expected
            if value is not container or value.tobytes() != contents:
                return f"{where} (a memoryview) changed"
        elif how == "sequence":
            container, items = expected
            if value is not container or list(map(exact, value)) != items:
                return f"{where} (a {type(container).__name__}) changed"
        elif how == "array":
            array, contents = expected
            if value is not array or not _same_contents(array, contents):
                return f"{where} (an array) changed"
        elif type(value) is not type(expected) or not _equal(value, expected):
            return f"{where} changed from {_short(expected)} to {_short(value)}"
    return None


def _short(value):
    """``repr(value)``, cut to 80 characters (a node's shows its data)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _items(container):
    return container if isinstance(container, dict) else dict(enumerate(container))


def _equal(a, b):
    return exact(a) == exact(b)


def _in_order(container):
    """A list's or dict's items, in order (a dict reordered is another dict to the step that
    walks it), as ``_shallow`` compares them."""
    return list(_shallow(_items(container)).items())


def _exact_items(container):
    """A list's or a mapping's items as ``exact`` keys (== takes -0.0 for 0.0, 0.1 for
    NumPy's)."""
    items = container.items() if isinstance(container, collections.abc.Mapping) \
        else enumerate(container)
    return [(key, exact(item)) for key, item in items]


def _same_contents(array, contents):
    """Whether ``array`` holds the bytes of ``contents`` (its copy): -0.0 is not 0.0."""
    if array.shape != contents.shape or array.dtype != contents.dtype:
        return False
    try:
        return numpy.array_equal(array.view(numpy.uint8), contents.view(numpy.uint8))
    except (ValueError, TypeError):         # not laid out for a view of bytes
        return array.tobytes() == contents.tobytes()


def _plain_tuple(value):
    return type(value) is tuple and all(isinstance(v, _VALUES) or _plain_tuple(v) for v in value)


def _shallow(attributes, skip=()):
    snapshot = {}
    for name, value in attributes.items():
        if name in skip:
            continue
        if isinstance(value, _VALUES) or _plain_tuple(value):
            snapshot[name] = ("value", exact(value))
        elif isinstance(value, (list, dict)):
            items = value.items() if isinstance(value, dict) else enumerate(value)
            snapshot[name] = ("items", id(value), tuple((k, id(v)) for k, v in items))
        else:
            snapshot[name] = ("is", id(value))
    return snapshot
