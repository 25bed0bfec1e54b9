package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// trainerLine is what the synthetic trainer prints per committed step.
type trainerLine struct {
	Worker     int    `json:"-"` // the launcher's worker index, from the "[i]" prefix
	workerName string // the member name, from the line's "worker"
	Step       int64  `json:"step"`
	Epoch      uint64 `json:"epoch"`
	WorldEpoch uint64 `json:"world_epoch"`
	// WorldRank0 names the world's rank 0 (the fashion-mnist example's
	// records): with WorldEpoch it names the world.
	WorldRank0 string     `json:"world_rank0"`
	Rank       int        `json:"rank"`
	Size       int        `json:"size"`
	Params     string     `json:"params_sha256"`
	Samples    sampleList `json:"samples"`
	Start      int        `json:"start"`
	Global     int        `json:"global"`
	// GlobalBatch is the fashion-mnist example's step's global batch.
	GlobalBatch int `json:"global_batch"`
	// Accum and LRFactor are the fashion-mnist example's step's plan: the
	// micro-batches accumulated beyond the first and the learning-rate
	// factor.
	Accum    int     `json:"accum"`
	LRFactor float64 `json:"lr_factor"`
	Loss     float64 `json:"loss"`
	Accuracy float64 `json:"test_accuracy"`
	// Kind is the fashion-mnist example's record kind ("step", "epoch",
	// "final"; empty in the synthetic trainer's lines).
	Kind string `json:"kind"`
	// GradSqr and GradVar are the job's smoothed gradient statistics after
	// the step (nil before the first estimate).
	GradSqr *float64 `json:"grad_sqr"`
	GradVar *float64 `json:"grad_var"`
	// TimeUS is when the worker committed the step, by its own clock (µs
	// since the Unix epoch; the synthetic trainer's time_us, 0 if absent).
	TimeUS int64 `json:"time_us"`
	// At is when the line reached the test, through the launcher.
	At time.Time
}

// sampleList is the synthetic trainer's list of sample indices; the
// Fashion-MNIST trainer prints a count there instead, which is ignored.
type sampleList []int

func (s *sampleList) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '[' {
		return json.Unmarshal(b, (*[]int)(s))
	}
	return nil
}

type runJobHarness struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	lines  []trainerLine
	events []string // the engine's JSON lines (--json)
	pids   map[int]int
	log    strings.Builder
	notify chan struct{}
	exited chan error
}

var (
	prefixRe = regexp.MustCompile(`^\[(\d+)\] (\{.*\})$`)
	pidRe    = regexp.MustCompile(`^gorovod run: worker (\d+) pid (\d+)( started| \(adopted\))?$`)
)

func startRunJob(t *testing.T, args ...string) *runJobHarness {
	t.Helper()
	return startRunJobWith(t, binary, args...)
}

// startRunJobWith runs `launcher run args...`: gorovod, or a program running
// its command line with more heuristics (examples/custom-launcher).
func startRunJobWith(t *testing.T, launcher string, args ...string) *runJobHarness {
	t.Helper()
	return startRunJobArgv(t, append([]string{launcher, "run"}, args...))
}

// logTailOnFailure has t log the last 12 KiB of h's output, named what, if
// the test fails.
func (h *runJobHarness) logTailOnFailure(t *testing.T, what string) {
	t.Cleanup(func() {
		if t.Failed() {
			log := h.logText()
			t.Logf("%s (last 12 KiB):\n%s", what, log[max(0, len(log)-12<<10):])
		}
	})
}

// startRunJobArgv runs argv, a `gorovod run` command line (behind a prefix
// such as nsenter's), and follows its output. The launcher is stopped after
// 3 minutes.
func startRunJobArgv(t *testing.T, argv []string) *runJobHarness {
	t.Helper()
	return startRunJobArgvWithin(t, argv, 3*time.Minute)
}

