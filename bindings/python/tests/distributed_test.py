"""torch.distributed on the "gorovod" backend, as a DDP script uses it.

dist.init_process_group("gorovod") with nothing else (no address, port,
rank or world size); then every collective the backend offers, against
values each rank can compute alone (sparse all_reduce too; the rooted
reduce, gather and scatter also against Gloo's); monitored_barrier, passed
and failed as on Gloo; bad arguments raise; and
DistributedDataParallel trains a small model (with no_sync accumulation
and a comm hook) to the same parameters as one process training on the
concatenated batches.

Prints "PASS rank R of N". Driven by bindings/python/python_test.go.
"""

import os

import torch
import torch.distributed as dist

import gorovod.torch as hvd
import gorovod.torch.distributed  # noqa: F401 (registers the backend, sets torchrun's variables)

# torchrun's variables, there before init_process_group as under torchrun.
local_rank = int(os.environ["LOCAL_RANK"])
dist.init_process_group("gorovod")
r, n = dist.get_rank(), dist.get_world_size()
assert dist.get_backend() == "gorovod", dist.get_backend()
want_env = {"RANK": r, "WORLD_SIZE": n, "LOCAL_RANK": hvd.local_rank(), "LOCAL_WORLD_SIZE": hvd.local_size(),
            "GROUP_RANK": hvd.cross_rank()}
got_env = {k: int(os.environ[k]) for k in want_env}
if got_env != want_env or local_rank != hvd.local_rank():
    raise AssertionError("rank %d: torchrun's variables %s, want %s" % (r, got_env, want_env))

# MASTER_ADDR and MASTER_PORT name the world's store (served by rank 0): a
# client of its own sees what rank 0 wrote there.
# (through the backend's own TCPStore maker, which also takes a torch built
# without libuv, as Debian's 2.6)
master = gorovod.torch.distributed._tcp_store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), n, False)
if r == 0:
    master.set("written by rank 0", "yes")
master.wait(["written by rank 0"])
assert master.get("written by rank 0") == b"yes"
# A Gloo group beside the gorovod one (its rendezvous goes through the same
# store).
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one host
if dist.is_gloo_available():
    gloo = dist.new_group(backend="gloo")
    t = torch.tensor([float(r + 1)])
    dist.all_reduce(t, group=gloo)
    assert t.item() == n * (n + 1) / 2, t


def _root_opts(opts):
    opts.rootRank = r
    return opts


def same(what, got, want):
    if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-5, atol=1e-6):
        raise AssertionError("rank %d: %s:\ngot  %s\nwant %s" % (r, what, got.tolist(), want.tolist()))


# all_reduce: each op, sync and async.
base = torch.arange(6, dtype=torch.float32) + 1
for op, want in ((dist.ReduceOp.SUM, sum(base * (k + 1) for k in range(n))),
                 (dist.ReduceOp.MAX, base * n),
                 (dist.ReduceOp.MIN, base),
                 (dist.ReduceOp.PRODUCT, base ** n * torch.prod(torch.arange(1, n + 1, dtype=torch.float32)))):
    t = base * (r + 1)
    dist.all_reduce(t, op=op)
    same("all_reduce %s" % op, t, want)
t = torch.full((4,), float(r))
work = dist.all_reduce(t, async_op=True)
work.wait()
same("async all_reduce", t, torch.full((4,), float(sum(range(n)))))
t = torch.full((3,), float(r), dtype=torch.float64)
fut = dist.all_reduce(t, async_op=True).get_future()
same("all_reduce future", fut.wait()[0], torch.full((3,), float(sum(range(n))), dtype=torch.float64))
# What a work says of itself, done: with its output tensors, and with an
# error (an all_to_all_single into an output of the wrong size, on every
# rank: wait() raises it, exception() gives it).
t = torch.full((2,), float(r))
work = dist.all_reduce(t, async_op=True)
work.wait()
if not work.is_completed() or not work.is_success() or work.exception() is not None:
    raise AssertionError("rank %d: a done all_reduce's work: completed %s, success %s, exception %r" %
                         (r, work.is_completed(), work.is_success(), work.exception()))
same("a done all_reduce's result()", work.result()[0], torch.full((2,), float(sum(range(n)))))
same("a done all_reduce's get_future().value()", work.get_future().value()[0], torch.full((2,), float(sum(range(n)))))
work = dist.all_to_all_single(torch.empty(n + 1), torch.zeros(n), async_op=True)
try:
    work.wait()
    raise AssertionError("rank %d: all_to_all_single into an output of the wrong size: wait() returned" % r)
