"""Elastic training with Horovod's API: ``@hvd.elastic.run``, TorchState,
ElasticSampler.

What ``run`` does, and how it maps onto gorovod (so that a Horovod elastic
script needs no change but its import line):

Horovod's model is commit / restore / sync: the script commits its state
every few batches; when a collective fails (HorovodInternalError) the
wrapper restores the last commit, re-initializes Horovod and syncs the state
from rank 0; when hosts change (HostsUpdatedInterrupt, noticed at a commit)
it re-initializes and syncs.

gorovod repairs the world itself: a collective that fails because a worker
died or froze returns only after the survivors have formed the next world
(no shutdown and init), and workers join or leave at a commit, where every
member moves to the new world at the same step. So here:

- HorovodInternalError is raised by the collective whose world broke; the
  calls the script had already queued for the old world (its other gradient
  allreduces) fail without running, and so does any new one until the
  wrapper has reset. The wrapper then restores the last commit.
- HostsUpdatedInterrupt is raised by ``state.commit()`` when the job moved
  to a new world there.
- Either way the wrapper waits for what is still in flight, tells the
  library the script is about to re-synchronize (gorovod_reset), runs the
  reset callbacks, and calls ``state.sync()`` — on every member and on the
  joiners, whose first sync it is — before calling the function again.
- WorkerExcluded (this worker asked to leave, or was removed) ends the
  process cleanly, with exit status 0.
- Inside ``run``, SIGTERM (what ``gorovod run`` and cluster schedulers send
  to remove a worker) asks to leave gracefully: the worker trains on until
  the others move to a world without it, at a commit, and then exits.
"""

import functools
import logging
import os
import signal
import sys
import threading

from gorovod import _core
from gorovod.exceptions import HorovodInternalError, HostsUpdatedInterrupt, WorkerExcluded
from gorovod.torch.elastic.sampler import ElasticSampler
from gorovod.torch.elastic.state import ObjectState, State, TorchState
from gorovod.torch.mpi_ops import init, shutdown

# A child of the "gorovod" logger. Its warnings reach stderr even when the
# script configures no logging (Python's last-resort handler).
_log = logging.getLogger(__name__)


def run(func):
    """Decorator for the elastic training function ``func(state, ...)``: it
    runs it until it returns, re-synchronizing the state after every world
    change. Collectives must not run before it (in particular not between
    init() and run(), except on the first start): a joining worker's first
    collectives are the state synchronization."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        return _run_elastic(func, state, args, kwargs, _horovod_error)
    return wrapper


def _horovod_error(state, e):
    """Horovod's rule: a HorovodInternalError says the world broke."""
    return isinstance(e, HorovodInternalError)


def _run_elastic(func, state, args, kwargs, world_broke, log=None, log_restores=False):
    """The loop both ``run`` decorators share (this module's, for Horovod's
    API, and ``gorovod.torch.distributed.elastic.run``, for DDP): sync the
    state, call ``func(state, *args, **kwargs)`` until it returns, and after
    every world change (HostsUpdatedInterrupt at a commit, or an error for
    which ``world_broke(state, e)`` is true, after which the last commit is
    restored) reset and sync again. SIGTERM asks to leave the job while it
    runs; a worker the job went on without (WorkerExcluded) shuts the
    library down and exits with status 0. ``log`` (this module's logger by
    default) is told of that, and of each restore with ``log_restores``."""
    log = log or _log
    previous = _leave_on_sigterm()
    try:
        while True:
            try:
                state.sync()
                return func(state, *args, **kwargs)
            except WorkerExcluded:
                raise
            except HostsUpdatedInterrupt:
                pass
            except Exception as e:  # noqa: BLE001 (DDP makes a RuntimeError of the collective's error)
                if not world_broke(state, e):
                    raise
                if log_restores:
                    log.info("the world changed (%s): back to the last commit", e)
                _core.drain()  # nothing of the old world writes into the state any more
                state.restore()
            _reset()
            state.on_reset()
    except WorkerExcluded as e:
        log.warning("this worker left the job: %s", e)
        _core.shutdown(finished=False)
        sys.exit(0)
    finally:
        _restore_sigterm(previous)


def _reset():
    """Between a world change and the next state.sync(): wait for what the
    old world still has in flight, then let the library run collectives
    again."""
    _core.drain()
    _core.reset()


def _leave_on_sigterm():
    if threading.current_thread() is not threading.main_thread():
        return None
    owner = os.getpid()
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame):
        if os.getpid() != owner:
            # A forked child (a DataLoader worker) inherited this handler: it
            # has no gorovod of its own, so SIGTERM does what it would have.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        _log.warning("SIGTERM: leaving the job once the others have moved on")
        try:
            _core.request_leave()
        except Exception as e:  # not fatal: the worker then stays
            _log.warning("asking to leave failed: %s", e)

    signal.signal(signal.SIGTERM, handler)
    return previous


def _restore_sigterm(previous):
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler", "init", "shutdown"]
