"""gorovod.torch on CUDA tensors, for a machine with a GPU and its NVIDIA
driver (libgorovod loads it at run time). Run it as several workers:

    GOROVOD_LIBRARY=/path/to/libgorovod.so PYTHONPATH=bindings/python \\
        gorovod run --np 2 -- python3 bindings/python/tests/gpu_cuda_tensors.py

Every worker may share one GPU (each uses local_rank % device_count). Each
check is computed on the GPU through gorovod and compared with what the CPU
computes from every rank's inputs, which each rank rebuilds from the rank
number. Prints one line per check and rank, "PASS name" or "FAIL name: why",
then "DONE rank R: P passed, F failed", and exits 1 when any check failed
(2 when there is no GPU or the library takes no CUDA memory).

With --cpu it runs the same checks on CPU tensors (but for the stream
ordering ones) with any library: that is how CI, which has no GPU, keeps the
checks themselves right (TestGPUScriptOnCPU in python_test.go).
"""

import copy
import faulthandler
import os
import sys
import time
import traceback

# A check that fails on one rank only can leave the other waiting in a
# collective: bound that wait (seconds), and the whole run.
os.environ.setdefault("GOROVOD_IO_TIMEOUT", "120")
faulthandler.dump_traceback_later(int(os.environ.get("GPU_TEST_TIMEOUT", "480")), exit=True)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gorovod.torch as hvd  # noqa: E402
from gorovod.torch import mpi_ops  # noqa: E402

results = {"pass": 0, "fail": 0}


def say(line):
    print("[rank %d] %s" % (hvd.rank(), line), flush=True)


