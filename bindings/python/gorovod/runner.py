"""gorovod.run: Horovod's programmatic launcher (``horovod.run``).

``run(func, args=(), kwargs=None, np=1, ...)`` starts ``gorovod run`` with
np workers on this host, each a new Python process that calls
``func(*args, **kwargs)``, and returns the workers' return values as a list in
rank order. If a worker raises, run raises that exception (the first rank's
that failed), with the worker's rank and traceback added as a note.

The function and its arguments reach the workers pickled with cloudpickle
(Debian's python3-cloudpickle), which pickles functions and classes of the
calling script (``__main__``) by value, as Horovod does; other modules are
imported by name in the workers, which get the caller's ``sys.path`` through
PYTHONPATH. The pickles and the results go through a private temporary
directory, which is why the workers must run on this host: ``hosts`` may name
only this host (use the ``gorovod run`` command with ``-H`` for several).

The ``gorovod`` command is found as $GOROVOD, else the one installed with
this package, else on the PATH.

The worker side is ``python3 -m gorovod.runner DIR``.
"""

import os
import pickle
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import traceback
import warnings

from gorovod import _core
from gorovod.exceptions import HorovodInternalError

_PAYLOAD = "payload.pkl"
_LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


def _cloudpickle():
    try:
        import cloudpickle
    except ImportError:
        raise ImportError("gorovod.run needs cloudpickle to send the function to its workers: install Debian's "
                          "python3-cloudpickle (apt-get install python3-cloudpickle)")
    return cloudpickle


def command_path():
    """The gorovod command: $GOROVOD when set, else the one installed with
    this package (pip puts it in the scripts directory of the environment,
    beside its python, which need not be on the PATH), else `gorovod` on the
    PATH. Nothing is built here."""
    named = os.environ.get("GOROVOD")
    if named:
        return named
    installed = os.path.join(sysconfig.get_path("scripts"), "gorovod")
    if os.path.isfile(installed) and os.access(installed, os.X_OK):
        return installed
    found = shutil.which("gorovod")
    if found:
        return found
    raise FileNotFoundError("gorovod.run: the gorovod command is neither installed beside %s nor on the PATH: "
                            "install the package with `pip install ./bindings/python` from a gorovod checkout, or "
                            "build the command with `go build -o /usr/local/bin/gorovod ./cmd/gorovod`, or set "
                            "GOROVOD to its path" % sys.executable)


def _local_only(hosts, hostfile):
    if hostfile:
        raise NotImplementedError("gorovod.run runs its workers on this host only (the function reaches them "
                                  "through a local directory); for a hostfile use `gorovod run --hostfile`")
    if not hosts:
        return
    here = _LOCAL_HOSTS + (socket.gethostname(),)
    for entry in hosts.split(","):
        name = entry.strip().rsplit(":", 1)[0]
        if name and name not in here:
            raise NotImplementedError("gorovod.run runs its workers on this host only (the function reaches them "
                                      "through a local directory), not on %r; use `gorovod run -H %s`" % (name, hosts))


def _alias(name, value, alias, alias_value, default=None):
    """The value given under name or under Horovod's other name alias."""
    if value is not None and alias_value is not None and value != alias_value:
        raise ValueError("gorovod.run: %s=%r and %s=%r disagree: give one" % (name, value, alias, alias_value))
    if value is not None:
        return value
    return alias_value if alias_value is not None else default