// startRunJobArgvWithin is startRunJobArgv for a job that may run for up to
// limit (a long fault).
func startRunJobArgvWithin(t *testing.T, argv []string, limit time.Duration) *runJobHarness {
	t.Helper()
	if testing.Short() {
		t.Skip("starts real worker processes; skipped with -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	dumpOnCancel(cmd)
	return startHarness(t, cmd)
}

// startHarness starts cmd, a `gorovod run` (or a command running one), and
// follows what it prints.
func startHarness(t *testing.T, cmd *exec.Cmd) *runJobHarness {
	t.Helper()
	h := &runJobHarness{cmd: cmd, pids: map[int]int{}, notify: make(chan struct{}, 1), exited: make(chan error, 1)}
	stdout, _ := h.cmd.StdoutPipe()
	stderr, _ := h.cmd.StderrPipe()
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var readers sync.WaitGroup
	readers.Go(func() { h.read(stdout) })
	readers.Go(func() { h.read(stderr) })
	go func() {
		readers.Wait()
		h.exited <- h.cmd.Wait()
	}()
	t.Cleanup(func() {
		h.mu.Lock()
		pids := maps.Clone(h.pids) // the reader may still add one
		h.mu.Unlock()
		for _, pid := range pids {
			if pid > 0 { // kill(0) would be this process group
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		_ = h.cmd.Process.Kill()
	})
	return h
}

func (h *runJobHarness) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<22)
	for sc.Scan() {
		h.readLine(sc.Text(), time.Now())
	}
}

// readLine takes one line of the launcher's output, printed at.
func (h *runJobHarness) readLine(line string, at time.Time) {
	h.mu.Lock()
	if m := prefixRe.FindStringSubmatch(line); m != nil {
		var tl trainerLine
		if json.Unmarshal([]byte(m[2]), &tl) == nil {
			var named struct {
				Worker string `json:"worker"`
			}
			_ = json.Unmarshal([]byte(m[2]), &named)
			tl.workerName = named.Worker
			tl.Worker, _ = strconv.Atoi(m[1])
			tl.At = at
			h.lines = append(h.lines, tl)
		} else {
			// A worker's own words (an error, a goroutine dump): kept
			// for the log a failing test prints.
			fmt.Fprintln(&h.log, line)
		}
	} else if strings.HasPrefix(line, `{"event":`) {
		h.events = append(h.events, line)
	} else if m := pidRe.FindStringSubmatch(line); m != nil {
		i, _ := strconv.Atoi(m[1])
		h.pids[i], _ = strconv.Atoi(m[2])
		fmt.Fprintln(&h.log, line)
	} else {
		fmt.Fprintln(&h.log, line)
	}
	h.mu.Unlock()
	select {
	case h.notify <- struct{}{}:
	default:
	}
}

// logText is the launcher's log so far.
func (h *runJobHarness) logText() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.log.String()
}

// waitAllAtStep waits (up to 2 minutes) until workers distinct workers have
// printed step step or a later one.
func (h *runJobHarness) waitAllAtStep(t *testing.T, step int64, workers int) {
	t.Helper()
	h.waitFor(t, fmt.Sprintf("step %d on every worker", step), 2*time.Minute, func(lines []trainerLine) bool {
		seen := map[int]bool{}
		for _, l := range lines {
			if l.Step >= step {
				seen[l.Worker] = true
			}
		}
		return len(seen) == workers
	})
}

// waitFor waits until cond holds over the lines seen so far.
func (h *runJobHarness) waitFor(t *testing.T, what string, timeout time.Duration, cond func(lines []trainerLine) bool) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		h.mu.Lock()
		ok := cond(h.lines)
		h.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-h.notify:
		case <-deadline:
			h.timedOut(t, what)
		}
	}
}

// timedOut fails the test for a wait on what that timed out, with the
// job's log and, first, the goroutine dumps of its processes (the workers'
// through the launcher, by dumpOnCancel's SIGQUIT), so that a hang says
// where it hung.
func (h *runJobHarness) timedOut(t *testing.T, what string) {
	t.Helper()
	if h.cmd.Cancel != nil {
		_ = h.cmd.Cancel()
		select {
		case err := <-h.exited:
			h.exited <- err
		case <-time.After(30 * time.Second):
		}
	}
	t.Fatalf("timed out waiting for %s; launcher log, with goroutine dumps:\n%s", what, h.logText())
}

func (h *runJobHarness) pid(t *testing.T, worker int) int {
	t.Helper()
	// The launcher's line with the pid can come after the worker's own
	// lines (an adopted worker's output is relayed as soon as it is
	// followed): wait for it a while, woken by each line read.
	deadline := time.After(30 * time.Second)
	for {
		h.mu.Lock()
		pid, ok := h.pids[worker]
		h.mu.Unlock()
		if ok {
			return pid
		}
		select {
		case <-h.notify:
		case <-deadline:
			t.Fatalf("no pid for worker %d", worker)
		}
	}
}

