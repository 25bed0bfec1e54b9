package heuristics

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Spec selects a heuristic by name with its parameters, as `gorovod run
// --heuristic NAME --heuristic-opt key=value` or a JSON configuration file
// gives it:
//
//	{"name": "all-of", "of": [
//	    {"name": "scaling-efficiency", "params": {"threshold": 0.2}},
//	    {"name": "utility-cost", "params": {"price_per_worker_hour": 2.5, "value_per_hour": 40}}]}
type Spec struct {
	Name   string          `json:"name"`
	Params json.RawMessage `json:"params,omitempty"`
	Of     []Spec          `json:"of,omitempty"` // the members of all-of and any-of
}

// Factory builds a heuristic from its spec; r builds the members of a
// composition.
type Factory func(r *Registry, s Spec) (Heuristic, error)

// Registry maps heuristic names to factories. NewRegistry holds the built-ins;
// a Go program embedding the engine registers its own beside them.
type Registry struct {
	factories map[string]Factory
	summaries map[string]string
}

// NewRegistry returns a registry holding the built-in heuristics.
func NewRegistry() *Registry {
	r := &Registry{factories: map[string]Factory{}, summaries: map[string]string{}}
	for _, b := range builtins() { // names unique: TestBuiltinNamesUnique
		r.factories[b.name], r.summaries[b.name] = b.factory, b.summary
	}
	return r
}

type builtin struct {
	name, summary string
	factory       Factory
}

func builtins() []builtin {
	return []builtin{
		{"hold", "never changes the world (measurements and straggler replacement only)", newHoldHeuristic},
		{"all-of", "acts only when every member heuristic asks for the same action (the smallest change)", newAllOf},
		{"any-of", "acts on the first member heuristic that does not hold", newAnyOf},
		{"scaling-efficiency", "grows while each added worker adds at least a threshold of a worker's throughput (Or et al.)", newScalingEfficiency},
		{"utility-cost", "grows or shrinks when the utility of finishing sooner exceeds the cost of the workers (Or et al.)", newUtilityCost},
		{"goodput", "picks the world size by predicted goodput (AdaptDL / Pollux: fitted throughput × statistical efficiency), per worker or against a price", newGoodput},
		{"fixed-schedule", "scales to given worker counts at given steps (tests and demos)", newFixedSchedule},
		{"exec", "runs an external program that reads the history as JSON and prints a decision", newExec},
	}
}

// Register adds a heuristic under name; names are unique.
func (r *Registry) Register(name, summary string, f Factory) error {
	if name == "" || f == nil {
		return errors.New("heuristics: Register needs a name and a factory")
	}
	if _, dup := r.factories[name]; dup {
		return fmt.Errorf("heuristics: %q is already registered", name)
	}
	r.factories[name], r.summaries[name] = f, summary
	return nil
}

// Names lists the registered heuristics, sorted.
func (r *Registry) Names() []string { return slices.Sorted(maps.Keys(r.factories)) }

// Summary is the one-line description of a registered heuristic.
func (r *Registry) Summary(name string) string { return r.summaries[name] }

// New builds the heuristic s names.
func (r *Registry) New(s Spec) (Heuristic, error) {
	f, ok := r.factories[s.Name]
	if !ok {
		return nil, fmt.Errorf("heuristics: unknown heuristic %q (known: %s)", s.Name, strings.Join(r.Names(), ", "))
	}
	h, err := f(r, s)
	if err != nil {
		return nil, fmt.Errorf("heuristics: %s: %w", s.Name, err)
	}
	return h, nil
}

// ParseSpec reads a JSON configuration (a Spec).
func ParseSpec(b []byte) (Spec, error) {
	var s Spec
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return Spec{}, fmt.Errorf("heuristics: configuration: %w", err)
	}
	if s.Name == "" {
		return Spec{}, errors.New(`heuristics: configuration has no "name"`)
	}
	return s, nil
}

// SpecFromOptions builds a spec from a name and key=value options (the
// command line's --heuristic-opt). A value that parses as JSON (a number, a
// boolean, a list) is taken as such, anything else as a string.
func SpecFromOptions(name string, opts []string) (Spec, error) {
	s := Spec{Name: name}
	if len(opts) == 0 {
		return s, nil
	}
	params := map[string]json.RawMessage{}
	for _, o := range opts {
		k, v, ok := strings.Cut(o, "=")
		if !ok || k == "" {
			return Spec{}, fmt.Errorf("heuristics: option %q is not key=value", o)
		}
		if json.Valid([]byte(v)) && v != "" {
			params[k] = json.RawMessage(v)
		} else {
			b, _ := json.Marshal(v)
			params[k] = b
		}
	}
	b, _ := json.Marshal(params)
	s.Params = b
	return s, nil
}

