"""``nn.save`` and ``nn.load``: the file's suffix picks its format.

- ``.safetensors``: the safetensors container (``nnkit.io.safetensors``), the same contents
  and guarantees as the ``.npz``;
- ``.pt``, ``.pth``: a PyTorch state dict written by ``torch.save(model.state_dict())``, read
  without PyTorch (``nnkit.io.torchfile``) and mapped onto an nnkit model of the same layers
  (``nnkit.io.torch_state``); load only;
- anything else: nnkit's ``.npz`` + JSON checkpoint (``nnkit.io.checkpoint``), the default.
"""
import os

from . import checkpoint, safetensors
from .checkpoint import Checkpoint, _file_path
from .fileformat import CheckpointError
from .torch_state import load_torch_state
from .torchfile import read_torch_file

__all__ = ['save', 'load']

TORCH_SUFFIXES = (".pt", ".pth")


def _suffix(path, where):
    return os.path.splitext(_file_path(path, where))[1].lower()


def save(path, model, optimizer=None, extra=None, *, schedule=None, trainer=None, rng=True):
    """Write ``model``'s parameters and buffers (and ``optimizer``'s state, and ``extra``) to
    ``path``; returns path.

    ``.safetensors``: one safetensors file (``nnkit.io.safetensors``); any other suffix: one
    ``.npz`` (``nnkit.io.checkpoint.save``, which says what ``model``, ``optimizer`` and
    ``extra`` may be, how the write is atomic and what is refused, and what ``schedule``,
    ``trainer`` and ``rng`` store for an exact resume). The two hold the same and load the
    same. nnkit writes no ``.pt``: give PyTorch ``nn.torch_state(model)``.
    """
    resume = {"schedule": schedule, "trainer": trainer, "rng": rng}
    suffix = _suffix(path, "save")
    if suffix == ".safetensors":
        return safetensors.save(path, model, optimizer=optimizer, extra=extra, **resume)
    if suffix in TORCH_SUFFIXES:
        raise ValueError(f"save: nnkit does not write PyTorch's {suffix} files; save to "
                         "'.safetensors' or '.npz', or hand PyTorch nn.torch_state(model): "
                         "torch_model.load_state_dict({k: torch.from_numpy(v) for k, v in "
                         "nn.torch_state(model).items()})")
    return checkpoint.save(path, model, optimizer=optimizer, extra=extra, **resume)


def load(path, model=None, optimizer=None, ops=None, *, schedule=None, trainer=None,
         rng=False):
    """Read a checkpoint; returns ``Checkpoint(model, extra)``.

    ``.safetensors``: a safetensors file (``nnkit.io.safetensors``: nnkit's own, or one another
    library wrote with the model's names); ``.pt`` / ``.pth``: a PyTorch state dict
    (``torch.save(torch_model.state_dict())``), read without PyTorch and without running any
    code from the file, into ``model`` (required; an nnkit model with the torch model's layers
    under the same attribute names, as ``nn.load_torch_state`` maps them; no optimizer); any
    other suffix: nnkit's ``.npz`` (``nnkit.io.checkpoint.load``, which says what is checked
    and what is refused, and what ``schedule``, ``trainer`` and ``rng`` restore). Nothing is
    changed when a file is refused (``CheckpointError``).
    """
    resume = {"schedule": schedule, "trainer": trainer, "rng": rng}
    suffix = _suffix(path, "load")
    if suffix == ".safetensors":
        return safetensors.load(path, model, optimizer=optimizer, ops=ops, **resume)
    if suffix in TORCH_SUFFIXES:
        if model is None:
            raise CheckpointError(f"load: '{path}' is a PyTorch state dict: give the nnkit "
                                  "model to load it into (it holds no architecture)")
        if optimizer is not None or schedule is not None or trainer is not None or rng:
            raise CheckpointError(f"load: '{path}' is a PyTorch state dict: it holds no nnkit "
                                  "optimizer, schedule, trainer or generator state")
        state = read_torch_file(path)
        try:
            load_torch_state(model, state)
        except (TypeError, ValueError) as error:
            raise CheckpointError(f"load: '{path}': {error}") from None
        return Checkpoint(model, None)
    return checkpoint.load(path, model, optimizer=optimizer, ops=ops, **resume)
