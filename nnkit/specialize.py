"""One copy of a function per class (``own_code``), for the engine's functions run on every node.

NetOp gives each op class its own ``accumulate`` methods with it, and the operators' fast path
(ops/surface.py) its own ``apply`` and bookkeeping per operator.
"""
import types


def own_code(function, owner=None):
    """A copy of ``function`` with a code object of its own, and otherwise the same (defaults,
    attributes; named as a method of ``owner`` when given, so that pickle finds it there).

    CPython specialises each attribute read and write in a code object to the class of the
    object it last saw, and gives up the specialisation when the classes keep changing. The
    engine's functions that run on every node (``accumulate``, the operators' bookkeeping)
    meet nodes of every op class; one copy per class keeps each copy on one class. Measured on
    W1 (benchmarks/), about 6% of a tiny op's time. (So patching ``NetVar.accumulate`` reaches
    the leaves only: patch the op class whose nodes you mean.)
    """
    copy = types.FunctionType(function.__code__.replace(), function.__globals__,
                              function.__name__, function.__defaults__, function.__closure__)
    copy.__kwdefaults__ = function.__kwdefaults__
    copy.__dict__.update(function.__dict__)
    copy.__doc__ = function.__doc__
    copy.__qualname__ = function.__qualname__
    copy.__module__ = function.__module__
    if owner is not None:
        copy.__qualname__ = f"{owner.__qualname__}.{function.__name__}"
        copy.__module__ = owner.__module__
    return copy
