//go:build cgo

package gpu

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

// NVML's types, as nvml.h lays them out: declared here so that building needs
// no NVIDIA software. Only the functions discovery calls are looked up, at run
// time with dlsym: the library references no NVML symbol, so it loads on a
// host without NVIDIA's libraries even where every symbol is resolved at load
// time (dlopen with RTLD_NOW, as Python's ctypes does).
typedef int gnv_return;
typedef void *gnv_device;
typedef struct {
	unsigned long long total, free, used;
} gnv_memory;
typedef struct {
	char busIdLegacy[16];
	unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
	char busId[32];
} gnv_pci;

enum { GNV_FUNCTION_NOT_FOUND = 13 };

typedef struct {
	void *handle;
	gnv_return (*init)(void);
	gnv_return (*shutdown)(void);
	const char *(*error_string)(gnv_return);
	gnv_return (*count)(unsigned int *);
	gnv_return (*by_index)(unsigned int, gnv_device *);
	gnv_return (*driver_version)(char *, unsigned int);
	gnv_return (*cuda_version)(int *);
	gnv_return (*uuid)(gnv_device, char *, unsigned int);
	gnv_return (*name)(gnv_device, char *, unsigned int);
	gnv_return (*memory)(gnv_device, gnv_memory *);
	gnv_return (*pci)(gnv_device, gnv_pci *);
	gnv_return (*cc)(gnv_device, int *, int *);
	gnv_return (*link_state)(gnv_device, unsigned int, int *);
	gnv_return (*link_remote)(gnv_device, unsigned int, gnv_pci *);
	gnv_return (*ancestor)(gnv_device, gnv_device, int *);
} gnv_lib;

