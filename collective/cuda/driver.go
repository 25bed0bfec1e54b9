package cuda

// The CUDA driver API, loaded at run time. The library that users build (and
// pip installs) must load on a host without NVIDIA software, where CPU tensors
// still work: so nothing here links libcuda. NewDevice dlopens the driver's
// libcuda.so.1 and resolves the functions below by the names the driver
// exports (cuda.h maps several API names to versioned symbols, the _v2 ones;
// the names are those of CUDA 11.8's cuda.h without per-thread default
// streams). The types are declared here from their ABI (CUresult, CUdevice
// and the enum values are ints, CUdeviceptr a 64-bit integer, every handle a
// pointer), so building needs no CUDA header either.
//
// Every function expects the caller to hold a locked OS thread with the
// device's context current, except the loader's own calls (init, version,
// deviceCount, device, attribute, deviceName, deviceUUID, primaryCtxRetain).

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int cu_result;
typedef unsigned long long cu_ptr;
typedef void *cu_handle;

// The symbols, in the order of the table; the driver must export each.
enum {
	CU_INIT, CU_DRIVER_GET_VERSION, CU_DEVICE_GET_COUNT, CU_DEVICE_GET, CU_DEVICE_GET_ATTRIBUTE,
	CU_DEVICE_GET_NAME, CU_DEVICE_GET_UUID, CU_PRIMARY_CTX_RETAIN, CU_PRIMARY_CTX_RELEASE,
	CU_CTX_SET_CURRENT, CU_CTX_SYNCHRONIZE, CU_MODULE_LOAD_DATA, CU_MODULE_GET_FUNCTION,
	CU_MODULE_UNLOAD, CU_STREAM_CREATE, CU_STREAM_DESTROY, CU_STREAM_SYNCHRONIZE, CU_EVENT_CREATE,
	CU_EVENT_DESTROY, CU_EVENT_RECORD, CU_EVENT_QUERY, CU_EVENT_SYNCHRONIZE, CU_LAUNCH_KERNEL,
	CU_MEM_ALLOC, CU_MEM_FREE, CU_MEMCPY_HTOD_ASYNC, CU_MEMCPY_DTOH_ASYNC, CU_MEMCPY_DTOD_ASYNC,
	CU_MEMCPY_DTOH, CU_MEMSET_D32_ASYNC, CU_MEM_GET_ADDRESS_RANGE, CU_POINTER_GET_ATTRIBUTE,
	CU_GET_ERROR_NAME, CU_IPC_GET_MEM_HANDLE, CU_IPC_OPEN_MEM_HANDLE, CU_IPC_CLOSE_MEM_HANDLE,
	CU_SYMBOLS
};

static const char *const cu_names[CU_SYMBOLS] = {
	"cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetAttribute",
	"cuDeviceGetName", "cuDeviceGetUuid", "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease_v2",
	"cuCtxSetCurrent", "cuCtxSynchronize", "cuModuleLoadData", "cuModuleGetFunction",
	"cuModuleUnload", "cuStreamCreate", "cuStreamDestroy_v2", "cuStreamSynchronize", "cuEventCreate",
	"cuEventDestroy_v2", "cuEventRecord", "cuEventQuery", "cuEventSynchronize", "cuLaunchKernel",
	"cuMemAlloc_v2", "cuMemFree_v2", "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoDAsync_v2",
	"cuMemcpyDtoH_v2", "cuMemsetD32Async", "cuMemGetAddressRange_v2", "cuPointerGetAttribute",
	"cuGetErrorName", "cuIpcGetMemHandle", "cuIpcOpenMemHandle_v2", "cuIpcCloseMemHandle",
};

static const char *cu_symbol_name(int i) { return cu_names[i]; }

// The table: the library's handle, then one function per symbol.
typedef struct { void *lib; void *fn[CU_SYMBOLS]; } cu_table;

// cu_open loads path into a new table. On failure it returns NULL and sets
// *err (malloc'd) to dlerror's text, or *missing to the index of the first
// symbol the library lacks.
static cu_table *cu_open(const char *path, char **err, int *missing) {
	*err = NULL;
	*missing = -1;
	// RTLD_NODELETE: the driver is never unloaded once loaded (its threads
	// outlive a Device; the CUDA runtime may share it), only our handle goes.
	void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
	if (lib == NULL) {
		const char *e = dlerror();
		*err = strdup(e != NULL ? e : "dlopen failed");
		return NULL;
	}
	cu_table *t = calloc(1, sizeof(cu_table));
	if (t == NULL) {
		dlclose(lib);
		*err = strdup("out of memory");
		return NULL;
	}
	t->lib = lib;
	for (int i = 0; i < CU_SYMBOLS; i++) {
		t->fn[i] = dlsym(lib, cu_names[i]);
		if (t->fn[i] == NULL) {
			*missing = i;
			dlclose(lib);
			free(t);
			return NULL;
		}
	}
	return t;
}