func maxStep(lines []trainerLine) int64 {
	var m int64
	for _, l := range lines {
		m = max(m, l.Step)
	}
	return m
}

// lastSize is the world size of the newest line.
func lastSize(lines []trainerLine) int {
	if len(lines) == 0 {
		return 0
	}
	return lines[len(lines)-1].Size
}

func sizeAfter(step int64, size int) func([]trainerLine) bool {
	// The harness only appends lines, and waitFor asks again at every new
	// one: each call looks at the lines the last one had not seen. (At 16
	// workers a thousand lines a second arrive; scanning all of them at
	// each made the test itself a busy process on the machine it measures.)
	seen := 0
	return func(lines []trainerLine) bool {
		for ; seen < len(lines); seen++ {
			if l := lines[seen]; l.Step > step && l.Size == size {
				return true
			}
		}
		return false
	}
}

// TestElasticRunSurvivesEvents runs the synthetic trainer under `gorovod run`
// and puts it through every membership event the issue names: a worker added
// mid-run, a graceful SIGTERM, a kill -9 during training and a SIGSTOP. The
// workers must agree on the parameters at every step, never go back more
// than the interrupted step, and process every sample of a data epoch once.
func TestElasticRunSurvivesEvents(t *testing.T) {
	const samples = 1500
	h := startRunJob(t, "--np", "3", "--min-np", "2", "--", synthetic,
		"--steps", "500", "--json", "--log-samples", "--samples", fmt.Sprint(samples), "--batch", "30",
		"--model-size", "20000", "--compute", "1ms")
	h.waitFor(t, "step 20", 60*time.Second, func(l []trainerLine) bool { return maxStep(l) >= 20 })

	// 1. Add a worker (the launcher's SIGUSR1): the world grows to 4.
	start := time.Now()
	if err := h.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	h.waitFor(t, "a 4-worker world", 60*time.Second, func(l []trainerLine) bool { return lastSize(l) == 4 })
	t.Logf("worker added: 4-worker steps after %v", time.Since(start))

	// 2. SIGTERM worker 1: it leaves gracefully, the world shrinks to 3.
	h.mu.Lock()
	s := maxStep(h.lines)
	h.mu.Unlock()
	start = time.Now()
	syscall.Kill(h.pid(t, 1), syscall.SIGTERM)
	h.waitFor(t, "a 3-worker world after SIGTERM", 60*time.Second, sizeAfter(s, 3))
	t.Logf("graceful leave: 3-worker steps after %v", time.Since(start))

	// 3. kill -9 worker 2 while the others train: 2 workers remain.
	h.mu.Lock()
	s = maxStep(h.lines)
	h.mu.Unlock()
	start = time.Now()
	syscall.Kill(h.pid(t, 2), syscall.SIGKILL)
	h.waitFor(t, "a 2-worker world after kill -9", 60*time.Second, sizeAfter(s, 2))
	t.Logf("kill -9: training resumed with 2 workers after %v", time.Since(start))

	// 4. Grow again, then freeze worker 0 with SIGSTOP.
	h.cmd.Process.Signal(syscall.SIGUSR1)
	h.mu.Lock()
	s = maxStep(h.lines)
	h.mu.Unlock()
	h.waitFor(t, "a 3-worker world again", 60*time.Second, sizeAfter(s, 3))
	h.mu.Lock()
	s = maxStep(h.lines)
	h.mu.Unlock()
	start = time.Now()
	syscall.Kill(h.pid(t, 0), syscall.SIGSTOP)
	h.waitFor(t, "a 2-worker world after SIGSTOP", 60*time.Second, sizeAfter(s, 2))
	t.Logf("SIGSTOP: training resumed with 2 workers after %v", time.Since(start))
	syscall.Kill(h.pid(t, 0), syscall.SIGKILL)

	select {
	case err := <-h.exited:
		if err != nil {
			t.Fatalf("gorovod run: %v\n%s", err, h.logText())
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("job did not finish")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	checkElasticInvariants(t, h.lines, samples)
}

func checkElasticInvariants(t *testing.T, lines []trainerLine, samples int) {
	t.Helper()
	checkElasticInvariantsSteps(t, lines, samples, 500)
}

func checkElasticInvariantsSteps(t *testing.T, lines []trainerLine, samples int, steps int64) {
	t.Helper()
	// Parameters agree among the workers of one world at one step.
	type key struct {
		step  int64
		world uint64
	}
	hashes := map[key]string{}
	newest := map[int64]uint64{}
	for _, l := range lines {
		k := key{l.Step, l.WorldEpoch}
		if h, ok := hashes[k]; ok && h != l.Params {
			t.Fatalf("step %d, world epoch %d: workers hold different parameters", l.Step, l.WorldEpoch)
		}
		hashes[k] = l.Params
		newest[l.Step] = max(newest[l.Step], l.WorldEpoch)
	}
	// A worker's step never goes back by more than the interrupted one.
	last := map[int]int64{}
	for _, l := range lines {
		if prev, ok := last[l.Worker]; ok && l.Step < prev-1 {
			t.Fatalf("worker %d went back from step %d to %d", l.Worker, prev, l.Step)
		}
		last[l.Worker] = l.Step
	}
	if maxStep(lines) != steps {
		t.Fatalf("training stopped at step %d", maxStep(lines))
	}
	// Samples: the committed record of each step is its newest world's. The
	// committed steps of a data epoch must tile its order exactly: no sample
	// lost, none processed twice. (Each step's range covers every worker's
	// share, also the share of a worker that died before it could print.)
	type span struct{ start, global int }
	byEpoch := map[uint64]map[int64]span{}
	firstLine := map[int64]trainerLine{}
	for _, l := range lines {
		if l.WorldEpoch != newest[l.Step] {
			continue
		}
		if byEpoch[l.Epoch] == nil {
			byEpoch[l.Epoch] = map[int64]span{}
		}
		sp := span{l.Start, l.Global}
		if prev, ok := byEpoch[l.Epoch][l.Step]; ok && prev != sp {
			f := firstLine[l.Step]
			t.Fatalf("step %d, world epoch %d: workers disagree on the global batch: %v (%s, rank %d of %d) and %v (%s, rank %d of %d)",
				l.Step, l.WorldEpoch, prev, f.workerName, f.Rank, f.Size, sp, l.workerName, l.Rank, l.Size)
		}
		byEpoch[l.Epoch][l.Step] = sp
		if _, ok := firstLine[l.Step]; !ok {
			firstLine[l.Step] = l
		}
	}
	finished := 0
	for e, byStep := range byEpoch {
		var spans []span
		for _, sp := range byStep {
			spans = append(spans, sp)
		}
		slices.SortFunc(spans, func(a, b span) int { return a.start - b.start })
		next := 0
		for _, sp := range spans {
			if sp.start != next {
				t.Fatalf("data epoch %d: samples [%d, %d) %s", e, min(next, sp.start), max(next, sp.start),
					map[bool]string{true: "lost", false: "processed twice"}[sp.start > next])
			}
			next += sp.global
		}
		if next == samples {
			finished++
		} else if _, later := byEpoch[e+1]; later {
			t.Fatalf("data epoch %d ended after %d of %d samples", e, next, samples)
		}
	}
	if finished == 0 {
		t.Fatal("no data epoch finished")
	}
}

func TestRunBadCommandLines(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"run"}, "no trainer command"},
		{[]string{"run", "--np", "0", "--", "true"}, "at least 1"},
		{[]string{"run", "--np", "2", "--min-np", "3", "--", "true"}, "--min-np"},
		{[]string{"run", "--np", "3", "--max-np", "2", "--", "true"}, "--max-np"},
		// horovodrun's names set the same values as gorovod's.
		{[]string{"run", "--num-proc", "0", "--", "true"}, "at least 1"},
		{[]string{"run", "--num-proc", "2", "--min-num-proc", "3", "--", "true"}, "--min-np"},
		{[]string{"run", "--np", "3", "--max-num-proc", "2", "--", "true"}, "--max-np"},
		{[]string{"run", "--", "/nonexistent/trainer"}, `trainer "/nonexistent/trainer": no such file or directory` + "\n"},
		{[]string{"run", "--", "no-such-trainer-here"}, `trainer "no-such-trainer-here": no such command in $PATH` + "\n"},
		{[]string{"run", "--", "/"}, `trainer "/": is a directory` + "\n"},
		{[]string{"run", "--placement", "everywhere", "--", "true"}, "unknown placement"},
		{[]string{"run", "--heuristic", "nope", "--", "true"}, `unknown heuristic "nope"`},
		{[]string{"run", "--heuristic-opt", "threshold=0.2", "--", "true"}, "--heuristic-opt needs --heuristic"},
		{[]string{"run", "--heuristic", "scaling-efficiency", "--heuristic-opt", "treshold=0.2", "--", "true"}, `unknown field "treshold"`},
		{[]string{"run", "--heuristic", "scaling-efficiency", "--heuristic-opt", "threshold", "--", "true"}, "not key=value"},
		{[]string{"run", "--heuristic", "utility-cost", "--", "true"}, "price_per_worker_hour"},
		{[]string{"run", "--heuristic", "hold", "--heuristic-config", "x.json", "--", "true"}, "not both"},
		{[]string{"run", "--heuristic-config", "/nonexistent/h.json", "--", "true"}, "no such file"},
		{[]string{"run", "--progress", "sometimes", "--", "true"}, "--progress"},
		{[]string{"run", "--straggler-threshold", "1.5", "--", "true"}, "threshold"},
		{[]string{"run", "--skip-steps", "-1", "--", "true"}, "--skip-steps"},
		{[]string{"run", "--slurm", "--kubernetes", "--", "true"}, "not both"},
		{[]string{"run", "--slurm-arg", "--gres=gpu:1", "--", "true"}, "need --slurm"},
		{[]string{"run", "--kubernetes-image", "img", "--", "true"}, "need --kubernetes"},
		{[]string{"run", "--leave-notice", "-1s", "--", "true"}, "--leave-notice"},
		{[]string{"run", "-H", "h1:x", "--", "true"}, `slots "x"`},
		{[]string{"run", "--hostfile", "/nonexistent/hosts", "--", "true"}, "--hostfile"},
		{[]string{"run", "-H", "a:1", "--host-discovery-script", "x", "--", "true"}, "give one of"},
		{[]string{"run", "-H", "a:1", "-p", "70000", "--", "true"}, "--ssh-port"},
		{[]string{"run", "--network-interface", "nosuch0", "--", "true"}, "--network-interface"},
		{[]string{"run", "-H", "a:1", "--ssh-option", "-oProxyCommand=x", "--", "true"}, "want Name=value"},
		{[]string{"run", "--start-timeout", "0", "--", "true"}, "positive"},
		{[]string{"run", "--blacklist-cooldown-range", "10", "--", "true"}, "MIN,MAX"},
		{[]string{"run", "--lanes", "99", "--", "true"}, "--lanes 99"},
		{[]string{"run", "--output-dir", "/dev/null/job", "--", "true"}, "--output-dir /dev/null/job: mkdir /dev/null: not a directory\n"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, errs, code := runGorovod(t, tc.args...)
			if code != 2 || !strings.Contains(errs, tc.want) {
				t.Fatalf("exit %d, stderr %q (want %q)", code, errs, tc.want)
			}
		})
	}
}