def run(func, args=(), kwargs=None, np=1, min_np=None, max_np=None, slots=None, reset_limit=None, hosts=None,
        hostfile=None, start_timeout=None, ssh_port=None, ssh_identity_file=None, disable_cache=None,
        output_filename=None, verbose=None, use_gloo=None, use_mpi=None, mpi_args=None, network_interface=None,
        executable=None, num_proc=None, min_num_proc=None, max_num_proc=None):
    """Runs func(*args, **kwargs) in np worker processes under `gorovod run`
    and returns their results, in rank order. Horovod's signature; min_np
    and max_np make the job elastic; Horovod's current names num_proc,
    min_num_proc and max_num_proc are accepted too (then results come from the workers of
    the last world, by their rank there). use_gloo, use_mpi and mpi_args are
    ignored (gorovod has its own transports), as are the SSH, cache and
    output options; hosts may name only this host."""
    if not callable(func):
        raise TypeError("gorovod.run: func must be callable, got %s" % type(func).__name__)
    # Horovod's current names (num_proc, min_num_proc, max_num_proc) and its
    # older ones (np, min_np, max_np) both work; the two for one value must agree.
    np = _alias("np", np if num_proc is None or np != 1 else None, "num_proc", num_proc, default=1)
    min_np = _alias("min_np", min_np, "min_num_proc", min_num_proc)
    max_np = _alias("max_np", max_np, "max_num_proc", max_num_proc)
    if not isinstance(np, int) or np < 1:
        raise ValueError("gorovod.run: np must be a positive integer, got %r" % (np,))
    _local_only(hosts, hostfile)
    if use_mpi:
        warnings.warn("gorovod.run: use_mpi is ignored: gorovod uses its own transports, not MPI")
    cloudpickle = _cloudpickle()
    argv = [command_path(), "run", "--np", str(np), "--min-np", str(min_np if min_np is not None else np)]
    if max_np is not None:
        argv += ["--max-np", str(max_np)]
    if start_timeout is not None:
        argv += ["--elastic-timeout", str(int(start_timeout))]
    if network_interface:
        argv += ["--network-interface", network_interface]
    with tempfile.TemporaryDirectory(prefix="gorovod-run-") as d:
        with open(os.path.join(d, _PAYLOAD), "wb") as f:
            cloudpickle.dump((func, tuple(args), dict(kwargs or {})), f)
        argv += ["--", executable or sys.executable, "-m", "gorovod.runner", d]
        env = dict(os.environ)
        # The workers import this gorovod package and the caller's modules
        # from where the caller does.
        path = [os.path.dirname(_core._package_dir())] + [p for p in sys.path if p]
        if env.get("PYTHONPATH"):
            path.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(path)
        proc = subprocess.run(argv, env=env)
        results, errors = _collect(d)
    if errors:
        # The first rank's own failure, before the failures it caused on the
        # others (HorovodInternalError: their collectives lost a peer).
        rank = min(errors, key=lambda r: (isinstance(errors[r][0], HorovodInternalError), r))
        exc, text = errors[rank]
        note = "gorovod.run: raised by rank %d of %d:\n%s" % (rank, np, text)
        if hasattr(exc, "add_note"):
            exc.add_note(note)
            raise exc
        raise RuntimeError(note) from exc
    if proc.returncode != 0:
        raise RuntimeError("gorovod.run: `%s` exited with status %d" % (" ".join(argv), proc.returncode))
    ranks = sorted(results)
    if ranks != list(range(len(ranks))) or not ranks:
        raise RuntimeError("gorovod.run: results came from ranks %s, not from every rank of the job" % ranks)
    return [results[r] for r in ranks]


def _collect(d):
    results, errors = {}, {}
    for name in os.listdir(d):
        kind, _, rank = name.partition(".")
        if kind not in ("result", "error") or not rank.isdigit():
            continue
        with open(os.path.join(d, name), "rb") as f:
            value = pickle.load(f)
        (results if kind == "result" else errors)[int(rank)] = value
    return results, errors


def _write(d, name, value):
    cloudpickle = _cloudpickle()
    tmp = os.path.join(d, ".%s.%d" % (name, os.getpid()))
    with open(tmp, "wb") as f:
        cloudpickle.dump(value, f)
    os.replace(tmp, os.path.join(d, name))


def _rank():
    """The worker's rank: in the current world when gorovod is still
    initialized, else the one the launcher gave it."""
    if _core.is_initialized():
        return _core.topology().rank
    return int(os.environ.get("GOROVOD_RANK", "0"))


def _worker(d):
    with open(os.path.join(d, _PAYLOAD), "rb") as f:
        func, args, kwargs = pickle.load(f)
    try:
        result = func(*args, **kwargs)
    except BaseException as e:
        text = traceback.format_exc()
        try:
            pickle.loads(_cloudpickle().dumps(e))
            exc = e
        except Exception:
            exc = RuntimeError("%s: %s (the exception could not be pickled)" % (type(e).__name__, e))
        _write(d, "error.%d" % _rank(), (exc, text))
        raise
    _write(d, "result.%d" % _rank(), result)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 -m gorovod.runner DIR (started by gorovod.run)")
    _worker(sys.argv[1])
