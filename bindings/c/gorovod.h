/*
 * gorovod.h — the C ABI of gorovod (libgorovod.so).
 *
 * gorovod is an elastic, Horovod-style collective communication library for
 * data-parallel training. This header is all a C or C++ program (or a
 * language binding: the Python package loads the library with ctypes) needs:
 *
 *     cc prog.c -I bindings/c -L <dir> -lgorovod -Wl,-rpath,<dir>
 *
 * Build the library with
 *
 *     go build -buildmode=c-shared -o libgorovod.so ./bindings/c
 *
 * (the build also writes a libgorovod.h of cgo's own: ignore it, this file
 * is the interface). The same library takes CUDA device memory where the
 * NVIDIA driver is installed (see CUDA below); it links no NVIDIA library.
 *
 * THE MODEL
 *
 *   One process is one worker. gorovod_init() joins the job that
 *   `gorovod run` started the process in (from its environment), or the job
 *   a gorovod_config names, or else trains alone in a world of one. The
 *   world (its members, this process's rank and size) can change while the
 *   job runs: workers join, leave and fail.
 *
 *   Collectives pair up by name, as in Horovod: a collective named with
 *   gorovod_name_next pairs with the other ranks' collective of that name,
 *   whatever its place in each rank's sequence; collectives without a name
 *   pair by their position among the unnamed ones. Every rank must call
 *   the same collectives, with the same dtypes and element counts (a
 *   collective on a process set concerns its members only: see Process
 *   sets below). They run one at a time on a thread of the library's own,
 *   in the order they were called where every rank called them in the
 *   same order; when the ranks' next calls differ, the ranks exchange their
 *   pending calls and run the first of rank 0's that every rank has
 *   pending. Ranks that called one collective (same name, or same
 *   position) differently all get GOROVOD_ERR_MISMATCH for that call,
 *   never a hang: the ranks compare each call's description before any of
 *   its data moves, so the next call runs as if it had not been made. A
 *   named call that no other rank's pairs with fails with
 *   GOROVOD_ERR_MISMATCH once the ranks have waited the I/O timeout for
 *   one.
 *
 *   Every collective has an asynchronous form (..._async), which queues it
 *   and returns a handle at once, and a synchronous form, which waits for it.
 *   The memory a call is given must stay valid and untouched until its
 *   handle completes (gorovod_wait returned something other than
 *   GOROVOD_ERR_TIMEOUT, or gorovod_poll said done); the library keeps no
 *   pointer after that. Buffers are host memory, or CUDA device memory
 *   when gorovod_cuda_next says so (see CUDA below). Send and receive
 *   buffers of one call may be the same memory only where a function says
 *   so.
 *
 * ERRORS
 *
 *   Every function returns a gorovod_status (0 is GOROVOD_OK), except the
 *   getters, which return their value or -1. After a failure,
 *   gorovod_last_error() describes it, for the calling thread (as errno),
 *   until that thread's next failing call. No function ever aborts the
 *   process or lets a Go panic cross into C (a panic becomes
 *   GOROVOD_ERR_INTERNAL), and all of them may be called from any thread.
 *
 * ELASTICITY (what a framework's elastic loop does, as the Python
 * binding's gorovod.torch.elastic.run)
 *
 *   - A collective that fails because the world broke (a peer died, froze,
 *     or left) returns GOROVOD_ERR_WORLD_CHANGED once the library has
 *     rebuilt the world without it. gorovod_commit() at the end of a step
 *     returns GOROVOD_ERR_HOSTS_UPDATED when every member moved to a newer
 *     world there (workers joined or left), and GOROVOD_ERR_EXCLUDED when
 *     the job goes on without this process (it asked to leave, or was
 *     removed): stop training and call gorovod_shutdown(0).
 *   - After a world change, the collectives already queued for the old
 *     world fail with GOROVOD_ERR_WORLD_CHANGED without running, and so does
 *     every new one until gorovod_reset(). The loop then restores its last
 *     committed state, calls gorovod_reset(), and broadcasts its state from
 *     the new rank 0 (gorovod_grouped_broadcast) before training on: every
 *     member does the same, at the same point, so their sequences pair up
 *     again. A worker that joins gets its state from the same broadcasts.
 *
 * FORK
 *
 *   The library runs threads of its own, so a child made by fork() must not
 *   call into it: every function returns GOROVOD_ERR_FORKED there, without
 *   entering the library's runtime. Load the library once per process: two
 *   copies would be two Go runtimes.
 */
