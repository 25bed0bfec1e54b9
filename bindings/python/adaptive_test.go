package python

import (
	"fmt"
	"testing"
	"time"
)

// TestAdaptiveDataLoader: gorovod.torch.AdaptiveDataLoader and
// AdaptiveOptimizer training for real, alone and on two workers, with each
// learning-rate rule: the batch size grows as the Go side decides, every
// epoch's samples are used once across the changes, every rank runs the
// same plans, and each step's learning rate is the rule's factor times the
// base (tests/adaptive_test.py).
func TestAdaptiveDataLoader(t *testing.T) {
	needTorch(t)
	for _, tc := range []struct {
		np   int
		rule string
	}{{0, "linear"}, {2, "adascale"}, {2, "sqrt"}} {
		t.Run(fmt.Sprintf("np=%d/%s", tc.np, tc.rule), func(t *testing.T) {
			out := runPython(t, tc.np, 4*time.Minute, pyEnv(t), "tests/adaptive_test.py", tc.rule)
			wantPasses(t, out, max(tc.np, 1))
			t.Log(out)
		})
	}
}
