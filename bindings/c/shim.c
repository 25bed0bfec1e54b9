// The public functions of gorovod.h. Each refuses to run in a child made by
// fork() before entering the Go runtime (whose threads the child does not
// have), then calls the Go function that does the work (exports.go). The
// synchronous collectives are their asynchronous forms plus gorovod_wait.
// The last error is kept per thread, here in C, so that it works in a
// forked child too.

#include <errno.h>
#include <pthread.h>
#include <signal.h>
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

// ---- The name of the calling thread's next collective ----
//
// gorovod_name_next names the next collective the calling thread submits
// (Horovod's name= argument), kept per thread as the last error is, so that
// every collective's signature stays as it was. Go takes it as the
// collective starts (gorovod_take_name_).

static pthread_key_t name_key;
static pthread_once_t name_once = PTHREAD_ONCE_INIT;

static void name_key_make(void) { pthread_key_create(&name_key, free); }

static const char long_name_msg[] = "gorovod_name_next: a name longer than GOROVOD_MAX_NAME bytes";
static const char no_memory_msg[] = "gorovod_name_next: out of memory";

int gorovod_name_next(const char *name) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  pthread_once(&name_once, name_key_make);
  char *copy = NULL;
  if (name != NULL && name[0] != 0) {
    size_t n = strnlen(name, GOROVOD_MAX_NAME + 1);
    if (n > GOROVOD_MAX_NAME) {
      gorovod_set_error_(long_name_msg, sizeof long_name_msg - 1);
      return GOROVOD_ERR_INVALID_ARGUMENT;
    }
    copy = malloc(n + 1);
    if (copy == NULL) {
      gorovod_set_error_(no_memory_msg, sizeof no_memory_msg - 1);
      return GOROVOD_ERR_FAILED;
    }
    memcpy(copy, name, n);
    copy[n] = 0;
  }
  free(pthread_getspecific(name_key));
  pthread_setspecific(name_key, copy);
  return GOROVOD_OK;
}

// gorovod_take_name_ returns the calling thread's next name (NULL: none)
// and forgets it; the caller frees it.
char *gorovod_take_name_(void) {
  pthread_once(&name_once, name_key_make);
  char *name = pthread_getspecific(name_key);
  if (name != NULL) {
    pthread_setspecific(name_key, NULL);
  }
  return name;
}

// ---- The memory of the calling thread's next collective ----
//
// gorovod_cuda_next says that the next collective the calling thread
// submits takes CUDA device memory, kept per thread as the name is; Go
// takes it as the collective starts (gorovod_take_cuda_).

static __thread int cuda_next_set;
static __thread int32_t cuda_next_device;
static __thread uint64_t cuda_next_event;

int gorovod_cuda_next(int32_t device, uint64_t event) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  cuda_next_set = 1;
  cuda_next_device = device;
  cuda_next_event = event;
  return GOROVOD_OK;
}

// gorovod_take_cuda_ returns 1 and the calling thread's next device and
// event when gorovod_cuda_next set them, and forgets them; 0 when not.
int gorovod_take_cuda_(int32_t *device, uint64_t *event) {
  if (!cuda_next_set) {
    return 0;
  }
  cuda_next_set = 0;
  *device = cuda_next_device;
  *event = cuda_next_event;
  return 1;
}

int gorovod_cuda_supported(void) {
  REFUSE_IF_FORKED(0);
  return gorovodGoCudaSupported();
}

// ---- The SIGINT watch of the interruptible _start calls ----
//
// A call that runs on the calling thread cannot return to its caller
// until the collective ends, so a caller that must stop on Ctrl-C (Python)
// asks for it to be interruptible: a handler of ours runs in front of the
// installed one and tells Go through an eventfd (write(2) is
// async-signal-safe), which aborts the call running on a caller's thread
// (engine.Interrupt); then the installed handler runs as it would have.
// Python's handler only notes the signal, and raises KeyboardInterrupt once
// the call has returned.

