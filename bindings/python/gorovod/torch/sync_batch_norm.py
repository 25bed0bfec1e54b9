"""SyncBatchNorm: batch normalization over the batch of every worker
(Horovod's ``hvd.SyncBatchNorm``).

In training mode with more than one worker, each channel's mean and variance
are those of the global batch, the concatenation of every worker's local
batch (local batches may differ in size, and may be empty); the running
statistics are updated with the global mean and the unbiased global
variance; the gradient of the input accounts for every worker's part of the
batch. In eval mode, or with one worker, it is torch's batch normalization.

How: the forward pass allgathers each worker's per-channel count, mean and
sum of squared deviations from its mean, and combines them (the pairwise
formula of Chan et al., in float64: no cancellation of sums of squares). The
backward pass allreduces (Sum) the per-channel sums of dy and of dy * (x -
mean), which the input's gradient needs over the global batch. The weight
and bias gradients are those of the local batch, as for any other parameter:
DistributedOptimizer averages them across workers. Every worker must run the
layer's forward and backward passes in the same order (collectives pair by
order).

Tested on CPU tensors only. gorovod's collectives take CPU tensors only (the
CUDA path is not wired into the C ABI), so a CUDA input raises ValueError
from the collective in training mode with more than one worker; nothing here
has run on a GPU.
"""

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from gorovod.torch.mpi_ops import allgather, allreduce_, size, Sum


class SyncBatchNorm(_BatchNorm):
    """Batch normalization over the global batch of all workers; takes input
    of shape (N, C) or (N, C, *) like BatchNorm1d/2d/3d. Arguments as
    torch.nn.BatchNorm2d's."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True):
        super().__init__(num_features, eps=eps, momentum=momentum, affine=affine,
                         track_running_stats=track_running_stats)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got %dD input)" % input.dim())

    def forward(self, input):
        if not self.training or size() == 1:
            return super().forward(input)
        self._check_input_dim(input)
        if input.shape[1] != self.num_features:
            raise ValueError("SyncBatchNorm: input has %d channels, the layer %d" %
                             (input.shape[1], self.num_features))
        factor = 0.0 if self.momentum is None else self.momentum
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # a cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked)
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias, self.running_mean, self.running_var,
                                            self.eps, factor)


def _shape(x):
    """The shape per-channel values take to broadcast against x."""
    return [1, x.shape[1]] + [1] * (x.dim() - 2)


def _reduce_dims(x):
    return [0] + list(range(2, x.dim()))


class _SyncBatchNormFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, factor):
        x = x.contiguous()
        channels = x.shape[1]
        count = x.numel() // channels if channels else 0
        xs = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        if count > 0:
            var, mean = torch.var_mean(xs, dim=_reduce_dims(x), unbiased=False)
            local = torch.cat([torch.tensor([float(count)], dtype=torch.float64, device=x.device), mean.double(),
                               var.double() * count])
        else:  # an empty local batch still takes part
            local = torch.zeros(1 + 2 * channels, dtype=torch.float64, device=x.device)
        gathered = allgather(local.unsqueeze(0))  # (workers, 1 + 2C)
        counts = gathered[:, :1]
        means, m2s = gathered[:, 1:1 + channels], gathered[:, 1 + channels:]
        total = float(counts.sum())
        if total <= 1:
            raise ValueError("SyncBatchNorm: expected more than 1 value per channel when training (the global "
                             "batch has %d)" % int(total))
        g_mean = (counts * means).sum(0) / total
        g_m2 = (m2s + counts * (means - g_mean) ** 2).sum(0)
        g_var = g_m2 / total  # biased: what normalizes
        invstd = torch.rsqrt(g_var + eps)

        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - factor).add_(g_mean.to(running_mean.dtype), alpha=factor)
                running_var.mul_(1 - factor).add_((g_m2 / (total - 1)).to(running_var.dtype), alpha=factor)

        shape = _shape(x)
        mean_x, invstd_x = g_mean.to(xs.dtype).view(shape), invstd.to(xs.dtype).view(shape)
        y = (xs - mean_x) * invstd_x
        if weight is not None:
            y = y * weight.to(xs.dtype).view(shape)
        if bias is not None:
            y = y + bias.to(xs.dtype).view(shape)
        ctx.save_for_backward(x, weight, mean_x, invstd_x)
        ctx.total = total
        ctx.bias_dtype = None if bias is None else bias.dtype
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean_x, invstd_x = ctx.saved_tensors
        shape, dims = _shape(x), _reduce_dims(x)
        xs = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        dy = dy.contiguous().to(xs.dtype)
        xmu = xs - mean_x
        sum_dy = dy.sum(dims)
        sum_dy_xmu = (dy * xmu).sum(dims)
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            # Over the global batch: every worker's part of the batch moves
            # the mean and variance this worker's x was normalized with.
            sums = allreduce_(torch.cat([sum_dy, sum_dy_xmu]).double(), op=Sum)
            channels = x.shape[1]
            mean_dy = (sums[:channels] / ctx.total).to(xs.dtype).view(shape)
            mean_dy_xmu = (sums[channels:] / ctx.total).to(xs.dtype).view(shape)
            scale = invstd_x if weight is None else invstd_x * weight.to(xs.dtype).view(shape)
            grad_x = (scale * (dy - mean_dy - xmu * invstd_x * invstd_x * mean_dy_xmu)).to(x.dtype)
        if weight is not None and ctx.needs_input_grad[1]:
            grad_weight = (sum_dy_xmu * invstd_x.view(-1)).to(weight.dtype)
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            grad_bias = sum_dy.to(ctx.bias_dtype)
        return grad_x, grad_weight, grad_bias, None, None, None, None
