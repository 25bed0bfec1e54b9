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
    """Horovod's programmatic launcher (``horovod.run(func, args, np=...)``),
    which pickles ``func`` and runs it in ``np`` new processes, is not
    offered: start the script itself under ``gorovod run`` instead."""
    raise NotImplementedError(
        "gorovod.run (horovod.run) is not implemented: start the script with "
        "`gorovod run --np N --min-np N -- python3 script.py ...` instead")
