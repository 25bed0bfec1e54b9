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
  failed; rank 1's later all_reduces complete both.

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
dist.barrier()

dist.destroy_process_group()
print("PASS rank %d of %d" % (r, n), flush=True)