// A trainer that is a file but not a program is refused, saying how to run
// it when it is a Python script.
func TestRunTrainerNotExecutable(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, want string }{
		{"train.py", `": not executable (run it with its interpreter: -- python3 ` + filepath.Join(dir, "train.py") + ")\n"},
		{"train", `": not executable (permission denied)` + "\n"},
	} {
		path := filepath.Join(dir, tc.name)
		if err := os.WriteFile(path, []byte("print('hi')\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		_, errs, code := runGorovod(t, "run", "--", path)
		if want := "gorovod run: trainer \"" + path + tc.want; code != 2 || !strings.HasPrefix(errs, want) {
			t.Errorf("exit %d, stderr %q; want 2, %q", code, errs, want)
		}
	}
}

// A trainer that fails at once fails the job, and the job's first lines
// (which job, how to add a worker, its directory, its workers) come before
// what became of its workers, though the first may fail before the second
// is launched.
func TestRunFailingTrainerFailsJob(t *testing.T) {
	_, errs, code := runGorovod(t, "run", "--np", "2", "--", "false")
	if code != 1 || !strings.Contains(errs, "job failed") {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	lines := strings.Split(errs, "\n")
	at := func(prefix string) int {
		return slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "gorovod run: "+prefix) })
	}
	news := slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, ") failed: ") })
	if news < 0 {
		t.Fatalf("no worker failed, says the output:\n%s", errs)
	}
	if first := at("job "); first != 0 {
		t.Errorf("the job's line is line %d, want the first:\n%s", first, errs)
	}
	for _, banner := range []string{"job ", "add a worker with", "job directory", "worker 0 pid", "worker 1 pid"} {
		if i := at(banner); i < 0 || i > news {
			t.Errorf("%q is line %d, after the first worker's end (line %d):\n%s", banner, i, news, errs)
		}
	}
	// Every line is gorovod run's: the job's error lists each failed worker
	// on a line of its own.
	for _, l := range lines {
		if l != "" && !strings.HasPrefix(l, "gorovod run: ") {
			t.Errorf("a line without the prefix %q: %q\n%s", "gorovod run: ", l, errs)
		}
	}
}