static volatile int interrupt_fd = -1;
static struct sigaction chained;  // the handler installed before ours
static uint64_t sigint_count;     // SIGINTs seen by on_sigint (atomic)

// gorovod_set_interrupt_fd_ is called by Go once, with the eventfd it reads.
void gorovod_set_interrupt_fd_(int fd) { interrupt_fd = fd; }

// gorovod_sigint_count_ is how many SIGINTs on_sigint has seen: a call
// records it as it starts, so that a SIGINT from before (handled between
// two calls, its eventfd read late) does not abort it.
uint64_t gorovod_sigint_count_(void) { return __atomic_load_n(&sigint_count, __ATOMIC_SEQ_CST); }

static void on_sigint(int sig, siginfo_t *info, void *uc) {
  int saved = errno;
  int fd = interrupt_fd;
  if (fd >= 0 && getpid() == owner_pid) {  // not in a forked child: the fd is the parent's
    __atomic_add_fetch(&sigint_count, 1, __ATOMIC_SEQ_CST);
    uint64_t one = 1;
    ssize_t n = write(fd, &one, sizeof one);
    (void)n;
  }
  errno = saved;
  if (chained.sa_flags & SA_SIGINFO) {
    if (chained.sa_sigaction != NULL) {
      chained.sa_sigaction(sig, info, uc);
    }
  } else if (chained.sa_handler == SIG_DFL) {
    // What SIGINT would have done: the default action, once this returns.
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(sig, &dfl, NULL);
    raise(sig);
  } else if (chained.sa_handler != SIG_IGN) {
    chained.sa_handler(sig);
  }
}

static pthread_mutex_t watch_mu = PTHREAD_MUTEX_INITIALIZER;

// watch_sigint puts on_sigint in front of the installed SIGINT handler unless
// it is there already or the installed one ignores SIGINT; it costs one
// system call when nothing changed (Python's signal.signal replaces ours).
static void watch_sigint(void) {
  struct sigaction cur;
  if (interrupt_fd < 0 || sigaction(SIGINT, NULL, &cur) != 0) {
    return;
  }
  if (((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_sigint) ||
      (!(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == SIG_IGN)) {
    return;
  }
  pthread_mutex_lock(&watch_mu);
  if (sigaction(SIGINT, NULL, &cur) == 0 && !((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_sigint)) {
    chained = cur;
    struct sigaction mine = cur;
    mine.sa_sigaction = on_sigint;
    // SA_ONSTACK: the signal may land on a Go thread, whose stack is small.
    mine.sa_flags = cur.sa_flags | SA_SIGINFO | SA_ONSTACK;
    sigaction(SIGINT, &mine, NULL);
  }
  pthread_mutex_unlock(&watch_mu);
}

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

int gorovod_newest_world(uint64_t *number, int *breaking) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoNewestWorld(number, breaking);
}

int gorovod_left_ranks(int32_t *ranks, int32_t capacity, int32_t *count) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoLeftRanks(ranks, capacity, count);
}

int gorovod_digest(const void *data, int64_t nbytes, uint64_t *out) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoDigest((void *)data, nbytes, out);
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
// the order C evaluates arguments in is unspecified); a _start call that
// ran on this thread left no handle (0), and rc is its result.
static int wait_for(int rc, const gorovod_handle *h) {
  if (rc != GOROVOD_OK || *h == 0) {
    return rc;
  }
  return gorovod_wait(*h, -1);
}

int gorovod_grouped_allreduce_ps_async(int32_t process_set, int32_t n, const void *const *send,
                                       void *const *recv, const int64_t *counts, const int32_t *dtypes, int op,
                                       double prescale, double postscale, gorovod_handle *handle) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoAllreduceAsync(process_set, n, (void *)send, (void *)recv, (int64_t *)counts, (int32_t *)dtypes,
                                 NULL, NULL, op, prescale, postscale, handle);
}

