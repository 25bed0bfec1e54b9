//go:build cuda

package ptxas

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/gorovod/gorovod/collective/cuda/kernels"
)

// TestAssembleShippedPTX assembles the embedded kernels.ptx, header included,
// for each GPU generation: the step the driver's JIT performs when the
// backend loads the module, done here without a GPU.
func TestAssembleShippedPTX(t *testing.T) {
	for _, arch := range []string{"sm_70", "sm_75", "sm_80", "sm_86", "sm_89", "sm_90"} {
		t.Run(arch, func(t *testing.T) {
			elf, err := Assemble(context.Background(), kernels.PTX, arch)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.HasPrefix(elf, []byte("\x7fELF")) {
				t.Fatalf("%d bytes that are not an ELF image", len(elf))
			}
			for _, k := range kernels.All() {
				if !bytes.Contains(elf, []byte(k.Name+"\x00")) {
					t.Errorf("machine code has no symbol %s", k.Name)
				}
			}
		})
	}
}

func TestAssembleReportsErrors(t *testing.T) {
	_, err := Assemble(context.Background(), ".version 7.8\n.target sm_70\n.address_size 64\nbogus;\n", "sm_70")
	var pe *Error
	if !errors.As(err, &pe) || pe.Log == "" {
		t.Fatalf("got %v, want an *Error with the assembler's log", err)
	}
}
