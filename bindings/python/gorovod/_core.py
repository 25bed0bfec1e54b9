"""libgorovod through ctypes: loading the library, the calls on raw memory,
handles, errors. Framework-independent; gorovod.torch builds on it.

What this module guards against (the known pitfalls of a Go library inside
Python):

- fork: a child made by fork() (a DataLoader worker) has the Go runtime's
  memory but none of its threads, so a call into Go could deadlock there.
  Every call checks the process id first and raises ForkedProcessError (the
  C library checks again before it enters Go).
- one Go runtime per process: loading a second copy of libgorovod (another
  path) would start a second Go runtime; it is refused.
- GOMAXPROCS: the Go runtime reads it once, when the library loads. If the
  environment does not set it (``gorovod run`` does: the host's CPUs divided
  among its workers), the library is loaded with GOMAXPROCS=2, so that Go's
  threads do not compete with the framework's intra-op threads; the
  process's environment is left as it was.
- signals: the library installs no handler for SIGINT or SIGTERM (Go does
  not in a shared library unless asked), so Ctrl-C stays Python's. Waits are
  done in slices of 100 ms, so a KeyboardInterrupt is raised promptly even
  while a collective is blocked; the memory of an interrupted call stays
  referenced until the library has let go of it. A small synchronous call
  may instead run on Python's own thread inside the library (the _start
  calls: no hand-over to the library's thread and back, which costs tens of
  microseconds); from the main thread, while SIGINT raises
  KeyboardInterrupt, it is made interruptible: the library then notes SIGINT
  before Python's handler does and aborts the call. Under a SIGINT handler of
  the script's own, calls wait in slices as before, so that the handler runs
  while they wait.
"""

import atexit
import ctypes
import os
import signal
import sys
import threading
import time

from gorovod.exceptions import (ForkedProcessError, GorovodError, HorovodInternalError, HostsUpdatedInterrupt,
                                MismatchError, NotInitializedError, WorkerExcluded)

# gorovod_status codes (gorovod.h).
OK = 0
ERR_INVALID_ARGUMENT = 1
ERR_NOT_INITIALIZED = 2
ERR_MISMATCH = 3
ERR_WORLD_CHANGED = 4
ERR_HOSTS_UPDATED = 5
ERR_EXCLUDED = 6
ERR_TIMEOUT = 7
ERR_FORKED = 8
ERR_SHUT_DOWN = 9
ERR_UNKNOWN_HANDLE = 10

# gorovod_*_start flags.
START_INTERRUPTIBLE = 1

# gorovod_dtype codes.
FLOAT32, FLOAT64, FLOAT16, BFLOAT16, INT32, INT64, UINT8 = 1, 2, 3, 4, 5, 6, 7
# gorovod_op codes.
SUM, AVERAGE, MIN, MAX, PRODUCT, ADASUM = 1, 2, 3, 4, 5, 6

ABI_VERSION = 12
_WAIT_SLICE_US = 100_000
_DEFAULT_GOMAXPROCS = 2

_lock = threading.Lock()
_lib = None
_lib_path = None
_owner_pid = None
# Handles still running (or not yet collected) -> what must stay alive until
# the library has let go of their memory.
_inflight = {}
_failed = False  # an uncaught exception is on its way: shutdown as not finished
_interrupted = False  # a wait was interrupted (Ctrl-C): its call may never complete
_cuda = None  # whether the loaded library supports CUDA, once asked


class _Config(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("job_id", ctypes.c_char_p),
        ("secret_hex", ctypes.c_char_p),
        ("seeds", ctypes.c_char_p),
        ("listen_addr", ctypes.c_char_p),
        ("gossip_addr", ctypes.c_char_p),
        ("io_timeout_ms", ctypes.c_int64),
        ("fusion_bytes", ctypes.c_int64),
        ("log_level", ctypes.c_int32),
    ]


class Topology(ctypes.Structure):
    _fields_ = [
        ("rank", ctypes.c_int32),
        ("size", ctypes.c_int32),
        ("local_rank", ctypes.c_int32),
        ("local_size", ctypes.c_int32),
        ("cross_rank", ctypes.c_int32),
        ("cross_size", ctypes.c_int32),
        ("world", ctypes.c_uint64),
    ]


# ---- Finding and loading the library ----

def _package_dir():
    return os.path.dirname(os.path.abspath(__file__))


LIBRARY_NAME = "libgorovod.so"
# The one place the package reads GOROVOD_LIBRARY.
LIBRARY_ENV = "GOROVOD_LIBRARY"
BUILD_HINT = ("install the package from a gorovod checkout with `pip install ./bindings/python` (Go on the PATH), "
              "or build the library with `go build -buildmode=c-shared -o /some/dir/libgorovod.so ./bindings/c` "
              "and set GOROVOD_LIBRARY=/some/dir/libgorovod.so")


