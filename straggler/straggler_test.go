package straggler

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// world makes one step's compute times: every worker takes base, except the
// slow ones, which take base×factor.
func world(n int, base time.Duration, slow map[int]float64) (map[string]int, map[string]time.Duration) {
	samples, compute := map[string]int{}, map[string]time.Duration{}
	for i := range n {
		w := fmt.Sprintf("w%d", i)
		samples[w] = 16
		c := base
		if f, ok := slow[i]; ok {
			c = time.Duration(float64(base) * f)
		}
		compute[w] = c
	}
	return samples, compute
}

func TestDetector(t *testing.T) {
	cfg := DefaultConfig() // alpha 0.1, threshold 0.8, sustain 10, warmup 3
	tests := []struct {
		name    string
		workers int
		slow    map[int]float64
		steps   int
		// wantAt is the first observed step (1-based) at which w<slowest>
		// is flagged, 0 for never.
		wantAt int
	}{
		// Relative throughput 1/2 from the first counted step (the average
		// starts at the first ratio): below threshold at steps 4..13, so
		// flagged at warmup 3 + sustain 10 = 13.
		{"x2 straggler", 4, map[int]float64{3: 2}, 40, 13},
		{"x4 straggler", 4, map[int]float64{3: 4}, 40, 13},
		// 1/1.33 = 0.75 < 0.8: flagged too.
		{"x1.33 straggler", 4, map[int]float64{3: 1.33}, 40, 13},
		// 1/1.2 = 0.83 stays above 0.8: never.
		{"x1.2 is not a straggler", 4, map[int]float64{3: 1.2}, 60, 0},
		{"uniform world", 3, nil, 60, 0},
		// Two workers: the median is their mean, 0.75 of the fast one's rate;
		// the slow one is at 0.5/0.75 = 0.67.
		{"two workers", 2, map[int]float64{1: 2}, 40, 13},
		{"one worker is never judged", 1, nil, 40, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := NewDetector(cfg)
			if err != nil {
				t.Fatal(err)
			}
			got := 0
			for step := 1; step <= tc.steps && got == 0; step++ {
				s, c := world(tc.workers, 10*time.Millisecond, tc.slow)
				for _, f := range d.Observe(1, int64(step), s, c) {
					if got == 0 {
						got = step
						if f.Worker != fmt.Sprintf("w%d", tc.workers-1) || f.Relative >= cfg.Threshold || f.Below < cfg.Sustain {
							t.Errorf("flag %+v", f)
						}
					}
				}
			}
			if got != tc.wantAt {
				t.Errorf("flagged at step %d, want %d", got, tc.wantAt)
			}
		})
	}
}

// A slowdown shorter than the sustain window is forgiven, and a world change
// restarts the count: the first steps of a new world are never judged.
func TestDetectorTransientsAndWorldChanges(t *testing.T) {
	cfg := DefaultConfig()
	d, _ := NewDetector(cfg)
	step := int64(0)
	run := func(epoch uint64, n int, slow map[int]float64) []Flag {
		var out []Flag
		for range n {
			step++
			s, c := world(4, 10*time.Millisecond, slow)
			out = append(out, d.Observe(epoch, step, s, c)...)
		}
		return out
	}
	if f := run(1, 20, nil); len(f) > 0 {
		t.Fatalf("uniform world flagged %v", f)
	}
	// A ×3 slowdown for 5 steps: the average goes 1 → 0.93 → 0.87 → 0.80 →
	// 0.73 → 0.67 and needs 5 more steps to climb back over 0.8 (0.70, 0.73,
	// 0.76, 0.78, 0.80): under the threshold 7 steps in a row, not 10.
	if f := run(1, 5, map[int]float64{2: 3}); len(f) > 0 {
		t.Fatalf("transient flagged %v", f)
	}
	if f := run(1, 30, nil); len(f) > 0 {
		t.Fatalf("recovered worker flagged %v", f)
	}
	// 9 slow steps (below from the first counted one), then a new world:
	// the count starts again, so 9 + 9 slow steps never reach 10 in a row.
	if f := run(1, 9, map[int]float64{2: 2}); len(f) > 0 {
		t.Fatalf("flagged before the sustain window: %v", f)
	}
	if f := run(2, 3+9, map[int]float64{2: 2}); len(f) > 0 {
		t.Fatalf("a world change did not restart the window: %v", f)
	}
	if f := run(2, 1, map[int]float64{2: 2}); len(f) != 1 || f[0].Worker != "w2" {
		t.Fatalf("want w2 flagged on the 10th slow step of the new world, got %v", f)
	}
	if r, ok := d.Relative("w2"); !ok || r > 0.6 {
		t.Errorf("Relative(w2) = %v, %v", r, ok)
	}
}

