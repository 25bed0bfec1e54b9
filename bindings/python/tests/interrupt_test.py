"""Ctrl-C while a collective is blocked: rank 1 never calls the allreduce,
rank 0 blocks in it; SIGINT to rank 0 must raise KeyboardInterrupt promptly
(the wait is done in slices, so Python handles its signals meanwhile).
Driven by bindings/python/elastic_test.go (TestInterrupt), which sends the
signal, then interrupts gorovod run, which ends the job."""

import os
import sys
import time

import torch

import gorovod.torch as hvd

hvd.init()
if hvd.rank() == 1:
    print("rank 1 pid %d waiting" % os.getpid(), flush=True)
    time.sleep(600)
    sys.exit(1)
print("rank 0 pid %d blocked" % os.getpid(), flush=True)
start = time.monotonic()
try:
    hvd.allreduce(torch.ones(4))
    print("the allreduce returned without rank 1", flush=True)
    sys.exit(1)
except KeyboardInterrupt:
    print("INTERRUPTED after %.2f s" % (time.monotonic() - start), flush=True)
    sys.exit(0)
