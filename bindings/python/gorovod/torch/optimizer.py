"""DistributedOptimizer: the user's optimizer, with its gradients averaged
across the workers before every step, as Horovod's.

A hook on each parameter's gradient accumulator notes when the backward pass
has produced that gradient (after backward_passes_per_step passes), so that
its bucket's allreduce can start and overlap the rest of the backward pass;
step() (or synchronize()) starts the rest, waits for them all and writes the
results into the gradients.

gorovod pairs collectives by their position in each rank's sequence, not by
name (the engine runs calls in submission order and ``name`` is not passed
to it), so every rank must start the same allreduces in the same order. The
ranks need not produce the same gradients in the same order, though: a
branch taken on some ranks only, a parameter one rank does not use, or hooks
that fire in another order on another rank all change which bucket becomes
ready first. So the buckets are started in one fixed order, the same on
every rank because it follows from the optimizer's parameters alone (by the
position of each bucket's first registered parameter, last first: the order
in which a backward pass usually completes them): a bucket whose gradients
are ready is started once every bucket before it in that order has been, and
synchronize() starts the buckets not started yet in the same order, reducing
zeros for the gradients this rank did not produce (as Horovod does). Each
bucket then pairs with the same bucket on every other rank, and the result
is the ranks' average whatever order they produced their gradients in. When
the backward pass completes the buckets in the fixed order, as it does for a
model whose forward pass applies its layers in registration order, every
bucket starts as soon as it is ready, as before; a bucket completed early
waits for the ones before it.
"""

import warnings
from contextlib import contextmanager

import torch

from gorovod.torch import mpi_ops
from gorovod.torch.compression import Compression
from gorovod.torch.mpi_ops import Adasum, Average, global_process_set


# Without ``groups``, the gradients are reduced in buckets, as Horovod's tensor
# fusion and DDP's gradient buckets do: one call per bucket instead of one per
# parameter, each with its round trips, its wake-ups of the communication
# thread and its Python-side cost. A gradient of at least _ALONE_BYTES is
# reduced alone, in place (no copy); the smaller ones, taken in reverse
# registration order (roughly the order the backward pass produces them), are
# packed into one library call per _BUCKET_BYTES, which the library reduces
# through its fusion buffer. A bucket starts once its last gradient is ready
# and the buckets before it in the fixed order (see the module's docstring)
# have started.
_ALONE_BYTES = 1 << 20
_BUCKET_BYTES = 4 << 20


def _buckets(params):
    """The default groups: each large parameter alone, the small ones
    packed (see _ALONE_BYTES), as lists of parameters."""
    buckets, small, size = [], [], 0
    for p in reversed(params):
        n = p.numel() * p.element_size()
        if n >= _ALONE_BYTES:
            buckets.append([p])
            continue
        if small and size + n > _BUCKET_BYTES:
            buckets.append(small)
            small, size = [], 0
        small.append(p)
        size += n
    if small:
        buckets.append(small)
    return buckets


