"""Process sets, as Horovod scripts use them, in a job of 3 or more workers:

- hvd.init(process_sets=[...]) registers sets; add_process_set takes a list
  or a ProcessSet; ids, ranks, rank(), size() and included() agree with
  Horovod's on every rank;
- the even and the odd ranks run every collective on their own set at the
  same time (sums, averages over the set's size, broadcast from a world
  rank, allgather of uneven first dimensions, alltoall with splits,
  reducescatter, barrier, grouped and asynchronous forms, autograd, Adasum
  where the set's size is a power of two), while a
  set with one rank idle runs beside them; then the world runs one;
- DistributedOptimizer on a set averages only among its members and leaves
  the others' parameters to their own gradients;
- errors are Horovod's types: ValueError for a duplicate set, a call on a
  set this rank is not in, a root outside the set, an unregistered set;
  remove_process_set returns False for a set not registered.

Prints "PASS rank R of N". Driven by bindings/python/python_test.go
(TestProcessSets).
"""

import torch

import gorovod.torch as hvd


def expect_value_error(what, call):
    try:
        call()
    except ValueError as e:
        return str(e)
    raise AssertionError("%s: no ValueError" % what)


def main():
    first = hvd.ProcessSet([0, 1])
    hvd.init(process_sets=[first])
    r, n = hvd.rank(), hvd.size()
    assert n >= 3, "run with 3 or more workers"
    assert first.process_set_id is not None and first.process_set_id > 0, first
    assert first.ranks == [0, 1] and first.included() == (r < 2), first
    assert first.size() == 2 and (r >= 2 or first.rank() == r), first
    assert hvd.global_process_set.process_set_id == 0 and hvd.global_process_set.ranks == list(range(n))
    assert hvd.global_process_set.size() == n and hvd.global_process_set.rank() == r

    even_ranks = [k for k in range(n) if k % 2 == 0]
    odd_ranks = [k for k in range(n) if k % 2 == 1]
    even = hvd.add_process_set(even_ranks)
    odd = hvd.add_process_set(hvd.ProcessSet(list(reversed(odd_ranks))))  # any order: sorted
    assert odd.ranks == odd_ranks, odd
    ids = hvd.allgather(torch.tensor([[first.process_set_id, even.process_set_id, odd.process_set_id]]))
    assert all(ids[k].tolist() == ids[0].tolist() for k in range(n)), "the sets' ids differ between ranks: %s" % ids
    assert len({first.process_set_id, even.process_set_id, odd.process_set_id}) == 3
    mine, members = (even, even_ranks) if r % 2 == 0 else (odd, odd_ranks)
    other = odd if mine is even else even
    assert mine.included() and not other.included()
    assert mine.rank() == members.index(r) and mine.size() == len(members)
    m = len(members)

    # Every collective on this rank's set, while the other set runs its own.
    s = hvd.allreduce(torch.tensor([float(r), 1.0]), op=hvd.Sum, process_set=mine)
    assert s.tolist() == [float(sum(members)), float(m)], s
    a = hvd.allreduce(torch.tensor([float(r)]), process_set=mine)
    assert abs(a.item() - sum(members) / m) < 1e-6, "average over the set: %s" % a
    i = hvd.allreduce(torch.tensor([r * 10], dtype=torch.int64), op=hvd.Max, process_set=mine)
    assert i.item() == 10 * max(members), i
    g = hvd.grouped_allreduce([torch.ones(3), torch.full((2,), float(r))], op=hvd.Sum, process_set=mine)
    assert g[0].tolist() == [float(m)] * 3 and g[1].tolist() == [float(sum(members))] * 2, g
    t = torch.full((4,), float(r))
    hvd.allreduce_(t, op=hvd.Sum, process_set=mine)
    assert t.tolist() == [float(sum(members))] * 4, t
    h = hvd.allreduce_async(torch.ones(5), op=hvd.Sum, process_set=mine)
    assert hvd.synchronize(h).tolist() == [float(m)] * 5
    scaled = hvd.allreduce(torch.tensor([3], dtype=torch.int32), op=hvd.Average, prescale_factor=2.0,
                           process_set=mine)
    assert scaled.item() == 6, "an integer average with prescale over the set: %s" % scaled

    # Adasum on the set (of a power-of-two size here, 1 or 2 ranks):
    # orthogonal vectors add up, equal ones stay as they are.
    if m & (m - 1) == 0:
        v = torch.zeros(4)
        v[mine.rank()] = 1.0
        ad = hvd.allreduce(v, op=hvd.Adasum, process_set=mine)
        assert ad.tolist() == [1.0] * m + [0.0] * (4 - m), "Adasum of orthogonal vectors on the set: %s" % ad
        same = hvd.allreduce(torch.full((3,), 2.0), op=hvd.Adasum, process_set=mine)
        assert same.tolist() == [2.0] * 3, "Adasum of equal vectors on the set: %s" % same

    root = members[-1]
    b = hvd.broadcast(torch.tensor([float(r)]), root_rank=root, process_set=mine)
    assert b.item() == float(root), "broadcast from world rank %d: %s" % (root, b)
    obj = hvd.broadcast_object({"from": r}, root_rank=root, process_set=mine)
    assert obj == {"from": root}, obj

    ag = hvd.allgather(torch.full((r + 1, 2), float(r)), process_set=mine)
    want = torch.cat([torch.full((k + 1, 2), float(k)) for k in members])
    assert torch.equal(ag, want), "allgather on the set: %s" % ag
    gag = hvd.grouped_allgather([torch.tensor([r]), torch.tensor([[r, r]])], process_set=mine)
    assert gag[0].tolist() == members and gag[1][:, 0].tolist() == members, gag

    splits = [1] * m
    out, got = hvd.alltoall(torch.tensor([100 * r + k for k in members]), splits=splits, process_set=mine)
    assert out.tolist() == [100 * k + r for k in members] and got.tolist() == splits, (out, got)

    rs = hvd.reducescatter(torch.arange(2 * m, dtype=torch.float32).reshape(2 * m, 1) * (r + 1), op=hvd.Sum,
                           process_set=mine)
    k = mine.rank()
    factor = sum(q + 1 for q in members)
    assert rs.flatten().tolist() == [float(2 * k * factor), float((2 * k + 1) * factor)], rs

    x = torch.tensor([float(r + 1)], requires_grad=True)
    y = hvd.allreduce(x, op=hvd.Sum, process_set=mine)
    y.backward()
    assert x.grad.item() == float(m), "gradient of an allreduce on the set: %s" % x.grad

    hvd.barrier(process_set=mine)

    # The first set beside them: rank 2 and up idle meanwhile.
    if first.included():
        f = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum, process_set=first)
        assert f.item() == 2.0, f

    # The world after the sets.
    w = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum)
    assert w.item() == float(n), w

    # DistributedOptimizer on the even set: its members end with the same
    # parameters, the odd ranks with their own.
    torch.manual_seed(r)
    model = torch.nn.Linear(4, 1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=model.named_parameters(), process_set=even)
    loss = model(torch.randn(8, 4)).pow(2).sum()
    loss.backward()
    opt.step()
    weights = hvd.allgather(model.weight.detach().clone())
    for q in range(n):
        same = torch.equal(weights[q], weights[0])
        if q % 2 == 0:
            assert same, "even rank %d's weights differ from rank 0's" % q
        elif n > 2:
            assert not same, "odd rank %d's weights are rank 0's: its gradients were reduced with the even set" % q

    # Errors, with Horovod's types.
    expect_value_error("a duplicate set", lambda: hvd.add_process_set(even_ranks))
    expect_value_error("the whole world as a set", lambda: hvd.add_process_set(list(range(n))))
    expect_value_error("an allreduce on a set without this rank",
                       lambda: hvd.allreduce(torch.ones(1), process_set=other))
    expect_value_error("a barrier on a set without this rank", lambda: hvd.barrier(process_set=other))
    expect_value_error("a broadcast from a root outside the set",
                       lambda: hvd.broadcast(torch.ones(1), root_rank=other.ranks[0], process_set=mine))
    expect_value_error("an unregistered set",
                       lambda: hvd.allreduce(torch.ones(1), process_set=hvd.ProcessSet([0, 2])))
    expect_value_error("a ProcessSet of something else", lambda: hvd.ProcessSet(["a"]))
    if not other.included():
        expect_value_error("rank() outside the set", other.rank)

    # Removal: the set is unknown afterwards, and removing it again is False.
    removed_id = odd.process_set_id
    assert hvd.remove_process_set(odd) is True
    assert odd.process_set_id is None and odd.size() is None
    assert hvd.remove_process_set(odd) is False
    assert hvd.remove_process_set(hvd.global_process_set) is False
    stale = hvd.ProcessSet(odd_ranks)
    stale.process_set_id = removed_id
    expect_value_error("a removed set's id", lambda: stale.size())
    again = hvd.add_process_set(odd_ranks)
    assert again.process_set_id not in (None, removed_id), again
    for ps in (again, even, first):
        assert hvd.remove_process_set(ps) is True

    w = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum)
    assert w.item() == float(n), w
    print("PASS rank %d of %d" % (r, n), flush=True)


if __name__ == "__main__":
    main()
