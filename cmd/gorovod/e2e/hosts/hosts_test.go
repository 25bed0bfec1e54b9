package hosts

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/cmd/gorovod/e2e"
	"github.com/gorovod/gorovod/internal/testing/testhosts"
)

// sinceMS is t's time after start in ms, "?" for the zero time.
func sinceMS(start, t time.Time) string {
	if t.IsZero() {
		return "?"
	}
	return fmt.Sprintf("%.1f ms", float64(t.Sub(start).Microseconds())/1000)
}

// TestPausedWorkerRejoins is issue 12's first report: a worker paused
// (SIGSTOP) long enough for the others to go on without it, then resumed
// (SIGCONT), must not fail the job. It comes back as a new member, the
// world grows back to 3, training ends with exit status 0 and every
// invariant holds.
func TestPausedWorkerRejoins(t *testing.T) {
	const samples, steps = 1200, 500
	h := e2e.StartRunJob(t, "--np", "3", "--min-np", "2", "--", e2e.Synthetic,
		"--steps", fmt.Sprint(steps), "--json", "--log-samples", "--samples", fmt.Sprint(samples), "--batch", "24",
		"--model-size", "20000", "--compute", "2ms")
	h.WaitFor(t, "step 20", 60*time.Second, func(l []e2e.TrainerLine) bool { return e2e.MaxStep(l) >= 20 })
	s := h.Step()
	pid := h.Pid(t, 1)
	paused := time.Now()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	h.WaitFor(t, "a 2-worker world while worker 1 is paused", 60*time.Second, e2e.SizeAfter(s, 2))
	t.Logf("paused worker left out: 2-worker steps after %v", time.Since(paused))
	// Paused at least 5 s in all, as the case (d).
	select {
	case <-time.After(time.Until(paused.Add(5 * time.Second))):
	case err := <-h.Exited:
		t.Fatalf("job ended while worker 1 was paused: %v\n%s", err, h.LogText())
	}
	s = h.Step()
	resumed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	h.WaitFor(t, "worker 1 back in a 3-worker world", 60*time.Second, func(l []e2e.TrainerLine) bool {
		for _, x := range l {
			if x.Worker == 1 && x.Step > s && x.Size == 3 {
				return true
			}
		}
		return false
	})
	t.Logf("resumed worker trains again after %v", time.Since(resumed))
	h.WaitExit(t, 2*time.Minute)
	log := h.LogText()
	if !strings.Contains(log, "came back as a new member") {
		t.Errorf("the summary does not say that worker 1 came back:\n%s", log[max(0, len(log)-4<<10):])
	}
	h.Mu.Lock()
	defer h.Mu.Unlock()
	e2e.CheckElasticInvariantsSteps(t, h.Lines, samples, steps)
}

// measuredHostJob is e2e.HostJob for a measurement: its launcher is gorovod
// built without the race detector (e2e.PlainLauncher). Its workers have 120 s
// to start, not the default 30 s: 16 of them started over ssh at once on a
// 2-core machine can take longer, and one that does gets its host
// blacklisted with the rest of its workers, so that the world never
// reaches the size the measurement waits for (a 16-worker
// TestTransitionBreakdown failed so: "worker 14 ... did not start within
// 30s"). The start is not part of what is measured.
func measuredHostJob(t *testing.T, n *testhosts.Net, head *testhosts.Host, hostArgs []string, trainerArgs ...string) *e2e.RunJobHarness {
	t.Helper()
	hostArgs = append([]string{"--start-timeout", "120"}, hostArgs...)
	return e2e.StartRunJobArgv(t, e2e.HostJobArgvWith(t, n, head, e2e.PlainLauncher(t), hostArgs, e2e.Synthetic, trainerArgs...))
}

