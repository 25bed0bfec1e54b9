package benchmark

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/inproc"
)

func TestParseSize(t *testing.T) {
	cases := []struct {
		in   string
		want int
		ok   bool
	}{
		{"4096", 4096, true}, {"4K", 4 << 10, true}, {"64M", 64 << 20, true}, {"1G", 1 << 30, true},
		{"256KiB", 256 << 10, true}, {"8kb", 8 << 10, true}, {"", 0, false}, {"-1", 0, false}, {"4X", 0, false},
	}
	for _, c := range cases {
		got, err := ParseSize(c.in)
		if (err == nil) != c.ok || (c.ok && got != c.want) {
			t.Errorf("ParseSize(%q) = %d, %v", c.in, got, err)
		}
	}
}

func TestSizes(t *testing.T) {
	got := Sizes(4<<10, 64<<20, 64)
	want := []int{4 << 10, 256 << 10, 16 << 20}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v want %v", got, want)
	}
}

func TestRunEveryOpVerifies(t *testing.T) {
	for _, p := range []int{1, 2, 3} {
		for _, op := range Ops() {
			for _, dt := range []collective.DType{collective.Float32, collective.BFloat16, collective.Int64, collective.Uint8} {
				t.Run(fmt.Sprintf("p=%d/%s/%v", p, op, dt), func(t *testing.T) {
					spec := Spec{Op: op, DType: dt, Reduce: collective.Sum, Sizes: []int{0, 96, 4096, 1 << 18}, Warmup: 1, Iters: 3}
					results := runAll(t, p, spec)
					if len(results) != len(spec.Sizes) {
						t.Fatalf("%d results for %d sizes", len(results), len(spec.Sizes))
					}
					for _, r := range results {
						if !r.Correct {
							t.Fatalf("result not verified: %+v", r)
						}
						if r.NP != p || r.Op != op || r.TimeUS <= 0 {
							t.Fatalf("bad result %+v", r)
						}
					}
				})
			}
		}
	}
}

func runAll(t *testing.T, p int, spec Spec) []Result {
	t.Helper()
	return runAllWith(t, p, spec, collective.DefaultConfig())
}

// TestResultNamesTheChunk checks that a result reports the chunk the
// communicator ran with, not the configured 0 that means "choose".
func TestResultNamesTheChunk(t *testing.T) {
	cases := []struct {
		configured, want int
	}{
		{0, collective.DefaultChunkBytes}, // loopback links in one process suggest none
		{4096, 4096},
		{1 << 20, 1 << 20},
	}
	for _, c := range cases {
		t.Run(fmt.Sprint(c.configured), func(t *testing.T) {
			cfg := collective.DefaultConfig()
			cfg.ChunkBytes = c.configured
			spec := Spec{Op: "allreduce", DType: collective.Float32, Reduce: collective.Sum, Sizes: []int{1 << 16}, Warmup: 1, Iters: 1}
			for _, r := range runAllWith(t, 2, spec, cfg) {
				if r.ChunkBytes != c.want {
					t.Fatalf("configured %d: result reports chunk %d, want %d", c.configured, r.ChunkBytes, c.want)
				}
			}
		})
	}
}

func runAllWith(t *testing.T, p int, spec Spec, cfg collective.Config) []Result {
	t.Helper()
	mesh := inproc.Mesh(inproc.Config{JobID: "bench", Epoch: 1}, p)
	// A bound against a hang, not a speed check: five ranks replicating
	// 64 MiB took 7.5 s under -race on an idle 2-core machine and ran past
	// 30 s while CI's other packages loaded it.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var mu sync.Mutex
	var results []Result
	var wg sync.WaitGroup
	errs := make([]error, p)
	for r := range p {
		c, err := collective.NewFromLinks(transport.World{JobID: "bench", Epoch: 1, Rank: r, Addrs: make([]string, p)}, mesh[r], cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		wg.Go(func() {
			errs[r] = Run(ctx, c, spec, func(res Result) error {
				if r == 0 {
					mu.Lock()
					results = append(results, res)
					mu.Unlock()
				}
				return nil
			})
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return results
}

// TestBatchSizedBySlowestRank: the batch of collectives per sample is sized
// by the slowest rank's warm-up. A replicate's holder that feeds no stripe
// returns at once; sized by its time, the batch would run a transfer of
// milliseconds a thousand times per sample.
func TestBatchSizedBySlowestRank(t *testing.T) {
	for _, tc := range []struct {
		name    string
		p       int
		sources int
	}{
		{"one of two holders feeds the receiver", 3, 1},
		{"two of four", 5, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := Spec{Op: "replicate", DType: collective.Float32, Sizes: []int{64 << 20}, Warmup: 1, Iters: 1,
				BatchTime: time.Millisecond}
			cfg := collective.DefaultConfig()
			cfg.StripeSources = tc.sources
			// Copying 64 MiB takes milliseconds on any machine, more than
			// the batch time: one replicate per sample.
			for _, r := range runAllWith(t, tc.p, spec, cfg) {
				if !r.Correct || r.Batch != 1 {
					t.Fatalf("result %+v: want a verified result of batch 1", r)
				}
			}
		})
	}
}