#ifndef GOROVOD_H
#define GOROVOD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this interface; gorovod_abi_version() returns the
 * library's. 2 added the _start calls, 3 the process sets, 4 the shaped
 * allreduce, 5 point-to-point messages and gorovod_name_next, 6 CUDA
 * device memory (gorovod_cuda_next, gorovod_cuda_supported), 7 the receive
 * from any rank (gorovod_recv_any_async), 8 the receive from any member of a
 * process set (gorovod_recv_any_ps_async), 9 the registration of a process
 * set with a handle (gorovod_add_process_set_async), 10 the newest world
 * known (gorovod_newest_world), 11 the ranks that left the job
 * (gorovod_left_ranks), 12 the digest of host memory (gorovod_digest). */
#define GOROVOD_ABI_VERSION 12

typedef enum gorovod_status {
  GOROVOD_OK = 0,
  /* An argument was refused before anything was sent: a null pointer, an
   * unknown dtype or reduce op, a negative count, counts that do not add
   * up, a root outside the world, a scale factor that is not finite. The
   * world is untouched. */
  GOROVOD_ERR_INVALID_ARGUMENT = 1,
  /* gorovod_init has not been called (or gorovod_shutdown was). */
  GOROVOD_ERR_NOT_INITIALIZED = 2,
  /* The ranks called different collectives (kind, dtype, count, reduce op,
   * root, scale factors): what each called is in gorovod_last_error(). The
   * call did nothing; the next one runs. */
  GOROVOD_ERR_MISMATCH = 3,
  /* The world changed under the collective (or before it ran): the library
   * rebuilt it; restore, gorovod_reset, re-synchronize (see ELASTICITY). */
  GOROVOD_ERR_WORLD_CHANGED = 4,
  /* gorovod_commit: every member moved to a newer world at this commit. */
  GOROVOD_ERR_HOSTS_UPDATED = 5,
  /* The job goes on without this process. */
  GOROVOD_ERR_EXCLUDED = 6,
  /* gorovod_wait: the timeout came first; the handle is still valid. */
  GOROVOD_ERR_TIMEOUT = 7,
  /* Called in a child process made by fork() after the library started. */
  GOROVOD_ERR_FORKED = 8,
  /* gorovod_shutdown was called while this call was queued or running. */
  GOROVOD_ERR_SHUT_DOWN = 9,
  /* Not a handle the library issued, or one already collected. */
  GOROVOD_ERR_UNKNOWN_HANDLE = 10,
  /* A bug in gorovod (a recovered panic): please report the message. */
  GOROVOD_ERR_INTERNAL = 11,
  /* Anything else: the job could not be joined, a collective failed in a way
   * that left the world intact, ... (see gorovod_last_error()). */
  GOROVOD_ERR_FAILED = 12
} gorovod_status;

/* Element types (the numbering is the ABI's). */
typedef enum gorovod_dtype {
  GOROVOD_FLOAT32 = 1,
  GOROVOD_FLOAT64 = 2,
  GOROVOD_FLOAT16 = 3,  /* IEEE 754 binary16 */
  GOROVOD_BFLOAT16 = 4,
  GOROVOD_INT32 = 5,
  GOROVOD_INT64 = 6,
  GOROVOD_UINT8 = 7
} gorovod_dtype;

