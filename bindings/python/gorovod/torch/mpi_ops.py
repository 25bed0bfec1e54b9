"""The collectives on torch tensors, with Horovod's signatures.

Collectives pair across the ranks as in Horovod: a call given a ``name``
pairs with the other ranks' call of that name, whatever its order in each
rank's sequence; calls without one pair by their order among the unnamed
calls (Horovod names them by a counter). Differences from Horovod:

- a name stays in flight (a second call of that name raises ValueError)
  until its handle is synchronized, not until the call completes;
- ranks that call one collective differently (another kind, dtype, element
  count, op, root or scale factor) get MismatchError, a RuntimeError, on
  every rank: the library compares each call's description across the ranks
  before it moves any data, so only that call fails and the next ones run;
  a named call that no other rank's pairs with fails so after the I/O
  timeout; allreduce compares shapes, broadcast only element counts
  (allgather, alltoall and reducescatter exchange shapes first and check
  them; a named one does so on a thread of its own, see _ChainHandle);
- ``join()`` serves the others' allreduces with zeros, as Horovod's does;
  their other collectives fail while a rank has joined.

Tensors are CPU or CUDA tensors of float32, float64, float16, bfloat16,
int32, int64 or uint8 (broadcast, allgather and alltoall move any dtype, as
bytes), and contiguous; the tensors of one call are on one device. The
library reduces CUDA tensors in device memory (its fusion buffers too),
loading the NVIDIA driver when a call first names a GPU. As in Horovod, a call on CUDA tensors
records an event on the tensors' current stream
(``torch.cuda.current_stream(tensor.device)``) when it is made, and the
library waits for that event before it reads them, so the call is ordered
after the work queued before it and neither this thread nor the stream
blocks; once synchronize() returns, the results are in place for any work
queued afterwards. On a host with several GPUs, choose one per worker first,
as in Horovod: ``torch.cuda.set_device(hvd.local_rank())`` (``gorovod run``
leaves CUDA_VISIBLE_DEVICES as it finds it, so every worker sees every GPU).
Under ``gorovod run --assign-gpus`` each worker sees only its own GPU, as
device 0: use ``hvd.local_rank() % torch.cuda.device_count()``, which works
both ways.
"""

import functools
import inspect
import threading
import time
import warnings
import zlib

import torch

from gorovod import _core
from gorovod.exceptions import HorovodInternalError, MismatchError, NotInitializedError  # noqa: F401 (re-exported)
from gorovod.torch.compression import Compression

# Reduce ops, with Horovod's values.
Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5

_OPS = {Average: _core.AVERAGE, Sum: _core.SUM, Min: _core.MIN, Max: _core.MAX, Product: _core.PRODUCT,
        Adasum: _core.ADASUM}

_DTYPES = {
    torch.float32: _core.FLOAT32,
    torch.float64: _core.FLOAT64,
    torch.float16: _core.FLOAT16,
    torch.bfloat16: _core.BFLOAT16,
    torch.int32: _core.INT32,
    torch.int64: _core.INT64,
    torch.uint8: _core.UINT8,
}


class ProcessSet(object):
    """Some of the world's ranks, which run collectives among themselves, as
    Horovod's ProcessSet: build it from a list of ranks, register it with
    add_process_set (or init(process_sets=[...])), and pass it as the
    process_set of a collective, on its members only. Roots (broadcast's
    root_rank) are world ranks, as in Horovod; rank() is the rank within
    the set. Sets built from an MPI communicator are not offered (gorovod has
    no MPI).

    A world change (an elastic job's workers coming or going) removes every
    set but global_process_set: their ranks were the old world's. Add them
    again after the reset (a State's on_reset callback), as a Horovod script
    does after its elastic reset."""

    process_set_id = None
    ranks = None
    mpi_comm = None

    def __init__(self, ranks_or_comm):
        try:
            ranks = sorted(ranks_or_comm)
        except TypeError:
            raise ValueError("ProcessSet should be initialized with a list of process ranks (gorovod has no MPI "
                             "communicators)")
        if any(not isinstance(r, int) or isinstance(r, bool) for r in ranks):
            raise ValueError("ProcessSet should be initialized with a list of process ranks or an mpi4py Comm object")
        self.ranks = ranks

    def _invalidate(self):
        self.process_set_id = None

    def size(self):
        """The number of ranks in the set, or None when it is not registered."""
        if self.process_set_id is None:
            return None
        return len(_set_info(self.process_set_id)[1])

    def rank(self):
        """This process's rank within the set (None when the set is not
        registered); ValueError when the process is not a member."""
        if self.process_set_id is None:
            return None
        me = _set_info(self.process_set_id)[0]
        if me < 0:
            raise ValueError("Process is not part of provided process set.")
        return me

    def included(self):
        """Whether this process is a member (None when the set has no ranks)."""
        if self.ranks is None:
            return None
        return rank() in self.ranks

    def __str__(self):
        return "ProcessSet(process_set_id=%s, ranks=%s, mpi_comm=%s)" % (self.process_set_id, self.ranks,
                                                                        self.mpi_comm)

    __repr__ = __str__


class _GlobalProcessSet(ProcessSet):
    """The whole world: process set 0, always registered. Its ranks are the
    current world's (they change with an elastic job's world)."""

    def __init__(self):
        self.process_set_id = 0

    @property
    def ranks(self):
        if not _core.is_initialized():
            return []
        return list(range(size()))

    def size(self):
        return size()

    def rank(self):
        return rank()

    def included(self):
        return True


global_process_set = _GlobalProcessSet()