def library_path():
    """Where libgorovod.so is: $GOROVOD_LIBRARY when set, else the copy
    installed with this package. Nothing is built here: every worker of a
    job imports this module, and building is done once, by the install."""
    named = os.environ.get(LIBRARY_ENV)
    if named:
        if not os.path.isfile(named):
            raise ImportError("gorovod: %s=%s is not a file; %s" % (LIBRARY_ENV, named, BUILD_HINT))
        return named
    installed = os.path.join(_package_dir(), LIBRARY_NAME)
    if not os.path.isfile(installed):
        raise ImportError("gorovod: this package (%s) has no %s beside it and %s is not set: %s"
                          % (_package_dir(), LIBRARY_NAME, LIBRARY_ENV, BUILD_HINT))
    return installed


def _loaded_copies():
    """The libgorovod files mapped into this process."""
    found = set()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                parts = line.split(None, 5)
                if len(parts) == 6 and os.path.basename(parts[5].strip()).startswith("libgorovod"):
                    found.add(os.path.realpath(parts[5].strip()))
    except OSError:
        pass
    return found


def _load():
    global _lib, _lib_path, _owner_pid
    if _lib is not None:
        return _lib
    path = os.path.realpath(library_path())
    others = _loaded_copies() - {path}
    if others:
        raise ImportError("gorovod: another copy of libgorovod is already loaded in this process (%s): a second "
                          "would be a second Go runtime, which a process cannot hold" % ", ".join(sorted(others)))
    set_procs = "GOMAXPROCS" not in os.environ
    if set_procs:
        os.environ["GOMAXPROCS"] = str(min(_DEFAULT_GOMAXPROCS, os.cpu_count() or 1))
    try:
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            hint = ""
            if "undefined symbol: nvml" in str(e):
                hint = " (a library built before GPU discovery loaded NVML at run time: rebuild it)"
            raise ImportError("gorovod: cannot load %s%s: %s" % (path, hint, e))
        # The version first: an older library lacks functions _prototypes
        # looks up.
        lib.gorovod_abi_version.argtypes, lib.gorovod_abi_version.restype = [], ctypes.c_int
        if lib.gorovod_abi_version() != ABI_VERSION:
            raise ImportError("gorovod: %s has ABI version %d, this package wants %d (rebuild it)" %
                              (path, lib.gorovod_abi_version(), ABI_VERSION))
        _prototypes(lib)
        # The first call into Go waits for the runtime to have started (and
        # read GOMAXPROCS).
        lib.gorovod_is_initialized()
    finally:
        if set_procs:
            del os.environ["GOMAXPROCS"]
    _lib, _lib_path, _owner_pid = lib, path, os.getpid()
    return lib