func TestDetectorIgnoresZeroCompute(t *testing.T) {
	d, _ := NewDetector(Config{Alpha: 0.1, Threshold: 0.8, Sustain: 1})
	samples := map[string]int{"a": 1, "b": 1, "c": 1}
	compute := map[string]time.Duration{"a": 0, "b": time.Millisecond, "c": time.Millisecond}
	if f := d.Observe(1, 1, samples, compute); len(f) != 0 {
		t.Fatalf("flagged %v", f)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Config)
	}{
		{"negative alpha", func(c *Config) { c.Alpha = -0.1 }},
		{"alpha above 1", func(c *Config) { c.Alpha = 1.5 }},
		{"threshold 1", func(c *Config) { c.Threshold = 1 }},
		{"negative threshold", func(c *Config) { c.Threshold = -0.5 }},
		{"negative sustain", func(c *Config) { c.Sustain = -1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.mod(&c)
			if _, err := NewDetector(c); !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("NewDetector: %v, want ErrInvalidConfig", err)
			}
		})
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	// Zero fields are the defaults; negative ones mean none.
	if got := (Config{}).withDefaults(); got != DefaultConfig() {
		t.Fatalf("Config{} means %+v, want %+v", got, DefaultConfig())
	}
	if got := (Config{Warmup: -1, Backoff: -1, MaxReplacements: -1}).withDefaults(); got.Warmup != 0 || got.Backoff != 0 || got.MaxReplacements != 0 {
		t.Fatalf("negative warm-up, back-off and limit mean %+v, want none", got)
	}
	p := NewPolicy(Config{Backoff: -1, MaxReplacements: -1})
	for i := range 10 {
		if ok, why := p.Allow(fmt.Sprint("w", i), int64(i)); !ok {
			t.Fatalf("replacement %d refused without back-off or limit: %s", i, why)
		}
		p.Replaced(fmt.Sprint("w", i), fmt.Sprint("w", i+1), int64(i))
	}
}

func TestPolicyBacksOff(t *testing.T) {
	cfg := DefaultConfig() // backoff 100 steps, doubling; at most 3 per slot
	p := NewPolicy(cfg)
	steps := []struct {
		worker      string
		step        int64
		allow       bool
		replacement string
		why         string
	}{
		{"a", 50, true, "a1", ""},
		// a1 fills a's slot, replaced once at 50: allowed from 150.
		{"a1", 149, false, "", "backing off until step 150"},
		{"a1", 150, true, "a2", ""},
		// Twice: 200 steps.
		{"a2", 349, false, "", "until step 350"},
		{"b", 349, true, "", ""}, // another slot is not affected
		{"a2", 350, true, "a3", ""},
		{"a3", 10000, false, "", "limit 3"},
	}
	for _, s := range steps {
		ok, why := p.Allow(s.worker, s.step)
		if ok != s.allow || !strings.Contains(why, s.why) {
			t.Fatalf("Allow(%s, %d) = %v %q, want %v %q", s.worker, s.step, ok, why, s.allow, s.why)
		}
		if ok && s.replacement != "" {
			p.Replaced(s.worker, s.replacement, s.step)
		}
	}
}
