package main

import (
	"os"
	"testing"

	"github.com/gorovod/gorovod/bindings/internal/buildtest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	buildtest.Cleanup()
	os.Exit(code)
}

// TestCProgram compiles testdata/abi_test.c with cc against gorovod.h and
// libgorovod.so, and runs it alone (a world of one) and as 3 workers under
// `gorovod run`: every collective, the handles, the errors, a forked child.
func TestCProgram(t *testing.T) {
	cProgram{source: "abi_test.c", libs: []string{"-lpthread"}, okLine: "abi test ok", np: 3}.run(t)
}

// TestHeaderIsCPlusPlus checks that gorovod.h compiles as C++ too.
func TestHeaderIsCPlusPlus(t *testing.T) { headerIsCPlusPlus(t, "gorovod.h") }
