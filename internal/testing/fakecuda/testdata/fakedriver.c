// A stand-in for the NVIDIA driver's libcuda.so.1 (see ../doc.go): it
// exports every function collective/cuda loads, with cuda.h's parameter
// order, so that Device and Memory run their whole driver path on a host
// without a GPU. Device 0's "memory" is host memory (malloc) at addresses
// moved by DEV_OFFSET (not canonical on x86-64 or arm64: Go code that took
// them for host memory would fault), and streams run their work at once, so
// an event has passed as soon as it is recorded. Of the kernels, float32's
// sum and scale run (the others fail with CUDA_ERROR_NOT_SUPPORTED); IPC
// works within the process (see cuIpcGetMemHandle).
//
// Built with these defined, it is another driver: FAKE_INIT_RESULT, cuInit's
// result; FAKE_VERSION, the CUDA version cuDriverGetVersion reports
// (1000*major + 10*minor); FAKE_DEVICES, how many devices it has;
// FAKE_LACKS_IPC_OPEN, a driver without cuIpcOpenMemHandle_v2; FAKE_NO_IPC,
// one whose IPC exports fail.
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define DEV_OFFSET (1ULL << 56)
#define MAX_ALLOCS 4096

typedef int res;
typedef unsigned long long dptr;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct { dptr base; size_t size; } allocs[MAX_ALLOCS];

static void *host(dptr p) { return (void *)(uintptr_t)(p - DEV_OFFSET); }

// find returns the allocation holding p, or -1.
static int find(dptr p) {
  for (int i = 0; i < MAX_ALLOCS; i++) {
    if (allocs[i].size > 0 && p >= allocs[i].base && p < allocs[i].base + allocs[i].size) return i;
  }
  return -1;
}

#ifndef FAKE_VERSION
#define FAKE_VERSION 12080
#endif
#ifndef FAKE_DEVICES
#define FAKE_DEVICES 1
#endif

res cuInit(unsigned flags) {
#ifdef FAKE_INIT_RESULT
  (void)flags;
  return FAKE_INIT_RESULT;
#else
  return flags == 0 ? 0 : 1;
#endif
}
res cuDriverGetVersion(int *v) { *v = FAKE_VERSION; return 0; }
res cuDeviceGetCount(int *n) { *n = FAKE_DEVICES; return 0; }
res cuDeviceGet(int *dev, int ordinal) { if (ordinal != 0) return 101; *dev = 0; return 0; }
res cuDeviceGetAttribute(int *v, int attr, int dev) {
  (void)dev;
  *v = attr == 75 ? 9 : 0; // compute capability 9.0
  return 0;
}
res cuDeviceGetName(char *name, int len, int dev) {
  (void)dev;
  strncpy(name, "gorovod fake GPU", (size_t)len);
  name[len - 1] = 0;
  return 0;
}
res cuDeviceGetUuid(unsigned char *u, int dev) { memset(u, 0x42 + dev, 16); return 0; }
static int ctx_storage;
res cuDevicePrimaryCtxRetain(void **ctx, int dev) {
  (void)dev;
  *ctx = &ctx_storage;
  return 0;
}
res cuDevicePrimaryCtxRelease_v2(int dev) { (void)dev; return 0; }
res cuCtxSetCurrent(void *ctx) { return ctx == &ctx_storage ? 0 : 201; } // CUDA_ERROR_INVALID_CONTEXT
res cuCtxSynchronize(void) { return 0; }

static int module_storage;
res cuModuleLoadData(void **mod, const void *image) {
  if (strstr((const char *)image, ".entry gorovod_sum_float32") == NULL) return 218; // CUDA_ERROR_INVALID_PTX
  *mod = &module_storage;
  return 0;
}
// A kernel handle is its name, copied.
res cuModuleGetFunction(void **fn, void *mod, const char *name) {
  if (mod != &module_storage) return 400; // CUDA_ERROR_INVALID_HANDLE
  *fn = strdup(name);
  return 0;
}
res cuModuleUnload(void *mod) { return mod == &module_storage ? 0 : 400; }

res cuStreamCreate(void **s, unsigned flags) { (void)flags; *s = malloc(1); return 0; }
res cuStreamDestroy_v2(void *s) { free(s); return 0; }
res cuStreamSynchronize(void *s) { (void)s; return 0; }
res cuEventCreate(void **e, unsigned flags) { (void)flags; *e = calloc(1, sizeof(int)); return 0; }
res cuEventDestroy_v2(void *e) { free(e); return 0; }
res cuEventRecord(void *e, void *s) {
  (void)s;
  *(int *)e = 1;
  return 0;
}
res cuEventQuery(void *e) { return *(int *)e ? 0 : 600; }
res cuEventSynchronize(void *e) { (void)e; return 0; }

res cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void *s, void **params, void **extra) {
  (void)gy; (void)gz; (void)by; (void)bz; (void)s;
  if (gx == 0 || bx == 0 || shared != 0 || extra != NULL) return 1; // CUDA_ERROR_INVALID_VALUE
  const char *name = fn;
  if (strcmp(name, "gorovod_sum_float32") == 0) {
    float *dst = host(*(dptr *)params[0]), *a = host(*(dptr *)params[1]), *b = host(*(dptr *)params[2]);
    uint64_t n = *(uint64_t *)params[3];
    for (uint64_t i = 0; i < n; i++) dst[i] = a[i] + b[i];
    return 0;
  }
  if (strcmp(name, "gorovod_scale_float32") == 0) {
    float *x = host(*(dptr *)params[0]);
    uint64_t n = *(uint64_t *)params[1];
    double f;
    memcpy(&f, params[2], sizeof f);
    float f32 = (float)f; // in the element's arithmetic, as the kernels and internal/reduce
    for (uint64_t i = 0; i < n; i++) x[i] = x[i] * f32;
    return 0;
  }
  return 801; // CUDA_ERROR_NOT_SUPPORTED
}

res cuMemAlloc_v2(dptr *p, size_t n) {
  if (n == 0) return 1;
  void *h = malloc(n);
  if (h == NULL) return 2; // CUDA_ERROR_OUT_OF_MEMORY
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAX_ALLOCS; i++) {
    if (allocs[i].size == 0) {
      allocs[i].base = (dptr)(uintptr_t)h + DEV_OFFSET;
      allocs[i].size = n;
      *p = allocs[i].base;
      pthread_mutex_unlock(&mu);
      return 0;
    }
  }
  pthread_mutex_unlock(&mu);
  free(h);
  return 2;
}
res cuMemFree_v2(dptr p) {
  pthread_mutex_lock(&mu);
  int i = find(p);
  if (i < 0 || allocs[i].base != p) {
    pthread_mutex_unlock(&mu);
    return 1;
  }
  allocs[i].size = 0;
  pthread_mutex_unlock(&mu);
  free(host(p));
  return 0;
}
// in reports whether [p, p+n) lies inside one allocation.
static int in(dptr p, size_t n) {
  pthread_mutex_lock(&mu);
  int i = find(p);
  int ok = i >= 0 && p + n <= allocs[i].base + allocs[i].size;
  pthread_mutex_unlock(&mu);
  return ok;
}
res cuMemcpyHtoDAsync_v2(dptr dst, const void *src, size_t n, void *s) {
  (void)s;
  if (!in(dst, n)) return 1;
  memcpy(host(dst), src, n);
  return 0;
}
res cuMemcpyDtoHAsync_v2(void *dst, dptr src, size_t n, void *s) {
  (void)s;
  if (!in(src, n)) return 1;
  memcpy(dst, host(src), n);
  return 0;
}
res cuMemcpyDtoDAsync_v2(dptr dst, dptr src, size_t n, void *s) {
  (void)s;
  if (!in(dst, n) || !in(src, n)) return 1;
  memmove(host(dst), host(src), n);
  return 0;
}
res cuMemcpyDtoH_v2(void *dst, dptr src, size_t n) { return cuMemcpyDtoHAsync_v2(dst, src, n, NULL); }
res cuMemsetD32Async(dptr p, unsigned v, size_t n, void *s) {
  (void)s;
  if (!in(p, n * 4)) return 1;
  unsigned *x = host(p);
  for (size_t i = 0; i < n; i++) x[i] = v;
  return 0;
}
res cuMemGetAddressRange_v2(dptr *base, size_t *size, dptr p) {
  pthread_mutex_lock(&mu);
  int i = find(p);
  if (i >= 0) {
    *base = allocs[i].base;
    *size = allocs[i].size;
  }
  pthread_mutex_unlock(&mu);
  return i >= 0 ? 0 : 1;
}
res cuPointerGetAttribute(void *data, int attr, dptr p) {
  if (attr != 9) return 1; // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL only
  if (!in(p, 1)) return 1;
  *(int *)data = 0;
  return 0;
}
res cuGetErrorName(res r, const char **s) {
  switch (r) {
  case 1: *s = "CUDA_ERROR_INVALID_VALUE"; return 0;
  case 2: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return 0;
  case 100: *s = "CUDA_ERROR_NO_DEVICE"; return 0;
  case 801: *s = "CUDA_ERROR_NOT_SUPPORTED"; return 0;
  }
  return 1;
}
// IPC within the one process: a handle carries the allocation's address,
// and opening it gives that address back. Built with -DFAKE_NO_IPC,
// exporting fails, as on a machine where IPC does not work.
res cuIpcGetMemHandle(void *h, dptr base) {
#ifdef FAKE_NO_IPC
  (void)h;
  (void)base;
  return 801;
#endif
  pthread_mutex_lock(&mu);
  int i = find(base);
  int ok = i >= 0 && allocs[i].base == base;
  pthread_mutex_unlock(&mu);
  if (!ok) return 1; // not an allocation's base
  memset(h, 0, 64);
  memcpy(h, "fake", 4);
  memcpy((char *)h + 8, &base, sizeof base);
  return 0;
}
typedef struct { char reserved[64]; } ipc_handle;
#ifndef FAKE_LACKS_IPC_OPEN
res cuIpcOpenMemHandle_v2(dptr *p, ipc_handle h, unsigned flags) {
  dptr base;
  if (memcmp(h.reserved, "fake", 4) != 0 || flags != 1) return 1;
  memcpy(&base, h.reserved + 8, sizeof base);
  if (!in(base, 1)) return 1;
  *p = base;
  return 0;
}
#endif
res cuIpcCloseMemHandle(dptr p) { return in(p, 1) ? 0 : 1; }
