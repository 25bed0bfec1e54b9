package heuristics

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ScheduleEntry asks for Workers from committed step Step on.
type ScheduleEntry struct {
	Step    int64 `json:"step"`
	Workers int   `json:"workers"`
}

// schedule reads either a JSON list of entries or the command line's
// "step:workers,step:workers" string (--heuristic-opt schedule=0:2,50:4).
type schedule []ScheduleEntry

func (s *schedule) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var str string
		if err := json.Unmarshal(b, &str); err != nil {
			return err
		}
		v, err := parseSchedule(str)
		if err != nil {
			return err
		}
		*s = v
		return nil
	}
	var entries []ScheduleEntry
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&entries); err != nil {
		return fmt.Errorf(`schedule must be a list of {"step": N, "workers": N} or a string "step:workers,...": %w`, err)
	}
	*s = entries
	return nil
}

func parseSchedule(str string) (schedule, error) {
	var s schedule
	for item := range strings.SplitSeq(str, ",") {
		item = strings.TrimSpace(item)
		st, w, ok := strings.Cut(item, ":")
		if !ok {
			return nil, fmt.Errorf("schedule entry %q is not step:workers", item)
		}
		step, err := strconv.ParseInt(strings.TrimSpace(st), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("schedule entry %q: step is not an integer", item)
		}
		workers, err := strconv.Atoi(strings.TrimSpace(w))
		if err != nil {
			return nil, fmt.Errorf("schedule entry %q: workers is not an integer", item)
		}
		s = append(s, ScheduleEntry{Step: step, Workers: workers})
	}
	return s, nil
}

func (s schedule) validate() error {
	if len(s) == 0 {
		return errors.New(`needs a schedule, e.g. "0:2,50:4" or [{"step": 0, "workers": 2}]`)
	}
	for i, e := range s {
		if e.Step < 0 {
			return fmt.Errorf("schedule entry %d: step must be ≥ 0, got %d", i, e.Step)
		}
		if e.Workers < 1 {
			return fmt.Errorf("schedule entry %d (step %d): workers must be ≥ 1, got %d", i, e.Step, e.Workers)
		}
		if i > 0 && e.Step <= s[i-1].Step {
			if e.Step == s[i-1].Step {
				return fmt.Errorf("schedule has step %d twice", e.Step)
			}
			return fmt.Errorf("schedule is not sorted by step: %d after %d", e.Step, s[i-1].Step)
		}
	}
	return nil
}

type scheduleConfig struct {
	Schedule schedule `json:"schedule"`
}

// fixedSchedule scales to the worker count the schedule gives for the
// current step, whatever is measured.
type fixedSchedule struct {
	entries schedule
}

func newFixedSchedule(_ *Registry, s Spec) (Heuristic, error) {
	var cfg scheduleConfig
	if err := DecodeParams(s.Params, &cfg); err != nil {
		return nil, err
	}
	if err := cfg.Schedule.validate(); err != nil {
		return nil, err
	}
	return &fixedSchedule{entries: cfg.Schedule}, nil
}

func (*fixedSchedule) Name() string { return "fixed-schedule" }

func (f *fixedSchedule) Decide(_ context.Context, h *History) (Decision, error) {
	k := h.Workers()
	if k == 0 {
		return HoldBecause("no world yet"), nil
	}
	i := -1
	for j, e := range f.entries {
		if e.Step <= h.Step {
			i = j
		}
	}
	if i < 0 {
		return HoldBecause("the schedule starts at step %d (now %d)", f.entries[0].Step, h.Step), nil
	}
	e := f.entries[i]
	target := h.Clamp(e.Workers)
	last := i == len(f.entries)-1
	nums := map[string]float64{"step": float64(h.Step), "workers": float64(k), "target": float64(target)}
	want := fmt.Sprintf("step %d: the schedule gives %d workers from step %d", h.Step, e.Workers, e.Step)
	if target != e.Workers {
		want += fmt.Sprintf(" (%d within the worker bounds)", target)
	}
	switch {
	case k < target:
		return Decision{Action: Grow, Count: target - k, Numbers: nums,
			Reason: fmt.Sprintf("%s; growing from %d by %d", want, k, target-k)}, nil
	case k > target:
		return Decision{Action: Shrink, Count: k - target, Numbers: nums,
			Reason: fmt.Sprintf("%s; shrinking from %d by %d", want, k, k-target)}, nil
	}
	d := Decision{Action: Hold, Settled: last, Numbers: nums, Reason: want + "; holding"}
	if last {
		d.Reason = want + "; the schedule's last entry, settled"
	}
	return d, nil
}
