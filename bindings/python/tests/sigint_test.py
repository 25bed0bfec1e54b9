"""SIGINT and the synchronous calls, at 2 workers (driven by
bindings/python/python_test.go, TestSigintHandlers):

- a script with a SIGINT handler of its own: a collective waiting for a slow
  peer is waited for in slices, so the handler runs during the wait, and the
  collective is not aborted: it completes with the right result;
- the default handler: small collectives run on Python's thread (the
  library's SIGINT watch is then in front of Python's handler, which it
  still calls: a SIGINT between collectives raises KeyboardInterrupt as
  always), and they keep working after a KeyboardInterrupt caught between
  them;
- a collective from another thread than the main one.
"""

import signal
import threading
import time

import torch

import gorovod.torch as hvd

hvd.init()
rank, n = hvd.rank(), hvd.size()
assert n == 2

# A handler of the script's own: rank 0 waits for rank 1, which is late;
# rank 0 signals itself during the wait.
seen = []
previous = signal.signal(signal.SIGINT, lambda sig, frame: seen.append(time.monotonic()))
t = torch.full((4,), float(rank + 1))
if rank == 0:
    threading.Timer(0.5, lambda: signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)).start()
    start = time.monotonic()
    hvd.allreduce_(t, op=hvd.Sum)
    end = time.monotonic()
    assert seen and start < seen[0] < end, (start, seen, end)
else:
    time.sleep(2)
    hvd.allreduce_(t, op=hvd.Sum)
assert torch.equal(t, torch.full((4,), 3.0)), t
signal.signal(signal.SIGINT, previous)

# The default handler: a small allreduce on this thread (which installs the
# library's watch), then a SIGINT between collectives is Python's
# KeyboardInterrupt, and collectives go on afterwards.
assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
t = torch.full((4,), float(rank + 1))
hvd.allreduce_(t, op=hvd.Sum)
assert torch.equal(t, torch.full((4,), 3.0)), t
try:
    signal.raise_signal(signal.SIGINT)
    for _ in range(100):
        time.sleep(0.01)
    raise AssertionError("no KeyboardInterrupt")
except KeyboardInterrupt:
    pass
for i in range(50):
    t = torch.full((1024,), float(rank + i))
    hvd.allreduce_(t, op=hvd.Sum)
    assert torch.equal(t, torch.full((1024,), float(1 + 2 * i))), (i, t)
hvd.barrier()

# From another thread (Ctrl-C goes to the main thread: not interruptible).
out = []
th = threading.Thread(target=lambda: out.append(hvd.allreduce(torch.full((8,), float(rank)), op=hvd.Sum)))
th.start()
th.join(60)
assert out and torch.equal(out[0], torch.full((8,), 1.0)), out

print("PASS rank %d of %d" % (rank, n), flush=True)
hvd.shutdown()