/* Reduce operations. AVERAGE is SUM divided by the world size (an integer
 * division, truncating toward zero, for integer dtypes). Every reducing
 * collective also takes a prescale factor (multiplies each rank's input) and
 * a postscale factor (multiplies the result; with AVERAGE the division
 * comes on top), as Horovod's; 0 means 1. Integer results of a scale are
 * rounded to nearest and saturated.
 * ADASUM is Horovod's adaptive summation: tensor by tensor (each tensor of a
 * grouped call on its own), a and b combine as
 * (1 - a.b/(2|a|^2)) a + (1 - a.b/(2|b|^2)) b, pairwise over log2(size)
 * levels. Allreduce only, floating-point dtypes only, and a world whose size
 * is a power of two: anything else is GOROVOD_ERR_INVALID_ARGUMENT. The
 * prescale factor applies before, the postscale factor after. */
typedef enum gorovod_op {
  GOROVOD_SUM = 1,
  GOROVOD_AVERAGE = 2,
  GOROVOD_MIN = 3,
  GOROVOD_MAX = 4,
  GOROVOD_PRODUCT = 5,
  GOROVOD_ADASUM = 6
} gorovod_op;

/* An asynchronous call until gorovod_wait collects it; never 0, never
 * reused. */
typedef uint64_t gorovod_handle;

/* How gorovod_init_config joins. Zero fields are defaults: start from
 * gorovod_config_init(). */
typedef struct gorovod_config {
  /* sizeof(gorovod_config), set by gorovod_config_init: lets a newer
   * library read an older program's struct. */
  uint32_t struct_size;
  /* The job to join. NULL or "": the job of the launcher that started this
   * process (`gorovod run`, from the environment), or else a world of one. */
  const char *job_id;
  /* With job_id: the job secret, hex (at least 16 bytes), and its gossip
   * seeds, comma-separated host:port (the driver's, usually). */
  const char *secret_hex;
  const char *seeds;
  /* Optional: where the collective transport listens (host:port) and where
   * gossip binds (host or host:port). */
  const char *listen_addr;
  const char *gossip_addr;
  /* How long a peer may stay silent inside a collective before it is given
   * up on; 0: 10 minutes. (A worker that died or froze is found by gossip in
   * about a second; this bounds one that is alive but stuck.) */
  int64_t io_timeout_ms;
  /* Allreduces of several tensors are packed into buffers of at most this
   * many bytes; 0: 128 MiB (Horovod's fusion threshold). */
  int64_t fusion_bytes;
  /* Diagnostics on stderr: 0 warnings and errors (default), 1 also info,
   * 2 also debug, -1 none. */
  int32_t log_level;
} gorovod_config;

/* The process's place in the current world, as Horovod's rank, size,
 * local_rank, local_size, cross_rank, cross_size: local ranks are the members
 * on this host in rank order; the cross ranks are the members with this
 * process's local rank (one per host). world is the world's number: it
 * changes whenever the world does. */
typedef struct gorovod_topology {
  int32_t rank, size;
  int32_t local_rank, local_size;
  int32_t cross_rank, cross_size;
  uint64_t world;
} gorovod_topology;

int gorovod_abi_version(void);

/* The last failure of the calling thread, as text; never NULL. Valid until
 * the thread's next failing call. */
const char *gorovod_last_error(void);

/* ---- Life cycle ---- */

void gorovod_config_init(gorovod_config *cfg);

/* Joins the launcher's job, or trains alone (gorovod_init_config(NULL)). */
int gorovod_init(void);
/* Joins as cfg says; blocks until a world admits this process. Calling it
 * again while initialized does nothing and returns GOROVOD_OK. */
int gorovod_init_config(const gorovod_config *cfg);
/* Leaves the job. finished != 0: training completed (queued collectives run
 * first and the job is told that training is over); 0: an error or an
 * interruption (the collective in progress is aborted, queued ones fail with
 * GOROVOD_ERR_SHUT_DOWN). gorovod_init may be called again afterwards (a new
 * worker joins). */
int gorovod_shutdown(int finished);
/* 1 when initialized, 0 when not. */
int gorovod_is_initialized(void);

/* ---- Where this process stands (as of the last completed collective) ---- */

