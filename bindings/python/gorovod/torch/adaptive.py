"""The adaptive batch size (AdaptDL / Pollux) for a PyTorch loop:
``AdaptiveDataLoader`` and ``AdaptiveOptimizer``, modelled on AdaptDL's
``adaptdl.torch.AdaptiveDataLoader`` and its learning-rate scaling rules.

The decisions are the Go side's (gorovod_adaptive.h): the gradient noise is
measured in the gradient allreduces, the throughput model is fitted to the
steps, and rank 0 picks each step's batch size and learning-rate factor for
the highest predicted goodput; every worker receives the same decision beside
the gradients and adopts it at the step's commit, which the loader makes.

    loader = AdaptiveDataLoader(dataset, batch_size=64, shuffle=True)
    loader.autoscale_batch_size(1024, local_bsz_bounds=(16, 256))
    optimizer = AdaptiveOptimizer(hvd.DistributedOptimizer(opt, ...), loader, lr_rule="adascale")
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()      # the learning rate times the step's factor

Every worker must build the loader and iterate it alike. The sampler is exact
across batch-size changes: each epoch is one permutation (the same on every
worker, seeded by seed + epoch), each step takes the next ``global batch``
indices of the permutations one after the other (the epoch's last step goes
on into the next epoch's) and splits them among the workers in rank order:
every sample is used exactly once per epoch whatever the batch sizes, and
every step has the planned batch. Samples are loaded in the calling process
(no DataLoader worker processes: the batch size is decided step by step).

Not offered here: gradient accumulation (``gradient_accumulation=True``
raises), and elastic world changes (a worker joining later starts from the
initial batch until rank 0's next decision reaches it; the loader's
``state_dict`` holds the position for ``elastic.TorchState``, but this path
is untested).
"""

import ctypes
import math

import torch

from gorovod import _core
from gorovod.torch import mpi_ops

_RULES = {"adascale": 0, "sqrt": 1, "linear": 2}


class _Plan(ctypes.Structure):
    _fields_ = [("global_batch", ctypes.c_int64), ("local_batch", ctypes.c_int64), ("lr_factor", ctypes.c_double)]


def _lib():
    lib = _core.lib()
    if not getattr(lib, "_gorovod_adaptive_prototypes", False):
        lib.gorovod_adaptive_start.argtypes = [ctypes.c_int64] * 4 + [ctypes.c_int]
        lib.gorovod_adaptive_plan.argtypes = [ctypes.POINTER(_Plan)]
        lib.gorovod_adaptive_set_global_batch.argtypes = [ctypes.c_int64]
        for f in (lib.gorovod_adaptive_start, lib.gorovod_adaptive_plan, lib.gorovod_adaptive_set_global_batch):
            f.restype = ctypes.c_int
        lib._gorovod_adaptive_prototypes = True
    return lib


def shares(count, parts):
    """Splits count into parts integers differing by at most one, the larger
    first (the workers' shares of a step)."""
    q, r = divmod(count, parts)
    return [q + 1 if i < r else q for i in range(parts)]


