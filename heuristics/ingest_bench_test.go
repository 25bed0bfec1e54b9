package heuristics

import (
	"context"
	"testing"
	"time"
)

type benchCluster struct{}

func (benchCluster) Remove(string)         {}
func (benchCluster) Workers() []WorkerInfo { return nil }

type benchProv struct{}

func (benchProv) Start(context.Context, int) error       { return nil }
func (benchProv) Stop(context.Context, WorkerInfo) error { return nil }

// BenchmarkEngineIngest is the driver's cost per worker step report: two
// workers' batches of 256 steps aggregated into complete steps.
func BenchmarkEngineIngest(b *testing.B) {
	for _, stragglers := range []bool{false, true} {
		name := "measure-only"
		if stragglers {
			name = "with-stragglers"
		}
		b.Run(name, func(b *testing.B) {
			cfg := DefaultEngineConfig()
			cfg.ReplaceStragglers = stragglers
			e, err := NewEngine(cfg, benchCluster{}, benchProv{})
			if err != nil {
				b.Fatal(err)
			}
			e.onWorld(WorldChange{Epoch: 1, Members: []string{"a", "b"}, At: time.Now()})
			batch := func(w string, from int64) workerReports {
				r := workerReports{worker: w, steps: make([]StepReport, 256)}
				for i := range r.steps {
					r.steps[i] = StepReport{Worker: w, Epoch: 1, Step: from + int64(i), Samples: 32, Compute: time.Millisecond, StepTime: 2 * time.Millisecond}
				}
				return r
			}
			b.ResetTimer()
			for i := range b.N {
				from := int64(i)*256 + 1
				e.onReports(batch("a", from))
				e.onReports(batch("b", from))
				e.evaluate(context.Background(), false)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*512), "ns/report")
		})
	}
}