int gorovod_topology_get(gorovod_topology *out);
/* The newest world this process has been told of: *number is
 * gorovod_topology's world, or above it while a world change is under way
 * (the job has agreed on a world that the library moves to at its next
 * call, or at the commit where every member does); *breaking is 1 when
 * that world goes on without a member of the current one that this
 * process's gossip declared dead (the next call on the current world then
 * fails with GOROVOD_ERR_WORLD_CHANGED), else 0. For a caller that waits
 * for the other ranks outside the library (on a store of its own): with
 * *breaking, one of them will not come. Does not block. */
int gorovod_newest_world(uint64_t *number, int *breaking);
/* The ranks, in the current world, of the members that left the job
 * gracefully (their processes shut the library down: gossip was told
 * goodbye, it did not declare them dead), in ascending order: they will
 * call nothing more in this world, whether or not the job forms a world
 * without them. Writes at most capacity of them to ranks and their number
 * to *count. For a caller that waits for the other ranks outside the
 * library, as gorovod_newest_world. Does not block. */
int gorovod_left_ranks(int32_t *ranks, int32_t capacity, int32_t *count);

/* Sets *out to the 64-bit digest (xxHash64, seed 0) of the nbytes bytes of
 * host memory at data: the same bytes give the same digest in every process
 * and on every host. A binding compares its workers' digests of a tensor to
 * skip sending one that every worker holds already (gorovod.torch's elastic
 * state). Needs no gorovod_init. GOROVOD_ERR_INVALID_ARGUMENT for a NULL out,
 * a negative nbytes, or a NULL data with nbytes > 0. */
int gorovod_digest(const void *data, int64_t nbytes, uint64_t *out);
/* Each returns its value, or -1 when not initialized. */
int gorovod_rank(void);
int gorovod_size(void);
int gorovod_local_rank(void);
int gorovod_local_size(void);
int gorovod_cross_rank(void);
int gorovod_cross_size(void);

/* ---- Collectives ----
 * count and counts are numbers of elements; per-rank counts arrays have
 * gorovod_size() entries. */

/* Reduces count elements of send across the world into recv (send == recv:
 * in place). */
int gorovod_allreduce_async(const void *send, void *recv, int64_t count, int dtype, int op,
                            double prescale, double postscale, gorovod_handle *handle);
int gorovod_allreduce(const void *send, void *recv, int64_t count, int dtype, int op,
                      double prescale, double postscale);
/* n tensors in one call, fused into few collectives (one per dtype): tensor
 * i is counts[i] elements of dtypes[i]; send may be NULL (in place: the
 * results land in recv[i]). */
int gorovod_grouped_allreduce_async(int32_t n, const void *const *send, void *const *recv,
                                    const int64_t *counts, const int32_t *dtypes, int op,
                                    double prescale, double postscale, gorovod_handle *handle);
int gorovod_grouped_allreduce(int32_t n, const void *const *send, void *const *recv,
                              const int64_t *counts, const int32_t *dtypes, int op,
                              double prescale, double postscale);

/* Copies root's buf into every other rank's, in place. */
int gorovod_broadcast_async(void *buf, int64_t count, int dtype, int32_t root, gorovod_handle *handle);
int gorovod_broadcast(void *buf, int64_t count, int dtype, int32_t root);
/* n buffers from one root in one call (a state broadcast). */
int gorovod_grouped_broadcast_async(int32_t n, void *const *bufs, const int64_t *counts,
                                    const int32_t *dtypes, int32_t root, gorovod_handle *handle);
int gorovod_grouped_broadcast(int32_t n, void *const *bufs, const int64_t *counts,
                              const int32_t *dtypes, int32_t root);

/* Concatenates every rank's send, in rank order, into recv: recv_counts[r]
 * elements from rank r (recv_counts NULL: count from every rank), and
 * recv_counts[rank] == count. Every rank passes the same recv_counts. */
int gorovod_allgather_async(const void *send, int64_t count, void *recv, const int64_t *recv_counts,
                            int dtype, gorovod_handle *handle);
