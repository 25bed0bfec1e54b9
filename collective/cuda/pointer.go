//go:build cuda

package cuda

/*
#cgo LDFLAGS: -lcuda
#include <cuda.h>

// gorgonia.org/cu v0.9.6's PtrAttribute passes a nil result pointer to
// cuPointerGetAttribute, so the attribute is read here.
static CUresult gorovod_pointer_device(CUdeviceptr p, int *ordinal) {
	return cuPointerGetAttribute(ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p);
}

static const char *gorovod_error_name(CUresult r) {
	const char *s = 0;
	if (cuGetErrorName(r, &s) != CUDA_SUCCESS || s == 0) {
		return "CUDA_ERROR_UNKNOWN";
	}
	return s;
}
*/
import "C"

// resultError is a driver error from the calls made here rather than through
// gorgonia.org/cu.
type resultError C.CUresult

func (r resultError) Error() string {
	return C.GoString(C.gorovod_error_name(C.CUresult(r)))
}

// pointerDevice returns the ordinal of the device whose memory p is; it
// fails for host memory and unknown addresses. The caller holds a locked
// thread with a context current.
func pointerDevice(p uintptr) (int, error) {
	var ordinal C.int
	if r := C.gorovod_pointer_device(C.CUdeviceptr(p), &ordinal); r != C.CUDA_SUCCESS {
		return 0, resultError(r)
	}
	return int(ordinal), nil
}
