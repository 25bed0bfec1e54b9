"""dist.new_group while a rank leaves the job gracefully: the last rank of
the world turns SIGTERM into an exit (a handler that raises SystemExit, so
Python's exit shuts gorovod down and gossip is told goodbye, not a
failure), prints "rank R pid P waits for SIGTERM" and waits for it; the
other ranks print "rank R calls new_group" and make a group of every rank
but the last, with a timeout of 10 minutes. The Go test
(TestTorchDistributedNewGroupRankLeaves) sends SIGTERM once they are there.
Each other rank must raise RuntimeError naming the rank that left, well
before the timeout; it then prints how long it waited and "PASS rank R of
N" (N the world's size less the rank that left).
"""

import datetime
import os
import signal
import sys
import time

import torch.distributed as dist

import gorovod.torch.distributed  # noqa: F401 (registers the "gorovod" backend)

dist.init_process_group("gorovod")
r, n = dist.get_rank(), dist.get_world_size()
last = n - 1

if r == last:

    def leave(signum, frame):
        print("rank %d leaves on SIGTERM" % r, flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, leave)
    print("rank %d pid %d waits for SIGTERM" % (r, os.getpid()), flush=True)
    while True:
        signal.pause()

print("rank %d calls new_group" % r, flush=True)
start = time.monotonic()
try:
    dist.new_group(ranks=list(range(last)), timeout=datetime.timedelta(minutes=10))
except RuntimeError as e:
    took = time.monotonic() - start
    want = "rank %d left the job" % last
    if want not in str(e):
        raise AssertionError("rank %d: new_group raised %r, want it to say %r" % (r, e, want))
    print("rank %d: new_group raised after %.1fs: %s" % (r, took, e), flush=True)
else:
    raise AssertionError("rank %d: new_group returned though rank %d left the job before calling it" % (r, last))
print("PASS rank %d of %d" % (r, last), flush=True)
