package heuristics

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// PluginProtocol is the version of the exec heuristic's protocol, sent as
// PluginHistory.Protocol. Fields may be added to the history within a
// version, so plugins must ignore fields they do not know; a change that
// breaks existing plugins gets a new version.
const PluginProtocol = 1

// PluginHistory is the JSON object the exec heuristic writes to a plugin's
// standard input: History in a form that needs no Go to read. Times are RFC
// 3339 in UTC with at most microseconds (what Python's
// datetime.fromisoformat reads from 3.11 on); the *_seconds fields give the
// same information as plain numbers.
type PluginHistory struct {
	Protocol       int       `json:"protocol"`
	Now            time.Time `json:"now,omitzero"`
	Start          time.Time `json:"start,omitzero"` // when the first world formed
	ElapsedSeconds float64   `json:"elapsed_seconds"`
	Step           int64     `json:"step"`
	TotalSteps     int64     `json:"total_steps"`     // 0: unknown
	RemainingSteps int64     `json:"remaining_steps"` // 0: unknown (or done)
	MinWorkers     int       `json:"min_workers"`
	MaxWorkers     int       `json:"max_workers"` // 0: no bound
	Workers        int       `json:"workers"`     // the current world size
	// Members are the current world's workers in rank order: the names a
	// replace decision may give.
	Members []string `json:"members"`
	// Periods, oldest first; the last is the current world.
	Periods []PluginPeriod `json:"periods"`
	// Measurements holds the newest period with at least one steady step
	// of each world size, by ascending size.
	Measurements []PluginMeasurement `json:"measurements"`
}

// PluginPeriod is one world epoch of the job.
type PluginPeriod struct {
	Epoch   uint64    `json:"epoch"`
	Workers int       `json:"workers"`
	Members []string  `json:"members"`
	Start   time.Time `json:"start,omitzero"`
	End     time.Time `json:"end,omitzero"` // absent for the current world
	// DurationSeconds is End (or now) minus Start.
	DurationSeconds float64 `json:"duration_seconds"`
	// SteadySteps counts the steps measured after the world's warm-up;
	// the figures below are 0 while it is 0.
	SteadySteps int `json:"steady_steps"`
	// Throughput is samples per second over the steady steps (steps per
	// second when the trainer reports no samples).
	Throughput      float64 `json:"throughput"`
	StepTimeSeconds float64 `json:"step_time_seconds"` // median
	GlobalBatch     int     `json:"global_batch"`      // median; 0: not reported
	// ComputeSeconds is each member's median time per steady step spent
	// computing rather than waiting for the others: a straggler stands out.
	ComputeSeconds map[string]float64 `json:"compute_seconds"`
	// Steps are the steady steps themselves, only with the heuristic's
	// include_steps parameter.
	Steps []PluginStep `json:"steps,omitempty"`
}

// PluginStep is one steady step of a period.
type PluginStep struct {
	Step        int64   `json:"step"`
	GlobalBatch int     `json:"global_batch"`
	TimeSeconds float64 `json:"time_seconds"`
}

// PluginMeasurement summarizes a period, as Measurement does.
type PluginMeasurement struct {
	Workers         int     `json:"workers"`
	Epoch           uint64  `json:"epoch"`
	Steps           int     `json:"steps"` // the steady steps it is based on
	Throughput      float64 `json:"throughput"`
	StepTimeSeconds float64 `json:"step_time_seconds"`
	GlobalBatch     int     `json:"global_batch"`
}

// pluginTime drops what the documented format does not carry: the location
// and the digits past microseconds, which some readers reject.
func pluginTime(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.UTC().Truncate(time.Microsecond)
}

