"""TorchState.sync sends only the tensors that differ on some worker: each
case below gives the workers a model and an optimizer that agree or differ
in known places, counts the tensors that sync() broadcasts (by wrapping
mpi_ops.grouped_broadcast_), and checks that every worker ends with rank
0's state, bit for bit. Also the digests themselves: the device digest
(run here on CPU tensors, the same code a GPU runs) and the host digest
tell apart what they must.

Prints "PASS rank R of N". Driven by bindings/python/python_test.go.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

import gorovod.torch as hvd
from gorovod.torch import functions, mpi_ops

hvd.init()
me, n = hvd.rank(), hvd.size()
last = n - 1
torch.set_num_threads(1)

sent = []
_grouped_broadcast = mpi_ops.grouped_broadcast_


def counting_broadcast(tensors, root_rank):
    tensors = list(tensors)
    sent.extend(tensors)
    return _grouped_broadcast(tensors, root_rank)


mpi_ops.grouped_broadcast_ = counting_broadcast


def model_fn():
    torch.manual_seed(7)
    return nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))


def train(model, optimizer, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        optimizer.zero_grad()
        x, y = torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()


def tensors_of(model, optimizer):
    out = [("model." + k, v) for k, v in sorted(model.state_dict().items())]
    for pid, entries in sorted(optimizer.state_dict()["state"].items()):
        for key, v in sorted(entries.items()):
            if torch.is_tensor(v):
                out.append(("optimizer.%d.%s" % (pid, key), v))
    return out


def same_as_rank0(model, optimizer, case):
    for name, t in tensors_of(model, optimizer):
        flat = t.detach().reshape(1, -1).to(torch.float64)
        every = hvd.allgather(flat)
        for q in range(n):
            if not torch.equal(every[q], every[0]):
                raise AssertionError("%s: %s differs between rank 0 and rank %d after sync" % (case, name, q))


def make(case):
    """Each case: the workers' model and optimizer before sync, and the
    names of the tensors sync must send."""
    model = model_fn()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if case == "identical":
        # A world that only lost members: everyone committed the same step.
        train(model, optimizer, 3, seed=1)
        return model, optimizer, set()
    if case == "one bias differs on the last rank":
        train(model, optimizer, 3, seed=1)
        if me == last:
            with torch.no_grad():
                model[3].bias[1] += 1.0
        return model, optimizer, {"model.3.bias"}
    if case == "one momentum buffer differs on rank 0":
        train(model, optimizer, 3, seed=1)
        if me == 0:
            buf = optimizer.state[model[0].weight]["momentum_buffer"]
            buf.view(-1)[5] = 42.0
        return model, optimizer, {"optimizer.0.momentum_buffer"}
    if case == "joiner with the frozen layers, a fresh head and no optimizer state":
        # Rank 0.. hold the trained job; the last rank is a joiner that
        # loaded the same pretrained first layer (frozen) and has a new
        # head, batch norm and an empty optimizer: everything but the
        # frozen layer travels, the optimizer state whole.
        for p in model[0].parameters():
            p.requires_grad_(False)
        optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1, momentum=0.9)
        if me != last:
            train(model, optimizer, 3, seed=1)
        want = {"model.1.bias", "model.1.weight", "model.1.running_mean", "model.1.running_var",
                "model.1.num_batches_tracked", "model.3.bias", "model.3.weight"}
        if n == 1:
            want = set()
        return model, optimizer, want | ({"optimizer.*"} if n > 1 else set())
    raise ValueError(case)


cases = ["identical", "one bias differs on the last rank", "one momentum buffer differs on rank 0",
         "joiner with the frozen layers, a fresh head and no optimizer state"]
for case in cases:
    model, optimizer, want = make(case)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, epoch=3)
    # By address: state_dict() detaches, a new tensor object each time.
    names = {t.data_ptr(): name for name, t in tensors_of(model, optimizer)}
    del sent[:]
    state.sync()
    got = set()
    for t in sent:
        name = names.get(t.data_ptr(), "optimizer.*")  # a joiner's fresh optimizer state
        if "optimizer.*" in want and name.startswith("optimizer."):
            name = "optimizer.*"
        got.add(name)
    if got != want:
        raise AssertionError("%s: sync sent %s, want %s" % (case, sorted(got), sorted(want)))
    same_as_rank0(state.model, state.optimizer, case)
    # The state trains on alike everywhere after the sync.
    train(state.model, state.optimizer, 2, seed=2)
    same_as_rank0(state.model, state.optimizer, case + ", then 2 steps")
    if state.epoch != 3:
        raise AssertionError("%s: epoch %r" % (case, state.epoch))

# The digests: equal bytes alike, any difference (a bit, the length, the
# dtype, the shape, the order of blocks) told apart.
keys = functions._digest_keys(torch.device("cpu"))
words = functions._DIGEST_WORDS


def dev(t):
    return int(functions._device_digest(t, keys))


def host(t):
    return functions._digests([t])[0]


base = torch.randn(2 * words + 3, generator=torch.Generator().manual_seed(5))
flipped = base.clone()
flipped.view(torch.int32)[words + 17] ^= 1  # one bit, in the second block
swapped = torch.cat([base[words:2 * words], base[:words], base[2 * words:]])
checks = [
    ("same bytes, device digest", dev(base) == dev(base.clone())),
    ("same bytes, host digest", host(base) == host(base.clone())),
    ("one bit, device digest", dev(base) != dev(flipped)),
    ("one bit, host digest", host(base) != host(flipped)),
    ("two blocks swapped, device digest", dev(base) != dev(swapped)),
    ("trailing zero byte, device digest",
     dev(torch.tensor([1, 2, 3], dtype=torch.uint8)) != dev(torch.tensor([1, 2, 3, 0], dtype=torch.uint8))),
    ("dtype, host digest", host(torch.zeros(4, dtype=torch.int32)) != host(torch.zeros(4, dtype=torch.float32))),
    ("shape, host digest", host(torch.zeros(2, 3)) != host(torch.zeros(3, 2))),
    ("a float16 slice at an odd offset, device digest",
     dev(base[:20].half()[1:9]) == dev(base[:20].half()[1:9].clone())),
    ("bool tensor, device digest", dev(torch.tensor([True, False])) != dev(torch.tensor([False, True]))),
    ("non-contiguous, host digest", host(base[:10].view(2, 5).t()) == host(base[:10].view(2, 5).t().contiguous())),
]
for what, ok in checks:
    if not ok:
        raise AssertionError("digest: " + what)
# Every process computes the same digests (the device digest's multipliers
# come from a fixed seed, the host's is xxHash64).
mine = torch.tensor([dev(base) & ((1 << 62) - 1), host(base) & ((1 << 62) - 1)], dtype=torch.int64)
every = hvd.allgather(mine.reshape(1, -1))
for q in range(n):
    if not torch.equal(every[q], every[0]):
        raise AssertionError("rank %d's digests of the same tensor differ from rank 0's" % q)

print("PASS rank %d of %d" % (me, n), flush=True)
hvd.shutdown()