except RuntimeError as e:
    if "received %d elements for an output of %d" % (n, n + 1) not in str(e):
        raise
if not work.is_completed() or work.is_success() or not isinstance(work.exception(), RuntimeError):
    raise AssertionError("rank %d: a failed all_to_all_single's work: completed %s, success %s, exception %r" %
                         (r, work.is_completed(), work.is_success(), work.exception()))
del work
# The futures' values are Gloo's: all_gather's the list of the gathered
# tensors, gather's that list on the root and [] elsewhere.
value = dist.all_gather([torch.zeros(2) for _ in range(n)], torch.full((2,), float(r)),
                        async_op=True).get_future().wait()
if not isinstance(value, list) or len(value) != n or not all(isinstance(v, torch.Tensor) for v in value):
    raise AssertionError("rank %d: all_gather's future holds %r, want a list of %d tensors" % (r, value, n))
same("all_gather's future", torch.stack(value), torch.stack([torch.full((2,), float(q)) for q in range(n)]))
value = dist.gather(torch.full((2,), float(r)), [torch.zeros(2) for _ in range(n)] if r == 0 else None, dst=0,
                    async_op=True).get_future().wait()
if r == 0:
    same("gather's future on the root", torch.stack(value), torch.stack([torch.full((2,), float(q)) for q in range(n)]))
elif value != []:
    raise AssertionError("rank %d: gather's future holds %r off the root, want []" % (r, value))
ints = torch.tensor([r, 10 * r], dtype=torch.int64)
dist.all_reduce(ints)
same("int64 all_reduce", ints, torch.tensor([sum(range(n)), 10 * sum(range(n))], dtype=torch.int64))

# all_reduce of sparse COO tensors (SUM and AVG, as Gloo offers): rank r
# holds r+1 entries (ranks hold different numbers), (k, k) = r+1 for k <= r;
# the result is the coalesced sum, in place.
for op, scale in ((dist.ReduceOp.SUM, 1.0), (getattr(dist.ReduceOp, "AVG", None), 1.0 / n)):
    if op is None:
        continue
    idx = torch.arange(r + 1).repeat(2, 1)
    sp = torch.sparse_coo_tensor(idx, torch.full((r + 1,), float(r + 1)), (n, n))
    dist.all_reduce(sp, op=op)
    want = torch.diag(torch.tensor([float(sum(q + 1 for q in range(k, n))) for k in range(n)])) * scale
    if not sp.is_sparse or not sp.is_coalesced():
        raise AssertionError("rank %d: sparse all_reduce %s left a tensor sparse %s, coalesced %s" %
                             (r, op, sp.is_sparse, sp.is_sparse and sp.is_coalesced()))
    same("sparse all_reduce %s" % op, sp.to_dense(), want)

# broadcast from each root.
for root in range(n):
    t = torch.full((2, 3), float(r))
    dist.broadcast(t, src=root)
    same("broadcast from %d" % root, t, torch.full((2, 3), float(root)))

# all_gather and its tensor form.
outs = [torch.empty(2, 2) for _ in range(n)]
dist.all_gather(outs, torch.full((2, 2), float(r)))
for k in range(n):
    same("all_gather[%d]" % k, outs[k], torch.full((2, 2), float(k)))
out = torch.empty(n * 3)
getattr(dist, "all_gather_into_tensor", dist._all_gather_base)(out, torch.full((3,), float(r)))
same("all_gather_into_tensor", out, torch.arange(n, dtype=torch.float32).repeat_interleave(3))

# The coalesced calls: several tensors of different shapes in one call
# (complex ones as torch passes them, viewed as real; empty ones among them).
ts = [torch.full((2, 2), float(r + 1)), torch.full((3,), float(10 * (r + 1)), dtype=torch.float32),
      torch.ones(0)]