int gorovod_grouped_allreduce_shaped_async(int32_t process_set, int32_t n, const void *const *send,
                                           void *const *recv, const int64_t *counts, const int32_t *dtypes,
                                           const int32_t *ndims, const int64_t *dims, int op, double prescale,
                                           double postscale, gorovod_handle *handle) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoAllreduceAsync(process_set, n, (void *)send, (void *)recv, (int64_t *)counts, (int32_t *)dtypes,
                                 (int32_t *)ndims, (int64_t *)dims, op, prescale, postscale, handle);
}

int gorovod_grouped_allreduce_ps_start(int32_t process_set, int32_t n, const void *const *send,
                                       void *const *recv, const int64_t *counts, const int32_t *dtypes, int op,
                                       double prescale, double postscale, int flags, gorovod_handle *handle) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  if (flags & GOROVOD_START_INTERRUPTIBLE) {
    watch_sigint();
  }
  return gorovodGoAllreduceStart(process_set, n, (void *)send, (void *)recv, (int64_t *)counts, (int32_t *)dtypes,
                                 NULL, NULL, op, prescale, postscale, flags, handle);
}

int gorovod_grouped_allreduce_shaped_start(int32_t process_set, int32_t n, const void *const *send,
                                           void *const *recv, const int64_t *counts, const int32_t *dtypes,
                                           const int32_t *ndims, const int64_t *dims, int op, double prescale,
                                           double postscale, int flags, gorovod_handle *handle) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  if (flags & GOROVOD_START_INTERRUPTIBLE) {
    watch_sigint();
  }
  return gorovodGoAllreduceStart(process_set, n, (void *)send, (void *)recv, (int64_t *)counts, (int32_t *)dtypes,
                                 (int32_t *)ndims, (int64_t *)dims, op, prescale, postscale, flags, handle);
}

int gorovod_grouped_allreduce_async(int32_t n, const void *const *send, void *const *recv,
                                    const int64_t *counts, const int32_t *dtypes, int op,
                                    double prescale, double postscale, gorovod_handle *handle) {
  return gorovod_grouped_allreduce_ps_async(0, n, send, recv, counts, dtypes, op, prescale, postscale, handle);
}

int gorovod_grouped_allreduce_start(int32_t n, const void *const *send, void *const *recv,
                                    const int64_t *counts, const int32_t *dtypes, int op,
                                    double prescale, double postscale, int flags, gorovod_handle *handle) {
  return gorovod_grouped_allreduce_ps_start(0, n, send, recv, counts, dtypes, op, prescale, postscale, flags,
                                            handle);
}

int gorovod_allreduce_start(const void *send, void *recv, int64_t count, int dtype, int op,
                            double prescale, double postscale, int flags, gorovod_handle *handle) {
  int32_t dt = dtype;
  return gorovod_grouped_allreduce_start(1, &send, &recv, &count, &dt, op, prescale, postscale, flags, handle);
}

int gorovod_grouped_allreduce(int32_t n, const void *const *send, void *const *recv,
                              const int64_t *counts, const int32_t *dtypes, int op,
                              double prescale, double postscale) {
  gorovod_handle h;
  return wait_for(gorovod_grouped_allreduce_start(n, send, recv, counts, dtypes, op, prescale, postscale, 0, &h), &h);
}

int gorovod_allreduce_async(const void *send, void *recv, int64_t count, int dtype, int op,
                            double prescale, double postscale, gorovod_handle *handle) {
  int32_t dt = dtype;
  return gorovod_grouped_allreduce_async(1, &send, &recv, &count, &dt, op, prescale, postscale, handle);
}

int gorovod_allreduce(const void *send, void *recv, int64_t count, int dtype, int op,
                      double prescale, double postscale) {
  gorovod_handle h;
  return wait_for(gorovod_allreduce_start(send, recv, count, dtype, op, prescale, postscale, 0, &h), &h);
}