static void cu_close(cu_table *t) {
	dlclose(t->lib);
	free(t);
}

#define CU_FN(t, i, type) ((type)(t)->fn[i])

static cu_result cu_init(cu_table *t) { return CU_FN(t, CU_INIT, cu_result (*)(unsigned))(0); }
static cu_result cu_driver_version(cu_table *t, int *v) { return CU_FN(t, CU_DRIVER_GET_VERSION, cu_result (*)(int *))(v); }
static cu_result cu_device_count(cu_table *t, int *n) { return CU_FN(t, CU_DEVICE_GET_COUNT, cu_result (*)(int *))(n); }
static cu_result cu_device_get(cu_table *t, int *dev, int ordinal) {
	return CU_FN(t, CU_DEVICE_GET, cu_result (*)(int *, int))(dev, ordinal);
}
static cu_result cu_device_attribute(cu_table *t, int *v, int attr, int dev) {
	return CU_FN(t, CU_DEVICE_GET_ATTRIBUTE, cu_result (*)(int *, int, int))(v, attr, dev);
}
static cu_result cu_device_name(cu_table *t, char *name, int len, int dev) {
	return CU_FN(t, CU_DEVICE_GET_NAME, cu_result (*)(char *, int, int))(name, len, dev);
}
// CUuuid is a struct of 16 chars.
static cu_result cu_device_uuid(cu_table *t, void *out, int dev) {
	return CU_FN(t, CU_DEVICE_GET_UUID, cu_result (*)(void *, int))(out, dev);
}
static cu_result cu_primary_retain(cu_table *t, uintptr_t *ctx, int dev) {
	cu_handle c = NULL;
	cu_result r = CU_FN(t, CU_PRIMARY_CTX_RETAIN, cu_result (*)(cu_handle *, int))(&c, dev);
	*ctx = (uintptr_t)c;
	return r;
}
static cu_result cu_primary_release(cu_table *t, int dev) { return CU_FN(t, CU_PRIMARY_CTX_RELEASE, cu_result (*)(int))(dev); }
static cu_result cu_ctx_set_current(cu_table *t, uintptr_t ctx) {
	return CU_FN(t, CU_CTX_SET_CURRENT, cu_result (*)(cu_handle))((cu_handle)ctx);
}
static cu_result cu_ctx_synchronize(cu_table *t) { return CU_FN(t, CU_CTX_SYNCHRONIZE, cu_result (*)(void))(); }
static cu_result cu_module_load_data(cu_table *t, uintptr_t *mod, const char *image) {
	cu_handle m = NULL;
	cu_result r = CU_FN(t, CU_MODULE_LOAD_DATA, cu_result (*)(cu_handle *, const void *))(&m, image);
	*mod = (uintptr_t)m;
	return r;
}
static cu_result cu_module_function(cu_table *t, uintptr_t *fn, uintptr_t mod, const char *name) {
	cu_handle f = NULL;
	cu_result r = CU_FN(t, CU_MODULE_GET_FUNCTION, cu_result (*)(cu_handle *, cu_handle, const char *))(&f, (cu_handle)mod, name);
	*fn = (uintptr_t)f;
	return r;
}
static cu_result cu_module_unload(cu_table *t, uintptr_t mod) {
	return CU_FN(t, CU_MODULE_UNLOAD, cu_result (*)(cu_handle))((cu_handle)mod);
}
static cu_result cu_stream_create(cu_table *t, uintptr_t *s, unsigned flags) {
	cu_handle h = NULL;
	cu_result r = CU_FN(t, CU_STREAM_CREATE, cu_result (*)(cu_handle *, unsigned))(&h, flags);
	*s = (uintptr_t)h;
	return r;
}
static cu_result cu_stream_destroy(cu_table *t, uintptr_t s) {
	return CU_FN(t, CU_STREAM_DESTROY, cu_result (*)(cu_handle))((cu_handle)s);
}
static cu_result cu_stream_synchronize(cu_table *t, uintptr_t s) {
	return CU_FN(t, CU_STREAM_SYNCHRONIZE, cu_result (*)(cu_handle))((cu_handle)s);
}
static cu_result cu_event_create(cu_table *t, uintptr_t *e, unsigned flags) {
	cu_handle h = NULL;
	cu_result r = CU_FN(t, CU_EVENT_CREATE, cu_result (*)(cu_handle *, unsigned))(&h, flags);
	*e = (uintptr_t)h;
	return r;
}
static cu_result cu_event_destroy(cu_table *t, uintptr_t e) {
	return CU_FN(t, CU_EVENT_DESTROY, cu_result (*)(cu_handle))((cu_handle)e);
}
static cu_result cu_event_record(cu_table *t, uintptr_t e, uintptr_t s) {
	return CU_FN(t, CU_EVENT_RECORD, cu_result (*)(cu_handle, cu_handle))((cu_handle)e, (cu_handle)s);
}
static cu_result cu_event_query(cu_table *t, uintptr_t e) {
	return CU_FN(t, CU_EVENT_QUERY, cu_result (*)(cu_handle))((cu_handle)e);
}
static cu_result cu_event_synchronize(cu_table *t, uintptr_t e) {
	return CU_FN(t, CU_EVENT_SYNCHRONIZE, cu_result (*)(cu_handle))((cu_handle)e);
}
// Every kernel parameter is 8 bytes wide (kernels.cu); the driver copies
// them at the launch, so the array may live on this stack.
static cu_result cu_launch(cu_table *t, uintptr_t fn, unsigned grid, unsigned block, uintptr_t s,
                           const uint64_t *params, int n) {
	uint64_t v[8];
	void *args[8];
	if (n > 8) {
		return 1; // CUDA_ERROR_INVALID_VALUE
	}
	for (int i = 0; i < n; i++) {
		v[i] = params[i];
		args[i] = &v[i];
	}
	return CU_FN(t, CU_LAUNCH_KERNEL, cu_result (*)(cu_handle, unsigned, unsigned, unsigned, unsigned, unsigned,
	                                                unsigned, unsigned, cu_handle, void **, void **))(
		(cu_handle)fn, grid, 1, 1, block, 1, 1, 0, (cu_handle)s, args, NULL);
}
static cu_result cu_mem_alloc(cu_table *t, cu_ptr *p, size_t n) {
	return CU_FN(t, CU_MEM_ALLOC, cu_result (*)(cu_ptr *, size_t))(p, n);
}
static cu_result cu_mem_free(cu_table *t, cu_ptr p) { return CU_FN(t, CU_MEM_FREE, cu_result (*)(cu_ptr))(p); }
static cu_result cu_memcpy_htod_async(cu_table *t, cu_ptr dst, const void *src, size_t n, uintptr_t s) {
	return CU_FN(t, CU_MEMCPY_HTOD_ASYNC, cu_result (*)(cu_ptr, const void *, size_t, cu_handle))(dst, src, n, (cu_handle)s);
}
static cu_result cu_memcpy_dtoh_async(cu_table *t, void *dst, cu_ptr src, size_t n, uintptr_t s) {
	return CU_FN(t, CU_MEMCPY_DTOH_ASYNC, cu_result (*)(void *, cu_ptr, size_t, cu_handle))(dst, src, n, (cu_handle)s);
}
static cu_result cu_memcpy_dtod_async(cu_table *t, cu_ptr dst, cu_ptr src, size_t n, uintptr_t s) {
	return CU_FN(t, CU_MEMCPY_DTOD_ASYNC, cu_result (*)(cu_ptr, cu_ptr, size_t, cu_handle))(dst, src, n, (cu_handle)s);
}
static cu_result cu_memcpy_dtoh(cu_table *t, void *dst, cu_ptr src, size_t n) {
	return CU_FN(t, CU_MEMCPY_DTOH, cu_result (*)(void *, cu_ptr, size_t))(dst, src, n);
}
static cu_result cu_memset_d32_async(cu_table *t, cu_ptr p, unsigned v, size_t n, uintptr_t s) {
	return CU_FN(t, CU_MEMSET_D32_ASYNC, cu_result (*)(cu_ptr, unsigned, size_t, cu_handle))(p, v, n, (cu_handle)s);
}
static cu_result cu_address_range(cu_table *t, cu_ptr p, cu_ptr *base, size_t *size) {
	return CU_FN(t, CU_MEM_GET_ADDRESS_RANGE, cu_result (*)(cu_ptr *, size_t *, cu_ptr))(base, size, p);
}
// CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL is 9.
static cu_result cu_pointer_device(cu_table *t, cu_ptr p, int *ordinal) {
	return CU_FN(t, CU_POINTER_GET_ATTRIBUTE, cu_result (*)(void *, int, cu_ptr))(ordinal, 9, p);
}
static const char *cu_error_name(cu_table *t, cu_result r) {
	const char *s = NULL;
	if (CU_FN(t, CU_GET_ERROR_NAME, cu_result (*)(cu_result, const char **))(r, &s) != 0) {
		return NULL;
	}
	return s;
}
// CUipcMemHandle is a struct of CU_IPC_HANDLE_SIZE (64) chars, passed by value.
typedef struct { char reserved[64]; } cu_ipc_handle;
static cu_result cu_ipc_get(cu_table *t, void *out, cu_ptr base) {
	cu_ipc_handle h;
	cu_result r = CU_FN(t, CU_IPC_GET_MEM_HANDLE, cu_result (*)(cu_ipc_handle *, cu_ptr))(&h, base);
	if (r == 0) {
		memcpy(out, h.reserved, sizeof h.reserved);
	}
	return r;
}
// CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS is 1.
static cu_result cu_ipc_open(cu_table *t, cu_ptr *p, const void *in) {
	cu_ipc_handle h;
	memcpy(h.reserved, in, sizeof h.reserved);
	return CU_FN(t, CU_IPC_OPEN_MEM_HANDLE, cu_result (*)(cu_ptr *, cu_ipc_handle, unsigned))(p, h, 1);
}
static cu_result cu_ipc_close(cu_table *t, cu_ptr p) { return CU_FN(t, CU_IPC_CLOSE_MEM_HANDLE, cu_result (*)(cu_ptr))(p); }
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// Driver values this package passes (cuda.h's enums; the ABI keeps them).
const (
	attrComputeCapabilityMajor = 75 // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
	attrComputeCapabilityMinor = 76 // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
	streamNonBlocking          = 1  // CU_STREAM_NON_BLOCKING
	eventBlockingSync          = 1  // CU_EVENT_BLOCKING_SYNC
	eventDisableTiming         = 2  // CU_EVENT_DISABLE_TIMING
	ipcHandleSize              = 64 // CU_IPC_HANDLE_SIZE

	resultNotReady      = 600 // CUDA_ERROR_NOT_READY
	resultAlreadyMapped = 208 // CUDA_ERROR_ALREADY_MAPPED
	resultStubLibrary   = 34  // CUDA_ERROR_STUB_LIBRARY
	resultNoDevice      = 100 // CUDA_ERROR_NO_DEVICE
	resultInsufficient  = 35  // CUDA_ERROR_INSUFFICIENT_DRIVER
)

