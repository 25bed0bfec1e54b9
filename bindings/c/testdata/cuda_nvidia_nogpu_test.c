// cuda_nvidia_nogpu_test.c: the library every build makes, with NVIDIA's
// real driver library (Debian's libcuda1, driver 535) first on
// LD_LIBRARY_PATH as libcuda.so.1, on a host without a GPU: a node whose
// GPU is gone, or a container started without one. The driver loads and
// reports its CUDA version but its cuInit finds no device; a collective
// given device memory then fails naming that (not a crash, not a hang),
// each time it is tried, and host collectives go on. Run alone and as
// several workers under `gorovod run` (cprogram_test.go); prints
// "cuda nvidia no-gpu test ok".

#include <dlfcn.h>
#include <string.h>

#include "check.h"

int main(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  CHECK(lib != NULL, "loading NVIDIA's driver library: %s", dlerror());
  int (*driver_version)(int *) = (int (*)(int *))dlsym(lib, "cuDriverGetVersion");
  int (*init)(unsigned) = (int (*)(unsigned))dlsym(lib, "cuInit");
  CHECK(driver_version != NULL && init != NULL, "the driver lacks cuDriverGetVersion or cuInit");
  int version = 0;
  CHECK(driver_version(&version) == 0 && version >= 11080, "cuDriverGetVersion: %d", version);
  CHECK(init(0) == 100, "cuInit found a device: this test is for a host without a GPU");

  join_world();
  CHECK(gorovod_cuda_supported() == 1, "the library says it takes no CUDA memory");
  float f[4] = {1, 2, 3, 4};
  for (int attempt = 0; attempt < 2; attempt++) {
    OK(gorovod_cuda_next(0, 0));
    int rc = gorovod_allreduce(f, f, 4, GOROVOD_FLOAT32, GOROVOD_SUM, 1, 1);
    CHECK(rc == GOROVOD_ERR_FAILED, "a CUDA allreduce with no GPU returned %d (attempt %d)", rc, attempt);
    const char *msg = gorovod_last_error();
    CHECK(strstr(msg, "CUDA_ERROR_NO_DEVICE") != NULL && strstr(msg, "finds no GPU") != NULL &&
              strstr(msg, "cuInit") != NULL,
          "message: %s", msg);
  }
  CHECK(f[0] == 1 && f[3] == 4, "a refused call changed its buffer");
  OK(gorovod_barrier());
  float y = 1;
  OK(gorovod_allreduce(&y, &y, 1, GOROVOD_FLOAT32, GOROVOD_SUM, 1, 1));
  CHECK(y == (float)size, "a host allreduce after the refused device calls: %g", y);
  OK(gorovod_shutdown(1));
  dlclose(lib);
  printf("cuda nvidia no-gpu test ok\n");
  return 0;
}
