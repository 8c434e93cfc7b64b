"""Grad mode and train/eval mode are per thread: a thread inside no_grad() / eval_mode() does not
switch them off for another thread running at the same time."""
import threading

import numpy as np

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