def _parameter_names(param_groups, ordered, named_parameters):
    """{parameter: name} for an optimizer's parameters, after Horovod's checks
    of named_parameters: tuples, unique names, every parameter named. Without
    named_parameters each parameter is named by its group and place, as Horovod
    names them."""
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
    named_ids = {id(p) for _, p in named_parameters}
    unnamed = [p for p in ordered if id(p) not in named_ids]
    if unnamed:
        raise ValueError("named_parameters was specified, but one or more model parameters were not named. "
                         "Python object ids: %s" % ", ".join(str(id(p)) for p in unnamed))
    return {p: k for k, p in named_parameters}


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1, op=Average,
                 gradient_predivide_factor=1.0, groups=None, sparse_as_dense=False, process_set=global_process_set):
        super(self.__class__, self).__init__(params)
        mpi_ops._check_process_set(process_set)
        self._compression = compression
        ordered = [p for group in self.param_groups for p in group["params"]]
        self._parameter_names = _parameter_names(self.param_groups, ordered, named_parameters)
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        # This step's started groups, in submission order: each a list of
        # (handle, parameters, compression contexts).
        self._handles = []
        self._densified = set()  # parameters whose sparse gradient is reduced dense this step
        self._grad_accs = []
        self._requires_update = [p for p in ordered if p.requires_grad]
        self._synchronized = False
        self._should_synchronize = True
        if groups is None:
            groups = _buckets(self._requires_update)
        groups = self._make_groups(groups)
        # The order every rank starts the groups in: by the position of each
        # group's first registered parameter, last first. It follows from the
        # optimizer's parameters alone, so it is the same on every rank
        # whatever gradients each produces, and in what order.
        position = {id(p): i for i, p in enumerate(self._requires_update)}
        self._order = sorted(groups, key=lambda g: -min(position[id(p)] for p in g))
        # The per-step bookkeeping the hooks touch is kept in lists indexed by
        # a parameter's position in _requires_update and a group's in _order,
        # never in dicts keyed by tensors: hashing a tensor is a Python call
        # (Tensor.__hash__), and a tuple of them hashes every one, which cost
        # a small model's step tens of such calls per gradient.
        self._group_of = [0] * len(self._requires_update)  # parameter -> its group's position in _order
        for gi, g in enumerate(self._order):
            for p in g:
                self._group_of[position[id(p)]] = gi
        self._group_sizes = [len(g) for g in self._order]
        # Backward passes each parameter's gradient still awaits this step.
        self._allreduce_delay = [backward_passes_per_step] * len(self._requires_update)
        self._group_counts = [0] * len(self._order)  # this step's ready gradients per group
        self._ready = [False] * len(self._order)  # this step's, by position in _order
        self._next = 0  # the position in _order of the next group to start
        # A rank outside the process set reduces nothing: its step applies
        # its own gradients (as Horovod's).
        if process_set.included():
            self._register_hooks()

    def _make_groups(self, groups):
        """The groups as tuples of parameters, each parameter in one."""
        params = self._requires_update
        if isinstance(groups, int):
            if groups <= 0:
                raise ValueError("groups should be a positive integer or a list of lists of torch.Tensor")
            per = (len(params) + groups - 1) // groups
            split = [params[i:i + per] for i in range(0, len(params), per)]
        elif isinstance(groups, list):
            seen = set()
            split = []
            for g in groups:
                for p in g:
                    if not isinstance(p, torch.Tensor):
                        raise ValueError("groups must consist of torch.Tensor.")
                    if id(p) in seen:
                        raise ValueError("A parameter can only appear once in groups.")
                    seen.add(id(p))
                split.append([p for p in params if any(p is q for q in g)])
            split += [[p] for p in params if id(p) not in seen]
        else:
            raise ValueError("groups should be a positive integer or a list of lists of torch.Tensor")
        return [tuple(g) for g in split if g]

    def _register_hooks(self):
        for i, p in enumerate(self._requires_update):
            grad_acc = p.expand_as(p).grad_fn.next_functions[0][0]
            grad_acc.register_hook(self._make_hook(p, i))
            self._grad_accs.append(grad_acc)  # the hooks live as long as their accumulators

    def _scales(self):
        if self.op == Average:
            # The division by the world size comes on top of the postscale.
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _grad(self, p):
        if p.grad is None:
            # Another worker may have produced this gradient: reduce zeros.
            p.grad = p.data.new(p.size()).zero_()
        if p.grad.is_sparse and self.sparse_as_dense:
            # Reduced dense; the result is made sparse again (_set_grad), as
            # an optimizer such as SparseAdam wants.
            self._densified.add(p)
            p.grad = p.grad.to_dense()
        return p.grad

    def _grouped_allreduce_grad_async(self, group):
        """Starts the reduction of a group's gradients: the dense ones in one
        grouped allreduce, each sparse one (sparse_as_dense off) through
        sparse_allreduce_async, as Horovod reduces them. Returns a list of
        (handle, parameters, compression contexts), the contexts None for a
        sparse one, whose handle is the function that returns it."""
        grads = [self._grad(p) for p in group]
        dense = [(p, g) for p, g in zip(group, grads) if not g.is_sparse]
        pending = []
        if dense:
            pairs = [self._compression.compress(g) for _, g in dense]
            pre, post = self._scales()
            tensors = [c for c, _ in pairs]
            # grouped_allreduce_async_ without its wrappers: the call has no
            # name to check for duplicates or remember.
            handle = mpi_ops._grouped_allreduce_async(tensors, tensors, mpi_ops._op(self.op), pre, post,
                                                      self.process_set)
            pending.append((handle, [p for p, _ in dense], [ctx for _, ctx in pairs]))
        for p, g in zip(group, grads):
            if g.is_sparse:
                pending.append((mpi_ops.sparse_allreduce_async(g, None, self.op, process_set=self.process_set), [p],
                                None))
        return pending

    def _make_hook(self, p, i):
        """The hook of p, the i-th parameter of _requires_update."""
        gi = self._group_of[i]
        delay, counts, size = self._allreduce_delay, self._group_counts, self._group_sizes[gi]

        def hook(*ignore):
            if delay[i] <= 0:
                # This step's gradient of p was counted already.
                raise AssertionError("Gradients were computed more than backward_passes_per_step times before call "
                                     "to step(). Increase backward_passes_per_step to accumulate gradients locally.")
            assert not p.grad.requires_grad
            delay[i] -= 1
            if delay[i] == 0:
                counts[gi] += 1
                if counts[gi] == size:
                    self._ready[gi] = True
                    self._start_ready()
        return hook

    def _start_ready(self, everything=False):
        """Starts, in the fixed order, the groups that are ready and that no
        group before them is still waiting for; with everything, all the
        groups not started yet (synchronize: zeros for the gradients this
        rank did not produce)."""
        order, ready = self._order, self._ready
        while self._next < len(order) and (everything or ready[self._next]):
            self._handles.append(self._grouped_allreduce_grad_async(order[self._next]))
            self._next += 1

    def synchronize(self):
        """Starts the groups not started yet, in the fixed order (with zeros
        for the gradients this rank did not produce), waits for every group's
        allreduce, and writes the results into the gradients."""
        if not self.process_set.included():
            self._synchronized = True
            return
        try:
            self._start_ready(everything=True)
            handles, self._handles = self._handles, []
            for pending in handles:
                for handle, params, ctxs in pending:
                    if ctxs is None:
                        params[0].grad = handle()
                        continue
                    outputs = mpi_ops.synchronize(handle)
                    for q, out, c in zip(params, outputs, ctxs):
                        self._set_grad(q, out, c)
        finally:
            # A failed step's allreduces in flight are dropped (the library
            # keeps their memory until they end), as _forget does.
            self._handles = []
            self._reset_step()
        self._synchronized = True

    def _reset_step(self):
        self._next = 0
        self._densified.clear()
        # In place: the hooks hold these lists.
        n = len(self._order)
        self._ready[:] = [False] * n
        self._group_counts[:] = [0] * n
        self._allreduce_delay[:] = [self.backward_passes_per_step] * len(self._allreduce_delay)

    def _set_grad(self, p, output, ctx):
        reduced = self._compression.decompress(output, ctx)
        if self._densified and p in self._densified:
            self._densified.discard(p)
            p.grad = reduced.to_sparse()
        elif reduced is not p.grad:
            p.grad.copy_(reduced)

    @contextmanager
    def skip_synchronize(self):
        """step() inside this context does not synchronize: for scripts that
        call synchronize() themselves first (gradient clipping, AMP)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training slowdown. You may want to consider "
                              "using optimizer.skip_synchronize() context if you use optimizer.synchronize() in your "
                              "code.")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._handles or any(self._ready):
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before optimizer.step() "
                                 "or optimizer.synchronize(). This is prohibited as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        self._forget()
        return super(self.__class__, self).load_state_dict(*args, **kwargs)

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        self._allreduce_delay[:] = [passes] * len(self._allreduce_delay)

    def _forget(self):
        """Drops the allreduces in flight (after a world change, which failed
        them) and the accumulation counts."""
        self._handles = []
        self._synchronized = False
        self._should_synchronize = True
        self._reset_step()


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Wraps optimizer so that each step averages (op) the gradients across the
    workers first. Arguments as Horovod's: compression (Compression.none or
    .fp16), backward_passes_per_step (accumulate that many backward passes
    locally before reducing), op (Average, Sum, Min, Max, Product, or Adasum:
    then, with more than one worker, Horovod's delta optimizer, see
    gorovod.torch.adasum_optimizer), gradient_predivide_factor (with Average:
    scale by 1/f before the sum and f/size after), groups (an int, or lists
    of parameters reduced together). Returns an optimizer of a new class
    deriving from optimizer's own class, sharing its parameter groups."""
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn("num_groups is deprecated: use groups", DeprecationWarning)
        if groups is None:
            groups = num_groups
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    if op == Adasum and mpi_ops.size() > 1:
        from gorovod.torch.adasum_optimizer import _DistributedAdasumOptimizer
        mpi_ops._check_process_set(process_set)
        cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedAdasumOptimizer.__dict__))
        return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step)
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, groups, sparse_as_dense, process_set)
