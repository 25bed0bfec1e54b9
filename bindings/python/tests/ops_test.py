"""Every collective of gorovod.torch, for every dtype and reduce op, against
torch's own result. Each rank builds every rank's input from (rank, seed), so
it can compute the expected result itself. Run alone or under
`gorovod run --np N --min-np N`; prints "PASS rank R of N" at the end.

Driven by bindings/python/python_test.go.
"""

import sys

import torch

import gorovod.torch as hvd
from gorovod import _core
from gorovod.torch import mpi_ops

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8]
OPS = [("Sum", hvd.Sum), ("Average", hvd.Average), ("Min", hvd.Min), ("Max", hvd.Max), ("Product", hvd.Product)]


def expect_raises(exc, fn, what):
    try:
        fn()
    except exc as e:
        return e
    raise AssertionError("%s: expected %s" % (what, exc.__name__))


def inputs(r, dtype, n=37):
    g = torch.Generator().manual_seed(1000 + r)
    # Small positive integers: exact in every dtype, products stay < 256.
    return torch.randint(1, 4, (n,), generator=g).to(dtype)


def reference(op, dtype, size):
    xs = [inputs(r, dtype).to(torch.float64) for r in range(size)]
    s = torch.stack(xs)
    if op == hvd.Sum:
        out = s.sum(0)
    elif op == hvd.Average:
        out = s.sum(0) / size
        if not dtype.is_floating_point:
            out = torch.trunc(out)
    elif op == hvd.Min:
        out = s.min(0).values
    elif op == hvd.Max:
        out = s.max(0).values
    else:
        out = s.prod(0)
    return out


def close(got, want, dtype, what):
    tol = {torch.float16: 1e-2, torch.bfloat16: 2e-2}.get(dtype, 1e-6)
    got64 = got.to(torch.float64)
    if not torch.allclose(got64, want, rtol=tol, atol=tol):
        raise AssertionError("%s: got %s, want %s" % (what, got64[:8].tolist(), want[:8].tolist()))


