// The public functions of gorovod_adaptive.h: each refuses to run in a
// child made by fork() (see shim.c), then calls its Go function
// (adaptive.go).

#include <unistd.h>

#include "gorovod_adaptive.h"
#include "_cgo_export.h"

void gorovod_set_error_(const char *msg, size_t n);

static pid_t adaptive_owner_pid;

__attribute__((constructor)) static void gorovod_adaptive_loaded(void) { adaptive_owner_pid = getpid(); }

static const char adaptive_forked_msg[] =
    "gorovod: called in a child process made by fork() (a DataLoader worker?): the library's runtime "
    "lives in the parent only; call gorovod from the process that loaded it";

static int adaptive_forked(void) {
  if (getpid() != adaptive_owner_pid) {
    gorovod_set_error_(adaptive_forked_msg, sizeof adaptive_forked_msg - 1);
    return 1;
  }
  return 0;
}

int gorovod_adaptive_start(int64_t init_batch, int64_t max_batch, int64_t min_local, int64_t max_local,
                           int accumulation, int lr_rule) {
  if (adaptive_forked()) return GOROVOD_ERR_FORKED;
  return gorovodGoAdaptiveStart(init_batch, max_batch, min_local, max_local, accumulation, lr_rule);
}

int gorovod_adaptive_plan(gorovod_adaptive_plan_t *out) {
  if (adaptive_forked()) return GOROVOD_ERR_FORKED;
  return gorovodGoAdaptivePlan(out);
}

int gorovod_adaptive_set_global_batch(int64_t n) {
  if (adaptive_forked()) return GOROVOD_ERR_FORKED;
  return gorovodGoAdaptiveSetGlobalBatch(n);
}

int gorovod_adaptive_record_micro_batch(double squared_norm) {
  if (adaptive_forked()) return GOROVOD_ERR_FORKED;
  return gorovodGoAdaptiveRecordMicroBatch(squared_norm);
}
