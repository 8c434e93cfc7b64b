"""The grad and train modes: ``no_grad``, ``enable_grad``, ``train_mode``, ``eval_mode``.

Each is a context manager (and decorator) that sets one per-thread switch of the engine and
restores it. The switches themselves live in core.py, which NetOp reads on every op; this module
only turns them.
"""
import functools
import inspect
import threading

from . import core

_grad_off_lock = threading.Lock()


class _Switch:
    """A context manager (and decorator) that sets one thread-local mode and restores it.

    What ``__enter__`` replaces is kept per thread, so one switch object (``quiet =
    no_grad()`` shared by several threads, or a decorated function running in several at
    once) restores each thread's own mode.
    """
    attribute = None

    def __init__(self, value):
        self.value = value
        self._local = threading.local()

    def _saved(self):
        """This thread's stack of the modes the nested ``with`` blocks replaced."""
        if not hasattr(self._local, "saved"):
            self._local.saved = []
        return self._local.saved

    def __enter__(self):
        self._saved().append(getattr(core._state, self.attribute))
        setattr(core._state, self.attribute, self.value)
        self._count_grad_off(1)
        return self

    def __exit__(self, *exc):
        setattr(core._state, self.attribute, self._saved().pop())
        self._count_grad_off(-1)
        return False

    def _count_grad_off(self, step):
        if self.attribute == "grad" and not self.value:
            with _grad_off_lock:
                core._grad_off += step

    def __call__(self, function):
        """As a decorator: every call of ``function`` runs inside the switch. A generator
        function runs each of its steps inside it (its body runs at each ``next``, after the
        call has returned), and the caller's code between steps outside it."""
        if inspect.isgeneratorfunction(function):
            @functools.wraps(function)
            def generator(*args, **kwargs):
                steps = function(*args, **kwargs)
                return (yield from _each_step_inside(self, steps))
            return generator

        @functools.wraps(function)
        def wrapped(*args, **kwargs):
            with self:
                return function(*args, **kwargs)
        return wrapped


def _each_step_inside(switch, steps):
    """Run the generator ``steps`` with ``switch`` on while it runs, and off between steps:
    what is sent or thrown into this generator is passed on to ``steps``."""
    resume, argument = steps.send, None
    while True:
        try:
            with switch:
                value = resume(argument)
        except StopIteration as stop:
            return stop.value
        try:
            argument = yield value
            resume = steps.send
        except GeneratorExit:
            with switch:
                steps.close()
            raise
        except BaseException as error:
            resume, argument = steps.throw, error


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
