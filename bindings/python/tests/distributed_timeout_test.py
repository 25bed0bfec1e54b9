"""Timeouts on the "gorovod" torch.distributed backend (2 ranks), as on Gloo:
a wait past the process group's timeout (init_process_group(timeout=...),
here 2 s) or past work.wait(timeout)'s raises RuntimeError naming the call,
its peer and the timeout, and the world goes on.

- rank 0's isend of 1 MiB (a rendezvous message) to rank 1, whose receive
  is not posted, and a blocking dist.send: wait() raises after the
  group's 2 s while rank 1 sits in an all_reduce; the all_reduce then
  completes on both;
- rank 0's irecv from rank 1, which sends nothing: wait() raises after 2 s,
  and after work.wait(timedelta(seconds=1)) after 1 s;
- the messages are not withdrawn: rank 1's later receives with those tags
  get them, in the order sent, and rank 0's abandoned irecv, waited
  again, gets rank 1's later message;
- an all_reduce only rank 0 has called yet: work.wait(timeout) raises
  naming the timeout; once rank 1 calls it, it completes on both;
- rank 0's receive from any rank (src=None) that nothing matches: wait()
  raises after 2 s; rank 1's later message with its tag completes it,
  naming rank 1;
- dist.barrier() that rank 1 has not reached: rank 0's raises after 2 s
  naming rank 1 as not arrived; once rank 1 reaches it, the world goes on;
- DistributedDataParallel's backward on rank 0 alone: DDP's reducer waits
  for its bucket's future from C++, with no limit of its own; the future
  fails after the group's 2 s and backward() raises RuntimeError naming
  the all_reduce and the timeout (as on Gloo) instead of waiting for ever;
  rank 1's backward, once told, completes the queued allreduce on both;
- the same through an all_reduce's get_future().wait() (torch's C++
  future), for a first all_reduce and one submitted after its future
  failed; rank 1's later all_reduces complete both;
- the collectives made in two steps (every rank's shape or split sizes
  first, then the data): all_gather, all_gather_into_tensor, gather,
  all_to_all_single, all_to_all, scatter, reduce_scatter and
  reduce_scatter_tensor, each made by rank 0 alone: the call returns and
  its wait() raises after the group's 2 s (without their bound the call
  itself waits for the exchange with no limit); rank 1's call, made later,
  completes it on both with the right outputs;
- DistributedDataParallel's constructor on rank 0 alone: its check of the
  parameters times out and the constructor raises naming it (torch's C++
  wait() would let the error pass and go on); and with rank 1 past that
  check, its start-up broadcast of the module's states times out and the
  constructor raises naming it, rather than go on with unsynchronized
  states. Rank 1's later calls complete both, with rank 0's states;
- dist.new_group on rank 0 alone (every rank of the world must call it):
  its set-up raises after the default group's 2 s where new_group is
  given no timeout (a group of rank 1, whose process set it registers),
  and after new_group's own 1 s (a group of both ranks), naming rank 1;
  then both ranks make the same two groups (rank 0's second try), use
  them, and the default group goes on.

Prints "PASS rank R of N". Driven by bindings/python/python_test.go.
"""

import datetime
import os
import re
import tempfile
import threading
import time

import torch
import torch.distributed as dist

import gorovod.torch.distributed  # noqa: F401 (registers the backend when run from a checkout)

GROUP_TIMEOUT = 2.0
# The waits that must not time out (the other rank is meanwhile waiting out
# a timeout, or the machine is loaded) say so.
LONG = datetime.timedelta(seconds=120)
dist.init_process_group("gorovod", timeout=datetime.timedelta(seconds=GROUP_TIMEOUT))
r, n = dist.get_rank(), dist.get_world_size()
if n != 2:
    raise SystemExit("distributed_timeout_test.py runs on 2 ranks, got %d" % n)


def times_out(what, wait, limit, *words):
    """Calls wait(), which must raise RuntimeError after about limit seconds
    with each of words in its message."""
    start = time.monotonic()
    try:
        wait()
    except RuntimeError as e:
        took, text = time.monotonic() - start, str(e)
        # Not before its time; the upper bound only catches a wait that
        # never ended on its own (the harness' limit would, later).
        if took < limit * 0.9 or took > limit + 60:
            raise AssertionError("rank %d: %s raised after %.2fs, want about %gs: %s" % (r, what, took, limit, text))
        missing = [w for w in words if w not in text]
        if missing:
            raise AssertionError("rank %d: %s: %r lacks %s" % (r, what, text, missing))
        # What torch's own tests (distributed_test.py's barrier timeouts)
        # look for in a backend's timeout.
        if not re.search(" (Timed out|closed|timeout) ", text):
            raise AssertionError("rank %d: %s: %r does not read as a timeout to torch's tests" % (r, what, text))
        print("rank %d: %s raised after %.2fs: %s" % (r, what, took, text), flush=True)
        return
    raise AssertionError("rank %d: %s returned; want a timeout" % (r, what))