def _set_info(process_set_id):
    """(this process's rank in the set or -1, the set's ranks), from the
    library; ValueError for a set it does not know."""
    try:
        return _core.process_set(process_set_id)
    except NotInitializedError:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    except ValueError:
        raise ValueError("Process set does not exist or has not been registered (process sets are removed when the "
                         "world changes: add them again after the reset).")


def add_process_set(process_set, timeout=None):
    """Registers a process set (a ProcessSet or a list of ranks) on every
    rank and returns it, registered. Every rank of the world must make the
    same call at the same point of its sequence. ValueError for a set of the
    same ranks as a registered one (the whole world included). Unlike in
    Horovod, HOROVOD_DYNAMIC_PROCESS_SETS need not be set. timeout (seconds;
    None: no limit) bounds the wait for the other ranks' registration: past
    it, TimeoutError, and the registration stays queued, to pair with the
    others' when they make it (the set is then registered, unseen by this
    call)."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set is global_process_set:
        raise ValueError("Attempted to add a duplicate process set: %s" % process_set)
    try:
        process_set.process_set_id = _core.add_process_set(process_set.ranks, timeout=timeout)
    except NotInitializedError:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    except ValueError as e:
        if "exists already" in str(e):
            raise ValueError("Attempted to add a duplicate process set: %s" % process_set)
        raise
    return process_set


def remove_process_set(process_set):
    """Unregisters a process set on every rank (all must make the call);
    returns whether it was registered. The set object is invalidated."""
    process_set_id = process_set.process_set_id
    if process_set_id is None or process_set_id == 0:
        return False
    process_set._invalidate()
    try:
        _core.remove_process_set(process_set_id)
    except NotInitializedError:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    except ValueError:
        return False  # not registered (removed already, or by a world change)
    return True


def _check_process_set(process_set):
    """The library's id of process_set (0: the world); ValueError for one
    not registered."""
    if process_set is None or process_set is global_process_set:
        return 0
    if not isinstance(process_set, ProcessSet):
        raise ValueError("process_set must be a ProcessSet (hvd.global_process_set, or one add_process_set "
                         "returned), not %r" % (process_set,))
    if process_set.process_set_id is None:
        raise ValueError("%s is not registered: add it with hvd.add_process_set() (or hvd.init(process_sets=...)) "
                         "first" % process_set)
    return process_set.process_set_id


def _set_place(process_set):
    """(the library's id, this process's rank in the set, the set's size)
    of process_set; ValueError when this process is not a member."""
    ps = _check_process_set(process_set)
    if ps == 0:
        t = _topology()
        return 0, t.rank, t.size
    me, ranks = _set_info(ps)
    if me < 0:
        raise ValueError("Rank %d is not a member of the provided process set %s." % (rank(), process_set))
    return ps, me, len(ranks)


# ---- Life cycle and topology ----

def init(comm=None, process_sets=None, **kwargs):
    """Joins the job `gorovod run` started this process in, or trains alone
    in a world of one. Keyword arguments (job_id, secret_hex, seeds, io_timeout,
    fusion_bytes, log_level) name a job explicitly; see gorovod._core.init."""
    if comm is not None:
        raise ValueError("gorovod has no MPI communicator: call init() without comm")
    if isinstance(process_sets, str):
        if process_sets.lower() != "dynamic":
            raise ValueError("process_sets: a list of ProcessSet, or \"dynamic\", not %r" % process_sets)
        process_sets = None  # gorovod's sets are always dynamic
    _core.init(**kwargs)
    for i, ps in enumerate(process_sets or []):
        if ps.process_set_id is not None:
            continue  # registered already (init called again)
        try:
            add_process_set(ps)
        except ValueError as e:
            if "duplicate" in str(e):
                raise ValueError("Horovod could not be initialized because process_sets entry number %d is a "
                                 "duplicate: %s" % (i, ps))
            raise


def shutdown():
    """Leaves the job, telling it that training is over."""
    _core.shutdown(finished=True)


def is_initialized():
    return _core.is_initialized()


def _topology():
    try:
        return _core.topology()
    except NotInitializedError:
        raise ValueError("gorovod has not been initialized; use hvd.init().")


def size():
    """The number of workers in the current world (it changes in elastic
    jobs)."""
    return _topology().size


def rank():
    return _topology().rank


def local_size():
    return _topology().local_size


def local_rank():
    return _topology().local_rank


def cross_size():
    return _topology().cross_size


def cross_rank():
    return _topology().cross_rank


def is_homogeneous():
    return True


# What Horovod scripts ask about their build.
def mpi_threads_supported():
    return False


def mpi_enabled():
    return False


def mpi_built():
    return False


def gloo_enabled():
    return False


def gloo_built():
    return False


def nccl_built():
    return 0


def ddl_built():
    return False


def ccl_built():
    return False


def cuda_built():
    """Whether the library takes CUDA tensors (True for every build of
    libgorovod: it loads the NVIDIA driver when a call first names a GPU)."""
    return _core.cuda_supported()


def rocm_built():
    return False


def start_timeline(file_path, mark_cycles=False):
    raise NotImplementedError("gorovod's timeline is not offered through the Python binding yet")


def stop_timeline():
    raise NotImplementedError("gorovod's timeline is not offered through the Python binding yet")


# ---- Tensors ----

def _check_tensor(tensor, what, reducing=True):
    """Returns (address, count, dtype code) of a tensor the library can take.
    Reducing collectives need one of the seven dtypes; the others move any
    dtype as bytes."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("gorovod %s: expected a torch.Tensor, got %s" % (what, type(tensor).__name__))
    # is_cpu and is_cuda rather than device.type: a Tensor's device is an
    # object made on each access, several times their cost.
    if not (tensor.is_cpu or tensor.is_cuda):
        raise ValueError("gorovod %s: the tensor is on %s: gorovod takes CPU and CUDA tensors; copy the tensor to "
                         "the CPU" % (what, tensor.device))
    if tensor.is_sparse:
        raise ValueError("gorovod %s: sparse tensors are not supported (use sparse_as_dense, or to_dense())" % what)
    if not tensor.is_contiguous():
        raise ValueError("gorovod %s: Tensor is required to be contiguous (call .contiguous() first)." % what)
    dt = _DTYPES.get(tensor.dtype)
    if dt is not None:
        return tensor.data_ptr(), tensor.numel(), dt
    if reducing:
        raise ValueError("gorovod %s: dtype %s is not supported (float32, float64, float16, bfloat16, int32, int64, "
                         "uint8)" % (what, tensor.dtype))
    return tensor.data_ptr(), tensor.numel() * tensor.element_size(), _core.UINT8


def _memory(what, *tensors):
    """Where a call's tensors are, for the library: None for CPU tensors,
    else a _core.CudaMemory of their device with an event recorded now on
    the device's current stream (the library waits for it before it reads
    them). Call it once the call's outputs are allocated, right before the
    library call. ValueError for tensors on different devices."""
    if all(isinstance(t, torch.Tensor) and t.is_cpu for t in tensors):
        return None  # the common case, without making a device object per tensor
    device = None
    for t in tensors:
        if device is None:
            device = t.device
        elif t.device != device:
            raise ValueError("gorovod %s: the tensors of one call must be on one device, not on %s and %s" %
                             (what, device, t.device))
    if device is None or device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return _core.CudaMemory(device.index, event.cuda_event, event)


def _on_callers_stream(tensor, fn):
    """fn, run on the stream that is current for tensor's device now (a CUDA
    tensor), wherever and whenever it runs: a named call's second step runs
    on a thread of its own (_ChainHandle), whose current stream is the
    default one, and it must allocate its output and record its event on
    the caller's stream."""
    if tensor.device.type != "cuda":
        return fn
    stream = torch.cuda.current_stream(tensor.device)

    def run(*args):
        with torch.cuda.stream(stream):
            return fn(*args)
    return run


def _op(op, average=None):
    if average is not None:
        warnings.warn("the 'average' argument is deprecated: use op=Average or op=Sum", DeprecationWarning)
        if op is not None:
            raise ValueError("give op or average, not both")
        return _core.AVERAGE if average else _core.SUM
    if op is None:
        op = Average
    if op not in _OPS:
        raise ValueError("unknown reduce op %r (Average, Sum, Adasum, Min, Max, Product)" % (op,))
    return _OPS[op]


def _check_adasum(op, process_set):
    """Adasum pairs the workers up level by level, so it needs a
    power-of-two number of them; Horovod raises NotImplementedError too."""
    if op == _core.ADASUM:
        n = process_set.size()
        if n & (n - 1):
            raise NotImplementedError("gorovod: Adasum needs a power-of-two number of workers; there are %d" % n)


# What synchronize returns for each handle: a tensor, a tuple, or a callable
# that produces it once the call completed.
_outputs = {}


def _handle(h, output):
    _outputs[h] = output
    return h


class _GroupHandle(object):
    """The handle of a grouped call the binding makes as one call per
    tensor: synchronize returns the list of their outputs."""

    def __init__(self, handles):
        self.handles = handles


class _ChainHandle(object):
    """The handle of a named call the binding makes in two steps, every
    rank's shape first and then the data (allgather, alltoall,
    reducescatter): a thread of its own waits for the first and submits the
    second, so that the ranks' named calls pair by name whatever order they
    make and synchronize them in (a caller waiting for the first step would
    hold up its later calls, which another rank may be waiting for)."""

    def __init__(self, first, then):
        self.handle, self.error, self.collected = None, None, False
        self.done = threading.Event()

        def run():
            try:
                _core.wait(first)
                self.handle = then()
            except BaseException as e:  # raised by synchronize
                self.error = e
            finally:
                self.done.set()
        threading.Thread(target=run, name="gorovod named call", daemon=True).start()

    def wait(self):
        """The second step's handle, once submitted; raises the error of
        either step's submission or of the first step."""
        while not self.done.wait(0.1):  # in slices: Ctrl-C stays possible
            pass
        if self.error is not None:
            raise self.error
        return self.handle


# The names of the asynchronous calls in flight -> their handle, and back:
# Horovod refuses a second call with the name of one in flight.
_names = {}
_handle_names = {}


def _named(fn):
    """Makes the asynchronous call fn refuse a name that a call still in
    flight was given (ValueError, as Horovod's duplicate name error), and
    remember the name of the call it starts until that is synchronized. (In
    flight: until synchronize collects it, rather than until it completes as
    in Horovod, so that a refusal does not depend on how fast the call
    ran.)"""
    # The name's place among fn's positional parameters, found once: binding
    # the arguments to the signature on every call (inspect) cost more than
    # the rest of a small call's Python path. Arguments that do not fit fn
    # raise its own TypeError when it is called.
    params = list(inspect.signature(fn).parameters)
    at = params.index("name")

    @functools.wraps(fn)
    def call(*args, **kwargs):
        name = args[at] if len(args) > at else kwargs.get("name")
        if name is None or (len(args) > at and "name" in kwargs):
            return fn(*args, **kwargs)
        earlier = _names.get(name)
        if earlier is not None and not _collected(earlier):
            raise ValueError("gorovod: a collective named %r is still in flight: names of calls in flight must be "
                             "unique (synchronize the first one before reusing its name)" % (name,))
        handle = fn(*args, **kwargs)
        _names[name] = handle
        _handle_names[handle] = name
        return handle
    return call


def _collected(handle):
    """Whether handle was collected: synchronized, or drained after a world
    change."""
    if isinstance(handle, _ChainHandle):
        return handle.collected
    if isinstance(handle, _GroupHandle):
        return all(_collected(h) for h in handle.handles)
    try:
        poll(handle)
        return False
    except ValueError:
        return True


def _forget_name(handle):
    name = _handle_names.pop(handle, None)
    if name is not None and _names.get(name) == handle:
        del _names[name]


def poll(handle):
    """True once the asynchronous call has completed."""
    if isinstance(handle, _GroupHandle):
        return all(poll(h) for h in handle.handles)
    if isinstance(handle, _ChainHandle):
        if handle.collected:
            raise ValueError("gorovod: the call was synchronized already")
        if not handle.done.is_set():
            return False
        return handle.error is not None or poll(handle.handle)
    return _core.poll(handle)


def synchronize(handle, timeout=None):
    """Waits for an asynchronous call and returns its output. Raises
    HorovodInternalError when the world changed under it. timeout (seconds;
    None: no limit) bounds the wait for a call of one handle (the
    torch.distributed backend's completer gives its process group's):
    past it, TimeoutError, and the call stays in flight with its name and
    output (synchronize it again). A named call made in two steps
    (_ChainHandle) counts both steps against the timeout; past it, it stays
    in flight as it is (its second step submitted or not)."""
    if timeout is not None and isinstance(handle, _ChainHandle):
        return _synchronize_chain(handle, timeout)
    if timeout is not None and not isinstance(handle, _GroupHandle) and handle in _outputs:
        try:
            _core.wait(handle, timeout)
        except TimeoutError:
            raise  # nothing collected
        except BaseException:
            _forget_name(handle)
            _outputs.pop(handle, None)
            raise
        _forget_name(handle)
        output = _outputs.pop(handle, None)
        return output() if callable(output) else output
    _forget_name(handle)
    if isinstance(handle, _ChainHandle):
        if handle.collected:
            raise ValueError("gorovod: the call was synchronized already")
        handle.collected = True
        return synchronize(handle.wait())
    if isinstance(handle, _GroupHandle):
        outputs, failure = [], None
        for h in handle.handles:  # every one collected, even after a failure
            try:
                outputs.append(synchronize(h))
            except Exception as e:
                failure = failure or e
        if failure is not None:
            raise failure
        return outputs
    if handle not in _outputs:
        return None
    try:
        _core.wait(handle)
    finally:
        output = _outputs.pop(handle, None)
    return output() if callable(output) else output


def _synchronize_chain(handle, timeout):
    """synchronize(handle, timeout) of a _ChainHandle: waits for its first
    step and the submission of its second, then for the second, within
    timeout seconds in all; TimeoutError leaves it uncollected."""
    if handle.collected:
        raise ValueError("gorovod: the call was synchronized already")
    deadline = time.monotonic() + max(0.0, float(timeout))
    if not handle.done.wait(max(0.0, deadline - time.monotonic())):
        raise TimeoutError("gorovod: a named call's exchange of shapes not done within %gs" % timeout)
    if handle.error is not None:
        handle.collected = True
        _forget_name(handle)
        raise handle.error
    output = synchronize(handle.handle, max(0.0, deadline - time.monotonic()))  # TimeoutError: both stay
    handle.collected = True
    _forget_name(handle)
    return output


# ---- Scale factors as Horovod applies them ----

_INTEGER = (torch.int32, torch.int64, torch.uint8)
_HALF = (torch.float16, torch.bfloat16)


def _scales_here(tensors, prescale_factor, postscale_factor):
    """Whether the binding applies the scale factors itself, as Horovod's CPU
    code computes them, rather than the library: integers are scaled in
    float64 and truncated toward zero (the library rounds to nearest), and
    a half-precision result is rounded to its dtype before the postscale
    factor is applied in float32 (the library's ring rounds once, after
    it). What is not a tensor is left for the library call to refuse."""
    if prescale_factor == 1.0 and postscale_factor == 1.0:
        return False  # nothing to scale (the common case: no look at each tensor)
    dtypes = [getattr(t, "dtype", None) for t in tensors]
    if prescale_factor != 1.0 and any(d in _INTEGER for d in dtypes):
        return True
    return postscale_factor != 1.0 and any(d in _INTEGER or d in _HALF for d in dtypes)


def _scaled(tensor, factor):
    """tensor * factor as Horovod's CPU ScaleBuffer computes it: integers in
    float64, converted back truncating toward zero; float16 and bfloat16 in
    float32; the others in their own dtype with the factor rounded to it."""
    if tensor.dtype in _INTEGER:
        return (tensor.to(torch.float64) * factor).to(tensor.dtype)
    if tensor.dtype in _HALF:
        return (tensor.to(torch.float32) * torch.tensor(factor, dtype=torch.float32)).to(tensor.dtype)
    return tensor * torch.tensor(factor, dtype=tensor.dtype)


def _scale_plan(op, prescale_factor, postscale_factor, process_set=None):
    """(op, the postscale factor) the binding applies when it scales:
    Average becomes Sum and a postscale of 1/size (the process set's), as in
    Horovod."""
    if op == _core.AVERAGE:
        return _core.SUM, postscale_factor / _set_place(process_set)[2]
    return op, postscale_factor


def _finish_scaled(outputs, factor):
    """Applies the postscale factor to outputs in place, once the call has
    completed; returns what synchronize returns."""
    def finish():
        if factor != 1.0:
            for out in outputs:
                out.copy_(_scaled(out, factor))
        return outputs
    return finish


# ---- Allreduce ----

def _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, process_set, now=False):
    """Starts an allreduce of tensor into output and returns its handle; with
    now, runs it (a small one on this thread) and returns output."""
    ps = _check_process_set(process_set)
    _check_adasum(op, process_set)
    if _scales_here([tensor], prescale_factor, postscale_factor):
        src = _scaled(tensor, prescale_factor) if prescale_factor != 1.0 else tensor
        op, post = _scale_plan(op, prescale_factor, postscale_factor, process_set)
        result = _allreduce_async(src, output, name, op, 1.0, 1.0, process_set, now)
        finish = _finish_scaled([output], post)
        if now:
            return finish()[0]
        _outputs[result] = lambda: finish()[0]
        return result
    src, n, dt = _check_tensor(tensor, "allreduce")
    dst = src if output is tensor else _check_tensor(output, "allreduce")[0]
    args = (src, dst, n, dt, op, float(prescale_factor), float(postscale_factor), (tensor, output), ps,
            _shape(tensor), name, _memory("allreduce", tensor, output))
    if now:
        _core.allreduce(*args)
        return output
    return _handle(_core.allreduce_async(*args), output)


