"""gorovod as a ``torch.distributed`` backend: ``dist.init_process_group("gorovod")``.

Importing this module registers the backend and, inside a gorovod job,
joins it and gives the process torchrun's environment for the world it
joined: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
MASTER_ADDR and MASTER_PORT (those not already set). Under ``gorovod run`` a
script then needs no address, port, rank or world size: they come from the
job::

    import torch.distributed as dist
    import gorovod.torch.distributed  # registers the "gorovod" backend

    dist.init_process_group("gorovod")
    model = torch.nn.parallel.DistributedDataParallel(model)

Where gorovod is pip-installed, the import line is not needed under
``gorovod run``: gorovod._torch_autoload (run at start-up by the installed
``gorovod_torch_backend.pth``) registers the backend once the script imports
torch, and this module is imported by init_process_group("gorovod"), which
then joins the job and sets torchrun's variables.

What the process group offers, on CPU tensors of the dtypes gorovod.torch
reduces (float32, float64, float16, bfloat16, int32, int64, uint8; the
moving collectives take any dtype):

- ``all_reduce`` with SUM, AVG, MIN, MAX and PRODUCT, synchronous or
  ``async_op=True`` (the work's ``wait()`` and ``get_future()``);
- ``broadcast``, ``all_gather``, ``_all_gather_base`` (``all_gather_into_tensor``),
  ``reduce_scatter``, ``_reduce_scatter_base``, ``all_to_all``,
  ``all_to_all_single`` (with or without split sizes), ``barrier``;
- the rooted ``reduce``, ``gather`` and ``scatter``, as on Gloo, on
  gorovod's unrooted collectives: an allreduce whose result only the root
  keeps, an allgather whose parts only the root copies out, an alltoall in
  which only the root sends;
- ``DistributedDataParallel`` (its gradient buckets, ``no_sync``, comm
  hooks, which get futures completed by the collectives themselves).

Groups: ``dist.new_group(ranks)`` on this backend gives a process group
whose collectives run on a gorovod process set of those ranks (registered
on every rank, members or not, when torch's new_group runs there: torch's
rule that every rank calls new_group in the same order is the process
sets' rule too). Ranks outside get torch's ``GroupMember.NON_GROUP_MEMBER``.
A destroyed group's process set is removed once every member destroyed
its groups on it, at the next point every rank passes: the next new_group,
or remove_destroyed_groups() called on every rank (removing a set is a call
of every rank, and torch's destroy_process_group(group) runs on the members
only). A world change (elastic jobs) removes the groups with their sets:
make them again in the new world. new_group's set-up waits for the other
ranks at most its timeout (given none, the default group's): the ranks meet
on the default group's store before anything is queued, and a rank that
does not find them all there in time raises RuntimeError naming the ranks
missing, leaving nothing behind (see _await_world). A rank that died
before it came (gorovod has been told of a world without it) makes the
others raise HorovodInternalError there instead, as a collective that broke
would, within 50 ms of gorovod learning of that world: the elastic loop
moves to it.

Point-to-point: ``send``, ``recv``, ``isend``, ``irecv`` and
``batch_isend_irecv`` with tags (0 to 2**32-1), on tensors of any dtype,
moved as bytes on the world's links beside the collectives (not in their
order: only the two ranks take part). A receive takes the next message from
its source with its tag; one of another size raises RuntimeError and the
world goes on. Each group's messages are apart from the others', as on
Gloo: a group new_group made sends with tags of its own (the group's number
among those made in the world, above the caller's 32 bits), so a receive on
a group takes only messages sent on that group. A receive from any rank
(``src=None``, recv_anysource) takes the next message with its tag from any
other rank of its group, never one of a rank outside it; ``dist.recv``
returns the sender, and an ``irecv``'s work gives it with
``_source_rank()``, as the sender's rank in the group (torch's dist.recv
turns it into a world rank).

Timeouts, as on Gloo: a work's ``wait()`` (that of ``send`` and ``recv``
too) raises RuntimeError naming the call, its peer and the timeout once the
process group's timeout (``init_process_group(timeout=...)``) or the one
given to ``wait(timeout)`` has passed; ``barrier()``'s names the ranks that
have not reached it. What timed out stays posted (see _P2PWork.wait and
_Collective.wait); the world goes on. C++ waits on a collective's work or
its future (DDP's reducer on its buckets) are bounded by the process
group's timeout too, counted from the collective's submission: the work's
future then fails with that RuntimeError (DDP raises it from backward()).
Every collective returns its work at once (those that need every rank's
shape first are gorovod named calls: see ProcessGroupGorovod._name), so
the timeout bounds each. torch's C++ callers whose wait() lets a future's
error pass (DDP's start-up broadcast of the module's states, its check of
the parameters) raise it on a gorovod group: see _checked_from_cpp.

CUDA tensors: every call takes them as gorovod.torch does (see
gorovod.torch.mpi_ops): the collective waits, on gorovod's side, for an
event recorded on the tensors' current stream when the call is made, so
it sees the work queued before it; a collective's work and future hold the
tensors' device (torch.futures.Future(devices=...)), so whoever waits on
them (DDP's reducer, a comm hook's then(), wait()) has its stream ordered
after the results, as with NCCL's works. Point-to-point messages of CUDA
tensors go through host memory: a send copies the tensor to the host, a
receive copies what came into the tensor, and wait() returns once that
copy is done.

How it works: each call goes to gorovod.torch's collectives, which run in
submission order on gorovod's engine. Every rank must call the same
collectives in the same order, as with every ``torch.distributed``
backend. One thread per process group completes the works' futures in that
order, so DDP's next bucket is already on the wire while the previous one
is being reduced.

The rendezvous: on import inside a gorovod job (GOROVOD_JOB_ID in the
environment), gorovod's rank 0 serves a TCPStore on a port the kernel picks
and its address reaches the others over gorovod's broadcast (one collective,
on every worker); MASTER_ADDR and MASTER_PORT name that store. With
``init_method`` left out, torch's default is ``env://``; inside a gorovod job
whose MASTER_ADDR and MASTER_PORT are the ones set here (or unset), this
module's ``env://`` handler answers with gorovod's rank and world size and
that store, which torch uses for the barrier at the end of
init_process_group (and a Gloo group made beside, with ``new_group``, for its
own rendezvous). Everywhere else (another master named, or outside a gorovod
job) torch's own ``env://`` handler runs unchanged, so Gloo and NCCL keep
working.

Elastic jobs: the world's rank and size are fixed in a process group, so a
new world needs a new one. ``gorovod.torch.distributed.elastic`` replaces the
default process group at each world change (with a new rendezvous, as on
import) and re-wraps DistributedDataParallel; see there.
"""

import collections
import contextlib
import datetime
import importlib
import logging
import os
import socket
import threading
import time
import weakref

import torch
import torch.distributed as dist
from torch.futures import Future

from gorovod import _core, _torch_autoload
from gorovod.exceptions import HorovodInternalError
from gorovod.torch import mpi_ops

__all__ = ["BACKEND", "ProcessGroupGorovod", "register", "remove_destroyed_groups", "switch_world"]

BACKEND = "gorovod"

# Point-to-point tags are below this; a group's messages carry its tag space
# above them (ProcessGroupGorovod._wire_tag).
_TAG_LIMIT = 1 << 32

_log = logging.getLogger("gorovod")

# How long switch_world waits at most for the new world's store and
# barrier (a member lost meanwhile).
_SWITCH_LIMIT = datetime.timedelta(seconds=60)

# The Python side of the collectives' works (_Collective), by work: the works
# themselves are torch's, which carry no Python attributes (see _work). A
# module's table because torch's Work class, which _work_method patches, is
# one for the whole process.
_collectives = weakref.WeakKeyDictionary()


def _reduce_op(op):
    """gorovod.torch's op for a torch.distributed ReduceOp."""
    for theirs, ours in ((dist.ReduceOp.SUM, mpi_ops.Sum), (dist.ReduceOp.MIN, mpi_ops.Min),
                         (dist.ReduceOp.MAX, mpi_ops.Max), (dist.ReduceOp.PRODUCT, mpi_ops.Product)):
        if op == theirs:
            return ours
    if hasattr(dist.ReduceOp, "AVG") and op == dist.ReduceOp.AVG:
        return mpi_ops.Average
    raise RuntimeError("gorovod backend: reduce op %s is not offered (SUM, AVG, MIN, MAX, PRODUCT are)" % (op,))


def _wait_limit(timeout, default):
    """The seconds a work's wait() may take, and whose limit it is: timeout
    (a timedelta, or seconds) where given and not zero (torch's kNoTimeout,
    which C++ callers pass), else the process group's (default), as Gloo
    does; (None, None): no limit."""
    for t, whose in ((timeout, "wait's timeout"), (default, "process group's timeout")):
        if t is None:
            continue
        seconds = t.total_seconds() if isinstance(t, datetime.timedelta) else float(t)
        if seconds > 0:
            return seconds, whose
    return None, None


class _Expired(object):
    """What the completer sets a collective's first future to once the
    process group's timeout has passed with the collective not done: the
    future the work wraps then fails with message (see _unwrap)."""

    def __init__(self, message):
        self.message = message