dist.all_reduce_coalesced(ts, op=dist.ReduceOp.SUM)
total = float(n * (n + 1) // 2)
for i, want in enumerate((torch.full((2, 2), total), torch.full((3,), 10 * total), torch.ones(0))):
    same("all_reduce_coalesced[%d]" % i, ts[i], want)
ts = [torch.full((2,), float(r + 1)), torch.full((1,), float(r + 2))]
dist.all_reduce_coalesced(ts, op=dist.ReduceOp.MAX, async_op=True).wait()
same("all_reduce_coalesced MAX", torch.cat(ts), torch.tensor([float(n)] * 2 + [float(n + 1)]))
inputs = [torch.full((2, 2), float(r)), torch.ones(0), torch.arange(3, dtype=torch.float32) + 100 * r]
outs = [[torch.empty(2, 2), torch.empty(0), torch.empty(3)] for _ in range(n)]
dist.all_gather_coalesced(outs, inputs)
for q in range(n):
    same("all_gather_coalesced[%d][0]" % q, outs[q][0], torch.full((2, 2), float(q)))
    same("all_gather_coalesced[%d][1]" % q, outs[q][1], torch.ones(0))
    same("all_gather_coalesced[%d][2]" % q, outs[q][2], torch.arange(3, dtype=torch.float32) + 100 * q)
cinputs = [torch.tensor([complex(r, -r), complex(1, r)])]
couts = [[torch.empty(2, dtype=torch.complex64)] for _ in range(n)]
dist.all_gather_coalesced(couts, cinputs)
for q in range(n):
    if couts[q][0].tolist() != [complex(q, -q), complex(1, q)]:
        raise AssertionError("rank %d: complex all_gather_coalesced[%d]: %s" % (r, q, couts[q][0].tolist()))

# reduce_scatter: rank k keeps the sum of every rank's k-th part.
parts = [torch.full((2,), float(r * 10 + k)) for k in range(n)]
out = torch.empty(2)
dist.reduce_scatter(out, parts)
same("reduce_scatter", out, torch.full((2,), float(sum(q * 10 + r for q in range(n)))))

inp = torch.cat([torch.full((2,), float(r * 10 + k)) for k in range(n)])
out = torch.empty(2)
getattr(dist, "reduce_scatter_tensor", dist._reduce_scatter_base)(out, inp)
same("reduce_scatter_tensor", out, torch.full((2,), float(sum(q * 10 + r for q in range(n)))))

# all_to_all_single, even and with split sizes; all_to_all on lists.
inp = torch.arange(n, dtype=torch.float32) + 100 * r
out = torch.empty(n)
dist.all_to_all_single(out, inp)
same("all_to_all_single", out, torch.tensor([100.0 * q + r for q in range(n)]))
# rank q sends q+1 copies of its rank to every rank: rank r gets q+1 from each q.
inp = torch.cat([torch.full((r + 1,), float(r)) for _ in range(n)])
recv = [q + 1 for q in range(n)]
out = torch.empty(sum(recv))
dist.all_to_all_single(out, inp, output_split_sizes=recv, input_split_sizes=[r + 1] * n)
same("all_to_all_single with splits", out, torch.cat([torch.full((q + 1,), float(q)) for q in range(n)]))
outs = [torch.empty(2) for _ in range(n)]
dist.all_to_all(outs, [torch.full((2,), float(r * 10 + k)) for k in range(n)])
for q in range(n):
    same("all_to_all[%d]" % q, outs[q], torch.full((2,), float(q * 10 + r)))

dist.barrier()

# monitored_barrier, as on Gloo: every rank arrives (plain and
# wait_all_ranks); then the last rank stays away: rank 0 names it, the
# others say rank 0 did not let them go; then rank 0 alone, with
# wait_all_ranks, names every other rank. The failed ones come last (a rank
# that stayed away counts one monitored barrier fewer).
import datetime  # noqa: E402
import re  # noqa: E402


def monitored_fails(pattern, **kwargs):
    try:
        dist.monitored_barrier(**kwargs)
    except RuntimeError as e:
        if not re.search(pattern, str(e)):
            raise AssertionError("rank %d: monitored_barrier raised %r, want /%s/" % (r, str(e), pattern))
        return
    raise AssertionError("rank %d: monitored_barrier passed, want /%s/" % (r, pattern))


dist.monitored_barrier(timeout=datetime.timedelta(seconds=60))
dist.monitored_barrier(timeout=datetime.timedelta(seconds=60), wait_all_ranks=True)
if n > 1:
    short = datetime.timedelta(seconds=0.5)
    if r == 0:
        monitored_fails("Rank %d failed to pass monitoredBarrier" % (n - 1), timeout=short)
        monitored_fails("Ranks %s failed to pass monitoredBarrier" % ", ".join(str(q) for q in range(1, n)),
                        timeout=short, wait_all_ranks=True)
    elif r != n - 1:
        monitored_fails("Rank %d successfully reached monitoredBarrier, but received errors while waiting for "
                        "send/recv from rank 0" % r, timeout=short)
dist.barrier()

# A C++ caller of the process group (DDP's broadcast of its module states,
# its check of the parameters, its reducer) holds only the C++ side of a
# work, and may wait on it long after the call returned, once the work's
# Python side is gone: that wait returns once the collective is done,
# however many collectives ran since. Here torch's C++ broadcast_coalesced
# issues its first bucket's broadcast, then its second, and only then waits
# on the first; the group runs 20 more collectives before the second, so the
# first is done and its Python side dropped (nothing in Python holds it)
# long before that C++ wait.
import threading  # noqa: E402
import weakref  # noqa: E402

pg = dist.distributed_c10d._get_default_group()
issued = []


def broadcast_after_others(tensors, opts=None):
    """The group's broadcast, as broadcast_coalesced calls it (from C++);
    from the second bucket on, 20 all_reduces run first."""
    if issued:
        for _ in range(20):
            dist.all_reduce(torch.zeros(1))
    work = type(pg).broadcast(pg, tensors, opts)
    issued.append(weakref.ref(work))
    return work


pg.broadcast = broadcast_after_others  # what torch's C++ calls on this group
buckets = [torch.full((4,), float(r + 1)), torch.full((4,), float(10 * (r + 1)))]
failed = []


def coalesced():
    try:
        dist._broadcast_coalesced(pg, buckets, 8, 0)  # 16-byte tensors, 8-byte buckets: one bucket each
    except Exception as e:  # noqa: BLE001 (reported below)
        failed.append(e)


waiter = threading.Thread(target=coalesced, daemon=True)
waiter.start()
waiter.join(60)
del pg.broadcast
if waiter.is_alive():
    raise AssertionError("rank %d: torch's C++ wait on a broadcast's work, done 20 collectives earlier, has not "
                         "returned in 60 s (its Python side is gone: the work's C++ side does not stand alone)" % r)
if failed:
    raise failed[0]
if len(issued) != 2:
    raise AssertionError("rank %d: broadcast_coalesced issued %d broadcasts, want 2 (one per bucket)" %
                         (r, len(issued)))
if issued[0]() is not None:
    raise AssertionError("rank %d: the first bucket's work still has its Python side (the C++ wait above did not "
                         "wait on its C++ side alone)" % r)
same("broadcast_coalesced's first bucket", buckets[0], torch.full((4,), 1.0))
same("broadcast_coalesced's second bucket", buckets[1], torch.full((4,), 10.0))

# The rooted collectives, from and to each rank, sync and async, against
# values each rank computes alone and against the same calls on the Gloo
# group beside: reduce leaves the result on dst (the others' tensors as they
# were), gather the parts in dst's list, scatter src's parts on each rank.
def rooted(g, async_op):
    """dst/src -> what each rooted call left on this rank, on group g."""
    got = {}
    for root in range(n):
        for op in ("SUM", "MAX", "MIN", "PRODUCT"):
            t = base * (r + 1) + root
            w = dist.reduce(t, dst=root, op=getattr(dist.ReduceOp, op), group=g, async_op=async_op)
            if async_op:
                w.wait()
            got["reduce", root, op] = t
        for dtype in (torch.float32, torch.int64):
            inp = (torch.arange(6, dtype=torch.float64).reshape(2, 3) + 10 * r + root).to(dtype)
            outs = [torch.full((2, 3), -1, dtype=dtype) for _ in range(n)] if r == root else None
            w = dist.gather(inp, outs, dst=root, group=g, async_op=async_op)
            if async_op:
                w.wait()
            got["gather", root, str(dtype)] = torch.stack(outs) if r == root else None
            parts = [(torch.arange(4, dtype=torch.float64) + 100 * root + 10 * q).to(dtype) for q in range(n)]
            out = torch.full((4,), -1, dtype=dtype)
            w = dist.scatter(out, parts if r == root else None, src=root, group=g, async_op=async_op)
            if async_op:
                w.wait()
            got["scatter", root, str(dtype)] = out
    return got


for async_op in (False, True):
    ours = rooted(None, async_op)
    for (call, root, kind), t in ours.items():
        what = "%s %s with root %d%s" % (call, kind, root, " (async)" if async_op else "")
        if call == "reduce":
            mine = base * (r + 1) + root
            if r != root:
                same(what + " leaves this rank's tensor", t, mine)
                continue
            each = [base * (q + 1) + root for q in range(n)]
            want = {"SUM": sum(each), "MAX": torch.stack(each).max(0).values,
                    "MIN": torch.stack(each).min(0).values, "PRODUCT": torch.stack(each).prod(0)}
            same(what, t, want[kind])
        elif call == "gather" and r == root:
            same(what, t.double(), torch.stack([torch.arange(6, dtype=torch.float64).reshape(2, 3) + 10 * q + root
                                                for q in range(n)]))
        elif call == "scatter":
            same(what, t.double(), torch.arange(4, dtype=torch.float64) + 100 * root + 10 * r)
    if dist.is_gloo_available():
        theirs = rooted(gloo, async_op)
        for key, t in ours.items():
            if key[0] == "reduce" and r != key[1]:
                continue  # Gloo leaves partial results there
            if (t is None) != (theirs[key] is None) or t is not None and not torch.equal(t, theirs[key]):
                raise AssertionError("rank %d: %s: gorovod gave %s, Gloo %s" %
                                     (r, key, None if t is None else t.tolist(),
                                      None if theirs[key] is None else theirs[key].tolist()))

# Bad arguments raise naming the call, on every rank (each calls the group
# as its root, so none waits for the others): a root outside the group, a
# root's list of the wrong length or of tensors unlike this rank's; the
# output lists of all_gather_coalesced of the wrong length or shapes.
pg = dist.group.WORLD
for name, call in (
        ("reduce", lambda: dist.reduce(torch.zeros(1), dst=n)),
        ("gather", lambda: pg.gather([[torch.zeros(3)] * n], [torch.zeros(2)], _root_opts(dist.GatherOptions()))),
        ("gather", lambda: pg.gather([[torch.zeros(2)] * (n + 1)], [torch.zeros(2)],
                                     _root_opts(dist.GatherOptions()))),
        ("scatter", lambda: pg.scatter([torch.zeros(2)], [[torch.zeros(2, dtype=torch.int64)] * n],
                                       _root_opts(dist.ScatterOptions()))),
        ("allgather_coalesced", lambda: dist.all_gather_coalesced([[torch.zeros(2)]] * (n + 1), [torch.zeros(2)])),
        ("allgather_coalesced", lambda: dist.all_gather_coalesced([[torch.zeros(3)]] * n, [torch.zeros(2)]))):
    try:
        call()
    except RuntimeError as e:
        if "gorovod backend" not in str(e) or name not in str(e):
            raise AssertionError("rank %d: %s raised %r, want gorovod's message naming it" % (r, name, e))
    else:
        raise AssertionError("rank %d: %s with bad arguments did not raise" % (r, name))

# DistributedDataParallel: the same steps as one process on the whole batch.
torch.manual_seed(1)

# Over 1 MiB of parameters: DDP's first bucket holds at most 1 MiB, so the
# gradients travel in several buckets.
def net():
    return torch.nn.Sequential(torch.nn.Linear(8, 512), torch.nn.ReLU(), torch.nn.Linear(512, 600), torch.nn.ReLU(),
                               torch.nn.Linear(600, 3))


model, reference = net(), net()
reference.load_state_dict(model.state_dict())
if r != 0:  # DDP broadcasts rank 0's parameters at construction
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.5)
hook_calls = []


