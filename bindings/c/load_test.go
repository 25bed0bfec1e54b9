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
// it (no build tags), loads where every symbol must be resolved at load time
// (dlopen with RTLD_NOW, as Python's ctypes does) whether or not NVIDIA's
// libraries are installed: it must not reference an NVML symbol (GPU
// discovery looks NVML up with dlsym), which the ELF check asserts on any
// host, and a C program must load it with RTLD_NOW, which on a host without
// NVML is the failure users saw ("undefined symbol: nvml...").
func TestLibraryLoadsEverywhere(t *testing.T) {
	lib := filepath.Join(buildtest.Library(t), "libgorovod.so")
	f, err := elf.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	syms, err := f.DynamicSymbols()
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range syms {
		if s.Section == elf.SHN_UNDEF && strings.HasPrefix(s.Name, "nvml") {
			t.Errorf("libgorovod.so references %s: it cannot load without NVIDIA's libnvidia-ml.so.1", s.Name)
		}
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
