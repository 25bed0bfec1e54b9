// cuda_fakedriver_test.c: the C ABI's CUDA path in the library every build
// makes (cuda.go, collective/cuda, the driver loaded at run time), against
// the fake driver of internal/testing/fakecuda, which the test puts first on
// LD_LIBRARY_PATH as libcuda.so.1. The program allocates and copies device
// memory through that driver's own functions, as a framework does through
// the CUDA runtime; the library finds the same driver by name. Across
// processes the fake's IPC handles do not open, so a world of several
// workers takes the staged path. Run alone and as several workers under
// `gorovod run` (cprogram_test.go); prints "cuda fake driver test ok".

#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

#include "check.h"

typedef unsigned long long dptr;

static int (*cu_init)(unsigned);
static int (*cu_alloc)(dptr *, size_t);
static int (*cu_free)(dptr);
static int (*cu_htod)(dptr, const void *, size_t, void *);
static int (*cu_dtoh)(void *, dptr, size_t);
static int (*cu_event_create)(void **, unsigned);
static int (*cu_event_record)(void *, void *);

static void *sym(void *lib, const char *name) {
  void *f = dlsym(lib, name);
  CHECK(f != NULL, "the driver has no %s", name);
  return f;
}

// upload allocates device memory holding n bytes of p.
static dptr upload(const void *p, size_t n) {
  dptr d = 0;
  CHECK(cu_alloc(&d, n) == 0, "cuMemAlloc(%zu)", n);
  CHECK(cu_htod(d, p, n, NULL) == 0, "cuMemcpyHtoDAsync");
  return d;
}

static void download(void *p, dptr d, size_t n) { CHECK(cu_dtoh(p, d, n) == 0, "cuMemcpyDtoH"); }

#define DEV(d) ((void *)(uintptr_t)(d))

int main(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  CHECK(lib != NULL, "loading the fake driver: %s", dlerror());
  *(void **)&cu_init = sym(lib, "cuInit");
  *(void **)&cu_alloc = sym(lib, "cuMemAlloc_v2");
  *(void **)&cu_free = sym(lib, "cuMemFree_v2");
  *(void **)&cu_htod = sym(lib, "cuMemcpyHtoDAsync_v2");
  *(void **)&cu_dtoh = sym(lib, "cuMemcpyDtoH_v2");
  *(void **)&cu_event_create = sym(lib, "cuEventCreate");
  *(void **)&cu_event_record = sym(lib, "cuEventRecord");
  CHECK(cu_init(0) == 0, "cuInit");

  join_world();
  CHECK(gorovod_cuda_supported() == 1, "the library says it takes no CUDA memory");

  // An in-place sum after an event recorded on the "stream" that wrote it
  // (the fake's work is done when recorded: the wait must pass).
  float x[1000];
  for (int i = 0; i < 1000; i++) x[i] = (float)(rank + i);
  dptr dx = upload(x, sizeof x);
  void *ev = NULL;
  CHECK(cu_event_create(&ev, 2) == 0 && cu_event_record(ev, NULL) == 0, "an event");
  OK(gorovod_cuda_next(0, (uint64_t)(uintptr_t)ev));
  OK(gorovod_allreduce(DEV(dx), DEV(dx), 1000, GOROVOD_FLOAT32, GOROVOD_SUM, 1, 1));
  download(x, dx, sizeof x);
  for (int i = 0; i < 1000; i++) {
    float want = (float)(size * i + size * (size - 1) / 2);
    CHECK(x[i] == want, "sum: x[%d] = %g, want %g", i, x[i], want);
  }

  // An average out of place (the fake's float32 scale kernel): the input
  // is untouched.
  float a[5] = {(float)rank, 1, 2, 3, 4}, ao[5] = {0};
  dptr da = upload(a, sizeof a), dao = upload(ao, sizeof ao);
  OK(gorovod_cuda_next(0, 0));
  OK(gorovod_allreduce(DEV(da), DEV(dao), 5, GOROVOD_FLOAT32, GOROVOD_AVERAGE, 1, 1));
  download(ao, dao, sizeof ao);
  download(a, da, sizeof a);
  float mean = (float)(size - 1) / 2;
  CHECK(ao[0] == mean && ao[1] == 1 && ao[4] == 4, "average: %g %g %g", ao[0], ao[1], ao[4]);
  CHECK(a[0] == (float)rank, "the average changed its input");

  // Broadcast from the last rank, and an allgather of one element each.
  int64_t v[2] = {rank * 10, rank};
  dptr dv = upload(v, sizeof v);
  OK(gorovod_cuda_next(0, 0));
  OK(gorovod_broadcast(DEV(dv), 2, GOROVOD_INT64, size - 1));
  download(v, dv, sizeof v);
  CHECK(v[0] == (size - 1) * 10 && v[1] == size - 1, "broadcast: %ld %ld", (long)v[0], (long)v[1]);
  float mine = (float)rank, all[64];
  int64_t counts[64];
  for (int r = 0; r < size; r++) counts[r] = 1;
  dptr dmine = upload(&mine, sizeof mine), dall = upload(all, sizeof(float) * (size_t)size);
  OK(gorovod_cuda_next(0, 0));
  OK(gorovod_allgather(DEV(dmine), 1, DEV(dall), counts, GOROVOD_FLOAT32));
  download(all, dall, sizeof(float) * (size_t)size);
  for (int r = 0; r < size; r++) CHECK(all[r] == (float)r, "allgather: element %d is %g", r, all[r]);

  // A host address given as device memory is refused, naming why, and the
  // session goes on.
  float y = 1;
  OK(gorovod_cuda_next(0, 0));
  CHECK(gorovod_allreduce(&y, &y, 1, GOROVOD_FLOAT32, GOROVOD_SUM, 1, 1) == GOROVOD_ERR_INVALID_ARGUMENT,
        "a host address as device memory");
  CHECK(strstr(gorovod_last_error(), "not CUDA device memory") != NULL, "message: %s", gorovod_last_error());
  OK(gorovod_barrier());
  y = 1;
  OK(gorovod_allreduce(&y, &y, 1, GOROVOD_FLOAT32, GOROVOD_SUM, 1, 1));
  CHECK(y == (float)size, "a host allreduce after the device calls: %g", y);

  OK(gorovod_shutdown(1));
  dptr frees[] = {dx, da, dao, dv, dmine, dall};
  for (size_t i = 0; i < sizeof frees / sizeof frees[0]; i++) CHECK(cu_free(frees[i]) == 0, "cuMemFree");
  printf("cuda fake driver test ok\n");
  return 0;
}
