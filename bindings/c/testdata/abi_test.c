// A C program against gorovod.h, run by abi_test.go: alone (a world of one)
// and under `gorovod run` with several workers. It checks every collective's
// result, the asynchronous handles, the errors (before init, bad arguments,
// unknown handles, a forked child, the last error per thread), then commits
// and shuts down. It prints "abi test ok: rank R of N" when all passed and
// exits 1 at the first failure, saying which.

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gorovod.h"
#include "check.h"

// Each thread's last error is its own.
static void *thread_errors(void *arg) {
  int which = *(int *)arg;
  for (int i = 0; i < 200; i++) {
    if (which == 0) {
      int rc = gorovod_allreduce(NULL, NULL, 1, GOROVOD_FLOAT32, GOROVOD_SUM, 1, 1);
      CHECK(rc == GOROVOD_ERR_INVALID_ARGUMENT, "NULL buffers: %d", rc);
      CHECK(strstr(gorovod_last_error(), "NULL") != NULL, "thread 0 sees another error: %s", gorovod_last_error());
    } else {
      int rc = gorovod_wait(999999999, 0);
      CHECK(rc == GOROVOD_ERR_UNKNOWN_HANDLE, "unknown handle: %d", rc);
      CHECK(strstr(gorovod_last_error(), "unknown handle") != NULL, "thread 1 sees another error: %s", gorovod_last_error());
    }
  }
  return NULL;
}

