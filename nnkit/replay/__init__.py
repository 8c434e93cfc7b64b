"""``nn.capture(fn)``: record a step's array operations once, replay them into arrays allocated once.

``step = nn.capture(fn)``; ``step(*inputs)`` returns what ``fn(*inputs)`` returns. The first call
with a signature (the inputs' shapes and dtypes, Python numbers by value, the grad and train
modes, the default dtype) runs ``fn`` eagerly while recording every array operation of the
forward pass, the backward pass and any optimizer step (``first_call.py``, ``record.py``); later
calls with that signature check that nothing the step reads changed (``world.py``), hand the
inputs over, and run the recorded operations (``schedule.py``, ``program.py``,
``instructions.py``) into the same arrays, with the optimizer's ``step()`` run as it is (it
reads its learning rate and counts live). The replay gives the same bits as eager; where it
cannot, the step records again or runs eagerly, never stale. docs/capture.md has the rules.
"""
from .captured import capture

__all__ = ["capture"]