def _prototypes(lib):
    c_int, c_i32, c_i64, c_u64, c_void_p, c_double = (ctypes.c_int, ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64,
                                                      ctypes.c_void_p, ctypes.c_double)
    p_u64 = ctypes.POINTER(c_u64)
    sigs = {
        "gorovod_abi_version": [],
        "gorovod_init_config": [ctypes.POINTER(_Config)],
        "gorovod_shutdown": [c_int],
        "gorovod_is_initialized": [],
        "gorovod_topology_get": [ctypes.POINTER(Topology)],
        "gorovod_newest_world": [p_u64, ctypes.POINTER(c_int)],  # ABI 10
        "gorovod_left_ranks": [ctypes.POINTER(c_i32), c_i32, ctypes.POINTER(c_i32)],  # ABI 11
        "gorovod_digest": [c_void_p, c_i64, p_u64],  # ABI 12
        "gorovod_allreduce_async": [c_void_p, c_void_p, c_i64, c_int, c_int, c_double, c_double, p_u64],
        "gorovod_grouped_allreduce_async": [c_i32, c_void_p, c_void_p, c_void_p, c_void_p, c_int, c_double, c_double,
                                            p_u64],
        "gorovod_broadcast_async": [c_void_p, c_i64, c_int, c_i32, p_u64],
        "gorovod_grouped_broadcast_async": [c_i32, c_void_p, c_void_p, c_void_p, c_i32, p_u64],
        "gorovod_allgather_async": [c_void_p, c_i64, c_void_p, c_void_p, c_int, p_u64],
        "gorovod_alltoall_async": [c_void_p, c_void_p, c_void_p, c_void_p, c_int, p_u64],
        "gorovod_reducescatter_async": [c_void_p, c_i64, c_void_p, c_void_p, c_int, c_int, c_double, c_double, p_u64],
        "gorovod_barrier_async": [p_u64],
        "gorovod_name_next": [ctypes.c_char_p],  # ABI 5
        "gorovod_cuda_next": [c_i32, c_u64],  # ABI 6
        "gorovod_cuda_supported": [],
        "gorovod_allreduce_start": [c_void_p, c_void_p, c_i64, c_int, c_int, c_double, c_double, c_int, p_u64],
        "gorovod_grouped_allreduce_start": [c_i32, c_void_p, c_void_p, c_void_p, c_void_p, c_int, c_double, c_double,
                                            c_int, p_u64],
        "gorovod_grouped_broadcast_start": [c_i32, c_void_p, c_void_p, c_void_p, c_i32, c_int, p_u64],
        "gorovod_barrier_start": [c_int, p_u64],
        "gorovod_join_async": [ctypes.POINTER(c_i32), p_u64],
        "gorovod_poll": [c_u64, ctypes.POINTER(c_int)],
        "gorovod_wait": [c_u64, c_i64],
        "gorovod_commit": [],
        "gorovod_reset": [],
        "gorovod_request_leave": [],
        "gorovod_record_samples": [c_i64],
        "gorovod_set_total_steps": [c_i64],
        # Process sets (ABI 3).
        "gorovod_add_process_set": [c_void_p, c_i32, ctypes.POINTER(c_i32)],
        "gorovod_add_process_set_async": [c_void_p, c_i32, ctypes.POINTER(c_i32), p_u64],  # ABI 9
        "gorovod_remove_process_set": [c_i32],
        "gorovod_process_set_get": [c_i32, ctypes.POINTER(c_i32), ctypes.POINTER(c_i32), c_void_p, c_i32],
        "gorovod_process_set_ids": [c_void_p, c_i32, ctypes.POINTER(c_i32)],
        "gorovod_grouped_allreduce_ps_async": [c_i32, c_i32, c_void_p, c_void_p, c_void_p, c_void_p, c_int, c_double,
                                               c_double, p_u64],
        "gorovod_grouped_allreduce_ps_start": [c_i32, c_i32, c_void_p, c_void_p, c_void_p, c_void_p, c_int, c_double,
                                               c_double, c_int, p_u64],
        "gorovod_grouped_allreduce_shaped_async": [c_i32, c_i32, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p,
                                                   c_void_p, c_int, c_double, c_double, p_u64],
        "gorovod_grouped_allreduce_shaped_start": [c_i32, c_i32, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p,
                                                   c_void_p, c_int, c_double, c_double, c_int, p_u64],
        "gorovod_grouped_broadcast_ps_async": [c_i32, c_i32, c_void_p, c_void_p, c_void_p, c_i32, p_u64],
        "gorovod_grouped_broadcast_ps_start": [c_i32, c_i32, c_void_p, c_void_p, c_void_p, c_i32, c_int, p_u64],
        "gorovod_allgather_ps_async": [c_i32, c_void_p, c_i64, c_void_p, c_void_p, c_int, p_u64],
        "gorovod_alltoall_ps_async": [c_i32, c_void_p, c_void_p, c_void_p, c_void_p, c_int, p_u64],
        "gorovod_reducescatter_ps_async": [c_i32, c_void_p, c_i64, c_void_p, c_void_p, c_int, c_int, c_double,
                                           c_double, p_u64],
        "gorovod_barrier_ps_async": [c_i32, p_u64],
        "gorovod_barrier_ps_start": [c_i32, c_int, p_u64],
        # Point-to-point messages (ABI 5).
        "gorovod_send_async": [c_void_p, c_i64, c_int, c_i32, c_u64, p_u64],
        "gorovod_recv_async": [c_void_p, c_i64, c_int, c_i32, c_u64, p_u64],
        "gorovod_recv_any_async": [c_void_p, c_i64, c_int, c_u64, ctypes.POINTER(c_i32), p_u64],  # ABI 7
        "gorovod_recv_any_ps_async": [c_i32, c_void_p, c_i64, c_int, c_u64, ctypes.POINTER(c_i32), p_u64],  # ABI 8
    }
    for name, args in sigs.items():
        f = getattr(lib, name)
        f.argtypes = args
        f.restype = c_int
    lib.gorovod_last_error.argtypes = []
    lib.gorovod_last_error.restype = ctypes.c_char_p


# ---- Errors ----

def _raise(rc, lib=None):
    if rc == OK:
        return
    msg = (lib or _lib).gorovod_last_error().decode(errors="replace")
    if rc == ERR_WORLD_CHANGED:
        raise HorovodInternalError(msg, rc)
    if rc == ERR_HOSTS_UPDATED:
        raise HostsUpdatedInterrupt(msg, rc)
    if rc == ERR_EXCLUDED:
        raise WorkerExcluded(msg, rc)
    if rc == ERR_MISMATCH:
        raise MismatchError(msg, rc)
    if rc == ERR_NOT_INITIALIZED:
        raise NotInitializedError("gorovod has not been initialized; use init().", rc)
    if rc == ERR_FORKED:
        raise ForkedProcessError(msg, rc)
    if rc in (ERR_INVALID_ARGUMENT, ERR_UNKNOWN_HANDLE):
        raise ValueError(msg)
    raise GorovodError(msg, rc)