// TestRunAcrossHosts runs a job over namespaced hosts with sshd (-H, -p, -i,
// --ssh-option): 2 hosts × 2 slots, workers started over ssh, gossip and
// collectives over the hosts' own addresses. Then every process of one host
// is killed with kill -9 (its sshd too): the survivors train on, the host is
// blacklisted, and the job ends with exit status 0 and every invariant.
func TestRunAcrossHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts hosts and real worker processes; skipped with -short")
	}
	n, hs := testhosts.NewHosts(t, testhosts.Config{Prefix: "mhrun", SSHPort: 2222}, 3)
	const samples, steps = 1200, 400
	h := e2e.HostJob(t, n, hs[0], []string{"--np", "4", "--min-np", "2", "-H", hs[1].Name + ":2," + hs[2].Name + ":2"},
		"--steps", fmt.Sprint(steps), "--json", "--log-samples", "--samples", fmt.Sprint(samples), "--batch", "24",
		"--model-size", "20000", "--compute", "2ms")
	h.WaitFor(t, "a 4-worker world at step 20", 90*time.Second, func(l []e2e.TrainerLine) bool { return e2e.MaxStep(l) >= 20 && e2e.LastSize(l) == 4 })
	s := h.Step()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	killed := time.Now()
	if err := hs[2].KillAll(ctx); err != nil {
		t.Fatal(err)
	}
	h.WaitFor(t, "a 2-worker world after the host was killed", 60*time.Second, e2e.SizeAfter(s, 2))
	t.Logf("host killed: 2-worker steps after %v", time.Since(killed))
	h.WaitExit(t, 2*time.Minute)
	log := h.LogText()
	for _, host := range hs[1:] {
		if !strings.Contains(log, "on "+host.Name) {
			t.Errorf("no worker started on %s:\n%s", host.Name, log[:min(len(log), 4<<10)])
		}
	}
	if !strings.Contains(log, "host "+hs[2].Name+" lost a worker: blacklisted") {
		t.Errorf("the launcher did not blacklist %s:\n%s", hs[2].Name, log[max(0, len(log)-4<<10):])
	}
	h.Mu.Lock()
	defer h.Mu.Unlock()
	e2e.CheckElasticInvariantsSteps(t, h.Lines, samples, steps)
}