// TestElasticRunFaultInjection kills a random worker with kill -9 at random
// moments, again and again, adding a replacement each time, and then lets the
// job finish: it must, with every invariant intact.
func TestElasticRunFaultInjection(t *testing.T) {
	const samples, steps = 1200, 400
	h := startRunJob(t, "--np", "4", "--min-np", "2", "--", synthetic,
		"--steps", fmt.Sprint(steps), "--json", "--samples", fmt.Sprint(samples), "--batch", "24",
		"--model-size", "20000", "--compute", "1ms", "-v")
	h.waitFor(t, "step 10", 60*time.Second, func(l []trainerLine) bool { return maxStep(l) >= 10 })
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	t.Logf("fault injection seed %d", seed)
	killed := map[int]bool{}
	deadline := time.Now().Add(6 * time.Second)
	kills := 0
	for time.Now().Before(deadline) {
		h.mu.Lock()
		var alive []int
		for i := range h.pids {
			if !killed[i] {
				alive = append(alive, i)
			}
		}
		done := maxStep(h.lines) >= steps-50
		h.mu.Unlock()
		if done {
			break
		}
		slices.Sort(alive)
		if len(alive) > 2 {
			victim := alive[rng.IntN(len(alive))]
			syscall.Kill(h.pid(t, victim), syscall.SIGKILL)
			killed[victim] = true
			kills++
			h.cmd.Process.Signal(syscall.SIGUSR1) // a replacement
		}
		// Wait a random while, but on the job's progress, not on the clock
		// alone: the next kill comes once training has moved on.
		h.mu.Lock()
		s := maxStep(h.lines)
		h.mu.Unlock()
		pause := time.Duration(100+rng.IntN(400)) * time.Millisecond
		h.waitFor(t, "progress after a kill", 60*time.Second, func(l []trainerLine) bool { return maxStep(l) > s })
		select {
		case <-time.After(pause):
		case err := <-h.exited:
			t.Fatalf("job ended during fault injection: %v\n%s", err, h.log.String())
		}
	}
	t.Logf("%d workers killed", kills)
	defer func() {
		if t.Failed() {
			log := h.logText()
			t.Logf("the launcher log's last 8 KiB:\n%s", log[max(0, len(log)-8<<10):])
		}
	}()
	select {
	case err := <-h.exited:
		if err != nil {
			t.Fatalf("gorovod run: %v\n%s", err, h.logText())
		}
	case <-time.After(2 * time.Minute):
		h.mu.Lock()
		defer h.mu.Unlock()
		t.Fatalf("job did not finish (last step %d); launcher log:\n%s", maxStep(h.lines), h.log.String())
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	checkElasticInvariantsSteps(t, h.lines, samples, steps)
}

// TestFashionMNISTUnderRun trains the real example elastically on part of the
// data and checks that the workers agree at every step and learn.
func TestFashionMNISTUnderRun(t *testing.T) {
	if !haveFashionMNIST() {
		t.Skip("needs Debian's dataset-fashion-mnist (CI installs it)")
	}
	// --min-np 2: a first worker alone would finish the 188 steps in a second,
	// before a second worker that loads its data more slowly could join.
	h := startRunJob(t, "--np", "2", "--min-np", "2", "--", fashionMNIST, "--epochs", "2", "--train-limit", "6000", "--json", "--log-every", "0")
	select {
	case err := <-h.exited:
		if err != nil {
			t.Fatalf("gorovod run: %v\n%s", err, h.logText())
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("job did not finish")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	checkFashionMNIST(t, h.lines, 0.7)
}

// TestRunWakesAWorkerPausedAtTheEnd: the last world's rank 0 pauses itself
// (SIGSTOP) once it has reported the end of training, as a chaos trial's
// worker paused there by hand and never resumed (the runner stopped it at
// ExitLimit, 30 s on, and SIGINT, pending while it was paused, then SIGKILL
// ended it: counted stopped, and in that trial without its final line,
// which the example then wrote after its report). The runner wakes the
// job's running processes FinishGrace after the end: the worker exits by
// itself, finished.
func TestRunWakesAWorkerPausedAtTheEnd(t *testing.T) {
	if !haveFashionMNIST() {
		t.Skip("needs Debian's dataset-fashion-mnist (CI installs it)")
	}
	h := startRunJob(t, "--np", "3", "--", fashionMNIST, "--epochs", "1", "--train-limit", "3000", "--json", "--log-every", "0", "--pause-at-end")
	h.logTailOnFailure(t, "gorovod run's output")
	h.waitExit(t, 2*time.Minute)
	log := h.logText()
	if !strings.Contains(log, "] final: test accuracy") {
		t.Error("the last world's rank 0 never wrote its final line")
	}
	if !strings.Contains(log, "gorovod run: 3 workers finished, 0 lost, 0 failed;") {
		t.Error("want the 3 workers counted finished (the paused one exiting by itself, not stopped)")
	}
}

// TestRunWritesTheResultWhenRank0DiesAtTheEnd: the last world's rank 0 is
// killed (SIGKILL, by itself: --die-at-end) as it is about to write the
// job's result, after the last step and its evaluation, as a chaos trial's
// rank 0 killed by hand there left the job without its final line. The
// others wait at the end (sync's TrainConfig.Final) for it; its death
// breaks their barrier, the world is formed again without it, and its new
// rank 0 evaluates the same parameters and writes the line, once.
func TestRunWritesTheResultWhenRank0DiesAtTheEnd(t *testing.T) {
	if !haveFashionMNIST() {
		t.Skip("needs Debian's dataset-fashion-mnist (CI installs it)")
	}
	marker := filepath.Join(t.TempDir(), "died")
	h := startRunJob(t, "--np", "3", "--min-np", "2", "--", fashionMNIST, "--epochs", "1", "--train-limit", "3000", "--json", "--log-every", "0", "--die-at-end", marker)
	h.logTailOnFailure(t, "gorovod run's output")
	select {
	case err := <-h.exited:
		if err != nil {
			t.Fatalf("gorovod run: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the job did not end")
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("no rank 0 died at the end: %v", err)
	}
	log := h.logText()
	if n := strings.Count(log, "] final: test accuracy"); n != 1 {
		t.Errorf("%d final lines, want 1 (from the new rank 0)", n)
	}
	if !strings.Contains(log, "gorovod run: 2 workers finished, 1 lost, 0 failed;") {
		t.Error("want 2 workers finished and the one killed lost")
	}
}

func haveFashionMNIST() bool {
	_, err := os.Stat("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz")
	return err == nil
}

// checkFashionMNIST: the workers of each world agree at every step, and the
// model learns.
func checkFashionMNIST(t *testing.T, lines []trainerLine, minAccuracy float64) {
	t.Helper()
	if msg, ok := disagreement(lines); !ok {
		t.Fatal(msg)
	}
	steps := map[int64]bool{}
	ranks := map[int]bool{}
	for _, l := range lines {
		if l.Params == "" || l.Size == 0 {
			continue // epoch and final records
		}
		steps[l.Step] = true
		ranks[l.Rank] = true
	}
	if len(steps) < 150 || len(ranks) < 2 {
		t.Fatalf("%d steps from ranks %v", len(steps), ranks)
	}
	var acc float64
	for _, l := range lines {
		acc = max(acc, l.Accuracy)
	}
	if acc < minAccuracy {
		t.Fatalf("test accuracy %.3f after 2 epochs", acc)
	}
	t.Logf("%d steps, test accuracy %.1f%%", len(steps), 100*acc)
}

// disagreement checks that the workers of one world hold the same parameters
// after each step, and says where they do not. A step number alone does not
// name one run of a step: workers that lose sight of each other (gossip
// declaring a loaded worker dead) train on in worlds of their own, each the
// same step numbers from the same state, until they meet again and the new
// world takes one of their states (the others' steps are rolled back). So
// the lines are compared per step and world: its epoch number and, as two
// proposers cut off from each other may number their worlds alike, its rank
// 0's name (world_rank0, where the trainer reports it).
func disagreement(lines []trainerLine) (string, bool) {
	type key struct {
		step  int64
		world uint64
		rank0 string
	}
	params := map[key]string{}
	for _, l := range lines {
		if l.Params == "" || l.Size == 0 {
			continue // epoch and final records
		}
		k := key{l.Step, l.WorldEpoch, l.WorldRank0}
		if prev, ok := params[k]; ok && prev != l.Params {
			return fmt.Sprintf("step %d, world epoch %d: the workers hold different parameters:\n%s",
				l.Step, l.WorldEpoch, describeSteps(lines, l.Step-3, l.Step)), false
		}
		params[k] = l.Params
	}
	return "", true
}

// describeSteps lists the trainer lines of steps from..to, each with its
// worker, world and plan, so that a failed agreement says what differed.
func describeSteps(lines []trainerLine, from, to int64) string {
	var b strings.Builder
	for _, l := range lines {
		if l.Params == "" || l.Size == 0 || l.Step < from || l.Step > to {
			continue
		}
		fmt.Fprintf(&b, "  step %d worker %d rank %d/%d world %d (rank 0 %s): global %d start %d accum %d lr×%g loss %.6g params %.12s\n",
			l.Step, l.Worker, l.Rank, l.Size, l.WorldEpoch, l.WorldRank0, l.GlobalBatch, l.Start, l.Accum, l.LRFactor, l.Loss, l.Params)
	}
	return b.String()
}

// A collective of the final step can complete on some workers and fail on
// others: those that completed finish, and the others redo the step in a world
// of their own, below --min-np (sync's rescue). The launcher must let them
// finish rather than stop them as late joiners. Worker 2 trains one step
// more, as such a worker must; alone, its step takes 64 × 60 ms = 3.8 s,
// longer than the 3 s the launcher gives workers once training is over.
func TestRunLetsTheLastStepFinish(t *testing.T) {
	h := startRunJob(t, "--np", "3", "--min-np", "3", "--", synthetic, "--steps", "3", "--json",
		"--batch", "64", "--compute", "60ms", "--model-size", "1024", "--extra-step-worker", "2")
	select {
	case err := <-h.exited:
		if err != nil {
			t.Fatalf("gorovod run: %v\n%s", err, h.logText())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("job did not finish; launcher log:\n%s", h.logText())
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, l := range h.lines {
		if l.Step == 4 {
			if l.Worker != 2 || l.Size != 1 {
				t.Fatalf("step 4 ran on worker %d in a world of %d, want worker 2 alone", l.Worker, l.Size)
			}
			return
		}
	}
	t.Fatalf("worker 2 never finished its extra step; launcher log:\n%s", h.log.String())
}

// TestRealDeathsLeaveOne: three workers, two of them killed at once (kill
// -9) with --min-np 1. Their deaths are known (the launcher sees the
// processes exit), not only suspected by gossip, so the quorum of the last
// world does not hold the survivor back: it trains on alone and finishes.
func TestRealDeathsLeaveOne(t *testing.T) {
	const samples = 1200
	h := startRunJob(t, "--np", "3", "--min-np", "1", "--", synthetic,
		"--steps", "400", "--json", "--log-samples", "--samples", fmt.Sprint(samples), "--batch", "24",
		"--model-size", "20000", "--compute", "2ms")
	h.waitFor(t, "a 3-worker world at step 20", 60*time.Second, func(l []trainerLine) bool { return maxStep(l) >= 20 && lastSize(l) == 3 })
	h.mu.Lock()
	s := maxStep(h.lines)
	h.mu.Unlock()
	start := time.Now()
	one, two := h.pid(t, 1), h.pid(t, 2)
	syscall.Kill(one, syscall.SIGKILL)
	syscall.Kill(two, syscall.SIGKILL)
	h.waitFor(t, "a 1-worker world after two kill -9", 60*time.Second, sizeAfter(s, 1))
	t.Logf("two of three killed: 1-worker steps after %v", time.Since(start))
	select {
	case err := <-h.exited:
		if err != nil {
			t.Fatalf("gorovod run: %v\n%s", err, h.logText())
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("job did not finish")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	checkOneWorldPerStep(t, h.lines, h.log.String())
	checkElasticInvariantsSteps(t, h.lines, samples, 400)
}