def counting_allreduce(state, bucket):
    hook_calls.append(bucket.index())
    t = bucket.buffer()
    return dist.all_reduce(t.div_(n), async_op=True).get_future().then(lambda f: f.value()[0])


if n > 1:
    ddp.register_comm_hook(None, counting_allreduce)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
per_rank, steps, micro = 4, 3, 2
for step in range(steps):
    g = torch.Generator().manual_seed(100 + step)
    xs = torch.randn(micro, n * per_rank, 8, generator=g)
    ys = torch.randint(0, 3, (micro, n * per_rank), generator=g)
    opt.zero_grad()
    for m in range(micro):
        x, y = xs[m, r * per_rank:(r + 1) * per_rank], ys[m, r * per_rank:(r + 1) * per_rank]
        if m < micro - 1:
            with ddp.no_sync():  # accumulate locally, reduce on the last micro-batch
                torch.nn.functional.cross_entropy(ddp(x), y).backward()
        else:
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
    opt.step()
    ref_opt.zero_grad()
    for m in range(micro):
        torch.nn.functional.cross_entropy(reference(xs[m]), ys[m]).backward()
    ref_opt.step()
for (name, p), q in zip(model.named_parameters(), reference.parameters()):
    same("DDP parameter %s after %d steps" % (name, steps), p.detach(), q.detach())
    everyone = [torch.empty_like(p) for _ in range(n)]
    dist.all_gather(everyone, p.detach().contiguous())
    for k in range(n):
        same("rank %d's %s" % (k, name), everyone[k], p.detach())
if n > 1 and len(set(hook_calls)) < 2:
    raise AssertionError("rank %d: the comm hook saw buckets %s, want several" % (r, sorted(set(hook_calls))))

dist.destroy_process_group()
print("PASS rank %d of %d" % (r, n), flush=True)
