// A C program against gorovod_adaptive.h, run by adaptive_test.go alone and
// as 2 workers under `gorovod run`: the errors (before init, before start,
// bad arguments, a second start), then steps of a noisy synthetic gradient
// through the adaptive loop of the header's comment until the batch size
// grows, every rank checking that all ran the same plan. Prints "adaptive
// test ok: rank R of N, batch B" and exits 1 at the first failure.

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gorovod_adaptive.h"
#include "check.h"

// A normal deviate (Box-Muller) from a xorshift generator.
static uint64_t rng = 88172645463325252ull;
static double uniform(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return ((rng >> 11) + 0.5) / 9007199254740992.0;
}
static double normal(void) { return sqrt(-2 * log(uniform())) * cos(6.283185307179586 * uniform()); }

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

enum { DIM = 500, M0 = 16 };

int main(void) {
  gorovod_adaptive_plan_t plan;
  CHECK(gorovod_adaptive_plan(&plan) == GOROVOD_ERR_NOT_INITIALIZED, "plan before init");
  OK(gorovod_init());
  rank = gorovod_rank();
  size = gorovod_size();
  rng += (uint64_t)rank * 7919;

  CHECK(gorovod_adaptive_plan(&plan) == GOROVOD_ERR_INVALID_ARGUMENT, "plan before start");
  CHECK(strstr(gorovod_last_error(), "not on") != NULL, "error: %s", gorovod_last_error());
  CHECK(gorovod_adaptive_start(M0, 512, 0, 0, 0, 7) == GOROVOD_ERR_INVALID_ARGUMENT, "rule 7");
  CHECK(gorovod_adaptive_start(M0, 8, 0, 0, 0, GOROVOD_LR_LINEAR) == GOROVOD_ERR_INVALID_ARGUMENT, "max below M0");
  CHECK(gorovod_adaptive_start(-1, 8, 0, 0, 0, GOROVOD_LR_LINEAR) == GOROVOD_ERR_INVALID_ARGUMENT, "negative M0");
  OK(gorovod_adaptive_start(M0, 512, 0, 0, 0, GOROVOD_LR_LINEAR));
  CHECK(gorovod_adaptive_start(M0, 512, 0, 0, 0, GOROVOD_LR_LINEAR) == GOROVOD_ERR_INVALID_ARGUMENT, "second start");
  CHECK(gorovod_adaptive_plan(NULL) == GOROVOD_ERR_INVALID_ARGUMENT, "NULL plan");
  CHECK(gorovod_adaptive_set_global_batch(0) == GOROVOD_ERR_INVALID_ARGUMENT, "global batch 0");
  CHECK(gorovod_adaptive_record_micro_batch(-1) == GOROVOD_ERR_INVALID_ARGUMENT, "negative norm");

  static float grad[DIM];
  double deadline = now() + 60;
  int grown = 0, steps = 0;
  while (grown < 10) {
    CHECK(now() < deadline, "the batch did not grow in 60 s (%d steps)", steps);
    OK(gorovod_adaptive_plan(&plan));
    CHECK(plan.global_batch >= M0 && plan.global_batch <= 512, "global batch %lld", (long long)plan.global_batch);
    CHECK(plan.accum_steps == 0, "accumulating without accumulation: %lld", (long long)plan.accum_steps);
    CHECK(plan.micro_batch * size == plan.global_batch, "micro %lld × %d != %lld", (long long)plan.micro_batch, size,
          (long long)plan.global_batch);
    CHECK(fabs(plan.lr_factor - (double)plan.global_batch / M0) < 1e-4, "linear factor %g at %lld", plan.lr_factor,
          (long long)plan.global_batch);
    // Every rank runs the same plan.
    double mine[2] = {(double)plan.global_batch, plan.lr_factor}, all[2 * 16];
    int64_t counts[16];
    CHECK(size <= 16, "size %d", size);
    for (int q = 0; q < size; q++) {
      counts[q] = 2;
    }
    OK(gorovod_allgather(mine, 2, all, counts, GOROVOD_FLOAT64));
    for (int q = 0; q < size; q++) {
      CHECK(all[2 * q] == mine[0] && all[2 * q + 1] == mine[1], "rank %d runs another plan", q);
    }
    OK(gorovod_adaptive_set_global_batch(plan.global_batch));
    for (int64_t i = 0; i < plan.micro_batch * 2000; i++) {
      uniform();  // compute that grows with the batch
    }
    for (int i = 0; i < DIM; i++) {
      grad[i] = (float)(0.01 + normal() / sqrt((double)plan.micro_batch));
    }
    OK(gorovod_allreduce(grad, grad, DIM, GOROVOD_FLOAT32, GOROVOD_AVERAGE, 1, 1));
    OK(gorovod_commit());
    steps++;
    if (plan.global_batch > M0) {
      grown++;
    }
  }
  printf("adaptive test ok: rank %d of %d, batch %lld after %d steps\n", rank, size, (long long)plan.global_batch,
         steps);
  OK(gorovod_shutdown(1));
  return 0;
}
