//go:build !gorovod_cudastandin

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/gorovod/gorovod/bindings/internal/engine"
	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/cuda"
)

// Calls given CUDA device memory (gorovod_cuda_next) run on collective/cuda,
// which loads the NVIDIA driver when the first such call opens a device: the
// library itself links no NVIDIA library, so it loads and serves host memory
// on any host. Everything the binding needs of collective/cuda goes through
// engine.OpenDevice, the one seam.

// cudaOpener is how the engine opens a CUDA device.
func cudaOpener() engine.OpenDevice { return openCUDA }

// deviceAllreducer runs each world's allreduces of CUDA memory through
// CUDA IPC when all its workers are on this host (collective/cuda's
// SameHostAllreducer; the staged ring otherwise). The ranks meet within a
// call on a shared-memory board (HostSync: microseconds, where a meeting
// over the communicator is a network round trip), waiting for a silent
// peer as long as the transport does (ioTimeout).
func deviceAllreducer(ioTimeout time.Duration, log *slog.Logger) func() collective.DeviceAllreducer {
	cfg := cuda.DefaultSameHostConfig()
	cfg.HostSync = true
	if ioTimeout > 0 {
		cfg.SyncTimeout = ioTimeout
	}
	return cuda.SameHostAllreducer(cfg, log)
}

// openCUDA opens CUDA device ordinal for the engine. A host without the
// NVIDIA driver makes device memory an invalid argument (the caller's
// mistake, as a tensor on an unknown device would be), with the loader's
// reason.
func openCUDA(ctx context.Context, ordinal int) (engine.Device, error) {
	d, err := cuda.NewDevice(ctx, ordinal)
	var noDriver *cuda.DriverLoadError
	if errors.As(err, &noDriver) {
		return nil, fmt.Errorf("%w: %w", engine.ErrInvalid, err)
	}
	if err != nil {
		return nil, err
	}
	return cudaDevice{d}, nil
}

// cudaDevice is a *cuda.Device as the engine's Device.
type cudaDevice struct{ *cuda.Device }

// Wrap adopts the caller's device memory; memory the driver does not know
// as this device's (a host address, another device's, a range past its
// allocation) is the caller's invalid argument.
func (d cudaDevice) Wrap(ctx context.Context, ptr uintptr, size int) (collective.DeviceMemory, error) {
	m, err := d.Device.Wrap(ctx, ptr, size)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", engine.ErrInvalid, err)
	}
	return m, nil
}

var _ engine.Device = cudaDevice{}