int gorovod_allgather(const void *send, int64_t count, void *recv, const int64_t *recv_counts, int dtype);

/* Sends send_counts[r] elements of send (in rank order) to each rank r and
 * receives recv_counts[r] elements from each into recv (not in place). */
int gorovod_alltoall_async(const void *send, const int64_t *send_counts, void *recv,
                           const int64_t *recv_counts, int dtype, gorovod_handle *handle);
int gorovod_alltoall(const void *send, const int64_t *send_counts, void *recv,
                     const int64_t *recv_counts, int dtype);

/* Reduces count elements of send across the world and leaves recv_counts[r]
 * of the result, in rank order, in rank r's recv (recv_counts NULL: count /
 * size each, the first count % size ranks one more). */
int gorovod_reducescatter_async(const void *send, int64_t count, void *recv, const int64_t *recv_counts,
                                int dtype, int op, double prescale, double postscale,
                                gorovod_handle *handle);
int gorovod_reducescatter(const void *send, int64_t count, void *recv, const int64_t *recv_counts,
                          int dtype, int op, double prescale, double postscale);

/* Names the next collective the calling thread calls (allreduce,
 * broadcast, allgather, alltoall or reducescatter, any form, on any
 * process set; barrier and join take no name and drop it), as Horovod's
 * name= argument: ranks pair the calls of one name whatever their order
 * (see THE MODEL). That next call takes the name whether it is accepted or
 * refused. name NULL or "": none. Up to GOROVOD_MAX_NAME bytes
 * (GOROVOD_ERR_INVALID_ARGUMENT above). Names of calls in flight should be
 * unique: with two of one name pending, the older pairs first. */
#define GOROVOD_MAX_NAME 4096
int gorovod_name_next(const char *name);

/* ---- CUDA ----
 *
 * Says that the buffers of the next collective the calling thread calls
 * (allreduce, broadcast, allgather, alltoall or reducescatter, any form,
 * on any process set) are CUDA device memory of device `device` (a CUDA
 * ordinal, as CUDA_VISIBLE_DEVICES leaves them: a PyTorch tensor's
 * device.index), allocated in the device's primary context (as the CUDA
 * runtime and PyTorch allocate), every buffer of the call on that device;
 * the pointer arguments are then device addresses. That next call takes
 * the setting whether it is accepted or refused; barrier and join drop it,
 * and a point-to-point message given it is refused (messages take host
 * memory only).
 *
 * event is a CUDA event (CUevent, the same handle as the runtime's
 * cudaEvent_t; PyTorch: torch.cuda.Event.cuda_event) that the caller
 * recorded on the stream that produces the buffers, after the work that
 * writes them (and, for the output buffers, after their allocation): the
 * library waits for the event before it touches any buffer, on its own
 * threads, so the caller's thread and stream never block. 0: none (the
 * buffers are ready now). The event must stay alive until the call's
 * handle completes. When the handle completes, the library's work on the
 * buffers is complete on the GPU too: the caller's stream may use the
 * results at once.
 *
 * The library opens device `device` the first time a call names it (one
 * per process per device, closed by gorovod_shutdown); its fusion buffers
 * for device tensors are device memory too. Opening the device loads the
 * NVIDIA driver (libcuda.so.1, R520 / CUDA 11.8 or newer); on a host
 * without it such a call fails with GOROVOD_ERR_INVALID_ARGUMENT and a
 * message naming what is missing. */
int gorovod_cuda_next(int32_t device, uint64_t event);
/* 1 when this library takes CUDA device memory where a driver is present
 * (every build of this version; 0 from a library that never does). Needs
 * no gorovod_init, and loads no driver: a call on device memory says
 * whether this host has one. */
int gorovod_cuda_supported(void);

/* Returns once every rank has entered it. */
int gorovod_barrier_async(gorovod_handle *handle);
int gorovod_barrier(void);

