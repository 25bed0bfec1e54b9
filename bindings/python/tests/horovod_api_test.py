"""Horovod's behaviour where a script depends on more than the values:

- ranks that call mismatched collectives (element count, dtype, reduce op,
  root, collective, shape beyond the first dimension, scale factors) get a
  RuntimeError (gorovod's MismatchError) on every rank, for that call alone:
  the next collectives run and give the right values;
- an asynchronous call given the name of one still in flight is refused
  with ValueError, and the name is free again once the first completed;
- integer tensors are pre- and postscaled in float64 and truncated toward
  zero, and a half-precision sum is rounded to float16 before its postscale
  factor is applied, as Horovod's CPU code computes them;
- grouped_reducescatter (and its async form and gradient) and
  grouped_allgather_async; a scalar refused by reducescatter;
- sparse_allreduce_async against the dense allreduce; DistributedOptimizer
  on sparse gradients (SparseAdam), with and without sparse_as_dense;
- join: a rank that joined serves the others' allreduces with zeros, their
  allgather fails, every rank gets the same last rank;
- broadcast_optimizer_state of a fresh optimizer leaves zero gradients on
  the parameters that take gradients, and none on the others.

Prints "PASS rank R of N". Driven by bindings/python/python_test.go
(TestHorovodAPI).
"""

import os

import torch

import gorovod.torch as hvd


def expect_mismatch(what, call):
    try:
        call()
    except RuntimeError as e:
        assert isinstance(e, hvd.MismatchError), "%s: %r is not a MismatchError" % (what, e)
        return str(e)
    raise AssertionError("%s: no error" % what)


def check_world_goes_on(what, r, n):
    got = hvd.allreduce(torch.tensor([float(r + 1)]), op=hvd.Sum)
    want = n * (n + 1) / 2
    assert got.item() == want, "after the mismatched %s: sum %s, want %s" % (what, got.item(), want)


def mismatches(r, n):
    cases = [
        ("element count", lambda: hvd.allreduce(torch.ones(10 + r))),
        ("dtype", lambda: hvd.allreduce(torch.ones(4, dtype=[torch.float32, torch.int32][r % 2]))),
        ("reduce op", lambda: hvd.allreduce(torch.ones(4), op=[hvd.Sum, hvd.Max][r % 2])),
        ("prescale factor", lambda: hvd.allreduce(torch.ones(4), op=hvd.Sum, prescale_factor=1.0 + (r % 2))),
        ("root rank", lambda: hvd.broadcast(torch.ones(4), root_rank=r)),
        ("collective", lambda: hvd.allreduce(torch.ones(4)) if r % 2 == 0 else hvd.broadcast(torch.ones(4), 0)),
        ("broadcast dtype", lambda: hvd.broadcast(torch.ones(4, dtype=[torch.float32, torch.int32][r % 2]), 0)),
        # As many elements in other shapes (Horovod's test_horovod_allreduce_error).
        ("allreduce shape", lambda: hvd.allreduce(torch.ones(*[(17, 23 * 57), (17, 23, 57)][r % 2]))),
        ("allreduce_ shape", lambda: hvd.allreduce_(torch.ones(*[(2, 3), (3, 2)][r % 2]), op=hvd.Sum)),
        ("grouped allreduce shape",
         lambda: hvd.grouped_allreduce([torch.ones(4), torch.ones(*[(6,), (2, 3)][r % 2])], op=hvd.Sum)),
        ("async allreduce shape", lambda: hvd.synchronize(hvd.allreduce_async(torch.ones(*[(4, 1), (1, 4)][r % 2])))),
        ("allgather shape", lambda: hvd.allgather(torch.ones(3, 2 + r % 2))),
        ("allgather dtype", lambda: hvd.allgather(torch.ones(3, dtype=[torch.float32, torch.int32][r % 2]))),
        ("reducescatter first dimension", lambda: hvd.reducescatter(torch.ones(2 * n + 2 * (r % 2)))),
    ]
    for what, call in cases:
        message = expect_mismatch(what, call)
        if "shape" in what and what.startswith(("allreduce", "grouped", "async")):
            assert "tensor shapes" in message, "%s: the error does not name the shapes: %s" % (what, message)
        check_world_goes_on(what, r, n)
    # The same shapes reduce, and a tensor of one dimension meets the same
    # elements as a grouped call's one-dimensional tensor.
    got = hvd.grouped_allreduce([torch.ones(2, 3), torch.ones(5)], op=hvd.Sum)
    assert got[0].shape == (2, 3) and got[0].sum().item() == 6 * n and got[1].sum().item() == 5 * n, got
    got = hvd.allreduce(torch.ones(5) if r % 2 == 0 else torch.ones(5).view(5), op=hvd.Sum)
    assert got.sum().item() == 5 * n, got
    # An asynchronous mismatched call fails at synchronize, and the calls
    # queued after it run.
    h = hvd.allreduce_async(torch.ones(10 + r))
    good = hvd.allreduce_async(torch.tensor([float(r)]), op=hvd.Sum)
    expect_mismatch("async element count", lambda: hvd.synchronize(h))
    assert hvd.synchronize(good).item() == n * (n - 1) / 2


