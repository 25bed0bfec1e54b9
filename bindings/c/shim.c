// The public functions of gorovod.h. Each refuses to run in a child made by
// fork() before entering the Go runtime (whose threads the child does not
// have), then calls the Go function that does the work (exports.go). The
// synchronous collectives are their asynchronous forms plus gorovod_wait.
// The last error is kept per thread, here in C, so that it works in a
// forked child too.

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gorovod.h"
#include "_cgo_export.h"

// ---- The calling thread's last error ----

static pthread_key_t err_key;
static pthread_once_t err_once = PTHREAD_ONCE_INIT;

static void err_key_make(void) { pthread_key_create(&err_key, free); }

// gorovod_set_error_ copies msg (n bytes) as the calling thread's last
// error. Go calls it with a buffer it owns only for the call.
void gorovod_set_error_(const char *msg, size_t n) {
  pthread_once(&err_once, err_key_make);
  char *copy = malloc(n + 1);
  if (copy == NULL) {
    return;  // keep the previous message rather than fail
  }
  memcpy(copy, msg, n);
  copy[n] = 0;
  free(pthread_getspecific(err_key));
  pthread_setspecific(err_key, copy);
}

const char *gorovod_last_error(void) {
  pthread_once(&err_once, err_key_make);
  const char *msg = pthread_getspecific(err_key);
  return msg != NULL ? msg : "";
}

// ---- Fork detection ----

static pid_t owner_pid;

__attribute__((constructor)) static void gorovod_loaded(void) { owner_pid = getpid(); }

static const char forked_msg[] =
    "gorovod: called in a child process made by fork() (a DataLoader worker?): the library's runtime "
    "lives in the parent only; call gorovod from the process that loaded it";

#define REFUSE_IF_FORKED(rc)                         \
  do {                                               \
    if (getpid() != owner_pid) {                     \
      gorovod_set_error_(forked_msg, sizeof forked_msg - 1); \
      return (rc);                                   \
    }                                                \
  } while (0)

// ---- Life cycle ----

int gorovod_abi_version(void) { return GOROVOD_ABI_VERSION; }

void gorovod_config_init(gorovod_config *cfg) {
  if (cfg != NULL) {
    memset(cfg, 0, sizeof *cfg);
    cfg->struct_size = sizeof *cfg;
  }
}

int gorovod_init(void) { return gorovod_init_config(NULL); }

int gorovod_init_config(const gorovod_config *cfg) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoInit((gorovod_config *)cfg);
}

int gorovod_shutdown(int finished) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoShutdown(finished);
}

int gorovod_is_initialized(void) {
  if (getpid() != owner_pid) {
    return 0;
  }
  return gorovodGoIsInitialized();
}

int gorovod_topology_get(gorovod_topology *out) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoTopology(out);
}

#define GETTER(name, field)                            \
  int gorovod_##name(void) {                           \
    gorovod_topology t;                                \
    if (gorovod_topology_get(&t) != GOROVOD_OK) {      \
      return -1;                                       \
    }                                                  \
    return t.field;                                    \
  }

GETTER(rank, rank)
GETTER(size, size)
GETTER(local_rank, local_rank)
GETTER(local_size, local_size)
GETTER(cross_rank, cross_rank)
GETTER(cross_size, cross_size)

// ---- Collectives ----

// wait_for collects *h once the call that issued it succeeded (a pointer:
// the order C evaluates arguments in is unspecified).
static int wait_for(int rc, const gorovod_handle *h) {
  if (rc != GOROVOD_OK) {
    return rc;
  }
  return gorovod_wait(*h, -1);
}

int gorovod_grouped_allreduce_async(int32_t n, const void *const *send, void *const *recv,
                                    const int64_t *counts, const int32_t *dtypes, int op,
                                    double prescale, double postscale, gorovod_handle *handle) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoAllreduceAsync(n, (void *)send, (void *)recv, (int64_t *)counts, (int32_t *)dtypes, op,
                                 prescale, postscale, handle);
}

int gorovod_grouped_allreduce(int32_t n, const void *const *send, void *const *recv,
                              const int64_t *counts, const int32_t *dtypes, int op,
                              double prescale, double postscale) {
  gorovod_handle h;
  return wait_for(gorovod_grouped_allreduce_async(n, send, recv, counts, dtypes, op, prescale, postscale, &h), &h);
}