/* The _start forms, for a caller that waits for the call at once: when
 * nothing is queued or running and the buffers are small (16 KiB by
 * default), the call runs on the calling thread before _start returns,
 * without handing it to the library's own thread and back (which costs
 * wake-ups of sleeping threads): *handle is then 0 and the return value is
 * the call's result. Otherwise the call is queued as the _async forms queue
 * it: the return value is the submission's and *handle names the call
 * (wait for it with gorovod_wait). The blocking forms above use these.
 *
 * GOROVOD_START_INTERRUPTIBLE: SIGINT aborts a call running on the calling
 * thread (status GOROVOD_ERR_FAILED; its world breaks, and the next
 * collective finds a rebuilt one, GOROVOD_ERR_WORLD_CHANGED). The library
 * then runs its own SIGINT handler in front of the one installed (unless
 * that one is SIG_IGN), calling the installed one afterwards; it checks at
 * each such call that it is still there. For a caller whose SIGINT stops the
 * program (Python's KeyboardInterrupt) and that must be able to stop while
 * a peer is frozen; without the flag a call on the calling thread blocks
 * until it completes or fails. */
#define GOROVOD_START_INTERRUPTIBLE 1
int gorovod_allreduce_start(const void *send, void *recv, int64_t count, int dtype, int op,
                            double prescale, double postscale, int flags, gorovod_handle *handle);
int gorovod_grouped_allreduce_start(int32_t n, const void *const *send, void *const *recv,
                                    const int64_t *counts, const int32_t *dtypes, int op,
                                    double prescale, double postscale, int flags, gorovod_handle *handle);
int gorovod_grouped_broadcast_start(int32_t n, void *const *bufs, const int64_t *counts,
                                    const int32_t *dtypes, int32_t root, int flags, gorovod_handle *handle);
int gorovod_barrier_start(int flags, gorovod_handle *handle);

/* Waits for every rank to join and writes the rank that joined last into
 * *last_rank (the same on every rank). Until then, as Horovod's join, a
 * rank that joined takes part in the others' allreduces with zeros, and
 * their other collectives return GOROVOD_ERR_MISMATCH. */
int gorovod_join_async(int32_t *last_rank, gorovod_handle *handle);
int gorovod_join(int32_t *last_rank);

/* ---- Process sets ----
 *
 * A process set is some of the world's ranks that run collectives among
 * themselves, as Horovod's: the _ps forms below take its id (0 is the whole
 * world; the forms above are the _ps forms with 0). Only its members call
 * them, and every member must make the set's calls in the same order;
 * other ranks meanwhile run calls of their own, on other sets or on none.
 * A root is a world rank (a member); per-rank counts arrays have one entry
 * per member, in rank order; AVERAGE divides by the set's size. Calls on
 * a set this process is not a member of, or on an id that is not
 * registered, return GOROVOD_ERR_INVALID_ARGUMENT.
 *
 * A process's calls run in the order it made them, whatever their set: a
 * rank waits inside a call on one set until that set's other members reach
 * it, so ranks must never wait on each other in a cycle (rank 0 in set A's
 * call, which rank 1 reaches only after a call on set B that waits for
 * rank 0). Making the calls in one order on every rank (each rank skipping
 * those of sets it is not in) is always safe.
 *
 * A world change removes every process set but the world (their ranks were
 * the old world's): after gorovod_reset, add the sets again. Ids are never
 * reused. */

/* Registers the process set of the world's ranks ranks[0..n-1] (any order,
 * no repeats) and writes its id. Every rank of the world must call it, at the
 * same place of its sequence, with the same ranks (GOROVOD_ERR_MISMATCH on
 * every rank when they differ); a set of the same ranks as an existing one,
 * or the whole world, is refused with GOROVOD_ERR_INVALID_ARGUMENT. Blocks
 * until the calls made before it have run. */
