package main

import (
	"context"
	"debug/elf"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/bindings/internal/buildtest"
)

// TestLibraryLoadsEverywhere checks that libgorovod.so, built as users build
// it (no build tags, CUDA path included), loads where every symbol must be
// resolved at load time (dlopen with RTLD_NOW, as Python's ctypes does)
// whether or not NVIDIA's libraries are installed: it must neither need an
// NVIDIA library nor reference an NVML or CUDA driver symbol (GPU discovery
// and collective/cuda look them up with dlsym), which the ELF checks assert
// on any host, and a C program must load it with RTLD_NOW, which on a host
// without NVML is the failure users saw ("undefined symbol: nvml...").
func TestLibraryLoadsEverywhere(t *testing.T) {
	lib := filepath.Join(buildtest.Library(t), "libgorovod.so")
	f, err := elf.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	syms, err := f.DynamicSymbols()
	if err != nil {
		f.Close()
		t.Fatal(err)
	}
	needed, err := f.ImportedLibraries()
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	// The CUDA path is in this build (collective/cuda, which loads the
	// driver at run time), not left out.
	var cudaPath bool
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF {
			cudaPath = cudaPath || s.Name == "gorovod_cuda_supported"
			continue
		}
		if strings.HasPrefix(s.Name, "nvml") {
			t.Errorf("libgorovod.so references %s: it cannot load without NVIDIA's libnvidia-ml.so.1", s.Name)
		}
		if strings.HasPrefix(s.Name, "cu") && len(s.Name) > 2 && s.Name[2] >= 'A' && s.Name[2] <= 'Z' {
			t.Errorf("libgorovod.so references %s: it cannot load without NVIDIA's libcuda.so.1", s.Name)
		}
	}
	for _, n := range needed {
		if strings.HasPrefix(n, "libcuda") || strings.HasPrefix(n, "libnvidia") || strings.HasPrefix(n, "libnvrtc") {
			t.Errorf("libgorovod.so needs %s: it cannot load on a host without NVIDIA's libraries", n)
		}
	}
	if !cudaPath {
		t.Error("libgorovod.so does not export gorovod_cuda_supported")
	}

	bin := filepath.Join(t.TempDir(), "dlopen_test")
	args := []string{"-Wall", "-Wextra", "-Werror", "-std=c11", "-D_GNU_SOURCE",
		filepath.Join("testdata", "dlopen_test.c"), "-ldl", "-o", bin}
	if out, err := exec.Command("cc", args...).CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, lib).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "LOADED abi") {
		t.Fatalf("loading %s with RTLD_NOW: %v\n%s", lib, err, out)
	}
}
