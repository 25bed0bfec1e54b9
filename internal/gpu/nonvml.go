//go:build cgo && gorovod_nonvml

package gpu

import (
	"context"
	"errors"
)

// System does not know: this build leaves NVML out (build tag
// gorovod_nonvml). libgorovod.so is built so, because go-nvml leaves the
// NVML functions unresolved until it loads the driver's library, and the
// programs that load a shared library (Python's ctypes, the linker of a C
// program) insist on resolving every symbol at once. The GPU count a worker
// publishes is then unknown rather than wrong.
func System(ctx context.Context) (Inventory, error) {
	if err := ctx.Err(); err != nil {
		return Inventory{}, err
	}
	return Inventory{}, errors.New("gpu: discovery is not built in (gorovod_nonvml: NVML is left out of libgorovod.so)")
}
