// cuda_standin_test.c: the C ABI's CUDA device path (gorovod_cuda_next),
// run against a library built with -tags gorovod_cudastandin, whose
// "device 0" is host memory reached only through the collectives'
// DeviceMemory interface and whose events are int32 flags in host memory
// (bindings/c/cudastandin.go). Run alone and as several workers under
// `gorovod run` (cprogram_test.go); prints "cuda stand-in test ok".

#include <stdint.h>
#include <string.h>
#include <time.h>

#include "check.h"

static uint64_t event_of(int32_t *flag) { return (uint64_t)(uintptr_t)flag; }

// The stand-in's device address of host memory p (cudastandin.go's
// standInOffset): a call that took it for host memory would fault.
#define DEV(p) ((void *)((uintptr_t)(p) + ((uintptr_t)1 << 56)))

int main(void) {
  join_world();
  CHECK(gorovod_cuda_supported() == 1, "the stand-in build says it has no CUDA support");

  // An in-place allreduce whose event has not passed: it must not complete,
  // nor read the buffer, until the flag is set; the data is written after
  // the call was made, as a kernel still running on the caller's stream
  // would.
  int32_t flag = 0;
  float x[1000];
  for (int i = 0; i < 1000; i++) x[i] = -1000;
  gorovod_handle h = 0;
  OK(gorovod_cuda_next(0, event_of(&flag)));
  OK(gorovod_allreduce_async(DEV(x), DEV(x), 1000, GOROVOD_FLOAT32, GOROVOD_SUM, 1, 1, &h));
  struct timespec pause = {0, 50 * 1000 * 1000};
  nanosleep(&pause, NULL);  // time in which a call that ignored its event would finish
  int done = -1;
  OK(gorovod_poll(h, &done));
  CHECK(done == 0, "the allreduce completed before its event passed");
  for (int i = 0; i < 1000; i++) x[i] = (float)(rank + i);
  __atomic_store_n(&flag, 1, __ATOMIC_RELEASE);
  OK(gorovod_wait(h, -1));
  for (int i = 0; i < 1000; i++) {
    float want = (float)(size * i + size * (size - 1) / 2);
    CHECK(x[i] == want, "allreduce after the event: x[%d] = %g, want %g", i, x[i], want);
  }

  // A grouped allreduce out of place, two dtypes (fused on the "device"),
  // synchronous (the _start path), averaged; the inputs are untouched.
  float a[3] = {(float)rank, 1, 2}, ao[3] = {0};
  double b[2] = {2.0 * rank, 4}, bo[2] = {0};
  const void *sends[2] = {DEV(a), DEV(b)};
  void *recvs[2] = {DEV(ao), DEV(bo)};
  int64_t counts[2] = {3, 2};
  int32_t dtypes[2] = {GOROVOD_FLOAT32, GOROVOD_FLOAT64};
  OK(gorovod_cuda_next(0, 0));
  OK(gorovod_grouped_allreduce(2, sends, recvs, counts, dtypes, GOROVOD_AVERAGE, 1, 1));
  float mean = (float)(size - 1) / 2;
  CHECK(ao[0] == mean && ao[1] == 1 && ao[2] == 2 && bo[0] == 2.0 * mean && bo[1] == 4,
        "grouped average: %g %g %g, %g %g", ao[0], ao[1], ao[2], bo[0], bo[1]);
  CHECK(a[0] == (float)rank && b[0] == 2.0 * rank, "the grouped allreduce changed its inputs");

  // Broadcast from the last rank.
  int64_t v[2] = {rank * 10, rank};
  OK(gorovod_cuda_next(0, 0));
  OK(gorovod_broadcast(DEV(v), 2, GOROVOD_INT64, size - 1));
  CHECK(v[0] == (size - 1) * 10 && v[1] == size - 1, "broadcast: %ld %ld", (long)v[0], (long)v[1]);

  // Allgather: rank r sends r+1 elements of value r.
  float mine[64], all[64 * 65 / 2];
  int64_t gcounts[64];
  int total = 0;
  for (int r = 0; r < size; r++) {
    gcounts[r] = r + 1;
    total += r + 1;
  }
  for (int i = 0; i <= rank; i++) mine[i] = (float)rank;
  OK(gorovod_cuda_next(0, 0));
  OK(gorovod_allgather(DEV(mine), rank + 1, DEV(all), gcounts, GOROVOD_FLOAT32));
  for (int r = 0, k = 0; r < size; r++) {
    for (int i = 0; i <= r; i++, k++) CHECK(all[k] == (float)r, "allgather: element %d is %g, want %d", k, all[k], r);
  }
  (void)total;

  // Alltoall: rank r sends r*100+j to rank j, one element each.
  float out_a[64], in_a[64];
  int64_t ones[64];
  for (int j = 0; j < size; j++) {
    out_a[j] = (float)(rank * 100 + j);
    ones[j] = 1;
  }
  OK(gorovod_cuda_next(0, 0));
  OK(gorovod_alltoall(DEV(out_a), ones, DEV(in_a), ones, GOROVOD_FLOAT32));
  for (int j = 0; j < size; j++) {
    CHECK(in_a[j] == (float)(j * 100 + rank), "alltoall: from %d got %g", j, in_a[j]);
  }

  // Reducescatter: one element per rank, summed.
  float rs[64], share = -1;
  for (int j = 0; j < size; j++) rs[j] = (float)(j + rank);
  OK(gorovod_cuda_next(0, 0));
  OK(gorovod_reducescatter(DEV(rs), size, DEV(&share), NULL, GOROVOD_FLOAT32, GOROVOD_SUM, 1, 1));
  CHECK(share == (float)(size * rank + size * (size - 1) / 2), "reducescatter: %g", share);

  // Refusals: a host address as device memory, a negative device, a device
  // the library cannot open, a point-to-point message; each takes the
  // marking, and the next host call runs as before.
  float y = 1;
  OK(gorovod_cuda_next(0, 0));
  CHECK(gorovod_allreduce(&y, &y, 1, GOROVOD_FLOAT32, GOROVOD_SUM, 1, 1) == GOROVOD_ERR_INVALID_ARGUMENT,
        "a host address as device memory");
  CHECK(strstr(gorovod_last_error(), "not a stand-in device address") != NULL, "message: %s", gorovod_last_error());
  OK(gorovod_cuda_next(-1, 0));
  CHECK(gorovod_allreduce(DEV(&y), DEV(&y), 1, GOROVOD_FLOAT32, GOROVOD_SUM, 1, 1) == GOROVOD_ERR_INVALID_ARGUMENT,
        "device -1");
  OK(gorovod_cuda_next(1, 0));
  int rc = gorovod_allreduce(DEV(&y), DEV(&y), 1, GOROVOD_FLOAT32, GOROVOD_SUM, 1, 1);
  CHECK(rc != GOROVOD_OK && strstr(gorovod_last_error(), "accelerator 1") != NULL, "device 1: %d", rc);
  OK(gorovod_cuda_next(0, 0));
  CHECK(gorovod_send_async(DEV(&y), 1, GOROVOD_FLOAT32, 0, 7, &h) == GOROVOD_ERR_INVALID_ARGUMENT,
        "a point-to-point message of device memory");
  CHECK(strstr(gorovod_last_error(), "host memory only") != NULL, "message: %s", gorovod_last_error());
  OK(gorovod_cuda_next(0, 0));
  OK(gorovod_barrier());
  y = 1;
  OK(gorovod_allreduce(&y, &y, 1, GOROVOD_FLOAT32, GOROVOD_SUM, 1, 1));
  CHECK(y == (float)size, "a host allreduce after the device calls: %g", y);

  OK(gorovod_shutdown(1));
  printf("cuda stand-in test ok\n");
  return 0;
}
