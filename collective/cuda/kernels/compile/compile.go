//go:build cuda

package compile

/*
#cgo LDFLAGS: -lnvrtc
#include <nvrtc.h>
*/
import "C"

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"unsafe"

	"gorgonia.org/cu/nvrtc"

	"github.com/gorovod/gorovod/collective/cuda/kernels"
)

// Result is one compile of kernels.Source.
type Result struct {
	Arch  string // the --gpu-architecture it was compiled for
	PTX   string // NVRTC's PTX (for sm_XX targets, the PTX it lowered to SASS)
	CUBIN []byte // machine code (an ELF image) for sm_XX targets; nil for compute_XX
	Log   string // NVRTC's log: warnings; empty on a clean compile
}

// Error is a failed compile: NVRTC's error and its log, which holds the
// compiler's messages.
type Error struct {
	Arch string
	Err  error
	Log  string
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("nvrtc: compiling kernels.cu for %s: %v", e.Arch, e.Err)
	if e.Log != "" {
		msg += "\n" + strings.TrimSpace(e.Log)
	}
	return msg
}

func (e *Error) Unwrap() error { return e.Err }

// Compile compiles kernels.Source with kernels.Options() for arch, a virtual
// architecture (compute_70: PTX only) or a real one (sm_80: NVRTC also runs
// the PTX assembler, so the kernels are checked down to machine code). NVRTC
// cannot be interrupted, so ctx is only checked before it starts; a compile
// of the whole source takes about a second.
func Compile(ctx context.Context, arch string) (Result, error) {
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	prog, err := nvrtc.CreateProgram(kernels.Source, "kernels.cu")
	if err != nil {
		return Result{}, &Error{Arch: arch, Err: err}
	}
	defer prog.Destroy()
	opts := append(kernels.Options(), "--gpu-architecture="+arch)
	cerr := prog.Compile(opts...)
	log, _ := prog.GetLog()
	log = strings.TrimRight(log, "\x00\n ")
	if cerr != nil {
		return Result{}, &Error{Arch: arch, Err: cerr, Log: log}
	}
	ptx, err := prog.GetPTX()
	if err != nil {
		return Result{}, &Error{Arch: arch, Err: fmt.Errorf("reading PTX: %w", err), Log: log}
	}
	res := Result{Arch: arch, PTX: strings.TrimRight(ptx, "\x00"), Log: log}
	if strings.HasPrefix(arch, "sm_") {
		if res.CUBIN, err = cubin(&prog); err != nil {
			return Result{}, &Error{Arch: arch, Err: err, Log: log}
		}
	}
	return res, nil
}

// cubin reads the machine code of a program compiled for a real architecture.
// gorgonia.org/cu/nvrtc (v0.9.6) predates nvrtcGetCUBIN and keeps the
// program handle unexported; its Program is a struct holding only that
// handle, so the handle is read through unsafe, after checking the sizes agree.
func cubin(p *nvrtc.Program) ([]byte, error) {
	if unsafe.Sizeof(*p) != unsafe.Sizeof(C.nvrtcProgram(nil)) {
		return nil, fmt.Errorf("gorgonia.org/cu/nvrtc.Program is %d bytes, not one program handle; update compile.cubin", unsafe.Sizeof(*p))
	}
	h := *(*C.nvrtcProgram)(unsafe.Pointer(p))
	var n C.size_t
	if r := C.nvrtcGetCUBINSize(h, &n); r != C.NVRTC_SUCCESS {
		return nil, fmt.Errorf("nvrtcGetCUBINSize: %s", C.GoString(C.nvrtcGetErrorString(r)))
	}
	if n == 0 {
		return nil, fmt.Errorf("nvrtcGetCUBINSize: NVRTC produced no machine code")
	}
	b := make([]byte, int(n))
	if r := C.nvrtcGetCUBIN(h, (*C.char)(unsafe.Pointer(&b[0]))); r != C.NVRTC_SUCCESS {
		return nil, fmt.Errorf("nvrtcGetCUBIN: %s", C.GoString(C.nvrtcGetErrorString(r)))
	}
	return b, nil
}

// Version is the NVRTC library's version as "major.minor".
func Version() (string, error) {
	major, minor, err := nvrtc.Version()
	if err != nil {
		return "", fmt.Errorf("nvrtc: version: %w", err)
	}
	return strconv.Itoa(major) + "." + strconv.Itoa(minor), nil
}

// SupportedArchs lists the real architectures this NVRTC can compile for, as
// numbers (70 for sm_70). gorgonia.org/cu/nvrtc does not wrap
// nvrtcGetSupportedArchs (CUDA 11.2+), hence the direct call.
func SupportedArchs() ([]int, error) {
	var n C.int
	if r := C.nvrtcGetNumSupportedArchs(&n); r != C.NVRTC_SUCCESS {
		return nil, fmt.Errorf("nvrtc: nvrtcGetNumSupportedArchs: %s", C.GoString(C.nvrtcGetErrorString(r)))
	}
	if n <= 0 {
		return nil, nil
	}
	archs := make([]C.int, int(n))
	if r := C.nvrtcGetSupportedArchs(&archs[0]); r != C.NVRTC_SUCCESS {
		return nil, fmt.Errorf("nvrtc: nvrtcGetSupportedArchs: %s", C.GoString(C.nvrtcGetErrorString(r)))
	}
	out := make([]int, len(archs))
	for i, a := range archs {
		out[i] = int(a)
	}
	return out, nil
}
