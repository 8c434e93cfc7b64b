"""Data-parallel training over MPI (mpi4py): one process per model copy, gradients averaged.

    import nnkit.distributed as dist

    model = ...                                   # built alike (or not: rank 0's values win)
    trainer = nn.Trainer(step, nn.Adam(model.vars), hooks=[dist.DataParallel(model)])
    trainer.fit(lambda: nn.minibatches(seqs, targets, 64, shard=True), epochs=10)

Run it with ``mpiexec -n 4 python train.py`` (``srun python train.py`` under Slurm). Every
process (a rank) holds a copy of the model and computes the gradient of its shard of each batch;
the gradients are summed over the ranks in one all-reduce per dtype, and every copy takes the
same step. Without MPI, or when not started by an MPI launcher, the same script runs as one
process: ``size()`` is 1, ``rank()`` 0, and every collective returns at once.

The functions, for a hand-written loop:

- ``rank()``, ``size()``, ``barrier()``;
- ``broadcast_vars(params, root=0)``: every rank takes root's parameter values (and a
  Module's buffers);
- ``allreduce_grads(params, average=True, weight=None)``: the gradients summed (or averaged)
  over the ranks, packed into one contiguous buffer per dtype and reduced in one call each;
  its first call and every 100th (``check_parameters_every(n)``) check that the ranks hold
  the same parameter values, raising on every rank otherwise;
- ``allreduce(value, op="sum")`` and ``broadcast(value, root=0)``: numbers and arrays, for
  metrics;
- ``shard(sequence_or_count)``: this rank's contiguous, balanced share;
- ``rng_states()``: every rank's random generator state, for a checkpoint that resumes each
  rank's stream (``nn.save(..., rng=dist.rng_states())``).

**Loss normalisation.** Every nnkit loss is a mean over its batch. Rank k's shard has n_k of
the batch's B = Σ n_k rows (or valid positions), so its loss L_k is a mean over n_k and the loss
of the whole batch is L = Σ_k (n_k / B) · L_k: its gradient is Σ_k n_k · ∇L_k / Σ_k n_k.
``allreduce_grads(params, weight=n_k)`` computes exactly that (``DataParallel`` passes each
batch's rows, or ``mask.sum()``), so N ranks give the gradient of one process on the whole
batch, uneven shards included. Without ``weight`` the ranks count alike (right for equal
shards); ``average=False`` sums, for a loss each rank already divides by the global B.

**Communication.** mpi4py is imported the first time a function here is called; MPI's world
communicator is then used for the life of the process. Over several processes an uncaught
exception on any rank, before its first collective too, prints its traceback and aborts the
whole job (``MPI_Abort``), so no rank waits forever in a collective for a rank that died. A launcher that started several processes
(``PMI_SIZE``, ``OMPI_COMM_WORLD_SIZE``) while mpi4py cannot be imported, or reports another
number of processes (mpi4py built for another MPI than the ``mpiexec`` used), raises
RuntimeError instead of training N unrelated copies.

**GPU (CuPy).** Gradients on the GPU are packed into one device buffer per dtype. When the MPI is
CUDA-aware (say so with the environment variable ``NNKIT_MPI_CUDA_AWARE=1``: Open MPI or
MVAPICH built with CUDA, MPICH with ``MPIR_CVAR_ENABLE_GPU=1``), MPI reduces that device buffer
directly; otherwise the buffer makes one copy to the host and one back per step. Either way the
step synchronises with the GPU once, since MPI needs the gradients complete. float16 data is
reduced in float32.
"""
__all__ = ['rank', 'size', 'barrier', 'broadcast_vars', 'allreduce_grads',
           'check_parameters_every', 'allreduce', 'broadcast', 'shard', 'rng_states',
           'DataParallel']

from .collectives import (allreduce, allreduce_grads, broadcast, broadcast_vars,
                          check_parameters_every, rng_states, shard)
from .connection import barrier, rank, size
from .parallel import DataParallel
