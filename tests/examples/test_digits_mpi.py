"""examples/digits_mpi.py under ``mpiexec -n 2``: one line of results, from rank 0, and the
accuracy of the single-process example (20 epochs here to keep the test short)."""
import pytest

from tests.distributed import mpi_scenarios
from tests.examples.helpers import ROOT

NO_MPI = mpi_scenarios.why_no_mpi()


@pytest.mark.skipif(NO_MPI is not None, reason=str(NO_MPI))
def test_digits_mpi_on_two_processes_prints_its_accuracy_once(tmp_path):
    pytest.importorskip("sklearn")
    status, out, err = mpi_scenarios.launch(
        2, [ROOT / "examples" / "digits_mpi.py", tmp_path, 20], timeout=240)
    assert status == 0, err[-3000:]
    lines = out.strip().splitlines()
    assert [line for line in lines if line.startswith("test accuracy: ")] == lines[-1:]
    assert lines[0].startswith("2 process(es) trained 20 epochs")
    assert float(lines[-1].split(": ")[1]) >= 0.97
    assert (tmp_path / "digits-best.npz").is_file()