def _shape(tensor):
    """The shape every rank compares before an allreduce of tensor, as
    Horovod refuses tensors of other shapes: None for one dimension (what
    the library assumes without one, and the faster call)."""
    return None if tensor.dim() == 1 else tuple(tensor.shape)


@_named
def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set):
    """Starts reducing tensor across the workers into a new tensor; returns a
    handle for poll() and synchronize()."""
    op = _op(op, average)
    return _allreduce_async(tensor, torch.empty_like(tensor), name, op, prescale_factor, postscale_factor, process_set)


@_named
def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set):
    """Starts reducing tensor across the workers in place."""
    op = _op(op, average)
    return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor, process_set)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set):
    """Reduces tensor across the workers in place and returns it."""
    return _allreduce_async(tensor, tensor, name, _op(op, average), prescale_factor, postscale_factor, process_set,
                            now=True)


class HorovodAllreduce(torch.autograd.Function):
    """Allreduce as an autograd function: the gradient is allreduced too."""

    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor, postscale_factor, process_set):
        ctx.average, ctx.op = average, op
        ctx.prescale_factor, ctx.postscale_factor, ctx.process_set = prescale_factor, postscale_factor, process_set
        return _allreduce_async(tensor, torch.empty_like(tensor), name, _op(op, average), prescale_factor,
                                postscale_factor, process_set, now=True)

    @staticmethod
    def backward(ctx, grad_output):
        return (allreduce(grad_output.contiguous(), average=ctx.average, op=ctx.op,
                          prescale_factor=ctx.prescale_factor, postscale_factor=ctx.postscale_factor,
                          process_set=ctx.process_set), None, None, None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set):
    """Returns tensor reduced across the workers (Average by default); the
    input is not modified. Differentiable."""
    compressed, ctx = compression.compress(tensor)
    reduced = HorovodAllreduce.apply(compressed, average, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(reduced, ctx)


def _grouped_allreduce_async(tensors, outputs, op, prescale_factor, postscale_factor, process_set, now=False,
                             name=None):
    """Starts a grouped allreduce and returns its handle; with now, runs it
    (a small one on this thread) and returns the outputs."""
    ps = _check_process_set(process_set)
    _check_adasum(op, process_set)
    if not tensors:
        raise ValueError("grouped allreduce of no tensors")
    if _scales_here(tensors, prescale_factor, postscale_factor):
        if prescale_factor != 1.0:
            tensors = [_scaled(t, prescale_factor) for t in tensors]
        op, post = _scale_plan(op, prescale_factor, postscale_factor, process_set)
        result = _grouped_allreduce_async(tensors, outputs, op, 1.0, 1.0, process_set, now, name)
        finish = _finish_scaled(list(outputs), post)
        if now:
            return finish()
        _outputs[result] = finish
        return result
    recv, counts, dtypes = [], [], []
    for t in outputs:
        p, n, dt = _check_tensor(t, "grouped allreduce")
        recv.append(p)
        counts.append(n)
        dtypes.append(dt)
    send = None
    if outputs is not tensors:
        send = [_check_tensor(t, "grouped allreduce")[0] for t in tensors]
    # Each tensor's shape, or None when every tensor has one dimension.
    shapes = None
    if any(t.dim() != 1 for t in tensors):
        shapes = [tuple(t.shape) for t in tensors]
    memory = _memory("grouped allreduce", *tensors) if send is None else _memory("grouped allreduce", *tensors,
                                                                                  *outputs)
    args = (send, recv, counts, dtypes, op, float(prescale_factor), float(postscale_factor),
            (list(tensors), list(outputs)), ps, shapes, name, memory)
    if now:
        _core.grouped_allreduce(*args)
        return list(outputs)
    return _handle(_core.grouped_allreduce_async(*args), list(outputs))


@_named
def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                            process_set=global_process_set):
    """Starts reducing a list of tensors (any mix of dtypes) in one call,
    fused into few collectives; synchronize returns new tensors."""
    op = _op(op, average)
    return _grouped_allreduce_async(list(tensors), [torch.empty_like(t) for t in tensors], op, prescale_factor,
                                    postscale_factor, process_set, name=name)


