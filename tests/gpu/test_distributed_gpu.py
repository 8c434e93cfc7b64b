"""Data-parallel training with the model on the GPU: 2 processes (sharing a GPU, or one each)
under mpiexec give the CPU's single-process numbers. Skipped without CuPy and a GPU, or
without MPI. Through host buffers by default; run it again with NNKIT_MPI_CUDA_AWARE=1 on a
CUDA-aware MPI for the direct path (docs/distributed.md)."""
import numpy as np
import pytest

import nnkit as nn
from tests.distributed import mpi_scenarios as scenarios

NO_MPI = scenarios.why_no_mpi()


@pytest.mark.skipif(not nn.gpu_available(), reason="CuPy with a GPU is not available")
@pytest.mark.skipif(NO_MPI is not None, reason=str(NO_MPI))
def test_gpu_data_parallel_training_gives_the_cpu_numbers(tmp_path):
    status, output = scenarios.run_scenario(2, "gpu_equality", tmp_path, timeout=180)
    assert status == 0, output[-3000:]
    model, optimizer, trainer = scenarios.train_mlp(False)
    reference, _ = scenarios.state(model, optimizer)
    ranks = scenarios.results(tmp_path, "gpu_equality", 2)
    for arrays, numbers in ranks:
        assert arrays.keys() == reference.keys()
        for key, value in arrays.items():
            assert np.array_equal(value, ranks[0][0][key]), key        # the ranks agree exactly
            np.testing.assert_allclose(value, reference[key], rtol=1e-8, atol=1e-12,
                                       err_msg=key)
        np.testing.assert_allclose(numbers["history"]["loss"],
                                   scenarios.history(trainer)["loss"], rtol=1e-8)
