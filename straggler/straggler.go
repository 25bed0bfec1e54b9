package straggler

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// Config tunes detection and replacement. A zero field means its default
// (DefaultConfig); where zero is a setting of its own (no warm-up, no
// back-off, no limit), a negative value says so.
type Config struct {
	// Alpha weighs the newest step in the moving average of a worker's
	// relative throughput.
	Alpha float64
	// Threshold: a worker whose average relative throughput stays below it is
	// a straggler.
	Threshold float64
	// Sustain is how many consecutive steps the average must stay below
	// Threshold.
	Sustain int
	// Warmup steps after a world change are not counted (negative: none).
	Warmup int
	// Backoff is how many steps must pass before a slot whose replacement
	// was itself flagged is replaced again; it doubles with each further
	// replacement of the slot (negative: no back-off).
	Backoff int64
	// MaxReplacements bounds the replacements of one slot (negative: no
	// limit).
	MaxReplacements int
}

// ErrInvalidConfig is wrapped by every error about a Config out of range.
var ErrInvalidConfig = errors.New("straggler: invalid configuration")

// DefaultConfig returns Or et al.'s detection settings and a back-off that
// retries a slot at most three times.
func DefaultConfig() Config {
	return Config{Alpha: 0.1, Threshold: 0.8, Sustain: 10, Warmup: 3, Backoff: 100, MaxReplacements: 3}
}

// withDefaults fills the zero fields and resolves the negative ones.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Alpha == 0 {
		c.Alpha = d.Alpha
	}
	if c.Threshold == 0 {
		c.Threshold = d.Threshold
	}
	if c.Sustain == 0 {
		c.Sustain = d.Sustain
	}
	switch {
	case c.Warmup == 0:
		c.Warmup = d.Warmup
	case c.Warmup < 0:
		c.Warmup = 0
	}
	switch {
	case c.Backoff == 0:
		c.Backoff = d.Backoff
	case c.Backoff < 0:
		c.Backoff = 0
	}
	switch {
	case c.MaxReplacements == 0:
		c.MaxReplacements = d.MaxReplacements
	case c.MaxReplacements < 0:
		c.MaxReplacements = 0 // below: 0 is no limit
	}
	return c
}

// Validate reports a setting out of range, as an error wrapping
// ErrInvalidConfig.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Alpha <= 0 || c.Alpha > 1:
		return fmt.Errorf("%w: alpha %v must be in (0, 1]", ErrInvalidConfig, c.Alpha)
	case c.Threshold <= 0 || c.Threshold >= 1:
		return fmt.Errorf("%w: threshold %v must be in (0, 1)", ErrInvalidConfig, c.Threshold)
	case c.Sustain < 1:
		return fmt.Errorf("%w: sustain %d must be at least 1 step", ErrInvalidConfig, c.Sustain)
	}
	return nil
}

// Flag reports a straggler.
type Flag struct {
	Worker string
	// Relative is the worker's average throughput relative to the median.
	Relative float64
	// Below is how many consecutive steps it has been under the threshold.
	Below int
	Step  int64
}

func (f Flag) String() string {
	return fmt.Sprintf("%s runs at %.2f of the median throughput (moving average, %d steps below threshold)", f.Worker, f.Relative, f.Below)
}

type score struct {
	avg   float64
	below int
}

// Detector tracks the workers of the current world.
type Detector struct {
	cfg    Config
	epoch  uint64
	seen   int // steps of this world observed
	scores map[string]*score
}

// NewDetector returns a detector; cfg must be valid.
func NewDetector(cfg Config) (*Detector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Detector{cfg: cfg.withDefaults(), scores: map[string]*score{}}, nil
}

// Observe feeds one complete step of world epoch: each member's samples and
// compute time (samples 0 when the trainer reports none: throughput is then
// steps per compute second). It returns the workers flagged at this step:
// those whose average has been below the threshold for Sustain steps.
func (d *Detector) Observe(epoch uint64, step int64, samples map[string]int, compute map[string]time.Duration) []Flag {
	if epoch != d.epoch {
		d.epoch, d.seen = epoch, 0
		clear(d.scores)
	}
	d.seen++
	if d.seen <= d.cfg.Warmup || len(compute) < 2 {
		return nil
	}
	rates := make(map[string]float64, len(compute))
	for w, c := range compute {
		if c <= 0 {
			continue // no compute measured (a step of waiting only): nothing to judge
		}
		work := float64(samples[w])
		if work == 0 {
			work = 1
		}
		rates[w] = work / c.Seconds()
	}
	if len(rates) < 2 {
		return nil
	}
	med := median(rates)
	if med <= 0 {
		return nil
	}
	var flags []Flag
	for _, w := range sortedKeys(rates) {
		rel := rates[w] / med
		s, ok := d.scores[w]
		if !ok {
			s = &score{avg: rel}
			d.scores[w] = s
		} else {
			s.avg += d.cfg.Alpha * (rel - s.avg)
		}
		if s.avg < d.cfg.Threshold {
			s.below++
		} else {
			s.below = 0
		}
		if s.below >= d.cfg.Sustain {
			flags = append(flags, Flag{Worker: w, Relative: s.avg, Below: s.below, Step: step})
		}
	}
	return flags
}

// Relative returns a worker's current average relative throughput.
func (d *Detector) Relative(worker string) (float64, bool) {
	s, ok := d.scores[worker]
	if !ok {
		return 0, false
	}
	return s.avg, true
}

func median(m map[string]float64) float64 {
	v := make([]float64, 0, len(m))
	for _, x := range m {
		v = append(v, x)
	}
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

func sortedKeys(m map[string]float64) []string {
	k := make([]string, 0, len(m))
	for w := range m {
		k = append(k, w)
	}
	slices.Sort(k)
	return k
}

// Policy rations replacements: it remembers which slot every worker fills
// (a replacement inherits its straggler's) and how often each was replaced.
type Policy struct {
	cfg   Config
	slot  map[string]int // worker → slot
	slots []slotState
}

type slotState struct {
	replaced int
	last     int64 // step of the last replacement
}

// NewPolicy returns a policy with no history.
func NewPolicy(cfg Config) *Policy { return &Policy{cfg: cfg.withDefaults(), slot: map[string]int{}} }

// Allow says whether worker may be replaced at step, and why not.
func (p *Policy) Allow(worker string, step int64) (bool, string) {
	i, ok := p.slot[worker]
	if !ok {
		return true, ""
	}
	s := p.slots[i]
	if p.cfg.MaxReplacements > 0 && s.replaced >= p.cfg.MaxReplacements {
		return false, fmt.Sprintf("its slot was replaced %d times already (limit %d): the slowness follows the slot, not the worker", s.replaced, p.cfg.MaxReplacements)
	}
	wait := p.cfg.Backoff << min(s.replaced-1, 20)
	if next := s.last + wait; step < next {
		return false, fmt.Sprintf("its slot was replaced %d time(s), last at step %d; backing off until step %d", s.replaced, s.last, next)
	}
	return true, ""
}

// Replaced records that replacement took old's place at step.
func (p *Policy) Replaced(old, replacement string, step int64) {
	i, ok := p.slot[old]
	if !ok {
		i = len(p.slots)
		p.slots = append(p.slots, slotState{})
	}
	p.slots[i].replaced++
	p.slots[i].last = step
	delete(p.slot, old)
	p.slot[replacement] = i
}
