//go:build cuda

package cuda

// The CUDA driver calls of the same-host path (ipc.go), all in this file:
// gorgonia.org/cu v0.9.6 has no IPC, UUID or address-range wrappers that
// work (see pointer.go), so these go to cuda.h directly. Every function
// expects the caller to hold a locked OS thread with the device's context
// current.

/*
#cgo LDFLAGS: -lcuda
#include <cuda.h>
#include <string.h>

static CUresult gorovod_ipc_get(CUdeviceptr base, void *out) {
	CUipcMemHandle h;
	CUresult r = cuIpcGetMemHandle(&h, base);
	if (r == CUDA_SUCCESS) {
		memcpy(out, h.reserved, CU_IPC_HANDLE_SIZE);
	}
	return r;
}

static CUresult gorovod_ipc_open(const void *in, CUdeviceptr *p) {
	CUipcMemHandle h;
	memcpy(h.reserved, in, CU_IPC_HANDLE_SIZE);
	return cuIpcOpenMemHandle(p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
}

static CUresult gorovod_address_range(CUdeviceptr p, CUdeviceptr *base, size_t *size) {
	return cuMemGetAddressRange(base, size, p);
}

static CUresult gorovod_device_uuid(CUdevice dev, void *out) {
	CUuuid u;
	CUresult r = cuDeviceGetUuid(&u, dev);
	if (r == CUDA_SUCCESS) {
		memcpy(out, u.bytes, 16);
	}
	return r;
}
*/
import "C"

import (
	"errors"
	"unsafe"
)

// ipcHandle (ipcplan.go) must be exactly CU_IPC_HANDLE_SIZE bytes: either
// conversion below fails to compile when they differ.
const _ = uint(C.CU_IPC_HANDLE_SIZE-len(ipcHandle{})) + uint(len(ipcHandle{})-C.CU_IPC_HANDLE_SIZE)

// ipcGetHandle exports the allocation that starts at base (cuIpcGetMemHandle
// takes only an allocation's base address).
func ipcGetHandle(base uintptr) (ipcHandle, error) {
	var h ipcHandle
	if r := C.gorovod_ipc_get(C.CUdeviceptr(base), unsafe.Pointer(&h[0])); r != C.CUDA_SUCCESS {
		return h, resultError(r)
	}
	return h, nil
}

// ipcOpenHandle maps another process's exported allocation into this
// context, enabling peer access lazily when it lives on another GPU.
func ipcOpenHandle(h ipcHandle) (uintptr, error) {
	var p C.CUdeviceptr
	if r := C.gorovod_ipc_open(unsafe.Pointer(&h[0]), &p); r != C.CUDA_SUCCESS {
		return 0, resultError(r)
	}
	return uintptr(p), nil
}

// ipcCloseHandle unmaps what ipcOpenHandle mapped.
func ipcCloseHandle(p uintptr) error {
	if r := C.cuIpcCloseMemHandle(C.CUdeviceptr(p)); r != C.CUDA_SUCCESS {
		return resultError(r)
	}
	return nil
}

// addressRange returns the base and size of the allocation holding p.
func addressRange(p uintptr) (base uintptr, size int, err error) {
	var b C.CUdeviceptr
	var s C.size_t
	if r := C.gorovod_address_range(C.CUdeviceptr(p), &b, &s); r != C.CUDA_SUCCESS {
		return 0, 0, resultError(r)
	}
	return uintptr(b), int(s), nil
}

// deviceUUID is the GPU's UUID (dev is the driver's CUdevice), the same in
// every process whatever CUDA_VISIBLE_DEVICES renumbers.
func deviceUUID(dev int) ([16]byte, error) {
	var u [16]byte
	if r := C.gorovod_device_uuid(C.CUdevice(dev), unsafe.Pointer(&u[0])); r != C.CUDA_SUCCESS {
		return u, resultError(r)
	}
	return u, nil
}

// isAlreadyMapped reports whether err is CUDA_ERROR_ALREADY_MAPPED: what
// cuIpcOpenMemHandle returns when this process still maps memory the peer
// has since freed and reused for the allocation being opened.
func isAlreadyMapped(err error) bool {
	var r resultError
	return errors.As(err, &r) && r == resultError(C.CUDA_ERROR_ALREADY_MAPPED)
}