def _check_process():
    if _owner_pid is not None and os.getpid() != _owner_pid:
        raise ForkedProcessError(
            "gorovod: called in a child process made by fork() (a DataLoader worker with num_workers > 0?): "
            "gorovod's runtime lives in the process that initialized it, and a forked child must not call it. "
            "Call gorovod from the main process only (collectives in a Dataset or collate_fn cannot work), or give "
            "the DataLoader multiprocessing_context='spawn' or 'forkserver'.", ERR_FORKED)


def lib():
    """The loaded library, for a process that has initialized gorovod. (A
    loaded library not initialized, or shut down, answers each call with
    ERR_NOT_INITIALIZED, which _raise turns into NotInitializedError: asking
    first would cost a call into the library per collective.)"""
    if _lib is None:
        raise NotInitializedError("gorovod has not been initialized; use init().", ERR_NOT_INITIALIZED)
    _check_process()
    return _lib


# ---- Life cycle ----

def init(job_id=None, secret_hex=None, seeds=None, listen_addr=None, gossip_addr=None, io_timeout=None,
         fusion_bytes=None, log_level=None):
    """Joins the job (see gorovod_init_config): the launcher's when job_id is
    None, else the one named. io_timeout is in seconds; the environment's
    GOROVOD_IO_TIMEOUT (seconds) and GOROVOD_LOG_LEVEL (debug, info, warn,
    error, none, or -1 to 2) apply when the arguments are None."""
    _check_process()
    with _lock:
        lib = _load()
        if lib.gorovod_is_initialized():
            return
        cfg = _Config()
        cfg.struct_size = ctypes.sizeof(_Config)
        enc = lambda s: s.encode() if s else None
        cfg.job_id, cfg.secret_hex, cfg.seeds = enc(job_id), enc(secret_hex), enc(seeds)
        cfg.listen_addr, cfg.gossip_addr = enc(listen_addr), enc(gossip_addr)
        if io_timeout is None and os.environ.get("GOROVOD_IO_TIMEOUT"):
            io_timeout = float(os.environ["GOROVOD_IO_TIMEOUT"])
        if io_timeout is not None:
            if io_timeout <= 0:
                raise ValueError("io_timeout must be positive seconds, not %r" % io_timeout)
            cfg.io_timeout_ms = max(1, int(io_timeout * 1000))
        cfg.fusion_bytes = int(fusion_bytes or 0)
        if log_level is None:
            log_level = os.environ.get("GOROVOD_LOG_LEVEL", "")
        cfg.log_level = _log_level(log_level)
        _raise(lib.gorovod_init_config(ctypes.byref(cfg)), lib)
        _install_exit_hooks()


# GOROVOD_LOG_LEVEL as `gorovod run --log-level` sets it (a name), or the
# gorovod_config number; the C ABI has no errors-only level.
_LOG_LEVELS = {"": 0, "error": 0, "warn": 0, "warning": 0, "info": 1, "debug": 2, "none": -1, "off": -1}


def _log_level(level):
    if isinstance(level, int):
        return level
    name = str(level).strip().lower()
    if name in _LOG_LEVELS:
        return _LOG_LEVELS[name]
    try:
        return int(name)
    except ValueError:
        raise ValueError("GOROVOD_LOG_LEVEL %r: want debug, info, warn, error or none (or -1 to 2)" % level)


def shutdown(finished=True):
    """Leaves the job; finished=False after an error or interruption (the job
    is then not told that training is over)."""
    global _interrupted
    if _lib is None or (_owner_pid is not None and os.getpid() != _owner_pid):
        return
    with _lock:
        if not _lib.gorovod_is_initialized():
            return
        if _interrupted:
            # A collective was interrupted: finishing would wait for it (and
            # for ranks that may never call it); abort it instead.
            finished = False
        rc = _lib.gorovod_shutdown(1 if finished else 0)
        _interrupted = False
        _inflight.clear()  # the library has let go of every buffer
        _raise(rc)


def is_initialized():
    if _lib is None or (_owner_pid is not None and os.getpid() != _owner_pid):
        return False
    return bool(_lib.gorovod_is_initialized())


_hooks_installed = False


def _install_exit_hooks():
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    previous = sys.excepthook

    def excepthook(*args):
        global _failed
        _failed = True
        previous(*args)

    sys.excepthook = excepthook
    atexit.register(_at_exit)


def _at_exit():
    try:
        shutdown(finished=not _failed)
    except GorovodError:
        pass


