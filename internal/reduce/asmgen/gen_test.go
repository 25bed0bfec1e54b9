package main

import (
	"bytes"
	"os"
	"testing"
)

// TestCheckedInUpToDate fails when the kernels were edited by hand or the
// generator changed without `go generate ./internal/reduce`.
func TestCheckedInUpToDate(t *testing.T) {
	var asm, decl bytes.Buffer
	generate(&asm, &decl)
	for path, want := range map[string][]byte{
		"../kernels_amd64.s":  asm.Bytes(),
		"../kernels_amd64.go": decl.Bytes(),
	} {
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run go generate ./internal/reduce", path)
		}
	}
}
