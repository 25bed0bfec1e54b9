"""hvd.SyncBatchNorm against torch's BatchNorm on the concatenated batch.

Every rank builds the same global batch (same seed), takes its own slice of
it (the slices differ in size across ranks; with 3 or more workers one is
empty), and runs SyncBatchNorm on it; rank-independent reference: torch's
BatchNorm1d/2d in one process on the whole batch. Over two training steps
and an eval step, compared: the forward output (this rank's rows), the
input's gradient (this rank's rows), the weight and bias gradients summed
over the ranks (each rank's are those of its own batch, which
DistributedOptimizer then reduces), running_mean, running_var and
num_batches_tracked. The data has a large mean and per-channel scales, so
statistics of the local batch instead of the global one show at once.

Prints "PASS rank R of N". Driven by bindings/python/python_test.go.
"""

import torch

import gorovod.torch as hvd

RTOL, ATOL = 1e-4, 1e-5  # float32


def local_sizes(n):
    """Unequal batch sizes: 3, 7, 0, 11, 15, ... (an empty one from 3 workers)."""
    return [0 if r == 2 else 3 + 4 * r for r in range(n)]


def close(what, got, want):
    if got.shape != want.shape or not torch.allclose(got, want, rtol=RTOL, atol=ATOL):
        diff = (got - want).abs().max().item() if got.shape == want.shape else float("nan")
        raise AssertionError("%s differs from torch's BatchNorm on the whole batch (max abs diff %g):\ngot  %s\nwant %s"
                             % (what, diff, got.flatten()[:8].tolist(), want.flatten()[:8].tolist()))


def check(name, ref_cls, shape_rest, momentum, affine, seed):
    r, n = hvd.rank(), hvd.size()
    sizes = local_sizes(n)
    if sum(sizes) < 2:
        sizes = [4]  # alone: a batch of 4
    lo, hi = sum(sizes[:r]), sum(sizes[:r + 1])
    channels = shape_rest[0]
    gen = torch.Generator().manual_seed(seed)

    sync = hvd.SyncBatchNorm(channels, momentum=momentum, affine=affine)
    ref = ref_cls(channels, momentum=momentum, affine=affine)
    if affine:
        with torch.no_grad():
            w = torch.rand(channels, generator=gen) + 0.5
            b = torch.randn(channels, generator=gen)
            for m in (sync, ref):
                m.weight.copy_(w)
                m.bias.copy_(b)

    for step in range(2):
        scale = (torch.arange(channels, dtype=torch.float32) + 1).view([1, channels] + [1] * (len(shape_rest) - 1))
        x_all = torch.randn([sum(sizes)] + list(shape_rest), generator=gen) * scale + 5.0
        g_all = torch.randn(x_all.shape, generator=gen)  # d loss / d y

        x_ref = x_all.clone().requires_grad_()
        y_ref = ref(x_ref)
        (y_ref * g_all).sum().backward()

        x = x_all[lo:hi].clone().requires_grad_()
        y = sync(x)
        (y * g_all[lo:hi]).sum().backward()

        what = "%s step %d: " % (name, step)
        close(what + "output", y.detach(), y_ref.detach()[lo:hi])
        close(what + "input gradient", x.grad, x_ref.grad[lo:hi])
        if affine:
            gw = hvd.allreduce(sync.weight.grad, op=hvd.Sum)
            gb = hvd.allreduce(sync.bias.grad, op=hvd.Sum)
            close(what + "weight gradient (summed over ranks)", gw, ref.weight.grad)
            close(what + "bias gradient (summed over ranks)", gb, ref.bias.grad)
            for m in (sync, ref):
                m.weight.grad = None
                m.bias.grad = None
        close(what + "running_mean", sync.running_mean, ref.running_mean)
        close(what + "running_var", sync.running_var, ref.running_var)
        assert int(sync.num_batches_tracked) == int(ref.num_batches_tracked) == step + 1

    # Eval mode: the running statistics, no collective.
    sync.eval()
    ref.eval()
    x_all = torch.randn([sum(sizes)] + list(shape_rest), generator=gen) * 2 + 1
    with torch.no_grad():
        close(name + " eval output", sync(x_all[lo:hi]), ref(x_all)[lo:hi])


def main():
    hvd.init()
    assert issubclass(hvd.SyncBatchNorm, torch.nn.modules.batchnorm._BatchNorm)
    check("BatchNorm1d (N, C)", torch.nn.BatchNorm1d, (6,), 0.1, True, 1)
    check("BatchNorm1d (N, C, L)", torch.nn.BatchNorm1d, (4, 5), 0.3, True, 2)
    check("BatchNorm2d", torch.nn.BatchNorm2d, (3, 4, 5), 0.1, True, 3)
    check("BatchNorm2d momentum=None", torch.nn.BatchNorm2d, (3, 2, 2), None, True, 4)
    check("BatchNorm2d affine=False", torch.nn.BatchNorm2d, (2, 3, 3), 0.1, False, 5)
    print("PASS rank %d of %d" % (hvd.rank(), hvd.size()), flush=True)


if __name__ == "__main__":
    main()
