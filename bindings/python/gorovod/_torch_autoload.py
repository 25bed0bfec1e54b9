"""Registers the "gorovod" torch.distributed backend in the workers of a
gorovod job, so that a torchrun script runs under ``gorovod run`` with
``dist.init_process_group("gorovod")`` and no gorovod import.

The installed package puts ``gorovod_torch_backend.pth`` in site-packages;
Python runs its line at start-up, which imports this module only when
GOROVOD_JOB_ID is set (the launcher gives it to every worker): outside a job
nothing of gorovod is imported. Here, importing torch is left to the script
(it takes seconds, and many workers never use it): install() puts a finder
first on sys.meta_path that wraps the loaders of ``torch`` and
``torch.distributed``. Once both have finished importing, the backend's name
is registered with a creator that imports gorovod.torch.distributed when a
group is made, and torch's env:// rendezvous is wrapped the same way, so
that gorovod's work (joining the job, the rendezvous's one broadcast) is
done at init_process_group("gorovod"), as the import line would have done
it, and never in a script that only imports torch (a Horovod-style
``gorovod.torch`` script calls hvd.init() itself, with its own arguments).

A failure here is logged on the "gorovod" logger and never breaks the
script's import of torch; the script's own ``import
gorovod.torch.distributed`` works beside it (registering is done once).
"""

import importlib
import os
import sys

BACKEND = "gorovod"
JOB_VARIABLE = "GOROVOD_JOB_ID"
_MODULE = "gorovod.torch.distributed"
_WATCHED = ("torch", "torch.distributed")


def _log():
    """The "gorovod" logger (logging is imported when first needed: this
    module runs at the start of every worker, torch's or not)."""
    import logging
    return logging.getLogger("gorovod")


def _real_backend():
    """gorovod.torch.distributed, imported on first use: importing it inside
    a job joins the job and makes the world's rendezvous."""
    return importlib.import_module(_MODULE)


def register_backend(dist, creator):
    """Registers BACKEND's name with torch.distributed (dist), creator making
    its groups. torch 2.x takes the devices a backend serves (it would
    assume CPU and CUDA); gorovod's groups move CPU tensors."""
    import inspect
    kwargs = {}
    try:
        if "devices" in inspect.signature(dist.Backend.register_backend).parameters:
            kwargs["devices"] = ["cpu"]
    except (TypeError, ValueError):  # no signature to read: torch 1.13's takes (name, func)
        pass
    dist.Backend.register_backend(BACKEND, creator, **kwargs)


def _create_lazily(store, rank, world_size, timeout):
    """The backend's creator until gorovod.torch.distributed is imported
    (its register() keeps this one, which hands over to its _create)."""
    return _real_backend()._create(store, rank, world_size, timeout)


def _env_rendezvous(original):
    """torch's env:// handler: gorovod.torch.distributed's handler (imported
    here if need be) inside a gorovod job whose environment names no
    master, or once that module is imported; torch's own everywhere else."""

    def handler(url, timeout=None, **kwargs):
        ours = _MODULE in sys.modules or (JOB_VARIABLE in os.environ and "MASTER_ADDR" not in os.environ and
                                          "MASTER_PORT" not in os.environ)
        if not ours:
            if timeout is None:
                yield from original(url, **kwargs)
            else:
                yield from original(url, timeout=timeout, **kwargs)
            return
        yield from _real_backend()._gorovod_env_rendezvous(original)(url, timeout=timeout, **kwargs)

    # gorovod.torch.distributed's register() leaves a handler so marked.
    handler.gorovod = True
    return handler


def register_lazily():
    """Registers the backend's name and the env:// handler above with
    torch.distributed (imported already); a no-op where the name is
    registered already (by gorovod.torch.distributed, or an earlier call).
    Returns whether it registered."""
    dist = sys.modules["torch.distributed"]
    if not dist.is_available():
        _log().debug("torch.distributed is not available in this torch build: the gorovod backend is not registered")
        return False
    if hasattr(dist.Backend, BACKEND.upper()):  # "gorovod", or "GOROVOD" in some torch versions
        return False
    register_backend(dist, _create_lazily)
    handlers = importlib.import_module("torch.distributed.rendezvous")._rendezvous_handlers
    if "env" in handlers and not getattr(handlers["env"], "gorovod", False):
        handlers["env"] = _env_rendezvous(handlers["env"])
    _log().debug("the gorovod torch.distributed backend is registered (%s)", __name__)
    return True


class _Loader(object):
    """A loader that runs the wrapped one, then tells the finder."""

    def __init__(self, loader, finder, name):
        self._loader, self._finder, self._name = loader, finder, name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)  # the script's import: its errors are its own
        self._finder.imported(self._name)

    def __getattr__(self, name):  # get_resource_reader, is_package, ...
        return getattr(self._loader, name)


class TorchFinder(object):
    """A sys.meta_path finder that finds nothing itself: it wraps the loader
    of torch and torch.distributed, found by the finders after it, and
    registers the backend once both are imported, then leaves sys.meta_path."""

    def __init__(self):
        self.done = set()
        self.registered = False

    def find_spec(self, name, path=None, target=None):
        if name not in _WATCHED or name in self.done:
            return None
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
            if spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            spec.loader = _Loader(spec.loader, self, name)
            return spec
        except Exception:  # noqa: BLE001 (the import goes on without us)
            _log().warning("gorovod: could not watch the import of %s to register the torch.distributed backend "
                         "(import gorovod.torch.distributed instead)", name, exc_info=True)
            return None

    def imported(self, name):
        """A watched module finished importing: registers once torch and
        torch.distributed both have (torch imports torch.distributed
        half-way through its own import)."""
        self.done.add(name)
        if self.registered or not self.done.issuperset(_WATCHED):
            return
        self.registered = True
        self.uninstall()
        try:
            register_lazily()
        except Exception:  # noqa: BLE001 (never breaks the script's import of torch)
            _log().warning("gorovod: registering the torch.distributed backend failed (import "
                         "gorovod.torch.distributed to register it)", exc_info=True)

    def uninstall(self):
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass


def install():
    """Installs the finder (once) and returns it; where torch.distributed is
    imported already, registers at once instead. A no-op returning None
    outside a gorovod job."""
    if JOB_VARIABLE not in os.environ:
        return None
    for finder in sys.meta_path:
        if isinstance(finder, TorchFinder):
            return finder
    finder = TorchFinder()
    try:
        if "torch.distributed" in sys.modules and "torch" in sys.modules:
            finder.done.update(_WATCHED)
            finder.imported("torch")
        else:
            sys.meta_path.insert(0, finder)
    except Exception:  # noqa: BLE001
        _log().warning("gorovod: installing the torch.distributed backend's import hook failed", exc_info=True)
    return finder


install()