// TestRunAcrossHostsPartition cuts one host's link for 5 s and plugs it
// back (issue 12 case b): the others train on without its workers, which
// come back as new members once the network heals; the job ends with exit
// status 0 and every invariant. The cut comes at step 20, or as soon as the
// driver proposed the 4-worker world, on the host of the worker that joined
// last: a
// worker cut off within a second of joining must still go back to the
// driver once the network heals (it used to look at its view for the driver
// only a second after it joined, and, never having seen it, never
// reconnected: its side trained on alone). The 60 s cut runs only with
// GOROVOD_LONG_PARTITION=1 (it takes over 2 minutes).
func TestRunAcrossHostsPartition(t *testing.T) {
	if testing.Short() {
		t.Skip("starts hosts and real worker processes; skipped with -short")
	}
	joinedRe := regexp.MustCompile(`(?m)^\[(\d+)\] time=(\S+) level=INFO msg="membership: joined"`)
	for _, tc := range []struct {
		name      string
		justAfter bool // cut right after the world formed, the last joiner's host
		// hold: how long the link stays down (default 5 s); steps: the
		// job's length (default 500), long enough to outlast it.
		hold  time.Duration
		steps int64
		// long: a cut of a minute, opt-in; it also checks that the
		// driver's side alone trains throughout the cut and that the job
		// ends with every worker's last step.
		long bool
	}{
		{name: "at step 20"},
		{name: "right after the last join", justAfter: true},
		// Longer than the takeover and minority graces (2 s + 10 s): the
		// cut-off half takes over proposing, but holds no quorum of the
		// last world (2 of 4; the driver's half wins the tie), so it
		// waits instead of training apart.
		{name: "longer than the minority grace", hold: 20 * time.Second, steps: 3000},
		// The cut as the first world forms, held past both graces: the
		// cut-off pair takes over. If the first world had not reached it,
		// it holds 2 of the job's 4 first workers (GOROVOD_NP), no
		// majority, and forms no first world; if it had, 2 of that
		// world's 4 members. Either way it waits.
		{name: "right after the last join, longer than the minority grace", justAfter: true, hold: 20 * time.Second, steps: 3000},
		// A minute, far past both graces. The 2-worker world trains at
		// most one step per 24 ms (12 samples × 2 ms of compute each), so
		// at most 2,500 of the 5,000 steps are done by the heal and the
		// cut-off pair has steps left to come back for.
		{name: "60 s, longer than every grace", hold: time.Minute, steps: 5000, long: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.long && os.Getenv(envLongPartition) == "" {
				t.Skip("a 60 s partition, over 2 minutes: set " + envLongPartition + "=1 to run it")
			}
			n, hs := testhosts.NewHosts(t, testhosts.Config{Prefix: "mhpart", SSHPort: 2222}, 3)
			const samples = 1200
			steps := cmp.Or(tc.steps, 500)
			hold := cmp.Or(tc.hold, 5*time.Second)
			trainer := []string{"--steps", fmt.Sprint(steps), "--json", "--log-samples", "--samples", fmt.Sprint(samples), "--batch", "24",
				"--model-size", "20000", "--compute", "2ms"}
			run := []string{"--np", "4", "--min-np", "2", "-H", hs[1].Name + ":2," + hs[2].Name + ":2"}
			if tc.justAfter || tc.hold > 0 {
				// The workers log when they joined (and when they lack
				// a quorum), the driver when it proposed a world.
				trainer, run = append(trainer, "-v"), append(run, "-v")
			}
			// Workers 0 and 1 run on hs[1], 2 and 3 on hs[2].
			var h *e2e.RunJobHarness
			if tc.long {
				h = e2e.StartRunJobArgvWithin(t, e2e.HostJobArgv(t, n, hs[0], run, e2e.Synthetic, trainer...), 6*time.Minute)
			} else {
				h = e2e.HostJob(t, n, hs[0], run, trainer...)
			}
			cut := hs[2]
			if !tc.justAfter {
				h.WaitFor(t, "a 4-worker world at step 20", 90*time.Second, func(l []e2e.TrainerLine) bool { return e2e.MaxStep(l) >= 20 && e2e.LastSize(l) == 4 })
			} else {
				h.WaitLog(t, "a 4-worker world proposed", 90*time.Second, regexp.MustCompile(`msg=proposed epoch=\d+ size=4`))
				last, lastAt := -1, ""
				for _, m := range joinedRe.FindAllStringSubmatch(h.LogText(), -1) {
					if i, err := strconv.Atoi(m[1]); err == nil && m[2] > lastAt { // RFC 3339 times of one clock sort as strings
						last, lastAt = i, m[2]
					}
				}
				if last < 0 {
					t.Fatalf("no worker said it joined:\n%s", h.LogText())
				}
				if last < 2 {
					cut = hs[1]
				}
				t.Logf("worker %d joined last (%s): cutting %s at step %d", last, lastAt, cut.Name, h.Step())
			}
			fewer := 2
			if tc.justAfter {
				// The cut may come before the 4-worker world reached the
				// cut-off host: its workers then train on in their world
				// of before, and the driver's half waits for them.
				fewer = 0
			}
			seen := cutAndHealAfter(t, h, cut, fewer, 4, hold)
			if tc.long && seen.back > fullAgainWithin {
				t.Errorf("the job was back to 4 workers %v after the heal, more than %v", seen.back, fullAgainWithin)
			}
			if tc.long {
				h.WaitExit(t, 4*time.Minute)
			} else {
				h.WaitExit(t, 2*time.Minute)
			}
			h.Mu.Lock()
			defer h.Mu.Unlock()
			// Also when the cut comes as the job's first world forms: the
			// cut-off workers, which the first world may not have
			// reached, see only 2 of the job's 4 first workers
			// (GOROVOD_NP): they form no first world of their own.
			e2e.CheckOneWorldPerStep(t, h.Lines, h.Log.String())
			e2e.CheckElasticInvariantsSteps(t, h.Lines, samples, steps)
			if tc.long {
				checkOneSideTrained(t, h.Lines, h.Log.String(), cut.Name, seen, steps)
			}
			if log := h.Log.String(); tc.hold > 0 && !noQuorumRe.MatchString(log) { // h.mu is held
				t.Errorf("the cut-off half never said it lacks a quorum:\n%s", log)
			} else if tc.justAfter && tc.hold > 0 {
				t.Logf("the cut-off pair lacked the quorum of the first world: %v", strings.Contains(log, "no quorum for the job's first world"))
			}
		})
	}
}

