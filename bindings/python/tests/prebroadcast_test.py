"""A script converted from non-elastic Horovod broadcasts its parameters and
its optimizer state before its elastic loop. The Go test
(TestWorldChangeBeforeElasticLoop) kills one rank with kill -9 while the
others broadcast: each survivor's broadcast raises HorovodInternalError,
Horovod's recoverable error (the one its elastic loop restarts from), never
a MismatchError or a hang. Each rank prints, under the rank it started with
(its rank in the new world may differ), which error it got, and exits 3 for
HorovodInternalError, 4 for any other, 5 for none within the time limit.
"""

import os
import sys
import time

import torch

import gorovod.torch as hvd

hvd.init()
rank = hvd.rank()
torch.manual_seed(rank)
torch.set_num_threads(1)
model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(8)])
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
print("rank %d pid %d broadcasting" % (rank, os.getpid()), flush=True)
deadline = time.monotonic() + 120
try:
    while time.monotonic() < deadline:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
except hvd.HorovodInternalError:
    print("rank %d: HorovodInternalError" % rank, flush=True)
    sys.exit(3)
except Exception as e:  # reported, so that the test names it
    print("rank %d: %s: %s" % (rank, type(e).__name__, e), flush=True)
    sys.exit(4)
print("rank %d: no error within 120 s" % rank, flush=True)
sys.exit(5)
