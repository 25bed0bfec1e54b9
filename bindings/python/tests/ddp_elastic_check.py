"""Checks a run of ddp_elastic_test.py from its workers' logs (see there):

1. the steps the world committed: world w's steps up to where the next
   world resumed (a step logged at or after that position was rolled back);
   each committed step has one entry per rank of its world;
2. every sample of every data epoch is in exactly one committed step (the
   samples padding an epoch's end apart, at most size-1 of them);
3. a one-process reference trained on the committed steps in order (each
   step's gradient the average of its ranks' mean-loss gradients, as DDP's)
   ends with rank 0's final parameters, within float rounding (the ranks'
   gradients are summed in another order).

Usage: ddp_elastic_check.py LOG_DIR SAMPLES EPOCHS. Prints what it found and
"CHECK OK", or the first violation and exits with status 1.
"""

import glob
import os
import sys

import torch
import torch.nn.functional as F


def dataset(samples):
    """The same synthetic regression data on every worker and here: sample
    i is (i, x_i, y_i)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(samples, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(samples, 1, generator=g)
    return torch.utils.data.TensorDataset(torch.arange(samples), x, y)


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def fail(msg):
    print("CHECK FAILED: " + msg, flush=True)
    sys.exit(1)


def read_logs(log_dir):
    resumes = {}  # world -> (epoch, position)
    steps = []  # (world, epoch, position, rank, size, [(index, padding)])
    for name in glob.glob(os.path.join(log_dir, "*.log")):
        with open(name) as f:
            for line in f:
                if not line.endswith("\n"):
                    continue  # cut short by kill -9
                fields = line.split()
                if fields[0] == "R":
                    w, at = int(fields[1]), (int(fields[2]), int(fields[3]))
                    if resumes.setdefault(w, at) != at:
                        fail("world %d resumed at %s on one rank and %s on another" % (w, resumes[w], at))
                elif fields[0] == "S":
                    w, e, p, r, n = (int(v) for v in fields[1:6])
                    batch = [(int(v.lstrip("p")), v.startswith("p")) for v in fields[6:]]
                    steps.append((w, e, p, r, n, batch))
    return resumes, steps


def committed_steps(resumes, steps):
    """{(epoch, position): (size, {rank: batch})} of the steps the world
    committed."""
    worlds = sorted(resumes)
    cut = {w: resumes[worlds[i + 1]] if i + 1 < len(worlds) else None for i, w in enumerate(worlds)}
    kept = {}
    for w, e, p, r, n, batch in steps:
        if w not in cut:
            fail("world %d logged steps but never resumed" % w)
        if cut[w] is not None and (e, p) >= cut[w]:
            continue  # rolled back: the next world resumed at or before it
        size, ranks = kept.setdefault((e, p), (n, {}))
        if size != n or r in ranks:
            fail("the step at epoch %d position %d was committed twice (worlds of %d and %d)" % (e, p, size, n))
        ranks[r] = batch
    for (e, p), (n, ranks) in kept.items():
        if sorted(ranks) != list(range(n)):
            fail("committed step at epoch %d position %d has the batches of ranks %s of %d" % (e, p, sorted(ranks), n))
    return kept


def main():
    log_dir, samples, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    resumes, steps = read_logs(log_dir)
    kept = committed_steps(resumes, steps)
    sizes = sorted({n for n, _ in kept.values()})
    print("worlds resumed: %d; steps logged: %d entries; committed: %d steps in worlds of sizes %s" %
          (len(resumes), len(steps), len(kept), sizes))
    for e in range(epochs):
        seen, padding = [0] * samples, 0
        for (ke, _), (n, ranks) in kept.items():
            if ke != e:
                continue
            for batch in ranks.values():
                for i, pad in batch:
                    if pad:
                        padding += 1
                    else:
                        seen[i] += 1
        missing = [i for i, c in enumerate(seen) if c == 0]
        repeated = [i for i, c in enumerate(seen) if c > 1]
        print("epoch %d: %d samples, %d never trained on, %d more than once, %d padding" %
              (e, samples, len(missing), len(repeated), padding))
        if missing or repeated:
            fail("epoch %d: samples never trained on %s, more than once %s" % (e, missing[:10], repeated[:10]))
        if padding >= max(sizes):
            fail("epoch %d: %d padding samples, more than a world's size-1" % (e, padding))

    data = dataset(samples)
    model = make_model()
    opt = make_optimizer(model)
    for key in sorted(kept):
        n, ranks = kept[key]
        opt.zero_grad()
        for r in range(n):
            idx = torch.tensor([i for i, _ in ranks[r]])
            _, x, y = data[idx]
            (F.mse_loss(model(x), y) / n).backward()
        opt.step()
    final = torch.load(os.path.join(log_dir, "final.pt"))
    worst = 0.0
    for name, ref in model.state_dict().items():
        worst = max(worst, (final[name] - ref).abs().max().item())
        if not torch.allclose(final[name], ref, rtol=1e-4, atol=1e-5):
            fail("%s differs from the one-process reference by up to %g" % (name, (final[name] - ref).abs().max()))
    print("one-process reference on the %d committed steps: largest difference %.3g" % (len(kept), worst))
    print("CHECK OK", flush=True)


if __name__ == "__main__":
    main()
