"""Probe whether CUDA IPC memory handles work between two processes on this
machine (deliverable 2 of issue 23 rests on it): a parent shares a CUDA
tensor with a spawned child through torch.multiprocessing (which sends a
cudaIpcMemHandle), the child adds 1 in place, and the parent checks the
result on its own copy of the memory. Prints one JSON line with the outcome
and the number of devices.

Usage: python3 bench/gpu/probe_ipc.py
"""
import json
import sys
import time


def child(q_in, q_out):
    import torch
    t = q_in.get()
    t.add_(1)
    torch.cuda.synchronize()
    q_out.put(("ok", t.device.index))


def main():
    import torch
    import torch.multiprocessing as mp
    res = {"kind": "ipc"}
    if not torch.cuda.is_available():
        res["error"] = "no CUDA"
        print(json.dumps(res))
        return 0
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    x = torch.zeros(1 << 20, device="cuda")
    p = ctx.Process(target=child, args=(q_in, q_out))
    t0 = time.time()
    p.start()
    q_in.put(x)
    try:
        status = q_out.get(timeout=60)
        torch.cuda.synchronize()
        res["child"] = list(status)
        res["all_ones"] = bool((x == 1).all().item())
    except Exception as e:  # the child's failure arrives as a timeout here
        res["error"] = repr(e)
    p.join(30)
    res["exitcode"] = p.exitcode
    res["seconds"] = round(time.time() - t0, 2)
    try:
        res["device_count"] = torch.cuda.device_count()
    except Exception as e:
        res["device_count_error"] = repr(e)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
