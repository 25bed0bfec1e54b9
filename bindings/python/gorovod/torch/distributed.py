"""gorovod as a ``torch.distributed`` backend: ``dist.init_process_group("gorovod")``.

Importing this module registers the backend and, inside a gorovod job,
joins it and sets torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
and GROUP_RANK (where unset). Under ``gorovod run`` a script then needs no
address, port, rank or world size: they come from the job::

    import torch.distributed as dist
    import gorovod.torch.distributed  # registers the "gorovod" backend

    dist.init_process_group("gorovod")
    model = torch.nn.parallel.DistributedDataParallel(model)

What the process group offers, on CPU tensors of the dtypes gorovod.torch
reduces (float32, float64, float16, bfloat16, int32, int64, uint8; the
moving collectives take any dtype):

- ``all_reduce`` with SUM, AVG, MIN, MAX and PRODUCT, synchronous or
  ``async_op=True`` (the work's ``wait()`` and ``get_future()``);
- ``broadcast``, ``all_gather``, ``_all_gather_base`` (``all_gather_into_tensor``),
  ``reduce_scatter``, ``_reduce_scatter_base``, ``all_to_all``,
  ``all_to_all_single`` (with or without split sizes), ``barrier``;
- ``DistributedDataParallel`` (its gradient buckets, ``no_sync``, comm
  hooks, which get futures completed by the collectives themselves).

Not offered: ``send``/``recv`` and the rooted ``reduce``/``gather``/``scatter``
(gorovod has no point-to-point or rooted path: they raise RuntimeError
naming the missing call), process groups other than the default one
(``new_group``), and CUDA tensors.

How it works: each call goes to gorovod.torch's collectives, which run in
submission order on gorovod's engine. Every rank must call the same
collectives in the same order, as with every ``torch.distributed``
backend. One thread per process group completes the works' futures in that
order, so DDP's next bucket is already on the wire while the previous one
is being reduced.

The rendezvous: with ``init_method`` left out, torch's default is ``env://``,
which needs MASTER_ADDR and MASTER_PORT. Inside a gorovod job (GOROVOD_JOB
in the environment) with no MASTER_ADDR set, this module's ``env://``
handler answers instead with gorovod's own rank and world size and a
TCPStore that gorovod's rank 0 serves on a port the kernel picks (its
address reaches the others over gorovod's broadcast); torch uses the store
for its barrier at the end of init_process_group. Everywhere
else (MASTER_ADDR set, or outside a gorovod job) torch's own ``env://``
handler runs unchanged, so Gloo and NCCL keep working.
"""

import importlib
import logging
import os
import queue
import socket
import threading

import torch
import torch.distributed as dist
from torch.futures import Future

from gorovod.torch import mpi_ops

__all__ = ["BACKEND", "ProcessGroupGorovod", "register"]

BACKEND = "gorovod"

_log = logging.getLogger("gorovod")


def _reduce_op(op):
    """gorovod.torch's op for a torch.distributed ReduceOp."""
    for theirs, ours in ((dist.ReduceOp.SUM, mpi_ops.Sum), (dist.ReduceOp.MIN, mpi_ops.Min),
                         (dist.ReduceOp.MAX, mpi_ops.Max), (dist.ReduceOp.PRODUCT, mpi_ops.Product)):
        if op == theirs:
            return ours
    if hasattr(dist.ReduceOp, "AVG") and op == dist.ReduceOp.AVG:
        return mpi_ops.Average
    raise RuntimeError("gorovod backend: reduce op %s is not offered (SUM, AVG, MIN, MAX, PRODUCT are)" % (op,))


class _Work(dist._Work):
    """A collective in flight: wait() blocks until it is done, get_future()
    gives a Future that the process group's completer sets."""

    def __init__(self, future):
        super().__init__()
        self._future = future

    def wait(self, timeout=None):
        self._future.wait()  # raises the collective's error, if any
        return True

    def is_completed(self):
        return self._future.done()

    def is_success(self):
        if not self._future.done():
            return False
        try:
            self._future.value()
        except Exception:  # noqa: BLE001 (any failure of the collective)
            return False
        return True

    def exception(self):
        try:
            self._future.value()
        except Exception as e:  # noqa: BLE001
            return e
        return None

    def get_future(self):
        return self._future

    def result(self):
        return self._future.value()

    def synchronize(self):
        self.wait()


