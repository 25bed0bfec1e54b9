//go:build cuda

package ptxas

/*
#cgo LDFLAGS: -lnvptxcompiler_static -lstdc++ -lm -lpthread
#cgo linux LDFLAGS: -L/usr/local/cuda/lib64
#cgo linux CFLAGS: -I/usr/local/cuda/include
#include <stdlib.h>
#include <nvPTXCompiler.h>
*/
import "C"

import (
	"context"
	"fmt"
	"strings"
	"unsafe"
)

// Error is a failed assembly, with the assembler's error log.
type Error struct {
	Arch string
	Op   string
	Code int // nvPTXCompileResult
	Log  string
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("ptxas: %s for %s: nvPTXCompileResult %d", e.Op, e.Arch, e.Code)
	if e.Log != "" {
		msg += "\n" + strings.TrimSpace(e.Log)
	}
	return msg
}

// Assemble compiles ptx to machine code for arch (e.g. "sm_80"), as the
// driver's JIT does when it loads the PTX, and returns the ELF image. The
// assembler cannot be interrupted, so ctx is only checked before it starts.
func Assemble(ctx context.Context, ptx, arch string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var h C.nvPTXCompilerHandle
	code := C.CString(ptx)
	defer C.free(unsafe.Pointer(code))
	if r := C.nvPTXCompilerCreate(&h, C.size_t(len(ptx)), code); r != C.NVPTXCOMPILE_SUCCESS {
		return nil, &Error{Arch: arch, Op: "nvPTXCompilerCreate", Code: int(r)}
	}
	defer C.nvPTXCompilerDestroy(&h)
	opt := C.CString("--gpu-name=" + arch)
	defer C.free(unsafe.Pointer(opt))
	opts := (**C.char)(C.malloc(C.size_t(unsafe.Sizeof(opt))))
	defer C.free(unsafe.Pointer(opts))
	*opts = opt
	if r := C.nvPTXCompilerCompile(h, 1, opts); r != C.NVPTXCOMPILE_SUCCESS {
		return nil, &Error{Arch: arch, Op: "nvPTXCompilerCompile", Code: int(r), Log: errorLog(h)}
	}
	var n C.size_t
	if r := C.nvPTXCompilerGetCompiledProgramSize(h, &n); r != C.NVPTXCOMPILE_SUCCESS || n == 0 {
		return nil, &Error{Arch: arch, Op: "nvPTXCompilerGetCompiledProgramSize", Code: int(r)}
	}
	out := make([]byte, int(n))
	if r := C.nvPTXCompilerGetCompiledProgram(h, unsafe.Pointer(&out[0])); r != C.NVPTXCOMPILE_SUCCESS {
		return nil, &Error{Arch: arch, Op: "nvPTXCompilerGetCompiledProgram", Code: int(r)}
	}
	return out, nil
}

func errorLog(h C.nvPTXCompilerHandle) string {
	var n C.size_t
	if C.nvPTXCompilerGetErrorLogSize(h, &n) != C.NVPTXCOMPILE_SUCCESS || n == 0 {
		return ""
	}
	b := make([]byte, int(n)+1)
	if C.nvPTXCompilerGetErrorLog(h, (*C.char)(unsafe.Pointer(&b[0]))) != C.NVPTXCOMPILE_SUCCESS {
		return ""
	}
	return strings.TrimRight(string(b), "\x00")
}