def check(name, fn):
    """Runs one check; every rank runs every check, so that the ranks'
    collectives stay paired when one check fails on one rank."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 (reported, then the next check)
        results["fail"] += 1
        say("FAIL %s: %s: %s" % (name, type(e).__name__, e))
        traceback.print_exc()
        return
    results["pass"] += 1
    say("PASS %s" % name)


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def same(got, want, what, rtol=0.0, atol=0.0):
    """got (a CUDA tensor) equals want (a CPU tensor), exactly by default."""
    expect(got.device == DEV, "%s: result on %s, want %s" % (what, got.device, DEV))
    expect(got.dtype == want.dtype, "%s: dtype %s, want %s" % (what, got.dtype, want.dtype))
    expect(tuple(got.shape) == tuple(want.shape), "%s: shape %s, want %s" % (what, tuple(got.shape), tuple(want.shape)))
    g = got.cpu()
    if rtol == 0 and atol == 0:
        if not torch.equal(g, want):
            bad = (g != want).nonzero()[:3].tolist()
            raise AssertionError("%s: differs at %s: got %s, want %s" % (
                what, bad, [g[tuple(i)].item() for i in bad], [want[tuple(i)].item() for i in bad]))
    elif not torch.allclose(g.double(), want.double(), rtol=rtol, atol=atol):
        diff = (g.double() - want.double()).abs().max().item()
        raise AssertionError("%s: max difference %g (rtol %g, atol %g)" % (what, diff, rtol, atol))


# Inputs go to the device with copy=True: with --cpu, .to(DEV) would return
# the tensor itself, and an in-place collective would change the expectation.

def inputs(r, n, dtype):
    """Rank r's input: small integers, exact in every dtype and in sums of a
    few ranks (bfloat16 holds integers up to 256 exactly)."""
    return ((torch.arange(n, dtype=torch.int64) * 7 + 3 * r) % 23 - 11).to(dtype)


def everyone(fn):
    return [fn(r) for r in range(SIZE)]


# ---- Allreduce ----

def allreduce_sum_and_average():
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for n in (1, 1000, 3 << 20 if dtype == torch.float32 else 1 << 18):
            name = "%s n=%d" % (dtype, n)
            ins = everyone(lambda r: inputs(r, n, dtype))
            total = sum(x.double() for x in ins)
            mine = ins[RANK].to(DEV, copy=True)
            out = hvd.allreduce(mine, op=hvd.Sum)
            same(out, total.to(dtype), "sum " + name)
            same(mine, ins[RANK], "the input of an out-of-place allreduce " + name)
            avg = hvd.allreduce(mine, op=hvd.Average)
            # The average's division rounds once in the tensor's dtype.
            same(avg, (total / SIZE).to(dtype), "average " + name, rtol=1e-2 if dtype != torch.float32 else 1e-6,
                 atol=1e-2 if dtype != torch.float32 else 1e-6)
            inplace = ins[RANK].to(DEV, copy=True)
            got = hvd.allreduce_(inplace, op=hvd.Sum)
            expect(got is inplace, "allreduce_ returned another tensor")
            same(inplace, total.to(dtype), "in-place sum " + name)


def allreduce_scaled():
    ins = everyone(lambda r: inputs(r, 4096, torch.float32))
    total = sum(x.double() for x in ins)
    out = hvd.allreduce(ins[RANK].to(DEV, copy=True), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25)
    same(out, (total * 0.5).float(), "sum with prescale 2 and postscale 0.25", rtol=1e-6, atol=1e-6)
    half = hvd.allreduce(ins[RANK].half().to(DEV, copy=True), op=hvd.Average, postscale_factor=2.0)
    same(half, (total / SIZE * 2).half(), "float16 average with postscale 2", rtol=1e-2, atol=1e-2)


def allreduce_async_synchronize():
    ns = [17, 1 << 16, 1 << 20, 5]
    ins = [everyone(lambda r, n=n, k=k: inputs(r + k, n, torch.float32)) for k, n in enumerate(ns)]
    handles, outs = [], []
    for k in range(len(ns)):
        t = ins[k][RANK].to(DEV, copy=True)
        if k % 2:
            handles.append(hvd.allreduce_async_(t, op=hvd.Sum, name="async.%d" % k))
            outs.append(t)
        else:
            handles.append(hvd.allreduce_async(t, op=hvd.Sum, name="async.%d" % k))
            outs.append(None)
    for k in reversed(range(len(ns))):  # collected in the reverse order
        result = hvd.synchronize(handles[k])
        got = outs[k] if outs[k] is not None else result
        same(got, sum(x.double() for x in ins[k]).float(), "async allreduce %d" % k)
    h = hvd.allreduce_async(ins[0][RANK].to(DEV, copy=True), op=hvd.Sum)
    while not hvd.poll(h):
        time.sleep(0.001)
    same(hvd.synchronize(h), sum(x.double() for x in ins[0]).float(), "allreduce after poll")


def grouped_allreduce():
    spec = [(torch.float32, 1000), (torch.float16, 333), (torch.bfloat16, 64), (torch.float32, 1 << 20),
            (torch.float64, 9), (torch.int32, 100), (torch.int64, 7)]
    ins = [everyone(lambda r, n=n, d=d: inputs(r, n, d)) for d, n in spec]
    outs = hvd.grouped_allreduce([x[RANK].to(DEV, copy=True) for x in ins], op=hvd.Sum)
    for (d, n), x, out in zip(spec, ins, outs):
        same(out, sum(v.double() for v in x).to(d), "grouped %s n=%d" % (d, n))
    tensors = [x[RANK].to(DEV, copy=True) for x in ins]
    h = hvd.grouped_allreduce_async_(tensors, op=hvd.Sum)
    hvd.synchronize(h)
    for (d, n), x, t in zip(spec, ins, tensors):
        same(t, sum(v.double() for v in x).to(d), "grouped async in place %s n=%d" % (d, n))


def compression_fp16():
    ins = everyone(lambda r: torch.linspace(-1, 1, 5000, dtype=torch.float32) * (r + 1))
    out = hvd.allreduce(ins[RANK].to(DEV, copy=True), op=hvd.Average, compression=hvd.Compression.fp16)
    want = (sum(x.double() for x in ins) / SIZE).float()
    same(out, want, "fp16-compressed average", rtol=2e-3, atol=2e-3)
    outs = hvd.grouped_allreduce([ins[RANK].to(DEV, copy=True), ins[RANK][:10].double().to(DEV, copy=True)], op=hvd.Sum,
                                 compression=hvd.Compression.fp16)
    same(outs[0], sum(x.double() for x in ins).float(), "fp16-compressed grouped sum", rtol=2e-3, atol=2e-3)
    same(outs[1], sum(x[:10].double() for x in ins), "fp16-compressed grouped float64 sum", rtol=2e-3, atol=2e-3)


# ---- Stream ordering ----

def long_work(n=8192, rounds=12):
    """Queues work that keeps the current stream busy for a while (a chain
    of large float32 products)."""
    a = torch.randn(n, n, device=DEV) / n ** 0.5
    b = a
    for _ in range(rounds):
        b = b @ a
    return b


def stream_ordering():
    n = 1 << 20
    for where in ("current stream", "side stream"):
        t = torch.full((n,), -100.0, device=DEV)
        torch.cuda.synchronize()  # setup only: t holds -100 everywhere
        stream = torch.cuda.current_stream(DEV) if where == "current stream" else torch.cuda.Stream(DEV)
        with torch.cuda.stream(stream):
            sink = long_work()
            t.fill_(RANK + 1)  # queued behind the products: written long after the call is made
            started = time.perf_counter()
            hvd.allreduce_(t, op=hvd.Sum)
            # The result is in place for work queued next on the stream.
            t.mul_(2)
            doubled = t.clone()
        elapsed = time.perf_counter() - started
        # same() copies to the CPU on the default stream: after the side
        # stream's work, without blocking the host here.
        torch.cuda.current_stream(DEV).wait_stream(stream)
        del sink
        want = torch.full((n,), float(SIZE * (SIZE + 1)), dtype=torch.float32)
        same(doubled, want, "an allreduce of a tensor the %s was still writing (%.3f s)" % (where, elapsed))


def stream_ordering_named_side_stream():
    """A named allgather's data step runs on a thread of the binding's own:
    it must still follow the caller's (side) stream."""
    n = 1 << 16
    t = torch.full((n,), -100.0, device=DEV)
    torch.cuda.synchronize()
    side = torch.cuda.Stream(DEV)
    with torch.cuda.stream(side):
        sink = long_work(rounds=6)
        t.fill_(RANK + 1)
        h = hvd.allgather_async(t, name="side.gather")
    out = hvd.synchronize(h)
    torch.cuda.current_stream(DEV).wait_stream(side)
    del sink
    want = torch.cat([torch.full((n,), float(r + 1)) for r in range(SIZE)])
    same(out, want, "a named allgather of a tensor a side stream was still writing")


