"""elastic.State and elastic.run refuse bad input with a TypeError that says
what is wrong (alone, no job: nothing here makes a collective). Prints
"PASS rank 0 of 1"."""

import torch
from torch.nn.parallel import DistributedDataParallel

import gorovod.torch.distributed.elastic as elastic
from gorovod.torch.elastic import TorchState

model = torch.nn.Linear(2, 1)
data = torch.utils.data.TensorDataset(torch.zeros(4, 2))
for what, make, says in (
        ("a DDP module", lambda: elastic.State(DistributedDataParallel.__new__(DistributedDataParallel)),
         "not a DistributedDataParallel"),
        ("not a module", lambda: elastic.State(object()), "must be a torch.nn.Module"),
        ("another sampler", lambda: elastic.State(model, sampler=torch.utils.data.SequentialSampler(data)),
         "must be an ElasticSampler"),
        ("an attribute named module", lambda: elastic.State(model, module=1), "the state's own attribute"),
        ("run on a TorchState", lambda: elastic.run(lambda s: None)(TorchState(model)), "elastic.State")):
    try:
        make()
    except TypeError as e:
        assert says in str(e), "%s: %s" % (what, e)
    else:
        raise AssertionError("%s: no TypeError" % what)
print("PASS rank 0 of 1", flush=True)
