//go:build cuda

// Command genptx compiles kernels.cu with NVRTC for kernels.PTXArch and writes
// kernels.ptx, headed by the source hash and NVRTC version the kernels
// package checks. go generate runs it in collective/cuda/kernels; it needs
// libnvrtc and nvrtc.h, not a GPU.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/gorovod/gorovod/collective/cuda/kernels"
	"github.com/gorovod/gorovod/collective/cuda/kernels/compile"
)

func main() {
	out := flag.String("o", "kernels.ptx", "file to write")
	flag.Parse()
	if err := run(context.Background(), *out); err != nil {
		fmt.Fprintln(os.Stderr, "genptx:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out string) error {
	version, err := compile.Version()
	if err != nil {
		return err
	}
	res, err := compile.Compile(ctx, kernels.PTXArch)
	if err != nil {
		return err
	}
	if res.Log != "" {
		// Warnings are errors here: the checked-in PTX should come from a clean compile.
		return fmt.Errorf("NVRTC warnings for %s:\n%s", kernels.PTXArch, res.Log)
	}
	return os.WriteFile(out, []byte(kernels.FormatPTX(res.PTX, version)), 0o644)
}