def duplicate_names(r, n):
    """Rank 0 makes its checks while its first call cannot complete: the
    other ranks submit theirs only once rank 0 opens their FIFO, one for
    each rank the driving test made (HOROVOD_API_TEST_DIR/rank<R>), which
    their open waits for."""
    t = torch.ones(5)
    if n == 1:
        first = hvd.allreduce_async(t, name="grad.w", op=hvd.Sum)  # alone, it completes at once
    elif r == 0:
        first = hvd.allreduce_async(t, name="grad.w", op=hvd.Sum)
        for call in (lambda: hvd.allreduce_async(t, name="grad.w"),
                     lambda: hvd.allgather_async(t, name="grad.w"),
                     lambda: hvd.broadcast_async(t, 0, name="grad.w")):
            try:
                call()
                raise AssertionError("a second call named grad.w in flight was not refused")
            except ValueError as e:
                assert "grad.w" in str(e), e
        for q in range(1, n):
            open(os.path.join(os.environ["HOROVOD_API_TEST_DIR"], "rank%d" % q), "w").close()
    else:
        with open(os.path.join(os.environ["HOROVOD_API_TEST_DIR"], "rank%d" % r)) as f:
            f.read()
        first = hvd.allreduce_async(t, name="grad.w", op=hvd.Sum)
    assert torch.equal(hvd.synchronize(first), torch.full((5,), float(n)))
    # Free again once collected; other names never collide.
    a = hvd.allreduce_async(t, name="grad.w", op=hvd.Sum)
    b = hvd.allreduce_async(t, name="grad.b", op=hvd.Sum)
    assert torch.equal(hvd.synchronize(a), hvd.synchronize(b))


def ranks_tensors(n, dtype, shape, seed):
    """Every rank's input, which each rank can compute."""
    out = []
    for q in range(n):
        g = torch.Generator().manual_seed(seed + q)
        out.append((torch.rand(shape, generator=g) * 200 - 100).to(dtype))
    return out


def horovod_scaled(x, f):
    """Horovod's CPU ScaleBuffer: integers in float64, truncated; float16
    in float32."""
    if x.dtype in (torch.int32, torch.int64, torch.uint8):
        return (x.to(torch.float64) * f).to(x.dtype)
    return (x.to(torch.float32) * torch.tensor(f, dtype=torch.float32)).to(x.dtype)


