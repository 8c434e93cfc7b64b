"""DLPack both ways: a node's memory shared with NumPy and PyTorch, nn.from_dlpack without a
copy where it can, a copy where it must (and saying so with copy=False), and the in-place
edit rules over shared memory."""
import numpy as np
import pytest

import nnkit as nn


def test_numpy_reads_a_node_without_a_copy():
    node = nn.NetVar(np.arange(6, dtype=np.float32).reshape(2, 3))
    view = np.from_dlpack(node)
    assert np.shares_memory(view, node.data)
    np.testing.assert_array_equal(view, node.data)
    assert node.__dlpack_device__()[0] == 1          # the host


def test_from_dlpack_shares_a_numpy_arrays_memory():
    array = np.arange(6.0).reshape(2, 3)
    node = nn.from_dlpack(array)
    assert np.shares_memory(node.data, array) and node.requires_grad
    array[0, 0] = 7
    assert node.data[0, 0] == 7
    row = nn.from_dlpack(np.arange(3.0), requires_grad=False)
    assert row.shape == (1, 3) and not row.requires_grad        # nnkit's row convention


def test_a_copy_is_made_only_when_it_must_be():
    frozen = np.arange(3.0)
    frozen.flags.writeable = False
    copied = nn.from_dlpack(frozen)
    assert not np.shares_memory(copied.data, frozen) and copied.data.flags.writeable
    with pytest.raises(ValueError, match="copy=False, but a copy is needed: x is read-only"):
        nn.from_dlpack(frozen, copy=False)
    counts = np.arange(3)
    with pytest.raises(ValueError, match="dtype policy makes int64 float"):
        nn.from_dlpack(counts, copy=False)
    as_float = nn.from_dlpack(counts)
    assert as_float.dtype == nn.get_dtype() and as_float.requires_grad
    assert nn.from_dlpack(counts, dtype=np.int64, copy=False).dtype == np.int64
    fresh = np.arange(3.0)
    assert not np.shares_memory(nn.from_dlpack(fresh, copy=True).data, fresh)
    with pytest.raises(TypeError, match="must be a DLPack producer"):
        nn.from_dlpack([1.0, 2.0])


def test_torch_both_ways():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    tensor = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    node = nn.from_dlpack(tensor)
    assert node.dtype == np.float32 and node.shape == (2, 3)
    tensor[1, 2] = 40
    assert node.data[1, 2] == 40                     # one memory
    back = torch.from_dlpack(node)
    node.data[0, 0] = -1
    assert back[0, 0].item() == -1

    weights = nn.from_dlpack(torch.ones(1, 3, dtype=torch.float64))
    shared = torch.from_dlpack(weights)
    (nn.NetVar([[1.0, 2.0, 3.0]], requires_grad=False) * weights).sum().back()
    nn.GD([weights], lr=0.5).step()                 # an optimizer updates in place
    assert (weights.data < 1).all()
    np.testing.assert_array_equal(shared.numpy(), weights.data)      # PyTorch sees the step


def test_a_producer_that_refuses_is_named():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    with pytest.raises(BufferError, match="from_dlpack: Tensor refused to export its data: "
                                          "Can.t export tensors that require gradient"):
        nn.from_dlpack(torch.ones(2, requires_grad=True))


def test_an_edit_through_the_producer_is_seen_after_mark_edited():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    tensor = torch.ones(2, 2, dtype=torch.float64)
    x = nn.from_dlpack(tensor)
    y = (x * x).sum()
    tensor.add_(1)                  # nnkit cannot see this edit by itself ...
    x.mark_edited()                 # ... so the editor records it, as after x.data[...] = v
    with pytest.raises(nn.InplaceEditError):
        y.back()


@pytest.mark.skipif(not nn.gpu_available(), reason="needs CuPy and a GPU")
def test_cupy_both_ways():
    import cupy
    array = cupy.arange(6, dtype=cupy.float32).reshape(2, 3)
    node = nn.from_dlpack(array)
    assert node.device.startswith("gpu") and node.dtype == np.float32
    array[0, 0] = 7
    assert float(node.data[0, 0]) == 7               # one memory, on the GPU
    back = cupy.from_dlpack(node)
    node.data[1, 1] = -3
    assert float(back[1, 1]) == -3
