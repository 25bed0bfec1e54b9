"""Broadcasting a model's parameters, an optimizer's state and Python
objects, and gathering objects, as Horovod's functions of the same names."""

import collections
import io
import pickle
import zlib

import torch

from gorovod import _core
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
    mpi_ops.grouped_broadcast_(_parameter_tensors(params), root_rank)


def _parameter_tensors(params):
    """The tensors of broadcast_parameters' params, in the order it sends them."""
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
    return tensors


# ---- Sending only what differs ----
#
# After a world change every member of the new world re-synchronizes its
# elastic state from rank 0 (TorchState.sync). When a world only lost
# members, they all hold that state already, byte for byte; a joiner that
# loaded the same checkpoint holds every frozen layer already. Each worker
# takes a 64-bit digest of each of its tensors, one small allreduce tells
# every worker which tensors differ anywhere, and only those are broadcast.


def _digest_keys(device):
    """The multipliers of the device digest (_device_digest): odd 64-bit
    numbers from a fixed seed, the same in every process."""
    g = torch.Generator().manual_seed(0x2545F4914F6CDD1D)
    keys = torch.randint(-(1 << 62), 1 << 62, (_DIGEST_WORDS,), dtype=torch.int64, generator=g) * 2 + 1
    return keys.to(device)


_DIGEST_WORDS = 1 << 20  # 32-bit words per block of the device digest
_MASK64 = (1 << 64) - 1


def _signed64(x):
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


def _device_digest(t, keys):
    """A 64-bit digest of a tensor's bytes computed where the tensor lives (a
    GPU), without copying it to the host: the 32-bit words times the fixed
    odd multipliers, summed modulo 2^64 per block of _DIGEST_WORDS words,
    each block's sum times a multiplier of its own, plus the length. Two
    different tensors collide with a chance of about 2^-63 for multipliers
    chosen at random (a multilinear hash); this is not a defence against an
    adversary, which a job's authenticated members are not. Returns a
    0-dimensional int64 tensor on the tensor's device."""
    b = t.detach().reshape(-1).view(torch.uint8)
    n = b.numel()
    if n % 4:
        b = torch.cat([b, b.new_zeros(4 - n % 4)])
    elif b.storage_offset() % 4:
        b = b.clone()  # a view starting inside a 32-bit word (a float16 slice at an odd offset)
    w = b.view(torch.int32)
    total = torch.zeros((), dtype=torch.int64, device=t.device)
    for j, start in enumerate(range(0, w.numel(), _DIGEST_WORDS)):
        block = w[start:start + _DIGEST_WORDS].to(torch.int64)
        total += (block * keys[:block.numel()]).sum() * _signed64((j + 1) * 0x9E3779B97F4A7C15 | 1)
    return total + _signed64(n * 0xC2B2AE3D27D4EB4F)


def _digests(tensors):
    """Each tensor's 64-bit digest (an int), its dtype and shape included, or
    None where none can be taken (a sparse tensor): such a tensor is always
    sent. Host tensors are hashed by the library (xxHash64), device tensors
    on their device (_device_digest), all of a device's at once."""
    out = [None] * len(tensors)
    on_device = {}
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor) or t.is_sparse:
            continue
        if t.device.type == "cpu":
            c = t.detach().contiguous()
            out[i] = _core.digest(c.data_ptr(), c.numel() * c.element_size())
        else:
            on_device.setdefault(t.device, []).append(i)
    for device, idx in on_device.items():
        keys = _digest_keys(device)
        sums = torch.stack([_device_digest(tensors[i], keys) for i in idx]).cpu().tolist()
        for i, d in zip(idx, sums):
            out[i] = d & _MASK64
    for i, t in enumerate(tensors):
        if out[i] is not None:
            desc = ("%s%s" % (t.dtype, tuple(t.shape))).encode()
            out[i] = (out[i] + zlib.crc32(desc) * 0x165667B19E3779F9) & _MASK64
    return out


def _broadcast_held(tensors, root_rank):
    """Makes every worker's tensors equal to root_rank's, as
    broadcast_parameters does, but broadcasts only the tensors whose digest
    (_digests) differs on some worker; the others every worker holds already.
    One allreduce of two 64-bit integers per tensor decides, the same way on
    every worker. Returns the indices of the tensors sent."""
    tensors = list(tensors)
    if not tensors:
        return []
    digests = _digests(tensors)
    n = len(tensors)
    # Max over [d, -d] gives each tensor's largest and (negated) smallest
    # digest: equal on every worker exactly when they are the same. 62 bits
    # keep -d in range; a tensor without a digest is above every digest
    # here and below every one in its negated half, so it always differs.
    high = [1 << 62 if d is None else d & ((1 << 62) - 1) for d in digests]
    low = [0 if d is None else -h for d, h in zip(digests, high)]
    v = torch.tensor(high + low, dtype=torch.int64)
    top = mpi_ops.allreduce(v, op=mpi_ops.Max, name="gorovod.state_digests").tolist()
    send = [i for i in range(n) if top[i] != -top[n + i]]
    if send:
        mpi_ops.grouped_broadcast_([tensors[i] for i in send], root_rank)
    return send


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
    _sync_optimizer_state(optimizer, root_rank, skip_held=False)


def _optimizer_layout(state_dict):
    """An optimizer state dict's description (param_groups, and per
    parameter each entry's shape, dtype and kind of device, or its value when
    it is not a tensor) and its tensors in the order of the description
    (None for one that is not contiguous)."""
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
    return layout, tensors


def _equal(a, b):
    """a == b, False where the comparison itself fails (a tensor among the
    values)."""
    try:
        return bool(a == b)
    except Exception:
        return False


def _sync_optimizer_state(optimizer, root_rank, skip_held):
    """broadcast_optimizer_state; with skip_held, when every worker's state
    has root's layout (the same parameters with state, entries, shapes,
    dtypes, values and hyperparameters), the tensors are synchronized in
    place by _broadcast_held: only those that differ somewhere travel."""
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
    mine, tensors = _optimizer_layout(state_dict)
    if me == root_rank and any(t is None for t in tensors):
        raise ValueError("broadcast_optimizer_state: a state tensor of rank %d is not contiguous" % me)
    layout = broadcast_object(mine if me == root_rank else None, root_rank)
    if skip_held:
        same = me == root_rank or (_equal(mine, layout) and all(t is not None for t in tensors))
        everywhere = mpi_ops.allreduce(torch.tensor([int(same)], dtype=torch.int64), op=mpi_ops.Min,
                                       name="gorovod.optimizer_layouts")
        if int(everywhere[0]) == 1:
            _broadcast_held(tensors, root_rank)
            return
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
