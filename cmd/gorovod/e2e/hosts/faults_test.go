package hosts

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/cmd/gorovod/e2e"
	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/internal/testing/testhosts"
)

// hostTrainer is a trainer the fault tests over hosts run: its command line,
// and how many samples and steps its job has.
type hostTrainer struct {
	name    string
	program func() string // the built binary (set by TestMain)
	args    []string
	samples int
	steps   int64
	// lines turns the trainer's JSON lines into what the invariants read.
	lines func([]e2e.TrainerLine) []e2e.TrainerLine
}

// The synthetic trainer paces itself (compute per sample) so that a job
// lasts long enough for a fault and a recovery also on an idle machine:
// steps of 24 samples.
func syntheticOverHosts(steps int64, compute time.Duration) hostTrainer {
	return hostTrainer{
		name: "synthetic", program: func() string { return e2e.Synthetic },
		args: []string{"--steps", fmt.Sprint(steps), "--json", "--log-samples", "--samples", "1200", "--batch", "24",
			"--model-size", "20000", "--compute", compute.String()},
		samples: 1200, steps: steps,
		lines: func(l []e2e.TrainerLine) []e2e.TrainerLine { return l },
	}
}

// Fashion-MNIST (Debian's dataset): epochs of the first images of the
// training set in global batches of 64 (the last one of an epoch short).
// It trains as fast as the machine lets it: a job must have many steps left
// after a fault for the workers cut off or paused for 5 s to come back
// before training is over.
func fashionOverHosts(images, epochs int) hostTrainer {
	return hostTrainer{
		name: "fashion-mnist", program: func() string { return e2e.FashionMNIST },
		args: []string{"--epochs", fmt.Sprint(epochs), "--train-limit", fmt.Sprint(images), "--batch-size", "64",
			"--json", "--log-every", "0"},
		samples: images, steps: int64(epochs * ((images + 63) / 64)),
		lines: fashionStepLines,
	}
}

// fashionStepLines keeps the Fashion-MNIST trainer's step records (the
// epoch and final records have no world) and reads its global batch where
// the invariants look for it.
func fashionStepLines(lines []e2e.TrainerLine) []e2e.TrainerLine {
	var out []e2e.TrainerLine
	for _, l := range lines {
		if l.Size == 0 {
			continue
		}
		l.Global = l.GlobalBatch
		out = append(out, l)
	}
	return out
}

// checkHostJob checks what every fault case promises: exit status 0 (the
// caller waited for it), identical parameters in a world at every step,
// every sample exactly once per data epoch, training to the last step; and
// for Fashion-MNIST that the model learned.
func checkHostJob(t *testing.T, h *e2e.RunJobHarness, tr hostTrainer) {
	t.Helper()
	h.Mu.Lock()
	defer h.Mu.Unlock()
	e2e.CheckElasticInvariantsSteps(t, tr.lines(h.Lines), tr.samples, tr.steps)
	if tr.name != "fashion-mnist" {
		return
	}
	var acc float64
	for _, l := range h.Lines {
		acc = max(acc, l.Accuracy)
	}
	if acc < 0.7 {
		t.Errorf("Fashion-MNIST: test accuracy %.3f after %d steps", acc, tr.steps)
	}
	t.Logf("Fashion-MNIST: test accuracy %.1f%%", 100*acc)
}