def topology():
    t = Topology()
    _raise(lib().gorovod_topology_get(ctypes.byref(t)))
    return t


def newest_world():
    """The newest world this process has been told of, as (number,
    breaking): number is topology().world, or above it while a world change
    is under way (the library moves at its next call, or at the commit where
    every member does); breaking, that the new world goes on without a
    member of the current one that gossip declared dead (the next call on
    the current world fails with HorovodInternalError). Does not block: for
    a wait outside the library (on a store) that must stop when a rank it
    waits for will not come."""
    number, breaking = ctypes.c_uint64(), ctypes.c_int()
    _raise(lib().gorovod_newest_world(ctypes.byref(number), ctypes.byref(breaking)))
    return number.value, bool(breaking.value)


def left_ranks():
    """The ranks, in the current world, of the members that left the job
    gracefully (their processes shut gorovod down), ascending: they will
    call nothing more in this world, whether or not the job forms one
    without them. Does not block: for a wait outside the library, as
    newest_world."""
    capacity = 0
    while True:
        ranks, count = (ctypes.c_int32 * max(capacity, 1))(), ctypes.c_int32()
        _raise(lib().gorovod_left_ranks(ranks, capacity, ctypes.byref(count)))
        if count.value <= capacity:
            return [ranks[i] for i in range(count.value)]
        capacity = count.value


def digest(ptr, nbytes):
    """The 64-bit digest (xxHash64) of nbytes bytes of host memory at ptr:
    the same bytes give the same digest in every worker. Needs no init (the
    library is loaded if it is not yet)."""
    l = _load()
    _check_process()
    out = ctypes.c_uint64()
    _raise(l.gorovod_digest(ptr, int(nbytes), ctypes.byref(out)), l)
    return out.value


# ---- Handles ----

def _issue(rc, handle, keep):
    _raise(rc)
    _inflight[handle.value] = keep
    return handle.value


def poll(handle):
    """True once the call has completed (wait then returns at once)."""
    done = ctypes.c_int()
    _raise(lib().gorovod_poll(handle, ctypes.byref(done)))
    return bool(done.value)


def wait(handle, timeout=None):
    """Waits for the call and raises its error; its memory is released from
    the in-flight registry once the library has let go of it. timeout:
    seconds (None: no limit); past it, TimeoutError, and the call stays in
    flight, its handle and memory kept (wait again, or let shutdown take
    it)."""
    global _interrupted
    l = lib()
    deadline = None if timeout is None else time.monotonic() + max(0.0, float(timeout))
    looked = False  # a call done already is collected, whatever the timeout
    while True:
        slice_us = _WAIT_SLICE_US
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 and looked:
                raise TimeoutError("gorovod: call %d not done within %gs" % (handle, timeout))
            slice_us = max(1, min(_WAIT_SLICE_US, int(left * 1e6)))
        looked = True
        try:
            rc = l.gorovod_wait(handle, slice_us)
        except BaseException:
            # Ctrl-C (KeyboardInterrupt) between two slices: the call stays
            # queued, so shutdown must abort rather than wait for it.
            _interrupted = True
            raise
        if rc != ERR_TIMEOUT:
            break
    _inflight.pop(handle, None)
    _raise(rc)


def drain():
    """Waits for every call still in flight, ignoring their errors (after a
    world change, before the state is re-synchronized)."""
    for h in list(_inflight):
        try:
            wait(h)
        except GorovodError:
            pass
        except ValueError:  # already collected
            _inflight.pop(h, None)


# ---- Collectives on raw memory (addresses as ints) ----

class CudaMemory(object):
    """Says that a call's addresses are CUDA device memory of device ordinal
    (gorovod_cuda_next), ready once the GPU has passed event, a raw CUDA
    event handle (an int; 0: ready now) recorded on the stream that
    produces them; owner (the framework's event object) is kept alive until
    the call completes, with the call's other memory."""

    __slots__ = ("ordinal", "event", "owner")

    def __init__(self, ordinal, event, owner=None):
        self.ordinal, self.event, self.owner = int(ordinal), int(event or 0), owner


def cuda_supported():
    """Whether the library takes CUDA device memory (every build does,
    loading the NVIDIA driver when a call first names a device; a host
    without one makes such a call raise ValueError). Needs no init, loads no
    driver. (Asked of the library once.)"""
    global _cuda
    if _cuda is None:
        l = _load()
        _check_process()
        _cuda = bool(l.gorovod_cuda_supported())
    return _cuda


def _u64():
    return ctypes.c_uint64()


def _lib_named(name, device=None):
    """The library, with name given to the calling thread's next collective
    (gorovod_name_next; None: none): ranks pair calls of one name whatever
    their order, calls without one by their order; and device (a CudaMemory;
    None: host memory) saying where its memory is (gorovod_cuda_next)."""
    l = lib()
    if name is not None:
        _raise(l.gorovod_name_next(str(name).encode()))
    if device is not None:
        _raise(l.gorovod_cuda_next(device.ordinal, device.event))
    return l