def _unwrap(first):
    """The callback that makes the future a collective's work wraps (and
    get_future() gives) from the one the completer sets (first): its value,
    or, once the process group's timeout passed (_Expired), a failure with
    the timeout's message. A failure of a then() callback is one C++ sees:
    DDP's reducer, which waits on its buckets' futures from C++, raises it
    from backward(), as on Gloo, where it would otherwise wait for ever. A
    collective that failed otherwise (set_exception) keeps its error as the
    value, as the completer set it."""
    try:
        value = first.value()
    except Exception as e:  # noqa: BLE001 (set_exception's value: handed on as it was)
        return e
    if isinstance(value, _Expired):
        raise RuntimeError(value.message)
    return value


class _Collective(object):
    """The Python side of a collective's work, which the work's Python
    methods (wait, exception, is_success, result, synchronize; see
    _work_method) run on: wait() blocks until the collective is done or the
    timeout passes (RuntimeError naming the call; the collective stays
    queued) and raises the collective's error. The process group's
    completer sets future once the collective is done, or, past the group's
    timeout (deadline, time.monotonic()'s; None: none), to _Expired (expire);
    the work wraps work_future, which follows it (_unwrap)."""

    def __init__(self, future, what, timeout, absent=None, deadline=None):
        self.future = future
        self.work_future = future.then(_unwrap)
        self.what, self.timeout, self.deadline = what, timeout, deadline
        # absent, when given, names the ranks that have not made the call
        # (a barrier's: see ProcessGroupGorovod.barrier), for the timeout's
        # message.
        self.absent = absent
        self.finished = threading.Event()  # set by the completer
        self.expired = False  # future was set to _Expired (the completer's thread alone sets it)
        self.value = None  # what the collective gave, once finished
        self.failure = None  # the collective's own error, once finished
        self.error = None  # the world broke under it (the future then holds the outputs as they are)

    def timed_out(self, limit, whose):
        """The message of a wait that gave up after limit seconds (whose
        limit it was)."""
        who = self.absent() if self.absent is not None else None
        who = ("rank%s %s of the group %s not made the call" %
               ("s" if len(who) > 1 else "", ", ".join(str(q) for q in who), "have" if len(who) > 1 else "has")
               if who else "a rank of the group has not made the call")
        return ("gorovod backend: %s timed out after %gs (the %s ran out): %s. It stays queued, and the group's "
                "later collectives run after it, so they complete only once every rank has made it" %
                (self.what, limit, whose, who))

    def expire(self):
        """Fails the work's future with the timeout's message: its waiters
        from C++, which wait with no limit of their own, return (the
        completer calls it once deadline passed). The collective stays
        queued; its Python side completes when it does."""
        if self.expired or self.finished.is_set():
            return
        self.expired = True
        self.future.set_result(_Expired(self.timed_out(_wait_limit(None, self.timeout)[0], "process group's timeout")))

    def wait(self, timeout=None):
        limit, whose = _wait_limit(timeout, self.timeout)
        if limit is not None and not self.finished.wait(limit):
            raise RuntimeError(self.timed_out(limit, whose))
        self.finished.wait()
        if self.error is not None:
            raise self.error
        if self.failure is not None:
            raise self.failure
        return True

    def is_success(self):
        return self.finished.is_set() and self.exception() is None

    def exception(self):
        if self.error is not None:
            return self.error
        return self.failure

    def result(self):
        self.finished.wait()
        if self.failure is not None:
            raise self.failure
        return self.value

    def synchronize(self):
        self.wait()


def _work(collective):
    """The work a process group returns for a collective: torch's own work
    on the collective's future (_create_work_from_future), whose C++ side
    stands alone. torch (1.13) keeps only the C++ side of a work that C++
    code calls the group for (DDP's broadcast of its module states, its
    check of the parameters, its reducer), and that code calls wait() or
    getFuture() on it when it needs it, after the Python side may be gone;
    a Python subclass of Work loses its overrides with its Python side (a
    wait() from C++ then blocks forever), this work keeps its future. A
    Python caller gets this work with its Python side, collective, whose
    methods its Python ones run (see _work_method): the group's timeout,
    the collective's error raised by wait(). From C++, wait() waits for
    the future and does not raise the collective's error (torch's
    FutureWrappingWork): the error stays in the future (getFuture()); a
    world that broke is raised by the next collective (gorovod refuses them
    until the world is reset). The future fails once the group's timeout
    has passed with the collective not done (_Collective.expire), so a C++
    waiter (DDP's reducer) never waits longer."""
    work = torch._C._distributed_c10d._create_work_from_future(collective.work_future)
    _collectives[work] = collective
    return work


def _unraised(collectives, what):
    """The error that a C++ caller's wait() on these collectives' works let
    pass (see _checked_from_cpp): the first that timed out (its future
    expired), failed or saw the world break; None when none did."""
    for c in collectives:
        if c.expired:
            limit, _ = _wait_limit(None, c.timeout)
            return RuntimeError("%s; %s went on without it, so it is raised here: the tensors it was to fill "
                                "are as they were" % (c.timed_out(limit, "process group's timeout"), what))
        if c.error is not None:
            return c.error
        if c.failure is not None:
            return RuntimeError("gorovod backend: %s: %s" % (what, c.failure))
    return None


def _checked_from_cpp(original, what):
    """torch's function original (a C++ function that makes collectives on
    a process group and waits on their works from C++), which on a gorovod
    group raises the error of a collective it made that timed out or
    failed. torch 1.13's C++ wait() on a work made from a future
    (FutureWrappingWork) returns once the future completes without raising
    the future's error, so its C++ callers go on with the tensors as they
    were: DistributedDataParallel's start-up broadcast of the module's
    states (torch.distributed.utils._sync_params_and_buffers) and its
    buffers' broadcasts (dist._broadcast_coalesced), its check that every
    rank holds the same parameters (dist._verify_params_across_processes).
    Python code calls them through torch.distributed's attributes, which
    register() replaces with this function. The first collective's error is
    raised: RuntimeError naming the call and the timeout (as on Gloo,
    whose wait() raises), the collective's own error, or the world's
    HorovodInternalError."""

    def call(process_group, *args, **kwargs):
        if not isinstance(process_group, ProcessGroupGorovod):
            return original(process_group, *args, **kwargs)
        with process_group._watching() as made:
            try:
                result = original(process_group, *args, **kwargs)
            except Exception as e:
                # A check that compared what a timed-out collective left in
                # place fails for that reason: said as such.
                error = _unraised(made, what)
                if error is None:
                    raise
                raise error from e
        error = _unraised(made, what)
        if error is not None:
            raise error
        return result

    call.__name__ = call.__qualname__ = original.__name__
    call.__doc__ = original.__doc__
    call.gorovod = True
    return call


def _work_method(name, original):
    """torch's Work method name for every work of the process: on a work of
    a gorovod collective (one _work made), its _Collective's method; on any
    other work torch's own (original). A Python subclass's method comes
    first, as before."""

    def method(self, *args, **kwargs):
        try:
            collective = _collectives.get(self)
        except TypeError:  # a work that takes no weak reference: not one of ours
            collective = None
        if collective is None:
            return original(self, *args, **kwargs)
        return getattr(collective, name)(*args, **kwargs)

    # pybind11 recognises a Python override calling its own C++ method by
    # the frame's code name (a Python subclass of Work that does not define
    # name reaches this method from C++, and this method torch's).
    method.__code__ = method.__code__.replace(co_name=name)
    method.__name__ = method.__qualname__ = name
    method.__doc__ = original.__doc__
    method.gorovod = True
    return method


def _future(outputs):
    """The future a collective's work completes with outputs: one that may
    hold CUDA tensors of their devices, for which torch records the
    completing thread's streams and has each waiter's stream wait for them
    (a CPU-only future refuses CUDA tensors)."""
    devices = sorted({t.device.index for t in outputs if isinstance(t, torch.Tensor) and t.is_cuda})
    if not devices:
        return Future()
    return Future(devices=[torch.device("cuda", d) for d in devices])


def _receivable(t):
    """The host tensor a receive into t lands in: t itself when it is a
    contiguous CPU tensor, else a contiguous CPU tensor of its shape."""
    if t.is_cpu and t.is_contiguous():
        return t
    return torch.empty(t.shape, dtype=t.dtype)


def _received(out, into):
    """What completes a receive that landed in into, for out: nothing when
    they are one tensor; else the copy into out, done before wait() returns
    (for a CUDA tensor, on the waiting thread's current stream, which it
    then waits for, so that any stream may read out afterwards)."""
    if into is out:
        return None

    def finish():
        out.copy_(into)
        if out.is_cuda:
            torch.cuda.current_stream(out.device).synchronize()

    return finish