int gorovod_grouped_broadcast_ps_async(int32_t process_set, int32_t n, void *const *bufs, const int64_t *counts,
                                       const int32_t *dtypes, int32_t root, gorovod_handle *handle) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoBroadcastAsync(process_set, n, (void *)bufs, (int64_t *)counts, (int32_t *)dtypes, root, handle);
}

int gorovod_grouped_broadcast_ps_start(int32_t process_set, int32_t n, void *const *bufs, const int64_t *counts,
                                       const int32_t *dtypes, int32_t root, int flags, gorovod_handle *handle) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  if (flags & GOROVOD_START_INTERRUPTIBLE) {
    watch_sigint();
  }
  return gorovodGoBroadcastStart(process_set, n, (void *)bufs, (int64_t *)counts, (int32_t *)dtypes, root, flags,
                                 handle);
}

int gorovod_grouped_broadcast_async(int32_t n, void *const *bufs, const int64_t *counts,
                                    const int32_t *dtypes, int32_t root, gorovod_handle *handle) {
  return gorovod_grouped_broadcast_ps_async(0, n, bufs, counts, dtypes, root, handle);
}

int gorovod_grouped_broadcast_start(int32_t n, void *const *bufs, const int64_t *counts,
                                    const int32_t *dtypes, int32_t root, int flags, gorovod_handle *handle) {
  return gorovod_grouped_broadcast_ps_start(0, n, bufs, counts, dtypes, root, flags, handle);
}

int gorovod_grouped_broadcast(int32_t n, void *const *bufs, const int64_t *counts,
                              const int32_t *dtypes, int32_t root) {
  gorovod_handle h;
  return wait_for(gorovod_grouped_broadcast_start(n, bufs, counts, dtypes, root, 0, &h), &h);
}

int gorovod_broadcast_async(void *buf, int64_t count, int dtype, int32_t root, gorovod_handle *handle) {
  int32_t dt = dtype;
  return gorovod_grouped_broadcast_async(1, &buf, &count, &dt, root, handle);
}

int gorovod_broadcast(void *buf, int64_t count, int dtype, int32_t root) {
  int32_t dt = dtype;
  gorovod_handle h;
  return wait_for(gorovod_grouped_broadcast_start(1, &buf, &count, &dt, root, 0, &h), &h);
}

int gorovod_allgather_ps_async(int32_t process_set, const void *send, int64_t count, void *recv,
                               const int64_t *recv_counts, int dtype, gorovod_handle *handle) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoAllgatherAsync(process_set, (void *)send, count, recv, (int64_t *)recv_counts, dtype, handle);
}

int gorovod_allgather_async(const void *send, int64_t count, void *recv, const int64_t *recv_counts,
                            int dtype, gorovod_handle *handle) {
  return gorovod_allgather_ps_async(0, send, count, recv, recv_counts, dtype, handle);
}

int gorovod_allgather(const void *send, int64_t count, void *recv, const int64_t *recv_counts, int dtype) {
  gorovod_handle h;
  return wait_for(gorovod_allgather_async(send, count, recv, recv_counts, dtype, &h), &h);
}

int gorovod_alltoall_ps_async(int32_t process_set, const void *send, const int64_t *send_counts, void *recv,
                              const int64_t *recv_counts, int dtype, gorovod_handle *handle) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoAlltoallAsync(process_set, (void *)send, (int64_t *)send_counts, recv, (int64_t *)recv_counts,
                                dtype, handle);
}

int gorovod_alltoall_async(const void *send, const int64_t *send_counts, void *recv,
                           const int64_t *recv_counts, int dtype, gorovod_handle *handle) {
  return gorovod_alltoall_ps_async(0, send, send_counts, recv, recv_counts, dtype, handle);
}

int gorovod_alltoall(const void *send, const int64_t *send_counts, void *recv,
                     const int64_t *recv_counts, int dtype) {
  gorovod_handle h;
  return wait_for(gorovod_alltoall_async(send, send_counts, recv, recv_counts, dtype, &h), &h);
}

