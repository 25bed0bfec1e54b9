"""Point-to-point on the "gorovod" torch.distributed backend (3 or more
ranks), and destroy_process_group(group) removing the group's process set.

send/recv (blocking) and isend/irecv and batch_isend_irecv pass tensors
around the ring; a 64 MiB isend followed by all_reduce before its irecv
is posted completes; messages with different tags are received in another order
than sent; a receive of another size than its message raises and the world
goes on; a receive posted long before its message (collectives run
meanwhile) gets it; a group's ranks are translated to world ranks; a
receive from any rank (src=None: dist.recv, and irecv's work._source_rank())
takes each of several senders' messages once, naming the sender, each
sender's in the order sent, beside a receive from a given rank posted
before it; on a group of some ranks it takes only the group's messages
(not those of ranks outside it, nor a member's sent on the world's group
with the same tag) and names the sender's group rank. Then: a group
destroyed on all its members has
its process set removed at the next new_group (on every rank, members or
not), while a group of other ranks whose members have not all destroyed it
keeps its set.

Prints "PASS rank R of N". Driven by bindings/python/python_test.go.
"""

import torch
import torch.distributed as dist

import gorovod.torch.distributed as gdist
from gorovod import _core

dist.init_process_group("gorovod")
r, n = dist.get_rank(), dist.get_world_size()
if n < 3:
    raise SystemExit("distributed_p2p_test.py needs 3 or more ranks, got %d" % n)
nxt, prv = (r + 1) % n, (r + n - 1) % n


def same(what, got, want):
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        raise AssertionError("rank %d: %s:\ngot  %s\nwant %s" % (r, what, got.tolist(), want.tolist()))


def message(sender, k, dtype=torch.float32, count=1000):
    return (torch.arange(count, dtype=torch.float64) + sender * 100000 + k).to(dtype)


# Blocking send/recv around the ring: even ranks send first, odd ones
# receive first (with an odd world, rank n-1 and rank 0 both send first:
# sends of this size are buffered).
got = torch.empty(1000)
if r % 2 == 0:
    dist.send(message(r, 1), dst=nxt)
    dist.recv(got, src=prv)
else:
    dist.recv(got, src=prv)
    dist.send(message(r, 1), dst=nxt)
same("blocking ring", got, message(prv, 1))

# isend/irecv around the ring, both ways, several dtypes, a message of
# several chunks (2 MiB), a non-contiguous receive.
for dtype, count in ((torch.float32, 3), (torch.int64, 1000), (torch.bfloat16, 17), (torch.uint8, 0),
                     (torch.float64, 1 << 18)):
    to_next, from_prev = torch.empty(count, dtype=dtype), torch.empty(count, dtype=dtype)
    works = [dist.irecv(from_prev, src=prv, tag=3), dist.irecv(to_next, src=nxt, tag=4),
             dist.isend(message(r, 2, dtype, count), dst=nxt, tag=3),
             dist.isend(message(r, 3, dtype, count), dst=prv, tag=4)]
    for w in works:
        w.wait()
    same("irecv from the previous rank (%s)" % dtype, from_prev, message(prv, 2, dtype, count))
    same("irecv from the next rank (%s)" % dtype, to_next, message(nxt, 3, dtype, count))
column = torch.zeros(4, 3)[:, 1]  # not contiguous
ops = [dist.P2POp(dist.irecv, column, prv), dist.P2POp(dist.isend, message(r, 4, count=4), nxt)]
for w in dist.batch_isend_irecv(ops):
    w.wait()
same("batch_isend_irecv into a column", column, message(prv, 4, count=4))

# An isend far larger than the links buffer (64 MiB), then collectives, and
# only then its irecv, legal in torch.distributed: the collectives (a small
# all_reduce, whose first move is a send to that same partner at 4 ranks,
# and a ring one) are not stuck behind the messages, and the messages
# arrive whole. Ranks pair up (0 and 1, 2 and 3); an odd one out only
# runs the collectives.
big = 16 << 20
partner = r ^ 1 if (r ^ 1) < n else None
if partner is not None:
    w_big = dist.isend(message(r, 5, count=big), dst=partner, tag=5)
t = torch.full((4,), float(r))
dist.all_reduce(t)
same("small all_reduce behind a 64 MiB isend", t, torch.full((4,), float(sum(range(n)))))
t = torch.full((1 << 18,), 1.0)
dist.all_reduce(t)
same("ring all_reduce behind a 64 MiB isend", t, torch.full((1 << 18,), float(n)))
if partner is not None:
    got_big = torch.empty(big)
    dist.irecv(got_big, src=partner, tag=5).wait()
    w_big.wait()
    same("a 64 MiB irecv posted after the all_reduce", got_big, message(partner, 5, count=big))
    del got_big