def allreduce_check(value):
    t = torch.full((4,), float(value + r))
    dist.all_reduce(t, async_op=True).wait(LONG)
    want = torch.full((4,), float(2 * value + 1))
    if not torch.equal(t, want):
        raise AssertionError("rank %d: all_reduce gave %s, want %s" % (r, t.tolist(), want.tolist()))


big = torch.arange(1 << 18, dtype=torch.float32)  # 1 MiB: sent by rendezvous
small = torch.arange(8, dtype=torch.int64)

if r == 0:
    work = dist.isend(big, dst=1, tag=5)
    times_out("isend(...).wait()", work.wait, GROUP_TIMEOUT, "send to rank 1 with tag 5", "timed out after 2s",
              "process group's timeout")
    times_out("dist.send", lambda: dist.send(big + 1, dst=1, tag=5), GROUP_TIMEOUT, "send to rank 1 with tag 5",
              "timed out after 2s")
    got = torch.empty(8, dtype=torch.int64)
    recv = dist.irecv(got, src=1, tag=7)
    times_out("irecv(...).wait()", recv.wait, GROUP_TIMEOUT, "recv from rank 1 with tag 7", "timed out after 2s")
    times_out("irecv(...).wait(1s)", lambda: recv.wait(datetime.timedelta(seconds=1)), 1.0,
              "recv from rank 1 with tag 7", "timed out after 1s", "wait's timeout")
allreduce_check(10)  # rank 1 has waited here meanwhile: the world goes on

# The messages were not withdrawn: rank 1's receives with tag 5 get both
# sends, in order; rank 0's abandoned irecv gets rank 1's message.
if r == 0:
    work.wait(LONG)
    recv.wait(LONG)
    if not torch.equal(got, small * 3):
        raise AssertionError("rank 0: the abandoned irecv got %s" % got.tolist())
else:
    first, second = torch.empty_like(big), torch.empty_like(big)
    dist.irecv(first, src=0, tag=5).wait(LONG)
    dist.irecv(second, src=0, tag=5).wait(LONG)
    if not (torch.equal(first, big) and torch.equal(second, big + 1)):
        raise AssertionError("rank 1: got %s and %s" % (first[:4].tolist(), second[:4].tolist()))
    dist.isend(small * 3, dst=0, tag=7).wait(LONG)

# A collective only rank 0 has called: its wait(timeout) raises; rank 1
# calls it once told that rank 0 has seen the timeout. Told by a file, not
# a message: rank 0's message would come after the collective's frame that
# rank 0 has sent already, which rank 1 reads only in that collective.
told = os.path.join(tempfile.gettempdir(), "gorovod-timeout-test-%s" % os.environ["GOROVOD_JOB_ID"])
t = torch.full((4,), float(r + 1))
if r == 0:
    pending = dist.all_reduce(t, async_op=True)
    times_out("all_reduce wait(1s)", lambda: pending.wait(datetime.timedelta(seconds=1)), 1.0, "all_reduce",
              "timed out after 1s", "wait's timeout")
    open(told, "w").close()
    pending.wait(LONG)
    os.remove(told)
else:
    deadline = time.monotonic() + LONG.total_seconds()
    while not os.path.exists(told):
        if time.monotonic() > deadline:
            raise AssertionError("rank 1: rank 0 did not write %s" % told)
        time.sleep(0.05)
    dist.all_reduce(t, async_op=True).wait(LONG)
if not torch.equal(t, torch.full((4,), 3.0)):
    raise AssertionError("rank %d: the late all_reduce gave %s" % (r, t.tolist()))
allreduce_check(20)


def wait_told(name):
    """Rank 1 waits for rank 0's file (see told above)."""
    deadline = time.monotonic() + LONG.total_seconds()
    while not os.path.exists(name):
        if time.monotonic() > deadline:
            raise AssertionError("rank 1: rank 0 did not write %s" % name)
        time.sleep(0.05)


# A receive from any rank that nothing matches times out as the others do;
# the message sent later completes it.
anysrc = torch.empty(3, dtype=torch.int64)
if r == 0:
    w_any = dist.irecv(anysrc, tag=13)  # src=None
    times_out("irecv(src=None).wait()", w_any.wait, GROUP_TIMEOUT, "recv from any rank with tag 13",
              "timed out after 2s")
