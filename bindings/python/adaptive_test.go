package python

import (
	"fmt"
	"testing"
	"time"
)

// TestAdaptiveDataLoader: gorovod.torch.AdaptiveDataLoader and
// AdaptiveOptimizer training for real, alone and on two workers, with each
// learning-rate rule, with and without gradient accumulation: the batch size
// grows as the Go side decides, every epoch's samples are used once across
// the changes, every rank runs the same plans, and each step applies the
// mean gradient times the rule's factor times the base learning rate
// (tests/adaptive_test.py).
func TestAdaptiveDataLoader(t *testing.T) {
	needTorch(t)
	for _, tc := range []struct {
		np    int
		rule  string
		accum bool
	}{{0, "linear", false}, {2, "adascale", false}, {2, "sqrt", false}, {0, "adascale", true}, {2, "linear", true}} {
		args := []string{"tests/adaptive_test.py", tc.rule}
		if tc.accum {
			args = append(args, "accumulate")
		}
		t.Run(fmt.Sprintf("np=%d/%s/accumulate=%v", tc.np, tc.rule, tc.accum), func(t *testing.T) {
			out := runPython(t, tc.np, 4*time.Minute, pyEnv(t), args...)
			wantPasses(t, out, max(tc.np, 1))
			t.Log(out)
		})
	}
}