int gorovod_allreduce_async(const void *send, void *recv, int64_t count, int dtype, int op,
                            double prescale, double postscale, gorovod_handle *handle) {
  int32_t dt = dtype;
  return gorovod_grouped_allreduce_async(1, &send, &recv, &count, &dt, op, prescale, postscale, handle);
}

int gorovod_allreduce(const void *send, void *recv, int64_t count, int dtype, int op,
                      double prescale, double postscale) {
  gorovod_handle h;
  return wait_for(gorovod_allreduce_async(send, recv, count, dtype, op, prescale, postscale, &h), &h);
}

int gorovod_grouped_broadcast_async(int32_t n, void *const *bufs, const int64_t *counts,
                                    const int32_t *dtypes, int32_t root, gorovod_handle *handle) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoBroadcastAsync(n, (void *)bufs, (int64_t *)counts, (int32_t *)dtypes, root, handle);
}

int gorovod_grouped_broadcast(int32_t n, void *const *bufs, const int64_t *counts,
                              const int32_t *dtypes, int32_t root) {
  gorovod_handle h;
  return wait_for(gorovod_grouped_broadcast_async(n, bufs, counts, dtypes, root, &h), &h);
}

int gorovod_broadcast_async(void *buf, int64_t count, int dtype, int32_t root, gorovod_handle *handle) {
  int32_t dt = dtype;
  return gorovod_grouped_broadcast_async(1, &buf, &count, &dt, root, handle);
}

int gorovod_broadcast(void *buf, int64_t count, int dtype, int32_t root) {
  gorovod_handle h;
  return wait_for(gorovod_broadcast_async(buf, count, dtype, root, &h), &h);
}

int gorovod_allgather_async(const void *send, int64_t count, void *recv, const int64_t *recv_counts,
                            int dtype, gorovod_handle *handle) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoAllgatherAsync((void *)send, count, recv, (int64_t *)recv_counts, dtype, handle);
}

int gorovod_allgather(const void *send, int64_t count, void *recv, const int64_t *recv_counts, int dtype) {
  gorovod_handle h;
  return wait_for(gorovod_allgather_async(send, count, recv, recv_counts, dtype, &h), &h);
}

int gorovod_alltoall_async(const void *send, const int64_t *send_counts, void *recv,
                           const int64_t *recv_counts, int dtype, gorovod_handle *handle) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoAlltoallAsync((void *)send, (int64_t *)send_counts, recv, (int64_t *)recv_counts, dtype, handle);
}

int gorovod_alltoall(const void *send, const int64_t *send_counts, void *recv,
                     const int64_t *recv_counts, int dtype) {
  gorovod_handle h;
  return wait_for(gorovod_alltoall_async(send, send_counts, recv, recv_counts, dtype, &h), &h);
}

int gorovod_reducescatter_async(const void *send, int64_t count, void *recv, const int64_t *recv_counts,
                                int dtype, int op, double prescale, double postscale,
                                gorovod_handle *handle) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoReducescatterAsync((void *)send, count, recv, (int64_t *)recv_counts, dtype, op, prescale,
                                     postscale, handle);
}

int gorovod_reducescatter(const void *send, int64_t count, void *recv, const int64_t *recv_counts,
                          int dtype, int op, double prescale, double postscale) {
  gorovod_handle h;
  return wait_for(gorovod_reducescatter_async(send, count, recv, recv_counts, dtype, op, prescale, postscale, &h), &h);
}

int gorovod_barrier_async(gorovod_handle *handle) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoBarrierAsync(handle);
}

int gorovod_barrier(void) {
  gorovod_handle h;
  return wait_for(gorovod_barrier_async(&h), &h);
}

int gorovod_join_async(int32_t *last_rank, gorovod_handle *handle) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoJoinAsync(last_rank, handle);
}

int gorovod_join(int32_t *last_rank) {
  gorovod_handle h;
  return wait_for(gorovod_join_async(last_rank, &h), &h);
}

// ---- Handles ----

int gorovod_poll(gorovod_handle handle, int *done) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoPoll(handle, done);
}

int gorovod_wait(gorovod_handle handle, int64_t timeout_us) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoWait(handle, timeout_us);
}

// ---- Elastic training ----

int gorovod_commit(void) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoCommit();
}

int gorovod_reset(void) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoReset();
}

int gorovod_request_leave(void) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoRequestLeave();
}

int gorovod_record_samples(int64_t n) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoRecordSamples(n);
}

int gorovod_set_total_steps(int64_t n) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoSetTotalSteps(n);
}
