"""Elastic DistributedDataParallel: a DDP script that survives workers dying
(kill -9), freezing (SIGSTOP), leaving (SIGTERM) and joining, in place,
without restarting the job.

A DDP script becomes elastic with four changes (examples/pytorch/ddp_elastic.py)::

    import gorovod.torch.distributed.elastic as elastic   # also registers "gorovod"

    dist.init_process_group("gorovod")
    sampler = elastic.ElasticSampler(dataset, shuffle=True, seed=0)   # for DistributedSampler
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    model = Net()                                          # not wrapped: the state wraps it
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    state = elastic.State(model, optimizer, sampler, epoch=0)

    @elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            sampler.set_epoch(state.epoch)
            for x, y in loader:
                optimizer.zero_grad()
                loss_fn(state.model(x), y).backward()   # state.model: the DDP module
                optimizer.step()
                sampler.record_batch(0, 32)
                state.commit()

    train(state)

What happens at a world change, on every member of the new world at the same
point (so their collectives pair up):

1. A worker died or froze: the collective that needed it fails once gorovod
   has formed the world without it (HorovodInternalError, or the
   RuntimeError DDP makes of it in ``backward()``). ``run`` waits for what
   the old world still has in flight and restores the last commit: the
   module's and optimizer's state dicts, the sampler's position, the other
   attributes; gradients are dropped. Workers joining or leaving: the
   world changes at a ``state.commit()``, which raises HostsUpdatedInterrupt
   after saving (nothing to restore).
2. ``run`` lets the library run collectives again, calls the reset
   callbacks, then ``state.sync()``: the default process group is replaced
   by one for the new world (``gorovod.torch.distributed.switch_world``: the
   new rank 0 serves a new store, and torchrun's variables follow), the
   module is wrapped in a new DistributedDataParallel on it (which
   broadcasts rank 0's parameters and buffers, and divides gradients by the
   new size), and the optimizer's state, the sampler's position and the
   other attributes are broadcast from rank 0. The sampler re-splits the
   samples the world has not trained on yet among the new world.
3. The training function is called again; ``state.model`` is the new DDP
   module.

Groups made with ``dist.new_group`` are the old world's: the world change
destroys them with the default group and removes their process sets (a
collective on one raises RuntimeError saying so). Make them inside the
training function, where each world makes them anew with its own ranks.

A worker that joins runs the script from the top: its import makes the
rendezvous of the world it joined and ``init_process_group`` uses it, then
``run`` calls ``state.sync()``, which meets the members' sync. So a script
must make no collective between the import and ``run`` (no
``dist.barrier()``, no DDP of its own: the state wraps the module).

``run`` also turns SIGTERM into a graceful leave (the worker trains on until
the others have moved to a world without it, at a commit) and ends a worker
left out of the world with exit status 0, as ``gorovod.torch.elastic.run``.
"""

import functools
import logging
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from gorovod import _core
from gorovod.exceptions import HorovodInternalError
from gorovod.torch import distributed as _backend
from gorovod.torch.elastic import _run_elastic
from gorovod.torch.elastic.sampler import ElasticSampler
from gorovod.torch.elastic.state import ObjectState, TorchState
from gorovod.torch.functions import _broadcast_held

__all__ = ["ElasticSampler", "State", "run"]

_log = logging.getLogger(__name__)