# Tags: rank 0 sends tags 1, 2, 3 to rank 1 (and two with tag 2); rank 1
# receives 3 first, then 2, then 1: each receive takes the next message
# with its tag, whatever came before it.
if r == 0:
    works = [dist.isend(message(0, t), dst=1, tag=t) for t in (1, 2, 2, 3)]
    for w in works:
        w.wait()
    for t in (10, 20):
        dist.send(message(0, t, count=5), dst=1, tag=t)
elif r == 1:
    for t, k in ((3, 3), (2, 2), (1, 1), (2, 2)):
        g = torch.empty(1000)
        dist.recv(g, src=0, tag=t)
        same("tag %d" % t, g, message(0, k))
    # Receives posted out of order before the messages come.
    late = torch.empty(5)
    w20 = dist.irecv(late, src=0, tag=20)
    early = torch.empty(5)
    dist.recv(early, src=0, tag=10)
    w20.wait()
    same("tag 10", early, message(0, 10, count=5))
    same("tag 20", late, message(0, 20, count=5))

# A receive of another size than its message raises; the world goes on.
if r == 0:
    dist.send(torch.ones(5), dst=2, tag=7)
    dist.send(torch.full((2,), 7.0), dst=2, tag=7)
elif r == 2:
    try:
        dist.recv(torch.empty(4), src=0, tag=7)
    except RuntimeError as e:
        if "20 bytes" not in str(e) or "16" not in str(e):
            raise AssertionError("rank 2: a mismatched receive raised %r, want the two sizes" % (e,))
    else:
        raise AssertionError("rank 2: a receive of 4 floats for a message of 5 did not raise")
    g = torch.empty(2)
    dist.recv(g, src=0, tag=7)
    same("the message after a mismatch", g, torch.full((2,), 7.0))
t = torch.ones(1)
dist.all_reduce(t)
same("all_reduce after the mismatch", t, torch.full((1,), float(n)))

# irecv long before the send: the receiver runs collectives meanwhile,
# and the sender sends only after them.
if r == 1:
    g = torch.empty(300)
    w = dist.irecv(g, src=2, tag=11)
for _ in range(3):
    t = torch.full((1000,), float(r))
    dist.all_reduce(t)
    same("all_reduce while a receive waits", t, torch.full((1000,), float(sum(range(n)))))
    dist.barrier()
if r == 2:
    dist.send(message(2, 11, count=300), dst=1, tag=11)
elif r == 1:
    if not w.wait():
        raise AssertionError("rank 1: wait() returned false")
    if not w.is_completed():
        raise AssertionError("rank 1: a waited receive is not completed")
    same("irecv before send", g, message(2, 11, count=300))

# A group's ranks: dst and src are world ranks, sent within the group.
pair = [1, 2]
g12 = dist.new_group(ranks=pair)
if r == 1:
    dist.send(message(1, 12, count=8), dst=2, group=g12)
elif r == 2:
    g = torch.empty(8)
    dist.recv(g, src=1, group=g12)
    same("send within a group", g, message(1, 12, count=8))

# A receive from any rank: every other rank sends rank 0 two messages with
# tag 30, rank 1 one more with tag 31. Rank 0 posts a receive from rank 1
# first, which takes rank 1's first message; the receives from any rank
# take the others, each once, a sender's in the order sent.
if r == 0:
    first_of_1 = torch.empty(5)
    specific = dist.irecv(first_of_1, src=1, tag=30)
    seen = {q: 0 for q in range(1, n)}
    seen[1] = 1  # its first goes to the receive above
    for i in range(2 * (n - 1) - 1):
        g = torch.empty(5)
        if i % 2:
            sender = dist.recv(g, tag=30)  # src=None: returns the sender
        else:
            w = dist.irecv(g, tag=30)
            w.wait()
            sender = w._source_rank()
        if sender not in seen or seen[sender] > 1:
            raise AssertionError("rank 0: a receive from any rank named rank %r (so far %s)" % (sender, seen))
        same("message %d from rank %d, received from any rank" % (seen[sender], sender), g,
             message(sender, 30 + seen[sender], count=5))
        seen[sender] += 1
    if seen != {q: 2 for q in range(1, n)}:
        raise AssertionError("rank 0: receives from any rank got %s messages per sender, want 2 each" % seen)
    specific.wait()
    same("the receive from rank 1 posted first", first_of_1, message(1, 30, count=5))
    g = torch.empty(5)
    if dist.recv(g, tag=31) != 1:
        raise AssertionError("rank 0: the message with tag 31 is not named rank 1's")
    same("tag 31 from any rank", g, message(1, 32, count=5))