// envLongPartition, set to 1, runs TestRunAcrossHostsPartition's 60 s cut.
const envLongPartition = "GOROVOD_LONG_PARTITION"

// fullAgainWithin bounds how long after a long partition heals the job may
// take to train in its full world again: the cut-off workers go back to the
// seeds every second, rejoin and are admitted at the next boundary (under a
// second on an idle machine); the rest is room for a loaded one.
const fullAgainWithin = 30 * time.Second

// drivingGap bounds the longest pause in the driver's side's steps while the
// other side is cut off: that side trains throughout the cut, not only at
// its start.
const drivingGap = 10 * time.Second

var (
	// workerHostRe is the launcher's line for a worker it started over ssh.
	workerHostRe = regexp.MustCompile(`(?m)\bworker (\d+) on (\S+)$`)
	// proposedByRe is a worker's log line (-v) for a world it proposed
	// after taking over from the driver, with its time.
	proposedByRe = regexp.MustCompile(`(?m)^\[(\d+)\] time=(\S+) .*msg=proposed epoch=(\d+) size=(\d+)`)
	// finishedRe is the launcher's count line.
	finishedRe = regexp.MustCompile(`(\d+) workers finished, (\d+) lost, (\d+) failed.*; last world epoch \d+ had (\d+) workers`)
)

// checkOneSideTrained checks a partition of cutHost, seen as p, in a job of
// steps steps (h.mu held): exactly one side trained while it lasted, the
// driver's. The cut-off workers proposed no world during the cut and
// committed no step after it in a world of their own: each of their steps
// was also committed by a worker of the driver's side in the same world
// epoch, by no more workers than that world's size (two worlds under one
// number, one on each side, show as more); the driver's side kept committing steps in its smaller world from the
// first of them to the heal, never pausing longer than drivingGap; and the
// job ended with every worker it started finished at the last step. It logs
// the partition's figures.
func checkOneSideTrained(t *testing.T, lines []e2e.TrainerLine, log, cutHost string, p partitionSeen, steps int64) {
	t.Helper()
	hostOf := map[int]string{}
	for _, m := range workerHostRe.FindAllStringSubmatch(log, -1) {
		i, _ := strconv.Atoi(m[1])
		hostOf[i] = m[2]
	}
	cutOff := map[int]bool{}
	for i, host := range hostOf {
		cutOff[i] = host == cutHost
	}
	if sides := slices.Collect(maps.Values(cutOff)); !slices.Contains(sides, true) || !slices.Contains(sides, false) {
		t.Fatalf("workers by host %v: want workers on %s and elsewhere", hostOf, cutHost)
	}
	full := 0
	for _, l := range lines {
		full = max(full, l.Size)
	}
	var proposals []string
	for _, m := range proposedByRe.FindAllStringSubmatch(log, -1) {
		i, _ := strconv.Atoi(m[1])
		at, err := time.Parse(time.RFC3339Nano, m[2])
		if cutOff[i] && (err != nil || at.After(p.cut) && at.Before(p.healed)) {
			proposals = append(proposals, fmt.Sprintf("worker %d at %s: epoch %s of %s", i, m[2], m[3], m[4]))
		}
	}
	if len(proposals) > 0 {
		t.Errorf("the cut-off side proposed worlds of its own during the cut: %v", proposals)
	}
	type stepOf struct {
		world uint64
		step  int64
	}
	committedBy := map[stepOf]map[int]bool{} // the workers that logged each step of each world
	for _, l := range lines {
		k := stepOf{l.WorldEpoch, l.Step}
		if committedBy[k] == nil {
			committedBy[k] = map[int]bool{}
		}
		committedBy[k][l.Worker] = true
	}
	for _, l := range lines {
		if !cutOff[l.Worker] || l.Step <= p.cutStep {
			continue
		}
		by := committedBy[stepOf{l.WorldEpoch, l.Step}]
		withDriverSide := slices.ContainsFunc(slices.Collect(maps.Keys(by)), func(w int) bool { return !cutOff[w] })
		if !withDriverSide || len(by) > l.Size {
			t.Fatalf("cut-off worker %d committed step %d (cut at step %d) in world epoch %d of %d workers, which workers %v logged: the cut-off side trained in a world of its own; the worlds:\n%s\nthe decisions:\n%s",
				l.Worker, l.Step, p.cutStep, l.WorldEpoch, l.Size, slices.Sorted(maps.Keys(by)), e2e.DescribeWorlds(lines), e2e.Decisions(log))
		}
	}
	// The driver's side over the cut: its lines come over a link that stayed
	// up, so their arrival times are when it trained.
	var during []e2e.TrainerLine
	for _, l := range lines {
		if !cutOff[l.Worker] && l.Size < full && l.At.After(p.cut) && !l.At.After(p.healed) {
			during = append(during, l)
		}
	}
	if len(during) == 0 {
		t.Fatalf("the driver's side committed no step in a smaller world during the cut; the worlds:\n%s", e2e.DescribeWorlds(lines))
	}
	gap, gapAt := p.healed.Sub(during[len(during)-1].At), during[len(during)-1].At
	committed := map[int64]bool{}
	for i, l := range during {
		committed[l.Step] = true
		if i > 0 && l.At.Sub(during[i-1].At) > gap {
			gap, gapAt = l.At.Sub(during[i-1].At), during[i-1].At
		}
	}
	if gap > drivingGap {
		t.Errorf("the driver's side paused %v from %s during the cut (steps %d-%d of its smaller world): it did not train throughout",
			gap, gapAt.Format("15:04:05.000"), during[0].Step, during[len(during)-1].Step)
	}
	// Every worker started finished: its last step reached the launcher.
	last := map[int]int64{}
	for _, l := range lines {
		last[l.Worker] = max(last[l.Worker], l.Step)
	}
	for i := range hostOf {
		if last[i] != steps {
			t.Errorf("worker %d (on %s) printed no result for the last step %d: its last is %d", i, hostOf[i], steps, last[i])
		}
	}
	if m := finishedRe.FindStringSubmatch(log); m == nil || m[1] != strconv.Itoa(len(hostOf)) || m[2] != "0" || m[3] != "0" || m[4] != strconv.Itoa(full) {
		t.Errorf("want the launcher to count %d workers finished, 0 lost, 0 failed, and a last world of %d; it says %q", len(hostOf), full, m)
	}
	t.Logf("cut at step %d, healed at step %d; the driver's side committed steps %d-%d (%d steps) during the cut, longest pause %v; smaller world after %v, full again %v after the heal",
		p.cutStep, p.healStep, during[0].Step, during[len(during)-1].Step, len(committed), gap.Round(time.Millisecond), p.smaller, p.back)
	t.Logf("steps committed per world:\n%s", worldSteps(lines))
}

