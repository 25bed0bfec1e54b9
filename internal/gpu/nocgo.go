//go:build !cgo

package gpu

import "context"

// System reports no GPUs: discovery loads NVML with dlopen, which needs cgo, and this
// binary was built without it (CGO_ENABLED=0).
func System(ctx context.Context) (Inventory, error) {
	if err := ctx.Err(); err != nil {
		return Inventory{}, err
	}
	return Inventory{}, &NoGPUsError{Reason: "gorovod was built without cgo, which GPU discovery (NVML) needs"}
}
