"""W7: W2-W4 on the GPU with CuPy, when CuPy and a GPU are present."""
from nnkit import backend


def gpu_rows(rounds):
    """The GPU rows, or a printed reason for skipping them."""
    cp = backend.cupy_module()
    if cp is None:
        print("W7 skipped: CuPy with a working GPU is not available on this machine")
        return []
    print("W7 skipped: the GPU workloads are not written yet")
    return []