def integer_scaling(r, n):
    for dtype in (torch.int32, torch.int64):
        for op in (hvd.Sum, hvd.Average):
            for pre, post in ((0.37, 1.0), (1.0, 0.61), (0.83, 1.7)):
                xs = ranks_tensors(n, dtype, (7, 5), 11)
                total = sum(horovod_scaled(x, pre) for x in xs)
                want = horovod_scaled(total, post / n if op == hvd.Average else post)
                for how in ("allreduce", "grouped", "inplace"):
                    x = xs[r].clone()
                    if how == "allreduce":
                        got = hvd.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post)
                    elif how == "grouped":
                        got = hvd.grouped_allreduce([x], op=op, prescale_factor=pre, postscale_factor=post)[0]
                    else:
                        got = hvd.synchronize(hvd.allreduce_async_(x, op=op, prescale_factor=pre,
                                                                   postscale_factor=post))
                        assert got is x
                    assert torch.equal(got, want), "%s %s op %s pre %s post %s: %s, want %s" % (
                        how, dtype, op, pre, post, got.flatten()[:6].tolist(), want.flatten()[:6].tolist())
                    assert torch.equal(x, xs[r]) or how == "inplace", "the input changed"
                # Reducescatter: this rank's share of the first dimension.
                xs = ranks_tensors(n, dtype, (2 * n, 3), 17)
                total = sum(horovod_scaled(x, pre) for x in xs)
                want = horovod_scaled(total, post / n if op == hvd.Average else post)[2 * r:2 * r + 2]
                got = hvd.reducescatter(xs[r], op=op, prescale_factor=pre, postscale_factor=post)
                assert torch.equal(got, want), "reducescatter %s op %s pre %s post %s: %s, want %s" % (
                    dtype, op, pre, post, got.tolist(), want.tolist())


def half_postscale(r, n):
    if n != 2:
        return  # with two ranks the sum has one order: the rounding is Horovod's alone
    xs = ranks_tensors(n, torch.float16, (1000,), 23)
    xs = [x / 7 for x in xs]  # not integers: the sums need rounding
    post = 0.3
    total = (xs[0].to(torch.float32) + xs[1].to(torch.float32)).to(torch.float16)
    want = horovod_scaled(total, post)
    got = hvd.allreduce(xs[r], op=hvd.Sum, postscale_factor=post)
    assert torch.equal(got, want), "float16 postscale: %d of 1000 elements differ" % int((got != want).sum())


