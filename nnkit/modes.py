"""The grad and train modes: ``no_grad``, ``enable_grad``, ``train_mode``, ``eval_mode``.

Each is a context manager (and decorator) that sets one per-thread switch and restores it.
The engine (core.py) reads the switches on every op: ``state.grad`` and ``threads_without_grad``.
"""
import functools
import inspect
import threading

from . import checks


class _Modes(threading.local):
    grad = True       # ops record their parents (no_grad turns it off)
    train = True      # Dropout / BatchNorm behaviour


state = _Modes()      # this thread's modes
# How many threads have grad mode off. While it is 0, grad mode is on in every thread and NetOp
# skips the thread-local read (a third of a tiny op's bookkeeping). A list, so that the engine's
# binding of it sees the live count.
threads_without_grad = [0]
_grad_off_lock = threading.Lock()


class _Switch:
    """A context manager (and decorator) that sets one thread-local mode and restores it.

    What ``__enter__`` replaces is kept per thread, so one switch object (``quiet =
    no_grad()`` shared by several threads, or a decorated function running in several at
    once) restores each thread's own mode.
    """
    attribute = None

    def __new__(cls, *args, **kwargs):
        switch = super().__new__(cls)
        if len(args) == 1 and not kwargs and callable(args[0]):
            switch.__init__()       # @no_grad without parentheses: the decorated function
            return switch(args[0])
        return switch

    def __init__(self, value):
        self.value = value
        self._local = threading.local()

    def _saved(self):
        """This thread's stack of the modes the nested ``with`` blocks replaced."""
        if not hasattr(self._local, "saved"):
            self._local.saved = []
        return self._local.saved

    def __enter__(self):
        self._saved().append(getattr(state, self.attribute))
        self._set(self.value)
        return self

    def __exit__(self, *exc):
        self._set(self._saved().pop())
        return False

    def _set(self, value):
        """Set this thread's mode; ``threads_without_grad`` counts the threads whose grad mode
        is off, whatever order blocks end in (generators holding blocks across a yield may end
        them out of order, which a count of blocks would lose)."""
        before = getattr(state, self.attribute)
        setattr(state, self.attribute, value)
        if self.attribute == "grad" and before != value:
            with _grad_off_lock:
                threads_without_grad[0] += 1 if before else -1

    def __call__(self, function):
        """As a decorator: every call of ``function`` runs inside the switch. A generator
        function runs each of its steps inside it (its body runs at each ``next``, after the
        call has returned), and the caller's code between steps outside it; a coroutine
        function (``async def``) likewise runs each of its steps, between two awaits that
        suspend it, inside the switch."""
        if inspect.isgeneratorfunction(function):
            @functools.wraps(function)
            def generator(*args, **kwargs):
                steps = function(*args, **kwargs)
                return (yield from _each_step_inside(self, steps))
            return generator
        if inspect.iscoroutinefunction(function):
            @functools.wraps(function)
            async def coroutine(*args, **kwargs):
                return await _Steps(self, function(*args, **kwargs))
            return coroutine

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


class _Steps:
    """An awaitable running a coroutine's steps inside a switch (``_each_step_inside``)."""

    def __init__(self, switch, coroutine):
        self.switch, self.coroutine = switch, coroutine

    def __await__(self):
        return _each_step_inside(self.switch, self.coroutine.__await__())


class no_grad(_Switch):
    """``with nnkit.no_grad():`` ops record no parents, so nothing can be backpropagated.

    Use it for evaluation and inference: the graph is not kept, so memory stays flat.
    Also usable as a decorator, ``@no_grad()`` or ``@no_grad``. The mode is per thread.
    """
    attribute = "grad"

    def __init__(self):
        super().__init__(False)


class enable_grad(_Switch):
    """``with nnkit.enable_grad():`` turns recording back on inside a ``no_grad`` block
    (a decorator too, ``@enable_grad()`` or ``@enable_grad``)."""
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
        super().__init__(checks.flag("train_mode", "enabled", enabled))


def eval_mode():
    """Shorthand for ``train_mode(False)``."""
    return train_mode(False)


def is_training():
    """True unless this thread is inside ``train_mode(False)`` / ``eval_mode()``."""
    return state.train


def is_grad_enabled():
    """True unless this thread is inside ``no_grad()`` (ops then record no parents)."""
    return state.grad
