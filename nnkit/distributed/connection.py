"""The MPI connection: the world communicator (mpi4py's, found on first use, or a world of one
process without MPI), the launch checks, the abort of every rank on an uncaught exception, and
whether the MPI is CUDA-aware; ``rank()``, ``size()`` and ``barrier()``.

The state lives here (``_world``, ``_MPI``, ``_hooked``): the other modules read it through this
module (``connection._MPI``, ``_communicator()``), so that setting it here reaches them all.
"""
import os
import sys
import time

_world = None      # the communicator, found on first use: mpi4py's COMM_WORLD, or _Alone()
_MPI = None        # the mpi4py.MPI module when MPI is in use
_LAUNCHERS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")
_hooked = False    # whether sys.excepthook aborts the job


class _Alone:
    """The world of a process without MPI: one rank. Collectives never reach it (size 1
    returns before communicating)."""

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 1

    def Barrier(self):
        pass


def _communicator():
    global _world
    if _world is None:
        _world = _connect(os.environ)
    return _world


def _launched_size(environ):
    """``(processes, variable)`` when an MPI launcher's environment says how many processes it
    started, else ``(None, None)``."""
    for variable in _LAUNCHERS:
        value = environ.get(variable, "")
        if value.isdigit():
            return int(value), variable
    return None, None


def _connect(environ):
    """MPI's world communicator, or ``_Alone()`` without MPI; refuses a launch that MPI does not
    see (see the package docstring)."""
    global _MPI
    expected, variable = _launched_size(environ)
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError, OSError) as error:    # (no mpi4py, or no MPI library)
        if expected is not None and expected > 1:
            raise RuntimeError(
                f"nnkit.distributed: started as one of {expected} processes ({variable}="
                f"{expected}) but mpi4py cannot be used ({type(error).__name__}: {error}); "
                "install it with `pip install nnkit[mpi]` or `pip install mpi4py`") from error
        return _Alone()
    comm = MPI.COMM_WORLD
    if expected is not None and comm.Get_size() != expected:
        raise RuntimeError(
            f"nnkit.distributed: the launcher started {expected} processes ({variable}="
            f"{expected}) but MPI sees {comm.Get_size()}: mpi4py uses another MPI than the "
            f"mpiexec that started them (mpi4py's: {MPI.Get_library_version().splitlines()[0]})"
            "; run the mpiexec of that MPI")
    _MPI = MPI
    if comm.Get_size() > 1:
        _abort_on_uncaught_exception()
    return comm


def _abort_on_uncaught_exception():
    """Make an uncaught exception print its traceback and then end every rank (MPI_Abort).

    Without it the other ranks wait forever in their next collective for this one. Installed
    once: when this module is imported under a launcher of several processes (so that a rank
    failing before its first collective is covered too), else when MPI is found with several.
    """
    global _hooked
    if _hooked:
        return
    _hooked = True
    previous = sys.excepthook

    def abort(kind, value, traceback):
        previous(kind, value, traceback)
        try:
            comm = _communicator()
        except Exception:              # no usable MPI: nothing to abort
            return
        if comm.Get_size() > 1:
            print(f"nnkit.distributed: rank {comm.Get_rank()} of {comm.Get_size()} stopped on "
                  f"{kind.__name__}; aborting every rank (MPI_Abort)", file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
            # MPI_Abort tears down the launcher's output forwarding at once: on a loaded machine
            # the lines just written could be lost. Give them a moment to reach the terminal.
            time.sleep(0.5)
            comm.Abort(1)

    sys.excepthook = abort


if (_launched_size(os.environ)[0] or 0) > 1:
    _abort_on_uncaught_exception()


def _cuda_aware():
    return os.environ.get("NNKIT_MPI_CUDA_AWARE", "").lower() in ("1", "true", "yes")


def rank():
    """This process's number, 0 … size() − 1 (0 without MPI)."""
    return _communicator().Get_rank()


def size():
    """The number of processes (1 without MPI)."""
    return _communicator().Get_size()


def barrier():
    """Wait until every rank has called ``barrier()``."""
    _communicator().Barrier()
