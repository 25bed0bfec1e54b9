package sync

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	stdsync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/heuristics/goodput"
	"github.com/gorovod/gorovod/internal/half"
	"github.com/gorovod/gorovod/internal/testing/fakedevice"
	"github.com/gorovod/gorovod/sync/driver"
)

// collectiveCounter counts a communicator's collectives.
type collectiveCounter struct{ n atomic.Int64 }

func (c *collectiveCounter) CollectiveStart(collective.OpInfo, time.Time)               { c.n.Add(1) }
func (*collectiveCounter) CollectivePhase(collective.OpInfo, collective.PhaseInfo)      {}
func (*collectiveCounter) CollectiveEnd(collective.OpInfo, time.Time, time.Time, error) {}

// noiseWorld joins p workers over TCP into one world, each session with the
// given gradient noise configuration and a collective counter.
func noiseWorld(t *testing.T, p int, noise NoiseConfig) ([]*Session, []*collectiveCounter) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	coord := driver.NewCoordinator(driver.CoordinatorConfig{MinWorkers: p, Coalesce: time.Millisecond})
	go coord.Run(ctx)
	sessions := make([]*Session, p)
	counters := make([]*collectiveCounter, p)
	errs := make([]error, p)
	var wg stdsync.WaitGroup
	for i := range p {
		w := startToy(t, fmt.Sprintf("n%d", i), coord, 4)
		counters[i] = &collectiveCounter{}
		wg.Go(func() {
			sessions[i], errs[i] = joinCoord(ctx, coord, w.name, w.tr, w.state, func(sc *Config) {
				sc.GradientNoise = noise
				sc.Collective.Tracer = counters[i]
			})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("worker %d: %v", i, err)
		}
		t.Cleanup(func() { sessions[i].Close() })
	}
	return sessions, counters
}

