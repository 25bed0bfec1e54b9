"""The exceptions gorovod raises.

HorovodInternalError and HostsUpdatedInterrupt keep Horovod's names, so that
scripts written for Horovod catch them unchanged.
"""


class GorovodError(RuntimeError):
    """A failure reported by libgorovod; ``code`` is its gorovod_status."""

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = code


class HorovodInternalError(GorovodError):
    """A collective failed because the world changed under it (a worker died,
    froze or left). gorovod has already rebuilt the world without that worker;
    ``gorovod.torch.elastic.run`` restores the last committed state and
    re-synchronizes it from the new rank 0, then calls the training function
    again."""


class HostsUpdatedInterrupt(GorovodError):
    """Raised by ``state.commit()`` / ``state.check_host_updates()`` when every
    worker moved to a new world at this commit (workers joined or left).

    ``skip_sync`` is always False in gorovod: a joining worker needs the state,
    and the elastic loop re-synchronizes it from the new rank 0."""

    def __init__(self, message="the job moved to a new world at this commit", code=None, skip_sync=False):
        super().__init__(message, code)
        self.skip_sync = skip_sync


class WorkerExcluded(GorovodError):
    """The job goes on without this worker: it asked to leave (SIGTERM under
    ``gorovod run``) or was removed. ``gorovod.torch.elastic.run`` ends the
    process cleanly (exit status 0) when it sees this."""


class MismatchError(GorovodError, ValueError):
    """The workers called different collectives at the same point: another
    kind, dtype, element count, reduce op or root. The message says what each
    called."""


class ForkedProcessError(GorovodError):
    """gorovod was called in a child process made by fork() (a DataLoader
    worker, typically): the library's runtime lives in the parent only."""


class NotInitializedError(GorovodError, ValueError):
    """gorovod was used before ``init()`` (or after ``shutdown()``)."""
