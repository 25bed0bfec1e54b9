package main

import "testing"

// TestAdaptiveCProgram compiles testdata/adaptive_test.c against
// gorovod_adaptive.h and libgorovod.so and runs it alone and as 2 workers
// under `gorovod run`: its errors, and the adaptive loop growing the batch
// with every rank on the same plan.
func TestAdaptiveCProgram(t *testing.T) {
	cProgram{source: "adaptive_test.c", libs: []string{"-lm"}, okLine: "adaptive test ok", np: 2}.run(t)
}

// TestAdaptiveHeaderIsCPlusPlus checks that gorovod_adaptive.h compiles as
// C++ too.
func TestAdaptiveHeaderIsCPlusPlus(t *testing.T) { headerIsCPlusPlus(t, "gorovod_adaptive.h") }