@_named
def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                             process_set=global_process_set):
    op = _op(op, average)
    tensors = list(tensors)
    return _grouped_allreduce_async(tensors, tensors, op, prescale_factor, postscale_factor, process_set, name=name)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set):
    tensors = list(tensors)
    return _grouped_allreduce_async(tensors, tensors, _op(op, average), prescale_factor, postscale_factor, process_set,
                                    now=True, name=name)


class HorovodGroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, average, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.average, ctx.op = average, op
        ctx.prescale_factor, ctx.postscale_factor, ctx.process_set = prescale_factor, postscale_factor, process_set
        return tuple(_grouped_allreduce_async(list(tensors), [torch.empty_like(t) for t in tensors], _op(op, average),
                                              prescale_factor, postscale_factor, process_set, now=True, name=name))

    @staticmethod
    def backward(ctx, *grad_output):
        grads = grouped_allreduce([g.contiguous() for g in grad_output], average=ctx.average, op=ctx.op,
                                  prescale_factor=ctx.prescale_factor, postscale_factor=ctx.postscale_factor,
                                  process_set=ctx.process_set)
        return (None, None, None, None, None, None) + tuple(grads)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set):
    """Returns each tensor of the list reduced across the workers."""
    pairs = [compression.compress(t) for t in tensors]
    reduced = HorovodGroupedAllreduce.apply(average, name, op, prescale_factor, postscale_factor, process_set,
                                            *[c for c, _ in pairs])
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, pairs)]


