//go:build !cuda && !gorovod_cudastandin

package main

import (
	"errors"
	"log/slog"
	"time"

	"github.com/gorovod/gorovod/bindings/internal/engine"
	"github.com/gorovod/gorovod/collective"
)

// This library was built without the tag cuda (the default build): calls
// given CUDA device memory are refused with errNoCUDA.
const cudaSupported = false

var errNoCUDA = errors.New("this libgorovod was built without CUDA support, so it cannot take CUDA tensors (device memory): " +
	"build it with `go build -tags cuda -buildmode=c-shared -o libgorovod.so ./bindings/c` " +
	"(CGO_CFLAGS=-I<cuda>/include CGO_LDFLAGS=-L<cuda>/lib: CUDA's cuda.h and libcuda), or copy the tensors to the CPU")

// cudaOpener is nil: the engine opens no accelerator, and the binding
// refuses device memory with errNoCUDA before asking it.
func cudaOpener() engine.OpenDevice { return nil }

// deviceAllreducer is nil: no device memory reaches the collectives.
func deviceAllreducer(time.Duration, *slog.Logger) func() collective.DeviceAllreducer { return nil }
