package hosts

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/cmd/gorovod/e2e"
	"github.com/gorovod/gorovod/internal/testing/testhosts"
)

// TestTransitionBreakdown runs the planned transitions of
// TestMeasureHostTransitions (a graceful leave, then a join) with the
// library's debug logs on, and splits each one into its phases from the
// timestamps of the driver's and the workers' log lines (all processes share
// the machine's clock):
//
//	leave: SIGTERM → the leaver's loop sees the signal → the driver sees it
//	       leaving → the driver proposes → the last worker adopts the epoch →
//	       the last worker reaches the step boundary → the last worker has
//	       connected the new world and taken its state → first step printed
//	join:  SIGUSR1 → the joiner's process runs (its first log line) → the
//	       driver sees it ready → proposes → ... as above
//
// Set GOROVOD_MEASURE_TRANSITIONS=1 to run it; GOROVOD_MEASURE_NP (default
// 16) and GOROVOD_MEASURE_ROUNDS (default 3) choose the size and repetitions,
// GOROVOD_MEASURE_DIR keeps the launcher's log of each run there. The debug
// logs cost time themselves (every line crosses ssh and the launcher): the
// totals are for the breakdown, TestMeasureHostTransitions' for the record.
func TestTransitionBreakdown(t *testing.T) {
	if os.Getenv("GOROVOD_MEASURE_TRANSITIONS") == "" {
		t.Skip("a measurement: set GOROVOD_MEASURE_TRANSITIONS=1")
	}
	np, rounds := 16, 3
	if v := os.Getenv("GOROVOD_MEASURE_NP"); v != "" {
		np, _ = strconv.Atoi(v)
	}
	if v := os.Getenv("GOROVOD_MEASURE_ROUNDS"); v != "" {
		rounds, _ = strconv.Atoi(v)
	}
	n, hs := testhosts.NewHosts(t, testhosts.Config{Prefix: "mhbrk", SSHPort: 2222}, 5)
	var list []string
	for _, x := range hs[1:] {
		list = append(list, fmt.Sprintf("%s:%d", x.Name, np/4+1))
	}
	h := measuredHostJob(t, n, hs[0], []string{"--np", fmt.Sprint(np), "--min-np", "2", "--log-level", "debug", "-H", strings.Join(list, ",")},
		"--steps", "1000000", "--json", "--samples", "100000", "--batch", fmt.Sprint(4*np),
		"--model-size", "20000", "--compute", "1ms")
	h.WaitFor(t, fmt.Sprintf("a %d-worker world", np), 3*time.Minute, func(l []e2e.TrainerLine) bool { return e2e.LastSize(l) == np })
	if dir := os.Getenv("GOROVOD_MEASURE_DIR"); dir != "" {
		t.Cleanup(func() {
			_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("breakdown-%d.log", np)), []byte(h.LogText()), 0o644)
		})
	}
	size := np
	for round := range rounds {
		victim := trainerOnLastHost(t, hs)
		s := h.Step()
		start := time.Now()
		_ = syscall.Kill(victim, syscall.SIGTERM)
		h.WaitFor(t, "the smaller world", time.Minute, e2e.SizeAfter(s, size-1))
		size--
		t.Logf("np %d round %d leave: %s", np, round, breakdown(t, h, start, s, size, "leave"))
		s = h.Step()
		start = time.Now()
		_ = h.Cmd.Process.Signal(syscall.SIGUSR1)
		h.WaitFor(t, "the larger world", time.Minute, e2e.SizeAfter(s, size+1))
		size++
		t.Logf("np %d round %d join: %s", np, round, breakdown(t, h, start, s, size, "join"))
	}
}

// trainerOnLastHost is a trainer process on the last host that has one.
func trainerOnLastHost(t *testing.T, hs []*testhosts.Host) int {
	t.Helper()
	for i := len(hs) - 1; i > 0; i-- {
		pids, err := hs[i].Processes()
		if err != nil {
			t.Fatal(err)
		}
		for _, pid := range pids {
			if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); strings.HasPrefix(string(cmd), e2e.Synthetic+"\x00") {
				return pid
			}
		}
	}
	t.Fatal("no trainer on any host")
	return 0
}