int gorovod_add_process_set(const int32_t *ranks, int32_t n, int32_t *id);
/* gorovod_add_process_set that returns at once with a handle, for a caller
 * that bounds its wait (gorovod_wait with a timeout): the registration is
 * queued as a collective is, and *id is written when the handle completes
 * with GOROVOD_OK (id, like a collective's buffers, stays valid until
 * then). A wait that times out leaves it queued: it still pairs with the
 * other ranks' registration when they make it, and registers the set then.
 * Arguments are checked before it is queued, as for the blocking form. */
int gorovod_add_process_set_async(const int32_t *ranks, int32_t n, int32_t *id, gorovod_handle *handle);
/* Unregisters process set id on every rank (which must all call it, as for
 * gorovod_add_process_set); GOROVOD_ERR_INVALID_ARGUMENT for 0 or an id not
 * registered. */
int gorovod_remove_process_set(int32_t id);
/* Process set id: this process's rank in it (-1 when not a member), its
 * size, and up to capacity of its (world) ranks, increasing, into ranks
 * (which may be NULL). Any output pointer may be NULL. */
int gorovod_process_set_get(int32_t id, int32_t *rank, int32_t *size, int32_t *ranks, int32_t capacity);
/* The ids of the registered process sets, 0 first: *n of them, up to
 * capacity of which are written into ids (which may be NULL). */
int gorovod_process_set_ids(int32_t *ids, int32_t capacity, int32_t *n);

int gorovod_grouped_allreduce_ps_async(int32_t process_set, int32_t n, const void *const *send,
                                       void *const *recv, const int64_t *counts, const int32_t *dtypes, int op,
                                       double prescale, double postscale, gorovod_handle *handle);
int gorovod_grouped_allreduce_ps_start(int32_t process_set, int32_t n, const void *const *send,
                                       void *const *recv, const int64_t *counts, const int32_t *dtypes, int op,
                                       double prescale, double postscale, int flags, gorovod_handle *handle);
/* The grouped allreduce of tensors with shapes, which every rank compares as
 * well as their dtypes and element counts: tensor i has ndims[i] dimensions
 * (0 to 64), whose sizes follow one another in dims (the product of
 * tensor i's is counts[i]). Ranks whose shapes differ all get
 * GOROVOD_ERR_MISMATCH for the call and the world stays usable, as for any
 * mismatch. ndims NULL: each tensor has one dimension, counts[i]. */
int gorovod_grouped_allreduce_shaped_async(int32_t process_set, int32_t n, const void *const *send,
                                           void *const *recv, const int64_t *counts, const int32_t *dtypes,
                                           const int32_t *ndims, const int64_t *dims, int op, double prescale,
                                           double postscale, gorovod_handle *handle);
int gorovod_grouped_allreduce_shaped_start(int32_t process_set, int32_t n, const void *const *send,
                                           void *const *recv, const int64_t *counts, const int32_t *dtypes,
                                           const int32_t *ndims, const int64_t *dims, int op, double prescale,
                                           double postscale, int flags, gorovod_handle *handle);
int gorovod_grouped_broadcast_ps_async(int32_t process_set, int32_t n, void *const *bufs, const int64_t *counts,
                                       const int32_t *dtypes, int32_t root, gorovod_handle *handle);
int gorovod_grouped_broadcast_ps_start(int32_t process_set, int32_t n, void *const *bufs, const int64_t *counts,
                                       const int32_t *dtypes, int32_t root, int flags, gorovod_handle *handle);
int gorovod_allgather_ps_async(int32_t process_set, const void *send, int64_t count, void *recv,
                               const int64_t *recv_counts, int dtype, gorovod_handle *handle);
int gorovod_alltoall_ps_async(int32_t process_set, const void *send, const int64_t *send_counts, void *recv,
                              const int64_t *recv_counts, int dtype, gorovod_handle *handle);
int gorovod_reducescatter_ps_async(int32_t process_set, const void *send, int64_t count, void *recv,
                                   const int64_t *recv_counts, int dtype, int op, double prescale,
                                   double postscale, gorovod_handle *handle);
int gorovod_barrier_ps_async(int32_t process_set, gorovod_handle *handle);
int gorovod_barrier_ps_start(int32_t process_set, int flags, gorovod_handle *handle);

