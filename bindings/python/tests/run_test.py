"""gorovod.run (horovod.run): a function of this script, with a class of this
script among its arguments and results, runs in 3 workers under `gorovod
run`; the results come back in rank order; a worker's exception is raised in
the caller with its rank and traceback; bad arguments are refused before
anything starts. Prints "PASS run". Driven by bindings/python/python_test.go
(which sets GOROVOD to the gorovod command).
"""

import os

import torch

import gorovod as horovod
import gorovod.torch as hvd


class Box:
    """Defined in __main__: reaches the workers and comes back by value."""

    def __init__(self, value):
        self.value = value


def work(box, fail_rank=None, pid_file=None):
    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
    if hvd.rank() == fail_rank:
        raise KeyError("rank %d fails on purpose" % hvd.rank())
    return Box((hvd.rank(), hvd.size(), total * box.value, os.getpid()))


def main():
    results = horovod.run(work, args=(Box(10),), num_proc=3)  # Horovod's current name for np
    got = [r.value[:3] for r in results]
    assert got == [(0, 3, 60.0), (1, 3, 60.0), (2, 3, 60.0)], got
    assert len({r.value[3] for r in results} | {os.getpid()}) == 4, "the workers are not 3 new processes"

    try:
        horovod.run(work, args=(Box(1),), kwargs={"fail_rank": 2}, np=3)
        raise AssertionError("a worker's exception was not raised")
    except KeyError as e:
        notes = "\n".join(getattr(e, "__notes__", []))
        assert "rank %d fails on purpose" % 2 in str(e), e
        assert "raised by rank 2 of 3" in notes and "in work" in notes, notes

    for bad, kwargs in (("np", {"np": 0}), ("np", {"num_proc": 0}), ("disagree", {"np": 2, "num_proc": 3}),
                        ("disagree", {"min_np": 1, "min_num_proc": 2, "np": 2}), ("this host only", {"np": 2, "hosts": "elsewhere.invalid:2"}),
                        ("this host only", {"np": 2, "hostfile": "/nonexistent"})):
        try:
            horovod.run(work, args=(Box(1),), **kwargs)
            raise AssertionError("gorovod.run(%s) was not refused" % kwargs)
        except (ValueError, NotImplementedError) as e:
            assert bad in str(e), e
    print("PASS run", flush=True)


if __name__ == "__main__":
    main()
