"""DistributedOptimizer(op=Adasum): Horovod's delta optimizer.

Adasum combines vectors by their directions, so it is given what each
worker would change its parameters by, not its gradients: every worker
applies the wrapped optimizer to its own gradients (momentum, Adam's
moments and all), takes the change of each parameter (the delta), and the
workers combine their deltas with Adasum; each then sets its parameters to
where they stood before the step plus the combined delta. Every worker ends
the step with the same parameters (the combination is bit-identical on every
worker); the optimizer's own state stays each worker's.

As in Horovod, the local step runs during the backward pass, as soon as
the gradients are there (after backward_passes_per_step passes), so that
combining the deltas overlaps the rest of the backward pass (here bucket by
bucket, see below; Horovod steps parameter by parameter); step()
does the parameters not done yet (those without a gradient this step, whose
delta the wrapped optimizer makes, usually zero) and waits for the deltas.
synchronize() does nothing and skip_synchronize() is refused, since the
gradients are never reduced.

gorovod pairs collectives by their order on each worker, so the deltas are
combined in buckets started in one fixed order, the same on every worker,
as DistributedOptimizer's gradients are (see gorovod.torch.optimizer); each
tensor of a bucket is still combined with its own dot product and norms, so
the buckets do not change the result.
"""

import torch

from gorovod.torch import mpi_ops
from gorovod.torch.mpi_ops import Adasum


def _names(param_groups, ordered, named_parameters):
    """{parameter: name}, after Horovod's checks: tuples, unique names,
    every parameter named."""
    if named_parameters is None:
        return {p: "allreduce.noname.%d.%d" % (i, j)
                for i, group in enumerate(param_groups) for j, p in enumerate(group["params"])}
    named_parameters = list(named_parameters)
    if any(not isinstance(p, tuple) for p in named_parameters):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), usually produced by "
                         "model.named_parameters().")
    names = [k for k, _ in named_parameters]
    dups = sorted({k for k in names if names.count(k) > 1})
    if dups:
        raise ValueError("Parameter names in named_parameters must be unique. Found duplicates: %s" % ", ".join(dups))
    named = {id(p) for _, p in named_parameters}
    unnamed = [p for p in ordered if id(p) not in named]
    if unnamed:
        raise ValueError("named_parameters was specified, but one or more model parameters were not named. "
                         "Python object ids: %s" % ", ".join(str(id(p)) for p in unnamed))
    return {p: k for k, p in named_parameters}


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1):
        super(self.__class__, self).__init__(params)
        from gorovod.torch.optimizer import _buckets
        ordered = [p for group in self.param_groups for p in group["params"]]
        self._parameter_names = _names(self.param_groups, ordered, named_parameters)
        self._compression = compression
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {p: backward_passes_per_step for p in ordered}
        self._requires_update = [p for p in ordered if p.requires_grad]
        # Where each parameter stood before its local step.
        self._starts = {p: torch.zeros_like(p, requires_grad=False) for p in self._requires_update}
        groups = _buckets(self._requires_update)
        position = {p: i for i, p in enumerate(self._requires_update)}
        # The buckets in the order every worker starts them: by their first
        # registered parameter, last first (the order a backward pass
        # usually completes them).
        self._order = sorted((tuple(g) for g in groups), key=lambda g: -min(position[p] for p in g))
        self._group_of = {p: i for i, g in enumerate(self._order) for p in g}
        self._waiting = [len(g) for g in self._order]  # this step's parameters not yet ready, per bucket
        self._next = 0  # the position in _order of the next bucket to start
        self._pending = []  # (bucket, handle, compressed tensors, contexts), in order
        self._grad_accs = []
        for p in self._requires_update:
            grad_acc = p.expand_as(p).grad_fn.next_functions[0][0]
            grad_acc.register_hook(self._make_hook(p))
            self._grad_accs.append(grad_acc)  # the hooks live as long as their accumulators

    def _make_hook(self, p):
        def hook(*ignore):
            if self._allreduce_delay[p] <= 0:
                raise AssertionError("Gradients were computed more than backward_passes_per_step times before call "
                                     "to step(). Increase backward_passes_per_step to accumulate gradients locally.")
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                i = self._group_of[p]
                self._waiting[i] -= 1
                self._start_ready()
        return hook

    def _start_ready(self, everything=False):
        """Starts, in the fixed order, the buckets whose parameters are all
        ready and that no bucket before them is still waiting for; with
        everything, all the buckets not started yet."""
        while self._next < len(self._order) and (everything or self._waiting[self._next] == 0):
            self._start(self._order[self._next])
            self._next += 1

    def _start(self, bucket):
        """Runs the wrapped optimizer's step on the bucket's parameters
        alone, turns each into its delta and starts their combination."""
        ids = {id(p) for p in bucket}
        stashed = [group["params"] for group in self.param_groups]
        try:
            for group in self.param_groups:
                group["params"] = [p for p in group["params"] if id(p) in ids]
            for p in bucket:
                self._starts[p].copy_(p.data)
            super(self.__class__, self).step()
        finally:
            for group, params in zip(self.param_groups, stashed):
                group["params"] = params
        compressed, ctxs = [], []
        for p in bucket:
            p.data.sub_(self._starts[p])  # the parameter holds its delta until step() ends
            c, ctx = self._compression.compress(p.data)
            compressed.append(c)
            ctxs.append(ctx)
        handle = mpi_ops.grouped_allreduce_async_(compressed, op=Adasum)
        self._pending.append((bucket, handle, ctxs))

    def synchronize(self):
        """Nothing to do: Adasum combines the parameters' deltas in step()."""

    def skip_synchronize(self):
        raise AssertionError("Skipping synchronization is not supported when using Adasum optimizer.")

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        try:
            self._start_ready(everything=True)
            for bucket, handle, ctxs in self._pending:
                for p, out, ctx in zip(bucket, mpi_ops.synchronize(handle), ctxs):
                    start = self._starts[p]
                    start.add_(self._compression.decompress(out, ctx))
                    p.data.copy_(start)
        finally:
            self._reset_step()
        return loss

    def _reset_step(self):
        self._pending = []
        self._next = 0
        for i, g in enumerate(self._order):
            self._waiting[i] = len(g)
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step

    def zero_grad(self, *args, **kwargs):
        if self._pending:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before optimizer.step() "
                                 "or optimizer.synchronize(). This is prohibited as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def load_state_dict(self, *args, **kwargs):
        self._forget()
        return super(self.__class__, self).load_state_dict(*args, **kwargs)

    def _forget(self):
        """Drops the combinations in flight (after a world change, which
        failed them) and the accumulation counts; the parameters are
        restored by whoever restores the model."""
        self._reset_step()