/* ---- Point-to-point messages ----
 *
 * count elements of dtype from buf to world rank peer as one message with
 * tag; the peer takes it with gorovod_recv_async from this rank with the same
 * tag. These stand outside the order of the collectives: each starts at once
 * and runs beside them (the message travels on the links the collectives
 * use), and its handle is collected with gorovod_wait as any other. Messages
 * from one rank to another with one tag arrive in the order sent; a receive
 * takes the next message with its tag, whatever came with other tags. A
 * message whose length in bytes differs from the receive's buffer fails that
 * receive with GOROVOD_ERR_FAILED (the message is dropped; the world goes
 * on). A peer that dies or stays silent past the I/O timeout breaks the world
 * as a failed collective does: GOROVOD_ERR_WORLD_CHANGED once it is rebuilt.
 * buf is the caller's until the handle completes. */
int gorovod_send_async(const void *buf, int64_t count, int dtype, int32_t peer, uint64_t tag,
                       gorovod_handle *handle);
int gorovod_recv_async(void *buf, int64_t count, int dtype, int32_t peer, uint64_t tag, gorovod_handle *handle);
/* Receives the next message with tag from any rank, as gorovod_recv_async
 * does from one: it takes its place among the receives posted for each rank,
 * in posting order, and a message already there (the earliest to come)
 * matches at once. The sender's world rank is written to *source before the
 * handle completes (a receive of another size than the message included);
 * source, like buf, is the caller's until then. A world of one rank has no
 * one to receive from: GOROVOD_ERR_INVALID_ARGUMENT. */
int gorovod_recv_any_async(void *buf, int64_t count, int dtype, uint64_t tag, int32_t *source,
                           gorovod_handle *handle);
/* gorovod_recv_any_async from any other member of process_set (0: the
 * world): messages with tag from ranks outside the set are left for other
 * receives. *source is the sender's world rank. A set this rank is not a
 * member of, an unknown one, or one of this rank alone:
 * GOROVOD_ERR_INVALID_ARGUMENT. */
int gorovod_recv_any_ps_async(int32_t process_set, void *buf, int64_t count, int dtype, uint64_t tag,
                              int32_t *source, gorovod_handle *handle);

/* ---- Handles ---- */

/* *done = 1 when the call has completed (gorovod_wait then returns at once),
 * 0 when not. The handle stays valid. */
int gorovod_poll(gorovod_handle handle, int *done);
/* Waits up to timeout_us microseconds (negative: without limit) and returns
 * the call's status, collecting the handle; GOROVOD_ERR_TIMEOUT when the
 * timeout came first (the handle stays valid: wait again). Waiting in
 * slices lets a caller handle its signals meanwhile. */
int gorovod_wait(gorovod_handle handle, int64_t timeout_us);

/* ---- Elastic training ---- */

/* Ends a step (after every queued collective): moves every member to a newer
 * world when one was agreed. GOROVOD_OK, GOROVOD_ERR_HOSTS_UPDATED,
 * GOROVOD_ERR_WORLD_CHANGED (a failure was found and repaired here, or the
 * new world's rank 0 had not finished this step), or GOROVOD_ERR_EXCLUDED. */
int gorovod_commit(void);
/* Acknowledges a world change: this process's next collectives are for the
 * new world (see ELASTICITY). */
int gorovod_reset(void);
/* Asks to leave the job gracefully (what `gorovod run` asks with SIGTERM):
 * a later gorovod_commit returns GOROVOD_ERR_EXCLUDED at the step where the
 * others move on without this process; keep training until then. */
int gorovod_request_leave(void);
/* Reports the samples this process trained on since the last commit, and
 * the steps (commits) the job plans in all, to the job's autoscaling
 * engine. */
int gorovod_record_samples(int64_t n);
int gorovod_set_total_steps(int64_t n);

#ifdef __cplusplus
}
#endif

#endif /* GOROVOD_H */
