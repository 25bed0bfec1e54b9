"""Named collectives pair by name across the ranks, as in Horovod:

- the duplicate-name pattern of Horovod's own tests, for allreduce,
  allgather, broadcast, reducescatter and alltoall: rank 0 starts a named
  call, is refused a second of that name (ValueError) and enters a barrier,
  which the other ranks enter first, starting their named call (and being
  refused a second) only after it; then every rank synchronizes its call
  and checks the result;
- named calls of every kind started in other orders on different ranks and
  synchronized in other orders;
- one name with tensors of other sizes raises MismatchError on every rank
  (after a barrier that overtook it on rank 0), and the next call runs.

Prints "PASS rank R of N".
"""

import torch

import gorovod.torch as hvd


def calls(r, n):
    """kind -> (start(name): the handle of a named call of that kind,
    ok(output): whether synchronize's output is right)."""
    total = float(n * (n + 1) // 2)
    return {
        "allreduce": (lambda name: hvd.allreduce_async(torch.full((17, 17, 17), float(r + 1)), name=name, op=hvd.Sum),
                      lambda out: torch.equal(out, torch.full((17, 17, 17), total))),
        "allgather": (lambda name: hvd.allgather_async(torch.full((r + 1, 2), float(r)), name=name),
                      lambda out: torch.equal(out, torch.cat([torch.full((q + 1, 2), float(q)) for q in range(n)]))),
        "broadcast": (lambda name: hvd.broadcast_async(torch.full((4,), float(r)), root_rank=0, name=name),
                      lambda out: torch.equal(out, torch.zeros(4))),
        "reducescatter": (lambda name: hvd.reducescatter_async(torch.full((2 * n, 3), float(r + 1)), name=name,
                                                               op=hvd.Sum),
                          lambda out: torch.equal(out, torch.full((2, 3), total))),
        "alltoall": (lambda name: hvd.alltoall_async(torch.full((n,), float(r)), name=name),
                     lambda out: torch.equal(out[0] if isinstance(out, tuple) else out,
                                             torch.arange(n, dtype=torch.float32))),
    }


def duplicate_name_pattern(r, n):
    for kind, (start, ok) in calls(r, n).items():
        name = "dup." + kind

        def start_refusing_a_second():
            h = start(name)
            try:
                start(name)
            except ValueError as e:
                assert name in str(e), e
                return h
            raise AssertionError("a second %s named %s in flight was not refused" % (kind, name))

        h = None
        if r == 0:
            h = start_refusing_a_second()
        hvd.barrier()
        if r > 0:
            h = start_refusing_a_second()
        hvd.barrier()
        assert ok(hvd.synchronize(h)), "%s after the barrier that overtook it" % kind


def other_orders(r, n):
    c = calls(r, n)
    order = list(c) if r % 2 == 0 else list(c)[::-1]
    handles = {kind: c[kind][0]("order." + kind) for kind in order}
    for kind in (order[::-1] if r == 0 else order):
        assert c[kind][1](hvd.synchronize(handles[kind])), "%s started in another order" % kind


def same_name_other_size(r, n):
    if r == 0:
        hvd.barrier()
        h = hvd.allreduce_async(torch.ones(4), name="clash", op=hvd.Sum)
    else:
        h = hvd.allreduce_async(torch.ones(5), name="clash", op=hvd.Sum)
        hvd.barrier()
    try:
        hvd.synchronize(h)
        raise AssertionError("allreduces named clash of 4 and 5 elements did not fail")
    except hvd.MismatchError as e:
        assert "element count" in str(e) and "clash" in str(e), e
    assert hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum).item() == n * (n - 1) / 2


def main():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    duplicate_name_pattern(r, n)
    other_orders(r, n)
    if n > 1:
        same_name_other_size(r, n)
    hvd.barrier()
    print("PASS rank %d of %d" % (r, n), flush=True)


if __name__ == "__main__":
    main()
