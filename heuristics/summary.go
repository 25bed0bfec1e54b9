package heuristics

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Status is a snapshot of the job for a progress display.
type Status struct {
	Step, TotalSteps int64
	Workers          int
	Epoch            uint64
	// Throughput of the current world (0 until measured), samples per second
	// or steps per second when trainers report no samples.
	Throughput float64
	Samples    bool // Throughput is in samples
	Acting     string
}

// Status describes the job now; safe to call from any goroutine.
func (e *Engine) Status() Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := Status{Step: e.history.Step, TotalSteps: e.history.TotalSteps}
	if cur := e.history.Current(); cur != nil {
		m := cur.Measure()
		s.Workers, s.Epoch, s.Throughput, s.Samples = cur.Workers(), cur.Epoch, m.Throughput, m.GlobalBatch > 0
	}
	if a := e.pending; a != nil {
		s.Acting = a.d.Action.String()
	}
	return s
}

// Span is the part of a job spent in one world.
type Span struct {
	Epoch    uint64  `json:"world_epoch"`
	Workers  int     `json:"workers"`
	StartS   float64 `json:"start_s"` // since the first world formed
	Duration float64 `json:"duration_s"`
	Steps    int     `json:"steps"` // steps every member reported
}

// Summary is the account of a run: worker count over time, throughput per
// world size, and the decisions taken.
type Summary struct {
	Elapsed    float64       `json:"elapsed_s"`
	Steps      int64         `json:"steps"`
	Timeline   []Span        `json:"timeline"`
	Throughput []Measurement `json:"throughput"` // the newest measurement of each world size
	Events     []Event       `json:"events"`     // decisions and their outcomes
	// EarlierWorlds and EarlierEvents count the oldest worlds and events
	// no longer kept: a job keeps its newest 1024 worlds (and each world
	// size's best newest measurement) and 1024 events, however often its
	// world changes.
	EarlierWorlds int `json:"earlier_worlds,omitempty"`
	EarlierEvents int `json:"earlier_events,omitempty"`
	// SettledAfter is when the heuristic found its target (seconds since
	// the first world; negative when it never did), at which step and size.
	SettledAfter   float64 `json:"settled_after_s"`
	SettledStep    int64   `json:"settled_step,omitempty"`
	SettledWorkers int     `json:"settled_workers,omitempty"`
	Replacements   int     `json:"replacements"`
}

// Summary describes the run so far; safe to call from any goroutine.
func (e *Engine) Summary() Summary {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now()
	s := Summary{Steps: e.history.Step, Events: slices.Clone(e.events), Replacements: e.replaced, SettledAfter: -1,
		EarlierWorlds: e.earlier, EarlierEvents: e.earlierEvents}
	if !e.history.Start.IsZero() {
		s.Elapsed = now.Sub(e.history.Start).Seconds()
	}
	byWorkers := map[int]Measurement{}
	for _, p := range e.history.Periods {
		end := p.End
		if end.IsZero() {
			end = now
		}
		s.Timeline = append(s.Timeline, Span{Epoch: p.Epoch, Workers: p.Workers(), StartS: p.Start.Sub(e.history.Start).Seconds(),
			Duration: end.Sub(p.Start).Seconds(), Steps: p.Complete()})
		if m := p.Measure(); m.Steps > 0 {
			byWorkers[m.Workers] = m
		}
	}
	for _, m := range byWorkers {
		s.Throughput = append(s.Throughput, m)
	}
	slices.SortFunc(s.Throughput, func(a, b Measurement) int { return a.Workers - b.Workers })
	if e.settled != nil {
		s.SettledAfter, s.SettledStep, s.SettledWorkers = e.settled.Elapsed, e.settled.Step, e.settled.Workers
	}
	return s
}

// WriteText prints the summary for a person.
func (s Summary) WriteText(w io.Writer) {
	fmt.Fprintf(w, "autoscaling summary: %d steps in %.1f s\n", s.Steps, s.Elapsed)
	fmt.Fprintf(w, "  workers over time:\n")
	if s.EarlierWorlds > 0 {
		fmt.Fprintf(w, "    (%d earlier worlds not kept)\n", s.EarlierWorlds)
	}
	for _, sp := range s.Timeline {
		fmt.Fprintf(w, "    %7.1f s  world %-3d %2d workers  %6.1f s  %d steps\n", sp.StartS, sp.Epoch, sp.Workers, sp.Duration, sp.Steps)
	}
	if len(s.Throughput) > 0 {
		unit := "steps/s"
		if s.Throughput[0].GlobalBatch > 0 {
			unit = "samples/s"
		}
		fmt.Fprintf(w, "  throughput per world size (%s, newest measurement):\n", unit)
		for _, m := range s.Throughput {
			fmt.Fprintf(w, "    %2d workers  %10.1f  step %7.2f ms  over %d steps\n", m.Workers, m.Throughput, float64(m.StepTime)/1e6, m.Steps)
		}
	}
	var acted []string
	if s.EarlierEvents > 0 {
		acted = append(acted, fmt.Sprintf("    (%d earlier events not kept)", s.EarlierEvents))
	}
	for _, ev := range s.Events {
		acted = append(acted, fmt.Sprintf("    %7.1f s  step %-6d %-9s %s", ev.Elapsed, ev.Step, ev.Kind, ev.Message))
	}
	if len(acted) > 0 {
		fmt.Fprintf(w, "  decisions:\n%s\n", strings.Join(acted, "\n"))
	}
	if s.SettledAfter >= 0 {
		fmt.Fprintf(w, "  settled at %d workers after %.1f s (step %d)\n", s.SettledWorkers, s.SettledAfter, s.SettledStep)
	}
	if s.Replacements > 0 {
		fmt.Fprintf(w, "  stragglers replaced: %d\n", s.Replacements)
	}
}