// DecodeParams decodes a spec's parameters into cfg (a pointer to a struct
// holding the defaults); unknown keys are an error, so a typo is not silently
// ignored.
func DecodeParams(raw json.RawMessage, cfg any) error {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(cfg); err != nil {
		return fmt.Errorf("parameters: %w", err)
	}
	return nil
}

// Duration is a time.Duration written as "1.5s" or "200ms" in configurations.
type Duration time.Duration

func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

type holdHeuristic struct{}

func newHoldHeuristic(_ *Registry, s Spec) (Heuristic, error) {
	if err := DecodeParams(s.Params, &struct{}{}); err != nil {
		return nil, err
	}
	return holdHeuristic{}, nil
}

func (holdHeuristic) Name() string { return "hold" }
func (holdHeuristic) Decide(context.Context, *History) (Decision, error) {
	return HoldBecause("the hold heuristic never changes the world"), nil
}

// composite combines member heuristics; every member sees every history.
type composite struct {
	name    string
	all     bool
	members []Heuristic
}

func newAllOf(r *Registry, s Spec) (Heuristic, error) { return newComposite(r, s, true) }
func newAnyOf(r *Registry, s Spec) (Heuristic, error) { return newComposite(r, s, false) }

func newComposite(r *Registry, s Spec, all bool) (Heuristic, error) {
	if len(s.Params) > 0 && string(bytes.TrimSpace(s.Params)) != "{}" {
		return nil, errors.New(`takes no parameters, only "of"`)
	}
	if len(s.Of) == 0 {
		return nil, errors.New(`needs member heuristics in "of"`)
	}
	c := &composite{name: s.Name, all: all}
	for _, m := range s.Of {
		h, err := r.New(m)
		if err != nil {
			return nil, err
		}
		c.members = append(c.members, h)
	}
	return c, nil
}

func (c *composite) Name() string {
	names := make([]string, len(c.members))
	for i, m := range c.members {
		names[i] = m.Name()
	}
	return c.name + "(" + strings.Join(names, ", ") + ")"
}

// OnReady passes the engine's wake-up on to the members that work in the
// background.
func (c *composite) OnReady(ready func()) {
	for _, m := range c.members {
		if b, ok := m.(Background); ok {
			b.OnReady(ready)
		}
	}
}

// Decide asks every member (so each keeps observing), then combines: any-of
// takes the first member that does not hold; all-of acts only when every
// member asks for the same action, by the smallest count, and replaces only a
// worker every member names.
func (c *composite) Decide(ctx context.Context, h *History) (Decision, error) {
	ds := make([]Decision, len(c.members))
	for i, m := range c.members {
		d, err := m.Decide(ctx, h)
		if err != nil {
			return Decision{}, fmt.Errorf("%s: %w", m.Name(), err)
		}
		if err := d.Validate(); err != nil {
			return Decision{}, fmt.Errorf("%s: %w", m.Name(), err)
		}
		ds[i] = d
	}
	reasons := make([]string, len(ds))
	numbers := map[string]float64{}
	for i, d := range ds {
		reasons[i] = c.members[i].Name() + ": " + d.String()
		for k, v := range d.Numbers {
			numbers[c.members[i].Name()+"."+k] = v
		}
	}
	why := strings.Join(reasons, "; ")
	if !c.all {
		for _, d := range ds {
			if d.Action != Hold {
				d.Reason, d.Numbers = why, numbers
				return d, nil
			}
		}
		return Decision{Action: Hold, Reason: why, Numbers: numbers, Settled: allSettled(ds)}, nil
	}
	first := ds[0]
	for _, d := range ds[1:] {
		if d.Action != first.Action || (d.Action == Replace && d.Worker != first.Worker) {
			return Decision{Action: Hold, Reason: "members disagree: " + why, Numbers: numbers}, nil
		}
		first.Count = min(first.Count, d.Count)
	}
	first.Reason, first.Numbers, first.Settled = why, numbers, allSettled(ds)
	return first, nil
}

func allSettled(ds []Decision) bool {
	for _, d := range ds {
		if !d.Settled {
			return false
		}
	}
	return true
}