func newPluginHistory(h *History, includeSteps bool) PluginHistory {
	ph := PluginHistory{
		Protocol:       PluginProtocol,
		Now:            pluginTime(h.Now),
		Start:          pluginTime(h.Start),
		Step:           h.Step,
		TotalSteps:     h.TotalSteps,
		RemainingSteps: h.Remaining(),
		MinWorkers:     h.MinWorkers,
		MaxWorkers:     h.MaxWorkers,
		Workers:        h.Workers(),
		Members:        []string{},
		Periods:        make([]PluginPeriod, 0, len(h.Periods)),
		Measurements:   []PluginMeasurement{},
	}
	if !h.Start.IsZero() && !h.Now.IsZero() {
		ph.ElapsedSeconds = h.Now.Sub(h.Start).Seconds()
	}
	if c := h.Current(); c != nil {
		ph.Members = append(ph.Members, c.Members...)
	}
	newest := map[int]PluginMeasurement{}
	for _, p := range h.Periods {
		m := p.Measure()
		pp := PluginPeriod{
			Epoch:           p.Epoch,
			Workers:         p.Workers(),
			Members:         append([]string{}, p.Members...),
			Start:           pluginTime(p.Start),
			End:             pluginTime(p.End),
			SteadySteps:     m.Steps,
			Throughput:      m.Throughput,
			StepTimeSeconds: m.StepTime.Seconds(),
			GlobalBatch:     m.GlobalBatch,
			ComputeSeconds:  medianCompute(p),
		}
		end := p.End
		if end.IsZero() {
			end = h.Now
		}
		if !p.Start.IsZero() && !end.IsZero() && end.After(p.Start) {
			pp.DurationSeconds = end.Sub(p.Start).Seconds()
		}
		if includeSteps {
			for _, s := range p.Steady() {
				pp.Steps = append(pp.Steps, PluginStep{Step: s.Step, GlobalBatch: s.GlobalBatch, TimeSeconds: s.Time.Seconds()})
			}
		}
		ph.Periods = append(ph.Periods, pp)
		if m.Steps > 0 {
			// Periods are oldest first, so a later one overwrites.
			newest[m.Workers] = PluginMeasurement{
				Workers: m.Workers, Epoch: m.Epoch, Steps: m.Steps,
				Throughput: m.Throughput, StepTimeSeconds: m.StepTime.Seconds(), GlobalBatch: m.GlobalBatch,
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(newest)) {
		ph.Measurements = append(ph.Measurements, newest[k])
	}
	return ph
}

// medianCompute is each member's median compute time over the period's
// steady steps; a member missing from a step's report is not counted there.
func medianCompute(p *Period) map[string]float64 {
	per := map[string][]time.Duration{}
	for _, s := range p.Steady() {
		for name, d := range s.Compute {
			per[name] = append(per[name], d)
		}
	}
	out := make(map[string]float64, len(per))
	for name, ds := range per {
		slices.Sort(ds)
		out[name] = ds[len(ds)/2].Seconds()
	}
	return out
}

// parsePluginDecision reads a plugin's standard output: exactly one JSON
// object with Decision's fields, nothing else but white space. The decoding
// is strict because a misspelt field silently dropped would make the engine
// act on a decision the plugin did not mean.
func parsePluginDecision(out []byte, members []string) (Decision, error) {
	text := bytes.TrimSpace(out)
	if len(text) == 0 {
		return Decision{}, errors.New("no output (want one JSON decision object)")
	}
	if text[0] != '{' {
		return Decision{}, errors.New("not a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(text))
	dec.DisallowUnknownFields()
	var d Decision
	if err := dec.Decode(&d); err != nil {
		return Decision{}, err
	}
	if rest := bytes.TrimSpace(text[dec.InputOffset():]); len(rest) > 0 {
		return Decision{}, errors.New("more output after the decision object")
	}
	if err := d.Validate(); err != nil {
		return Decision{}, errors.New(strings.TrimPrefix(err.Error(), "heuristics: "))
	}
	if d.Worker != "" && !slices.Contains(members, d.Worker) {
		return Decision{}, fmt.Errorf("worker %q is not a member of the current world %v", d.Worker, members)
	}
	return d, nil
}
