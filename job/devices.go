package job

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/gorovod/gorovod/internal/gpu"
)

// gpuDiscoveryTimeout bounds the look for the host's GPUs (NVML, or
// nvidia-smi) at the first launch.
const gpuDiscoveryTimeout = 5 * time.Second

// gpuInventory discovers this host's GPUs; gpu.System unless a test gives
// another.
type gpuInventory func(context.Context) (gpu.Inventory, error)

// assignGPUs returns this host's GPUs as a pool that gives each worker
// process one of its own while it runs, in ring order, when the host has
// enough for the np workers started at once; with none (or no NVIDIA driver)
// the workers run on the CPU and the pool is nil. discover nil is
// gpu.System.
func assignGPUs(ctx context.Context, discover gpuInventory, np int, notice func(string)) *devicePool {
	if discover == nil {
		discover = gpu.System
	}
	ctx, cancel := context.WithTimeout(ctx, gpuDiscoveryTimeout)
	defer cancel()
	inv, err := discover(ctx)
	if err != nil {
		if !gpu.IsNoGPUs(err) {
			notice(fmt.Sprintf("GPU discovery: %v", err))
		}
		return nil
	}
	if _, err := gpu.AssignDevices(inv.GPUs, np); err != nil {
		notice(fmt.Sprintf("%v; workers choose their GPUs themselves", err))
		return nil
	}
	order, _ := gpu.AssignDevices(inv.GPUs, len(inv.GPUs))
	notice("one GPU per worker, in this order: " + strings.Join(order, ", "))
	return newDevicePool(order)
}

// devicePool tracks which worker process holds which GPU, so that workers
// added while the job runs get a free one and a departed worker's GPU is
// handed out again.
type devicePool struct {
	mu    sync.Mutex
	order []string
	owner map[string]int // device → launch index
}

func newDevicePool(order []string) *devicePool {
	return &devicePool{order: order, owner: map[string]int{}}
}

// take gives worker i the first free device in ring order (nil pool: none).
func (p *devicePool) take(i int) (string, bool) {
	if p == nil {
		return "", false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, d := range p.order {
		if _, used := p.owner[d]; !used {
			p.owner[d] = i
			return d, true
		}
	}
	return "", false
}

// release frees worker i's device.
func (p *devicePool) release(i int) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for d, owner := range p.owner {
		if owner == i {
			delete(p.owner, d)
		}
	}
}
