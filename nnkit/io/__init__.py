"""Checkpoints: parameters, buffers and optimizer state in one .npz (+ JSON; never pickle or eval).

    nn.save("model.npz", model, optimizer=opt, extra={"epoch": 7})
    nn.load("model.npz", model, optimizer=opt)       # restore into the existing objects
    net = nn.load("model.npz").model                  # or rebuild an FFN from the file

What ``model`` may be (for ``save`` and ``load`` alike):

- any ``nn.Module``, nested as deep as you like: an FFN, a SequenceModel, your own subclass
  holding modules, parameters, BatchNormStates and lists or dicts of them. Its parameters and
  buffers are stored under the dotted names of ``named_vars()`` and ``named_buffers()``
  (``blocks.0.fc.W``, ``bn.running_mean``). An FFN names by place, ``topology.<entry>.<argument>``:
  ``topology.0.1`` is the W of ``(Multiply, W)``, and the running statistics of
  ``(BatchNorm, gamma, beta, state)`` at entry 3 are ``topology.3.3.running_mean`` and
  ``topology.3.3.running_var``; an FFN inside an FFN adds its place (``topology.0.0.topology.0.1``);
- a dict, list or tuple, nested as you like, of parameters (leaf NetVars that require a
  gradient), constants (leaf NetVars that do not) and Modules, named by keys and indices:
  ``{"enc": {"w": w}, "layers": [block]}`` stores ``enc.w`` and ``layers.0.<the block's
  names>``. Anything else in it (a number, None, a set) is refused, naming where it is and
  what it is. Both are listed by the one walk over models, ``nnkit.module.walk``, whose errors
  these are.

A parameter reachable under several names (a shared weight) is stored once, under its first
name, as ``named_vars()`` lists it; ``load`` assigns into the existing objects, so what is
shared in the model stays shared. A BatchNormState's ``num_batches_tracked``, ``momentum`` and
``eps`` are settings, not buffers: they are restored only when an FFN is rebuilt.

The file (format version 2). One ``.npz`` holds every array (host copies, so a checkpoint
written from GPU data loads in a NumPy-only session) and, under the key ``__nnkit__``, a UTF-8
JSON description: ``format`` and ``version``; ``model``, the saved object's type and, when
``load`` cannot rebuild it without a model, why; ``params`` and ``buffers``, each name with its
array's key, shape and dtype; ``optimizer``, its type, options, group options and sizes, the
names of the parameters it updates in its order (so its per-parameter state maps to the model
by name, whatever order the optimizer lists them in) and that state (numbers inline, arrays by
key); ``extra``; and for an FFN its ``topology`` as plain data: op names with arguments that are
parameter references, BatchNormStates (features, momentum, eps, batches seen, the names of its
two buffers), constants (arrays by key) or numbers. An entry that cannot be described as data (a
function, a Module other than an FFN, an argument of another type) keeps its label and the
reason, with ``args`` null: saving works, rebuilding refuses. Loading maps op names through a
registry of nnkit's public op classes (``ops=`` adds your own) and reads with
``numpy.load(..., allow_pickle=False)``.

What resuming needs besides, each optional and absent from older files (which load as before):
``schedule`` and ``trainer``, each ``{"type": class name, "state": its state_dict()}``, and
``rng``, the random generator states of the ranks that saved (``[get_rng_state()]`` in one
process), all plain JSON; ``load`` restores each only when asked (``schedule=``, ``trainer=``,
``rng=True``), checked before anything is assigned (see docs/resuming.md).

Version 1 files (nnkit before Modules) still load. Version 1 had no buffers and named an FFN's
parameters ``<entry>.<Op>.<argument>`` (``0.Multiply.1``; ``2.FFN.0.Multiply.1`` inside a nested
FFN): loading one into an FFN maps those names onto the model's parameters, and dicts and lists
were named as they are now. Rebuilding works as for version 2.

Without a model, ``load`` rebuilds an FFN from its topology (BatchNormStates included, shared
weights and states still shared), and returns what was saved from a dict or list of parameters
as one flat dict of dotted name → NetVar. Any other model (a Module that is not an FFN, an FFN
with an entry that is not data, a dict holding a Module) cannot be rebuilt from data: ``load``
raises CheckpointError naming it; give the model to load into.

io knows no model class: a model saved with its topology implements a small protocol. It is a
Module with ``topology``, a list of ``(op, *args)`` entries where ``(model,)`` holds another
such model; its class registers with ``saved_with_topology``, which also names the class
``load`` rebuilds a topology with (``cls(*entries)``). ``nnkit.nets.ffn`` registers FFN, so io
sits below the networks: nets import io, io imports no net. ``check_model(model, where)`` lists
and checks a model as ``save`` does (``SaveBest`` uses it to refuse a model when it is built).

Safety: ``save`` checks everything first (a refused save leaves an existing file as it was),
then writes a temporary file in the target's directory and renames it over the target
(``os.replace``), so a crash mid-save leaves the previous checkpoint intact. ``load`` reads and
checks everything (file integrity, every name, shape and dtype of parameters and buffers, the
topology, the optimizer's state) before assigning anything: on any mismatch it raises
``CheckpointError`` naming the first difference, and the model's parameters, buffers and
gradients and the optimizer are unchanged.

The package, bottom to top: ``model`` (what can be saved: ``check_model``, the dict or list seen
as a Module, ``saved_with_topology``), ``fileformat`` (the .npz and its JSON description: the
atomic write, reading and checking arrays, ``CheckpointError``), ``topology`` (an FFN as plain
data: the op registry, encoding and rebuilding, version 1 names) and ``checkpoint`` (``save``,
``load`` and the optimizer's state). Other formats (``files`` picks one by the suffix):
``safetensors``, PyTorch's ``.pt`` read with an allow-list unpickler (``torchfile``), PyTorch
state dicts (``torch_state``) and DLPack (``dlpack``); docs/weights.md shows them.
"""
from .checkpoint import Checkpoint
from .dlpack import from_dlpack
from .files import load, save      # by suffix: .safetensors, .pt / .pth (load), else .npz
from .fileformat import CheckpointError
from .model import check_model, saved_with_topology  # noqa: F401 (nnkit.nets uses them)
from .safetensors import read_safetensors, write_safetensors
from .torch_state import load_torch_state, torch_state
from .torchfile import read_torch_file

__all__ = ['save', 'load', 'Checkpoint', 'CheckpointError', 'read_safetensors',
           'write_safetensors', 'load_torch_state', 'torch_state', 'read_torch_file',
           'from_dlpack']
