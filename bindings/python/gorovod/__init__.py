"""gorovod for Python: an elastic, Horovod-style collective communication
library. ``import gorovod.torch as hvd`` is the PyTorch binding, written to
run Horovod PyTorch scripts after changing that import line.

The library (libgorovod.so) is found beside this package when installed
(``pip install ./bindings/python``), built from the Go sources on first use
when the package is used straight from a checkout, or named by the
environment variable GOROVOD_LIBRARY.
"""

from gorovod.exceptions import (GorovodError, HorovodInternalError, HostsUpdatedInterrupt, MismatchError,
                                ForkedProcessError, NotInitializedError, WorkerExcluded)

__version__ = "0.1.0"


def run(func, *args, **kwargs):
    """Horovod's programmatic launcher (``horovod.run(func, args=(...),
    np=N)``): runs func in N worker processes under ``gorovod run`` on this
    host and returns their results in rank order; see gorovod.runner.run."""
    from gorovod import runner
    return runner.run(func, *args, **kwargs)