// ipcHandle (ipcplan.go) must be exactly CU_IPC_HANDLE_SIZE bytes: either
// conversion below fails to compile when they differ.
const _ = uint(ipcHandleSize-len(ipcHandle{})) + uint(len(ipcHandle{})-ipcHandleSize)

// Result is a CUDA driver call's result other than CUDA_SUCCESS: the
// driver's code and its name (cuGetErrorName's, e.g. "CUDA_ERROR_OUT_OF_MEMORY").
type Result struct {
	Code int
	Name string
}

func (r Result) Error() string {
	if r.Name == "" {
		return fmt.Sprintf("CUDA error %d", r.Code)
	}
	return fmt.Sprintf("%s (CUDA error %d)", r.Name, r.Code)
}

// driver is one loading of the CUDA driver library: its function table.
type driver struct {
	t *C.cu_table
}

// loadDriver dlopens library (a name the dynamic loader searches for, or a
// path) and resolves every function gorovod calls.
func loadDriver(library string) (*driver, error) {
	path := C.CString(library)
	defer C.free(unsafe.Pointer(path))
	var cerr *C.char
	var missing C.int
	t := C.cu_open(path, &cerr, &missing)
	if t == nil {
		if cerr != nil {
			defer C.free(unsafe.Pointer(cerr))
			return nil, &DriverLoadError{Library: library, Reason: C.GoString(cerr)}
		}
		return nil, &DriverLoadError{Library: library, Missing: C.GoString(C.cu_symbol_name(missing))}
	}
	return &driver{t: t}, nil
}