def allreduce_async(send, recv, count, dtype, op, prescale, postscale, keep, ps=0, shape=None, name=None,
                    device=None):
    """ps: the process set (0: the world), as for every collective here;
    shape: the tensor's dimensions, which every rank compares (None: one
    dimension of count elements); name: what pairs the call with the other
    ranks' (None: its order among the unnamed calls), as for every
    collective here; device: a CudaMemory when the addresses are CUDA
    device memory (None: host memory), as for every collective here."""
    if ps or shape is not None:
        return grouped_allreduce_async([send], [recv], [count], [dtype], op, prescale, postscale, keep, ps,
                                       None if shape is None else [shape], name, device)
    h = _u64()
    return _issue(_lib_named(name, device).gorovod_allreduce_async(send, recv, count, dtype, op, prescale,
                                                                   postscale, ctypes.byref(h)), h, (keep, device))


def _array(ctype, values):
    return (ctype * len(values))(*values)


def _grouped_arrays(sends, recvs, counts, dtypes):
    """The C arrays of a grouped call: n, sends (None: in place), recvs,
    counts, dtypes."""
    s = _array(ctypes.c_void_p, sends) if sends is not None else None
    return len(recvs), s, _array(ctypes.c_void_p, recvs), _array(ctypes.c_int64, counts), _array(ctypes.c_int32, dtypes)


def _shape_arrays(shapes):
    """The C arrays of the tensors' shapes: each one's number of dimensions,
    and their sizes one after another."""
    return (_array(ctypes.c_int32, [len(sh) for sh in shapes]),
            _array(ctypes.c_int64, [int(d) for sh in shapes for d in sh]))


def grouped_allreduce_async(sends, recvs, counts, dtypes, op, prescale, postscale, keep, ps=0, shapes=None, name=None,
                            device=None):
    """shapes: each tensor's dimensions, which every rank compares (None:
    one dimension of its count each)."""
    n, s, r, c, d = _grouped_arrays(sends, recvs, counts, dtypes)
    h = _u64()
    keep = (keep, device)
    l = _lib_named(name, device)
    if shapes is not None:
        nd, dims = _shape_arrays(shapes)
        rc = l.gorovod_grouped_allreduce_shaped_async(ps, n, s, r, c, d, nd, dims, op, prescale, postscale,
                                                          ctypes.byref(h))
        return _issue(rc, h, (keep, s, r, c, d, nd, dims))
    if ps:
        rc = l.gorovod_grouped_allreduce_ps_async(ps, n, s, r, c, d, op, prescale, postscale, ctypes.byref(h))
    else:
        rc = l.gorovod_grouped_allreduce_async(n, s, r, c, d, op, prescale, postscale, ctypes.byref(h))
    return _issue(rc, h, (keep, s, r, c, d))


def broadcast_async(bufs, counts, dtypes, root, keep, ps=0, name=None, device=None):
    n, _, b, c, d = _grouped_arrays(None, bufs, counts, dtypes)
    h = _u64()
    keep = (keep, device)
    l = _lib_named(name, device)
    if ps:
        rc = l.gorovod_grouped_broadcast_ps_async(ps, n, b, c, d, root, ctypes.byref(h))
    else:
        rc = l.gorovod_grouped_broadcast_async(n, b, c, d, root, ctypes.byref(h))
    return _issue(rc, h, (keep, b, c, d))


def allgather_async(send, count, recv, recv_counts, dtype, keep, ps=0, name=None, device=None):
    rc = _array(ctypes.c_int64, recv_counts) if recv_counts is not None else None
    h = _u64()
    keep = (keep, device)
    l = _lib_named(name, device)
    if ps:
        status = l.gorovod_allgather_ps_async(ps, send, count, recv, rc, dtype, ctypes.byref(h))
    else:
        status = l.gorovod_allgather_async(send, count, recv, rc, dtype, ctypes.byref(h))
    return _issue(status, h, (keep, rc))


def alltoall_async(send, send_counts, recv, recv_counts, dtype, keep, ps=0, name=None, device=None):
    sc, rc = _array(ctypes.c_int64, send_counts), _array(ctypes.c_int64, recv_counts)
    h = _u64()
    keep = (keep, device)
    l = _lib_named(name, device)
    if ps:
        status = l.gorovod_alltoall_ps_async(ps, send, sc, recv, rc, dtype, ctypes.byref(h))
    else:
        status = l.gorovod_alltoall_async(send, sc, recv, rc, dtype, ctypes.byref(h))
    return _issue(status, h, (keep, sc, rc))