allreduce_check(30)
if r == 1:
    dist.send(torch.tensor([7, 8, 9]), dst=0, tag=13)
else:
    w_any.wait(LONG)
    if w_any._source_rank() != 1 or anysrc.tolist() != [7, 8, 9]:
        raise AssertionError("rank 0: the abandoned receive from any rank got %s from %s" %
                             (anysrc.tolist(), w_any._source_rank()))

# A barrier rank 1 has not reached: rank 0's raises after the group's
# timeout naming rank 1; rank 1 reaches it once told, and the world goes
# on (the barrier rank 0 gave up on stays queued and pairs with rank 1's).
told = told + "-barrier"
if r == 0:
    times_out("dist.barrier()", dist.barrier, GROUP_TIMEOUT, "barrier", "timed out after 2s",
              "rank 1 of the group has not made the call")
    open(told, "w").close()
else:
    wait_told(told)
    dist.barrier()
    os.remove(told)
allreduce_check(40)


def bounded(fn, limit):
    """Calls fn on a thread of its own and returns or raises what it did;
    AssertionError if it has not returned after limit seconds (a wait with
    no limit: without the group's timeout on a work's future, C++ waits for
    ever)."""
    outcome = {}

    def run():
        try:
            outcome["value"] = fn()
        except BaseException as e:  # noqa: BLE001 (handed to the caller)
            outcome["error"] = e
    th = threading.Thread(target=run, name="bounded", daemon=True)
    th.start()
    th.join(limit)
    if th.is_alive():
        raise AssertionError("rank %d: still waiting after %gs: a wait from C++ ignores the group's timeout" %
                             (r, limit))
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


# DDP's backward on rank 0 alone: its reducer waits for the bucket's
# future from C++, which fails after the group's timeout; rank 1's backward
# then pairs with the allreduce rank 0 left queued.
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1, bias=False))
told = told + "-ddp"
if r == 0:
    times_out("DDP backward", lambda: bounded(lambda: model(torch.ones(2, 4)).sum().backward(), GROUP_TIMEOUT + 60),
              GROUP_TIMEOUT, "all_reduce", "timed out after 2s", "process group's timeout")
    open(told, "w").close()
else:
    wait_told(told)
    model(torch.ones(2, 4)).sum().backward()
    os.remove(told)
allreduce_check(50)

# The same from Python through the work's future (torch's C++ future, as
# DDP's reducer waits on it): an all_reduce rank 1 has not made fails its
# future after the group's timeout, and so does one submitted after that,
# while the completer still waits for the first; rank 1 then makes both,
# and they complete on both ranks (their Python side, wait()).
told = told + "-future"
a, b = torch.full((4,), float(r + 1)), torch.full((4,), float(10 * (r + 1)))
if r == 0:
    first = dist.all_reduce(a, async_op=True)
    times_out("all_reduce get_future().wait()", lambda: bounded(first.get_future().wait, GROUP_TIMEOUT + 60),
              GROUP_TIMEOUT, "all_reduce", "timed out after 2s", "process group's timeout")
    second = dist.all_reduce(b, async_op=True)
    times_out("a later all_reduce's get_future().wait()",
              lambda: bounded(second.get_future().wait, GROUP_TIMEOUT + 60), GROUP_TIMEOUT, "all_reduce",
              "timed out after 2s")
    open(told, "w").close()
    first.wait(LONG)
    second.wait(LONG)
    os.remove(told)
else:
    wait_told(told)
    dist.all_reduce(a)
    dist.all_reduce(b)
if not (torch.equal(a, torch.full((4,), 3.0)) and torch.equal(b, torch.full((4,), 30.0))):
    raise AssertionError("rank %d: the late all_reduces gave %s and %s" % (r, a.tolist(), b.tolist()))
allreduce_check(60)

# The collectives made in two steps (every rank's shape, or split sizes,
# first, then the data): one only rank 0 has made gives up after the
# group's timeout, from the call (which returns at once) and its wait();
# once rank 1 makes it, it completes on both, with the right values.
# Without their bound the call itself waits for the exchange of shapes,
# with no limit (bounded() reports it).
me = float(r + 1)


