"""Adasum (op=hvd.Adasum) against a one-process reference of the formula:
allreduce, its async and in-place forms, grouped allreduce (each tensor
combined on its own), the scale factors, the refusals, join, and
DistributedOptimizer(op=Adasum), Horovod's delta optimizer. Each rank
builds every rank's input from (rank, seed), so it can compute the expected
result itself. Run alone or under `gorovod run --np N --min-np N`; prints "PASS
rank R of N" at the end.

Driven by bindings/python/python_test.go.
"""

import torch

import gorovod.torch as hvd

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
# Bound on the relative L2 distance from the reference: the workers sum each
# dot product in pieces, in another order, so an element may round the
# other way.
TOL = {torch.float64: 1e-12, torch.float32: 1e-6, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def expect_raises(exc, fn, what):
    try:
        fn()
    except exc as e:
        return e
    raise AssertionError("%s: expected %s" % (what, exc.__name__))


def adasum_reference(vectors, dtype):
    """Combines the workers' vectors (float64, one per rank) as the Adasum
    paper's formula says, pairing ranks r and r+m for m = 1, 2, 4, ... (the
    lower rank's on the left), rounding to dtype after each level."""
    vecs = [v.to(torch.float64).clone() for v in vectors]
    n, m = len(vecs), 1
    while m < n:
        for r in range(0, n, 2 * m):
            a, b = vecs[r], vecs[r + m]
            dot, na, nb = float((a * b).sum()), float((a * a).sum()), float((b * b).sum())
            ca = 1 - dot / (2 * na) if na >= 2.0 ** -511 else 1.0
            cb = 1 - dot / (2 * nb) if nb >= 2.0 ** -511 else 1.0
            vecs[r] = (ca * a + cb * b).to(dtype).to(torch.float64)
        m *= 2
    return vecs[0]


def rel(got, want):
    got, want = got.to(torch.float64).flatten(), want.to(torch.float64).flatten()
    w = float(want.norm())
    d = float((got - want).norm())
    return d / w if w else d


def random_input(r, dtype, shape, seed):
    g = torch.Generator().manual_seed(seed * 100 + r)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def orthogonal_input(r, n, dtype, shape):
    """Rank r's values only where the flat index is r modulo n."""
    v = torch.zeros(shape, dtype=torch.float64).flatten()
    v[r::n] = torch.arange(1, v[r::n].numel() + 1, dtype=torch.float64) % 7 + 1
    return v.view(shape).to(dtype)


def identical_input(dtype, shape):
    v = (torch.arange(torch.Size(shape).numel(), dtype=torch.float64) * 5 % 9 - 4).view(shape)
    return v.to(dtype)


def check_collectives(r, n):
    for dtype in FLOATS:
        for shape in [(37,), (4, 5), (1,), (0,)]:
            xs = [random_input(k, dtype, shape, 1) for k in range(n)]
            want = adasum_reference([x.flatten() for x in xs], dtype).view(shape)
            x = xs[r].clone()
            got = hvd.allreduce(x, op=hvd.Adasum)
            assert torch.equal(x, xs[r]), "allreduce modified its input"
            assert got.dtype == dtype and got.shape == x.shape
            assert rel(got, want) <= TOL[dtype], "%s %s: %.3g from the reference" % (dtype, shape, rel(got, want))
            # The same through allreduce_async and the in-place form.
            h = hvd.allreduce_async(xs[r].clone(), op=hvd.Adasum)
            assert torch.equal(hvd.synchronize(h), got), "async result differs"
            y = xs[r].clone()
            hvd.allreduce_(y, op=hvd.Adasum)
            assert torch.equal(y, got), "in-place result differs"
        # Orthogonal vectors add up, identical ones stay, exactly.
        shape = (6, 7)
        got = hvd.allreduce(orthogonal_input(r, n, dtype, shape), op=hvd.Adasum)
        want = sum(orthogonal_input(k, n, torch.float64, shape) for k in range(n))
        assert torch.equal(got.to(torch.float64), want), "%s orthogonal: %s" % (dtype, got)
        same = identical_input(dtype, shape)
        assert torch.equal(hvd.allreduce(same, op=hvd.Adasum), same), "%s identical" % dtype

    # A grouped allreduce combines each tensor on its own (an orthogonal, an
    # identical and a random one in one call), as Horovod's fused Adasum.
    shapes = [(30,), (3, 4), (50,)]
    ins = [[orthogonal_input(k, n, torch.float32, shapes[0]), identical_input(torch.float32, shapes[1]),
            random_input(k, torch.float32, shapes[2], 2)] for k in range(n)]
    outs = hvd.grouped_allreduce(ins[r], op=hvd.Adasum)
    for i in range(3):
        want = adasum_reference([ins[k][i].flatten() for k in range(n)], torch.float32).view(shapes[i])
        assert rel(outs[i], want) <= TOL[torch.float32], "grouped tensor %d: %.3g" % (i, rel(outs[i], want))

    # Prescale before the combination, postscale after (Horovod's order).
    got = hvd.allreduce(orthogonal_input(r, n, torch.float32, (8,)), op=hvd.Adasum, prescale_factor=2.0,
                        postscale_factor=1.5)
    want = 3 * sum(orthogonal_input(k, n, torch.float64, (8,)) for k in range(n))
    assert torch.equal(got.to(torch.float64), want), "scaled: %s" % got

    # Refusals: integers, reducescatter; the world stays usable.
    e = expect_raises(ValueError, lambda: hvd.allreduce(torch.ones(3, dtype=torch.int32), op=hvd.Adasum), "int32")
    assert "floating-point" in str(e), e
    expect_raises(NotImplementedError, lambda: hvd.reducescatter(torch.ones(2 * n), op=hvd.Adasum), "reducescatter")
    assert float(hvd.allreduce(torch.ones(1), op=hvd.Sum)) == n

    # A rank that joined serves the others' Adasum allreduces with zeros,
    # as Horovod's join does: its vector counts as zero.
    if n > 1:
        xs = [random_input(k, torch.float32, (20,), 3) for k in range(n)]
        if r != 0:
            got = hvd.allreduce(xs[r], op=hvd.Adasum)
            want = adasum_reference([torch.zeros(20, dtype=torch.float64)] + xs[1:], torch.float32)
            assert rel(got, want) <= TOL[torch.float32], "with rank 0 joined: %.3g" % rel(got, want)
        hvd.join()


def check_optimizer(r, n, passes):
    """DistributedOptimizer(op=Adasum) against a simulation of every worker:
    each applies SGD with momentum to its own gradients, the parameter
    deltas combine with Adasum per parameter, every worker continues from
    the start plus the combined delta; momentum stays each worker's."""
    def model():
        torch.manual_seed(5)
        return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))

    def batch(k, step, micro):
        g = torch.Generator().manual_seed(1000 * step + 10 * k + micro)
        return torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)

    def loss_of(m, k, step, micro):
        x, y = batch(k, step, micro)
        return ((m(x) - y) ** 2).mean()

    net = model()
    unused = torch.nn.Linear(2, 2)  # parameters without a gradient: they stay as they are
    unused_before = [p.detach().clone() for p in unused.parameters()]
    params = list(net.parameters()) + list(unused.parameters())
    named = [("net." + k, v) for k, v in net.named_parameters()] + [("unused." + k, v)
                                                                     for k, v in unused.named_parameters()]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1, momentum=0.9), named_parameters=named,
                                   op=hvd.Adasum, backward_passes_per_step=passes)
    sims = [model() for _ in range(n)]
    sim_opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in sims]
    for step in range(3):
        opt.zero_grad()
        for micro in range(passes):
            loss_of(net, r, step, micro).backward()
        opt.step()
        before = [p.detach().clone() for p in sims[0].parameters()]
        deltas = []
        for k in range(n):
            sim_opts[k].zero_grad()
            for micro in range(passes):
                loss_of(sims[k], k, step, micro).backward()
            sim_opts[k].step()
            deltas.append([p.detach() - b for p, b in zip(sims[k].parameters(), before)])
        for i, b in enumerate(before):
            combined = b + adasum_reference([d[i].flatten() for d in deltas], torch.float32).view(b.shape).float()
            for m in sims:
                list(m.parameters())[i].data.copy_(combined)
        for i, (p, want) in enumerate(zip(net.parameters(), sims[0].parameters())):
            d = rel(p.detach(), want.detach())
            assert d <= 1e-5, "step %d parameter %d: %.3g from the simulation" % (step, i, d)
        for p, b, k in zip(unused.parameters(), unused_before, ("weight", "bias")):
            assert torch.equal(p.detach(), b), "the unused %s changed" % k
        # Every worker holds the same parameters, bit for bit.
        flat = torch.cat([p.detach().flatten() for p in params])
        everyone = hvd.allgather(flat.unsqueeze(0))
        assert all(torch.equal(everyone[k], flat) for k in range(n)), "the workers' parameters differ"
    if n > 1:  # alone, Horovod and gorovod wrap the ordinary optimizer
        expect_raises(AssertionError, opt.skip_synchronize, "skip_synchronize")


def main():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    if n & (n - 1):
        e = expect_raises(NotImplementedError, lambda: hvd.allreduce(torch.ones(2), op=hvd.Adasum), "world of %d" % n)
        assert "power-of-two" in str(e), e
        expect_raises(NotImplementedError, lambda: hvd.grouped_allreduce([torch.ones(2)], op=hvd.Adasum),
                      "grouped in a world of %d" % n)
        assert float(hvd.allreduce(torch.ones(1), op=hvd.Sum)) == n
    else:
        check_collectives(r, n)
        for passes in (1, 2):
            check_optimizer(r, n, passes)
    print("PASS rank %d of %d" % (r, n), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