def reducescatter_async(send, count, recv, recv_counts, dtype, op, prescale, postscale, keep, ps=0, name=None,
                        device=None):
    rc = _array(ctypes.c_int64, recv_counts)
    h = _u64()
    keep = (keep, device)
    l = _lib_named(name, device)
    if ps:
        status = l.gorovod_reducescatter_ps_async(ps, send, count, recv, rc, dtype, op, prescale, postscale,
                                                  ctypes.byref(h))
    else:
        status = l.gorovod_reducescatter_async(send, count, recv, rc, dtype, op, prescale, postscale,
                                               ctypes.byref(h))
    return _issue(status, h, (keep, rc))


def send_async(buf, count, dtype, peer, tag, keep):
    """A point-to-point message of count elements at buf to world rank
    peer with tag (a non-negative int); its handle is waited as any other."""
    h = _u64()
    return _issue(lib().gorovod_send_async(buf, count, dtype, peer, tag, ctypes.byref(h)), h, keep)


def recv_async(buf, count, dtype, peer, tag, keep):
    """Receives the next message from world rank peer with tag into the
    count elements at buf."""
    h = _u64()
    return _issue(lib().gorovod_recv_async(buf, count, dtype, peer, tag, ctypes.byref(h)), h, keep)


def recv_any_async(buf, count, dtype, tag, keep, ps=0):
    """Receives the next message with tag from any other member of process
    set ps (0: any rank of the world) into the count elements at buf.
    Returns the handle and a ctypes int32 the library sets to the sender's
    world rank before the handle completes."""
    h, source = _u64(), ctypes.c_int32(-1)
    l = lib()
    status = (l.gorovod_recv_any_ps_async(ps, buf, count, dtype, tag, ctypes.byref(source), ctypes.byref(h)) if ps
              else l.gorovod_recv_any_async(buf, count, dtype, tag, ctypes.byref(source), ctypes.byref(h)))
    return _issue(status, h, (keep, source)), source


def barrier_async(ps=0):
    """Starts a barrier of process set ps (0: the world); its handle is
    waited as any other."""
    h = _u64()
    l = lib()
    return _issue(l.gorovod_barrier_ps_async(ps, ctypes.byref(h)) if ps else l.gorovod_barrier_async(ctypes.byref(h)),
                  h, None)


def barrier(ps=0):
    if ps:
        _run(lambda l, flags, h: l.gorovod_barrier_ps_start(ps, flags, h),
             lambda l, h: l.gorovod_barrier_ps_async(ps, h), None)
        return
    _run(lambda l, flags, h: l.gorovod_barrier_start(flags, h), lambda l, h: l.gorovod_barrier_async(h), None)


# ---- Process sets ----

def add_process_set(ranks, timeout=None):
    """Registers the process set of the world's ranks (every rank makes the
    same call) and returns its id; ValueError for a duplicate. timeout:
    seconds (None: no limit) to wait for the other ranks' registration;
    past it, TimeoutError, and the registration stays queued (it pairs with
    the others' when they make it; see wait)."""
    ranks = [int(r) for r in ranks]
    arr = _array(ctypes.c_int32, ranks) if ranks else None
    out = ctypes.c_int32(-1)
    if timeout is None:
        _raise(lib().gorovod_add_process_set(arr, len(ranks), ctypes.byref(out)))
        return out.value
    h = _u64()
    # out is the library's until the handle completes (gorovod.h).
    wait(_issue(lib().gorovod_add_process_set_async(arr, len(ranks), ctypes.byref(out), ctypes.byref(h)), h, out),
         timeout)
    return out.value


def remove_process_set(ps):
    _raise(lib().gorovod_remove_process_set(ps))


def process_set(ps):
    """(this process's rank in set ps or -1, the set's world ranks)."""
    l = lib()
    rank, size = ctypes.c_int32(-1), ctypes.c_int32(0)
    _raise(l.gorovod_process_set_get(ps, ctypes.byref(rank), ctypes.byref(size), None, 0))
    ranks = (ctypes.c_int32 * max(size.value, 1))()
    _raise(l.gorovod_process_set_get(ps, ctypes.byref(rank), ctypes.byref(size), ranks, size.value))
    return rank.value, list(ranks[:size.value])


def process_set_ids():
    l = lib()
    n = ctypes.c_int32(0)
    _raise(l.gorovod_process_set_ids(None, 0, ctypes.byref(n)))
    ids = (ctypes.c_int32 * max(n.value, 1))()
    _raise(l.gorovod_process_set_ids(ids, n.value, ctypes.byref(n)))
    return list(ids[:n.value])


def join():
    last = ctypes.c_int32(-1)
    h = _u64()
    wait(_issue(lib().gorovod_join_async(ctypes.byref(last), ctypes.byref(h)), h, last))
    return last.value


