"""The grad and train modes: ``no_grad``, ``enable_grad``, ``train_mode``, ``eval_mode``.

Each is a context manager (and decorator) that sets one per-thread switch of the engine and
restores it. The switches themselves live in core.py, which NetOp reads on every op; this module
only turns them.
"""
import copy
import functools
import threading

from . import core

_grad_off_lock = threading.Lock()


class _Switch:
    """A context manager (and decorator) that sets one thread-local mode and restores it."""
    attribute = None

    def __init__(self, value):
        self.value = value
        self._saved = []

    def __enter__(self):
        self._saved.append(getattr(core._state, self.attribute))
        setattr(core._state, self.attribute, self.value)
        self._count_grad_off(1)
        return self

    def __exit__(self, *exc):
        setattr(core._state, self.attribute, self._saved.pop())
        self._count_grad_off(-1)
        return False

    def _count_grad_off(self, step):
        if self.attribute == "grad" and not self.value:
            with _grad_off_lock:
                core._grad_off += step

    def __call__(self, function):
        """As a decorator: every call of ``function`` runs inside a fresh copy of the switch."""
        @functools.wraps(function)
        def wrapped(*args, **kwargs):
            switch = copy.copy(self)
            switch._saved = []
            with switch:
                return function(*args, **kwargs)
        return wrapped


class no_grad(_Switch):
    """``with nnkit.no_grad():`` ops record no parents, so nothing can be backpropagated.

    Use it for evaluation and inference: the graph is not kept, so memory stays flat.
    Also usable as a decorator. The mode is per thread.
    """
    attribute = "grad"

    def __init__(self):
        super().__init__(False)


class enable_grad(_Switch):
    """``with nnkit.enable_grad():`` turns recording back on inside a ``no_grad`` block."""
    attribute = "grad"

    def __init__(self):
        super().__init__(True)


class train_mode(_Switch):
    """``with nnkit.train_mode(False):`` evaluation behaviour for Dropout and BatchNorm.

    Training mode is on by default. ``nnkit.train_mode(False)`` (or ``nnkit.eval_mode()``)
    makes Dropout the identity and BatchNorm use its running statistics. The mode is per
    thread; ``is_training()`` reads it.
    """
    attribute = "train"

    def __init__(self, enabled=True):
        super().__init__(bool(enabled))


def eval_mode():
    """Shorthand for ``train_mode(False)``."""
    return train_mode(False)


def is_training():
    """True unless this thread is inside ``train_mode(False)`` / ``eval_mode()``."""
    return core._state.train


def is_grad_enabled():
    """True unless this thread is inside ``no_grad()`` (ops then record no parents)."""
    return core._state.grad
