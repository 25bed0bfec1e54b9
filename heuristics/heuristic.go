package heuristics

import (
	"context"
	"fmt"
	"strings"
)

// Action is what a decision asks of the engine.
type Action int

const (
	Hold    Action = iota // keep the world as it is
	Grow                  // add Count workers
	Shrink                // remove Count workers
	Replace               // start a replacement for Worker, then remove it
)

func (a Action) String() string {
	switch a {
	case Hold:
		return "hold"
	case Grow:
		return "grow"
	case Shrink:
		return "shrink"
	case Replace:
		return "replace"
	}
	return fmt.Sprintf("action(%d)", int(a))
}

// MarshalText encodes an action by name (for JSON logs and the exec protocol).
func (a Action) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// UnmarshalText decodes an action name.
func (a *Action) UnmarshalText(b []byte) error {
	switch strings.ToLower(string(b)) {
	case "hold", "":
		*a = Hold
	case "grow":
		*a = Grow
	case "shrink":
		*a = Shrink
	case "replace":
		*a = Replace
	default:
		return fmt.Errorf("unknown action %q (want hold, grow, shrink or replace)", b)
	}
	return nil
}

// Decision is a heuristic's answer: an action, its size, and why.
type Decision struct {
	Action Action `json:"action"`
	// Count is how many workers to add or remove (Grow, Shrink).
	Count int `json:"count,omitempty"`
	// Worker is the member to replace (Replace).
	Worker string `json:"worker,omitempty"`
	// Reason explains the decision to a person reading the log.
	Reason string `json:"reason"`
	// Numbers are the figures behind it (throughputs, efficiencies, costs),
	// logged with the decision.
	Numbers map[string]float64 `json:"numbers,omitempty"`
	// Settled says the heuristic has found its target and will hold there.
	Settled bool `json:"settled,omitempty"`
}

// HoldBecause is a Hold decision with a reason.
func HoldBecause(format string, args ...any) Decision {
	return Decision{Action: Hold, Reason: fmt.Sprintf(format, args...)}
}

// Validate checks a decision's fields against its action.
func (d Decision) Validate() error {
	switch d.Action {
	case Hold:
	case Grow, Shrink:
		if d.Count < 1 {
			return fmt.Errorf("heuristics: %s decision needs a positive count, got %d", d.Action, d.Count)
		}
	case Replace:
		if d.Worker == "" {
			return fmt.Errorf("heuristics: replace decision names no worker")
		}
	default:
		return fmt.Errorf("heuristics: unknown action %d", int(d.Action))
	}
	return nil
}

func (d Decision) String() string {
	var b strings.Builder
	b.WriteString(d.Action.String())
	switch d.Action {
	case Grow, Shrink:
		fmt.Fprintf(&b, " by %d", d.Count)
	case Replace:
		fmt.Fprintf(&b, " %s", d.Worker)
	}
	if d.Reason != "" {
		b.WriteString(": ")
		b.WriteString(d.Reason)
	}
	return b.String()
}

// Heuristic decides, from what has been measured of the job, whether its
// world should grow, shrink, replace a worker or hold. The engine calls Decide
// from one goroutine, every few steps, only while no earlier decision is still
// being carried out; a heuristic may keep state between calls.
//
// The history's current world need not be the one a heuristic asked for: the
// engine clamps decisions to the job's bounds, another heuristic of a
// composition may have acted, and workers fail. Decide must work from
// History.Workers(), not from what it expected.
type Heuristic interface {
	Name() string
	Decide(ctx context.Context, h *History) (Decision, error)
}

// Background is implemented by a heuristic that works beside the engine, as
// the exec heuristic runs its program: Decide starts the work and holds, and
// a later call returns the answer. The engine hands it a function to call once
// an answer is ready, and then evaluates at once instead of at the next
// reported step. Compositions pass it on to their members.
type Background interface {
	Heuristic
	// OnReady sets the function to call when an answer is ready; it may be
	// called from any goroutine and never blocks.
	OnReady(ready func())
}
