//go:build gorovod_cudastandin

package main

/*
#include <stdint.h>

// The stand-in's "device pointers" are host addresses plus an offset and its
// events host flags: both arrive as integers and become pointers here, in C.
static void *gorovod_standin_ptr(uintptr_t p) { return (void *)p; }
static int32_t gorovod_standin_flag(uintptr_t p) { return __atomic_load_n((const int32_t *)p, __ATOMIC_ACQUIRE); }
*/
import "C"

import (
	"context"
	"fmt"
	"log/slog"
	"time"
	"unsafe"

	"github.com/gorovod/gorovod/bindings/internal/engine"
	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/internal/testing/fakedevice"
)

// A library built with the tag gorovod_cudastandin, for tests only, takes
// the calls gorovod_cuda_next marks as device memory as a CUDA build does,
// but its "device 0" is host memory that the collectives reach only through
// collective.DeviceMemory (internal/testing/fakedevice), at "device
// addresses" that are host addresses plus standInOffset (not canonical on
// x86-64 or arm64, so that a call that took them for host memory would
// fault rather than pass), and an event is the address of an int32 flag
// that the program sets when the "stream" gets there. The C ABI's whole device path (the thread's marking, the buffers,
// in-place calls, the event wait before the buffers are touched, the
// device's life) then runs where there is no GPU (testdata/cuda_standin_test.c).

// standInOffset is added to a host address to make the stand-in's device
// address of the same memory.
const standInOffset = 1 << 56

func cudaOpener() engine.OpenDevice { return openStandIn }

func openStandIn(ctx context.Context, ordinal int) (engine.Device, error) {
	if ordinal != 0 {
		return nil, fmt.Errorf("the CUDA stand-in has device 0 only, not %d", ordinal)
	}
	return standIn{}, nil
}

type standIn struct{}

func (standIn) Wrap(ctx context.Context, ptr uintptr, size int) (collective.DeviceMemory, error) {
	if size == 0 {
		return fakedevice.Adopt([]byte{}, nil), nil
	}
	if ptr < standInOffset {
		return nil, fmt.Errorf("0x%x is not a stand-in device address (host address + 0x%x)", ptr, uintptr(standInOffset))
	}
	return fakedevice.Adopt(unsafe.Slice((*byte)(C.gorovod_standin_ptr(C.uintptr_t(ptr-standInOffset))), size), nil), nil
}

// WaitEvent polls the flag at event until it is set or ctx ends.
func (standIn) WaitEvent(ctx context.Context, event uintptr) error {
	for C.gorovod_standin_flag(C.uintptr_t(event)) == 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Microsecond):
		}
	}
	return nil
}

func (standIn) Close() error { return nil }

// deviceAllreducer is the stand-in's: it runs each device allreduce on the
// staged path through the communicator's DeviceAllreducer hook, so that the
// stand-in tests go the way a CUDA build's calls go (collective/cuda's
// SameHostAllreducer needs a GPU).
func deviceAllreducer(time.Duration, *slog.Logger) func() collective.DeviceAllreducer {
	return func() collective.DeviceAllreducer { return standInAllreducer{} }
}

type standInAllreducer struct{}

func (standInAllreducer) AllreduceDevice(ctx context.Context, c *collective.Communicator, send, recv collective.Buffer, op collective.ReduceOp, prescale, postscale float64) error {
	return c.Allreduce(ctx, send, recv, op, collective.Prescale(prescale), collective.Postscale(postscale), collective.Staged())
}

func (standInAllreducer) Close() error { return nil }
