"""Grad mode and train/eval mode are per thread: a thread inside no_grad() / eval_mode() does not
switch them off for another thread running at the same time."""
import threading

import numpy as np
import pytest

import nnkit as nn

ROUNDS = 20


def _observe(inside_modes, barrier, seen, errors):
    """Alternate with the other thread (the barrier makes every round interleave) and record
    what this thread sees: grad mode, train mode and whether an op recorded its parents."""
    try:
        w = nn.NetVar(np.ones((1, 2)))
        for _ in range(ROUNDS):
            if inside_modes:
                with nn.no_grad(), nn.eval_mode():
                    barrier.wait()      # both threads are now inside their own blocks
                    seen.append((nn.is_grad_enabled(), nn.is_training(), bool((w * 2.0).parents)))
                    barrier.wait()
            else:
                barrier.wait()
                seen.append((nn.is_grad_enabled(), nn.is_training(), bool((w * 2.0).parents)))
                barrier.wait()
    except Exception as error:          # reported by the main thread
        errors.append(error)
        barrier.abort()


def test_grad_and_train_modes_are_thread_local():
    barrier = threading.Barrier(2, timeout=10)
    seen = {True: [], False: []}
    errors = []
    threads = [threading.Thread(target=_observe, args=(inside, barrier, seen[inside], errors))
               for inside in (True, False)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert seen[True] == [(False, False, False)] * ROUNDS
    assert seen[False] == [(True, True, True)] * ROUNDS
    assert nn.is_grad_enabled() and nn.is_training()     # the main thread was never touched


def test_a_new_thread_starts_in_the_default_modes():
    seen = []
    with nn.no_grad(), nn.eval_mode():
        thread = threading.Thread(target=lambda: seen.append(
            (nn.is_grad_enabled(), nn.is_training())))
        thread.start()
        thread.join()
        assert not nn.is_grad_enabled() and not nn.is_training()
    assert seen == [(True, True)]


def test_one_switch_object_shared_by_two_threads_restores_each_threads_own_mode():
    # One no_grad() object entered by two threads: its saved modes were one list, so a thread
    # leaving it took the other thread's mode (here: A left with grad off, B with grad on).
    quiet = nn.no_grad()
    barrier = threading.Barrier(2, timeout=10)
    after = {}

    def thread_a():
        with quiet:                         # grad on before
            barrier.wait()                  # 1: A inside
            barrier.wait()                  # 2: B inside
        after["a"] = nn.is_grad_enabled()
        barrier.wait()                      # 3: A has left

    def thread_b():
        with nn.no_grad():                  # grad off before
            barrier.wait()                  # 1
            with quiet:
                barrier.wait()              # 2
                barrier.wait()              # 3
            after["b"] = nn.is_grad_enabled()

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert after == {"a": True, "b": False}


def test_a_decorated_generator_runs_its_steps_in_the_mode_and_the_caller_outside():
    w = nn.NetVar(np.ones((1, 2)))
    cleaned = []

    @nn.no_grad()
    def steps():
        try:
            while True:
                try:
                    yield bool((w * 2.0).parents), nn.is_training()
                except ValueError:
                    yield "handled", nn.is_grad_enabled()
        finally:
            cleaned.append(nn.is_grad_enabled())

    @nn.eval_mode()
    def counted(n):
        for _ in range(n):
            yield nn.is_training()
        return "done"

    run = steps()
    assert next(run) == (False, True)              # the body records no parents...
    assert bool((w * 2.0).parents) and nn.is_grad_enabled()    # ...the caller does
    assert run.throw(ValueError("x")) == ("handled", False)
    assert next(run) == (False, True)
    run.close()
    assert cleaned == [False] and nn.is_grad_enabled()
    assert list(counted(3)) == [False] * 3 and nn.is_training()
    with pytest.raises(StopIteration) as stop:
        next(counted(0))
    assert stop.value.value == "done"


def test_mode_blocks_ended_out_of_order_by_generators_leave_mode_and_ops_agreeing():
    # a no_grad and an enable_grad block held across yields, ended in the order they began:
    # is_grad_enabled() said off while ops still recorded (a count of blocks reached 0)
    w = nn.NetVar(np.ones((1, 2)))

    def holding(switch):
        with switch:
            yield

    first, second = holding(nn.no_grad()), holding(nn.enable_grad())
    next(first)
    next(second)
    for steps in (first, second):
        next(steps, None)
    assert nn.is_grad_enabled() is False
    assert (w * 2).requires_grad is False            # the ops agree with the mode
    with nn.enable_grad():
        assert (w * 2).requires_grad is True
    nn.enable_grad().__enter__()       # this thread's mode on again, for the tests after
    assert nn.is_grad_enabled() is True and (w * 2).requires_grad is True


def test_mode_decorators_cover_coroutines_and_bare_use():
    import asyncio
    w = nn.NetVar(np.ones((1, 2)))

    @nn.no_grad()
    async def quiet():
        await asyncio.sleep(0)
        return (w * 2).requires_grad, nn.is_grad_enabled()

    @nn.eval_mode()
    async def evaluating():
        await asyncio.sleep(0)
        return nn.is_training()

    async def both():
        return await quiet(), await evaluating(), nn.is_grad_enabled(), nn.is_training()

    # the body ran after the call returned, outside the mode: a graph and Dropout in training
    assert asyncio.run(both()) == ((False, False), False, True, True)

    @nn.no_grad                          # without parentheses, as PyTorch allows
    def bare():
        return (w * 2).requires_grad

    assert bare() is False and (w * 2).requires_grad is True
    with pytest.raises(TypeError, match="train_mode: enabled must be True or False, got str"):
        nn.train_mode("False")


def test_detect_anomaly_blocks_ended_out_of_order_leave_no_checker_attached():
    # each block restored the observers it saw at its start: ended out of order (generators,
    # threads), a checker stayed attached for good and raised outside any block
    from nnkit import core

    def holding():
        with nn.detect_anomaly():
            yield

    first, second = holding(), holding()
    next(first)
    next(second)
    for steps in (first, second):
        next(steps, None)
    assert core.observers == [] and not core.anomaly_mode()
    with nn.detect_anomaly():
        with nn.detect_anomaly(False):
            assert not core.anomaly_mode()
        assert core.anomaly_mode()
    assert core.observers == []