// threeHostJob starts a job of 3 hosts × 2 slots (--np 6, --min-np 2), run
// from a fourth host, the head, and waits for its 6-worker world.
func threeHostJob(t *testing.T, prefix string, tr hostTrainer, before func(hs []*testhosts.Host)) (*e2e.RunJobHarness, []*testhosts.Host) {
	t.Helper()
	if tr.name == "fashion-mnist" && !e2e.HaveFashionMNIST() {
		t.Skip("needs Debian's dataset-fashion-mnist (CI installs it)")
	}
	if testing.Short() {
		t.Skip("starts hosts and real worker processes; skipped with -short")
	}
	n, hs := testhosts.NewHosts(t, testhosts.Config{Prefix: prefix, SSHPort: 2222}, 4)
	if before != nil {
		before(hs)
	}
	var list []string
	for _, x := range hs[1:] {
		list = append(list, x.Name+":2")
	}
	started := time.Now()
	h := e2e.HostJobWith(t, n, hs[0], []string{"--np", "6", "--min-np", "2", "-H", strings.Join(list, ",")}, tr.program(), tr.args...)
	h.WaitFor(t, "a first step", 2*time.Minute, func(l []e2e.TrainerLine) bool { return len(l) > 0 })
	first := time.Since(started)
	h.WaitFor(t, "a 6-worker world", 2*time.Minute, func(l []e2e.TrainerLine) bool { return e2e.LastSize(l) == 6 })
	t.Logf("first step after %v, a 6-worker world at step %d after %v", first.Round(time.Millisecond), h.Step(), time.Since(started).Round(time.Millisecond))
	return h, hs
}

// trainerOn returns the pid of a trainer process running on host, found
// among the processes of the host's network namespace (the test started it
// there through sshd; the launcher does not know a remote worker's pid), and
// the launcher's index of that worker, from the process's environment.
func trainerOn(t *testing.T, host *testhosts.Host, program string) (pid, worker int) {
	t.Helper()
	pids, err := host.Processes()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pids {
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		if !strings.HasPrefix(string(cmd), program+"\x00") {
			continue
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p))
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range strings.Split(string(env), "\x00") {
			if v, ok := strings.CutPrefix(kv, envconfig.EnvLaunchIndex+"="); ok {
				if worker, err = strconv.Atoi(v); err != nil {
					t.Fatalf("pid %d: %s", p, kv)
				}
				return p, worker
			}
		}
		t.Fatalf("trainer pid %d on %s has no %s", p, host.Name, envconfig.EnvLaunchIndex)
	}
	t.Fatalf("no %s process on %s (processes %v)", program, host.Name, pids)
	return 0, 0
}

// TestFaultsAcrossHosts runs issue 12's fault cases that the tests above do
// not (or not with both trainers) on 3 hosts × 2 slots: the synthetic trainer
// and Fashion-MNIST, each with identical parameters at every step, every
// sample once per data epoch, and exit status 0.
//
//   - latency: every host's link carries 2 ms ± 1 ms (each flow's packets kept
//     in order) from before the job starts to its end; a world that shrinks
//     meanwhile is logged with the reasons, not failed (see faultLatency);
//   - remote-pause: a worker on a remote host (its pid found in that host's
//     namespace) is stopped with SIGSTOP for 5 s and continued: it is left
//     out, comes back as a new member, and the job ends with exit status 0;
//   - kill-9: every process of one host, sshd included, is killed with
//     kill -9 (the synthetic trainer's case is TestRunAcrossHosts);
//   - partition: one host's link is down for 5 s, then up: its workers come
//     back as new members (the synthetic trainer's case is
//     TestRunAcrossHostsPartition).
func TestFaultsAcrossHosts(t *testing.T) {
	type fault struct {
		name     string
		trainers []hostTrainer
		run      func(t *testing.T, tr hostTrainer)
	}
	for _, f := range []fault{
		// 300 steps take 20-30 s under the latency (on a loaded machine).
		{"latency", []hostTrainer{syntheticOverHosts(300, 2*time.Millisecond), fashionOverHosts(12000, 2)}, faultLatency},
		// Long enough that the paused or cut-off workers find training
		// going on when they are back: the others train at least 25 ms a
		// step (synthetic: 5 samples of 5 ms), and 1876 Fashion-MNIST steps
		// took about 20 ms each here (load average 10); 564 steps were once
		// over within a 5 s partition.
		{"remote-pause", []hostTrainer{syntheticOverHosts(600, 5*time.Millisecond), fashionOverHosts(60000, 2)}, faultRemotePause},
		{"kill-9", []hostTrainer{fashionOverHosts(12000, 2)}, faultHostKill},
		{"partition", []hostTrainer{fashionOverHosts(60000, 2)}, faultPartition},
	} {
		for _, tr := range f.trainers {
			t.Run(f.name+"/"+tr.name, func(t *testing.T) {
				began := time.Now()
				f.run(t, tr)
				t.Logf("%s with %s: %v", f.name, tr.name, time.Since(began).Round(100*time.Millisecond))
			})
		}
	}
}