class State(TorchState):
    """What an elastic DDP job keeps identical on every worker, commits,
    restores and re-synchronizes: the module (given unwrapped; ``model`` is
    its DistributedDataParallel wrapper for the current world), the
    optimizer, the sampler and any keyword attributes (epoch, step, a
    learning-rate scheduler, ...), as ``gorovod.torch.elastic.TorchState``.

    Args:
        model: the torch.nn.Module to train, not wrapped in DDP.
        optimizer: its optimizer (over ``model.parameters()``).
        sampler: an ElasticSampler, or None.
        ddp_kwargs: keyword arguments for each DistributedDataParallel
            (``find_unused_parameters``, ``bucket_cap_mb``, ...).
        on_wrap: called with each new DDP module after it is made, before
            training resumes (to register a comm hook on it, say).
        kwargs: other attributes, saved at each commit and broadcast from
            rank 0 at each sync.

    Attributes:
        model: the DistributedDataParallel module of the current world (call
            it in the training function: a new one replaces it at each world
            change, and the old one must not be called again).
        module: the module given.
    """

    def __init__(self, model, optimizer=None, sampler=None, ddp_kwargs=None, on_wrap=None, **kwargs):
        if isinstance(model, DistributedDataParallel):
            raise TypeError("elastic.State: give the module itself, not a DistributedDataParallel: the state wraps "
                            "it anew for each world (and wrapping it before run() would make collectives that a "
                            "joining worker's do not pair with)")
        if not isinstance(model, torch.nn.Module):
            raise TypeError("elastic.State: model must be a torch.nn.Module, not %s" % type(model).__name__)
        if sampler is not None and not isinstance(sampler, ElasticSampler):
            raise TypeError("elastic.State: sampler must be an ElasticSampler (it keeps the job's position in the "
                            "data across world changes), not %s" % type(sampler).__name__)
        for name in ("model", "module"):
            if name in kwargs:
                raise TypeError("elastic.State: %r is the state's own attribute" % name)
        self._ddp_kwargs = dict(ddp_kwargs or {})
        self._on_wrap = on_wrap
        if sampler is not None:
            kwargs["sampler"] = sampler
        super().__init__(model=None, optimizer=optimizer, module=model, **kwargs)
        # TorchState keeps model=None as a plain attribute: here model is the
        # DDP wrapper, made by sync() and never saved or broadcast.
        self._saved_state.pop("model", None)
        if optimizer is None:
            self._saved_state.pop("optimizer", None)
        self.model = None
        self._world = None

    def sync(self):
        """Called by ``run`` on every member of a new world: a process group
        for the world, the module wrapped in DDP on it (with rank 0's
        parameters and buffers), and rank 0's optimizer state, sampler
        position and attributes."""
        self._world = _core.topology().world
        began = time.monotonic()
        switched = _backend.switch_world()
        wrapping = time.monotonic()
        self._wrap()
        broadcasting = time.monotonic()
        for name, handler in self._handlers.items():
            if name != "module":  # DDP's construction broadcast it
                handler.sync()
        ObjectState.sync(self)
        _log.debug("state synchronized in world %d: process group %s in %.3f s, DDP in %.3f s, the rest in %.3f s",
                   self._world, "made" if switched else "kept", wrapping - began, broadcasting - wrapping,
                   time.monotonic() - broadcasting)

    def commit(self):
        """Saves the state and ends the step, as TorchState.commit(); first
        raises the error of a collective of this world that failed (DDP
        completes a bucket whose allreduce failed with its gradients not
        reduced: such a step must not be saved)."""
        pg = dist.group.WORLD if dist.is_initialized() else None
        failure = getattr(pg, "failure", None)
        if failure is not None:
            raise failure
        super().commit()

    def restore(self):
        """Back to the last commit, gradients dropped (the failed step's may
        be partly accumulated)."""
        super().restore()
        for p in self.module.parameters():
            p.grad = None

    def _wrap(self):
        old = self.model
        self.model = None
        if old is not None:
            _disarm(old)
            del old
        world = dist.group.WORLD
        if self._ddp_kwargs.get("process_group") is None and isinstance(world, _backend.ProcessGroupGorovod):
            # DDP's construction broadcasts rank 0's parameters and buffers
            # (those it does not ignore). Send only those whose digest
            # differs on some rank (none after a world that only lost
            # members), then let DDP's broadcast find them in place.
            ignored = set(getattr(self.module, "_ddp_params_and_buffers_to_ignore", ()))
            states = [p.detach() for name, p in self.module.named_parameters() if name not in ignored]
            if self._ddp_kwargs.get("broadcast_buffers", True):
                states += [b.detach() for name, b in self.module.named_buffers() if name not in ignored]
            _broadcast_held(states, root_rank=0)
            world.root_state_held = True
            try:
                self.model = DistributedDataParallel(self.module, **self._ddp_kwargs)
            finally:
                world.root_state_held = False
        else:
            self.model = DistributedDataParallel(self.module, **self._ddp_kwargs)
        if self._on_wrap is not None:
            self._on_wrap(self.model)

    def _world_changed(self):
        """Whether gorovod is in another world than the one the last sync
        began in (a collective failed because its world broke)."""
        if self._world is None:
            return False
        try:
            return _core.topology().world != self._world
        except Exception:  # noqa: BLE001 (not initialized, or shut down: not a world change)
            return False


def _disarm(ddp):
    """Drops the old DDP module's reducer, whose autograd hooks on the
    parameters stay registered while it lives: after a step that failed in
    mid-backward it still expects them, and would run its buckets on the old
    process group in the next backward."""
    for name in ("reducer", "logger"):
        if hasattr(ddp, name):
            setattr(ddp, name, None)


def run(func):
    """Decorator for the elastic training function ``func(state, ...)`` of a
    DDP script, ``state`` an ``elastic.State``: runs it until it returns,
    re-synchronizing the state (process group, DDP, optimizer, sampler)
    after every world change. See the module's documentation."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        if not isinstance(state, State):
            raise TypeError("gorovod.torch.distributed.elastic.run: the first argument must be an elastic.State, "
                            "not %s" % type(state).__name__)
        return _run_elastic(func, state, args, kwargs, _world_broke, log=_log, log_restores=True)

    return wrapper


def _world_broke(state, e):
    """DDP's rule: a HorovodInternalError, or any error (DDP makes a
    RuntimeError of the collective's) raised while gorovod moved to another
    world than the state's, says the world broke."""
    return isinstance(e, HorovodInternalError) or state._world_changed()