// onEachSession runs fn on every session concurrently and fails on the
// first error.
func onEachSession(t *testing.T, sessions []*Session, fn func(ctx context.Context, rank int, s *Session) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errs := make([]error, len(sessions))
	var wg stdsync.WaitGroup
	for i, s := range sessions {
		wg.Go(func() { errs[i] = fn(ctx, s.Rank(), s) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("worker %d: %v", i, err)
		}
	}
}

// gradBuffer holds a gradient of n elements in dtype dt.
type gradBuffer struct {
	dt  collective.DType
	f32 []float32
	f64 []float64
	h   []uint16
}

func newGradBuffer(dt collective.DType, n int) *gradBuffer {
	g := &gradBuffer{dt: dt}
	switch dt {
	case collective.Float32:
		g.f32 = make([]float32, n)
	case collective.Float64:
		g.f64 = make([]float64, n)
	default:
		g.h = make([]uint16, n)
	}
	return g
}

func (g *gradBuffer) set(i int, v float64) {
	switch g.dt {
	case collective.Float32:
		g.f32[i] = float32(v)
	case collective.Float64:
		g.f64[i] = v
	case collective.Float16:
		g.h[i] = half.F32ToF16(float32(v))
	case collective.BFloat16:
		g.h[i] = half.F32ToBF16(float32(v))
	}
}

// squaredNorm is Σ g[i]² of the stored (rounded) elements.
func (g *gradBuffer) squaredNorm() float64 {
	var sq float64
	switch g.dt {
	case collective.Float32:
		for _, v := range g.f32 {
			sq += float64(v) * float64(v)
		}
	case collective.Float64:
		for _, v := range g.f64 {
			sq += v * v
		}
	default:
		panic("squaredNorm: float32 and float64 only")
	}
	return sq
}

func (g *gradBuffer) buffer() collective.Buffer {
	switch g.dt {
	case collective.Float32:
		return collective.SliceBuffer(g.f32)
	case collective.Float64:
		return collective.SliceBuffer(g.f64)
	}
	b := collective.HostBuffer(g.dt, make([]byte, 2*len(g.h)))
	for i, v := range g.h {
		b.Host[2*i], b.Host[2*i+1] = byte(v), byte(v>>8)
	}
	return b
}

// The estimate through real sessions is unbiased on synthetic gradients of
// known noise: every micro-batch gradient is G + ε with G a constant vector
// and ε Gaussian of variance σ²/b per coordinate (b samples of per-sample
// variance σ²), so |G|² = D·μ² and var = tr(Σ)/M0 = D·σ²/M0. The side-car
// adds no collective: one per step, as many as the gradients need.
func TestGradientNoiseUnbiasedThroughSessions(t *testing.T) {
	const (
		dim    = 2000
		mu     = 0.05
		sigma  = 0.4
		b      = 8  // samples per micro-batch
		m0     = 16 // the initial batch
		steps  = 120
		relTol = 0.15
	)
	avg, sum := Reduction{}, Sum()
	tests := []struct {
		name  string
		p     int
		micro int // micro-batches per worker and step
		dt    collective.DType
		how   func(p int) Reduction
		// byNorm: the trainer takes the micro-batches' norms itself
		// (RecordMicroBatchNorm), as the language bindings do.
		byNorm bool
	}{
		{"two workers average float32", 2, 1, collective.Float32, func(int) Reduction { return avg }, false},
		{"three workers sum scaled by 1/p", 3, 1, collective.Float32, func(p int) Reduction { s := sum; s.Prescale = 1 / float64(p); return s }, false},
		{"two workers accumulating 3 float64", 2, 3, collective.Float64, func(int) Reduction { return avg }, false},
		{"two workers float16 with scales", 2, 1, collective.Float16, func(int) Reduction { return Reduction{Prescale: 2, Postscale: 0.5} }, false},
		{"two workers bfloat16", 2, 2, collective.BFloat16, func(int) Reduction { return avg }, false},
		{"two workers accumulating 2, norms from the trainer", 2, 2, collective.Float32, func(int) Reduction { return avg }, true},
		{"alone accumulating 3, norms from the trainer", 1, 3, collective.Float64, func(int) Reduction { return avg }, true},
		{"alone accumulating 2", 1, 2, collective.Float32, func(int) Reduction { return avg }, false},
		{"alone, consecutive steps", 1, 1, collective.Float32, func(int) Reduction { return avg }, false},
		{"alone, consecutive steps float64", 1, 1, collective.Float64, func(int) Reduction { return avg }, false},
		{"alone, consecutive steps float16 with scales", 1, 1, collective.Float16, func(int) Reduction { return Reduction{Prescale: 2, Postscale: 0.5} }, false},
		{"alone, consecutive steps bfloat16 summed", 1, 1, collective.BFloat16, func(int) Reduction { return sum }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sessions, counters := noiseWorld(t, tc.p, NoiseConfig{Measure: true, InitBatch: m0})
			global := tc.p * tc.micro * b
			joined := make([]int64, len(counters)) // entering the world ran collectives (the state)
			for i, c := range counters {
				joined[i] = c.n.Load()
			}
			onEachSession(t, sessions, func(ctx context.Context, rank int, s *Session) error {
				r := rand.New(rand.NewPCG(uint64(rank)+1, 99))
				grad, acc := newGradBuffer(tc.dt, dim), newGradBuffer(tc.dt, dim)
				mean := make([]float64, dim)
				for range steps {
					s.SetGlobalBatch(global)
					clear(mean)
					for range tc.micro {
						for j := range dim {
							v := mu + r.NormFloat64()*sigma/math.Sqrt(b)
							grad.set(j, v)
							mean[j] += v / float64(tc.micro)
						}
						switch {
						case tc.micro > 1 && tc.byNorm:
							s.RecordMicroBatchNorm(grad.squaredNorm())
						case tc.micro > 1:
							if err := s.RecordMicroBatch(grad.buffer()); err != nil {
								return err
							}
						}
					}
					for j, v := range mean {
						acc.set(j, v)
					}
					if err := s.Allreduce(ctx, tc.how(s.Size()), acc.buffer()); err != nil {
						return err
					}
					if err := s.Commit(ctx); err != nil {
						return err
					}
				}
				return nil
			})
			want := goodput.GradParams{Sqr: dim * mu * mu, Var: dim * sigma * sigma / m0}
			for i, s := range sessions {
				got, ok := s.GradientNoise()
				if !ok {
					t.Fatalf("worker %d: no estimate", i)
				}
				if math.Abs(got.Sqr/want.Sqr-1) > relTol || math.Abs(got.Var/want.Var-1) > relTol {
					t.Fatalf("worker %d: estimated %+v, want %+v within %.0f%%", i, got, want, 100*relTol)
				}
				if i == 0 {
					t.Logf("estimated |G|² %.4g (true %.4g), var %.4g (true %.4g)", got.Sqr, want.Sqr, got.Var, want.Var)
				}
				if n := counters[i].n.Load() - joined[i]; n != steps {
					t.Fatalf("worker %d ran %d collectives in %d steps", i, n, steps)
				}
			}
		})
	}
}

