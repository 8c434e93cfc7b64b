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
# child prints the page faults of the third step and whether nnkit kept freed memory.
STEP = """
import resource, numpy as np, nnkit
def faults(): return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def step(): return sum(float(a[0]) for a in [np.ones(1 << 19, np.float32) for _ in range(24)])
step(); step()
before = faults(); step()
print(faults() - before, nnkit.backend.malloc_keeps_freed_memory)
"""


def _child(**settings):
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
    count, kept = done.stdout.split()
    return int(count), kept == "True"


@glibc_only
def test_a_step_after_import_gets_its_memory_back_without_page_faults():
    faults, kept = _child()
    assert kept
    assert faults < 1000                # 48 MB in fresh pages would be about 12,000


@glibc_only
def test_told_not_to_nnkit_leaves_malloc_to_give_memory_back():
    # the same step with glibc's own thresholds: the freed 48 MB come back as fresh pages
    faults, kept = _child(NNKIT_KEEP_FREED_MEMORY="0")
    assert not kept
    assert faults > 6000


@glibc_only
@pytest.mark.parametrize("setting", [{"MALLOC_TRIM_THRESHOLD_": "131072"},
                                     {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"}])
def test_glibc_settings_in_the_environment_are_the_users_choice(setting):
    faults, kept = _child(**setting)
    assert not kept
    assert faults > 6000


@pytest.mark.parametrize("limit", [-1, 1.5, "256", True, None])
def test_keep_freed_memory_refuses_a_limit_that_is_not_bytes(limit):
    with pytest.raises(ValueError, match="keep_freed_memory: limit must be an int"):
        nn.backend.keep_freed_memory(limit)
