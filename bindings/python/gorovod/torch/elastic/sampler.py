"""ElasticSampler: shards a data set across a changing number of workers so
that no sample of a data epoch is lost or repeated when the world changes."""

import math
import random

import torch.utils.data

from gorovod import _core
from gorovod.torch.mpi_ops import rank, size


class ElasticSampler(torch.utils.data.Sampler):
    """A DistributedSampler whose position survives world changes.

    The position is a property of the whole job: the data epoch and how many
    samples of the epoch's order the world has processed (a prefix, since
    every worker takes its share of each step's samples in the same order).
    Each time the sampler is reset — when TorchState synchronizes it after a
    world change — the samples not yet processed are split among the current
    workers, worker r taking every size-th one from position r. So a sample
    processed before the change is not seen again, and none is skipped.

    Use it as Horovod's: include it in the TorchState, call
    ``record_batch(batch_idx, batch_size)`` after each step, and commit; call
    ``set_epoch(e)`` when moving to epoch e. Unlike Horovod's, setting the
    epoch the sampler is already in keeps its position, so calling set_epoch
    at the top of the epoch loop (after a reset in mid-epoch) does not start
    the epoch over. As DistributedSampler, it pads the remaining samples to a
    multiple of the world size, so up to size-1 samples are seen twice at the
    end of an epoch.

    Args:
        dataset: the data set (of constant length).
        shuffle: shuffle the order each epoch (seed + epoch), the same on
            every worker.
        seed: the shuffling seed, identical on every worker.
    """

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch):
        """Moves to the start of data epoch epoch (no change when the sampler
        is already in it)."""
        if epoch == self.epoch:
            return
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Records that every worker has processed a batch of batch_size
        samples (call it once per step, before commit)."""
        self.processed_num = min(len(self.dataset), self.processed_num + batch_size * self.num_replicas)
        if _core.is_initialized():
            _core.record_samples(batch_size)

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def state_dict(self):
        return dict(epoch=self.epoch, processed_num=self.processed_num)

    def reset(self):
        """Re-splits the samples not processed yet among the current world."""
        self.num_replicas = size() if _core.is_initialized() else 1
        self.rank = rank() if _core.is_initialized() else 0
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        indices = self.remaining_indices[:]
        indices += indices[:self.total_size - len(indices)]
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self):
        return self.num_samples
