"""Host memory: nnkit lets glibc's malloc keep what a step frees (backend.keep_freed_memory)."""
import os
import subprocess
import sys

import pytest

import nnkit as nn


def _glibc():
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (ValueError, OSError):
        return False


glibc_only = pytest.mark.skipif(not _glibc(), reason="glibc's malloc (Linux) only")

# A "step" that makes 24 arrays of 2 MB and frees them, as a training step frees its graph; the
# child prints the page faults of the third step, the size of malloc's heap after it (glibc's
# mallinfo2, -1 before glibc 2.33) and whether nnkit set malloc's thresholds.
STEP = """
import ctypes, resource, numpy as np, nnkit
def faults(): return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def step(): return sum(float(a[0]) for a in [np.ones(1 << 19, np.float32) for _ in range(24)])
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks",
                "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
step(); step()
before = faults(); step()
count = faults() - before
try:
    info = ctypes.CDLL(None).mallinfo2
    info.restype = Info
    heap = info().arena
except AttributeError:
    heap = -1
print(count, heap, nnkit.backend.malloc_keeps_freed_memory)
"""
MB = 1 << 20


def _child(**settings):
    """(page faults of the third step, heap bytes after it or -1, whether nnkit kept memory)."""
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES",
                                                                "NNKIT_KEEP_FREED_MEMORY")}
    environment.update(settings)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    environment["PYTHONPATH"] = os.pathsep.join(
        [root] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    done = subprocess.run([sys.executable, "-c", STEP], env=environment, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    count, heap, kept = done.stdout.split()
    return int(count), int(heap), kept == "True"


def _huge_pages_always():
    """Whether the kernel backs all memory with huge pages (few, large page faults)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[always]" in f.read()
    except OSError:
        return False


def _given_back(faults, heap):
    """Whether malloc gave the freed 48 MB back to the system: its heap shrank (or, before
    glibc 2.33, the step faulted its pages in again)."""
    if heap >= 0:
        return heap < 24 * MB
    if _huge_pages_always():
        pytest.skip("no mallinfo2 and huge pages: page faults do not tell")
    return faults > 6000


@glibc_only
def test_a_step_after_import_gets_its_memory_back_without_page_faults():
    faults, heap, kept = _child()
    assert kept
    assert faults < 1000                # 48 MB in fresh pages would be about 12,000
    assert heap < 0 or heap >= 48 * MB
    assert not _given_back(faults, heap)


@glibc_only
def test_told_not_to_nnkit_leaves_malloc_to_give_memory_back():
    # the same step with glibc's own thresholds: the freed 48 MB go back to the system
    faults, heap, kept = _child(NNKIT_KEEP_FREED_MEMORY="0")
    assert not kept
    assert _given_back(faults, heap)


@glibc_only
@pytest.mark.parametrize("setting", [{"MALLOC_TRIM_THRESHOLD_": "131072"},
                                     {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"}])
def test_glibc_settings_in_the_environment_are_the_users_choice(setting):
    faults, heap, kept = _child(**setting)
    assert not kept
    assert _given_back(faults, heap)


@pytest.mark.parametrize("limit", [1.5, "256", True, None])
def test_keep_freed_memory_refuses_a_limit_that_is_not_an_int(limit):
    with pytest.raises(TypeError, match="keep_freed_memory: limit must be an int number of "
                                        "bytes, got"):
        nn.backend.keep_freed_memory(limit)


def test_keep_freed_memory_refuses_a_negative_limit():
    with pytest.raises(ValueError, match="keep_freed_memory: limit must be >= 0 bytes, got -1"):
        nn.backend.keep_freed_memory(-1)
