package e2e

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/internal/testing/testhosts"
)

// WaitExit waits for the launcher to end and fails the test unless it
// Exited with status 0.
func (h *RunJobHarness) WaitExit(t *testing.T, within time.Duration) {
	t.Helper()
	select {
	case err := <-h.Exited:
		if err != nil {
			log := h.LogText()
			t.Fatalf("gorovod run: %v; the launcher log's last 8 KiB:\n%s", err, log[max(0, len(log)-8<<10):])
		}
	case <-time.After(within):
		h.Mu.Lock()
		defer h.Mu.Unlock()
		t.Fatalf("job did not finish (last step %d); launcher log:\n%s", MaxStep(h.Lines), h.Log.String())
	}
}

// Step is the newest step any worker of h's job committed.
func (h *RunJobHarness) Step() int64 {
	h.Mu.Lock()
	defer h.Mu.Unlock()
	return MaxStep(h.Lines)
}

// FirstCommit is when the first step after step of a world of size was
// committed, by the clock of the worker that committed it first (the
// trainer's time_us; zero when it prints none). It waits, at most within,
// for that world's lines from size workers: the line that reached the test
// first is not always the one committed first, as each worker's output
// takes its own way through the launcher.
func (h *RunJobHarness) FirstCommit(step int64, size int, within time.Duration) time.Time {
	deadline := time.After(within)
	for {
		var first int64
		workers := map[int]bool{}
		h.Mu.Lock()
		for _, l := range h.Lines {
			if l.Step > step && l.Size == size && l.TimeUS > 0 {
				workers[l.Worker] = true
				if first == 0 || l.TimeUS < first {
					first = l.TimeUS
				}
			}
		}
		h.Mu.Unlock()
		if len(workers) >= size {
			return time.UnixMicro(first)
		}
		select {
		case <-h.Notify:
		case <-deadline:
			if first == 0 {
				return time.Time{}
			}
			return time.UnixMicro(first)
		}
	}
}

// HostJob starts `gorovod run` on the first of the hosts (the head) with
// workers on the others over ssh, as a user of those machines would.
func HostJob(t *testing.T, n *testhosts.Net, head *testhosts.Host, hostArgs []string, trainerArgs ...string) *RunJobHarness {
	t.Helper()
	return HostJobWith(t, n, head, hostArgs, Synthetic, trainerArgs...)
}

// HostJobWith is HostJob with the trainer program named.
func HostJobWith(t *testing.T, n *testhosts.Net, head *testhosts.Host, hostArgs []string, trainer string, trainerArgs ...string) *RunJobHarness {
	t.Helper()
	return StartRunJobArgv(t, HostJobArgv(t, n, head, hostArgs, trainer, trainerArgs...))
}

// HostJobArgv is HostJobWith's command line: `gorovod run` in head's
// namespace with the hosts' ssh options.
func HostJobArgv(t *testing.T, n *testhosts.Net, head *testhosts.Host, hostArgs []string, trainer string, trainerArgs ...string) []string {
	t.Helper()
	return HostJobArgvWith(t, n, head, Binary, hostArgs, trainer, trainerArgs...)
}

// HostJobArgvWith is HostJobArgv with the gorovod program named.
func HostJobArgvWith(t *testing.T, n *testhosts.Net, head *testhosts.Host, gorovod string, hostArgs []string, trainer string, trainerArgs ...string) []string {
	t.Helper()
	prefix, err := head.Exec()
	if err != nil {
		t.Fatal(err)
	}
	// --start-timeout before hostArgs, so that a caller's own wins.
	argv := append(prefix, gorovod, "run", "--start-timeout", "30")
	argv = append(argv, hostArgs...)
	argv = append(argv, "-p", fmt.Sprint(n.SSHPort()), "-i", n.ClientKey(),
		"--ssh-option", "User=root", "--ssh-option", "UserKnownHostsFile="+n.KnownHostsFile(),
		"--ssh-option", "StrictHostKeyChecking=yes", "--ssh-option", "GlobalKnownHostsFile=/dev/null",
		"--", trainer)
	return append(argv, trainerArgs...)
}