// worldSteps lists, per world epoch, its size, the workers that logged in it
// and the steps it committed.
func worldSteps(lines []e2e.TrainerLine) string {
	workers := map[uint64]map[int]bool{}
	stepsOf := map[uint64]map[int64]bool{}
	size := map[uint64]int{}
	for _, l := range lines {
		if workers[l.WorldEpoch] == nil {
			workers[l.WorldEpoch], stepsOf[l.WorldEpoch] = map[int]bool{}, map[int64]bool{}
		}
		workers[l.WorldEpoch][l.Worker] = true
		stepsOf[l.WorldEpoch][l.Step] = true
		size[l.WorldEpoch] = max(size[l.WorldEpoch], l.Size)
	}
	var b strings.Builder
	for _, e := range slices.Sorted(maps.Keys(workers)) {
		ss := slices.Sorted(maps.Keys(stepsOf[e]))
		fmt.Fprintf(&b, "epoch %d (size %d, workers %v): %d steps, %d-%d\n", e, size[e], slices.Sorted(maps.Keys(workers[e])), len(ss), ss[0], ss[len(ss)-1])
	}
	return b.String()
}

// noQuorumRe is the warning of a proposer whose next world would lack the
// quorum of the last one (epoch.NoQuorum).
var noQuorumRe = regexp.MustCompile(`level=WARN msg="no quorum`)

