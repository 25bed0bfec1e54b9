package fusion

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/inproc"
	"github.com/gorovod/gorovod/internal/testing/fakedevice"
)

// countingTracer counts a communicator's collectives and remembers the last
// one's dtype and element count.
type countingTracer struct {
	n     atomic.Int64
	dtype atomic.Int32
	count atomic.Uint64
}

func (c *countingTracer) CollectiveStart(op collective.OpInfo, _ time.Time) {
	c.n.Add(1)
	c.dtype.Store(int32(op.DType))
	c.count.Store(op.Count)
}
func (*countingTracer) CollectivePhase(collective.OpInfo, collective.PhaseInfo)      {}
func (*countingTracer) CollectiveEnd(collective.OpInfo, time.Time, time.Time, error) {}

func tracedWorld(t *testing.T, p int) ([]*collective.Communicator, []*countingTracer) {
	t.Helper()
	mesh := inproc.Mesh(inproc.Config{JobID: "extras", Epoch: 1, IOTimeout: 5 * time.Second}, p)
	comms := make([]*collective.Communicator, p)
	tracers := make([]*countingTracer, p)
	for r := range comms {
		cfg := collective.DefaultConfig()
		tracers[r] = &countingTracer{}
		cfg.Tracer = tracers[r]
		c, err := collective.NewFromLinks(transport.World{JobID: "extras", Epoch: 1, Rank: r, Addrs: make([]string, p)}, mesh[r], cfg)
		if err != nil {
			t.Fatal(err)
		}
		comms[r] = c
		t.Cleanup(func() { c.Close() })
	}
	return comms, tracers
}

// The extras ride with one of the tensors' collectives, in the carrier the
// rules pick, come back reduced like the tensors (ops and scales included),
// and add no collective; the tensors are reduced as without them.
func TestFuserExtrasRideAlong(t *testing.T) {
	f32, f64, f16, bf16, i32 := collective.Float32, collective.Float64, collective.Float16, collective.BFloat16, collective.Int32
	tests := []struct {
		name      string
		specs     []tensorSpec
		threshold int
		carrier   collective.DType // 0: none
	}{
		{"one float32 tensor, packed to carry", []tensorSpec{{f32, 1000, false}}, 0, f32},
		{"float64 bucket before float32", []tensorSpec{{f32, 10, false}, {f64, 3, false}, {f32, 5, false}, {f64, 4, false}}, 0, f64},
		{"packed float32 bucket before a float64 tensor alone", []tensorSpec{{f64, 1000, false}, {f32, 10, false}, {f32, 5, false}}, 4096, f32},
		{"smallest tensor alone", []tensorSpec{{f32, 2000, false}, {f32, 1500, false}}, 1024, f32},
		{"float16 when no wider float", []tensorSpec{{f16, 100, false}, {i32, 7, false}}, 0, f16},
		{"bfloat16 alone", []tensorSpec{{bf16, 64, false}}, 0, bf16},
		{"host float32 beside device tensors", []tensorSpec{{f32, 10, true}, {f32, 6, false}, {f64, 4, true}}, 0, f32},
		{"mixed list", mixed, 256, f64},
		{"integers only: not carried", []tensorSpec{{i32, 10, false}, {collective.Uint8, 3, false}}, 0, 0},
		{"device only: not carried", []tensorSpec{{f32, 10, true}}, 0, 0},
		{"no tensors: not carried", nil, 0, 0},
	}
	for _, tc := range tests {
		for _, p := range []int{1, 2, 4} {
			for _, op := range []collective.ReduceOp{collective.Sum, collective.Average} {
				t.Run(fmt.Sprintf("%s/p=%d/%v", tc.name, p, op), func(t *testing.T) {
					comms, tracers := tracedWorld(t, p)
					var calls fakedevice.Counters
					// Collectives without extras, to compare with.
					onEach(t, comms, func(ctx context.Context, c *collective.Communicator) error {
						return NewFuser(tc.threshold).Allreduce(ctx, c, makeTensors(c.Rank(), tc.specs, &calls), op)
					})
					plain := tracers[0].n.Load()
					onEach(t, comms, func(ctx context.Context, c *collective.Communicator) error {
						ts := makeTensors(c.Rank(), tc.specs, &calls)
						r := float64(c.Rank())
						extras := []float64{r + 1, 0.25 * r, 3}
						if c.Rank() != 0 {
							extras[2] = 0 // rank 0 alone sends this one
						}
						f := NewFuser(tc.threshold)
						defer f.Close()
						// Scales that keep integers exact with Sum (Average of
						// integers truncates between them).
						var opts []collective.Option
						if op == collective.Sum {
							opts = append(opts, collective.Prescale(2), collective.Postscale(0.5))
						}
						carried, err := f.AllreduceExtra(ctx, c, ts, extras, op, opts...)
						if err != nil {
							return err
						}
						if carried != (tc.carrier != 0) {
							return fmt.Errorf("carried %v, want %v", carried, tc.carrier != 0)
						}
						if err := checkReduced(ts, p, op, 1); err != nil {
							return err
						}
						want := []float64{float64(p*(p+1)) / 2, 0.25 * float64(p*(p-1)) / 2, 3}
						if !carried {
							want = []float64{r + 1, 0.25 * r, extras[2]} // untouched
						} else if op == collective.Average {
							for i := range want {
								want[i] /= float64(p)
							}
						}
						for i := range want {
							if extras[i] != want[i] {
								return fmt.Errorf("extra %d = %v, want %v", i, extras[i], want[i])
							}
						}
						return nil
					})
					if got := tracers[0].n.Load() - plain; got != plain {
						t.Errorf("%d collectives with extras, %d without", got, plain)
					}
				})
			}
		}
	}
}

// The carrier is the group the rules pick: the extras are the last elements
// of the carrier's collective, which is the last one to run among equals.
func TestFuserCarrierChoice(t *testing.T) {
	f32, f64, f16 := collective.Float32, collective.Float64, collective.Float16
	tests := []struct {
		name      string
		specs     []tensorSpec
		threshold int
		dtype     collective.DType
		count     uint64 // elements of the carrier's collective, extras included
	}{
		{"float64 before float32", []tensorSpec{{f32, 10, false}, {f64, 3, false}}, 0, f64, 3 + 2},
		{"the only tensor", []tensorSpec{{f16, 100, false}}, 0, f16, 100 + 2},
		{"the smaller of two alone", []tensorSpec{{f32, 300, false}, {f32, 200, false}}, 256, f32, 200 + 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			comms, tracers := tracedWorld(t, 2)
			var calls fakedevice.Counters
			onEach(t, comms, func(ctx context.Context, c *collective.Communicator) error {
				ts := makeTensors(c.Rank(), tc.specs, &calls)
				f := NewFuser(tc.threshold)
				plan := f.plan(ts)
				if plan != nil {
					return plan
				}
				g := f.carrier(ts)
				if g < 0 {
					return fmt.Errorf("no carrier")
				}
				last := g == len(f.groups)-1
				_, err := f.AllreduceExtra(ctx, c, ts, []float64{1, 2}, collective.Sum)
				if err == nil && last {
					tr := tracers[c.Rank()]
					if collective.DType(tr.dtype.Load()) != tc.dtype || tr.count.Load() != tc.count {
						return fmt.Errorf("carrier collective: %v × %d, want %v × %d", collective.DType(tr.dtype.Load()), tr.count.Load(), tc.dtype, tc.count)
					}
				}
				return err
			})
		})
	}
}