func faultLatency(t *testing.T, tr hostTrainer) {
	latency := testhosts.Impairment{Delay: 2 * time.Millisecond, Jitter: time.Millisecond, KeepOrder: true}
	h, hs := threeHostJob(t, "mhlat", tr, func(hs []*testhosts.Host) {
		for _, x := range hs {
			if err := x.Impair(latency); err != nil {
				t.Fatal(err)
			}
		}
	})
	started := time.Now()
	s := h.Step()
	h.WaitExit(t, 3*time.Minute)
	// The impairment must have held for the whole job.
	for _, x := range hs {
		if err := x.Heal(); err != nil {
			t.Error(err)
		}
	}
	h.Mu.Lock()
	var sizes []int
	for _, l := range h.Lines {
		if l.Step > s && l.Size > 0 && !slices.Contains(sizes, l.Size) {
			sizes = append(sizes, l.Size)
		}
	}
	steps := e2e.MaxStep(h.Lines) - s
	h.Mu.Unlock()
	t.Logf("under 2 ms ± 1 ms: %d steps of the 6-worker world in %v (%v a step); world sizes since %v",
		steps, time.Since(started).Round(time.Millisecond), (time.Since(started) / time.Duration(max(steps, 1))).Round(10*time.Microsecond), sizes)
	if !slices.Equal(sizes, []int{6}) {
		// Not a failure: the delay is made by this process, which gives
		// every packet of the 4 hosts its verdict in user space; under the
		// -race suite at load 20 it lagged far beyond 2 ms ± 1 ms once and
		// a world of 3 formed (the job still finished with every invariant).
		// Say why the workers were left out.
		var why []string
		for _, line := range strings.Split(h.LogText(), "\n") {
			if strings.Contains(line, "dead") || strings.Contains(line, "left out") || strings.Contains(line, "failure reported") {
				why = append(why, line)
			}
		}
		t.Logf("world sizes %v after the 6-worker world formed: workers were left out under the impairment:\n%s",
			sizes, strings.Join(why[:min(len(why), 20)], "\n"))
	}
	checkHostJob(t, h, tr)
}

func faultRemotePause(t *testing.T, tr hostTrainer) {
	h, hs := threeHostJob(t, "mhpause", tr, nil)
	pid, worker := trainerOn(t, hs[3], tr.program())
	s := h.Step()
	paused := time.Now()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Error(err)
			}
		}
	}
	defer resume()
	h.WaitFor(t, "a 5-worker world while a remote worker is paused", time.Minute, e2e.SizeAfter(s, 5))
	t.Logf("worker %d (pid %d on %s) paused: 5-worker steps after %v", worker, pid, hs[3].Name, time.Since(paused))
	select {
	case <-time.After(time.Until(paused.Add(5 * time.Second))):
	case err := <-h.Exited:
		t.Fatalf("job ended while worker %d was paused: %v\n%s", worker, err, h.LogText())
	}
	s = h.Step()
	resume()
	back := time.Now()
	h.WaitFor(t, fmt.Sprintf("worker %d back in a 6-worker world", worker), time.Minute, func(l []e2e.TrainerLine) bool {
		for _, x := range l {
			if x.Worker == worker && x.Step > s && x.Size == 6 {
				return true
			}
		}
		return false
	})
	t.Logf("resumed worker trains again after %v", time.Since(back))
	h.WaitExit(t, 3*time.Minute)
	if log := h.LogText(); !strings.Contains(log, "came back as a new member") {
		t.Errorf("the summary does not say that worker %d came back:\n%s", worker, log[max(0, len(log)-4<<10):])
	}
	checkHostJob(t, h, tr)
}