// TestRunHostDiscoveryScript runs a job whose hosts come from a discovery
// script (issue 12 case e): a host appears, then one with a worker
// disappears; its worker is stopped and a replacement starts on the new
// host, keeping --min-np; the job ends with exit status 0 and every
// invariant. A script that fails meanwhile changes nothing.
func TestRunHostDiscoveryScript(t *testing.T) {
	if testing.Short() {
		t.Skip("starts hosts and real worker processes; skipped with -short")
	}
	n, hs := testhosts.NewHosts(t, testhosts.Config{Prefix: "mhdisc", SSHPort: 2222}, 4)
	list := filepath.Join(t.TempDir(), "hosts")
	write := func(lines ...string) {
		t.Helper()
		tmp := list + ".new"
		if err := os.WriteFile(tmp, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, list); err != nil { // atomic: the script never reads half a list
			t.Fatal(err)
		}
	}
	write(hs[1].Name+":1", hs[2].Name+":1")
	const samples, steps = 1200, 500
	h := e2e.HostJob(t, n, hs[0], []string{"--np", "2", "--host-discovery-script", "cat " + list},
		"--steps", fmt.Sprint(steps), "--json", "--log-samples", "--samples", fmt.Sprint(samples), "--batch", "24",
		"--model-size", "20000", "--compute", "2ms")
	h.WaitFor(t, "a 2-worker world at step 20", 90*time.Second, func(l []e2e.TrainerLine) bool { return e2e.MaxStep(l) >= 20 && e2e.LastSize(l) == 2 })
	// A failing script: the hosts stay as they were.
	if err := os.Remove(list); err != nil {
		t.Fatal(err)
	}
	h.WaitLog(t, "the discovery failure reported", 30*time.Second, regexp.MustCompile(`host discovery failed \(keeping the hosts`))
	s := h.Step()
	h.WaitFor(t, "training going on while discovery fails", 30*time.Second, func(l []e2e.TrainerLine) bool {
		return e2e.MaxStep(l) >= s+20 && e2e.LastSize(l) == 2
	})
	// A host appears, and the first one (with a worker) goes.
	write(hs[1].Name+":1", hs[2].Name+":1", hs[3].Name+":1")
	h.WaitFor(t, "training going on with the new host listed", 30*time.Second, func(l []e2e.TrainerLine) bool { return e2e.MaxStep(l) >= s+40 })
	s = h.Step()
	dropped := time.Now()
	write(hs[2].Name+":1", hs[3].Name+":1")
	h.WaitFor(t, "a worker on the new host", 60*time.Second, func(l []e2e.TrainerLine) bool {
		for _, x := range l {
			if x.Worker >= 2 && x.Step > s && x.Size == 2 {
				return true
			}
		}
		return false
	})
	t.Logf("host dropped: its replacement trains after %v", time.Since(dropped))
	h.WaitExit(t, 2*time.Minute)
	log := h.LogText()
	for _, want := range []string{"on " + hs[3].Name} {
		if !strings.Contains(log, want) {
			t.Errorf("the launcher log does not say %q:\n%s", want, log[max(0, len(log)-4<<10):])
		}
	}
	h.Mu.Lock()
	defer h.Mu.Unlock()
	e2e.CheckElasticInvariantsSteps(t, h.Lines, samples, steps)
}