# ---- Broadcast ----

def _broadcast_async(tensor, root_rank, process_set, now=False, name=None):
    """Starts copying root_rank's tensor into every other worker's and
    returns the library's handle; with now, runs it (a small one on this
    thread) and returns tensor."""
    ps = _check_process_set(process_set)
    p, n, dt = _check_tensor(tensor, "broadcast", reducing=False)
    device = _memory("broadcast", tensor)
    if now:
        _core.broadcast([p], [n], [dt], int(root_rank), tensor, ps, name, device)
        return tensor
    return _core.broadcast_async([p], [n], [dt], int(root_rank), tensor, ps, name, device)


@_named
def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts copying root_rank's tensor into every other worker's, in place."""
    return _handle(_broadcast_async(tensor, root_rank, process_set, name=name), tensor)


@_named
def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts a broadcast into a new tensor (the input is not modified)."""
    output = tensor.clone()
    return _handle(_broadcast_async(output, root_rank, process_set, name=name), output)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    return _broadcast_async(tensor, root_rank, process_set, now=True, name=name)


class HorovodBroadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return _broadcast_async(tensor.clone(), root_rank, process_set, now=True, name=name)

    @staticmethod
    def backward(ctx, grad_output):
        reduced = allreduce(grad_output.contiguous(), op=Average, process_set=ctx.process_set)
        if rank() != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns root_rank's tensor on every worker (the input is not
    modified). Differentiable."""
    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


def grouped_broadcast_(tensors, root_rank):
    """Copies root_rank's tensors into every other worker's, in place, in one
    call (what broadcast_parameters uses)."""
    tensors = list(tensors)
    if not tensors:
        return tensors
    # One call per kind of device (CPU, CUDA), in the order of each kind's
    # first tensor: every rank makes the same calls as long as the ranks
    # hold their tensors on the same kinds of device, as a model's copies do.
    kinds = {}
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            _check_tensor(t, "broadcast", reducing=False)  # raises
        kinds.setdefault(t.device.type, []).append(t)
    for group in kinds.values():
        ptrs, counts, dtypes = [], [], []
        for t in group:
            p, n, dt = _check_tensor(t, "broadcast", reducing=False)
            ptrs.append(p)
            counts.append(n)
            dtypes.append(dt)
        _core.broadcast(ptrs, counts, dtypes, int(root_rank), group, 0, None, _memory("broadcast", *group))
    return tensors


# ---- Shapes, exchanged before the collectives whose outputs depend on them ----

def _shapes(tensor, what, process_set=None):
    """Every rank's (first dimension, the rest of the shape) of tensor, in
    the process set's rank order; the ranks' dtypes and trailing shapes must
    agree."""
    h, finish = _shapes_async(tensor, what, process_set)
    _core.wait(h)
    return finish()


def _after_shapes(tensor, what, process_set, name, then):
    """What then(firsts, rest) returns (the handle of the data's call) once
    every rank's shape of tensor is known (_shapes): at once for an unnamed
    call; for a named one, a _ChainHandle, after an exchange named after the
    call."""
    if name is None:
        return then(*_shapes(tensor, what, process_set))
    h, finish = _shapes_async(tensor, what, process_set, "%s.shape" % (name,))
    return _ChainHandle(h, lambda: then(*finish()))


def _shapes_async(tensor, what, process_set=None, name=None):
    """Starts _shapes: its handle, and what returns its result once the
    handle has completed."""
    shape = tuple(tensor.shape) if tensor.dim() > 0 else (1,)
    rest = shape[1:]
    key = zlib.crc32(repr((rest, str(tensor.dtype))).encode())  # the same in every process
    mine = torch.tensor([shape[0], len(rest), key], dtype=torch.int64)
    ps, _, n = _set_place(process_set)
    every = torch.empty(3 * n, dtype=torch.int64)
    h = _core.allgather_async(mine.data_ptr(), 3, every.data_ptr(), None, _core.INT64, (mine, every), ps, name)
    return h, lambda: _shapes_of(every, n, rest, key, shape, tensor, what)


def _shapes_of(every, n, rest, key, shape, tensor, what):
    """_shapes' result from every rank's (first dimension, number of other
    dimensions, key of the rest and the dtype)."""
    every = every.view(n, 3)
    for r in range(n):
        if int(every[r, 1]) != len(rest) or int(every[r, 2]) != key:
            # Every rank sees the same table, so every rank raises: nothing
            # else was sent, and the next collective runs.
            raise MismatchError("gorovod %s: rank %d's tensor differs from this rank's (shape %s, dtype %s) in dtype "
                                "or in a dimension other than the first" % (what, r, list(shape), tensor.dtype))
    return [int(d) for d in every[:, 0]], rest


def _numel(rest):
    n = 1
    for d in rest:
        n *= d
    return n


# ---- Allgather ----

@_named
def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts concatenating every worker's tensor along the first dimension
    (which may differ between workers). The ranks' first dimensions are
    exchanged at once; the data travels asynchronously."""
    ps, me, _ = _set_place(process_set)
    p, _, dt = _check_tensor(tensor, "allgather", reducing=False)

    def gather(firsts, rest):
        per = _numel(rest) * (1 if tensor.dtype in _DTYPES else tensor.element_size())
        output = tensor.new_empty((sum(firsts),) + tuple(rest))
        counts = [f * per for f in firsts]
        h = _core.allgather_async(p, counts[me], output.data_ptr(), counts, dt, (tensor, output), ps, name,
                                  _memory("allgather", tensor, output))
        return _handle(h, output)
    return _after_shapes(tensor, "allgather", process_set, name, _on_callers_stream(tensor, gather))


class HorovodAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.dim, ctx.process_set = (tensor.shape[0] if tensor.dim() > 0 else 1), process_set
        return synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        reduced = allreduce(grad_output.contiguous(), op=Average, process_set=ctx.process_set)
        dims = allgather(torch.tensor([ctx.dim], dtype=torch.int64), process_set=ctx.process_set)
        offset = int(dims[:_set_place(ctx.process_set)[1]].sum())
        return reduced.narrow(0, offset, ctx.dim), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Returns every worker's tensor concatenated along the first dimension.
    Differentiable."""
    return HorovodAllgather.apply(tensor, name, process_set)


@_named
def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Starts an allgather of each tensor of the list (one library call each,
    in order); synchronize returns the list of their results."""
    return _GroupHandle([allgather_async(t, None, process_set) for t in tensors])


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Returns each tensor of the list gathered from every worker, as
    allgather does. Differentiable."""
    return [allgather(t, None, process_set) for t in tensors]


# ---- Sparse allreduce ----

def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Starts reducing a sparse COO tensor as Horovod does: every worker's
    indices and values are allgathered (so the result holds each worker's
    entries, uncoalesced; Average divides the values by the number of
    workers). Returns a function that waits and returns the sparse
    result."""
    if not tensor.is_sparse:
        raise ValueError("gorovod sparse_allreduce_async: the tensor is not sparse (use allreduce_async)")
    op = _op(op)
    if op not in (_core.AVERAGE, _core.SUM):
        raise ValueError("gorovod sparse_allreduce_async: only Average and Sum reduce sparse tensors")
    # Allgather concatenates along the first dimension: the indices travel
    # transposed, one row per entry.
    indices = allgather_async(tensor._indices().transpose(0, 1).contiguous(),
                              name=None if name is None else "%s.indices" % name, process_set=process_set)
    values = allgather_async(tensor._values().contiguous(), name=None if name is None else "%s.values" % name,
                             process_set=process_set)

    def result():
        i, v = synchronize(indices), synchronize(values)
        if op == _core.AVERAGE:
            v = v / _set_place(process_set)[2]
        return torch.sparse_coo_tensor(i.transpose(0, 1), v, tensor.size())
    return result


# ---- Alltoall ----

@_named
def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts sending splits[r] slices (first dimension) of tensor to each
    worker r and gathering what each sends here; synchronize returns the
    output and the received splits."""
    ps, _, n = _set_place(process_set)
    p, _, dt = _check_tensor(tensor, "alltoall", reducing=False)
    first = tensor.shape[0] if tensor.dim() > 0 else 1
    if splits is None:
        if first % n:
            raise ValueError("gorovod alltoall: the first dimension (%d) does not split evenly among %d workers: give "
                             "splits" % (first, n))
        sends = [first // n] * n
    else:
        sends = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
        if len(sends) != n or any(s < 0 for s in sends) or sum(sends) != first:
            raise ValueError("gorovod alltoall: splits %s must be %d non-negative counts adding up to the first "
                             "dimension %d" % (sends, n, first))
    def exchange(firsts, rest):
        send_splits = torch.tensor(sends, dtype=torch.int64)
        recv_splits = torch.empty(n, dtype=torch.int64)
        ones = [1] * n
        _core.wait(_core.alltoall_async(send_splits.data_ptr(), ones, recv_splits.data_ptr(), ones, _core.INT64,
                                        (send_splits, recv_splits), ps, None if name is None else "%s.splits" % (name,)))
        per = _numel(rest) * (1 if tensor.dtype in _DTYPES else tensor.element_size())
        received = [int(x) for x in recv_splits]
        output = tensor.new_empty((sum(received),) + tuple(rest))
        h = _core.alltoall_async(p, [s * per for s in sends], output.data_ptr(), [s * per for s in received], dt,
                                 (tensor, output), ps, name, _memory("alltoall", tensor, output))
        return _handle(h, (output, recv_splits.to(torch.int32)))
    return _after_shapes(tensor, "alltoall", process_set, name, _on_callers_stream(tensor, exchange))


class HorovodAlltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.process_set, ctx.received = process_set, received
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, *dead):
        grad, _ = alltoall(grad_output.contiguous(), splits=ctx.received, process_set=ctx.process_set)
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Returns the slices every worker sent here, concatenated in rank order,
    and, when splits was given, how many came from each worker.
    Differentiable."""
    output, received = HorovodAlltoall.apply(tensor, splits, name, process_set)
    if splits is None:
        return output
    return output, received


# ---- Reducescatter ----

@_named
def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0):
    """Starts reducing tensor across the workers and scattering the result:
    worker r gets its share of the first dimension (first // size, the
    first first % size workers one more)."""
    _set_place(process_set)
    op = _op(op)
    if op == _core.ADASUM:
        raise NotImplementedError("gorovod reducescatter: Adasum combines whole tensors (allreduce only)")
    _check_tensor(tensor, "reducescatter")
    if tensor.dim() == 0:
        raise ValueError("gorovod reducescatter: a scalar (0-dimensional) tensor cannot be scattered: give it a first "
                         "dimension")
    if _scales_here([tensor], prescale_factor, postscale_factor):
        src = _scaled(tensor, prescale_factor) if prescale_factor != 1.0 else tensor
        lib_op, post = _scale_plan(op, prescale_factor, postscale_factor, process_set)
        return _reducescatter_async(src, lib_op, 1.0, 1.0, process_set, name, post)
    return _reducescatter_async(tensor, op, prescale_factor, postscale_factor, process_set, name)