else:
    for k in range(2):
        dist.send(message(r, 30 + k, count=5), dst=0, tag=30)
    if r == 1:
        dist.send(message(1, 32, count=5), dst=0, tag=31)
# On a group (the pair, world ranks 1 and 2: group ranks 0 and 1), a
# receive from any rank takes only the group's messages, and names the
# sender by its group rank (torch's dist.recv turns it into a world rank).
# Rank 1 posts one before anything is sent; meanwhile every rank outside
# the pair sends rank 1 a message with the same tag on the world's group,
# and so does rank 2 (a member, but not on the group); only then does rank 2
# send its two messages on the group. Neither of the world's messages is
# taken by the group's receives; receives from any rank of the world take
# them afterwards.
if r == 1:
    first = torch.empty(5)
    w_group = dist.irecv(first, group=g12, tag=40)
    if w_group.is_completed():
        raise AssertionError("rank 1: a receive from any rank of the group completed before anyone sent")
if r != 1:
    dist.send(message(r, 40, count=5), dst=1, tag=40)  # on the world's group
dist.barrier()
if r == 2:
    for k in (41, 42):
        dist.send(message(2, k, count=5), dst=1, group=g12, tag=40)
elif r == 1:
    w_group.wait()
    if w_group._source_rank() != 1:
        raise AssertionError("rank 1: irecv from any rank of the group named group rank %r, want 1 (world rank 2)" %
                             w_group._source_rank())
    same("the first message on the group", first, message(2, 41, count=5))
    g = torch.empty(5)
    sender = dist.recv(g, group=g12, tag=40)
    if sender != 2:
        raise AssertionError("rank 1: dist.recv from any rank of the group returned %r, want world rank 2" % sender)
    same("the second message on the group", g, message(2, 42, count=5))
    seen = set()
    for _ in range(n - 1):
        g = torch.empty(5)
        sender = dist.recv(g, tag=40)  # the world's group
        if sender in seen or sender == 1:
            raise AssertionError("rank 1: a receive from any rank of the world named rank %r (seen %s)" %
                                 (sender, seen))
        seen.add(sender)
        same("rank %d's message on the world's group" % sender, g, message(sender, 40, count=5))
dist.barrier()


# destroy_process_group(group): the group's process set goes at the next
# point every rank passes (new_group, or remove_destroyed_groups), once
# every member destroyed its groups on it.
def set_ranks():
    return sorted(tuple(_core.process_set(i)[1]) for i in _core.process_set_ids() if i != 0)


low = list(range(n - 1))
g_low = dist.new_group(ranks=low)
if r in low:
    t = torch.ones(1)
    dist.all_reduce(t, group=g_low)
    same("all_reduce on the low group", t, torch.full((1,), float(len(low))))
before = set_ranks()
if tuple(low) not in before or tuple(pair) not in before:
    raise AssertionError("rank %d: process sets %s, want %s and %s among them" % (r, before, low, pair))
if r in low:
    dist.destroy_process_group(g_low)
# Rank 1 (a member of the pair) keeps its group on the pair; rank 2
# destroys its own.
if r == 2:
    dist.destroy_process_group(g12)
g_last = dist.new_group(ranks=[0, n - 1])  # every rank: the removal happens here
after = set_ranks()
if tuple(low) in after:
    raise AssertionError("rank %d: the low group was destroyed on every member, but its set is still there: %s" %
                         (r, after))
if tuple(pair) not in after:
    raise AssertionError("rank %d: rank 1 still has its group on %s, but the set is gone: %s" % (r, pair, after))
if r == 1:
    dist.destroy_process_group(g12)
removed = gdist.remove_destroyed_groups()
if tuple(pair) in set_ranks():
    raise AssertionError("rank %d: the pair's groups are all destroyed, yet its set stays (removed %s): %s" %
                         (r, removed, set_ranks()))
if r in (0, n - 1):
    t = torch.ones(1)
    dist.all_reduce(t, group=g_last)
    same("all_reduce on a group made after the removals", t, torch.full((1,), 2.0))

dist.barrier()
dist.destroy_process_group()
print("PASS rank %d of %d" % (r, n), flush=True)