// close drops this loading's handle and table; the library stays mapped
// (RTLD_NODELETE).
func (d *driver) close() {
	if d.t != nil {
		C.cu_close(d.t)
		d.t = nil
	}
}

// check is nil for CUDA_SUCCESS and the driver's Result otherwise.
func (d *driver) check(r C.cu_result) error {
	if r == 0 {
		return nil
	}
	res := Result{Code: int(r)}
	if s := C.cu_error_name(d.t, r); s != nil {
		res.Name = C.GoString(s)
	}
	return res
}

func (d *driver) init() error { return d.check(C.cu_init(d.t)) }

// version is the driver's CUDA version, 1000*major + 10*minor.
func (d *driver) version() (int, error) {
	var v C.int
	err := d.check(C.cu_driver_version(d.t, &v))
	return int(v), err
}

func (d *driver) deviceCount() (int, error) {
	var n C.int
	err := d.check(C.cu_device_count(d.t, &n))
	return int(n), err
}

func (d *driver) device(ordinal int) (int, error) {
	var dev C.int
	err := d.check(C.cu_device_get(d.t, &dev, C.int(ordinal)))
	return int(dev), err
}

func (d *driver) attribute(attr, dev int) (int, error) {
	var v C.int
	err := d.check(C.cu_device_attribute(d.t, &v, C.int(attr), C.int(dev)))
	return int(v), err
}