def main():
    # Before init: a clear error, no crash.
    expect_raises(ValueError, hvd.rank, "rank before init")
    expect_raises(ValueError, lambda: hvd.allreduce(torch.ones(3)), "allreduce before init")
    assert not hvd.is_initialized()

    hvd.init()
    assert hvd.is_initialized()
    r, n = hvd.rank(), hvd.size()
    assert 0 <= r < n
    assert hvd.local_size() == n and hvd.local_rank() == r, "one host: local = global"
    assert hvd.cross_size() == 1 and hvd.cross_rank() == 0

    # Allreduce: every dtype x op, out of place, in place, async.
    for dtype in DTYPES:
        for name, op in OPS:
            what = "allreduce %s %s" % (dtype, name)
            want = reference(op, dtype, n)
            x = inputs(r, dtype)
            before = x.clone()
            out = hvd.allreduce(x, op=op)
            assert out.dtype == dtype and out.shape == x.shape, what
            assert torch.equal(x, before), what + ": the input changed"
            close(out, want, dtype, what)

            y = inputs(r, dtype)
            res = hvd.allreduce_(y, op=op)
            assert res is y, what + ": allreduce_ must return its input"
            close(y, want, dtype, what + " in place")

            h = hvd.allreduce_async(inputs(r, dtype), op=op)
            close(hvd.synchronize(h), want, dtype, what + " async")

            z = inputs(r, dtype)
            h = hvd.allreduce_async_(z, op=op)
            while not hvd.poll(h):
                pass
            assert hvd.synchronize(h) is z
            close(z, want, dtype, what + " async in place")

    # The deprecated average= argument, prescale and postscale.
    close(hvd.allreduce(inputs(r, torch.float32), average=False), reference(hvd.Sum, torch.float32, n),
          torch.float32, "average=False")
    close(hvd.allreduce(inputs(r, torch.float32), op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0),
          reference(hvd.Sum, torch.float32, n) * 1.5, torch.float32, "prescale/postscale")

    # A 2-D tensor keeps its shape.
    m = torch.arange(12, dtype=torch.float32).view(3, 4) * (r + 1)
    out = hvd.allreduce(m, op=hvd.Sum)
    assert out.shape == (3, 4)
    close(out, (torch.arange(12, dtype=torch.float64).view(3, 4) * sum(range(1, n + 1))), torch.float32, "2-D")

    # Grouped allreduce of mixed dtypes.
    group = [inputs(r, d) for d in DTYPES]
    outs = hvd.grouped_allreduce(group, op=hvd.Sum)
    for d, o in zip(DTYPES, outs):
        close(o, reference(hvd.Sum, d, n), d, "grouped allreduce %s" % d)
    hvd.grouped_allreduce_(group, op=hvd.Max)
    for d, o in zip(DTYPES, group):
        close(o, reference(hvd.Max, d, n), d, "grouped allreduce_ %s" % d)

    # Allgather: uneven first dimensions, every dtype and bool (moved as bytes).
    for dtype in DTYPES + [torch.bool]:
        mine = torch.full((r + 1, 3), r % 2 if dtype == torch.bool else r + 1).to(dtype)
        got = hvd.allgather(mine)
        want = torch.cat([torch.full((q + 1, 3), q % 2 if dtype == torch.bool else q + 1).to(dtype) for q in range(n)])
        assert got.dtype == dtype and torch.equal(got, want), "allgather %s: %s" % (dtype, got)
    h = hvd.allgather_async(torch.tensor([r], dtype=torch.int64))
    assert hvd.synchronize(h).tolist() == list(range(n))

    # Broadcast from the last rank: out of place and in place.
    root = n - 1
    for dtype in DTYPES:
        x = inputs(r, dtype)
        got = hvd.broadcast(x, root)
        assert torch.equal(got, inputs(root, dtype)), "broadcast %s" % dtype
        assert torch.equal(x, inputs(r, dtype)), "broadcast changed its input"
        res = hvd.broadcast_(x, root)
        assert res is x and torch.equal(x, inputs(root, dtype)), "broadcast_ %s" % dtype
    h = hvd.broadcast_async_(torch.full((4,), float(r)), 0)
    assert hvd.synchronize(h).sum().item() == 0

    # Alltoall: even, then with splits (rank r sends q+1 rows to rank q).
    for dtype in DTYPES:
        x = torch.arange(2 * n, dtype=torch.float64).to(dtype) + r
        got = hvd.alltoall(x)
        want = torch.cat([(torch.arange(2 * n, dtype=torch.float64)[2 * r:2 * r + 2] + q).to(dtype) for q in range(n)])
        assert torch.equal(got, want), "alltoall %s: %s vs %s" % (dtype, got, want)
    splits = [q + 1 for q in range(n)]
    x = torch.cat([torch.full((q + 1, 2), 10 * r + q, dtype=torch.int32) for q in range(n)])
    got, received = hvd.alltoall(x, splits=splits)
    assert received.tolist() == [r + 1] * n, received
    want = torch.cat([torch.full((r + 1, 2), 10 * q + r, dtype=torch.int32) for q in range(n)])
    assert torch.equal(got, want), "alltoall splits"

    # Reducescatter (Sum and Average).
    rows = 2 * n + 1
    x = torch.arange(rows * 2, dtype=torch.float32).view(rows, 2) * (r + 1)
    total = torch.arange(rows * 2, dtype=torch.float32).view(rows, 2) * sum(range(1, n + 1))
    share = [rows // n + (1 if q < rows % n else 0) for q in range(n)]
    start = sum(share[:r])
    got = hvd.reducescatter(x, op=hvd.Sum)
    assert torch.equal(got, total[start:start + share[r]]), "reducescatter sum"
    got = hvd.reducescatter(x, op=hvd.Average)
    assert torch.allclose(got, total[start:start + share[r]] / n), "reducescatter average"

    # Objects, barrier, join.
    assert hvd.broadcast_object({"from": r, "list": [1, 2]}, root_rank=root) == {"from": root, "list": [1, 2]}
    assert hvd.allgather_object(("rank", r)) == [("rank", q) for q in range(n)]
    hvd.barrier()
    assert 0 <= hvd.join() < n

    # Autograd through allreduce: the gradient of sum(allreduce(x)) is reduced too.
    x = torch.ones(5, requires_grad=True)
    hvd.allreduce(x * (r + 1), op=hvd.Sum).sum().backward()
    # d/dx of sum over ranks of sum(allreduce): each rank's ones are summed (n), times r+1.
    assert torch.equal(x.grad, torch.full((5,), float(n * (r + 1)))), x.grad

    # Bad input: a clear Python exception, and the world stays usable.
    nc = torch.arange(12, dtype=torch.float32).view(3, 4).t()
    e = expect_raises(ValueError, lambda: hvd.allreduce(nc), "non-contiguous")
    assert "contiguous" in str(e)
    expect_raises(ValueError, lambda: hvd.allreduce(torch.zeros(3, dtype=torch.complex64)), "complex dtype")
    expect_raises(TypeError, lambda: hvd.allreduce_([1, 2, 3]), "a list")
    expect_raises(ValueError, lambda: hvd.alltoall(torch.ones(n + 1) if n > 1 else torch.ones(1), splits=[5] * n),
                  "bad splits")
    # CUDA memory: every build takes it, which cuda_built() says; a call
    # marked as device memory goes through _core to the C ABI, which loads
    # the NVIDIA driver to open the device, and on this host (no driver) is
    # refused with a message naming what is missing.
    assert hvd.cuda_built() is True
    buf = torch.ones(3)
    e = expect_raises(ValueError, lambda: _core.allreduce(buf.data_ptr(), buf.data_ptr(), 3, _core.FLOAT32, _core.SUM,
                                                          1.0, 1.0, buf, device=_core.CudaMemory(0, 0)),
                      "CUDA memory on a host without an NVIDIA driver")
    assert "cannot load the CUDA driver library libcuda.so.1" in str(e) and "NVIDIA driver" in str(e), e
    e = expect_raises(ValueError, lambda: hvd.allreduce(torch.empty(3, device="meta")), "a meta tensor")
    assert "CPU and CUDA" in str(e), e
    # Trailing dimensions that differ across ranks: every rank sees it (the
    # shapes are exchanged first) and the world is intact afterwards.
    if n > 1:
        bad = torch.zeros(2, 3 + r)
        e = expect_raises(ValueError, lambda: hvd.allgather(bad), "allgather trailing shapes")
        assert "differs" in str(e), e
    close(hvd.allreduce(inputs(r, torch.float32), op=hvd.Sum), reference(hvd.Sum, torch.float32, n), torch.float32,
          "allreduce after bad input")

    print("PASS rank %d of %d" % (r, n), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
    sys.exit(0)