def two_step_cases():
    """(name, what the timeout names, start): start() makes the call with
    async_op=True and returns (its work, check), check() raising when the
    outputs are wrong."""
    cases = []

    def all_gather():
        outs = [torch.empty(3) for _ in range(n)]
        return dist.all_gather(outs, torch.full((3,), me), async_op=True), \
            lambda: [o.tolist() for o in outs] == [[q + 1.0] * 3 for q in range(n)]
    cases.append(("all_gather", "all_gather on a group", all_gather))

    def all_gather_into_tensor():
        out = torch.empty(2 * n)
        return dist.all_gather_into_tensor(out, torch.full((2,), me), async_op=True), \
            lambda: out.tolist() == [float(q // 2 + 1) for q in range(2 * n)]
    cases.append(("all_gather_into_tensor", "all_gather_into_tensor", all_gather_into_tensor))

    def gather():
        outs = [torch.empty(2) for _ in range(n)] if r == 0 else None
        return dist.gather(torch.full((2,), me), outs, dst=0, async_op=True), \
            lambda: outs is None or [o.tolist() for o in outs] == [[q + 1.0] * 2 for q in range(n)]
    cases.append(("gather", "gather on a group", gather))

    def all_to_all_single():
        out = torch.empty(n)
        return dist.all_to_all_single(out, torch.full((n,), me), async_op=True), \
            lambda: out.tolist() == [q + 1.0 for q in range(n)]
    cases.append(("all_to_all_single", "all_to_all_single", all_to_all_single))

    def all_to_all():
        outs = [torch.empty(2) for _ in range(n)]
        return dist.all_to_all(outs, [torch.full((2,), me) for _ in range(n)], async_op=True), \
            lambda: [o.tolist() for o in outs] == [[q + 1.0] * 2 for q in range(n)]
    cases.append(("all_to_all", "all_to_all on a group", all_to_all))

    def scatter():
        out = torch.empty(2)
        parts = [torch.full((2,), 10.0 + q) for q in range(n)] if r == 0 else None
        return dist.scatter(out, parts, src=0, async_op=True), lambda: out.tolist() == [10.0 + r] * 2
    cases.append(("scatter", "scatter on a group", scatter))

    def reduce_scatter():
        out = torch.empty(2)
        return dist.reduce_scatter(out, [torch.full((2,), me * (q + 1)) for q in range(n)], async_op=True), \
            lambda: out.tolist() == [3.0 * (r + 1)] * 2
    cases.append(("reduce_scatter", "reduce_scatter on a group", reduce_scatter))

    def reduce_scatter_tensor():
        out = torch.empty(2)
        return dist.reduce_scatter_tensor(out, torch.full((2 * n,), me), async_op=True), \
            lambda: out.tolist() == [3.0] * 2
    cases.append(("reduce_scatter_tensor", "reduce_scatter_tensor", reduce_scatter_tensor))
    return cases


for name, what, start in two_step_cases():
    told = told + "-" + name
    if r == 0:
        made = {}

        def call_and_wait(start=start, made=made):
            made["work"], made["check"] = start()
            made["work"].wait()

        times_out(name, lambda: bounded(call_and_wait, GROUP_TIMEOUT + 30), GROUP_TIMEOUT, what,
                  "timed out after 2s", "process group's timeout")
        open(told, "w").close()
        made["work"].wait(LONG)
        check = made["check"]
        os.remove(told)
    else:
        wait_told(told)
        work, check = start()
        work.wait(LONG)
    if not check():
        raise AssertionError("rank %d: the late %s gave wrong outputs" % (r, name))
    allreduce_check(70)


# DistributedDataParallel's constructor on rank 0 alone: its check of the
# parameters (an all_gather of their number, which torch waits on from C++,
# whose wait() lets its error pass) gives up after the group's timeout, and
# the constructor raises instead of going on unchecked. Rank 1 then makes
# the same all_gather (of its 4 parameters' number), which completes the
# one rank 0 left queued: the world goes on.
def model_of(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))


def states_of(module):
    return [t.detach().clone() for t in list(module.parameters()) + list(module.buffers())]


BUCKET = int(250 * 1024 * 1024)  # DDP's broadcast_bucket_size


class patient(object):
    """The group's timeout is LONG inside the with block: for the calls
    from C++ that must not time out while the other rank catches up (their
    waits have no limit of their own)."""

    def __enter__(self):
        self.timeout, dist.group.WORLD.timeout = dist.group.WORLD.timeout, LONG

    def __exit__(self, *exc):
        dist.group.WORLD.timeout = self.timeout


reference = states_of(model_of(0))  # rank 0's
told = told + "-ddp-check"
module = model_of(r)
if r == 0:
    times_out("DDP constructor (its check of the parameters)",
              lambda: bounded(lambda: torch.nn.parallel.DistributedDataParallel(module), GROUP_TIMEOUT + 30),
              GROUP_TIMEOUT, "_verify_params_across_processes", "timed out after 2s", "process group's timeout")
    open(told, "w").close()
    allreduce_check(80)
    os.remove(told)
else:
    wait_told(told)
    counts = [torch.empty(1, dtype=torch.int64) for _ in range(n)]
    dist.all_gather(counts, torch.tensor([len(list(module.parameters()))]))
    if [c.item() for c in counts] != [4] * n:
        raise AssertionError("rank 1: the all_gather DDP's check left queued on rank 0 gave %s" % counts)
    allreduce_check(80)

# The start-up broadcast of the module's states itself, which rank 1 (it
# made the check, as DDP's constructor does first) has not made: the
# constructor raises after the group's timeout rather than go on with
# rank 0's own states as if synchronized. Rank 1's broadcast, made later,
# completes the one rank 0 left queued.
told = told + "-ddp-broadcast"
module = model_of(r)
if r == 0:
    times_out("DDP constructor (its broadcast of the module's states)",
              lambda: bounded(lambda: torch.nn.parallel.DistributedDataParallel(module), GROUP_TIMEOUT + 30),
              GROUP_TIMEOUT, "_broadcast_coalesced", "broadcast on a group", "timed out after 2s",
              "process group's timeout")
    open(told, "w").close()
    allreduce_check(90)
    os.remove(told)
else:
    with patient():
        torch.distributed.utils._verify_param_shape_across_processes(dist.group.WORLD, list(module.parameters()))
    wait_told(told)
    with patient():
        torch.distributed.utils._sync_module_states(module, dist.group.WORLD, BUCKET, 0, set())
    allreduce_check(90)
if not all(torch.equal(a, b) for a, b in zip(states_of(module), reference)):
    raise AssertionError("rank %d: the late start-up broadcast left other states than rank 0's" % r)

# dist.new_group, which every rank of the world calls, members of the group
# or not: made by rank 0 alone, its set-up gives up after the default
# group's timeout (2 s) where new_group is given none, and after
# new_group's own (1 s) where it is given one, naming rank 1, and leaves
# nothing behind: rank 1, told, then makes the same two groups with rank 0
# (rank 0's second try of each), both use them, and the default group goes
# on. Without the bound the first set-up waits in the registration of the
# group's process set for gorovod's I/O timeout (10 minutes: bounded()
# reports it).
told = told + "-new-group"
if r == 0:
    times_out("new_group([1]) alone", lambda: bounded(lambda: dist.new_group([1]), GROUP_TIMEOUT + 30),
              GROUP_TIMEOUT, "new_group(ranks=[1])", "timed out after 2s", "the default group's timeout",
              "rank 1 has not called it")
    times_out("new_group([0, 1], timeout=1s) alone",
              lambda: bounded(lambda: dist.new_group([0, 1], timeout=datetime.timedelta(seconds=1)), 1 + 30),
              1.0, "new_group(ranks=[0, 1])", "timed out after 1s", "new_group's timeout", "rank 1 has not called it")
    open(told, "w").close()
else:
    wait_told(told)
    os.remove(told)
ones = dist.new_group([1], timeout=LONG)
both = dist.new_group([0, 1], timeout=LONG)
if dist.get_world_size(both) != 2 or dist.get_rank(both) != r:
    raise AssertionError("rank %d: the group of both ranks has this rank as %d of %d" %
                         (r, dist.get_rank(both), dist.get_world_size(both)))
t = torch.full((3,), float(r + 1))
dist.all_reduce(t, group=both, async_op=True).wait(LONG)
if not torch.equal(t, torch.full((3,), 3.0)):
    raise AssertionError("rank %d: all_reduce on the group made after the timeouts gave %s" % (r, t.tolist()))
if r == 1:
    u = torch.full((2,), 5.0)
    dist.all_reduce(u, group=ones, async_op=True).wait(LONG)
    if dist.get_world_size(ones) != 1 or not torch.equal(u, torch.full((2,), 5.0)):
        raise AssertionError("rank 1: the group of rank 1 alone gave %s at size %d" %
                             (u.tolist(), dist.get_world_size(ones)))
elif ones != dist.GroupMember.NON_GROUP_MEMBER:
    raise AssertionError("rank 0: new_group([1]) gave %r, want NON_GROUP_MEMBER" % (ones,))
allreduce_check(100)
dist.barrier()

dist.destroy_process_group()
print("PASS rank %d of %d" % (r, n), flush=True)
