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

With ``gradient_accumulation=True`` a step may be several micro-batches:
the loader yields them one by one, and the AdaptiveOptimizer skips step()
and zero_grad() until the step's last (``loader.accumulating`` says which).

Not covered: elastic world changes (a worker joining later starts from the
initial batch until rank 0's next decision reaches it; the loader's
``state_dict`` holds the position for ``elastic.TorchState``, but this path
is untested). Every sum or average allreduce between two steps counts as
the step's gradients for the noise measurement: average metrics with
allgather, or after the loop.
"""

import collections
import ctypes
import math

import torch

from gorovod import _core
from gorovod.torch import mpi_ops

_RULES = {"adascale": 0, "sqrt": 1, "linear": 2}


class _Plan(ctypes.Structure):
    _fields_ = [("global_batch", ctypes.c_int64), ("micro_batch", ctypes.c_int64), ("accum_steps", ctypes.c_int64),
                ("lr_factor", ctypes.c_double)]


class Plan(collections.namedtuple("Plan", "global_batch local_batch accum_steps lr_factor")):
    """A step's plan: the global batch (all workers' samples), this
    worker's samples, the micro-batches beyond the first it accumulates
    them in, and the learning-rate factor."""


def _lib():
    lib = _core.lib()
    if not getattr(lib, "_gorovod_adaptive_prototypes", False):
        lib.gorovod_adaptive_start.argtypes = [ctypes.c_int64] * 4 + [ctypes.c_int, ctypes.c_int]
        lib.gorovod_adaptive_plan.argtypes = [ctypes.POINTER(_Plan)]
        lib.gorovod_adaptive_set_global_batch.argtypes = [ctypes.c_int64]
        lib.gorovod_adaptive_record_micro_batch.argtypes = [ctypes.c_double]
        for f in (lib.gorovod_adaptive_start, lib.gorovod_adaptive_plan, lib.gorovod_adaptive_set_global_batch,
                  lib.gorovod_adaptive_record_micro_batch):
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
        self.gradient_accumulation = False
        self.lr_rule = "adascale"
        self._started = False
        self._in_step = False
        self._optimizer = None  # the AdaptiveOptimizer, told where each step begins
        self.plan = None  # the current step's Plan
        self.micro_index = 0  # the current micro-batch of the step

    def autoscale_batch_size(self, max_batch_size, local_bsz_bounds=None, gradient_accumulation=False):
        """Lets the job grow the global batch up to max_batch_size, each
        worker's micro-batch within local_bsz_bounds = (lo, hi) (None: 1 and
        max_batch_size), accumulating gradients over several micro-batches
        per step when gradient_accumulation is set (a worker's share beyond
        hi, or, alone, a batch beyond the initial one: the gradient noise is
        then measured from the micro-batches). Call it before iterating."""
        if self._started:
            raise RuntimeError("autoscale_batch_size() after the loader started")
        if max_batch_size < self.batch_size:
            raise ValueError("max_batch_size %d is below batch_size %d" % (max_batch_size, self.batch_size))
        lo, hi = local_bsz_bounds if local_bsz_bounds is not None else (0, 0)
        if lo < 0 or hi < 0 or (hi and lo > hi):
            raise ValueError("local_bsz_bounds %r: want 0 <= lo <= hi" % (local_bsz_bounds,))
        self.max_batch_size = max_batch_size
        self.local_bsz_bounds = (lo or 0, hi or 0)
        self.gradient_accumulation = bool(gradient_accumulation)

    def _start(self):
        if self.lr_rule not in _RULES:
            raise ValueError("lr_rule %r: want one of %s" % (self.lr_rule, ", ".join(sorted(_RULES))))
        if self.gradient_accumulation and self._optimizer is None:
            raise RuntimeError("gradient_accumulation needs an AdaptiveOptimizer over the loader (it skips the "
                               "optimizer's step and zero_grad between a step's micro-batches)")
        lo, hi = self.local_bsz_bounds
        _core._raise(_lib().gorovod_adaptive_start(self.batch_size, self.max_batch_size, lo, hi,
                                                   1 if self.gradient_accumulation else 0, _RULES[self.lr_rule]))
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
            self.plan = Plan(step, mine[rank], p.accum_steps, p.lr_factor)
            self.position += step
            self._in_step = True
            _core.record_samples(len(indices))
            if self._optimizer is not None:
                self._optimizer._begin_step(p.accum_steps + 1)
            at = 0
            for i, count in enumerate(shares(len(indices), p.accum_steps + 1)):
                self.micro_index = i
                try:
                    yield self.collate_fn([self.dataset[j] for j in indices[at:at + count]])
                except GeneratorExit:
                    # The loop was left inside this step (break): the step
                    # ends here, on every worker alike.
                    self._end_step()
                    raise
                at += count
        self._end_step()
        self.epoch += 1
        self.position -= n

    @property
    def accumulating(self):
        """Whether the current micro-batch is not the step's last: its
        gradient is accumulated, the optimizer does not step yet."""
        return self.plan is not None and self.micro_index < self.plan.accum_steps

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
    """Wraps a DistributedOptimizer so that each step runs with the learning
    rate scaled by the factor the job decided for the step's batch size:
    lr_rule "adascale" (AdaScale's gain, the default), "sqrt" (square root
    of the batch's ratio to the initial one, for Adam and its relatives) or
    "linear". Make it before the loader starts (the rule is the loader's).

    With the loader's gradient_accumulation, step() and zero_grad() do
    nothing between a step's micro-batches but note each micro-batch's
    gradient norm (the gradient noise comes from them); at the step's last
    micro-batch the gradients are averaged over the micro-batches, reduced
    across the workers and applied. Their allreduces then start at step(),
    not during the backward pass."""

    def __init__(self, optimizer, loader, lr_rule="adascale"):
        if lr_rule not in _RULES:
            raise ValueError("lr_rule %r: want one of %s" % (lr_rule, ", ".join(sorted(_RULES))))
        if loader._started:
            raise RuntimeError("AdaptiveOptimizer must be made before its loader starts")
        if not hasattr(optimizer, "set_backward_passes_per_step"):
            raise ValueError("AdaptiveOptimizer wraps a gorovod DistributedOptimizer")
        loader.lr_rule = lr_rule
        loader._optimizer = self
        self.optimizer = optimizer
        self.loader = loader
        self._micro = 1
        self._seen = None  # the gradients accumulated before the current micro-batch

    def __getattr__(self, name):
        return getattr(self.optimizer, name)

    @property
    def lr_factor(self):
        return self.loader.plan.lr_factor if self.loader.plan else 1.0

    def _params(self):
        return [p for g in self.optimizer.param_groups for p in g["params"] if p.requires_grad]

    def _begin_step(self, micro):
        """Called by the loader before a step's first micro-batch."""
        self._micro, self._seen = micro, None
        # Accumulating, the backward passes must not start the allreduces:
        # the mean over the micro-batches is reduced in step().
        self.optimizer.set_backward_passes_per_step(micro + 1 if micro > 1 else 1)

    def _record_micro_batch(self):
        """Notes the squared norm of the micro-batch just back-propagated:
        the gradients now less those accumulated before it."""
        sq = 0.0
        now = []
        for i, p in enumerate(self._params()):
            g = p.grad.detach() if p.grad is not None else torch.zeros_like(p)
            d = g if self._seen is None else g - self._seen[i]
            sq += float(d.double().pow(2).sum())
            now.append(g.clone())
        self._seen = now
        _core._raise(_lib().gorovod_adaptive_record_micro_batch(sq))

    def step(self, closure=None):
        if self._micro > 1:
            self._record_micro_batch()
            if self.loader.accumulating:
                return None
            self._seen = None
            for p in self._params():
                if p.grad is not None:
                    p.grad.div_(self._micro)
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
        if self._micro > 1 and self.loader.micro_index > 0:
            return None  # inside a step: the micro-batches accumulate
        return self.optimizer.zero_grad(*args, **kwargs)