int main(void) {
  CHECK(gorovod_abi_version() == GOROVOD_ABI_VERSION, "ABI version %d", gorovod_abi_version());

  // Before init.
  CHECK(gorovod_is_initialized() == 0, "initialized before init");

  // The digest needs no init: xxHash64 of "abc" and of nothing, and bad
  // arguments refused.
  uint64_t digest = 0;
  CHECK(gorovod_digest("abc", 3, &digest) == GOROVOD_OK, "digest: %s", gorovod_last_error());
  CHECK(digest == 0x44bc2cf5ad770999ULL, "digest of \"abc\" %llx", (unsigned long long)digest);
  CHECK(gorovod_digest(NULL, 0, &digest) == GOROVOD_OK, "digest of nothing: %s", gorovod_last_error());
  CHECK(digest == 0xef46db3751d8e999ULL, "digest of nothing %llx", (unsigned long long)digest);
  CHECK(gorovod_digest(NULL, 4, &digest) == GOROVOD_ERR_INVALID_ARGUMENT, "digest of NULL data accepted");
  CHECK(gorovod_digest("abc", -1, &digest) == GOROVOD_ERR_INVALID_ARGUMENT, "negative digest size accepted");
  CHECK(gorovod_digest("abc", 3, NULL) == GOROVOD_ERR_INVALID_ARGUMENT, "NULL digest output accepted");
  CHECK(gorovod_rank() == -1, "rank before init");
  float x = 1;
  int rc = gorovod_allreduce(&x, &x, 1, GOROVOD_FLOAT32, GOROVOD_SUM, 1, 1);
  CHECK(rc == GOROVOD_ERR_NOT_INITIALIZED, "allreduce before init: %d", rc);
  CHECK(strstr(gorovod_last_error(), "not initialized") != NULL, "message: %s", gorovod_last_error());
  uint64_t newest = 0;
  int breaking = -1;
  CHECK(gorovod_newest_world(&newest, &breaking) == GOROVOD_ERR_NOT_INITIALIZED, "newest world before init");
  int32_t left[4], nleft = -1;
  CHECK(gorovod_left_ranks(left, 4, &nleft) == GOROVOD_ERR_NOT_INITIALIZED, "left ranks before init");

  // A configuration the library refuses.
  gorovod_config cfg;
  gorovod_config_init(&cfg);
  cfg.job_id = "some-job";
  cfg.secret_hex = "abc";
  rc = gorovod_init_config(&cfg);
  CHECK(rc == GOROVOD_ERR_INVALID_ARGUMENT, "bad secret: %d", rc);

  OK(gorovod_init());
  OK(gorovod_init());  // again: nothing happens
  CHECK(gorovod_is_initialized() == 1, "not initialized after init");
  gorovod_topology top;
  OK(gorovod_topology_get(&top));
  rank = top.rank;
  size = top.size;
  CHECK(size >= 1 && rank >= 0 && rank < size, "topology %d of %d", rank, size);
  CHECK(gorovod_rank() == rank && gorovod_size() == size, "getters disagree");
  // The newest world known is the current one or (a change under way) a
  // later one, never an earlier one; no member of this world is dead.
  OK(gorovod_newest_world(&newest, &breaking));
  CHECK(newest >= top.world && top.world > 0 && breaking == 0, "newest world %llu (breaking %d), current %llu",
        (unsigned long long)newest, breaking, (unsigned long long)top.world);
  CHECK(gorovod_newest_world(NULL, &breaking) == GOROVOD_ERR_INVALID_ARGUMENT, "newest world into NULL");
  CHECK(gorovod_newest_world(&newest, NULL) == GOROVOD_ERR_INVALID_ARGUMENT, "breaking into NULL");
  // No member of this world has left the job yet.
  OK(gorovod_left_ranks(left, 4, &nleft));
  CHECK(nleft == 0, "%d ranks left the job", nleft);
  OK(gorovod_left_ranks(NULL, 0, &nleft));
  CHECK(gorovod_left_ranks(left, 4, NULL) == GOROVOD_ERR_INVALID_ARGUMENT, "left ranks' count into NULL");
  CHECK(gorovod_left_ranks(NULL, 4, &nleft) == GOROVOD_ERR_INVALID_ARGUMENT, "left ranks into NULL");
  CHECK(top.local_size == size && top.local_rank == rank && top.cross_size == 1 && top.cross_rank == 0,
        "one host: local %d/%d cross %d/%d", top.local_rank, top.local_size, top.cross_rank, top.cross_size);
  const char *expect = getenv("ABI_TEST_SIZE");
  if (expect != NULL) {
    CHECK(size == atoi(expect), "size %d, want %s", size, expect);
  }

  // Allreduce: sum, average, min, max, product; in and out of place.
  float f[4], g[4];
  for (int i = 0; i < 4; i++) f[i] = (float)(rank + i);
  OK(gorovod_allreduce(f, g, 4, GOROVOD_FLOAT32, GOROVOD_SUM, 1, 1));
  for (int i = 0; i < 4; i++) {
    float want = (float)(size * (size - 1) / 2 + size * i);
    CHECK(g[i] == want, "sum[%d] = %g, want %g", i, g[i], want);
    CHECK(f[i] == (float)(rank + i), "the send buffer changed");
  }
  double d = rank;
  OK(gorovod_allreduce(&d, &d, 1, GOROVOD_FLOAT64, GOROVOD_AVERAGE, 1, 1));
  CHECK(d == (size - 1) / 2.0, "average %g", d);
  int32_t mn = rank + 5, mx = rank + 5;
  OK(gorovod_allreduce(&mn, &mn, 1, GOROVOD_INT32, GOROVOD_MIN, 1, 1));
  OK(gorovod_allreduce(&mx, &mx, 1, GOROVOD_INT32, GOROVOD_MAX, 1, 1));
  CHECK(mn == 5 && mx == 5 + size - 1, "min %d max %d", mn, mx);
  int64_t prod = rank + 1;
  OK(gorovod_allreduce(&prod, &prod, 1, GOROVOD_INT64, GOROVOD_PRODUCT, 1, 1));
  int64_t fact = 1;
  for (int i = 2; i <= size; i++) fact *= i;
  CHECK(prod == fact, "product %lld, want %lld", (long long)prod, (long long)fact);
  float s = 1;
  OK(gorovod_allreduce(&s, &s, 1, GOROVOD_FLOAT32, GOROVOD_SUM, 3, 0.5));
  CHECK(s == 1.5f * size, "sum with prescale 3, postscale 0.5: %g", s);
  uint8_t u = 2;
  OK(gorovod_allreduce(&u, &u, 1, GOROVOD_UINT8, GOROVOD_SUM, 1, 1));
  CHECK(u == 2 * size, "uint8 sum %d", u);
  // Adasum: orthogonal vectors add up (a world of one keeps its input); a
  // world that is not a power of two, integers and reducescatter are refused.
  double ad[2] = {rank == 0 ? 3 : 0, rank == 1 ? 4 : 0};
  rc = gorovod_allreduce(ad, ad, 2, GOROVOD_FLOAT64, GOROVOD_ADASUM, 1, 1);
  if ((size & (size - 1)) == 0) {
    CHECK(rc == GOROVOD_OK && ad[0] == 3 && ad[1] == (size > 1 ? 4 : 0), "adasum: %d, %g %g", rc, ad[0], ad[1]);
  } else {
    CHECK(rc == GOROVOD_ERR_INVALID_ARGUMENT && strstr(gorovod_last_error(), "power-of-two"),
          "adasum in a world of %d: %d (%s)", size, rc, gorovod_last_error());
  }
  int32_t ai = 1;
  rc = gorovod_allreduce(&ai, &ai, 1, GOROVOD_INT32, GOROVOD_ADASUM, 1, 1);
  CHECK(rc == GOROVOD_ERR_INVALID_ARGUMENT, "adasum of an int32: %d", rc);
  float ars[2] = {1, 2};
  rc = gorovod_reducescatter(ars, 2, ars, NULL, GOROVOD_FLOAT32, GOROVOD_ADASUM, 1, 1);
  CHECK(rc == GOROVOD_ERR_INVALID_ARGUMENT, "adasum reducescatter: %d", rc);

  // Grouped: several dtypes, in place, one call.
  float ga[3] = {1, 2, 3};
  int64_t gb[2] = {rank, 10};
  uint16_t gh[2] = {0x3c00, 0x4000};  // float16 1 and 2
  void *bufs[3] = {ga, gb, gh};
  int64_t cnts[3] = {3, 2, 2};
  int32_t dts[3] = {GOROVOD_FLOAT32, GOROVOD_INT64, GOROVOD_FLOAT16};
  OK(gorovod_grouped_allreduce(3, NULL, bufs, cnts, dts, GOROVOD_SUM, 1, 1));
  CHECK(ga[2] == 3.0f * size && gb[0] == size * (size - 1) / 2 && gb[1] == 10 * size, "grouped sums");
  if (size == 2) {
    CHECK(gh[0] == 0x4000 && gh[1] == 0x4400, "float16 sums %04x %04x", gh[0], gh[1]);
  }

  // Shaped: 6 elements as 2x3 on every rank sum up; as 2x3 on rank 0 and
  // 3x2 elsewhere, every rank gets a mismatch naming the shapes, and the
  // next call runs.
  float sh[6] = {1, 1, 1, 1, 1, 1};
  void *shp = sh;
  int64_t six = 6;
  int32_t f32 = GOROVOD_FLOAT32, two = 2;
  int64_t same[2] = {2, 3}, other[2] = {rank == 0 ? 2 : 3, rank == 0 ? 3 : 2};
  gorovod_handle shh;
  OK(gorovod_grouped_allreduce_shaped_async(0, 1, NULL, &shp, &six, &f32, &two, same, GOROVOD_SUM, 1, 1, &shh));
  OK(gorovod_wait(shh, -1));
  CHECK(sh[5] == (float)size, "shaped sum %g", sh[5]);
  rc = gorovod_grouped_allreduce_shaped_start(0, 1, NULL, &shp, &six, &f32, &two, other, GOROVOD_SUM, 1, 1, 0, &shh);
  if (rc == GOROVOD_OK && shh != 0) {
    rc = gorovod_wait(shh, -1);
  }
  if (size > 1) {
    CHECK(rc == GOROVOD_ERR_MISMATCH && strstr(gorovod_last_error(), "shapes"), "shapes 2x3 and 3x2: %d %s", rc,
          gorovod_last_error());
  } else {
    OK(rc);
  }
  int64_t five[2] = {5, 1};
  rc = gorovod_grouped_allreduce_shaped_async(0, 1, NULL, &shp, &six, &f32, &two, five, GOROVOD_SUM, 1, 1, &shh);
  CHECK(rc == GOROVOD_ERR_INVALID_ARGUMENT, "shape 5x1 of 6 elements: %d", rc);

  // Broadcast from the last rank; grouped broadcast from rank 0.
  int32_t b = rank * 7;
  OK(gorovod_broadcast(&b, 1, GOROVOD_INT32, size - 1));
  CHECK(b == (size - 1) * 7, "broadcast %d", b);
  double st[2] = {rank, -rank};
  uint8_t flag = (uint8_t)rank;
  void *sbufs[2] = {st, &flag};
  int64_t scnts[2] = {2, 1};
  int32_t sdts[2] = {GOROVOD_FLOAT64, GOROVOD_UINT8};
  OK(gorovod_grouped_broadcast(2, sbufs, scnts, sdts, 0));
  CHECK(st[0] == 0 && st[1] == 0 && flag == 0, "grouped broadcast");

  // Allgather: rank r sends r+1 elements.
  int64_t *agc = calloc(size, sizeof *agc);
  int64_t total = 0;
  for (int r = 0; r < size; r++) {
    agc[r] = r + 1;
    total += r + 1;
  }
  int32_t *agsend = calloc(rank + 1, sizeof *agsend), *agrecv = calloc(total, sizeof *agrecv);
  for (int i = 0; i <= rank; i++) agsend[i] = rank;
  OK(gorovod_allgather(agsend, rank + 1, agrecv, agc, GOROVOD_INT32));
  for (int r = 0, k = 0; r < size; r++) {
    for (int i = 0; i <= r; i++, k++) CHECK(agrecv[k] == r, "allgather[%d] = %d", k, agrecv[k]);
  }
  // Equal counts (NULL).
  int64_t one = rank, *all = calloc(size, sizeof *all);
  OK(gorovod_allgather(&one, 1, all, NULL, GOROVOD_INT64));
  for (int r = 0; r < size; r++) CHECK(all[r] == r, "allgather of equal counts");

  // Alltoall: rank r sends one value r*100+j to each rank j.
  int64_t *ones = calloc(size, sizeof *ones);
  float *a2s = calloc(size, sizeof *a2s), *a2r = calloc(size, sizeof *a2r);
  for (int j = 0; j < size; j++) {
    ones[j] = 1;
    a2s[j] = (float)(rank * 100 + j);
  }
  OK(gorovod_alltoall(a2s, ones, a2r, ones, GOROVOD_FLOAT32));
  for (int j = 0; j < size; j++) CHECK(a2r[j] == (float)(j * 100 + rank), "alltoall[%d] = %g", j, a2r[j]);

  // Reducescatter: 2*size+1 elements, the default split.
  int64_t n = 2 * size + 1, mine = n / size + (rank < n % size ? 1 : 0);
  float *rss = calloc(n, sizeof *rss), *rsr = calloc(mine, sizeof *rsr);
  for (int i = 0; i < n; i++) rss[i] = (float)i;
  OK(gorovod_reducescatter(rss, n, rsr, NULL, GOROVOD_FLOAT32, GOROVOD_SUM, 1, 1));
  int64_t off = 0;
  for (int r = 0; r < rank; r++) off += n / size + (r < n % size ? 1 : 0);
  for (int i = 0; i < mine; i++) CHECK(rsr[i] == (float)(size * (off + i)), "reducescatter[%d] = %g", i, rsr[i]);

  OK(gorovod_barrier());
  int32_t last = -1;
  OK(gorovod_join(&last));
  CHECK(last >= 0 && last < size, "join: last rank %d", last);

  // Asynchronous: three in flight, collected out of order.
  float big[3][1000];
  gorovod_handle h[3];
  for (int k = 0; k < 3; k++) {
    for (int i = 0; i < 1000; i++) big[k][i] = (float)k;
    OK(gorovod_allreduce_async(big[k], big[k], 1000, GOROVOD_FLOAT32, GOROVOD_SUM, 1, 1, &h[k]));
    CHECK(h[k] != 0, "handle 0");
  }
  int done = 0;
  OK(gorovod_poll(h[2], &done));
  rc = gorovod_wait(h[2], 0);
  CHECK(rc == GOROVOD_OK || rc == GOROVOD_ERR_TIMEOUT, "wait(0): %d", rc);
  if (rc == GOROVOD_ERR_TIMEOUT) OK(gorovod_wait(h[2], -1));
  OK(gorovod_wait(h[0], 10 * 1000 * 1000));
  OK(gorovod_wait(h[1], -1));
  for (int k = 0; k < 3; k++) CHECK(big[k][999] == (float)(k * size), "async %d", k);
  rc = gorovod_wait(h[1], -1);
  CHECK(rc == GOROVOD_ERR_UNKNOWN_HANDLE, "a collected handle again: %d", rc);

  // _start: a small call with nothing queued runs on this thread (no
  // handle); a large one is queued and gets a handle. (The engine's tests
  // check that a call behind a queued one is queued too.)
  float small[4] = {1, 2, 3, 4};
  gorovod_handle hs = 99;
  OK(gorovod_allreduce_start(small, small, 4, GOROVOD_FLOAT32, GOROVOD_SUM, 1, 1, GOROVOD_START_INTERRUPTIBLE, &hs));
  CHECK(hs == 0 && small[3] == 4.0f * size, "small _start: handle %llu, %f", (unsigned long long)hs, small[3]);
  static float large[1 << 16];
  for (int i = 0; i < (1 << 16); i++) large[i] = 1;
  OK(gorovod_allreduce_start(large, large, 1 << 16, GOROVOD_FLOAT32, GOROVOD_SUM, 1, 1, 0, &hs));
  CHECK(hs != 0, "large _start: no handle");
  // Queued behind the large one unless that one is done already.
  OK(gorovod_barrier_start(0, &h[0]));
  OK(gorovod_wait(hs, -1));
  if (h[0] != 0) OK(gorovod_wait(h[0], -1));
  CHECK(large[65535] == (float)size, "large _start: %f", large[65535]);

  // Bad arguments: refused before anything is sent, the world untouched.
  gorovod_handle hh;
  CHECK(gorovod_allreduce(f, g, 4, 99, GOROVOD_SUM, 1, 1) == GOROVOD_ERR_INVALID_ARGUMENT, "dtype 99");
  CHECK(strstr(gorovod_last_error(), "dtype 99") != NULL, "message: %s", gorovod_last_error());
  CHECK(gorovod_allreduce(f, g, 4, GOROVOD_FLOAT32, 42, 1, 1) == GOROVOD_ERR_INVALID_ARGUMENT, "op 42");
  CHECK(gorovod_allreduce(f, g, -1, GOROVOD_FLOAT32, GOROVOD_SUM, 1, 1) == GOROVOD_ERR_INVALID_ARGUMENT, "count -1");
  CHECK(gorovod_allreduce_async(f, g, 4, GOROVOD_FLOAT32, GOROVOD_SUM, 1, 1, NULL) == GOROVOD_ERR_INVALID_ARGUMENT, "NULL handle");
  CHECK(gorovod_broadcast(&b, 1, GOROVOD_INT32, size) == GOROVOD_ERR_INVALID_ARGUMENT, "root %d", size);
  CHECK(gorovod_broadcast_async(&b, 1, GOROVOD_INT32, -1, &hh) == GOROVOD_ERR_INVALID_ARGUMENT, "root -1");
  CHECK(gorovod_join(NULL) == GOROVOD_ERR_INVALID_ARGUMENT, "join(NULL)");
  CHECK(gorovod_poll(424242, &done) == GOROVOD_ERR_UNKNOWN_HANDLE, "poll of an unknown handle");
  float check = 1;
  OK(gorovod_allreduce(&check, &check, 1, GOROVOD_FLOAT32, GOROVOD_SUM, 1, 1));
  CHECK(check == (float)size, "allreduce after the refusals: %g", check);

  // Named calls pair by name whatever their order: the even ranks name
  // "na" then "nb", the odd ranks "nb" then "na" (of other sizes, so that a
  // pairing by position would be a mismatch).
  float na[2] = {1, 1}, nb[3] = {2, 2, 2};
  gorovod_handle hna = 0, hnb = 0;
  for (int i = 0; i < 2; i++) {
    if ((i == 0) == (rank % 2 == 0)) {
      OK(gorovod_name_next("na"));
      OK(gorovod_allreduce_async(na, na, 2, GOROVOD_FLOAT32, GOROVOD_SUM, 1, 1, &hna));
    } else {
      OK(gorovod_name_next("nb"));
      OK(gorovod_allreduce_async(nb, nb, 3, GOROVOD_FLOAT32, GOROVOD_SUM, 1, 1, &hnb));
    }
  }
  OK(gorovod_wait(hna, -1));
  OK(gorovod_wait(hnb, -1));
  CHECK(na[1] == (float)size && nb[2] == (float)(2 * size), "named allreduces: %g %g", na[1], nb[2]);
  // A refused call takes the name it was given (a different one on each
  // rank, which would pair with nothing): the next call is unnamed again.
  char refused_name[32];
  snprintf(refused_name, sizeof refused_name, "refused-%d", rank);
  OK(gorovod_name_next(refused_name));
  CHECK(gorovod_allreduce(f, g, 4, 99, GOROVOD_SUM, 1, 1) == GOROVOD_ERR_INVALID_ARGUMENT, "named dtype 99");
  check = 1;
  OK(gorovod_allreduce(&check, &check, 1, GOROVOD_FLOAT32, GOROVOD_SUM, 1, 1));
  CHECK(check == (float)size, "the unnamed allreduce after a named refusal: %g", check);
  static char too_long[GOROVOD_MAX_NAME + 2];
  memset(too_long, 'x', sizeof too_long - 1);
  CHECK(gorovod_name_next(too_long) == GOROVOD_ERR_INVALID_ARGUMENT, "a name of %d bytes", GOROVOD_MAX_NAME + 1);
  OK(gorovod_name_next(NULL));

  // CUDA device memory: every build takes it, loading the NVIDIA driver
  // when a call first names a device. Where this host has no driver (CI's),
  // every collective given device memory is refused with a message naming
  // the missing driver, the refused call takes the setting (the next call
  // is on host memory again), and barrier drops it. (With a driver, the
  // calls run on the GPU: bindings/python/tests/gpu_cuda_tensors.py checks
  // that on one.)
  CHECK(gorovod_cuda_supported() == 1, "the library says it takes no CUDA memory");
  void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver != NULL) {
    dlclose(driver);
    printf("rank %d: this host has an NVIDIA driver: the refusals without one are not checked\n", rank);
  } else {
    OK(gorovod_cuda_next(0, 0));
    CHECK(gorovod_allreduce(f, g, 4, GOROVOD_FLOAT32, GOROVOD_SUM, 1, 1) == GOROVOD_ERR_INVALID_ARGUMENT,
          "a CUDA allreduce on a host without a driver");
    CHECK(strstr(gorovod_last_error(), "cannot load the CUDA driver library libcuda.so.1") != NULL &&
              strstr(gorovod_last_error(), "NVIDIA driver") != NULL,
          "message: %s", gorovod_last_error());
    OK(gorovod_cuda_next(0, 0));
    CHECK(gorovod_broadcast(&b, 1, GOROVOD_INT32, 0) == GOROVOD_ERR_INVALID_ARGUMENT, "a CUDA broadcast");
    OK(gorovod_cuda_next(0, 0));
    CHECK(gorovod_allgather_async(f, 1, g, NULL, GOROVOD_FLOAT32, &hh) == GOROVOD_ERR_INVALID_ARGUMENT,
          "a CUDA allgather");
    OK(gorovod_cuda_next(0, 0));
    CHECK(gorovod_send_async(f, 1, GOROVOD_FLOAT32, 0, 1, &hh) == GOROVOD_ERR_INVALID_ARGUMENT, "a CUDA send");
    OK(gorovod_cuda_next(0, 0));
    OK(gorovod_barrier());
  }
  check = 1;
  OK(gorovod_allreduce(&check, &check, 1, GOROVOD_FLOAT32, GOROVOD_SUM, 1, 1));
  CHECK(check == (float)size, "a host allreduce after the refused CUDA calls: %g", check);

  // Process sets: every rank but the last (the whole world is set 0, so it
  // cannot be added; alone, no other set can be made).
  int32_t everyone[64], ps = -1;
  for (int r = 0; r < size && r < 64; r++) everyone[r] = r;
  CHECK(gorovod_add_process_set(everyone, size, &ps) == GOROVOD_ERR_INVALID_ARGUMENT, "the whole world as a set");
  gorovod_handle ph;
  CHECK(gorovod_barrier_ps_async(77, &ph) == GOROVOD_ERR_INVALID_ARGUMENT, "a barrier on set 77");
  if (size >= 2) {
    OK(gorovod_add_process_set(everyone, size - 1, &ps));
    int32_t prank = -2, psize = 0, pranks[64] = {0}, ids[8], nids = 0;
    OK(gorovod_process_set_get(ps, &prank, &psize, pranks, 64));
    CHECK(ps > 0 && psize == size - 1 && prank == (rank < size - 1 ? rank : -1) && pranks[size - 2] == size - 2,
          "set %d: rank %d of %d", ps, prank, psize);
    OK(gorovod_process_set_ids(ids, 8, &nids));
    CHECK(nids == 2 && ids[0] == 0 && ids[1] == ps, "%d set ids", nids);
    if (rank < size - 1) {
      float pv = 1;
      const void *ps_send = &pv;
      void *ps_recv = &pv;
      int64_t c1 = 1;
      int32_t f32 = GOROVOD_FLOAT32;
      OK(gorovod_grouped_allreduce_ps_async(ps, 1, &ps_send, &ps_recv, &c1, &f32, GOROVOD_SUM, 1, 1, &ph));
      OK(gorovod_wait(ph, -1));
      CHECK(pv == (float)(size - 1), "allreduce on the set: %g", pv);
      int32_t pb = rank, i32 = GOROVOD_INT32;
      void *pbp = &pb;
      OK(gorovod_grouped_broadcast_ps_start(ps, 1, &pbp, &c1, &i32, size - 2, 0, &ph));
      if (ph != 0) OK(gorovod_wait(ph, -1));
      CHECK(pb == size - 2, "broadcast on the set from world rank %d: %d", size - 2, pb);
      int32_t mine32 = rank, got[64] = {0};
      OK(gorovod_allgather_ps_async(ps, &mine32, 1, got, NULL, GOROVOD_INT32, &ph));
      OK(gorovod_wait(ph, -1));
      for (int r = 0; r < size - 1; r++) CHECK(got[r] == r, "allgather on the set: [%d] = %d", r, got[r]);
      OK(gorovod_barrier_ps_start(ps, 0, &ph));
      if (ph != 0) OK(gorovod_wait(ph, -1));
    } else {
      CHECK(gorovod_barrier_ps_async(ps, &ph) == GOROVOD_ERR_INVALID_ARGUMENT, "a call on a set without this rank");
    }
    // A receive from any member of the set: the last rank, outside it,
    // sends rank 0 a message with tag 46 before rank 1 does (after a
    // barrier); rank 0's receive, posted first, takes rank 1's, naming it,
    // and the outsider's stays for a receive from it. The outsider cannot
    // receive from any member.
    if (size >= 3) {
      gorovod_handle hp, hb;
      int64_t mine = rank * 7, got = -1, theirs = -1;
      int32_t from = -1;
      if (rank == 0) OK(gorovod_recv_any_ps_async(ps, &got, 1, GOROVOD_INT64, 46, &from, &hp));
      if (rank == size - 1) {
        OK(gorovod_send_async(&mine, 1, GOROVOD_INT64, 0, 46, &hp));
        OK(gorovod_wait(hp, -1));
        CHECK(gorovod_recv_any_ps_async(ps, &got, 1, GOROVOD_INT64, 46, &from, &hp) == GOROVOD_ERR_INVALID_ARGUMENT,
              "a receive from any member of a set without this rank");
      }
      OK(gorovod_barrier_async(&hb));
      OK(gorovod_wait(hb, -1));
      if (rank == 1) {
        OK(gorovod_send_async(&mine, 1, GOROVOD_INT64, 0, 46, &hp));
        OK(gorovod_wait(hp, -1));
      } else if (rank == 0) {
        OK(gorovod_wait(hp, -1));
        CHECK(from == 1 && got == 7, "a receive from any member of the set got %lld from rank %d", (long long)got, from);
        OK(gorovod_recv_async(&theirs, 1, GOROVOD_INT64, size - 1, 46, &hp));
        OK(gorovod_wait(hp, -1));
        CHECK(theirs == (size - 1) * 7, "the outsider's message after it: %lld", (long long)theirs);
      }
    }
    OK(gorovod_remove_process_set(ps));
    CHECK(gorovod_barrier_ps_async(ps, &ph) == GOROVOD_ERR_INVALID_ARGUMENT, "a barrier on a removed set");
    CHECK(gorovod_remove_process_set(0) == GOROVOD_ERR_INVALID_ARGUMENT, "removing the world");

    // A registration with a handle, which the last rank makes only once
    // rank 0's wait for it has timed out (rank 0 says so with a file: a
    // message would come after the frames of the registration's exchange,
    // which the last rank reads only inside that exchange): rank 0's handle
    // stays valid, and the registration completes with the same id
    // everywhere once the last rank's call pairs with the others'. Its
    // arguments are checked as the blocking form's.
    int32_t later[64], lid = -1;
    gorovod_handle lh = 0;
    for (int r = 1; r < size && r < 64; r++) later[r - 1] = r;
    CHECK(gorovod_add_process_set_async(later, size - 1, NULL, &lh) == GOROVOD_ERR_INVALID_ARGUMENT, "a NULL id");
    CHECK(gorovod_add_process_set_async(later, size - 1, &lid, NULL) == GOROVOD_ERR_INVALID_ARGUMENT,
          "a NULL handle");
    char told[256];
    snprintf(told, sizeof told, "/tmp/gorovod-abi-test-%s-later-set", getenv("GOROVOD_JOB_ID") ? getenv("GOROVOD_JOB_ID") : "alone");
    if (rank < size - 1) {
      OK(gorovod_add_process_set_async(later, size - 1, &lid, &lh));
      if (rank == 0) {
        CHECK(gorovod_wait(lh, 50000) == GOROVOD_ERR_TIMEOUT, "a registration the last rank has not made completed");
        int done = 1;
        OK(gorovod_poll(lh, &done));
        CHECK(done == 0 && lid == -1, "after the timeout: done %d, id %d", done, lid);
        FILE *f = fopen(told, "w");
        CHECK(f != NULL, "cannot write %s", told);
        fclose(f);
      }
    } else {
      for (int waited = 0; access(told, F_OK) != 0; waited++) {
        CHECK(waited < 120 * 20, "rank 0 did not write %s", told);
        usleep(50000);
      }
      OK(gorovod_add_process_set_async(later, size - 1, &lid, &lh));
    }
    OK(gorovod_wait(lh, -1));
    if (rank == size - 1) unlink(told);
    int32_t lsize = 0, lrank = -2, lmax = lid, lmin = lid;
    OK(gorovod_process_set_get(lid, &lrank, &lsize, NULL, 0));
    CHECK(lid > ps && lsize == size - 1 && lrank == rank - 1, "the later set %d: rank %d of %d", lid, lrank, lsize);
    OK(gorovod_allreduce(&lmax, &lmax, 1, GOROVOD_INT32, GOROVOD_MAX, 1, 1));
    OK(gorovod_allreduce(&lmin, &lmin, 1, GOROVOD_INT32, GOROVOD_MIN, 1, 1));
    CHECK(lmax == lid && lmin == lid, "the later set's id differs across the ranks: %d to %d", lmin, lmax);
    OK(gorovod_remove_process_set(lid));
  }

  // Point-to-point: a ring pass, the receive posted first; a message of
  // another size fails its receive alone; bad peers are refused.
  if (size >= 2) {
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    int64_t ring_out[300], ring_in[300];
    for (int i = 0; i < 300; i++) ring_out[i] = rank * 1000 + i, ring_in[i] = -1;
    gorovod_handle hr, hs;
    OK(gorovod_recv_async(ring_in, 300, GOROVOD_INT64, prev, 42, &hr));
    OK(gorovod_send_async(ring_out, 300, GOROVOD_INT64, next, 42, &hs));
    OK(gorovod_wait(hs, -1));
    OK(gorovod_wait(hr, -1));
    for (int i = 0; i < 300; i++) CHECK(ring_in[i] == prev * 1000 + i, "ring element %d: %lld", i, (long long)ring_in[i]);
    float three[3] = {1, 2, 3}, two[2];
    if (rank == 0) {
      OK(gorovod_send_async(three, 3, GOROVOD_FLOAT32, 1, 43, &hs));
      OK(gorovod_wait(hs, -1));
    } else if (rank == 1) {
      OK(gorovod_recv_async(two, 2, GOROVOD_FLOAT32, 0, 43, &hr));
      rc = gorovod_wait(hr, -1);
      CHECK(rc == GOROVOD_ERR_FAILED && strstr(gorovod_last_error(), "12 bytes") != NULL,
            "a receive of 2 floats for a message of 3: %d %s", rc, gorovod_last_error());
    }
    // A receive from any rank: every other rank sends rank 0 its rank with
    // tag 44; each of rank 0's receives names its sender, each sender once.
    if (rank == 0) {
      int seen[64] = {0};
      for (int k = 1; k < size; k++) {
        int64_t got = -1;
        int32_t from = -1;
        OK(gorovod_recv_any_async(&got, 1, GOROVOD_INT64, 44, &from, &hr));
        OK(gorovod_wait(hr, -1));
        CHECK(from > 0 && from < size && from < 64 && !seen[from] && got == from * 7,
              "a receive from any rank got %lld from rank %d", (long long)got, from);
        seen[from] = 1;
      }
      CHECK(gorovod_recv_any_async(two, 2, GOROVOD_FLOAT32, 1, NULL, &hr) == GOROVOD_ERR_INVALID_ARGUMENT,
            "a receive from any rank without a source");
    } else {
      int64_t mine = rank * 7;
      OK(gorovod_send_async(&mine, 1, GOROVOD_INT64, 0, 44, &hs));
      OK(gorovod_wait(hs, -1));
    }
    CHECK(gorovod_send_async(three, 3, GOROVOD_FLOAT32, rank, 1, &hs) == GOROVOD_ERR_INVALID_ARGUMENT, "a send to itself");
    CHECK(gorovod_recv_async(two, 2, GOROVOD_FLOAT32, size, 1, &hr) == GOROVOD_ERR_INVALID_ARGUMENT, "a receive from outside");
    OK(gorovod_barrier());
  }

  // Each thread keeps its own last error.
  pthread_t th[2];
  int which[2] = {0, 1};
  for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, thread_errors, &which[i]);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);

  // A forked child is refused without entering the Go runtime.
  pid_t pid = fork();
  CHECK(pid >= 0, "fork");
  if (pid == 0) {
    int crc = gorovod_barrier();
    if (crc != GOROVOD_ERR_FORKED || strstr(gorovod_last_error(), "fork") == NULL) _exit(2);
    if (gorovod_is_initialized() != 0 || gorovod_rank() != -1) _exit(3);
    uint64_t child_digest = 0;
    if (gorovod_digest("abc", 3, &child_digest) != GOROVOD_ERR_FORKED) _exit(4);
    _exit(0);
  }
  int wstatus = 0;
  CHECK(waitpid(pid, &wstatus, 0) == pid, "waitpid");
  CHECK(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0, "the forked child: status %d", wstatus);

  OK(gorovod_record_samples(32));
  OK(gorovod_set_total_steps(1));
  OK(gorovod_commit());
  OK(gorovod_reset());
  OK(gorovod_shutdown(1));
  CHECK(gorovod_is_initialized() == 0, "initialized after shutdown");
  rc = gorovod_barrier();
  CHECK(rc == GOROVOD_ERR_NOT_INITIALIZED, "barrier after shutdown: %d", rc);
  printf("abi test ok: rank %d of %d\n", rank, size);
  return 0;
}