// TestRunHostWithoutSSHD lists a host whose sshd is gone: its workers never
// start, the host is blacklisted, and the job trains on the other host's
// slots and ends with exit status 0.
func TestRunHostWithoutSSHD(t *testing.T) {
	if testing.Short() {
		t.Skip("starts hosts and real worker processes; skipped with -short")
	}
	n, hs := testhosts.NewHosts(t, testhosts.Config{Prefix: "mhnossh", SSHPort: 2222}, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := hs[1].KillAll(ctx); err != nil { // sshd and all: a host that does not answer on port 2222
		t.Fatal(err)
	}
	const samples, steps = 1200, 200
	h := e2e.HostJob(t, n, hs[0], []string{"--np", "4", "--min-np", "2", "-H", hs[1].Name + ":2," + hs[2].Name + ":2"},
		"--steps", fmt.Sprint(steps), "--json", "--log-samples", "--samples", fmt.Sprint(samples), "--batch", "24",
		"--model-size", "20000", "--compute", "2ms")
	h.WaitExit(t, 2*time.Minute)
	log := h.LogText()
	if !strings.Contains(log, "host "+hs[1].Name+" lost a worker: blacklisted") {
		t.Errorf("the launcher did not blacklist %s:\n%s", hs[1].Name, log[max(0, len(log)-4<<10):])
	}
	h.Mu.Lock()
	defer h.Mu.Unlock()
	for _, l := range h.Lines {
		if l.Worker < 2 {
			t.Fatalf("worker %d, placed on %s (no sshd), trained", l.Worker, hs[1].Name)
		}
	}
	e2e.CheckElasticInvariantsSteps(t, h.Lines, samples, steps)
}

// TestMeasureHostTransitions measures planned transitions over namespaced
// hosts at 4, 8 and 16 workers (4 hosts): a graceful leave (SIGTERM to a
// worker on its host) to the first step of the smaller world, and a join
// (SIGUSR1 to the launcher: a worker started over ssh) to the first step of
// the larger one, three rounds of each; then an unplanned one: every process
// of the host with the most workers (fewer than half) killed with kill -9
// (its sshd too), to the survivors' first step in a world without them. Set
// GOROVOD_MEASURE_TRANSITIONS=1 to run it; the numbers are logged
// (docs/multihost.md records them). GOROVOD_MEASURE_DEBUG=1 runs the job
// with --log-level debug, and GOROVOD_MEASURE_DIR keeps its log, to split a
// transition by its log lines (TestTransitionBreakdown does it for the
// planned ones).
func TestMeasureHostTransitions(t *testing.T) {
	if os.Getenv("GOROVOD_MEASURE_TRANSITIONS") == "" {
		t.Skip("a measurement: set GOROVOD_MEASURE_TRANSITIONS=1")
	}
	// trainersOn lists the synthetic trainers' pids among a host's processes.
	trainersOn := func(t *testing.T, host *testhosts.Host) []int {
		t.Helper()
		pids, err := host.Processes()
		if err != nil {
			t.Fatal(err)
		}
		var trainers []int
		for _, pid := range pids {
			if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); strings.HasPrefix(string(cmd), e2e.Synthetic+"\x00") {
				trainers = append(trainers, pid)
			}
		}
		return trainers
	}
	for _, np := range []int{4, 8, 16} {
		t.Run(fmt.Sprint(np), func(t *testing.T) {
			n, hs := testhosts.NewHosts(t, testhosts.Config{Prefix: "mhmeas", SSHPort: 2222}, 5)
			var list []string
			for _, x := range hs[1:] {
				list = append(list, fmt.Sprintf("%s:%d", x.Name, np/4+1))
			}
			args := []string{"--np", fmt.Sprint(np), "--min-np", "2", "-H", strings.Join(list, ",")}
			if os.Getenv("GOROVOD_MEASURE_DEBUG") != "" {
				args = append(args, "--log-level", "debug")
			}
			h := measuredHostJob(t, n, hs[0], args,
				"--steps", "1000000", "--json", "--samples", "100000", "--batch", fmt.Sprint(4*np),
				"--model-size", "20000", "--compute", "1ms")
			h.WaitFor(t, fmt.Sprintf("a %d-worker world", np), 3*time.Minute, func(l []e2e.TrainerLine) bool { return e2e.LastSize(l) == np })
			if dir := os.Getenv("GOROVOD_MEASURE_DIR"); dir != "" {
				t.Cleanup(func() {
					_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("transitions-%d.log", np)), []byte(h.LogText()), 0o644)
				})
			}
			size := np
			for round := range 3 {
				// Leave: SIGTERM one trainer process on the last host that has one.
				victim := 0
				for i := len(hs) - 1; i > 0 && victim == 0; i-- {
					if trainers := trainersOn(t, hs[i]); len(trainers) > 0 {
						victim = trainers[len(trainers)-1]
					}
				}
				if victim == 0 {
					t.Fatal("no trainer on any host")
				}
				s := h.Step()
				start := time.Now()
				syscall.Kill(victim, syscall.SIGTERM)
				h.WaitFor(t, "the smaller world", time.Minute, e2e.SizeAfter(s, size-1))
				seen := time.Since(start)
				t.Logf("np %d round %d: graceful leave → first step of the %d-worker world: %s by the workers' clocks (its line reached the test after %v)",
					np, round, size-1, sinceMS(start, h.FirstCommit(s, size-1, 5*time.Second)), seen)
				size--
				s = h.Step()
				start = time.Now()
				h.Cmd.Process.Signal(syscall.SIGUSR1)
				h.WaitFor(t, "the larger world", time.Minute, e2e.SizeAfter(s, size+1))
				seen = time.Since(start)
				t.Logf("np %d round %d: join (SIGUSR1, ssh, process start) → first step of the %d-worker world: %s by the workers' clocks (its line reached the test after %v)",
					np, round, size+1, sinceMS(start, h.FirstCommit(s, size+1, 5*time.Second)), seen)
				size++
			}
			// A host killed: the survivors' first step without its workers.
			// The world may pass through a smaller size first (a ring blames
			// one dead neighbour), so both the first step of any smaller
			// world and that of the world without the whole host are logged.
			// The host with the most trainers, so long as they are fewer than
			// half the world (more would leave the survivors without a
			// quorum: they would wait, as for a partition).
			var dead *testhosts.Host
			lost := 0
			for _, host := range hs[1:] {
				if k := len(trainersOn(t, host)); k > lost && 2*k < size {
					dead, lost = host, k
				}
			}
			if dead == nil {
				t.Fatalf("no host holds fewer than half of the %d workers", size)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			s := h.Step()
			start := time.Now()
			if err := dead.KillAll(ctx); err != nil {
				t.Fatal(err)
			}
			h.WaitFor(t, fmt.Sprintf("a %d-worker world after %s was killed", size-lost, dead.Name), time.Minute, e2e.SizeAfter(s, size-lost))
			seen := time.Since(start)
			settled := h.FirstCommit(s, size-lost, 5*time.Second)
			var first time.Time
			h.Mu.Lock()
			for _, l := range h.Lines {
				if at := time.UnixMicro(l.TimeUS); l.Step > s && l.Size < size && l.TimeUS > 0 && (first.IsZero() || at.Before(first)) {
					first = at
				}
			}
			h.Mu.Unlock()
			t.Logf("np %d: host kill -9 (%d of %d workers) → first step of a smaller world: %s; of the %d-worker world: %s by the workers' clocks (its line reached the test after %v)",
				np, lost, size, sinceMS(start, first), size-lost, sinceMS(start, settled), seen)
		})
	}
}