// breakdown splits the transition that began at start, at step, and ended
// in a world of size workers into phases, from the log. The workers' lines
// reach the launcher, and the launcher's the test, later than the world's
// first step does: it first waits (a few seconds at most) for the new
// world's first step from every member and for every member's "entered
// world" line.
func breakdown(t *testing.T, h *e2e.RunJobHarness, start time.Time, step int64, size int, kind string) string {
	t.Helper()
	firstCommit := h.FirstCommit(step, size, 5*time.Second)
	h.WaitEntered(start, size, 5*time.Second)
	lines := e2e.ParseLogLines(h.LogText(), start)
	// The new world: the first epoch the driver proposed after start with this size.
	var proposed *e2e.LogLine
	for i, l := range lines {
		if l.Worker < 0 && l.Msg == "proposed" && l.Attrs["size"] == strconv.Itoa(size) {
			proposed = &lines[i]
			break
		}
	}
	if proposed == nil {
		return "no proposal found in the log"
	}
	ep := proposed.Attrs["epoch"]
	ms := func(at time.Time) string {
		if at.IsZero() {
			return "?"
		}
		return fmt.Sprintf("%.1f", float64(at.Sub(start).Microseconds())/1000)
	}
	first := func(pred func(e2e.LogLine) bool) (at time.Time) {
		for _, l := range lines {
			if pred(l) {
				return l.At
			}
		}
		return
	}
	// The latest matching line by its timestamp: the workers' lines reach
	// the launcher's log interleaved, not in the order they were written.
	last := func(pred func(e2e.LogLine) bool) (at time.Time, n int) {
		for _, l := range lines {
			if pred(l) {
				if l.At.After(at) {
					at = l.At
				}
				n++
			}
		}
		return
	}
	var parts []string
	if kind == "leave" {
		parts = append(parts, "signal seen "+ms(first(func(l e2e.LogLine) bool { return strings.HasPrefix(l.Msg, "leave signal") })))
		parts = append(parts, "driver sees leaving "+ms(first(func(l e2e.LogLine) bool {
			return l.Worker < 0 && strings.HasPrefix(l.Msg, "membership: member") && l.Attrs["state"] == "leaving"
		})))
	} else {
		parts = append(parts, "joiner's first line "+ms(first(func(l e2e.LogLine) bool { return l.Worker >= 0 && l.Msg == "membership: joined" })))
		parts = append(parts, "driver sees ready "+ms(first(func(l e2e.LogLine) bool {
			return l.Worker < 0 && strings.HasPrefix(l.Msg, "membership: member") && l.Attrs["state"] == "ready" && !l.At.Before(start)
		})))
	}
	parts = append(parts, "proposed "+ms(proposed.At))
	adoptFirst := first(func(l e2e.LogLine) bool { return l.Msg == "newer epoch" && l.Attrs["epoch"] == ep })
	adoptLast, adopted := last(func(l e2e.LogLine) bool { return l.Msg == "newer epoch" && l.Attrs["epoch"] == ep })
	parts = append(parts, fmt.Sprintf("adopted %s–%s (%d)", ms(adoptFirst), ms(adoptLast), adopted))
	// Where each member learnt that it moves: the end of the gradient
	// allreduce whose tag carried the new epoch (logged by newer revisions
	// only), and its step boundary, after the trainer's own work between
	// the two (since_allreduce). A member that had only the epoch's number
	// from the tag waits for its content (known below the epoch) before
	// "entered world"'s clock starts.
	var carryStart, carryEnd []time.Time
	var sinceAllreduce []float64
	fromTag := 0
	for _, l := range lines {
		switch {
		case l.Msg == "a gradient allreduce carried a newer epoch" && l.Attrs["newest"] == ep:
			took, _ := time.ParseDuration(l.Attrs["took"])
			carryStart = append(carryStart, l.At.Add(-took))
			carryEnd = append(carryEnd, l.At)
		case strings.HasPrefix(l.Msg, "step boundary") && l.Attrs["newest"] == ep:
			if d, err := time.ParseDuration(l.Attrs["since_allreduce"]); err == nil {
				sinceAllreduce = append(sinceAllreduce, float64(d.Microseconds())/1000)
			}
			if l.Attrs["known"] != ep {
				fromTag++
			}
		}
	}
	if len(carryEnd) > 0 {
		parts = append(parts, fmt.Sprintf("carrying allreduce began %s–%s, ended %s–%s (%d)",
			ms(slices.MinFunc(carryStart, time.Time.Compare)), ms(slices.MaxFunc(carryStart, time.Time.Compare)),
			ms(slices.MinFunc(carryEnd, time.Time.Compare)), ms(slices.MaxFunc(carryEnd, time.Time.Compare)), len(carryEnd)))
	}
	if len(sinceAllreduce) > 0 {
		parts = append(parts, fmt.Sprintf("boundary after it max %.3f ms, %d without the epoch's content", slices.Max(sinceAllreduce), fromTag))
	}
	var bounds, memberBounds, entered []time.Time
	var connects, states, cpus []float64
	joinerCPU, joinerConnect := -1.0, -1.0
	for _, l := range lines {
		if l.Msg != "entered world" || l.Attrs["epoch"] != ep {
			continue
		}
		took, _ := time.ParseDuration(l.Attrs["took"])
		bounds = append(bounds, l.At.Add(-took))
		if l.Attrs["links_kept"] != "0" { // not a joiner, whose entry begins with its epoch
			memberBounds = append(memberBounds, l.At.Add(-took))
		}
		entered = append(entered, l.At)
		if d, err := time.ParseDuration(l.Attrs["connect"]); err == nil {
			connects = append(connects, float64(d.Microseconds())/1000)
			// At a join, the joiner is the member that kept no link.
			if kind == "join" && l.Attrs["links_kept"] == "0" {
				joinerConnect = connects[len(connects)-1]
			}
		}
		if d, err := time.ParseDuration(l.Attrs["state"]); err == nil {
			states = append(states, float64(d.Microseconds())/1000)
		}
		// The CPU the entry cost the worker (logged by newer revisions
		// only); at a join, the joiner is the member that kept no link.
		if d, err := time.ParseDuration(l.Attrs["cpu"]); err == nil {
			cpus = append(cpus, float64(d.Microseconds())/1000)
			if kind == "join" && l.Attrs["links_kept"] == "0" {
				joinerCPU = cpus[len(cpus)-1]
			}
		}
	}
	if len(bounds) > 0 {
		parts = append(parts, fmt.Sprintf("boundary %s–%s", ms(slices.MinFunc(bounds, time.Time.Compare)), ms(slices.MaxFunc(bounds, time.Time.Compare))))
		parts = append(parts, fmt.Sprintf("entered %s–%s (%d)", ms(slices.MinFunc(entered, time.Time.Compare)), ms(slices.MaxFunc(entered, time.Time.Compare)), len(entered)))
	}
	if len(connects) > 0 {
		c := fmt.Sprintf("connect max %.1f ms", slices.Max(connects))
		if joinerConnect >= 0 {
			c += fmt.Sprintf(" (joiner %.1f ms)", joinerConnect)
		}
		parts = append(parts, c+fmt.Sprintf(", state max %.1f ms", slices.Max(states)))
	}
	if len(cpus) > 0 {
		slices.Sort(cpus)
		c := fmt.Sprintf("CPU per member's entry median %.1f ms, max %.1f ms, sum %.1f ms", cpus[len(cpus)/2], cpus[len(cpus)-1], sumOf(cpus))
		if joinerCPU >= 0 {
			c += fmt.Sprintf(" (joiner %.1f ms)", joinerCPU)
		}
		parts = append(parts, c)
	}
	h.Mu.Lock()
	var firstStep time.Time
	for _, l := range h.Lines {
		if l.At.After(start) && l.Size == size && strconv.FormatUint(l.WorldEpoch, 10) == ep && (firstStep.IsZero() || l.At.Before(firstStep)) {
			firstStep = l.At
		}
	}
	h.Mu.Unlock()
	parts = append(parts, "first step "+ms(firstCommit)+" (its line reached the test at "+ms(firstStep)+")")
	// The gossip layer's streams (each a TCP connection, taken by
	// memberlist and logged at debug level) that the transition cost the
	// machine: epochs, acknowledgements, goodbyes, statistics, looks for
	// gone members.
	toDriver, toWorkers := 0, 0
	for _, l := range lines {
		if l.Msg != "Stream connection" || l.At.Before(start) || l.At.After(firstCommit) {
			continue
		}
		if l.Worker < 0 {
			toDriver++
		} else {
			toWorkers++
		}
	}
	parts = append(parts, fmt.Sprintf("streams taken until then: the driver %d, the workers %d", toDriver, toWorkers))
	if len(memberBounds) > 0 {
		// What the members lost: from the first one's step boundary (the
		// end of its last step in the old world) to the first step of the
		// new world.
		parts = append(parts, fmt.Sprintf("members' pause %.1f ms", float64(firstCommit.Sub(slices.MinFunc(memberBounds, time.Time.Compare)).Microseconds())/1000))
	}
	// The step time before the transition: median interval between the
	// steps the lowest worker index printed in the second before it.
	h.Mu.Lock()
	var at []time.Time
	for _, l := range h.Lines {
		if l.Worker == 0 && l.At.Before(start) && l.At.After(start.Add(-time.Second)) {
			at = append(at, l.At)
		}
	}
	h.Mu.Unlock()
	if os.Getenv("GOROVOD_MEASURE_DIR") != "" {
		h.Mu.Lock()
		for _, l := range h.Lines {
			if l.Worker == 0 && l.At.After(start.Add(-100*time.Millisecond)) && l.At.Before(firstStep.Add(50*time.Millisecond)) {
				t.Logf("  worker 0 step %d world %d size %d at %s", l.Step, l.WorldEpoch, l.Size, ms(l.At))
			}
		}
		h.Mu.Unlock()
	}
	// How far apart the members commit an ordinary step: the spread of the
	// commit times of each of the 10 steps before the transition (the
	// commit follows the step's gradient allreduce by microseconds).
	h.Mu.Lock()
	commits := map[int64][]int64{}
	for _, l := range h.Lines {
		if l.Step > step-10 && l.Step <= step && l.TimeUS > 0 {
			commits[l.Step] = append(commits[l.Step], l.TimeUS)
		}
	}
	h.Mu.Unlock()
	oldSize := size - 1 // the world a join left
	if kind == "leave" {
		oldSize = size + 1
	}
	var spreads []float64
	for _, c := range commits {
		if len(c) >= oldSize {
			spreads = append(spreads, float64(slices.Max(c)-slices.Min(c))/1000)
		}
	}
	if len(spreads) > 0 {
		slices.Sort(spreads)
		parts = append(parts, fmt.Sprintf("(commit spread of a step before: median %.1f ms, max %.1f ms)", spreads[len(spreads)/2], spreads[len(spreads)-1]))
	}
	if len(at) > 2 {
		gaps := make([]float64, len(at)-1)
		for i := range gaps {
			gaps[i] = float64(at[i+1].Sub(at[i]).Microseconds()) / 1000
		}
		slices.Sort(gaps)
		parts = append(parts, fmt.Sprintf("(step time before: median %.1f ms)", gaps[len(gaps)/2]))
	}
	return "ms after the signal: " + strings.Join(parts, ", ")
}

func sumOf(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s
}