class _P2PWork(dist._Work):
    """A point-to-point message in flight. Unlike a collective's work it is
    completed on its own, not in the group's submission order: a receive
    posted first must not hold up the sends after it. wait() collects the
    message (a receive of another size than the message raises
    RuntimeError; a world change HorovodInternalError, as for the
    collectives); finish runs once a receive is complete (copying into a
    non-contiguous tensor). A wait longer than its timeout (the wait's, else
    the process group's) raises RuntimeError naming the peer; the message
    stays in flight (see wait)."""

    def __init__(self, handle, what, finish=None, timeout=None, source=None):
        super().__init__()
        self._handle, self._what, self._finish, self._timeout = handle, what, finish, timeout
        # source: for a receive from any rank, gives the sender's rank in
        # the group once the message came (see _source_rank).
        self._source = source
        self._lock = threading.Lock()
        self._done = False
        self._error = None
        self._future = None

    def wait(self, timeout=None):
        limit, whose = _wait_limit(timeout, self._timeout)
        with self._lock:
            if not self._done:
                try:
                    _core.wait(self._handle, limit)
                    if self._finish is not None:
                        self._finish()
                except TimeoutError:
                    # Not withdrawn (gorovod has no way to take back a send
                    # announced to the peer, or a receive posted for it): a
                    # send still goes once the peer posts its receive, ahead
                    # of later messages with its tag; a receive still takes
                    # the next message from its peer with its tag. wait()
                    # again collects it.
                    raise RuntimeError("gorovod backend: %s timed out after %gs (the %s ran out); the %s stays posted: "
                                       "wait again to collect it" %
                                       (self._what, limit, whose, self._what.split(" ")[0])) from None
                except HorovodInternalError as e:
                    self._error = e
                except _core.GorovodError as e:
                    self._error = RuntimeError("gorovod backend: %s: %s" % (self._what, e))
                self._done = True
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self):
        if self._done:
            return True
        try:
            return _core.poll(self._handle)
        except ValueError:  # collected by a wait() meanwhile
            return True

    def is_success(self):
        return self.is_completed() and self.exception() is None

    def exception(self):
        try:
            self.wait()
        except Exception as e:  # noqa: BLE001
            return e
        return None

    def get_future(self):
        with self._lock:
            if self._future is None:
                self._future = Future()

                def complete(future=self._future):
                    try:
                        self.wait()
                        future.set_result([])
                    except Exception as e:  # noqa: BLE001 (handed to the waiter)
                        future.set_exception(e)

                threading.Thread(target=complete, name="gorovod-p2p-future", daemon=True).start()
            return self._future

    def result(self):
        self.wait()
        return []

    def synchronize(self):
        self.wait()

    def _source_rank(self):
        """The rank in the group that sent the message a receive took (what
        dist.recv(src=None) returns; torch 1.13's name for Work.sourceRank):
        waits for the message first. RuntimeError for a send, or a receive
        from a given rank, as on Gloo."""
        if self._source is None:
            raise RuntimeError("gorovod backend: %s has no source rank (only a receive from any rank has)" %
                               self._what)
        try:
            self.wait()
        except Exception:  # noqa: BLE001 (a size mismatch still names its sender)
            if self._source() < 0:
                raise
        return self._source()

    source_rank = _source_rank


class _Pending(object):
    """A process group's collectives in submission order, for its completer
    (get), and the earliest deadline among them and the one it is
    completing (deadline; see _Collective)."""

    def __init__(self):
        self._items = collections.deque()
        self._cond = threading.Condition(threading.Lock())
        self._current = None  # the collective the completer is completing

    def put(self, item):
        """Queues (handles, finish, collective, outputs), or None: the
        completer ends there."""
        with self._cond:
            self._items.append(item)
            self._cond.notify()

    def get(self):
        with self._cond:
            while not self._items:
                self._cond.wait()
            item = self._items.popleft()
            self._current = item[2] if item is not None else None
            return item

    def _live(self):
        """The collectives not expired yet, the current one first (under the
        lock)."""
        queued = (item[2] for item in self._items if item is not None)
        for c in ([self._current] if self._current is not None else []):
            if not c.expired:
                yield c
        for c in queued:
            if not c.expired:
                yield c

    def deadline(self):
        """The earliest deadline of a collective not expired yet; None: none."""
        with self._cond:
            return min((c.deadline for c in self._live() if c.deadline is not None), default=None)

    def expire(self, now):
        """Expires the collectives whose deadline is past."""
        with self._cond:
            due = [c for c in self._live() if c.deadline is not None and c.deadline <= now]
        for c in due:
            c.expire()


# How long at most the completer waits for a call before it looks again at
# the deadlines (collectives queued meanwhile bring theirs).
_RECHECK = 1.0


def _collect(handle, pending):
    """handle's result (mpi_ops.synchronize). While it waits, each
    collective of the group whose deadline passes (this one or one queued
    after it, which cannot complete before it) is expired, within _RECHECK
    of it, so that C++ waiters on their works return within the group's
    timeout; the wait for handle itself goes on (the call stays queued)."""
    while True:
        deadline = pending.deadline()
        left = _RECHECK if deadline is None else min(_RECHECK, max(0.0, deadline - time.monotonic()))
        try:
            return mpi_ops.synchronize(handle, left)
        except TimeoutError:
            pending.expire(time.monotonic())


def _complete(pending, group_ref):
    """The completer thread of a process group: completes the works' futures
    in submission order, until the group is closed or collected; a work
    whose collective is not done within the group's timeout fails (see
    _collect)."""
    while True:
        item = pending.get()
        if item is None:
            return
        handles, finish, collective, outputs = item
        future = collective.future
        try:
            results = [_collect(h, pending) for h in handles]
            value = finish(results)
        except HorovodInternalError as e:
            # The world broke. DistributedDataParallel (torch 1.13) dies of a
            # segmentation fault on a bucket's future that holds an error,
            # so the future completes with the outputs as they are, and the
            # error is kept: the work's wait() raises it (from Python), every
            # later collective raises it too (gorovod refuses them until the
            # reset), and elastic.State.commit() raises it before saving, so
            # a step whose gradients were not reduced is never committed.
            # Recorded before the future completes: a C++ caller waits on the
            # future alone.
            collective.error, collective.value = e, outputs
            group = group_ref()
            if group is not None:
                group._failed(e)
            del group
            if not collective.expired:
                future.set_result(outputs)
        except Exception as e:  # noqa: BLE001 (handed to the waiter)
            collective.failure = e
            if not collective.expired:
                future.set_exception(e)
        else:
            collective.value = value
            if not collective.expired:
                future.set_result(value)
        finally:
            collective.finished.set()
        del item, future, collective


