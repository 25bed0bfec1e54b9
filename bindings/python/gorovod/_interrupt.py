"""How a worker that its job stops ends: one line, not a traceback.

``gorovod run`` stops a worker with SIGINT (its Ctrl-C): when the job is
over and the worker still waits to join, when the job cannot go on (a rank
failed and the job is below its minimum), or when it is stopped as a whole.
Python turns SIGINT into KeyboardInterrupt, and a script that does not
catch it prints a traceback, which reads as a failure of the worker; the
reason it was stopped is in gorovod run's own lines.

So, in a process that gorovod run launched (GOROVOD_LAUNCH_INDEX set), an
uncaught KeyboardInterrupt prints one line saying where the worker was
stopped instead of the traceback. Nothing else changes: the exception is
raised as always (a script's own ``except KeyboardInterrupt`` and
``finally`` run), the process still ends by SIGINT as Python makes it, and
a script's own ``sys.excepthook`` (set before or after this) is left to do
what it does. With ``gorovod run -v`` (GOROVOD_LOG_LEVEL info or debug) the
traceback is printed as before.

Why not another signal: SIGTERM, which torchrun and horovodrun stop their
workers with, is gorovod's request to leave gracefully (the worker trains
on until the others have moved to a world without it), and schedulers send
it for that; the stop has to be another signal, and SIGINT is the one a
Python script already stops on.
"""

import os
import sys
import traceback

_LAUNCH_INDEX = "GOROVOD_LAUNCH_INDEX"
_LOG_LEVEL = "GOROVOD_LOG_LEVEL"


def _wants_traceback(level):
    """Whether GOROVOD_LOG_LEVEL asks for more than warnings (gorovod run -v)."""
    name = level.strip().lower()
    if name in ("info", "debug"):
        return True
    try:
        return int(name) >= 1
    except ValueError:
        return False


def install():
    """Installs the hook in a worker launched by gorovod run (at import of
    the package: a worker may be stopped before it calls init)."""
    if _LAUNCH_INDEX not in os.environ or _wants_traceback(os.environ.get(_LOG_LEVEL, "")):
        return
    previous = sys.excepthook
    if previous is not sys.__excepthook__:
        return  # the script's own, or ours already

    def excepthook(kind, value, tb):
        if not issubclass(kind, KeyboardInterrupt):
            return previous(kind, value, tb)
        where = ""
        frames = traceback.extract_tb(tb)
        if frames:
            last = frames[-1]
            where = " at %s:%d in %s" % (os.path.basename(last.filename), last.lineno, last.name)
        sys.stderr.write("gorovod: stopped by SIGINT (KeyboardInterrupt)%s; `gorovod run -v` shows the traceback\n"
                         % where)
        sys.stderr.flush()

    sys.excepthook = excepthook
