/* gorovod_adaptive.h — the adaptive batch size (AdaptDL / Pollux) for a
 * framework's own training loop, on top of gorovod.h. The library measures
 * the gradient noise in the gradient allreduces, fits its throughput model
 * to the steps, and decides each step's batch size and learning-rate factor
 * on rank 0; every rank receives the same decision beside the gradients and
 * adopts it at gorovod_commit. A framework's loop, each step:
 *
 *   gorovod_adaptive_plan(&plan);              // the step's batch sizes
 *   gorovod_adaptive_set_global_batch(plan.global_batch);
 *   for each of the plan.accum_steps + 1 micro-batches of plan.micro_batch
 *   samples: forward, backward, and when accumulating (accum_steps > 0)
 *       gorovod_adaptive_record_micro_batch(squared norm of its gradient);
 *   allreduce the mean of the micro-batches' gradients (average), scale the
 *   learning rate by plan.lr_factor, step the optimizer;
 *   gorovod_commit(); */
#ifndef GOROVOD_ADAPTIVE_H
#define GOROVOD_ADAPTIVE_H

#include <stdint.h>

#include "gorovod.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The learning-rate rules: AdaScale (its gain), square root and linear in
 * the batch's ratio to the initial batch. */
enum {
  GOROVOD_LR_ADASCALE = 0,
  GOROVOD_LR_SQRT = 1,
  GOROVOD_LR_LINEAR = 2,
};

/* Turns the adaptive batch size on, starting at init_batch (M0, the global
 * batch the learning rate is tuned for), never above max_batch (0:
 * init_batch), each rank's micro-batch within [min_local, max_local] (0: 1
 * and max_batch), accumulating gradients over micro-batches when
 * accumulation is non-zero. Every rank calls it at the same point of its
 * collectives, before the first step that uses it; once per process. */
int gorovod_adaptive_start(int64_t init_batch, int64_t max_batch, int64_t min_local, int64_t max_local,
                           int accumulation, int lr_rule);

/* The plan of the next step on the current world. */
typedef struct gorovod_adaptive_plan_t {
  int64_t global_batch; /* all ranks' samples together */
  int64_t micro_batch;  /* this rank's samples per micro-batch */
  int64_t accum_steps;  /* micro-batches per step, less one */
  double lr_factor;     /* multiply the learning rate by it */
} gorovod_adaptive_plan_t;
int gorovod_adaptive_plan(gorovod_adaptive_plan_t *out);

/* Tells the gradient noise measurement the step's global batch: after the
 * previous gorovod_commit, before the step's gradient allreduces. */
int gorovod_adaptive_set_global_batch(int64_t n);

/* Records the squared norm (sum over all gradient tensors) of one
 * micro-batch's mean gradient, when the step accumulates: after its
 * backward pass, before the step's allreduce. */
int gorovod_adaptive_record_micro_batch(double squared_norm);

#ifdef __cplusplus
}
#endif

#endif
