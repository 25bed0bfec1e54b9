package sync

import (
	"context"
	"fmt"
	"log/slog"
	stdsync "sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/tcp"
	"github.com/gorovod/gorovod/sync/control"
	"github.com/gorovod/gorovod/sync/driver"
	"github.com/gorovod/gorovod/sync/stats"
)

// startToyWorld joins p toy workers through an in-process coordinator and
// returns their sessions once all are in one world; edits change each
// session's configuration.
func startToyWorld(b *testing.B, p int, params int, edits ...func(*Config)) ([]*Session, *driver.Coordinator) {
	b.Helper()
	coord := driver.NewCoordinator(driver.CoordinatorConfig{MinWorkers: p, Coalesce: time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	go coord.Run(ctx)
	sessions := make([]*Session, p)
	var wg stdsync.WaitGroup
	for i := range p {
		w := startToy(b, fmt.Sprintf("b%d", i), coord, params)
		wg.Go(func() {
			s, err := joinCoord(ctx, coord, w.name, w.tr, w.state, edits...)
			if err != nil {
				b.Error(err)
				return
			}
			sessions[i] = s
			b.Cleanup(func() { s.Close() })
		})
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
	return sessions, coord
}

// BenchmarkStepOverhead compares a training step's communication through the
// session (fused allreduce plus the step-boundary agreement of Commit) with a
// bare allreduce of the same gradients on the same communicator.
func BenchmarkStepOverhead(b *testing.B) {
	for _, p := range []int{2, 4} {
		for _, n := range []int{100_000, 1 << 20} {
			for _, mode := range []string{"bare", "session"} {
				b.Run(fmt.Sprintf("p=%d/floats=%d/%s", p, n, mode), func(b *testing.B) {
					sessions, _ := startToyWorld(b, p, 16)
					grads := make([][]float32, p)
					for i := range grads {
						grads[i] = make([]float32, n)
					}
					b.SetBytes(int64(4 * n))
					b.ResetTimer()
					var wg stdsync.WaitGroup
					for i, s := range sessions {
						wg.Go(func() {
							ctx := context.Background()
							for range b.N {
								var err error
								if mode == "bare" {
									err = collective.Allreduce(ctx, s.Communicator(), grads[i], grads[i], collective.Average)
								} else if err = s.Allreduce(ctx, Reduction{}, collective.SliceBuffer(grads[i])); err == nil {
									err = s.Commit(ctx)
								}
								if err != nil {
									b.Error(err)
									return
								}
							}
						})
					}
					wg.Wait()
				})
			}
		}
	}
}

// BenchmarkStatsOverhead is the autoscaling engine's cost to the trainer in
// steady state: steps with the step statistics off, and on with every batch
// encoded for the wire as a worker does and handed to a sender goroutine. Tiny
// gradients make the step short and the relative cost the largest.
func BenchmarkStatsOverhead(b *testing.B) {
	for _, n := range []int{1_000, 100_000} {
		for _, mode := range []string{"off", "timing", "on"} {
			b.Run(fmt.Sprintf("p=2/floats=%d/stats=%s", n, mode), func(b *testing.B) {
				var edits []func(*Config)
				if mode == "timing" { // the clock reads and records, batches dropped
					edits = append(edits, func(sc *Config) { sc.OnStats = func(stats.Batch) {} })
				}
				if mode == "on" {
					queue := make(chan stats.Batch, 8)
					done := make(chan struct{})
					b.Cleanup(func() { close(done) })
					go func() {
						for {
							select {
							case batch := <-queue:
								_ = control.EncodeStats(batch)
							case <-done:
								return
							}
						}
					}()
					edits = append(edits, func(sc *Config) {
						sc.OnStats = func(batch stats.Batch) {
							select {
							case queue <- batch:
							default:
							}
						}
					})
				}
				sessions, _ := startToyWorld(b, 2, 16, edits...)
				stepAll(b, sessions, func(int) []float32 { return make([]float32, n) }, func(s *Session) { s.RecordSamples(32) })
			})
		}
	}
}

// BenchmarkTransition measures a planned change: from the epoch that admits a
// new worker being proposed to the first allreduce completed in the new world
// (connecting, state broadcast to the joiner, one gradient allreduce).
func BenchmarkTransition(b *testing.B) {
	for _, p := range []int{4, 8} {
		b.Run(fmt.Sprintf("p=%d", p), func(b *testing.B) {
			var total time.Duration
			for it := range b.N {
				total += transitionOnce(b, p, it)
			}
			b.ReportMetric(float64(total.Microseconds())/float64(b.N)/1000, "ms/transition")
		})
	}
}

func transitionOnce(b *testing.B, p, it int) time.Duration {
	b.StopTimer()
	sessions, coord := startToyWorld(b, p-1, 100_000)
	// Before the joiner is added: the epoch with it may be proposed at once.
	first := coord.Current().Number
	joiner := startToy(b, fmt.Sprintf("joiner-%d", it), coord, 100_000)
	ctx := context.Background()
	var proposed time.Time
	done := make([]time.Time, p)
	var wg stdsync.WaitGroup
	grads := func() collective.Buffer { return collective.SliceBuffer(make([]float32, 100_000)) }
	for i, s := range sessions {
		wg.Go(func() {
			// Step until the new world is in place, then one allreduce there.
			for s.World().Number == first {
				if err := s.Allreduce(ctx, Reduction{}, grads()); err != nil {
					b.Error(err)
					return
				}
				if err := s.Commit(ctx); err != nil {
					b.Error(err)
					return
				}
			}
			if err := s.Allreduce(ctx, Reduction{}, grads()); err != nil {
				b.Error(err)
			}
			done[i] = time.Now()
		})
	}
	wg.Go(func() {
		s, err := joinCoord(ctx, coord, joiner.name, joiner.tr, joiner.state)
		if err != nil {
			b.Error(err)
			return
		}
		defer s.Close()
		if err := s.Allreduce(ctx, Reduction{}, grads()); err != nil {
			b.Error(err)
		}
		done[p-1] = time.Now()
	})
	e, err := coord.View("bench").Await(ctx, first)
	proposed = time.Now()
	if err != nil {
		b.Fatal(err)
	}
	_ = e
	wg.Wait()
	var last time.Time
	for _, d := range done {
		if d.After(last) {
			last = d
		}
	}
	return last.Sub(proposed)
}

// BenchmarkSessionCPU is the session's own cost per step with no network to
// hide it: in a world of one the allreduce moves nothing, so what is measured
// is the fusion (packing many small tensors into one buffer and back), the
// checks, the step-boundary agreement and the step clock.
func BenchmarkSessionCPU(b *testing.B) {
	for _, shape := range []struct{ tensors, floats int }{{1, 100_000}, {64, 1024}} {
		b.Run(fmt.Sprintf("tensors=%d/floats=%d", shape.tensors, shape.floats), func(b *testing.B) {
			sessions, _ := startToyWorld(b, 1, 16)
			s := sessions[0]
			bufs := make([]collective.Buffer, shape.tensors)
			for i := range bufs {
				bufs[i] = collective.SliceBuffer(make([]float32, shape.floats))
			}
			ctx := context.Background()
			b.SetBytes(int64(4 * shape.tensors * shape.floats))
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if err := s.Allreduce(ctx, Reduction{}, bufs...); err != nil {
					b.Fatal(err)
				}
				if err := s.Commit(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkGradientNoiseOverhead is the gradient noise measurement's cost
// to a step: the same steps (one gradient tensor, averaged, committed) with
// the measurement off and on, in worlds of one and two. There is no compute
// in these steps, so the relative cost is the largest a trainer can see;
// the absolute difference per step is what a real step pays.
func BenchmarkGradientNoiseOverhead(b *testing.B) {
	for _, p := range []int{1, 2} {
		for _, n := range []int{100_000, 1 << 20} {
			for _, mode := range []string{"off", "on"} {
				b.Run(fmt.Sprintf("p=%d/floats=%d/gns=%s", p, n, mode), func(b *testing.B) {
					sessions, _ := startToyWorld(b, p, 16, func(sc *Config) { sc.GradientNoise.Measure = mode == "on" })
					grads := func(rank int) []float32 {
						g := make([]float32, n)
						for j := range g {
							g[j] = float32((rank+j)%7) - 3
						}
						return g
					}
					stepAll(b, sessions, grads, func(s *Session) { s.SetGlobalBatch(64) })
				})
			}
		}
	}
}

// stepAll runs b.N steps on every session at once: before each, each step
// calls before; then it averages the session's gradient tensor (grads of
// its index) and commits.
func stepAll(b *testing.B, sessions []*Session, grads func(int) []float32, before func(*Session)) {
	b.Helper()
	b.SetBytes(int64(4 * len(grads(0))))
	bufs := make([]collective.Buffer, len(sessions))
	for i := range sessions {
		bufs[i] = collective.SliceBuffer(grads(i))
	}
	b.ResetTimer()
	var wg stdsync.WaitGroup
	for i, s := range sessions {
		wg.Go(func() {
			ctx := context.Background()
			for range b.N {
				before(s)
				err := s.Allreduce(ctx, Reduction{}, bufs[i])
				if err == nil {
					err = s.Commit(ctx)
				}
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkStateDigest takes the digest of a 1 GiB float32 state, what
// every member that holds the job's state computes on entering a world
// (Session.stateRoot), in parallel, before any transfer; bytes/s is the
// hashing rate.
func BenchmarkStateDigest(b *testing.B) {
	st := NewState()
	st.RegisterTensor("params", make([]float32, (1<<30)/4))
	b.SetBytes(1 << 30)
	for b.Loop() {
		if d, err := st.digest(); err != nil || !d.whole {
			b.Fatalf("digest: %+v, %v", d, err)
		}
	}
}

// BenchmarkJoinerState moves a 256 MiB float32 state (4 tensors) into one
// joiner of a 9-rank world over loopback TCP, goroutine ranks in one
// process: "broadcast" is the transfer without holders (the pipelined
// broadcast from rank 0 through every rank, what a world with a joiner ran
// before the holders were known), "holders" what entering the world runs
// now (Session.stateRoot's digest round, then the tensors in stripes from
// the holders, collective.Config.StripeSources left to choose); in
// "holders-half-held" the joiner holds two of the four tensors already (a
// checkpoint's frozen layers), which are not sent. Each rank has its own
// copy: 9 × 256 MiB.
func BenchmarkJoinerState(b *testing.B) {
	const p, tensors, bytes = 9, 4, 256 << 20
	for _, mode := range []string{"broadcast", "holders", "holders-half-held"} {
		b.Run(mode, func(b *testing.B) {
			comms := make([]*collective.Communicator, p)
			trs := make([]transport.Transport, p)
			addrs := make([]string, p)
			for r := range trs {
				cfg := tcp.DefaultConfig()
				cfg.Secret = []byte("sync-bench-secret")
				cfg.IOTimeout = time.Minute
				tr, err := tcp.Listen(cfg)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { tr.Close() })
				trs[r], addrs[r] = tr, tr.Addr()
			}
			sessions := make([]*Session, p)
			var lacking [][]float32 // the joiner's tensors that differ from the job's
			var wg stdsync.WaitGroup
			for r := range p {
				st := NewState()
				for i := range tensors {
					t := make([]float32, bytes/4/tensors)
					if r < p-1 || (mode == "holders-half-held" && i < tensors/2) {
						for j := range t {
							t[j] = float32(j%1000 + i)
						}
					} else {
						lacking = append(lacking, t)
					}
					st.RegisterTensor(fmt.Sprintf("t%d", i), t)
				}
				st.Step = 9
				sessions[r] = &Session{synced: r < p-1, state: st, log: slog.New(slog.DiscardHandler)}
				wg.Go(func() {
					w := transport.World{JobID: "joiner-bench", Epoch: 1, Rank: r, Addrs: addrs}
					c, err := collective.New(context.Background(), trs[r], w, collective.Config{})
					if err != nil {
						b.Error(err)
						return
					}
					comms[r] = c
					b.Cleanup(func() { c.Close() })
				})
			}
			wg.Wait()
			if b.Failed() {
				b.FailNow()
			}
			b.SetBytes(bytes)
			b.ResetTimer()
			for range b.N {
				// The joiner lacks those tensors again (the last round
				// gave it the job's).
				b.StopTimer()
				for _, t := range lacking {
					clear(t)
				}
				b.StartTimer()
				errs := make([]error, p)
				for r := range p {
					wg.Go(func() {
						ctx := context.Background()
						if mode == "broadcast" {
							_, errs[r] = sessions[r].state.broadcast(ctx, comms[r], 0, nil, []int{0})
						} else {
							errs[r] = enterState(ctx, sessions[r], comms[r])
						}
					})
				}
				wg.Wait()
				for r, err := range errs {
					if err != nil {
						b.Fatalf("rank %d: %v", r, err)
					}
				}
			}
		})
	}
}