// TestStuckWorkerIsLeftOut: a worker whose training loop blocks while its
// gossip and transport live on (--freeze-worker: a stuck data loader)
// answers every liveness probe. Before, the others re-formed the same world
// and waited for it until the recovery timeout (10 minutes). Now they blame
// it for the failed world, then for worlds it never connects to
// (sync.Config.ConnectTimeout), and the third blame takes it out: training
// goes on without it and the job ends with exit status 0.
func TestStuckWorkerIsLeftOut(t *testing.T) {
	const samples, steps = 1200, 300
	h := e2e.StartRunJob(t, "--np", "3", "--min-np", "2", "--", e2e.Synthetic,
		"--steps", fmt.Sprint(steps), "--json", "--log-samples", "--samples", fmt.Sprint(samples), "--batch", "24",
		"--model-size", "20000", "--compute", "1ms", "--freeze-worker", "1", "--freeze-step", "10", "--freeze-for", "10m")
	h.WaitFor(t, "step 9", 60*time.Second, func(l []e2e.TrainerLine) bool { return e2e.MaxStep(l) >= 9 })
	frozen := time.Now()
	h.WaitFor(t, "a 2-worker world without the stuck worker", 4*time.Minute, e2e.SizeAfter(9, 2))
	t.Logf("stuck worker left out: 2-worker steps after %v", time.Since(frozen))
	h.WaitExit(t, 3*time.Minute)
	h.Mu.Lock()
	defer h.Mu.Unlock()
	e2e.CheckElasticInvariantsSteps(t, h.Lines, samples, steps)
}
