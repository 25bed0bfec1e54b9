"""gorovod's CUDA path with NVIDIA's real driver library (Debian's libcuda1,
driver 535) on LD_LIBRARY_PATH, on a host without a GPU: the driver loads,
its cuInit finds no device, and a call on device memory raises GorovodError
(a RuntimeError, not a ValueError: the tensor is not at fault, the host is)
naming CUDA_ERROR_NO_DEVICE, each time; CPU tensors go on. gorovod.torch's
own CUDA step needs a CUDA tensor, which torch cannot make here, so the
call goes through gorovod._core as gorovod.torch's does.

Prints "PASS rank R of N". Driven by bindings/python/python_test.go.
"""

import ctypes
import sys

import torch

import gorovod.torch as hvd
from gorovod import _core
from gorovod.exceptions import GorovodError


def main():
    # The driver this test is for: loadable, and seeing no GPU (cuInit's
    # CUDA_ERROR_NO_DEVICE is 100).
    driver = ctypes.CDLL("libcuda.so.1")
    version = ctypes.c_int(0)
    assert driver.cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value >= 11080, version.value
    assert driver.cuInit(0) == 100, "cuInit found a GPU: this test is for a host without one"

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    buf = torch.ones(3)
    for attempt in range(2):
        try:
            _core.allreduce(buf.data_ptr(), buf.data_ptr(), 3, _core.FLOAT32, _core.SUM, 1.0, 1.0, buf,
                            device=_core.CudaMemory(0, 0))
        except ValueError as e:
            raise AssertionError("a host with the driver but no GPU raised ValueError: %s" % e)
        except GorovodError as e:
            msg = str(e)
            assert "CUDA_ERROR_NO_DEVICE" in msg and "finds no GPU" in msg and "cuInit" in msg, msg
        else:
            raise AssertionError("a CUDA call succeeded without a GPU (attempt %d)" % attempt)
    assert torch.equal(buf, torch.ones(3)), buf
    hvd.barrier()
    out = hvd.allreduce(torch.full((4,), float(r)), op=hvd.Sum)
    assert torch.equal(out, torch.full((4,), float(n * (n - 1) / 2))), out
    print("PASS rank %d of %d" % (r, n), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
    sys.exit(0)