func (d *driver) deviceName(dev int) (string, error) {
	var buf [256]C.char
	if err := d.check(C.cu_device_name(d.t, &buf[0], C.int(len(buf)), C.int(dev))); err != nil {
		return "", err
	}
	return C.GoString(&buf[0]), nil
}

// deviceUUID is the GPU's UUID, the same in every process whatever
// CUDA_VISIBLE_DEVICES renumbers.
func (d *driver) deviceUUID(dev int) ([16]byte, error) {
	var u [16]byte
	err := d.check(C.cu_device_uuid(d.t, unsafe.Pointer(&u[0]), C.int(dev)))
	return u, err
}

func (d *driver) primaryCtxRetain(dev int) (uintptr, error) {
	var ctx C.uintptr_t
	err := d.check(C.cu_primary_retain(d.t, &ctx, C.int(dev)))
	return uintptr(ctx), err
}

func (d *driver) primaryCtxRelease(dev int) error {
	return d.check(C.cu_primary_release(d.t, C.int(dev)))
}

func (d *driver) ctxSetCurrent(ctx uintptr) error {
	return d.check(C.cu_ctx_set_current(d.t, C.uintptr_t(ctx)))
}

func (d *driver) ctxSynchronize() error { return d.check(C.cu_ctx_synchronize(d.t)) }

// moduleLoadData loads a module from PTX text (JIT-compiled by the driver).
func (d *driver) moduleLoadData(ptx string) (uintptr, error) {
	image := C.CString(ptx)
	defer C.free(unsafe.Pointer(image))
	var mod C.uintptr_t
	err := d.check(C.cu_module_load_data(d.t, &mod, image))
	return uintptr(mod), err
}

func (d *driver) moduleFunction(mod uintptr, name string) (uintptr, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var fn C.uintptr_t
	err := d.check(C.cu_module_function(d.t, &fn, C.uintptr_t(mod), cname))
	return uintptr(fn), err
}

func (d *driver) moduleUnload(mod uintptr) error {
	return d.check(C.cu_module_unload(d.t, C.uintptr_t(mod)))
}

func (d *driver) streamCreate(flags uint) (uintptr, error) {
	var s C.uintptr_t
	err := d.check(C.cu_stream_create(d.t, &s, C.unsigned(flags)))
	return uintptr(s), err
}

func (d *driver) streamDestroy(s uintptr) error {
	return d.check(C.cu_stream_destroy(d.t, C.uintptr_t(s)))
}

func (d *driver) streamSynchronize(s uintptr) error {
	return d.check(C.cu_stream_synchronize(d.t, C.uintptr_t(s)))
}

func (d *driver) eventCreate(flags uint) (uintptr, error) {
	var e C.uintptr_t
	err := d.check(C.cu_event_create(d.t, &e, C.unsigned(flags)))
	return uintptr(e), err
}

func (d *driver) eventDestroy(e uintptr) error {
	return d.check(C.cu_event_destroy(d.t, C.uintptr_t(e)))
}

func (d *driver) eventRecord(e, s uintptr) error {
	return d.check(C.cu_event_record(d.t, C.uintptr_t(e), C.uintptr_t(s)))
}

// eventQuery is nil once the GPU has passed e, a Result with code
// resultNotReady before.
func (d *driver) eventQuery(e uintptr) error {
	return d.check(C.cu_event_query(d.t, C.uintptr_t(e)))
}