class ProcessGroupGorovod(dist.ProcessGroup):
    """A process group of a ``torch.distributed`` job on gorovod. The default
    group's rank and size are gorovod's (``hvd.rank()``, ``hvd.size()``); a
    group ``new_group`` made runs its collectives on a gorovod process set of
    its ranks (process_set), with the rank and size within it."""

    def __init__(self, rank, size, world=None, timeout=None, process_set=None, group_ranks=None, store=None,
                 tag_space=0, names=None):
        super().__init__(rank, size)
        # The gorovod names of the collectives made in two steps (every
        # rank's shape or split sizes first, then the data: see _name): the
        # group's own prefix, the same on every rank of the group and apart
        # from every other group's in the process, and how many it has made.
        self._names = names if names is not None else "gorovod.torch.distributed/%s/%s" % (world, tag_space)
        self._named = 0
        # The point-to-point tags' high 32 bits: 0 for the default group, a
        # group's number among the groups made in its world for a group
        # new_group made (the same on every rank: see _new_group_helper).
        self._tag_space = tag_space
        # The group's store (torch's, from the rendezvous), where barrier
        # records each rank's arrivals so that a timed-out barrier can name
        # the ranks that have not made it; barriers counts this rank's.
        self._store = store
        self._barriers = 0
        # This rank's monitored barriers on the group (their keys' number).
        self._monitored = 0
        # Set (by gorovod.torch.distributed.elastic, on every rank alike)
        # while every rank holds the root's tensors of the broadcasts to
        # come: they are then done without sending anything (see broadcast).
        self.root_state_held = False
        # The number of gorovod's world this group was made for (rank and
        # size are fixed in a process group: a new world needs a new group).
        self.world = world
        self.timeout = timeout if timeout is not None else dist.constants.default_pg_timeout
        # The gorovod process set the collectives run on: the world's for
        # the default group and for a new_group of every rank.
        self.process_set = process_set if process_set is not None else mpi_ops.global_process_set
        # group_ranks: the world ranks of a group new_group made, in the
        # group's order (roots are group ranks in torch, world ranks in
        # gorovod's process sets); None for the default group.
        self._subgroup = group_ranks is not None
        self._world_ranks = list(group_ranks) if self._subgroup else None
        # The first HorovodInternalError of a collective of this group (the
        # world it was made for broke), or None.
        self.failure = None
        self._pending = _Pending()
        # The collectives submitted on this thread while a call from C++
        # whose waits cannot raise runs (see _checked_from_cpp).
        self._watched = threading.local()
        # The completer holds the group weakly, so that a group torch drops
        # (destroy_process_group) ends its thread when collected.
        self._completer = threading.Thread(target=_complete, args=(self._pending, weakref.ref(self)),
                                           name="gorovod-pg-completer", daemon=True)
        self._completer.start()

    def __del__(self):
        self._pending.put(None)

    def getBackendName(self):
        return BACKEND

    # torch 2.x keeps a group's name in the C++ backends registered on it,
    # and a process group written in Python has none: its C++ name would
    # refuse to be set or read ("ProcessGroup name not set"), and with it
    # destroy_process_group(group). torch's Python code sets and reads the
    # name through these two, so the name lives here.
    def _set_group_name(self, name):
        self._group_name = name

    @property
    def group_name(self):
        name = getattr(self, "_group_name", None)
        if name is None:
            raise RuntimeError("ProcessGroup name not set")
        return name

    def close(self):
        """Ends the completer thread once the works queued so far are done
        (the group is no longer used: its world is gone)."""
        self._pending.put(None)

    @contextlib.contextmanager
    def _watching(self):
        """The collectives of the group submitted on this thread inside the
        with block, in a list (see _checked_from_cpp)."""
        outer = getattr(self._watched, "collectives", None)
        mine = []
        self._watched.collectives = mine
        try:
            yield mine
        finally:
            self._watched.collectives = outer
            if outer is not None:
                outer.extend(mine)

    def _failed(self, error):
        """Records the HorovodInternalError that broke the world under a
        collective of the group (the completer calls it)."""
        if self.failure is None:
            self.failure = error

    def _name(self):
        """The name of the group's next collective made in two steps
        (allgather, alltoall and reducescatter, and those made of them: the
        data's call needs every rank's shape, or split sizes, first). Named,
        the call returns at once: gorovod.torch submits the exchange of
        shapes now and the data's call from a thread of its own once the
        shapes are in (mpi_ops._ChainHandle), and the data's call pairs with
        the other ranks' by its name, wherever it lands among the group's
        unnamed calls. Unnamed, the caller would wait for the exchange
        itself, with no timeout: a rank that never makes the call would
        hold the others inside it, and the completer bounds only what has
        been submitted. The same on every rank, which make the group's
        collectives in the same order."""
        self._named += 1
        return "%s/%d" % (self._names, self._named)

    def _submit(self, handles, finish, outputs, what, absent=None):
        """A work (see _work) whose future the completer sets to finish(the
        handles' results), or, when the world broke under them, to outputs
        as they are (see _complete). Nothing here holds the work: its C++
        side stands alone. A caller that watches the group's collectives
        (see _watching) gets the collective too."""
        limit, _ = _wait_limit(None, self.timeout)
        collective = _Collective(_future(outputs), "%s on a group of %d ranks" % (what, self.size()), self.timeout,
                                 absent, None if limit is None else time.monotonic() + limit)
        self._pending.put((handles, finish, collective, outputs))
        watched = getattr(self._watched, "collectives", None)
        if watched is not None:
            watched.append(collective)
        return _work(collective)

    # ----- the collectives

    def _set(self):
        """The process set of the group's collectives; RuntimeError for a
        group new_group made in a world that has changed since (a world
        change removes gorovod's process sets: the group's ranks were the
        old world's)."""
        if self._subgroup and _core.topology().world != self.world:
            raise RuntimeError("gorovod backend: this process group (world ranks %s) was made in gorovod's world %d, "
                               "which has changed since (now %d): a world change removes such groups; make them "
                               "again with new_group in the new world (inside the elastic function)" %
                               (self._world_ranks, self.world, _core.topology().world))
        return self.process_set

    def _world_rank(self, group_rank):
        """The world rank of the group's rank group_rank."""
        if not self._subgroup:
            return group_rank
        if not 0 <= group_rank < len(self._world_ranks):
            raise RuntimeError("gorovod backend: rank %d is not in a group of %d" % (group_rank, len(self._world_ranks)))
        return self._world_ranks[group_rank]

    def allreduce(self, tensors, opts=None):
        return self._allreduce(tensors, opts, "all_reduce")

    def allreduce_coalesced(self, tensors, opts=None):
        # dist.all_reduce_coalesced: the same as allreduce, one allreduce per
        # tensor queued together (gorovod's fusion packs them into one
        # buffer where they fit), as one work.
        return self._allreduce(tensors, opts, "all_reduce_coalesced")

    def _allreduce(self, tensors, opts, what):
        op = _reduce_op(opts.reduceOp) if opts is not None else mpi_ops.Sum
        ps = self._set()
        if any(t.is_sparse for t in tensors):
            return self._sparse_allreduce(tensors, op, ps, what)
        handles = [mpi_ops.allreduce_async_(t, op=op, process_set=ps) for t in tensors]
        return self._submit(handles, lambda _: tensors, tensors, what)

    def _sparse_allreduce(self, tensors, op, ps, what):
        """all_reduce of sparse COO tensors, SUM or AVG, as Gloo offers it:
        every rank's indices and values are allgathered (ranks may hold
        different numbers of entries) and each tensor becomes the coalesced
        sum of them, in place."""
        if op not in (mpi_ops.Sum, mpi_ops.Average):
            raise RuntimeError("gorovod backend: %s of sparse tensors reduces with SUM or AVG only" % what)
        if not all(t.is_sparse for t in tensors):
            raise RuntimeError("gorovod backend: %s takes sparse or dense tensors, not both in one call" % what)
        handles = []
        for t in tensors:
            # allgather concatenates along the first dimension: the indices
            # travel transposed, one row per entry.
            handles.append(mpi_ops.allgather_async(t._indices().transpose(0, 1).contiguous(), name=self._name(),
                                                   process_set=ps))
            handles.append(mpi_ops.allgather_async(t._values().contiguous(), name=self._name(), process_set=ps))

        def finish(results):
            for k, t in enumerate(tensors):
                indices, values = results[2 * k], results[2 * k + 1]
                if op == mpi_ops.Average:
                    values = values / self.size()
                t.copy_(torch.sparse_coo_tensor(indices.transpose(0, 1), values, t.size()).coalesce())
            return tensors
        return self._submit(handles, finish, tensors, what)

    def broadcast(self, tensors, opts=None):
        if self.root_state_held:
            # DDP's construction in an elastic job, after the state's sync
            # made every rank's module rank 0's (elastic.State._wrap):
            # nothing to send.
            return self._submit([], lambda _: tensors, tensors, "broadcast")
        ps = self._set()
        root = self._world_rank(opts.rootRank if opts is not None else 0)
        handles = [mpi_ops.broadcast_async_(t, root, process_set=ps) for t in tensors]
        return self._submit(handles, lambda _: tensors, tensors, "broadcast")

    def allgather(self, output_tensors, input_tensors, opts=None):
        # output_tensors[i] is a list of size() tensors, one per rank.
        self._check_one("allgather", input_tensors)
        inp, outs = input_tensors[0], output_tensors[0]
        self._check_list("allgather", outs)
        handle = mpi_ops.allgather_async(inp.reshape((1,) + tuple(inp.shape)), name=self._name(),
                                         process_set=self._set())

        def finish(results):
            for out, part in zip(outs, results[0]):
                out.copy_(part.reshape(out.shape))
            return outs

        # The future's value is the list of gathered tensors, as Gloo's.
        return self._submit([handle], finish, outs, "all_gather")

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        # dist.all_gather_coalesced: output_lists[q][i] gets rank q's
        # input_tensors[i]. The inputs (of one dtype, as torch checks) go as
        # one flat allgather; each rank's part is cut back into its tensors
        # by this rank's shapes (torch requires the same shapes on every
        # rank and does not check them).
        self._check_list("allgather_coalesced", output_lists)
        for q, outs in enumerate(output_lists):
            if len(outs) != len(input_tensors):
                raise RuntimeError("gorovod backend: allgather_coalesced: output list %d holds %d tensors for %d inputs" %
                                   (q, len(outs), len(input_tensors)))
            self._check_like_shapes("allgather_coalesced", outs, input_tensors)
        flat = torch.cat([t.reshape(-1) for t in input_tensors]) if input_tensors else torch.empty(0)
        handle = mpi_ops.allgather_async(flat.reshape(1, flat.numel()), name=self._name(), process_set=self._set())
        outputs = [t for outs in output_lists for t in outs]

        def finish(results):
            for outs, part in zip(output_lists, results[0]):
                at = 0
                for out in outs:
                    k = out.numel()
                    out.copy_(part[at:at + k].reshape(out.shape))
                    at += k
            return outputs

        return self._submit([handle], finish, outputs, "all_gather_coalesced")

    def _allgather_base(self, output, input, opts=None):
        handle = mpi_ops.allgather_async(input.reshape((1, input.numel())), name=self._name(), process_set=self._set())

        def finish(results):
            output.copy_(results[0].reshape(output.shape))
            return [output]

        return self._submit([handle], finish, [output], "all_gather_into_tensor")

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
        handle = mpi_ops.reducescatter_async(flat, name=self._name(), op=op, process_set=self._set())

        def finish(results):
            out.copy_(results[0].reshape(out.shape))
            return [out]

        return self._submit([handle], finish, [out], "reduce_scatter")

    def _reduce_scatter_base(self, output, input, opts=None):
        op = _reduce_op(opts.reduceOp) if opts is not None else mpi_ops.Sum
        if input.numel() != output.numel() * self.size():
            raise RuntimeError("gorovod backend: reduce_scatter_tensor of %d elements into %d on %d ranks" %
                               (input.numel(), output.numel(), self.size()))
        handle = mpi_ops.reducescatter_async(input.reshape(self.size(), output.numel()), name=self._name(), op=op,
                                             process_set=self._set())

        def finish(results):
            output.copy_(results[0].reshape(output.shape))
            return [output]

        return self._submit([handle], finish, [output], "reduce_scatter_tensor")

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        n = self.size()
        if input_split_sizes:
            splits = list(input_split_sizes)
        else:
            if input.shape[0] % n:
                raise RuntimeError("gorovod backend: all_to_all_single of a first dimension %d on %d ranks needs "
                                   "input_split_sizes" % (input.shape[0], n))
            splits = [input.shape[0] // n] * n
        handle = mpi_ops.alltoall_async(input, splits=splits, name=self._name(), process_set=self._set())

        def finish(results):
            received, _ = results[0]
            if received.numel() != output.numel():
                raise RuntimeError("gorovod backend: all_to_all_single received %d elements for an output of %d" %
                                   (received.numel(), output.numel()))
            output.copy_(received.reshape(output.shape))
            return [output]

        return self._submit([handle], finish, [output], "all_to_all_single")

    def alltoall(self, output_tensors, input_tensors, opts=None):
        self._check_list("all_to_all", input_tensors)
        self._check_list("all_to_all", output_tensors)
        rest = tuple(input_tensors[0].shape[1:]) if input_tensors[0].dim() > 0 else ()
        flat = torch.cat([t.reshape((-1,) + rest) for t in input_tensors])
        splits = [t.reshape((-1,) + rest).shape[0] for t in input_tensors]
        handle = mpi_ops.alltoall_async(flat, splits=splits, name=self._name(), process_set=self._set())

        def finish(results):
            received, got = results[0]
            at = 0
            for out, k in zip(output_tensors, got.tolist()):
                out.copy_(received[at:at + k].reshape(out.shape))
                at += k
            return output_tensors

        return self._submit([handle], finish, output_tensors, "all_to_all")

    def barrier(self, opts=None):
        # dist.barrier() waits on the work, with the group's timeout (as on
        # Gloo): the barrier itself is queued as any collective.
        ps = self._set()
        self._barriers += 1
        mine = self._barriers
        # A counter per rank (torch 1.13's stores have no check() of a key;
        # add(key, 0) reads a counter without waiting, 0 when missing).
        key = "gorovod-barrier-arrivals/%d"
        if self._store is not None:
            try:
                self._store.add(key % self.rank(), 1)
            except Exception as e:  # noqa: BLE001 (only the timeout's message needs it)
                _log.debug("gorovod backend: barrier: recording this rank's arrival in the store failed: %s", e)
                self._store = None
        store = self._store

        def absent():
            """The group's ranks that have not reached this barrier, by
            their records in the store; None when the store cannot say."""
            if store is None:
                return None
            try:
                late = []
                for q in range(self.size()):
                    if q == self.rank():
                        continue
                    if store.add(key % q, 0) < mine:
                        late.append(q)
                return late
            except Exception:  # noqa: BLE001
                return None

        return self._submit([mpi_ops._barrier_async(process_set=ps)], lambda _: [], [], "barrier", absent)

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """Gloo's monitored barrier (dist.monitored_barrier, or this
        method called directly, as on ProcessGroupGloo): rank 0 waits for
        each other rank of the group in rank order, then lets them go; a rank
        that has not arrived within timeout (a timedelta or seconds; the
        group's by default) makes rank 0 raise RuntimeError naming it (with
        wait_all_ranks, naming every late rank, each given the whole
        timeout), and the others raise when rank 0 has not let them go within
        timeout. It runs on the group's store, apart from gorovod's queue:
        unlike barrier() it finds ranks stuck in an earlier collective."""
        if self._store is None:
            raise RuntimeError("gorovod backend: monitored_barrier needs the group's store, which this group lacks")
        if timeout is None:
            timeout = self.timeout
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
        self._monitored += 1
        key = "gorovod-monitored-barrier/%d/%%s" % self._monitored
        me = self.rank()
        start = time.monotonic()

        def elapsed_ms():
            return int((time.monotonic() - start) * 1000)

        if me != 0:
            self._store.set(key % ("arrived/%d" % me), "1")
            try:
                self._store.wait([key % "passed"], datetime.timedelta(seconds=max(seconds, 0.001)))
            except Exception as e:  # noqa: BLE001 (the store's timeout; said below)
                raise RuntimeError("Rank %d successfully reached monitoredBarrier, but received errors while waiting "
                                   "for send/recv from rank 0. Please check rank 0 logs for faulty rank. (%s)" %
                                   (me, e)) from None
            return
        late = []
        for q in range(1, self.size()):
            remaining = seconds if wait_all_ranks else seconds - (time.monotonic() - start)
            if remaining <= 0:
                if wait_all_ranks:
                    late.append(q)
                    continue
                raise RuntimeError("[Rank 0]: Rank 0 timed out in monitoredBarrier after %d ms, waiting for rank %d"
                                   % (elapsed_ms(), q))
            try:
                self._store.wait([key % ("arrived/%d" % q)], datetime.timedelta(seconds=remaining))
            except Exception:  # noqa: BLE001 (the store's timeout: the rank is late)
                if not wait_all_ranks:
                    raise RuntimeError("[Rank 0]: Rank %d failed to pass monitoredBarrier in %d ms" %
                                       (q, int(seconds * 1000))) from None
                late.append(q)
        if late:
            raise RuntimeError("[Rank 0]: Ranks %s failed to pass monitoredBarrier in %d ms" %
                               (", ".join(str(q) for q in late), int(seconds * 1000)))
        self._store.set(key % "passed", "1")

    # ----- point-to-point

    def send(self, tensors, dstRank, tag=0):
        self._check_one("send", tensors)
        t = self._p2p_tensor("send", tensors[0], tag)
        if t.is_cuda:
            # Through host memory: the copy waits for the work queued on
            # the tensor's current stream, as the message must.
            t = t.cpu()
        peer = self._world_rank(dstRank)
        return _P2PWork(_core.send_async(t.data_ptr(), t.numel() * t.element_size(), _core.UINT8, peer,
                                         self._wire_tag(tag), t),
                        "send to rank %d with tag %d" % (dstRank, tag), timeout=self.timeout)

    def recv(self, tensors, srcRank, tag=0):
        self._check_one("recv", tensors)
        out = tensors[0]
        t = self._p2p_tensor("recv", out, tag)  # out itself
        into = _receivable(t)
        peer = self._world_rank(srcRank)
        handle = _core.recv_async(into.data_ptr(), into.numel() * into.element_size(), _core.UINT8, peer,
                                  self._wire_tag(tag), into)
        return _P2PWork(handle, "recv from rank %d with tag %d" % (srcRank, tag), _received(out, into),
                        timeout=self.timeout)

    def recv_anysource(self, tensors, tag=0):
        self._check_one("recv", tensors)
        out = tensors[0]
        t = self._p2p_tensor("recv", out, tag)  # out itself
        into = _receivable(t)
        # From the other members of the group's process set only (the
        # world's for the default group and a group of every rank).
        handle, source = _core.recv_any_async(into.data_ptr(), into.numel() * into.element_size(), _core.UINT8,
                                              self._wire_tag(tag), into, ps=self.process_set.process_set_id)

        def group_rank():
            world = source.value
            if world < 0 or not self._subgroup:
                return world
            return self._world_ranks.index(world)

        return _P2PWork(handle, "recv from any rank with tag %d" % tag, _received(out, into), timeout=self.timeout,
                        source=group_rank)

    def _p2p_tensor(self, what, t, tag):
        """The tensor a point-to-point call moves, checked; the world's
        links carry it as bytes."""
        self._set()  # a subgroup of a changed world is refused
        if not (t.is_cpu or t.is_cuda):
            raise RuntimeError("gorovod backend: %s of a %s tensor (gorovod moves CPU and CUDA tensors)" %
                               (what, t.device))
        if not isinstance(tag, int) or not 0 <= tag < _TAG_LIMIT:
            raise RuntimeError("gorovod backend: %s with tag %r (tags are integers from 0 to 2**32-1)" % (what, tag))
        return t if t.is_contiguous() else (t.contiguous() if what == "send" else t)

    def _wire_tag(self, tag):
        """The tag gorovod's message carries: the group's tag space above
        the caller's tag, so that a group's messages are apart from every
        other group's."""
        return self._tag_space * _TAG_LIMIT + tag

    # ----- the rooted collectives, on gorovod's unrooted ones

    def reduce(self, tensors, opts=None):
        # An allreduce whose result only the root keeps: the other ranks
        # reduce a copy, so their tensors are left as they were.
        self._check_one("reduce", tensors)
        op = _reduce_op(opts.reduceOp) if opts is not None else mpi_ops.Sum
        root = opts.rootRank if opts is not None else 0
        self._check_root("reduce", root)
        ps = self._set()
        t = tensors[0]
        buf = t if root == self.rank() else t.clone()
        handle = mpi_ops.allreduce_async_(buf, op=op, process_set=ps)
        return self._submit([handle], lambda _: tensors, tensors, "reduce")

    def gather(self, output_tensors, input_tensors, opts=None):
        # An allgather whose parts only the root copies out: output_tensors
        # is [a list of size() tensors] on the root, [] elsewhere (as
        # dist.gather passes them). The ranks' shapes and dtypes are
        # compared by the allgather (a difference raises MismatchError on
        # every rank).
        self._check_one("gather", input_tensors)
        root = opts.rootRank if opts is not None else 0
        self._check_root("gather", root)
        inp = input_tensors[0]
        if self.rank() == root:
            if len(output_tensors) != 1:
                raise RuntimeError("gorovod backend: gather takes one list of output tensors on the root, got %d" %
                                   len(output_tensors))
            outs = output_tensors[0]
            self._check_list("gather", outs)
            self._check_like("gather", outs, inp, "output")
        elif output_tensors and any(len(o) for o in output_tensors):
            raise RuntimeError("gorovod backend: gather takes output tensors on the root (rank %d) only" % root)
        else:
            outs = None
        handle = mpi_ops.allgather_async(inp.reshape((1,) + tuple(inp.shape)), name=self._name(),
                                         process_set=self._set())

        def finish(results):
            if outs is not None:
                for out, part in zip(outs, results[0]):
                    out.copy_(part.reshape(out.shape))
            return outs if outs is not None else []

        # The future's value is the root's list of gathered tensors, [] on
        # the other ranks, as Gloo's.
        return self._submit([handle], finish, outs if outs is not None else [], "gather")

    def scatter(self, output_tensors, input_tensors, opts=None):
        # An alltoall in which only the root sends: rank r's part of its
        # list, to each rank r. input_tensors is [a list of size() tensors]
        # on the root, [] elsewhere (as dist.scatter passes them).
        self._check_one("scatter", output_tensors)
        root = opts.rootRank if opts is not None else 0
        self._check_root("scatter", root)
        out = output_tensors[0]
        n = self.size()
        if self.rank() == root:
            if len(input_tensors) != 1:
                raise RuntimeError("gorovod backend: scatter takes one list of input tensors on the root, got %d" %
                                   len(input_tensors))
            parts = input_tensors[0]
            self._check_list("scatter", parts)
            self._check_like("scatter", parts, out, "input")
            flat = torch.cat([p.reshape(-1) for p in parts])
            splits = [p.numel() for p in parts]
        elif input_tensors and any(len(i) for i in input_tensors):
            raise RuntimeError("gorovod backend: scatter takes input tensors on the root (rank %d) only" % root)
        else:
            flat, splits = torch.empty(0, dtype=out.dtype, device=out.device), [0] * n
        handle = mpi_ops.alltoall_async(flat, splits=splits, name=self._name(), process_set=self._set())

        def finish(results):
            received, _ = results[0]
            if received.numel() != out.numel():
                raise RuntimeError("gorovod backend: scatter received %d elements from rank %d for an output of %d" %
                                   (received.numel(), root, out.numel()))
            out.copy_(received.reshape(out.shape))
            return output_tensors

        return self._submit([handle], finish, output_tensors, "scatter")

    # ----- argument checks

    def _check_one(self, what, tensors):
        if len(tensors) != 1:
            raise RuntimeError("gorovod backend: %s takes one tensor per process, got %d" % (what, len(tensors)))

    def _check_root(self, what, root):
        if not 0 <= root < self.size():
            raise RuntimeError("gorovod backend: %s to or from rank %d, outside a group of %d" % (what, root, self.size()))

    def _check_like(self, what, tensors, like, which):
        """Each of the root's tensors has like's shape and dtype, as Gloo
        requires."""
        for i, t in enumerate(tensors):
            if t.shape != like.shape or t.dtype != like.dtype:
                raise RuntimeError("gorovod backend: %s's %s tensor %d is %s of %s; this rank's tensor is %s of %s "
                                   "(they must match, as on Gloo)" %
                                   (what, which, i, tuple(t.shape), t.dtype, tuple(like.shape), like.dtype))

    def _check_like_shapes(self, what, outs, inputs):
        """Each output has its input's shape and dtype, as Gloo requires."""
        for i, (o, t) in enumerate(zip(outs, inputs)):
            if o.shape != t.shape or o.dtype != t.dtype:
                raise RuntimeError("gorovod backend: %s's output tensor %d is %s of %s for an input of %s of %s" %
                                   (what, i, tuple(o.shape), o.dtype, tuple(t.shape), t.dtype))

    def _check_list(self, what, tensors):
        if len(tensors) != self.size():
            raise RuntimeError("gorovod backend: %s takes a list of %d tensors (one per rank), got %d" %
                               (what, self.size(), len(tensors)))


def _create(store, rank, world_size, timeout):
    """The backend's creator: torch passes its rendezvous' rank and size,
    which must be gorovod's for the default group, and the rank and size
    within the group for one new_group makes (on its members only, after
    every rank registered the group's process set: see _new_group_helper)."""
    if not mpi_ops.is_initialized():
        mpi_ops.init()
    topo = _core.topology()
    made = _current.pop("new_group", None)
    if made is not None:
        ranks, ps, tag_space = made
        if world_size != len(ranks) or not 0 <= rank < len(ranks) or ranks[rank] != topo.rank:
            raise RuntimeError("gorovod backend: new_group gave rank %d of %d for world ranks %s, but this process is "
                               "world rank %d" % (rank, world_size, ranks, topo.rank))
        pg = ProcessGroupGorovod(rank, world_size, world=topo.world, timeout=timeout, process_set=ps,
                                 group_ranks=ranks, store=store, tag_space=tag_space)
        _made_sets.groups.append((weakref.ref(pg), ps.process_set_id))
        return pg
    if rank != topo.rank or world_size != topo.size:
        raise RuntimeError("gorovod backend: init_process_group was given rank %d of %d, but gorovod's world has this "
                           "process as rank %d of %d: leave rank and world_size out" %
                           (rank, world_size, topo.rank, topo.size))
    made = _made_sets.current()
    made.defaults += 1
    return ProcessGroupGorovod(rank, world_size, world=topo.world, timeout=timeout, store=store,
                               names="gorovod.torch.distributed/%d/default-%d" % (topo.world, made.defaults))


def _group_process_set(ranks, timeout=None):
    """The gorovod process set of the world's ranks (sorted), registered on
    every rank of the world: the world's own for every rank, else the one
    registered already with these ranks (by an earlier new_group, or by the
    script's add_process_set), else a new one. Every rank calls it at the
    same point (torch's new_group runs on every rank, in the same order), as
    add_process_set requires. A set stays registered when its groups are
    destroyed (removing one is a call of every rank, which destroying a group
    is not) and is used again by the next group of the same ranks; a world
    change removes it. timeout (seconds; None: no limit) bounds the wait for
    the registration: TimeoutError past it (see mpi_ops.add_process_set)."""
    topo = _core.topology()
    if list(ranks) == list(range(topo.size)):
        return mpi_ops.global_process_set
    for ps_id in _core.process_set_ids():
        if ps_id != 0 and list(_core.process_set(ps_id)[1]) == list(ranks):
            ps = mpi_ops.ProcessSet(list(ranks))
            ps.process_set_id = ps_id
            return ps
    ps = mpi_ops.add_process_set(list(ranks), timeout=timeout)
    _made_sets.ids.append(ps.process_set_id)
    return ps


class _MadeSets(object):
    """The process sets the backend registered for groups (not the
    script's own, which a group may share), in the world they were made in,
    and this rank's groups on them: (a weak reference to the group, its
    set's id). The same ids, in the same order, on every rank: new_group
    runs on every rank in the same order."""

    def __init__(self):
        self.world, self.ids, self.groups = None, [], []
        # made: the gorovod groups new_group made in this world, so far
        # (each group's number is its point-to-point tag space); defaults:
        # the default groups made in this world (each one's number names
        # its collectives: see ProcessGroupGorovod._name).
        self.made = self.defaults = 0

    def current(self):
        """Forgets the sets of a world that has changed (the change removed
        them), and its groups."""
        world = _core.topology().world
        if world != self.world:
            self.world, self.ids, self.groups, self.made, self.defaults = world, [], [], 0, 0
        return self


_made_sets = _MadeSets()


def remove_destroyed_groups(timeout=None):
    """Removes the gorovod process sets of the groups that are destroyed
    on all their members: a set the backend registered for new_group goes
    once every member has destroyed each of its groups on it
    (destroy_process_group(group)), or dropped it. Removing a set is a call
    every rank of the world makes at the same point (torch's
    destroy_process_group(group) runs on the members only, and returns early
    on the others), so it happens here, where every rank passes: at each
    new_group (before the new group's set is chosen) and wherever the script
    calls this on every rank. Each rank says which sets it is done with (a
    member: no live group on it; the others: all) in one allreduce of the
    world; those all are done with are removed, on every rank. Returns the
    ids removed. timeout (seconds; None: no limit) bounds the wait for that
    allreduce: past it, TimeoutError, nothing is removed and the allreduce
    stays queued (it pairs with the other ranks' when they make it)."""
    made = _made_sets.current()
    if not made.ids:
        return []
    live = set()
    for ref, ps_id in made.groups:
        pg = ref()
        if pg is not None and pg in _live_groups():
            live.add(ps_id)
    made.groups = [(ref, ps_id) for ref, ps_id in made.groups if ref() is not None and ps_id in live]
    done = torch.tensor([0 if ps_id in live else 1 for ps_id in made.ids], dtype=torch.int32)
    handle = mpi_ops.allreduce_async_(done, op=mpi_ops.Min, name="gorovod.remove_destroyed_groups")
    mpi_ops.synchronize(handle, timeout)
    removed = [ps_id for ps_id, d in zip(made.ids, done.tolist()) if d]
    for ps_id in removed:
        ps = mpi_ops.ProcessSet(list(_core.process_set(ps_id)[1]))
        ps.process_set_id = ps_id
        mpi_ops.remove_process_set(ps)
    made.ids = [ps_id for ps_id in made.ids if ps_id not in removed]
    return removed


def _setup_limit(timeout, default):
    """The seconds a new_group's set-up may wait for the other ranks, and
    whose limit it is: new_group's timeout, or, where it was given none
    (torch 1.13 then passes its default_pg_timeout object itself), the
    default group's, as init_process_group(timeout=...) set it;
    (None, ...) for no limit."""
    if timeout is None or timeout is dist.constants.default_pg_timeout:
        timeout, whose = getattr(default, "timeout", None), "the default group's timeout"
    else:
        whose = "new_group's timeout"
    if timeout is None:
        timeout = dist.constants.default_pg_timeout
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
    return (seconds if seconds > 0 else None), whose


# How often a rank waiting in _await_world looks at the store again: after
# the first of these seconds, doubling up to the second.
_AWAIT_PAUSES = (0.001, 0.05)

# How long a rank waiting in _await_world for a rank that left the job
# gracefully waits for the job's proposer to form a world without it (it
# does so within milliseconds of the goodbye when the job goes on), so that
# an elastic job gets the world change it recovers from rather than an
# error it does not.
_LEFT_GRACE = 1.0


def _await_world(store, key, rank, size, seconds, whose, what, world=None):
    """Waits until every rank of the world (size ranks) has reached the
    set-up of one new_group (what), at most seconds (None: no limit), on
    the default group's store (key, the same on every rank): apart from
    gorovod's queue, so that a rank that gives up leaves nothing there that a
    later call would pair with, and the other groups go on. Past the limit
    this rank takes its arrival back and raises RuntimeError naming the
    ranks that had not arrived; it has numbered and registered nothing, so
    the same new_group made again later, by every rank, starts afresh.

    A world that breaks ends the wait too: once gorovod has been told of a
    newer world than world (the number of the world this rank waits in;
    None: not looked at) that goes on without a member gossip declared dead
    (it comes though no collective runs), this rank takes its arrival back
    and raises HorovodInternalError, as the collective that broke would. A
    member that died before it reached the store never arrives; the elastic
    loop (gorovod.torch.distributed.elastic.run) takes the error for the
    world change it is, and the new world makes the group again. A newer
    world that only adds or gracefully removes members does not end the
    wait: every member of this world still comes, and they all move at the
    next commit (raising there would bring them back to this wait in the
    same world, again and again).

    A member that left the job gracefully before it came (its process shut
    gorovod down: an exit, or a SIGTERM handler that exits) ends the wait
    too, as soon as gossip carries its goodbye: it will never come, and the
    job may form no world without it (one that reported training finished
    ends the job's worlds). Where gorovod has been told of a newer world,
    this rank raises HorovodInternalError as above; where it has not within
    _LEFT_GRACE seconds of learning of the leave, RuntimeError naming the
    ranks that left.

    key holds the ranks that have arrived, with a token naming the write
    (this rank and a random number), so that compare_set, which answers with
    the value it leaves, tells a rank whether its own write won. Once the
    key holds every rank no one changes it: a rank that times out just as
    the last one arrives finds it so and goes on with the others."""
    if store is None or size <= 1:
        return
    deadline = None if seconds is None else time.monotonic() + seconds

    def read():
        """The arrivals, without waiting: compare_set from "" leaves the key
        as it is, or makes it empty where it is missing (a store's get
        would wait for it)."""
        value = store.compare_set(key, "", ";")
        return value, set(int(q) for q in value.decode().split(";", 1)[0].split(",") if q)

    def change(present):
        """Adds this rank to the arrivals (present) or takes it back;
        returns the arrivals as this rank left them (the ranks but itself,
        when it took itself back) and whether they are complete."""
        while True:
            value, now = read()
            if len(now) >= size:
                return now, True
            if present:
                now.add(rank)
            else:
                now.discard(rank)
            new = "%s;%d.%s" % (",".join(str(q) for q in sorted(now)), rank, os.urandom(8).hex())
            if store.compare_set(key, value.decode(), new).decode() == new:
                return now, len(now) >= size
            # Another rank changed the key meanwhile: look again.

    def stored(fn, *args):
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 (the store's own failure, said with what it was for)
            raise RuntimeError("gorovod backend: %s: the default group's store failed while the ranks met there "
                               "to set the group up: %s" % (what, e)) from e

    def give_up():
        """Takes this rank's arrival back: None when the meeting was complete
        meanwhile (this rank goes on with the others), else the ranks that
        had not come."""
        now, complete = stored(change, False)
        if complete:
            return None
        return [q for q in range(size) if q not in now and q != rank]

    now, complete = stored(change, True)
    pause = _AWAIT_PAUSES[0]
    left_since = None  # when this rank learnt that a rank it waits for left the job
    while not complete:
        left = None if deadline is None else deadline - time.monotonic()
        newest, breaking = (None, False) if world is None else _core.newest_world()
        gone = [] if world is None else [q for q in _core.left_ranks() if q not in now and q != rank]
        if gone and left_since is None:
            left_since = time.monotonic()
        if gone and (newest > world or time.monotonic() - left_since >= _LEFT_GRACE):
            if give_up() is None:
                return
            names = "rank%s %s" % ("s" if len(gone) > 1 else "", ", ".join(str(q) for q in gone))
            if newest > world:
                raise HorovodInternalError(
                    "gorovod backend: %s: %s of world %d left the job (shut gorovod down) before calling new_group, "
                    "and gorovod was told of world %d: nothing was registered; the new world makes the group anew" %
                    (what, names, world, newest))
            raise RuntimeError(
                "gorovod backend: %s: %s left the job (shut gorovod down) before calling new_group, which every "
                "rank of the world must call, so the group cannot be made in world %d. Nothing was registered or "
                "left queued" % (what, names, world))
        if breaking and newest > world:
            late = give_up()
            if late is None:
                return
            raise HorovodInternalError(
                "gorovod backend: %s: the world changed (gorovod was told of world %d while rank%s %s of world %d "
                "had not called new_group yet): nothing was registered; the new world makes the group anew" %
                (what, newest, "s" if len(late) > 1 else "", ", ".join(str(q) for q in late), world))
        if left is not None and left <= 0:
            late = give_up()
            if late is None:
                return
            raise RuntimeError(
                "gorovod backend: %s timed out after %gs (%s ran out) waiting for every rank of the world to "
                "call new_group, which each must, members of the group or not (torch's rule; gorovod registers the "
                "group's process set on every rank): rank%s %s %s not called it. Nothing was registered or left "
                "queued: every rank may call new_group again, and the other groups go on" %
                (what, seconds, whose, "s" if len(late) > 1 else "", ", ".join(str(q) for q in late),
                 "have" if len(late) > 1 else "has"))
        time.sleep(pause if left is None else min(pause, left))
        pause = min(2 * pause, _AWAIT_PAUSES[1])
        now = stored(read)[1]
        complete = len(now) >= size


def _live_groups():
    """torch's map of the process groups alive in this process (the
    default group and those new_group made, not destroyed). torch 2.x
    reaches it through its _world object; 1.13 has only the module's
    _pg_map, which 2.x keeps behind _world."""
    c10d = dist.distributed_c10d
    world = getattr(c10d, "_world", None)
    if world is not None and hasattr(world, "pg_map"):
        return world.pg_map
    return c10d._pg_map


def _new_group_helper(original):
    """torch's _new_process_group_helper, which new_group (and
    new_subgroups) call on every rank, members or not: for a gorovod group
    of some ranks, first registers the process set its collectives run on,
    on every rank of the world, and hands it to _create (which torch calls on
    the members only) with the group's number in this world (its
    point-to-point tag space). Every step is bounded by new_group's timeout
    (given none, the default group's; see _setup_limit): the meeting of
    every rank on the store first (_await_world), which a rank that gives
    up leaves as if it had never come, then the calls on gorovod's queue,
    which every rank then makes at once."""

    def helper(group_size, group_rank, global_ranks_in_group, backend, store, *args, **kwargs):
        if not global_ranks_in_group or str(backend) != BACKEND:
            return original(group_size, group_rank, global_ranks_in_group, backend, store, *args, **kwargs)
        if not mpi_ops.is_initialized():
            mpi_ops.init()
        topo = _core.topology()
        default = dist.distributed_c10d._get_default_group()
        if default.rank() != topo.rank or default.size() != topo.size:
            raise RuntimeError("gorovod backend: new_group needs a default group whose ranks are gorovod's; it has "
                               "this process as rank %d of %d, gorovod as rank %d of %d" %
                               (default.rank(), default.size(), topo.rank, topo.size))
        ranks = list(global_ranks_in_group)
        seconds, whose = _setup_limit(kwargs.get("timeout"), default)
        what = "new_group(ranks=%s)" % sorted(ranks)
        # Every rank numbers the group alike: new_group runs on every rank,
        # in the same order. A set-up that gave up before every rank
        # arrived numbered nothing, so the next new_group has its number.
        made = _made_sets.current()
        number = made.made + 1
        _await_world(store, "gorovod-new-group/%d/%d" % (topo.world, number), topo.rank, topo.size, seconds,
                     whose, what, topo.world)
        made.made = number
        try:
            remove_destroyed_groups(seconds)
            ps = _group_process_set(sorted(ranks), seconds)
        except TimeoutError:
            raise RuntimeError("gorovod backend: %s timed out after %gs (%s ran out) in the calls that set the group "
                               "up on gorovod's queue (the removal of destroyed groups' process sets, the "
                               "registration of its own), though every rank of the world had called new_group: a "
                               "rank has calls queued before them that the others did not make. What timed out "
                               "stays queued, and pairs with the other ranks' calls when they make them" %
                               (what, seconds, whose)) from None
        _current["new_group"] = (ranks, ps, made.made)
        try:
            return original(group_size, group_rank, global_ranks_in_group, backend, store, *args, **kwargs)
        finally:
            _current.pop("new_group", None)

    helper.gorovod = True
    return helper


def _monitored_barrier(original):
    """torch's dist.monitored_barrier, which on a gorovod group runs the
    group's monitored_barrier (torch's own refuses any backend but Gloo)."""

    def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
        c10d = dist.distributed_c10d
        if group is None:
            group = c10d._get_default_group() if c10d.is_initialized() else None
        if not isinstance(group, ProcessGroupGorovod):
            return original(group, timeout, wait_all_ranks)
        return group.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)

    monitored_barrier.__doc__ = original.__doc__
    monitored_barrier.gorovod = True
    return monitored_barrier


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


class _Rendezvous(object):
    """One world's store: rank 0 serves it, every rank holds a client (rank
    0 the server). host and port are MASTER_ADDR and MASTER_PORT."""

    def __init__(self, store, host, port, world, rank, size):
        self.store, self.host, self.port = store, host, port
        self.world, self.rank, self.size = world, rank, size
        self.groups = 0  # process groups made with it so far

    def group_store(self):
        """The store for the next process group of this world: a prefix of
        its own, the same on every rank (each makes the same groups in the
        same order), because init_process_group's barrier counts arrivals
        under a key that restarts with each default group."""
        self.groups += 1
        return dist.PrefixStore("gorovod-group-%d" % self.groups, self.store)


# The rendezvous of the world this process is in (None before the first,
# or outside a gorovod job), and the torchrun variables this module set (so
# that a world change updates those, never one the script set).
_current = {"rendezvous": None, "env": {}}


def _tcp_store(*args, **kwargs):
    """dist.TCPStore(*args, **kwargs), on torch's libuv server where torch
    has it (its default since 2.4), else on its older one: a torch built
    without libuv (Debian's 2.6) refuses its own default."""
    try:
        return dist.TCPStore(*args, **kwargs)
    except RuntimeError as e:
        if "libuv" not in str(e):
            raise
        return dist.TCPStore(*args, use_libuv=False, **kwargs)


def _rendezvous(timeout):
    """A TCPStore for the job's current world: rank 0 serves it on a port the
    kernel picks and tells the others where, over gorovod's own broadcast
    (one collective, which every member of the world must make at the same
    point: on import, and at each world change of an elastic DDP job)."""
    topo = _core.topology()
    r, n = topo.rank, topo.size
    where = torch.zeros(256, dtype=torch.uint8)
    store = None
    if r == 0:
        host = _store_host()
        store = _tcp_store(host, 0, n, True, timeout, wait_for_workers=False)
        text = ("%s %d" % (host, store.port)).encode()
        where[:len(text)] = torch.tensor(list(text), dtype=torch.uint8)
    mpi_ops.broadcast_(where, 0)
    host, port = bytes(where.tolist()).rstrip(b"\0").decode().split(" ")
    if r != 0:
        store = _tcp_store(host, int(port), n, False, timeout)
    rdv = _Rendezvous(store, host, int(port), topo.world, r, n)
    _current["rendezvous"] = rdv
    _set_torchrun_environment(rdv)
    _log.debug("gorovod world %d: rank %d of %d, store at %s:%s", topo.world, r, n, host, port)
    return rdv


def _answers_env_rendezvous():
    """Whether this module's env:// handler answers: inside a gorovod job
    whose MASTER_ADDR and MASTER_PORT are unset or the ones it set."""
    if "GOROVOD_JOB_ID" not in os.environ:
        return False
    ours = _current["env"]
    return all(os.environ.get(name) in (None, ours.get(name)) for name in ("MASTER_ADDR", "MASTER_PORT"))


def _world_rendezvous(timeout):
    """The rendezvous of gorovod's current world: the one made on import
    while the world is the same, else a new one."""
    if not mpi_ops.is_initialized():
        mpi_ops.init()
    rdv = _current["rendezvous"]
    if rdv is None or rdv.world != _core.topology().world:
        rdv = _rendezvous(timeout)
    return rdv


def _gorovod_env_rendezvous(original):
    """torch's env:// handler, answered by gorovod inside a gorovod job
    whose environment names no other master."""

    def handler(url, timeout=None, **kwargs):
        if not _answers_env_rendezvous():
            if timeout is None:
                yield from original(url, **kwargs)
            else:
                yield from original(url, timeout=timeout, **kwargs)
            return
        rdv = _world_rendezvous(timeout if timeout is not None else dist.constants.default_pg_timeout)
        _log.debug("torch.distributed env:// rendezvous answered by gorovod: rank %d of %d", rdv.rank, rdv.size)
        yield (rdv.group_store(), rdv.rank, rdv.size)

    handler.gorovod = True
    return handler


def switch_world():
    """Makes the default process group one for gorovod's current world, when
    it is not already: the old group is destroyed, the new world's rank 0
    serves a new store (the rendezvous above, one broadcast) and
    init_process_group makes the group with the new rank and size, with the
    old group's timeout. Every member of the new world calls it at the same
    point (gorovod.torch.distributed.elastic does, after each world change),
    as a worker that joins does on import. Returns whether the group was
    replaced. Modules wrapped in DistributedDataParallel keep the old group:
    wrap them again."""
    old = dist.group.WORLD if dist.is_initialized() else None
    if old is not None and not isinstance(old, ProcessGroupGorovod):
        raise RuntimeError("gorovod: the default process group is %s's, not gorovod's: an elastic job needs "
                           "init_process_group(\"gorovod\")" % dist.get_backend())
    if not mpi_ops.is_initialized():
        mpi_ops.init()
    world = _core.topology().world
    if old is not None and old.world == world:
        return False
    timeout = old.timeout if old is not None else dist.constants.default_pg_timeout
    if old is not None:
        # Destroying the default group drops every group (torch's rule); the
        # gorovod groups new_group made were the old world's, whose process
        # sets the world change removed.
        groups = [pg for pg in _live_groups() if isinstance(pg, ProcessGroupGorovod)]
        dist.destroy_process_group()
        for pg in groups:
            pg.close()
    # A member lost during the rendezvous leaves the others waiting on the
    # store (connecting to a dead rank 0, or in init_process_group's
    # barrier) until this limit, after which the failure is a RuntimeError
    # and run() starts the world change over.
    limit = min(timeout, _SWITCH_LIMIT)
    rdv = _world_rendezvous(limit)
    store = dist.PrefixStore("default_pg", rdv.group_store())
    dist.init_process_group(BACKEND, store=store, rank=rdv.rank, world_size=rdv.size, timeout=limit)
    rdv.store.set_timeout(timeout)
    dist.group.WORLD.timeout = timeout
    return True


def register():
    """Registers the "gorovod" backend and the env:// rendezvous inside
    gorovod jobs. Importing this module calls it; calling it again is a
    no-op."""
    # torch sets the attribute to "gorovod" or, in some versions, "GOROVOD";
    # it refuses a name that has it. gorovod._torch_autoload may have
    # registered the name (with a creator that hands over to _create).
    if not hasattr(dist.Backend, BACKEND.upper()):
        _torch_autoload.register_backend(dist, _create)
    # torch.distributed.rendezvous is also the name of a function there.
    handlers = importlib.import_module("torch.distributed.rendezvous")._rendezvous_handlers
    if "env" in handlers and not getattr(handlers["env"], "gorovod", False):
        handlers["env"] = _gorovod_env_rendezvous(handlers["env"])
    c10d = dist.distributed_c10d
    if not getattr(c10d._new_process_group_helper, "gorovod", False):
        c10d._new_process_group_helper = _new_group_helper(c10d._new_process_group_helper)
    # torch 1.13's dist.monitored_barrier refuses every backend but Gloo by
    # name before it reaches the group, which offers it (monitored_barrier).
    if not getattr(c10d.monitored_barrier, "gorovod", False):
        c10d.monitored_barrier = dist.monitored_barrier = _monitored_barrier(c10d.monitored_barrier)
    # The collectives' works are torch's own (see _work); their Python side
    # gives them the group's timeout and raises the collective's error.
    for name in ("wait", "exception", "is_success", "result", "synchronize"):
        original = getattr(dist._Work, name)
        if not getattr(original, "gorovod", False):
            setattr(dist._Work, name, _work_method(name, original))
    # torch's C++ callers of wait() that let a collective's error pass (see
    # _checked_from_cpp); torch's Python code calls them by these names.
    for name, what in (("_broadcast_coalesced", "torch's _broadcast_coalesced (DistributedDataParallel's broadcast "
                                                "of the module's states and buffers)"),
                       ("_verify_params_across_processes", "torch's _verify_params_across_processes "
                                                           "(DistributedDataParallel's check of the parameters)")):
        original = getattr(dist, name, None)
        if original is not None and not getattr(original, "gorovod", False):
            setattr(dist, name, _checked_from_cpp(original, what))


def _set_torchrun_environment(rdv):
    """Gives the process torchrun's variables for the world rdv is of (RANK,
    WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
    MASTER_PORT), so a script that reads them (LOCAL_RANK for
    torch.cuda.set_device, say) runs as under torchrun. A variable the
    script or its launcher set is left as it is; those set here follow the
    world (an elastic job's later worlds renumber the ranks)."""
    ours = _current["env"]
    for name, value in (("RANK", rdv.rank), ("WORLD_SIZE", rdv.size),
                        ("LOCAL_RANK", mpi_ops.local_rank()), ("LOCAL_WORLD_SIZE", mpi_ops.local_size()),
                        ("GROUP_RANK", mpi_ops.cross_rank()), ("MASTER_ADDR", rdv.host),
                        ("MASTER_PORT", rdv.port)):
        if os.environ.get(name) in (None, ours.get(name)):
            os.environ[name] = ours[name] = str(value)


def _torchrun_environment():
    """Inside a gorovod job, joins it and makes the world's rendezvous, which
    sets torchrun's variables."""
    if "GOROVOD_JOB_ID" not in os.environ:
        return
    if not mpi_ops.is_initialized():
        mpi_ops.init()
    _rendezvous(dist.constants.default_pg_timeout)


register()
_torchrun_environment()
