"""TorchState: what an elastic PyTorch job keeps identical on every worker,
commits, restores and re-synchronizes, as Horovod's TorchState.

How Horovod's model maps onto gorovod's (see also elastic/__init__.py):

- ``commit()`` saves a copy of the state in memory, then ends a gorovod step
  (gorovod_commit): if a newer world was agreed (workers joined, or one asked
  to leave), every member moves to it at this same commit and it raises
  HostsUpdatedInterrupt; a worker left out of the new world gets
  WorkerExcluded. Commit is where joiners are admitted, so commit often
  (every batch, as Horovod's examples do, is cheap: a copy of the state and
  one tiny allreduce when no gradient allreduce carried the news).
- ``check_host_updates()`` is the same step boundary without the copy.
- ``restore()`` goes back to the last commit, after a HorovodInternalError
  (a collective failed because the world broke; gorovod already rebuilt the
  world without the lost worker).
- ``sync()`` makes the state the new world's rank 0's (the oldest
  survivor's): the sampler and the other attributes pickled from it; the
  model's and the optimizer's tensors each by digest first. Every worker
  takes a 64-bit digest of each tensor, one small allreduce shows which
  differ on some worker, and only those are broadcast (in one call for the
  model, one for the optimizer): none after a world that only lost members
  (they all committed the same step), and for a joiner not the layers it
  already holds (frozen ones it loaded from the same checkpoint). An
  optimizer whose state differs in layout on some worker (a joiner's empty
  one) is sent whole. Every member calls it after every world change, and a
  joiner calls it on entering elastic.run, so they meet there.
"""

import copy

import torch

from gorovod import _core
from gorovod.torch.elastic.sampler import ElasticSampler
from gorovod.torch.functions import _broadcast_held, _parameter_tensors, _sync_optimizer_state, broadcast_object
from gorovod.torch.mpi_ops import rank


class State(object):
    """The base of every elastic state: reset callbacks and the commit step
    boundary."""

    def __init__(self, bcast_object=broadcast_object, get_rank=rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Functions called after each world change, before the state is
        synchronized (to rescale the learning rate to the new size, say)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Saves the state in memory, then ends the step; raises
        HostsUpdatedInterrupt when the job moved to a new world here."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Ends the step without saving: raises HostsUpdatedInterrupt when the
        job moved to a new world here."""
        _core.commit()

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()

    def reset(self):
        pass


class ObjectState(State):
    """Plain Python attributes, given as keyword arguments; they are copied
    (deepcopy) at each commit and pickled from rank 0 at each sync."""

    def __init__(self, bcast_object=broadcast_object, get_rank=rank, **kwargs):
        self._saved_state = kwargs
        self._set_attrs()
        super(ObjectState, self).__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {attr: _copy(getattr(self, attr)) for attr in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for attr, value in self._saved_state.items():
            setattr(self, attr, _copy(value))


def _copy(value):
    try:
        return copy.deepcopy(value)
    except Exception:  # an object that cannot be copied is kept by reference, as Horovod keeps all
        return value


class StateHandler(object):
    def __init__(self, value):
        self.value = value

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()

    def set_value(self, value):
        self.value = value
        self.save()


class _StateDictCopy(StateHandler):
    """A handler that saves a copy of its value's state dict at each commit
    and loads it back on restore."""

    def __init__(self, value):
        super().__init__(value)
        self.save()

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)


class ModelStateHandler(_StateDictCopy):
    def sync(self):
        # Only the tensors that differ on some worker travel: none after a
        # world that only lost members, not the frozen layers a joiner
        # loaded from the same checkpoint.
        _broadcast_held(_parameter_tensors(self.value.state_dict()), root_rank=0)


class OptimizerStateHandler(_StateDictCopy):
    def sync(self):
        if hasattr(self.value, "_forget"):
            self.value._forget()  # a DistributedOptimizer: its allreduces in flight died with the old world
        _sync_optimizer_state(self.value, root_rank=0, skip_held=True)


class StateDictHandler(_StateDictCopy):
    """Anything with state_dict() and load_state_dict() whose state is small
    (a sampler's position, a learning-rate scheduler): pickled from rank 0."""

    def restore(self):
        self.value.load_state_dict(copy.deepcopy(self._saved))

    def sync(self):
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank=0))


def _scheduler_types():
    sched = torch.optim.lr_scheduler
    types = [getattr(sched, n) for n in ("LRScheduler", "_LRScheduler", "ReduceLROnPlateau") if hasattr(sched, n)]
    return tuple(types)


_handler_registry = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, StateDictHandler),
    (_scheduler_types(), StateDictHandler),
]


def get_handler_registry():
    return _handler_registry


def set_handler_registry(registry):
    global _handler_registry
    _handler_registry = registry


def _get_handler(v):
    for handler_type, handler_cls in _handler_registry:
        if isinstance(v, handler_type):
            return handler_cls(v)
    return None


class TorchState(ObjectState):
    """The state of a PyTorch training process: model, optimizer, and any
    keyword attributes. Modules, optimizers, ElasticSamplers and
    learning-rate schedulers are saved, restored and synchronized through
    their state dicts; other attributes (epoch, batch, ...) as objects.

    Unlike Horovod's (which treats it as an opaque object), a learning-rate
    scheduler is handled through its state dict, so restore() takes it back
    and sync() does not replace it with an unpickled copy tied to another
    optimizer."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(dict(model=model, optimizer=optimizer))
        self._handlers = {}
        plain = {}
        for k, v in kwargs.items():
            h = _get_handler(v) if v is not None else None
            if h is not None:
                self._handlers[k] = h
            else:
                plain[k] = v
        for name, handler in self._handlers.items():
            object.__setattr__(self, name, handler.value)
        super(TorchState, self).__init__(bcast_object=broadcast_object, get_rank=rank, **plain)

    def save(self):
        for handler in self._handlers.values():
            handler.save()
        super(TorchState, self).save()

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        super(TorchState, self).restore()

    def sync(self):
        for handler in self._handlers.values():
            handler.sync()
        super(TorchState, self).sync()

    def __setattr__(self, name, value):
        handlers = self.__dict__.get("_handlers")
        if handlers is not None and name in handlers:
            handlers[name].set_value(value)
        super().__setattr__(name, value)
