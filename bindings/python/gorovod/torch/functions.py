"""Broadcasting a model's parameters, an optimizer's state and Python
objects, and gathering objects, as Horovod's functions of the same names."""

import collections
import io
import pickle

import torch

from gorovod.torch import mpi_ops
from gorovod.torch.mpi_ops import rank

try:  # lambdas and local classes, as Horovod pickles them
    import cloudpickle as _pickler
except ImportError:
    _pickler = pickle


def _dumps(obj):
    b = io.BytesIO()
    _pickler.dump(obj, b)
    return b.getvalue()


def broadcast_parameters(params, root_rank):
    """Copies root_rank's parameters into every other worker's, in place.

    params is a model's ``state_dict()`` (taken in sorted key order, as
    Horovod does), ``named_parameters()``, or ``parameters()``. All the tensors
    travel in one call."""
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, (list, tuple)) or hasattr(params, "__iter__"):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError("invalid params of type: %s" % type(params))
    tensors = []
    for name, p in items:
        if not isinstance(p, torch.Tensor):
            raise ValueError("broadcast_parameters: %s is a %s, not a tensor" % (name, type(p).__name__))
        tensors.append(p.data if p.requires_grad else p)
    mpi_ops.grouped_broadcast_(tensors, root_rank)


def broadcast_object(obj, root_rank=0, name=None, process_set=mpi_ops.global_process_set):
    """Returns root_rank's obj on every worker (pickled; cloudpickle when it is
    installed)."""
    mpi_ops._check_process_set(process_set)
    if rank() == root_rank:
        data = torch.frombuffer(bytearray(_dumps(obj)), dtype=torch.uint8)
        length = torch.tensor([data.numel()], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    mpi_ops.broadcast_(length, root_rank, process_set=process_set)
    if rank() != root_rank:
        data = torch.empty(int(length[0]), dtype=torch.uint8)
    mpi_ops.broadcast_(data, root_rank, process_set=process_set)
    if rank() == root_rank:
        return obj
    return pickle.loads(data.numpy().tobytes())


def allgather_object(obj, name=None):
    """Returns the list of every worker's obj, in rank order."""
    data = torch.frombuffer(bytearray(_dumps(obj)), dtype=torch.uint8)
    lengths = mpi_ops.allgather(torch.tensor([data.numel()], dtype=torch.int64))
    gathered = mpi_ops.allgather(data).numpy().tobytes()
    out, at = [], 0
    for n in lengths.tolist():
        out.append(pickle.loads(gathered[at:at + n]))
        at += n
    return out


def broadcast_optimizer_state(optimizer, root_rank, model=None):
    """Makes every worker's optimizer state (its per-parameter state and its
    hyperparameters, such as the learning rate) a copy of root_rank's.

    Root describes its state first (which parameters have state, each entry's
    shape and dtype, the values that are not tensors); the others build a
    state of that shape, the tensors travel in one call per kind of device (CPU,
    CUDA: a CUDA tensor lands on the current device), and the others load
    it. So, unlike Horovod, it needs no optimizer step on zero gradients to
    create the state of a fresh optimizer, and a worker whose optimizer has
    no state yet (one that just joined) gets root's as it is. As after
    Horovod's step, the parameters of an optimizer without state that take
    gradients and had none have zero gradients afterwards."""
    state_dict = optimizer.state_dict()
    if not state_dict["state"]:
        # Horovod creates a fresh optimizer's state by a step on zero
        # gradients, which leaves each parameter that takes a gradient with a
        # zero one: scripts read it afterwards.
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
    me = rank()
    if me == root_rank:
        layout = {"param_groups": state_dict["param_groups"], "state": {}}
        tensors = []
        for pid, entries in sorted(state_dict["state"].items()):
            desc = collections.OrderedDict()
            for key, value in entries.items():
                if torch.is_tensor(value) and value.device.type in ("cpu", "cuda") and not value.is_sparse:
                    desc[key] = ("tensor", tuple(value.shape), str(value.dtype), value.device.type)
                    tensors.append(value if value.is_contiguous() else None)
                else:
                    desc[key] = ("value", value)
            layout["state"][pid] = desc
        if any(t is None for t in tensors):
            raise ValueError("broadcast_optimizer_state: a state tensor of rank %d is not contiguous" % me)
    else:
        layout = None
    layout = broadcast_object(layout, root_rank)
    if me == root_rank:
        mpi_ops.grouped_broadcast_(tensors, root_rank)
        return
    state = {}
    tensors = []
    for pid, desc in layout["state"].items():
        state[pid] = {}
        for key, (kind, *rest) in desc.items():
            if kind == "tensor":
                shape, dtype, where = rest
                # The root's kind of device (grouped_broadcast_ makes one
                # call per kind): a CUDA tensor lands on this process's
                # current device; load_state_dict moves each state to its
                # parameter's device anyway.
                device = torch.device("cuda", torch.cuda.current_device()) if where == "cuda" else None
                t = torch.empty(shape, dtype=getattr(torch, dtype.split(".")[-1]), device=device)
                state[pid][key] = t
                tensors.append(t)
            else:
                state[pid][key] = rest[0]
    mpi_ops.grouped_broadcast_(tensors, root_rank)
    optimizer.load_state_dict({"state": state, "param_groups": layout["param_groups"]})