class ProcessGroupGorovod(dist.ProcessGroup):
    """The default process group of a ``torch.distributed`` job on gorovod:
    rank and size are gorovod's (``hvd.rank()``, ``hvd.size()``)."""

    def __init__(self, rank, size):
        super().__init__(rank, size)
        self._pending = queue.Queue()
        # torch (1.13) keeps only the C++ side of a work a Python process
        # group returns: unless Python holds the work too, its overrides are
        # gone by the time C++ calls wait() (DDP does), which then blocks
        # forever. Works stay referenced until their collective is done.
        self._inflight = set()
        self._lock = threading.Lock()
        self._completer = threading.Thread(target=self._complete, name="gorovod-pg-completer", daemon=True)
        self._completer.start()

    def getBackendName(self):
        return BACKEND

    def _complete(self):
        while True:
            item = self._pending.get()
            if item is None:
                return
            handles, finish, future, work = item
            try:
                outputs = [mpi_ops.synchronize(h) for h in handles]
                future.set_result(finish(outputs))
            except Exception as e:  # noqa: BLE001 (handed to the waiter)
                future.set_exception(e)
            finally:
                with self._lock:
                    self._inflight.discard(work)

    def _submit(self, handles, finish):
        future = Future()
        work = _Work(future)
        with self._lock:
            self._inflight.add(work)
        self._pending.put((handles, finish, future, work))
        return work

    def _done(self, value):
        return self._submit([], lambda _: value)

    # ----- the collectives

    def allreduce(self, tensors, opts=None):
        op = _reduce_op(opts.reduceOp) if opts is not None else mpi_ops.Sum
        handles = [mpi_ops.allreduce_async_(t, op=op) for t in tensors]
        return self._submit(handles, lambda _: tensors)

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        handles = [mpi_ops.broadcast_async_(t, root) for t in tensors]
        return self._submit(handles, lambda _: tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        # output_tensors[i] is a list of size() tensors, one per rank.
        self._check_one("allgather", input_tensors)
        inp, outs = input_tensors[0], output_tensors[0]
        self._check_list("allgather", outs)
        handle = mpi_ops.allgather_async(inp.reshape((1,) + tuple(inp.shape)))

        def finish(results):
            for out, part in zip(outs, results[0]):
                out.copy_(part.reshape(out.shape))
            return output_tensors

        return self._submit([handle], finish)

    def _allgather_base(self, output, input, opts=None):
        handle = mpi_ops.allgather_async(input.reshape((1, input.numel())))

        def finish(results):
            output.copy_(results[0].reshape(output.shape))
            return [output]

        return self._submit([handle], finish)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        # input_tensors[0] is a list of size() tensors; rank r keeps the
        # reduction of every rank's r-th.
        op = _reduce_op(opts.reduceOp) if opts is not None else mpi_ops.Sum
        self._check_one("reduce_scatter", output_tensors)
        out, parts = output_tensors[0], input_tensors[0]
        self._check_list("reduce_scatter", parts)
        if any(p.numel() != out.numel() for p in parts):
            raise RuntimeError("gorovod backend: reduce_scatter needs %d input tensors of the output's %d elements" %
                               (self.size(), out.numel()))
        flat = torch.stack([p.reshape(-1) for p in parts])
        handle = mpi_ops.reducescatter_async(flat, op=op)

        def finish(results):
            out.copy_(results[0].reshape(out.shape))
            return [out]

        return self._submit([handle], finish)

    def _reduce_scatter_base(self, output, input, opts=None):
        op = _reduce_op(opts.reduceOp) if opts is not None else mpi_ops.Sum
        if input.numel() != output.numel() * self.size():
            raise RuntimeError("gorovod backend: reduce_scatter_tensor of %d elements into %d on %d ranks" %
                               (input.numel(), output.numel(), self.size()))
        handle = mpi_ops.reducescatter_async(input.reshape(self.size(), output.numel()), op=op)

        def finish(results):
            output.copy_(results[0].reshape(output.shape))
            return [output]

        return self._submit([handle], finish)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        n = self.size()
        if input_split_sizes:
            splits = list(input_split_sizes)
        else:
            if input.shape[0] % n:
                raise RuntimeError("gorovod backend: all_to_all_single of a first dimension %d on %d ranks needs "
                                   "input_split_sizes" % (input.shape[0], n))
            splits = [input.shape[0] // n] * n
        handle = mpi_ops.alltoall_async(input, splits=splits)

        def finish(results):
            received, _ = results[0]
            if received.numel() != output.numel():
                raise RuntimeError("gorovod backend: all_to_all_single received %d elements for an output of %d" %
                                   (received.numel(), output.numel()))
            output.copy_(received.reshape(output.shape))
            return [output]

        return self._submit([handle], finish)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        self._check_list("all_to_all", input_tensors)
        self._check_list("all_to_all", output_tensors)
        rest = tuple(input_tensors[0].shape[1:]) if input_tensors[0].dim() > 0 else ()
        flat = torch.cat([t.reshape((-1,) + rest) for t in input_tensors])
        splits = [t.reshape((-1,) + rest).shape[0] for t in input_tensors]
        handle = mpi_ops.alltoall_async(flat, splits=splits)

        def finish(results):
            received, got = results[0]
            at = 0
            for out, k in zip(output_tensors, got.tolist()):
                out.copy_(received[at:at + k].reshape(out.shape))
                at += k
            return output_tensors

        return self._submit([handle], finish)

    def barrier(self, opts=None):
        mpi_ops.barrier()
        return self._done([])

    # ----- what gorovod has no path for

    def _missing(self, what):
        raise RuntimeError("gorovod backend: %s is not offered (gorovod has collectives only, no point-to-point or "
                           "rooted calls); use all_reduce, broadcast or all_gather" % what)

    def send(self, tensors, dst, tag=0):
        self._missing("send")

    def recv(self, tensors, src, tag=0):
        self._missing("recv")

    def recv_anysource(self, tensors, tag=0):
        self._missing("recv")

    def reduce(self, tensors, opts=None):
        self._missing("reduce")

    def gather(self, output_tensors, input_tensors, opts=None):
        self._missing("gather")

    def scatter(self, output_tensors, input_tensors, opts=None):
        self._missing("scatter")

    # ----- argument checks

    def _check_one(self, what, tensors):
        if len(tensors) != 1:
            raise RuntimeError("gorovod backend: %s takes one tensor per process, got %d" % (what, len(tensors)))

    def _check_list(self, what, tensors):
        if len(tensors) != self.size():
            raise RuntimeError("gorovod backend: %s takes a list of %d tensors (one per rank), got %d" %
                               (what, self.size(), len(tensors)))


def _create(store, rank, world_size, timeout):
    """The backend's creator: torch passes its rendezvous' rank and size,
    which must be gorovod's."""
    if not mpi_ops.is_initialized():
        mpi_ops.init()
    if rank != mpi_ops.rank() or world_size != mpi_ops.size():
        raise RuntimeError("gorovod backend: init_process_group was given rank %d of %d, but gorovod's world has this "
                           "process as rank %d of %d: leave rank and world_size out" %
                           (rank, world_size, mpi_ops.rank(), mpi_ops.size()))
    return ProcessGroupGorovod(rank, world_size)


def _store_host():
    """The address the other ranks reach rank 0's store at."""
    if mpi_ops.local_size() == mpi_ops.size():
        return "127.0.0.1"  # every rank on this host
    advertised = os.environ.get("GOROVOD_ADVERTISE_ADDR", "")
    if not advertised:
        return socket.getfqdn()
    if advertised.startswith("["):  # [v6]:port
        return advertised[1:advertised.index("]")]
    if advertised.count(":") == 1:  # host:port
        return advertised.split(":")[0]
    return advertised  # a host, or a bare IPv6 address


def _job_store(timeout):
    """A TCPStore for the job's current world: rank 0 serves it on a port the
    kernel picks and tells the others where, over gorovod's own broadcast."""
    r, n = mpi_ops.rank(), mpi_ops.size()
    where = torch.zeros(256, dtype=torch.uint8)
    store = None
    if r == 0:
        store = dist.TCPStore(_store_host(), 0, n, True, timeout, wait_for_workers=False)
        text = ("%s %d" % (_store_host(), store.port)).encode()
        where[:len(text)] = torch.tensor(list(text), dtype=torch.uint8)
    mpi_ops.broadcast_(where, 0)
    if r != 0:
        host, port = bytes(where.tolist()).rstrip(b"\0").decode().split(" ")
        store = dist.TCPStore(host, int(port), n, False, timeout)
    return store


def _gorovod_env_rendezvous(original):
    """torch's env:// handler, answered by gorovod inside a gorovod job
    whose environment names no master."""

    def handler(url, timeout=None, **kwargs):
        if "GOROVOD_JOB_ID" not in os.environ or "MASTER_ADDR" in os.environ:
            if timeout is None:
                yield from original(url, **kwargs)
            else:
                yield from original(url, timeout=timeout, **kwargs)
            return
        if not mpi_ops.is_initialized():
            mpi_ops.init()
        store = _job_store(timeout if timeout is not None else dist.constants.default_pg_timeout)
        _log.debug("torch.distributed env:// rendezvous answered by gorovod: rank %d of %d",
                   mpi_ops.rank(), mpi_ops.size())
        yield (store, mpi_ops.rank(), mpi_ops.size())

    handler.gorovod = True
    return handler


def register():
    """Registers the "gorovod" backend and the env:// rendezvous inside
    gorovod jobs. Importing this module calls it; calling it again is a
    no-op."""
    if getattr(dist.Backend, BACKEND.upper(), None) != BACKEND:
        dist.Backend.register_backend(BACKEND, _create)
    # torch.distributed.rendezvous is also the name of a function there.
    handlers = importlib.import_module("torch.distributed.rendezvous")._rendezvous_handlers
    if "env" in handlers and not getattr(handlers["env"], "gorovod", False):
        handlers["env"] = _gorovod_env_rendezvous(handlers["env"])


def _torchrun_environment():
    """Inside a gorovod job, joins it and gives the process torchrun's
    variables for the world it joined (RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE, GROUP_RANK), so a script that reads them before
    init_process_group (LOCAL_RANK for torch.cuda.set_device, say) runs
    unchanged. Variables already set are left as they are. They describe
    the first world: an elastic job's later worlds renumber the ranks."""
    if "GOROVOD_JOB_ID" not in os.environ:
        return
    if not mpi_ops.is_initialized():
        mpi_ops.init()
    for name, value in (("RANK", mpi_ops.rank()), ("WORLD_SIZE", mpi_ops.size()),
                        ("LOCAL_RANK", mpi_ops.local_rank()), ("LOCAL_WORLD_SIZE", mpi_ops.local_size()),
                        ("GROUP_RANK", mpi_ops.cross_rank())):
        os.environ.setdefault(name, str(value))


register()
_torchrun_environment()
