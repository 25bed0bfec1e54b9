package timeline

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/tcp"
)

// BenchmarkRecord is the cost of recording one event on the traced goroutine.
func BenchmarkRecord(b *testing.B) {
	tl := New(io.Discard, DefaultConfig())
	defer tl.Close(context.Background())
	tr := tl.CollectiveTracer()
	op := collective.OpInfo{Collective: "allreduce", Algorithm: "ring", DType: collective.Float32, Op: collective.Sum, Count: 1024, Bytes: 4096, Size: 4}
	now := time.Now()
	b.Run("Complete", func(b *testing.B) {
		for range b.N {
			tl.Complete(TrackTraining, "step", "training", now, now, Int("step", 3))
		}
	})
	b.Run("CollectiveEnd", func(b *testing.B) {
		for range b.N {
			tr.CollectiveEnd(op, now, now, nil)
		}
	})
}

// tcpWorld connects p communicators over loopback TCP, tracing into tl when
// it is not nil (the same timeline for every rank: the goroutines contend
// for its lock as much as p processes' worth of events would for theirs).
func tcpWorld(b *testing.B, p int, tl *Timeline) []*collective.Communicator {
	b.Helper()
	ts := make([]*tcp.Transport, p)
	addrs := make([]string, p)
	for r := range ts {
		cfg := tcp.DefaultConfig()
		cfg.Secret = []byte("timeline-bench-secret")
		tr, err := tcp.Listen(cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { tr.Close() })
		ts[r], addrs[r] = tr, tr.Addr()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	comms := make([]*collective.Communicator, p)
	errs := make([]error, p)
	var wg sync.WaitGroup
	for r := range ts {
		wg.Go(func() {
			w := transport.World{JobID: "bench", Epoch: 1, Rank: r, Addrs: addrs}
			cfg := collective.DefaultConfig()
			cfg.Tracer = tl.CollectiveTracer()
			comms[r], errs[r] = collective.New(ctx, ts[r], w, cfg)
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			b.Fatalf("rank %d: %v", r, err)
		}
	}
	b.Cleanup(func() {
		for _, c := range comms {
			c.Close()
		}
	})
	return comms
}

// BenchmarkTracerOverhead measures the cost of leaving the timeline on: two
// worlds of p ranks over loopback TCP, one tracing and one not, run the same
// float32 sum allreduce in alternating rounds (so that a busy machine slows
// both alike), and the medians of the rounds' per-operation times are
// reported as ns/op-off and ns/op-on, with wall-overhead-% = on/off - 1;
// cpu-overhead-% compares the CPU time the process spent per operation (the
// ranks and the timeline's writer), which other programs on a shared machine
// disturb less than wall time.
func BenchmarkTracerOverhead(b *testing.B) {
	for _, p := range []int{2, 4} {
		for _, size := range []int{4 << 10, 256 << 10, 4 << 20} {
			b.Run(fmt.Sprintf("p=%d/%dKiB", p, size>>10), func(b *testing.B) {
				tl := New(io.Discard, DefaultConfig())
				defer tl.Close(context.Background())
				worlds := [2][]*collective.Communicator{tcpWorld(b, p, nil), tcpWorld(b, p, tl)}
				bufs := make([][]float32, p)
				for r := range bufs {
					bufs[r] = make([]float32, size/4)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
				defer cancel()
				// run returns the wall time and the process's CPU time (all
				// goroutines: the ranks and the timeline's writer) of n
				// allreduces on every rank.
				run := func(comms []*collective.Communicator, n int) (wall, cpu time.Duration) {
					cpu0 := processCPU(b)
					start := time.Now()
					var wg sync.WaitGroup
					errs := make([]error, p)
					for r, c := range comms {
						wg.Go(func() {
							for range n {
								if err := collective.Allreduce(ctx, c, bufs[r], bufs[r], collective.Sum); err != nil {
									errs[r] = err
									return
								}
							}
						})
					}
					wg.Wait()
					for r, err := range errs {
						if err != nil {
							b.Fatalf("rank %d: %v", r, err)
						}
					}
					return time.Since(start), processCPU(b) - cpu0
				}
				run(worlds[0], 3) // warm up both
				run(worlds[1], 3)
				b.ResetTimer()
				const rounds = 30
				batch := max(1, b.N/(2*rounds))
				var wall, cpu [2][]float64
				for i := range rounds {
					for k := range 2 {
						w := (i + k) % 2 // alternate which goes first
						wt, ct := run(worlds[w], batch)
						wall[w] = append(wall[w], float64(wt.Nanoseconds())/float64(batch))
						cpu[w] = append(cpu[w], float64(ct.Nanoseconds())/float64(batch))
					}
				}
				off, on := median(wall[0]), median(wall[1])
				b.ReportMetric(off, "ns/op-off")
				b.ReportMetric(on, "ns/op-on")
				b.ReportMetric(100*(on/off-1), "wall-overhead-%")
				b.ReportMetric(100*(median(cpu[1])/median(cpu[0])-1), "cpu-overhead-%")
				if tl.Dropped() > 0 {
					b.Fatalf("the timeline dropped %d events", tl.Dropped())
				}
			})
		}
	}
}

// processCPU is the user and system time this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkEncode is the writer goroutine's cost per event (off the traced
// goroutine, but CPU all the same).
func BenchmarkEncode(b *testing.B) {
	op := collective.OpInfo{Collective: "allreduce", Algorithm: "ring", DType: collective.Float32, Op: collective.Sum, Count: 1024, Bytes: 4096, Size: 4, Seq: 123456, Epoch: 7, Rank: 2}
	ev := event{ph: 'X', kind: evCollective, track: TrackCollectives, cat: "collective", ts: time.Now().UnixNano(), dur: 12345, op: op}
	var buf []byte
	for range b.N {
		buf = appendEvent(buf[:0], &ev, 4242)
	}
	b.SetBytes(int64(len(buf)))
}