def grouped_reducescatter(r, n):
    xs = [ranks_tensors(n, torch.float64, shape, 31 + i) for i, shape in enumerate([(2 * n,), (2 * n, 3), (n, 2, 2)])]
    mine = [x[r].clone() for x in xs]
    got = hvd.grouped_reducescatter(mine, op=hvd.Sum)
    shares = [2, 2, 1]
    for g, x, s in zip(got, xs, shares):
        want = sum(x)[s * r:s * (r + 1)]
        assert torch.allclose(g, want), (g, want)
    h = hvd.grouped_reducescatter_async(mine, op=hvd.Average)
    for g, x, s in zip(hvd.synchronize(h), xs, shares):
        assert torch.allclose(g, (sum(x) / n)[s * r:s * (r + 1)])
    # The gradient of a sum's share is the share's gradient gathered.
    leaves = [m.clone().requires_grad_() for m in mine]
    outs = hvd.grouped_reducescatter(leaves, op=hvd.Sum)
    sum(o.sum() for o in outs).backward()
    for leaf in leaves:
        assert torch.equal(leaf.grad, torch.full_like(leaf, float(n))), leaf.grad
    h = hvd.grouped_allgather_async([torch.full((r + 1, 2), float(r)), torch.tensor([r])])
    a, b = hvd.synchronize(h)
    assert a.shape == (n * (n + 1) // 2, 2) and torch.equal(b, torch.arange(n))


def scalar_reducescatter():
    for call in (lambda: hvd.reducescatter(torch.tensor(1.0)),
                 lambda: hvd.grouped_reducescatter([torch.ones(4), torch.tensor(1.0)])):
        try:
            call()
            raise AssertionError("a scalar was reducescattered")
        except ValueError as e:
            assert "scalar" in str(e), e


def sparse_allreduce(r, n):
    for op in (hvd.Average, hvd.Sum):
        for i, rows in enumerate((7, 1, 30)):
            dense = ranks_tensors(n, torch.float32, (rows, 4), 41 + i)
            dense = [d * (d > 50) for d in dense]  # mostly zeros
            result = hvd.sparse_allreduce_async(dense[r].to_sparse(), name="sparse.%d" % i, op=op)()
            assert result.is_sparse
            want = sum(dense) / (n if op == hvd.Average else 1)
            assert torch.allclose(result.to_dense(), want), (result.to_dense(), want)


def sparse_optimizer(r, n):
    inputs = [torch.tensor([[1, 2, 4, 5], [4, 3, 2, 9]]), torch.tensor([[1, 3, 4, 0], [4, 7, 9, 9]]),
              torch.tensor([[0, 0, 8, 8], [6, 6, 6, 6]])]
    for sparse_as_dense in (False, True):
        torch.manual_seed(5)
        model = torch.nn.Embedding(10, 3, sparse=True)
        reference = torch.nn.Embedding(10, 3, sparse=True)
        reference.load_state_dict(model.state_dict())
        opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(model.parameters()), lr=0.1),
                                       sparse_as_dense=sparse_as_dense)
        model(inputs[r % 3]).sum().backward()
        opt.step()
        # One process: SparseAdam on the average of every rank's gradient.
        grad = sum(torch.bincount(inputs[q % 3].flatten(), minlength=10).float() for q in range(n)) / n
        reference.weight.grad = (grad[:, None] * torch.ones(10, 3)).to_sparse()
        torch.optim.SparseAdam(list(reference.parameters()), lr=0.1).step()
        assert torch.allclose(model.weight, reference.weight), (sparse_as_dense, model.weight, reference.weight)


def fresh_optimizer_state():
    fixed = torch.nn.Parameter(torch.tensor([1, 3]), requires_grad=False)
    learned = torch.nn.Parameter(torch.rand(4))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([fixed, learned], lr=0.1, momentum=0.9),
                                   named_parameters=[("fixed", fixed), ("learned", learned)])
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert fixed.grad is None
    assert torch.equal(learned.grad, torch.zeros(4))


def join(r, n):
    for first in range(n):
        if r == first:
            last = hvd.join()
        else:
            a, b = torch.full((5,), float(r + 1)), torch.arange(17, dtype=torch.int64) * (r + 1)
            ha = hvd.allreduce_async(a, name="join.a", op=hvd.Average)
            hb = hvd.allreduce_async(b, name="join.b", op=hvd.Sum)
            others = sum(q + 1 for q in range(n) if q != first)
            assert torch.allclose(hvd.synchronize(ha), torch.full((5,), others / n)), "average with a rank joined"
            assert torch.equal(hvd.synchronize(hb), torch.arange(17, dtype=torch.int64) * others), "sum with a rank joined"
            try:
                hvd.allgather(torch.ones(2))
                raise AssertionError("an allgather while rank %d had joined did not fail" % first)
            except RuntimeError as e:
                assert isinstance(e, hvd.MismatchError), e
            last = hvd.join()
        assert last != first or n == 1, "rank %d joined first and last" % first
        assert hvd.allgather_object(last) == [last] * n


def main():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    if n > 1:
        mismatches(r, n)
    duplicate_names(r, n)
    integer_scaling(r, n)
    half_postscale(r, n)
    grouped_reducescatter(r, n)
    scalar_reducescatter()
    sparse_allreduce(r, n)
    sparse_optimizer(r, n)
    fresh_optimizer_state()
    join(r, n)
    hvd.barrier()
    print("PASS rank %d of %d" % (r, n), flush=True)


if __name__ == "__main__":
    main()
