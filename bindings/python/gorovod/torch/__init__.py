"""gorovod's PyTorch binding, with Horovod's API: a Horovod PyTorch script
runs under ``gorovod run`` after changing ``import horovod.torch as hvd`` to
``import gorovod.torch as hvd``.

What differs from Horovod is listed in the project README (the API table)
and in each module's docstring; the main points: collectives pair up by
their order on each worker (every worker must call the same ones in the same
order), CPU tensors only; process sets as Horovod's, but a world change
removes them (add them again at the start of the function elastic.run
wraps).
"""

from gorovod.exceptions import (HorovodInternalError, HostsUpdatedInterrupt, MismatchError, ForkedProcessError,
                                WorkerExcluded, GorovodError)
from gorovod.torch import elastic
from gorovod.torch.compression import Compression
from gorovod.torch.functions import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
from gorovod.torch.mpi_ops import allreduce, allreduce_async, allreduce_, allreduce_async_
from gorovod.torch.mpi_ops import grouped_allreduce, grouped_allreduce_async, grouped_allreduce_, grouped_allreduce_async_
from gorovod.torch.mpi_ops import allgather, allgather_async, grouped_allgather, grouped_allgather_async
from gorovod.torch.mpi_ops import broadcast, broadcast_async, broadcast_, broadcast_async_, grouped_broadcast_
from gorovod.torch.mpi_ops import alltoall, alltoall_async, sparse_allreduce_async
from gorovod.torch.mpi_ops import reducescatter, reducescatter_async, grouped_reducescatter, grouped_reducescatter_async
from gorovod.torch.mpi_ops import join, barrier, poll, synchronize
from gorovod.torch.mpi_ops import init, shutdown, is_initialized, start_timeline, stop_timeline
from gorovod.torch.mpi_ops import size, local_size, cross_size, rank, local_rank, cross_rank, is_homogeneous
from gorovod.torch.mpi_ops import mpi_threads_supported, mpi_enabled, mpi_built, gloo_enabled, gloo_built
from gorovod.torch.mpi_ops import nccl_built, ddl_built, ccl_built, cuda_built, rocm_built
from gorovod.torch.mpi_ops import ProcessSet, global_process_set, add_process_set, remove_process_set
from gorovod.torch.mpi_ops import Average, Sum, Adasum, Min, Max, Product
from gorovod.torch.optimizer import DistributedOptimizer
from gorovod.torch.sync_batch_norm import SyncBatchNorm
from gorovod.torch.adaptive import AdaptiveDataLoader, AdaptiveOptimizer