int gorovod_reducescatter_ps_async(int32_t process_set, const void *send, int64_t count, void *recv,
                                   const int64_t *recv_counts, int dtype, int op, double prescale,
                                   double postscale, gorovod_handle *handle) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoReducescatterAsync(process_set, (void *)send, count, recv, (int64_t *)recv_counts, dtype, op,
                                     prescale, postscale, handle);
}

int gorovod_reducescatter_async(const void *send, int64_t count, void *recv, const int64_t *recv_counts,
                                int dtype, int op, double prescale, double postscale,
                                gorovod_handle *handle) {
  return gorovod_reducescatter_ps_async(0, send, count, recv, recv_counts, dtype, op, prescale, postscale, handle);
}

int gorovod_reducescatter(const void *send, int64_t count, void *recv, const int64_t *recv_counts,
                          int dtype, int op, double prescale, double postscale) {
  gorovod_handle h;
  return wait_for(gorovod_reducescatter_async(send, count, recv, recv_counts, dtype, op, prescale, postscale, &h), &h);
}

int gorovod_barrier_ps_async(int32_t process_set, gorovod_handle *handle) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoBarrierAsync(process_set, handle);
}

int gorovod_barrier_ps_start(int32_t process_set, int flags, gorovod_handle *handle) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  if (flags & GOROVOD_START_INTERRUPTIBLE) {
    watch_sigint();
  }
  return gorovodGoBarrierStart(process_set, flags, handle);
}

int gorovod_send_async(const void *buf, int64_t count, int dtype, int32_t peer, uint64_t tag,
                       gorovod_handle *handle) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoP2PAsync(1, (void *)buf, count, dtype, peer, tag, handle);
}

int gorovod_recv_async(void *buf, int64_t count, int dtype, int32_t peer, uint64_t tag, gorovod_handle *handle) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoP2PAsync(0, buf, count, dtype, peer, tag, handle);
}

int gorovod_recv_any_async(void *buf, int64_t count, int dtype, uint64_t tag, int32_t *source,
                           gorovod_handle *handle) {
  return gorovod_recv_any_ps_async(0, buf, count, dtype, tag, source, handle);
}

int gorovod_recv_any_ps_async(int32_t process_set, void *buf, int64_t count, int dtype, uint64_t tag,
                              int32_t *source, gorovod_handle *handle) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoRecvAnyAsync(process_set, buf, count, dtype, tag, source, handle);
}

int gorovod_barrier_async(gorovod_handle *handle) { return gorovod_barrier_ps_async(0, handle); }

int gorovod_barrier_start(int flags, gorovod_handle *handle) { return gorovod_barrier_ps_start(0, flags, handle); }

int gorovod_barrier(void) {
  gorovod_handle h;
  return wait_for(gorovod_barrier_start(0, &h), &h);
}

int gorovod_join_async(int32_t *last_rank, gorovod_handle *handle) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoJoinAsync(last_rank, handle);
}

int gorovod_join(int32_t *last_rank) {
  gorovod_handle h;
  return wait_for(gorovod_join_async(last_rank, &h), &h);
}

// ---- Process sets ----

int gorovod_add_process_set(const int32_t *ranks, int32_t n, int32_t *id) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoAddProcessSet((int32_t *)ranks, n, id);
}

int gorovod_add_process_set_async(const int32_t *ranks, int32_t n, int32_t *id, gorovod_handle *handle) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoAddProcessSetAsync((int32_t *)ranks, n, id, handle);
}

int gorovod_remove_process_set(int32_t id) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoRemoveProcessSet(id);
}

int gorovod_process_set_get(int32_t id, int32_t *rank, int32_t *size, int32_t *ranks, int32_t capacity) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoProcessSetGet(id, rank, size, ranks, capacity);
}

int gorovod_process_set_ids(int32_t *ids, int32_t capacity, int32_t *n) {
  REFUSE_IF_FORKED(GOROVOD_ERR_FORKED);
  return gorovodGoProcessSetIds(ids, capacity, n);
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
