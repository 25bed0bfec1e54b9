package fusion

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/internal/testing/fakedevice"
)

// With Adasum, which combines tensor by tensor, fusing must not change the
// result: every tensor of a fused list (host and device, several dtypes,
// empty and one-element tensors, any bucket size) comes out as the
// collective gives it for that tensor alone. Their values are neither
// parallel nor orthogonal across ranks, so one dot product over a whole
// bucket would give other results.
func TestFuserAdasumKeepsTensorsApart(t *testing.T) {
	var specs []tensorSpec
	for _, s := range mixed {
		if s.dt.IsFloat() {
			specs = append(specs, s)
		}
	}
	for _, threshold := range []int{4, 64, 256, 1 << 20} {
		for _, p := range []int{2, 4} {
			t.Run(fmt.Sprintf("threshold=%d/p=%d", threshold, p), func(t *testing.T) {
				comms := world(t, p)
				var calls fakedevice.Counters
				onEach(t, comms, func(ctx context.Context, c *collective.Communicator) error {
					fused := makeTensors(c.Rank(), specs, &calls)
					alone := makeTensors(c.Rank(), specs, &calls)
					f := NewFuser(threshold)
					defer f.Close()
					if err := f.Allreduce(ctx, c, fused, collective.Adasum); err != nil {
						return err
					}
					for _, b := range alone {
						if err := c.Allreduce(ctx, b, b, collective.Adasum); err != nil {
							return err
						}
					}
					for i := range fused {
						got, want := decode(fused[i].DType, bytesOf(fused[i])), decode(alone[i].DType, bytesOf(alone[i]))
						for j := range want {
							// The pieces of a dot product are summed in
							// another grouping: a coefficient may differ in
							// its last bits, and an element by an ulp.
							if math.Abs(got[j]-want[j]) > ulp(fused[i].DType)*math.Abs(want[j]) {
								return fmt.Errorf("tensor %d (%v) element %d: fused %v, alone %v", i, fused[i].DType, j, got[j], want[j])
							}
						}
					}
					return nil
				})
			})
		}
	}
}

// ulp is the relative size of one unit in the last place of dt.
func ulp(dt collective.DType) float64 {
	switch dt {
	case collective.Float16:
		return 0x1p-10
	case collective.BFloat16:
		return 0x1p-7
	case collective.Float32:
		return 0x1p-23
	}
	return 0x1p-52
}