def _reducescatter_async(tensor, op, prescale_factor, postscale_factor, process_set=None, name=None, post=None):
    """reducescatter_async with the library's op code and factors; post: a
    postscale factor the binding applies to the result itself (None:
    none)."""
    p, _, dt = _check_tensor(tensor, "reducescatter")
    ps, me, n = _set_place(process_set)

    def scatter(firsts, rest):
        first = firsts[me]
        if any(f != first for f in firsts):
            raise MismatchError("gorovod reducescatter: the workers' tensors have first dimensions %s: they must be "
                                "equal" % firsts)
        share = [first // n + (1 if r < first % n else 0) for r in range(n)]
        per = _numel(rest)
        output = tensor.new_empty((share[me],) + tuple(rest))
        h = _core.reducescatter_async(p, tensor.numel(), output.data_ptr(), [s * per for s in share], dt, op,
                                      float(prescale_factor), float(postscale_factor), (tensor, output), ps, name,
                                      _memory("reducescatter", tensor, output))
        if post is None:
            return _handle(h, output)
        return _handle(h, lambda: _finish_scaled([output], post)()[0])
    return _after_shapes(tensor, "reducescatter", process_set, name, _on_callers_stream(tensor, scatter))


class HorovodReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op, ctx.process_set = op, process_set
        ctx.scale = prescale_factor * postscale_factor
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor, postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        g = grad_output.contiguous()
        if ctx.op == Sum:
            g = g * _set_place(ctx.process_set)[2]
        if ctx.scale != 1.0:
            g = g * ctx.scale
        return allgather(g, process_set=ctx.process_set), None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Returns this worker's share of tensor reduced across the workers.
    Differentiable."""
    compressed, ctx = compression.compress(tensor)
    reduced = HorovodReducescatter.apply(compressed, name, op, process_set, prescale_factor, postscale_factor)
    return compression.decompress(reduced, ctx)


@_named
def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                                postscale_factor=1.0):
    """Starts a reducescatter of each tensor of the list (one library call
    each, in order); synchronize returns the list of this worker's shares."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("grouped reducescatter of no tensors")
    for t in tensors:
        _check_tensor(t, "grouped reducescatter")
        if t.dim() == 0:
            raise ValueError("gorovod grouped reducescatter: a scalar (0-dimensional) tensor cannot be scattered: "
                             "give it a first dimension")
    return _GroupHandle([reducescatter_async(t, None, op, process_set, prescale_factor, postscale_factor)
                         for t in tensors])


class HorovodGroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.op, ctx.process_set = op, process_set
        ctx.scale = prescale_factor * postscale_factor
        return tuple(synchronize(grouped_reducescatter_async(list(tensors), name, op, process_set, prescale_factor,
                                                             postscale_factor)))

    @staticmethod
    def backward(ctx, *grad_output):
        grads = [g.contiguous() for g in grad_output]
        if ctx.op == Sum:
            grads = [g * _set_place(ctx.process_set)[2] for g in grads]
        if ctx.scale != 1.0:
            grads = [g * ctx.scale for g in grads]
        return (None, None, None, None, None) + tuple(grouped_allgather(grads, process_set=ctx.process_set))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Returns this worker's share of each tensor of the list reduced across
    the workers. Differentiable."""
    pairs = [compression.compress(t) for t in tensors]
    reduced = HorovodGroupedReducescatter.apply(name, op, process_set, prescale_factor, postscale_factor,
                                                *[c for c, _ in pairs])
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, pairs)]


# ---- Barrier and join ----

def barrier(process_set=global_process_set):
    """Returns once every worker has called it."""
    _core.barrier(_check_process_set(process_set))


def _barrier_async(process_set=global_process_set):
    """Starts a barrier; synchronize(handle) waits for it (the
    torch.distributed backend's barrier, whose wait has a timeout)."""
    return _handle(_core.barrier_async(_check_process_set(process_set)), None)


def join(device=-1):
    """Waits for every worker to join and returns the rank that joined last
    (the same on every worker). Until then, as in Horovod, a worker that
    joined takes part in the others' allreduces with zeros (an Average
    still divides by every worker), and their other collectives raise
    MismatchError: a worker that ran out of data can join while the others
    finish their steps."""
    return _core.join()

