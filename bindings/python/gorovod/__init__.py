"""gorovod for Python: an elastic, Horovod-style collective communication
library. ``import gorovod.torch as hvd`` is the PyTorch binding, written to
run Horovod PyTorch scripts after changing that import line.

The library (libgorovod.so) is the one named by the environment variable
GOROVOD_LIBRARY, else the one installed beside this package by
``pip install ./bindings/python``; importing never builds it.
"""

from gorovod.exceptions import (GorovodError, HorovodInternalError, HostsUpdatedInterrupt, MismatchError,
                                ForkedProcessError, NotInitializedError, WorkerExcluded)

from gorovod._version import __version__
from gorovod import _interrupt

_interrupt.install()  # a worker stopped by gorovod run ends with one line (gorovod/_interrupt.py)


def run(func, *args, **kwargs):
    """Horovod's programmatic launcher (``horovod.run(func, args=(...),
    np=N)``): runs func in N worker processes under ``gorovod run`` on this
    host and returns their results in rank order; see gorovod.runner.run."""
    from gorovod import runner
    return runner.run(func, *args, **kwargs)