// CheckOneWorldPerStep fails if two worlds with no member in common
// committed the same step: a split brain, two halves of the job training
// apart (one of them rolled back when they met again). Worlds are told
// apart by their number and the workers that logged in them; two worlds
// under one number show as more workers than its size.
func CheckOneWorldPerStep(t *testing.T, lines []TrainerLine, log string) {
	t.Helper()
	workers := map[uint64]map[int]bool{} // each world's workers, over all its steps
	size := map[uint64]int{}
	for _, l := range lines {
		if workers[l.WorldEpoch] == nil {
			workers[l.WorldEpoch] = map[int]bool{}
		}
		workers[l.WorldEpoch][l.Worker] = true
		size[l.WorldEpoch] = max(size[l.WorldEpoch], l.Size)
	}
	for e, ws := range workers {
		if len(ws) > size[e] {
			t.Fatalf("world epoch %d of %d workers was logged by %d workers %v: two worlds under one number", e, size[e], len(ws), slices.Sorted(maps.Keys(ws)))
		}
	}
	byStep := map[int64][]uint64{}
	for _, l := range lines {
		if !slices.Contains(byStep[l.Step], l.WorldEpoch) {
			byStep[l.Step] = append(byStep[l.Step], l.WorldEpoch)
		}
	}
	for step, es := range byStep {
		for i, a := range es {
			for _, b := range es[i+1:] {
				disjoint := true
				for w := range workers[a] {
					disjoint = disjoint && !workers[b][w]
				}
				if disjoint {
					t.Fatalf("step %d was committed by two worlds with no member in common: epoch %d %v and epoch %d %v; the worlds:\n%s\nthe decisions:\n%s",
						step, a, slices.Sorted(maps.Keys(workers[a])), b, slices.Sorted(maps.Keys(workers[b])), DescribeWorlds(lines), Decisions(log))
				}
			}
		}
	}
}

// Decisions are the lines of a launcher log that record the epoch
// protocol's decisions.
func Decisions(log string) string {
	var b strings.Builder
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "msg=proposed") || strings.Contains(l, "no quorum") || strings.Contains(l, "takes over") ||
			strings.Contains(l, "removed from the next world") || strings.Contains(l, "worker gone") || strings.Contains(l, "entered world") {
			b.WriteString(l)
			b.WriteString("\n")
		}
	}
	return b.String()
}

// DescribeWorlds lists, per world epoch, its size and each worker's first
// and last step in it and when the worker logged them.
func DescribeWorlds(lines []TrainerLine) string {
	type span struct {
		first, last     int64
		firstAt, lastAt time.Time
	}
	spans := map[uint64]map[int]*span{}
	size := map[uint64]int{}
	for _, l := range lines {
		if spans[l.WorldEpoch] == nil {
			spans[l.WorldEpoch] = map[int]*span{}
		}
		size[l.WorldEpoch] = max(size[l.WorldEpoch], l.Size)
		sp := spans[l.WorldEpoch][l.Worker]
		if sp == nil {
			sp = &span{first: l.Step, firstAt: l.At}
			spans[l.WorldEpoch][l.Worker] = sp
		}
		sp.last, sp.lastAt = l.Step, l.At
	}
	var b strings.Builder
	for _, e := range slices.Sorted(maps.Keys(spans)) {
		fmt.Fprintf(&b, "epoch %d (size %d):", e, size[e])
		for _, w := range slices.Sorted(maps.Keys(spans[e])) {
			sp := spans[e][w]
			fmt.Fprintf(&b, " [%d] steps %d-%d at %s-%s", w, sp.first, sp.last, sp.firstAt.Format("15:04:05.000"), sp.lastAt.Format("15:04:05.000"))
		}
		b.WriteString("\n")
	}
	return b.String()
}