func faultHostKill(t *testing.T, tr hostTrainer) {
	h, hs := threeHostJob(t, "mhkill", tr, nil)
	s := h.Step()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	killed := time.Now()
	if err := hs[3].KillAll(ctx); err != nil {
		t.Fatal(err)
	}
	h.WaitFor(t, "a 4-worker world after the host was killed", time.Minute, e2e.SizeAfter(s, 4))
	t.Logf("host killed: 4-worker steps after %v", time.Since(killed))
	h.WaitExit(t, 3*time.Minute)
	if log := h.LogText(); !strings.Contains(log, "host "+hs[3].Name+" lost a worker: blacklisted") {
		t.Errorf("the launcher did not blacklist %s:\n%s", hs[3].Name, log[max(0, len(log)-4<<10):])
	}
	checkHostJob(t, h, tr)
}

func faultPartition(t *testing.T, tr hostTrainer) {
	h, hs := threeHostJob(t, "mhcut", tr, nil)
	cutAndHeal(t, h, hs[3], 4, 6)
	h.WaitExit(t, 3*time.Minute)
	checkHostJob(t, h, tr)
}

// cutAndHeal takes host's link down for 5 s and up again: the others train
// on in a world of fewer workers, and host's workers are back in a world of
// full once the link is.
func cutAndHeal(t *testing.T, h *e2e.RunJobHarness, host *testhosts.Host, fewer, full int) {
	t.Helper()
	cutAndHealAfter(t, h, host, fewer, full, 5*time.Second)
}

// partitionSeen is what cutAndHealAfter saw of a partition: when the link
// went down and up, the newest step the launcher had seen at each, and how
// long the smaller world (when required) and the full one took to train.
type partitionSeen struct {
	cut, healed       time.Time
	cutStep, healStep int64
	smaller, back     time.Duration
}

// cutAndHealAfter is cutAndHeal with the link down for hold. With fewer 0
// no smaller world is required while the host is cut off: when the cut
// comes before a world change reached it, its workers go on in the world
// before the change and the others wait (the quorum), and what the cut-off
// workers log reaches the launcher only after the heal.
func cutAndHealAfter(t *testing.T, h *e2e.RunJobHarness, host *testhosts.Host, fewer, full int, hold time.Duration) partitionSeen {
	t.Helper()
	var p partitionSeen
	p.cutStep = h.Step()
	p.cut = time.Now()
	if err := host.SetLink(false); err != nil {
		t.Fatal(err)
	}
	healed := false
	heal := func() {
		if !healed {
			healed = true
			if err := host.SetLink(true); err != nil {
				t.Error(err)
			}
		}
	}
	defer heal()
	if fewer > 0 {
		h.WaitFor(t, fmt.Sprintf("a %d-worker world while a host is cut off", fewer), time.Minute, e2e.SizeAfter(p.cutStep, fewer))
		p.smaller = time.Since(p.cut)
		t.Logf("partition: %d-worker steps after %v", fewer, p.smaller)
	}
	select {
	case <-time.After(time.Until(p.cut.Add(hold))):
	case err := <-h.Exited:
		t.Fatalf("job ended during the partition: %v\n%s", err, h.LogText())
	}
	p.healStep = h.Step()
	heal()
	p.healed = time.Now()
	h.WaitFor(t, fmt.Sprintf("a %d-worker world after the partition healed", full), 90*time.Second, e2e.SizeAfter(p.healStep, full))
	p.back = time.Since(p.healed)
	t.Logf("healed: %d-worker steps after %v", full, p.back)
	return p
}