// What cannot be measured is not: gradients in device memory, a reduction
// other than a sum or an average, a step whose global batch nobody gave,
// and a step of fewer samples than micro-batches. Training goes on.
func TestGradientNoiseLeavesUnmeasurableSteps(t *testing.T) {
	var calls fakedevice.Counters
	tests := []struct {
		name    string
		global  int
		how     Reduction
		tensors func() []collective.Buffer
	}{
		{"device memory", 8, Reduction{}, func() []collective.Buffer {
			return []collective.Buffer{collective.SliceBuffer([]float32{1, 2}), fakedevice.New(make([]byte, 16), &calls).Buffer(collective.Float32)}
		}},
		{"max", 8, Reduction{Op: collective.Max}, func() []collective.Buffer { return []collective.Buffer{collective.SliceBuffer([]float32{1, 2})} }},
		{"no global batch", 0, Reduction{}, func() []collective.Buffer { return []collective.Buffer{collective.SliceBuffer([]float32{1, 2})} }},
		{"fewer samples than workers", 1, Reduction{}, func() []collective.Buffer { return []collective.Buffer{collective.SliceBuffer([]float32{1, 2})} }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sessions, _ := noiseWorld(t, 2, NoiseConfig{Measure: true})
			onEachSession(t, sessions, func(ctx context.Context, rank int, s *Session) error {
				for range 5 {
					s.SetGlobalBatch(tc.global)
					if err := s.Allreduce(ctx, tc.how, tc.tensors()...); err != nil {
						return err
					}
					if err := s.Commit(ctx); err != nil {
						return err
					}
				}
				if g, ok := s.GradientNoise(); ok {
					return fmt.Errorf("measured %+v", g)
				}
				return nil
			})
		})
	}
}

// recordingDecider is a decider that proposes a decision derived from a
// counter on rank 0 and records what every worker adopts.
type recordingDecider struct {
	mu        stdsync.Mutex
	proposals int
	adopted   []batchDecision // per committed step, zero when none
}

func (d *recordingDecider) propose(goodput.GradParams, bool) (batchDecision, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.proposals++
	n := d.proposals
	// Digits of every size, the largest values the side-car holds
	// included.
	switch n % 4 {
	case 1:
		return batchDecision{Micro: maxMicro, Accum: maxAccum, LRFactor: math.Ldexp(1<<(4*lrDigits)-1, -lrFraction)}, true
	case 2:
		return batchDecision{}, false
	}
	return batchDecision{Micro: 7*n + 1, Accum: n % 5, LRFactor: 1 + float64(n)/64}, true
}

func (d *recordingDecider) committed(c stepCommit) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !c.Decided {
		c.Decision = batchDecision{}
	}
	d.adopted = append(d.adopted, c.Decision)
}