def stream_ordering_async():
    n = 1 << 18
    t = torch.full((n,), -100.0, device=DEV)
    torch.cuda.synchronize()
    sink = long_work(rounds=6)
    t.fill_(RANK + 1)
    h = hvd.allreduce_async_(t, op=hvd.Sum)
    sink2 = long_work(rounds=2)  # more work queued while the allreduce waits
    hvd.synchronize(h)
    del sink, sink2
    same(t, torch.full((n,), float(SIZE * (SIZE + 1) // 2)), "async allreduce behind a busy stream")


# ---- The other collectives ----

def allgather():
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.uint8):
        def part(r):
            return (torch.arange((r + 1) * 3, dtype=torch.int64).reshape(r + 1, 3) + 10 * r).to(dtype)
        out = hvd.allgather(part(RANK).to(DEV, copy=True))
        same(out, torch.cat(everyone(part)), "allgather %s" % dtype)
    h = hvd.allgather_async(part(RANK).to(DEV, copy=True), name="gather.async")
    same(hvd.synchronize(h), torch.cat(everyone(part)), "allgather async")


def broadcast():
    root = SIZE - 1
    for dtype in (torch.float32, torch.float16, torch.int32, torch.bool):
        def val(r):
            return (torch.arange(1000) % 5 + r).to(dtype)
        t = val(RANK).to(DEV, copy=True)
        hvd.broadcast_(t, root_rank=root)
        same(t, val(root), "broadcast_ %s" % dtype)
        src = val(RANK).to(DEV, copy=True)
        out = hvd.broadcast(src, root_rank=0)
        same(out, val(0), "broadcast %s" % dtype)
        same(src, val(RANK), "broadcast's input %s" % dtype)


def alltoall():
    # Rank r sends j+1 rows to rank j, each row [r, j, k].
    def rows(r):
        return torch.cat([torch.tensor([[r, j, k] for k in range(j + 1)], dtype=torch.float32) for j in range(SIZE)])
    splits = [j + 1 for j in range(SIZE)]
    out, received = hvd.alltoall(rows(RANK).to(DEV, copy=True), splits=splits)
    want = torch.cat([torch.tensor([[r, RANK, k] for k in range(RANK + 1)], dtype=torch.float32) for r in range(SIZE)])
    same(out, want, "alltoall with splits")
    expect(received.tolist() == [RANK + 1] * SIZE, "alltoall received splits %s" % received.tolist())
    even = torch.arange(SIZE * 4, dtype=torch.float32).reshape(SIZE * 2, 2) + 100 * RANK
    out = hvd.alltoall(even.to(DEV, copy=True))
    want = torch.cat([(torch.arange(SIZE * 4, dtype=torch.float32).reshape(SIZE * 2, 2) + 100 * r)[2 * RANK:2 * RANK + 2]
                      for r in range(SIZE)])
    same(out, want, "alltoall even")


def reducescatter():
    rows = 2 * SIZE + 1
    ins = everyone(lambda r: inputs(r, rows * 4, torch.float32).reshape(rows, 4))
    total = sum(x.double() for x in ins).float()
    out = hvd.reducescatter(ins[RANK].to(DEV, copy=True), op=hvd.Sum)
    share = [rows // SIZE + (1 if r < rows % SIZE else 0) for r in range(SIZE)]
    start = sum(share[:RANK])
    same(out, total[start:start + share[RANK]], "reducescatter sum")


# ---- Training ----

def model_fn(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def batch(r):
    g = torch.Generator().manual_seed(1000 + r)
    return torch.randn(32, 16, generator=g), torch.randint(0, 4, (32,), generator=g)


def optimizer_step(compression, tol):
    model = model_fn(1234 + RANK).to(DEV)  # a different start on every rank...
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # ...until rank 0's is broadcast
    reference = model_fn(1234)  # rank 0's, on the CPU
    for p, q in zip(model.parameters(), reference.parameters()):
        same(p.detach(), q.detach(), "broadcast_parameters")
    lr = 0.1
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                   named_parameters=model.named_parameters(), compression=compression)
    x, y = batch(RANK)
    opt.zero_grad()
    F.cross_entropy(model(x.to(DEV, copy=True)), y.to(DEV, copy=True)).backward()
    opt.step()
    # The reference step: every rank's gradient on the CPU, averaged.
    grads = []
    for r in range(SIZE):
        m = copy.deepcopy(reference)
        xr, yr = batch(r)
        F.cross_entropy(m(xr), yr).backward()
        grads.append([p.grad.double() for p in m.parameters()])
    for i, (p, q) in enumerate(zip(model.parameters(), reference.parameters())):
        avg = sum(g[i] for g in grads) / SIZE
        same(p.detach(), (q.detach().double() - lr * avg).float(), "parameter %d after one step" % i, rtol=tol,
             atol=tol)
    flat = torch.cat([p.detach().reshape(1, -1) for p in model.parameters()], dim=1)
    every = hvd.allgather(flat)
    for r in range(SIZE):
        expect(torch.equal(every[r], every[0]), "parameters differ between rank 0 and rank %d" % r)


def torch_state_sync():
    model = model_fn(99 + RANK).to(DEV)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = batch(RANK)
    F.cross_entropy(model(x.to(DEV, copy=True)), y.to(DEV, copy=True)).backward()
    opt.step()  # rank-dependent parameters and state (exp_avg on the GPU, step as the optimizer keeps it)
    state = hvd.elastic.TorchState(model=model, optimizer=opt, epoch=RANK)
    state.sync()
    expect(state.epoch == 0, "epoch after sync: %s" % state.epoch)
    flat = torch.cat([p.detach().reshape(1, -1) for p in model.parameters()], dim=1)
    every = hvd.allgather(flat)
    for r in range(SIZE):
        expect(torch.equal(every[r], every[0]), "parameters differ between rank 0 and rank %d after sync" % r)
    for p in model.parameters():
        expect(p.device == DEV, "a parameter moved to %s" % p.device)
        s = opt.state[p]
        expect(s["exp_avg"].device == DEV, "exp_avg on %s" % s["exp_avg"].device)
        every = hvd.allgather(s["exp_avg"].reshape(1, -1).contiguous())
        for r in range(SIZE):
            expect(torch.equal(every[r], every[0]), "exp_avg differs between rank 0 and rank %d" % r)
    # Synced: every worker holds the same state now, so a second sync sends
    # no tensor (the digests, on the GPU for CUDA tensors, agree in every
    # process); then one changed parameter on the last rank travels alone.
    sent = []
    plain = mpi_ops.grouped_broadcast_

    def counting(tensors, root_rank):
        tensors = list(tensors)
        sent.extend(tensors)
        return plain(tensors, root_rank)

    mpi_ops.grouped_broadcast_ = counting
    try:
        state.sync()
        expect(not sent, "a second sync of the same state sent %d tensors" % len(sent))
        if SIZE == 1:
            return
        last = list(model.parameters())[-1]
        if RANK == SIZE - 1:
            with torch.no_grad():
                last.view(-1)[0] += 1.0
        state.sync()
        expect(len(sent) == 1 and sent[0].data_ptr() == last.data_ptr(),
               "after one parameter changed on rank %d, sync sent %d tensors" % (SIZE - 1, len(sent)))
        every = hvd.allgather(last.detach().reshape(1, -1))
        for r in range(SIZE):
            expect(torch.equal(every[r], every[0]), "the changed parameter differs on rank %d after sync" % r)
    finally:
        mpi_ops.grouped_broadcast_ = plain


def main():
    global RANK, SIZE, DEV
    cpu = "--cpu" in sys.argv[1:]
    hvd.init()
    RANK, SIZE = hvd.rank(), hvd.size()
    if cpu:
        DEV = torch.device("cpu")
        say("world of %d, CPU tensors (--cpu), torch %s" % (SIZE, torch.__version__))
    else:
        if not torch.cuda.is_available():
            say("SKIP: torch sees no GPU")
            sys.exit(2)
        if not hvd.cuda_built():
            say("FAIL cuda_built: the library (GOROVOD_LIBRARY=%s) takes no CUDA memory (a libgorovod older than "
                "this package?)" % os.environ.get("GOROVOD_LIBRARY"))
            sys.exit(2)
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
        DEV = torch.device("cuda", torch.cuda.current_device())
        say("world of %d, %s (%s), torch %s" % (SIZE, DEV, torch.cuda.get_device_name(DEV), torch.__version__))
        torch.backends.cuda.matmul.allow_tf32 = False
    check("allreduce sum/average f32 f16 bf16, in place and out", allreduce_sum_and_average)
    check("allreduce with scale factors", allreduce_scaled)
    check("allreduce async + synchronize", allreduce_async_synchronize)
    check("grouped allreduce", grouped_allreduce)
    check("Compression.fp16", compression_fp16)
    if not cpu:
        check("stream ordering", stream_ordering)
        check("stream ordering async", stream_ordering_async)
        check("stream ordering, named call on a side stream", stream_ordering_named_side_stream)
    check("allgather", allgather)
    check("broadcast", broadcast)
    check("alltoall", alltoall)
    check("reducescatter", reducescatter)
    check("DistributedOptimizer one step", lambda: optimizer_step(hvd.Compression.none, 1e-5))
    check("DistributedOptimizer one step, Compression.fp16", lambda: optimizer_step(hvd.Compression.fp16, 2e-3))
    check("elastic TorchState sync", torch_state_sync)
    say("DONE rank %d: %d passed, %d failed" % (RANK, results["pass"], results["fail"]))
    hvd.shutdown()
    sys.exit(1 if results["fail"] else 0)


if __name__ == "__main__":
    main()