// gnv_open loads the NVML library at path into *lib. It returns NULL, or why
// not (a static or dlerror's string, to be copied at once).
static const char *gnv_open(const char *path, gnv_lib *lib) {
	memset(lib, 0, sizeof *lib);
	lib->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (lib->handle == NULL) {
		const char *e = dlerror();
		return e != NULL ? e : "dlopen failed";
	}
#define GNV_SYM(field, symbol) *(void **)(&lib->field) = dlsym(lib->handle, symbol)
	GNV_SYM(init, "nvmlInit_v2");
	GNV_SYM(shutdown, "nvmlShutdown");
	GNV_SYM(error_string, "nvmlErrorString");
	GNV_SYM(count, "nvmlDeviceGetCount_v2");
	GNV_SYM(by_index, "nvmlDeviceGetHandleByIndex_v2");
	GNV_SYM(driver_version, "nvmlSystemGetDriverVersion");
	GNV_SYM(cuda_version, "nvmlSystemGetCudaDriverVersion");
	GNV_SYM(uuid, "nvmlDeviceGetUUID");
	GNV_SYM(name, "nvmlDeviceGetName");
	GNV_SYM(memory, "nvmlDeviceGetMemoryInfo");
	GNV_SYM(pci, "nvmlDeviceGetPciInfo_v3");
	GNV_SYM(cc, "nvmlDeviceGetCudaComputeCapability");
	GNV_SYM(link_state, "nvmlDeviceGetNvLinkState");
	GNV_SYM(link_remote, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
	GNV_SYM(ancestor, "nvmlDeviceGetTopologyCommonAncestor");
#undef GNV_SYM
	// Without these there is nothing to discover; the others are optional
	// (a missing one reads as NVML_ERROR_FUNCTION_NOT_FOUND).
	if (lib->init == NULL || lib->shutdown == NULL || lib->count == NULL || lib->by_index == NULL ||
	    lib->uuid == NULL || lib->memory == NULL || lib->pci == NULL) {
		dlclose(lib->handle);
		lib->handle = NULL;
		return "the library lacks nvmlInit_v2, nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2, "
		       "nvmlDeviceGetUUID, nvmlDeviceGetMemoryInfo or nvmlDeviceGetPciInfo_v3 (a driver older than NVML 11?)";
	}
	return NULL;
}

static gnv_return gnv_init(gnv_lib *l) { return l->init(); }
static gnv_return gnv_shutdown(gnv_lib *l) { return l->shutdown(); }
static const char *gnv_error_string(gnv_lib *l, gnv_return r) {
	return l->error_string != NULL ? l->error_string(r) : NULL;
}
static gnv_return gnv_count(gnv_lib *l, unsigned int *n) { return l->count(n); }
static gnv_return gnv_by_index(gnv_lib *l, unsigned int i, gnv_device *d) { return l->by_index(i, d); }
static gnv_return gnv_driver_version(gnv_lib *l, char *buf, unsigned int n) {
	return l->driver_version != NULL ? l->driver_version(buf, n) : GNV_FUNCTION_NOT_FOUND;
}
static gnv_return gnv_cuda_version(gnv_lib *l, int *v) {
	return l->cuda_version != NULL ? l->cuda_version(v) : GNV_FUNCTION_NOT_FOUND;
}
static gnv_return gnv_uuid(gnv_lib *l, gnv_device d, char *buf, unsigned int n) { return l->uuid(d, buf, n); }
static gnv_return gnv_name(gnv_lib *l, gnv_device d, char *buf, unsigned int n) {
	return l->name != NULL ? l->name(d, buf, n) : GNV_FUNCTION_NOT_FOUND;
}
static gnv_return gnv_memory_total(gnv_lib *l, gnv_device d, unsigned long long *total) {
	gnv_memory m;
	memset(&m, 0, sizeof m);
	gnv_return r = l->memory(d, &m);
	*total = m.total;
	return r;
}
static gnv_return gnv_pci_bus_id(gnv_lib *l, gnv_device d, char *buf) {
	gnv_pci p;
	memset(&p, 0, sizeof p);
	gnv_return r = l->pci(d, &p);
	memcpy(buf, p.busId, sizeof p.busId);
	return r;
}
static gnv_return gnv_cc(gnv_lib *l, gnv_device d, int *major, int *minor) {
	return l->cc != NULL ? l->cc(d, major, minor) : GNV_FUNCTION_NOT_FOUND;
}
static gnv_return gnv_link_state(gnv_lib *l, gnv_device d, unsigned int link, int *active) {
	return l->link_state != NULL ? l->link_state(d, link, active) : GNV_FUNCTION_NOT_FOUND;
}
static gnv_return gnv_link_remote(gnv_lib *l, gnv_device d, unsigned int link, char *buf) {
	if (l->link_remote == NULL) {
		return GNV_FUNCTION_NOT_FOUND;
	}
	gnv_pci p;
	memset(&p, 0, sizeof p);
	gnv_return r = l->link_remote(d, link, &p);
	memcpy(buf, p.busId, sizeof p.busId);
	return r;
}
static gnv_return gnv_ancestor(gnv_lib *l, gnv_device a, gnv_device b, int *level) {
	return l->ancestor != NULL ? l->ancestor(a, b, level) : GNV_FUNCTION_NOT_FOUND;
}
*/
import "C"

import (
	"context"
	"fmt"
	stdsync "sync"
	"unsafe"
)

// nvmlLibrary is the driver's library, by the name its packages install.
const nvmlLibrary = "libnvidia-ml.so.1"

// dlNVML is NVML loaded with dlopen. Its C state lives in C memory and is
// never freed: the library stays loaded for the life of the process.
type dlNVML struct {
	c *C.gnv_lib
}

var system struct {
	once stdsync.Once
	lib  *dlNVML
	err  error
}

// System discovers the GPUs of this host through the NVML library of the
// installed driver, loaded at the first call. On a host without a driver it
// returns a *NoGPUsError whose reason starts "no NVML:" and says why.
// Concurrent calls are safe (NVML counts its initializations).
func System(ctx context.Context) (Inventory, error) {
	if err := ctx.Err(); err != nil {
		return Inventory{}, err
	}
	system.once.Do(func() { system.lib, system.err = openNVML(nvmlLibrary) })
	if system.err != nil {
		return Inventory{}, system.err
	}
	return discover(ctx, system.lib)
}

// openNVML loads the NVML library at path (a name the dynamic loader looks
// up, or a path). A library that cannot be loaded is a *NoGPUsError.
func openNVML(path string) (*dlNVML, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	lib := (*C.gnv_lib)(C.calloc(1, C.size_t(unsafe.Sizeof(C.gnv_lib{}))))
	if lib == nil {
		return nil, fmt.Errorf("gpu: out of memory loading %s", path)
	}
	if why := C.gnv_open(cpath, lib); why != nil {
		reason := "no NVML: " + C.GoString(why)
		C.free(unsafe.Pointer(lib))
		return nil, &NoGPUsError{Reason: reason}
	}
	return &dlNVML{c: lib}, nil
}

func (l *dlNVML) Init() nvmlReturn     { return nvmlReturn(C.gnv_init(l.c)) }
func (l *dlNVML) Shutdown() nvmlReturn { return nvmlReturn(C.gnv_shutdown(l.c)) }

func (l *dlNVML) ErrorString(r nvmlReturn) string {
	if s := C.gnv_error_string(l.c, C.gnv_return(r)); s != nil {
		return C.GoString(s)
	}
	return fmt.Sprintf("NVML error %d", int(r))
}

func (l *dlNVML) DeviceCount() (int, nvmlReturn) {
	var n C.uint
	r := C.gnv_count(l.c, &n)
	return int(n), nvmlReturn(r)
}

func (l *dlNVML) DeviceByIndex(i int) (nvmlDevice, nvmlReturn) {
	var d C.gnv_device
	if r := nvmlReturn(C.gnv_by_index(l.c, C.uint(i), &d)); r != nvmlSuccess {
		return nil, r
	}
	return &dlDevice{lib: l.c, d: d}, nvmlSuccess
}

// nvmlString reads a string NVML writes into a buffer of n bytes (NVML's
// documented size for it, or more).
func nvmlString(n int, call func(buf *C.char, n C.uint) C.gnv_return) (string, nvmlReturn) {
	buf := (*C.char)(C.calloc(C.size_t(n+1), 1)) // a terminator whatever NVML writes
	if buf == nil {
		return "", nvmlUnknown
	}
	defer C.free(unsafe.Pointer(buf))
	if r := nvmlReturn(call(buf, C.uint(n))); r != nvmlSuccess {
		return "", r
	}
	return C.GoString(buf), nvmlSuccess
}

func (l *dlNVML) DriverVersion() (string, nvmlReturn) {
	return nvmlString(96, func(buf *C.char, n C.uint) C.gnv_return { return C.gnv_driver_version(l.c, buf, n) })
}

func (l *dlNVML) CUDADriverVersion() (int, nvmlReturn) {
	var v C.int
	r := C.gnv_cuda_version(l.c, &v)
	return int(v), nvmlReturn(r)
}

// dlDevice is an nvmlDevice_t of a dlNVML.
type dlDevice struct {
	lib *C.gnv_lib
	d   C.gnv_device
}

func (d *dlDevice) UUID() (string, nvmlReturn) {
	return nvmlString(96, func(buf *C.char, n C.uint) C.gnv_return { return C.gnv_uuid(d.lib, d.d, buf, n) })
}

func (d *dlDevice) Name() (string, nvmlReturn) {
	return nvmlString(96, func(buf *C.char, n C.uint) C.gnv_return { return C.gnv_name(d.lib, d.d, buf, n) })
}

func (d *dlDevice) MemoryTotal() (uint64, nvmlReturn) {
	var total C.ulonglong
	r := C.gnv_memory_total(d.lib, d.d, &total)
	return uint64(total), nvmlReturn(r)
}

func (d *dlDevice) PCIBusID() (string, nvmlReturn) {
	return nvmlString(32, func(buf *C.char, _ C.uint) C.gnv_return { return C.gnv_pci_bus_id(d.lib, d.d, buf) })
}

func (d *dlDevice) ComputeCapability() (int, int, nvmlReturn) {
	var major, minor C.int
	r := C.gnv_cc(d.lib, d.d, &major, &minor)
	return int(major), int(minor), nvmlReturn(r)
}

func (d *dlDevice) NVLinkActive(link int) (bool, nvmlReturn) {
	var state C.int
	r := C.gnv_link_state(d.lib, d.d, C.uint(link), &state)
	return state == 1, nvmlReturn(r) // NVML_FEATURE_ENABLED
}

func (d *dlDevice) NVLinkRemotePCIBusID(link int) (string, nvmlReturn) {
	return nvmlString(32, func(buf *C.char, _ C.uint) C.gnv_return { return C.gnv_link_remote(d.lib, d.d, C.uint(link), buf) })
}

func (d *dlDevice) CommonAncestor(other nvmlDevice) (int, nvmlReturn) {
	o, ok := other.(*dlDevice)
	if !ok || o.lib != d.lib {
		return 0, nvmlInvalidArgument
	}
	var level C.int
	r := C.gnv_ancestor(d.lib, d.d, o.d, &level)
	return int(level), nvmlReturn(r)
}