// Rank 0's decision reaches every worker exactly, in the step it was sent,
// through every carrier dtype and scaling, and a step without one is seen as
// such everywhere.
func TestDecisionsReachEveryWorker(t *testing.T) {
	for _, dt := range []collective.DType{collective.Float32, collective.Float64, collective.Float16, collective.BFloat16} {
		for _, how := range []Reduction{{}, {Op: collective.Sum, Prescale: 1.0 / 3}, {Prescale: 0.1, Postscale: 7}} {
			t.Run(fmt.Sprintf("%v/%+v", dt, how), func(t *testing.T) {
				sessions, _ := noiseWorld(t, 3, NoiseConfig{Measure: true})
				deciders := make([]*recordingDecider, len(sessions))
				for i, s := range sessions {
					deciders[i] = &recordingDecider{}
					s.noise.setDecider(deciders[i])
				}
				const steps = 12
				onEachSession(t, sessions, func(ctx context.Context, rank int, s *Session) error {
					g := newGradBuffer(dt, 40)
					for step := range steps {
						for j := range 40 {
							g.set(j, float64((rank+j+step)%5))
						}
						if err := s.Allreduce(ctx, how, g.buffer()); err != nil {
							return err
						}
						if err := s.Commit(ctx); err != nil {
							return err
						}
					}
					return nil
				})
				var rank0 *recordingDecider
				for i, s := range sessions {
					if s.Rank() == 0 {
						rank0 = deciders[i]
					}
				}
				want := &recordingDecider{}
				var sent []batchDecision
				for range steps {
					d, ok := want.propose(goodput.GradParams{}, false)
					if !ok {
						d = batchDecision{}
					}
					sent = append(sent, d)
				}
				if rank0.proposals != steps {
					t.Fatalf("rank 0 was asked %d times in %d steps", rank0.proposals, steps)
				}
				for i, d := range deciders {
					if len(d.adopted) != steps {
						t.Fatalf("worker %d committed %d steps", i, len(d.adopted))
					}
					for s := range steps {
						if d.adopted[s] != sent[s] {
							t.Fatalf("worker %d, step %d: got %+v, rank 0 sent %+v", i, s+1, d.adopted[s], sent[s])
						}
					}
				}
			})
		}
	}
}

// The measurement's state travels with the job's: a worker that joins
// receives the estimator's averages and holds the same statistics.
func TestGradientNoiseStateReachesJoiner(t *testing.T) {
	sessions, _ := noiseWorld(t, 2, NoiseConfig{Measure: true, InitBatch: 8})
	onEachSession(t, sessions, func(ctx context.Context, rank int, s *Session) error {
		r := rand.New(rand.NewPCG(uint64(rank), 3))
		g := make([]float32, 100)
		for range 10 {
			for j := range g {
				g[j] = float32(0.1 + r.NormFloat64())
			}
			s.SetGlobalBatch(8)
			if err := s.Allreduce(ctx, Reduction{}, collective.SliceBuffer(g)); err != nil {
				return err
			}
			if err := s.Commit(ctx); err != nil {
				return err
			}
		}
		return nil
	})
	blob, err := sessions[0].noise.marshal()
	if err != nil {
		t.Fatal(err)
	}
	joiner, err := newGradNoise(NoiseConfig{Measure: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := joiner.unmarshal(blob); err != nil {
		t.Fatal(err)
	}
	want, _ := sessions[1].GradientNoise()
	joiner.mu.Lock()
	got, ok := joiner.params()
	joiner.mu.Unlock()
	if !ok || got != want {
		t.Fatalf("the joiner holds %+v (%v), the workers %+v", got, ok, want)
	}
	for _, bad := range []string{`{`, `{"init_batch":-1}`, `{"init_batch":4,"estimator":{"sqr_unbias":2}}`, `{"scale_exp":5000}`} {
		if err := joiner.unmarshal([]byte(bad)); err == nil {
			t.Errorf("state %s accepted", bad)
		}
	}
}