class AdaptiveDataLoader:
    """Iterates a map-style dataset in batches whose size the job decides
    (see the module's docstring). batch_size is the initial global batch
    M0, all workers together, which the learning rate is tuned for."""

    def __init__(self, dataset, batch_size=32, shuffle=True, seed=0, collate_fn=None):
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1, got %d" % batch_size)
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.collate_fn = collate_fn or torch.utils.data.default_collate
        self.epoch = 0
        self.position = 0  # samples of the epoch's permutation used, all workers together
        self.max_batch_size = batch_size
        self.local_bsz_bounds = (0, 0)
        self.lr_rule = "adascale"
        self._started = False
        self._in_step = False
        self.plan = None  # the current step's (global batch, local batch, lr factor)

    def autoscale_batch_size(self, max_batch_size, local_bsz_bounds=None, gradient_accumulation=False):
        """Lets the job grow the global batch up to max_batch_size, each
        worker's batch within local_bsz_bounds = (lo, hi) (None: 1 and
        max_batch_size). Call it before iterating."""
        if gradient_accumulation:
            raise NotImplementedError("gorovod's AdaptiveDataLoader does not accumulate gradients yet "
                                      "(gradient_accumulation=True); the Go loop (sync.Train) does")
        if self._started:
            raise RuntimeError("autoscale_batch_size() after the loader started")
        if max_batch_size < self.batch_size:
            raise ValueError("max_batch_size %d is below batch_size %d" % (max_batch_size, self.batch_size))
        lo, hi = local_bsz_bounds if local_bsz_bounds is not None else (0, 0)
        if lo < 0 or hi < 0 or (hi and lo > hi):
            raise ValueError("local_bsz_bounds %r: want 0 <= lo <= hi" % (local_bsz_bounds,))
        self.max_batch_size = max_batch_size
        self.local_bsz_bounds = (lo or 0, hi or 0)

    def _start(self):
        if self.lr_rule not in _RULES:
            raise ValueError("lr_rule %r: want one of %s" % (self.lr_rule, ", ".join(sorted(_RULES))))
        lo, hi = self.local_bsz_bounds
        _core._raise(_lib().gorovod_adaptive_start(self.batch_size, self.max_batch_size, lo, hi, _RULES[self.lr_rule]))
        self._started = True

    def _permutation(self, epoch):
        n = len(self.dataset)
        if not self.shuffle:
            return list(range(n))
        g = torch.Generator()
        g.manual_seed(self.seed + epoch)
        return torch.randperm(n, generator=g).tolist()

    def _end_step(self):
        if self._in_step:
            self._in_step = False
            _core.commit()

    def __iter__(self):
        if not self._started:
            self._start()
        order, following = self._permutation(self.epoch), None
        n = len(order)
        while self.position < n:
            self._end_step()  # the step before: its decision is adopted here
            size, rank = mpi_ops.size(), mpi_ops.rank()
            p = _Plan()
            _core._raise(_lib().gorovod_adaptive_plan(ctypes.byref(p)))
            step = p.global_batch
            mine = shares(step, size)
            start = self.position + sum(mine[:rank])
            end = start + mine[rank]
            if end > n and following is None:
                # The epoch's last step goes on into the next epoch's
                # permutation: every step keeps the planned batch, and every
                # sample is still used once per permutation.
                following = self._permutation(self.epoch + 1)
            indices = [order[i] if i < n else following[i - n] for i in range(start, end)]
            _core._raise(_lib().gorovod_adaptive_set_global_batch(step))
            self.plan = (step, mine[rank], p.lr_factor)
            self.position += step
            self._in_step = True
            _core.record_samples(len(indices))
            try:
                yield self.collate_fn([self.dataset[i] for i in indices])
            except GeneratorExit:
                # The loop was left after this step's batch (break): the
                # step ends here, on every worker alike.
                self._end_step()
                raise
        self._end_step()
        self.epoch += 1
        self.position -= n

    def __len__(self):
        """Steps left in this epoch at the current global batch (an estimate:
        the batch size may change)."""
        return max(0, math.ceil((len(self.dataset) - self.position) / self.current_batch_size))

    @property
    def current_batch_size(self):
        """The current step's global batch."""
        return self.plan[0] if self.plan else self.batch_size

    def state_dict(self):
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state):
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


class AdaptiveOptimizer:
    """Wraps an optimizer (usually a DistributedOptimizer) so that each
    step runs with the learning rate scaled by the factor the job decided
    for the step's batch size: lr_rule "adascale" (AdaScale's gain, the
    default), "sqrt" (square root of the batch's ratio to the initial one,
    for Adam and its relatives) or "linear". The rule is the loader's (set
    here, before the loader starts)."""

    def __init__(self, optimizer, loader, lr_rule="adascale"):
        if lr_rule not in _RULES:
            raise ValueError("lr_rule %r: want one of %s" % (lr_rule, ", ".join(sorted(_RULES))))
        if loader._started:
            raise RuntimeError("AdaptiveOptimizer must be made before its loader starts")
        loader.lr_rule = lr_rule
        self.optimizer = optimizer
        self.loader = loader

    def __getattr__(self, name):
        return getattr(self.optimizer, name)

    @property
    def lr_factor(self):
        return self.loader.plan[2] if self.loader.plan else 1.0

    def step(self, closure=None):
        f = self.lr_factor
        base = [g["lr"] for g in self.optimizer.param_groups]
        for g in self.optimizer.param_groups:
            g["lr"] = g["lr"] * f
        try:
            return self.optimizer.step(closure)
        finally:
            for g, lr in zip(self.optimizer.param_groups, base):
                g["lr"] = lr

    def zero_grad(self, *args, **kwargs):
        return self.optimizer.zero_grad(*args, **kwargs)