# ---- Synchronous calls (the _start forms) ----

def _start_flags():
    """How a synchronous call may run: None: queued, waited for in slices (a
    SIGINT handler of the script's own runs between them); else the flags of
    a _start call, which may run on this thread."""
    if threading.current_thread() is not threading.main_thread():
        return 0  # Ctrl-C interrupts the main thread, not this one
    handler = signal.getsignal(signal.SIGINT)
    if handler is signal.default_int_handler:
        return START_INTERRUPTIBLE
    if handler in (signal.SIG_IGN, signal.SIG_DFL, None):
        return 0  # nothing to raise: ignored, or the process ends
    return None


def _run(start, queue, keep, name=None, device=None):
    """Runs a synchronous call: start(lib, flags, handle) calls its _start
    function, queue(lib, handle) its _async one (named name, on device's
    memory: see _lib_named). A call that ran on this thread has no handle
    (0) and returned its result; a queued one is waited for."""
    global _interrupted
    flags = _start_flags()
    keep = (keep, device)
    l = _lib_named(name, device)
    h = _u64()
    try:
        rc = queue(l, ctypes.byref(h)) if flags is None else start(l, flags, ctypes.byref(h))
    except BaseException:
        # Ctrl-C as the call returned: it was aborted (the world it ran in is
        # broken), so shutdown must not wait for the job to finish.
        _interrupted = True
        raise
    _raise(rc)
    if h.value != 0:
        _inflight[h.value] = keep
        wait(h.value)


def allreduce(send, recv, count, dtype, op, prescale, postscale, keep, ps=0, shape=None, name=None, device=None):
    """The synchronous allreduce_async."""
    if ps or shape is not None:
        grouped_allreduce([send], [recv], [count], [dtype], op, prescale, postscale, keep, ps,
                          None if shape is None else [shape], name, device)
        return
    _run(lambda l, flags, h: l.gorovod_allreduce_start(send, recv, count, dtype, op, prescale, postscale, flags, h),
         lambda l, h: l.gorovod_allreduce_async(send, recv, count, dtype, op, prescale, postscale, h), keep, name,
         device)


def grouped_allreduce(sends, recvs, counts, dtypes, op, prescale, postscale, keep, ps=0, shapes=None, name=None,
                      device=None):
    """The synchronous grouped_allreduce_async."""
    n, s, r, c, d = _grouped_arrays(sends, recvs, counts, dtypes)
    if shapes is not None:
        nd, dims = _shape_arrays(shapes)
        _run(lambda l, flags, h: l.gorovod_grouped_allreduce_shaped_start(ps, n, s, r, c, d, nd, dims, op, prescale,
                                                                          postscale, flags, h),
             lambda l, h: l.gorovod_grouped_allreduce_shaped_async(ps, n, s, r, c, d, nd, dims, op, prescale,
                                                                   postscale, h),
             (keep, s, r, c, d, nd, dims), name, device)
        return
    if ps:
        _run(lambda l, flags, h: l.gorovod_grouped_allreduce_ps_start(ps, n, s, r, c, d, op, prescale, postscale, flags,
                                                                      h),
             lambda l, h: l.gorovod_grouped_allreduce_ps_async(ps, n, s, r, c, d, op, prescale, postscale, h),
             (keep, s, r, c, d), name, device)
        return
    _run(lambda l, flags, h: l.gorovod_grouped_allreduce_start(n, s, r, c, d, op, prescale, postscale, flags, h),
         lambda l, h: l.gorovod_grouped_allreduce_async(n, s, r, c, d, op, prescale, postscale, h), (keep, s, r, c, d),
         name, device)


def broadcast(bufs, counts, dtypes, root, keep, ps=0, name=None, device=None):
    """The synchronous broadcast_async."""
    n, _, b, c, d = _grouped_arrays(None, bufs, counts, dtypes)
    if ps:
        _run(lambda l, flags, h: l.gorovod_grouped_broadcast_ps_start(ps, n, b, c, d, root, flags, h),
             lambda l, h: l.gorovod_grouped_broadcast_ps_async(ps, n, b, c, d, root, h), (keep, b, c, d), name,
             device)
        return
    _run(lambda l, flags, h: l.gorovod_grouped_broadcast_start(n, b, c, d, root, flags, h),
         lambda l, h: l.gorovod_grouped_broadcast_async(n, b, c, d, root, h), (keep, b, c, d), name, device)


# ---- Elastic ----

def commit():
    _raise(lib().gorovod_commit())


def reset():
    _raise(lib().gorovod_reset())


def request_leave():
    _raise(lib().gorovod_request_leave())


def record_samples(n):
    _raise(lib().gorovod_record_samples(int(n)))


def set_total_steps(n):
    _raise(lib().gorovod_set_total_steps(int(n)))