func (d *driver) eventSynchronize(e uintptr) error {
	return d.check(C.cu_event_synchronize(d.t, C.uintptr_t(e)))
}

// launch queues fn on s with a one-dimensional grid and block and up to 8
// parameters of 8 bytes each.
func (d *driver) launch(fn uintptr, grid, block int, s uintptr, params []uint64) error {
	var p *C.uint64_t
	if len(params) > 0 {
		p = (*C.uint64_t)(unsafe.Pointer(&params[0]))
	}
	return d.check(C.cu_launch(d.t, C.uintptr_t(fn), C.unsigned(grid), C.unsigned(block), C.uintptr_t(s), p, C.int(len(params))))
}

func (d *driver) memAlloc(n int) (uint64, error) {
	var p C.cu_ptr
	err := d.check(C.cu_mem_alloc(d.t, &p, C.size_t(n)))
	return uint64(p), err
}

func (d *driver) memFree(p uint64) error { return d.check(C.cu_mem_free(d.t, C.cu_ptr(p))) }

// The copies from and to host memory take Go memory: the driver stages
// pageable memory through its own pinned buffer, so a copy to the device
// returns once the bytes are out of src and one from the device once they
// are in dst, and the driver never holds the Go pointer after the call.

func (d *driver) memcpyHtoDAsync(dst uint64, src []byte, s uintptr) error {
	return d.check(C.cu_memcpy_htod_async(d.t, C.cu_ptr(dst), unsafe.Pointer(&src[0]), C.size_t(len(src)), C.uintptr_t(s)))
}

func (d *driver) memcpyDtoHAsync(dst []byte, src uint64, s uintptr) error {
	return d.check(C.cu_memcpy_dtoh_async(d.t, unsafe.Pointer(&dst[0]), C.cu_ptr(src), C.size_t(len(dst)), C.uintptr_t(s)))
}

func (d *driver) memcpyDtoDAsync(dst, src uint64, n int, s uintptr) error {
	return d.check(C.cu_memcpy_dtod_async(d.t, C.cu_ptr(dst), C.cu_ptr(src), C.size_t(n), C.uintptr_t(s)))
}

func (d *driver) memcpyDtoH(dst []byte, src uint64) error {
	return d.check(C.cu_memcpy_dtoh(d.t, unsafe.Pointer(&dst[0]), C.cu_ptr(src), C.size_t(len(dst))))
}

// memsetD32Async sets n 32-bit words at p to v.
func (d *driver) memsetD32Async(p uint64, v uint32, n int, s uintptr) error {
	return d.check(C.cu_memset_d32_async(d.t, C.cu_ptr(p), C.unsigned(v), C.size_t(n), C.uintptr_t(s)))
}

// addressRange returns the base and size of the allocation holding p.
func (d *driver) addressRange(p uint64) (base uint64, size int, err error) {
	var b C.cu_ptr
	var n C.size_t
	err = d.check(C.cu_address_range(d.t, C.cu_ptr(p), &b, &n))
	return uint64(b), int(n), err
}

// pointerDevice returns the ordinal of the device whose memory p is; it
// fails for host memory and unknown addresses.
func (d *driver) pointerDevice(p uint64) (int, error) {
	var ordinal C.int
	err := d.check(C.cu_pointer_device(d.t, C.cu_ptr(p), &ordinal))
	return int(ordinal), err
}

// ipcGetHandle exports the allocation that starts at base (cuIpcGetMemHandle
// takes only an allocation's base address).
func (d *driver) ipcGetHandle(base uintptr) (ipcHandle, error) {
	var h ipcHandle
	err := d.check(C.cu_ipc_get(d.t, unsafe.Pointer(&h[0]), C.cu_ptr(base)))
	return h, err
}

// ipcOpenHandle maps another process's exported allocation into this
// context, enabling peer access lazily when it lives on another GPU.
func (d *driver) ipcOpenHandle(h ipcHandle) (uintptr, error) {
	var p C.cu_ptr
	if err := d.check(C.cu_ipc_open(d.t, &p, unsafe.Pointer(&h[0]))); err != nil {
		return 0, err
	}
	return uintptr(p), nil
}

// ipcCloseHandle unmaps what ipcOpenHandle mapped.
func (d *driver) ipcCloseHandle(p uintptr) error {
	return d.check(C.cu_ipc_close(d.t, C.cu_ptr(p)))
}
