"""A job that cannot go on stops its other workers: rank 1 raises at once,
rank 0 waits; the job, below its minimum of 2, ends and stops rank 0 with
SIGINT, which Python raises as KeyboardInterrupt in its sleep. Driven by
bindings/python/elastic_test.go (TestStoppedWorkerEndsQuietly), which reads
what each worker printed."""

import os
import time

import gorovod.torch as hvd

hvd.init()
if hvd.rank() == 1:
    raise RuntimeError("rank 1 fails on purpose")
print("rank 0 pid %d waiting" % os.getpid(), flush=True)
time.sleep(600)
print("rank 0 was not stopped", flush=True)
