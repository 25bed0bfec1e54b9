package slurm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/heuristics"
	"github.com/gorovod/gorovod/internal/testing/testslurm"
)

// The test binary is also the workers' program: srun and sbatch start it
// with envHelper set.
const (
	envHelper = "SLURM_TEST_HELPER" // "worker", "allocation" or "exit3"
	envOnTerm = "SLURM_TEST_ON_TERM"
)

func TestMain(m *testing.M) {
	switch os.Getenv(envHelper) {
	case "worker":
		os.Exit(helperWorker())
	case "allocation":
		os.Exit(helperAllocation())
	case "exit3":
		os.Exit(3)
	}
	os.Exit(m.Run())
}

// helperWorker stands in for a trainer: it reports itself, then waits. On
// SIGTERM it prints the time and either leaves (exit 0) or, with
// SLURM_TEST_ON_TERM=ignore, keeps printing heartbeats until it is killed.
func helperWorker() int {
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	host, _ := os.Hostname()
	fmt.Printf("ready %s %d\n", host, os.Getpid())
	fmt.Printf("secret %s\n", os.Getenv("GOROVOD_SECRET"))
	<-term
	fmt.Printf("term %d\n", time.Now().UnixNano())
	if os.Getenv(envOnTerm) != "ignore" {
		fmt.Println("left")
		return 0
	}
	for t := time.NewTicker(20 * time.Millisecond); ; <-t.C {
		fmt.Printf("beat %d\n", time.Now().UnixNano())
	}
}

func helperAllocation() int {
	a, ok, err := CurrentAllocation()
	if err != nil || !ok {
		fmt.Printf("error %v %v\n", ok, err)
		return 1
	}
	b, _ := json.Marshal(a)
	fmt.Printf("%s\n", b)
	return 0
}

// lines collects what the workers print, by worker.
type lines struct {
	mu     sync.Mutex
	byID   map[int][]string
	update chan struct{}
}

func newLines() *lines { return &lines{byID: map[int][]string{}, update: make(chan struct{})} }

func (l *lines) add(i int, _ string, line []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.byID[i] = append(l.byID[i], string(line))
	close(l.update)
	l.update = make(chan struct{})
}

func (l *lines) of(i int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.byID[i]...)
}

// wait returns worker i's first line starting with prefix, waiting for it.
func (l *lines) wait(t *testing.T, i int, prefix string, timeout time.Duration) string {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		for _, s := range l.byID[i] {
			if strings.HasPrefix(s, prefix) {
				l.mu.Unlock()
				return s
			}
		}
		update := l.update
		l.mu.Unlock()
		select {
		case <-update:
		case <-deadline.C:
			t.Fatalf("worker %d never printed %q; it printed %q", i, prefix, l.of(i))
		}
	}
}

// info turns a "ready HOST PID" line into the engine's view of the worker.
func info(t *testing.T, ready string) heuristics.WorkerInfo {
	t.Helper()
	f := strings.Fields(ready)
	pid, err := strconv.Atoi(f[2])
	if len(f) != 3 || err != nil {
		t.Fatalf("bad ready line %q", ready)
	}
	return heuristics.WorkerInfo{Name: "w-" + f[2], Host: f[1], PID: pid}
}

func unixNano(t *testing.T, line string) time.Time {
	t.Helper()
	n, err := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
	if err != nil {
		t.Fatalf("bad line %q", line)
	}
	return time.Unix(0, n)
}

func waitCond(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %s after %v", what, state, timeout)
		}
		<-tick.C
	}
}

// steps lists the job's steps squeue shows.
func steps(t *testing.T, c *testslurm.Cluster, job string) []string {
	t.Helper()
	out, err := c.Run(context.Background(), "squeue", "--steps", "--noheader", "--format=%i", "--jobs="+job)
	if err != nil && !strings.Contains(err.Error(), "Invalid job id") {
		t.Fatal(err)
	}
	var ids []string
	for _, id := range strings.Fields(out) {
		if !strings.HasSuffix(id, ".extern") && !strings.HasSuffix(id, ".batch") {
			ids = append(ids, id)
		}
	}
	return ids
}

func secretHex() string { return strings.Repeat("5e", 32) }

// testExe is this test binary, which srun and sbatch start as a worker.
func testExe(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// TestStepsProvisioner drives the provisioner through real srun steps in a
// real allocation: it fills the allocation, is refused one more, stops a
// worker that leaves on SIGTERM and one that ignores it (killed after the
// grace period), starts a replacement in the freed slot, and then has Slurm
// cancel the whole job: every worker gets SIGTERM and the one that ignores
// it is killed KillWait later.
func TestStepsProvisioner(t *testing.T) {
	cfg := testslurm.DefaultConfig()
	cfg.KillWait = 3 * time.Second
	c := testslurm.New(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	job, err := c.Allocate(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	exe := testExe(t)
	out := newLines()
	onTerm := map[int]string{1: "ignore", 3: "ignore"}
	var logs []string
	var logMu sync.Mutex
	p, err := New(Config{
		Argv: []string{exe}, JobID: job, Slots: 3, Grace: 2 * time.Second, Environ: c.Environ(), Output: out.add,
		Env: func(i int) []string {
			return []string{envHelper + "=worker", envOnTerm + "=" + onTerm[i], "GOROVOD_SECRET=" + secretHex()}
		},
		Logf: func(format string, args ...any) {
			logMu.Lock()
			defer logMu.Unlock()
			logs = append(logs, fmt.Sprintf(format, args...))
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			logMu.Lock()
			t.Logf("provisioner log:\n%s", strings.Join(logs, "\n"))
			logMu.Unlock()
		}
	}()
	closed := false
	defer func() {
		if !closed {
			_ = p.Close(context.Background())
		}
	}()

	if err := p.Start(ctx, 3); err != nil {
		t.Fatal(err)
	}
	var workers []heuristics.WorkerInfo
	for i := range 3 {
		workers = append(workers, info(t, out.wait(t, i, "ready ", time.Minute)))
		if got := out.wait(t, i, "secret ", 10*time.Second); got != "secret "+secretHex() {
			t.Fatalf("worker %d got %q", i, got)
		}
	}
	if got := steps(t, c, job); len(got) != 3 {
		t.Fatalf("steps running: %v", got)
	}
	for i, w := range waitMarkers(t, p) {
		if w.ID != fmt.Sprintf("%s.%d", job, i) && !strings.HasPrefix(w.ID, job+".") || w.Host != workers[i].Host || w.PID != workers[i].PID {
			t.Fatalf("worker %d: provisioner knows %+v, it reported %+v", i, w, workers[i])
		}
	}
	// The secret travels in the environment only.
	for _, pid := range c.Leftovers() {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.Contains(string(b), secretHex()) {
			t.Fatalf("pid %d has the secret on its command line: %q", pid, b)
		}
	}
	if err := p.Start(ctx, 1); !errors.Is(err, ErrFull) {
		t.Fatalf("a 4th worker in 3 slots: %v", err)
	}

	// Worker 0 leaves on SIGTERM: Stop waits the grace period, sends it,
	// and returns once the step is over.
	t0 := time.Now()
	if err := p.Stop(ctx, workers[0]); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took < 2*time.Second {
		t.Fatalf("Stop returned after %v, before the grace period", took)
	}
	out.wait(t, 0, "term ", time.Second)
	out.wait(t, 0, "left", time.Second)
	// Worker 1 ignores SIGTERM: it gets it, then is killed.
	if err := p.Stop(ctx, workers[1]); err != nil {
		t.Fatal(err)
	}
	term := unixNano(t, out.wait(t, 1, "term ", time.Second))
	var last time.Time
	for _, l := range out.of(1) {
		if strings.HasPrefix(l, "beat ") {
			last = unixNano(t, l)
		}
	}
	if last.Sub(term) < time.Second {
		t.Fatalf("worker 1 was killed %v after its SIGTERM; the grace is 2 s", last.Sub(term))
	}
	ws := p.Workers()
	if !ws[0].Done || !ws[1].Done || ws[2].Done {
		t.Fatalf("workers after two stops: %+v", ws)
	}
	waitCond(t, 30*time.Second, "steps of stopped workers", func() (bool, string) {
		s := steps(t, c, job)
		return len(s) == 1, fmt.Sprint(s)
	})
	// A worker the provisioner did not start is not its business.
	if err := p.Stop(ctx, heuristics.WorkerInfo{Name: "stranger", Host: workers[0].Host, PID: os.Getpid()}); err != nil {
		t.Fatal(err)
	}

	// The freed slots take new workers.
	if err := p.Start(ctx, 1); err != nil {
		t.Fatal(err)
	}
	out.wait(t, 3, "ready ", time.Minute)

	// Slurm ends the whole job (as on preemption or a time limit): every
	// step gets SIGTERM; worker 3, which ignores it, is killed KillWait
	// later.
	if _, err := c.Run(ctx, "scancel", job); err != nil {
		t.Fatal(err)
	}
	out.wait(t, 2, "left", 30*time.Second)
	term = unixNano(t, out.wait(t, 3, "term ", 30*time.Second))
	waitCond(t, time.Minute, "workers after scancel of the job", func() (bool, string) {
		ws := p.Workers()
		return ws[2].Done && ws[3].Done, fmt.Sprintf("%+v", ws)
	})
	for _, l := range out.of(3) {
		if strings.HasPrefix(l, "beat ") {
			last = unixNano(t, l)
		}
	}
	if lived := last.Sub(term); lived < cfg.KillWait-300*time.Millisecond || lived > cfg.KillWait+5*time.Second {
		t.Fatalf("worker 3 lived %v after SIGTERM; KillWait is %v", lived, cfg.KillWait)
	}
	t.Logf("scancel of the job: SIGTERM, then SIGKILL %v later (KillWait %v)", last.Sub(term).Round(time.Millisecond), cfg.KillWait)

	closed = true
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// The job's own processes (slurmstepd) finish cleaning up after the
	// steps' tasks are gone.
	waitCond(t, 30*time.Second, "processes of the cancelled job", func() (bool, string) {
		left := c.Leftovers()
		return len(left) == 0, fmt.Sprint(left)
	})
}

// TestSignalsSlurmDelivers pins down what reaches a step's process for each
// way of ending it, the facts Stop is built on.
func TestSignalsSlurmDelivers(t *testing.T) {
	c := testslurm.New(t, testslurm.DefaultConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	job, err := c.Allocate(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	exe := testExe(t)
	out := newLines()
	p, err := New(Config{
		Argv: []string{exe}, JobID: job, Slots: 4, Grace: 2 * time.Second, Environ: c.Environ(), Output: out.add,
		Env: func(int) []string { return []string{envHelper + "=worker", envOnTerm + "=ignore"} },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	if err := p.Start(ctx, 3); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		out.wait(t, i, "ready ", time.Minute)
	}
	ws := waitMarkers(t, p)
	// scancel --signal=TERM JOB.STEP: SIGTERM, and the step goes on.
	if _, err := c.Run(ctx, "scancel", "--signal=TERM", ws[0].ID); err != nil {
		t.Fatal(err)
	}
	out.wait(t, 0, "term ", 30*time.Second)
	out.wait(t, 0, "beat ", 30*time.Second)
	// scancel JOB.STEP: SIGKILL at once, no SIGTERM.
	if _, err := c.Run(ctx, "scancel", ws[1].ID); err != nil {
		t.Fatal(err)
	}
	waitCond(t, 30*time.Second, "worker 1 after scancel of its step", func() (bool, string) {
		w := p.Workers()[1]
		return w.Done, fmt.Sprintf("%+v", w)
	})
	for _, l := range out.of(1) {
		if strings.HasPrefix(l, "term ") {
			t.Fatalf("scancel of a step sent SIGTERM first: %q", out.of(1))
		}
	}
	// SIGTERM to srun itself: srun kills the step, no SIGTERM reaches it.
	if err := p.signalSrun(2, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitCond(t, 30*time.Second, "worker 2 after SIGTERM to srun", func() (bool, string) {
		w := p.Workers()[2]
		return w.Done, fmt.Sprintf("%+v", w)
	})
	for _, l := range out.of(2) {
		if strings.HasPrefix(l, "term ") {
			t.Fatalf("SIGTERM to srun reached the task: %q", out.of(2))
		}
	}
}

// waitMarkers waits until the provisioner has read every worker's marker
// (its step, host and pid) and returns the workers. The wrapper prints the
// marker on stderr and the trainer its "ready" on stdout, two pipes read
// apart, so a worker's "ready" can arrive before its marker does.
func waitMarkers(t *testing.T, p *Provisioner) []Worker {
	t.Helper()
	var ws []Worker
	waitCond(t, 30*time.Second, "the workers' markers", func() (bool, string) {
		ws = p.Workers()
		for _, w := range ws {
			if w.ID == "" || w.Host == "" {
				return false, fmt.Sprintf("%+v", ws)
			}
		}
		return true, ""
	})
	return ws
}

// signalSrun sends sig to the srun process of worker i (tests only).
func (p *Provisioner) signalSrun(i int, sig syscall.Signal) error {
	p.mu.Lock()
	job := p.workers[i].job
	p.mu.Unlock()
	return job.SignalWorker(0, sig)
}

// TestCurrentAllocation reads the allocation where a driver runs: under
// salloc and in a batch script.
func TestCurrentAllocation(t *testing.T) {
	c := testslurm.New(t, testslurm.DefaultConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	exe := testExe(t)
	check := func(how, out, jobID string) {
		t.Helper()
		var a Allocation
		if err := json.Unmarshal([]byte(out), &a); err != nil {
			t.Fatalf("%s: %v: %s", how, err, out)
		}
		if jobID == "" {
			jobID = a.JobID
		}
		want := Allocation{JobID: jobID, Hosts: []Host{{Name: c.NodeName, Slots: 3}}, NTasks: 3}
		if fmt.Sprint(a) != fmt.Sprint(want) {
			t.Fatalf("%s: %+v, want %+v", how, a, want)
		}
	}
	cmd := c.Command(ctx, "salloc", "--ntasks=3", exe)
	cmd.Env = append(cmd.Env, envHelper+"=allocation")
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("salloc: %v: %s", err, b)
	}
	check("salloc", string(b), "")

	outFile := filepath.Join(t.TempDir(), "alloc.out")
	cmd = c.Command(ctx, "sbatch", "--parsable", "--ntasks=3", "--output="+outFile, "--wrap="+exe)
	cmd.Env = append(cmd.Env, envHelper+"=allocation")
	if b, err = cmd.CombinedOutput(); err != nil {
		t.Fatalf("sbatch: %v: %s", err, b)
	}
	waitCond(t, time.Minute, "the batch job's output", func() (bool, string) {
		out := readFile(outFile)
		return strings.HasSuffix(out, "\n"), fmt.Sprintf("%q", out)
	})
	check("sbatch", readFile(outFile), strings.TrimSpace(string(b)))

	if _, ok, err := CurrentAllocation(); os.Getenv("SLURM_JOB_ID") == "" && (ok || err != nil) {
		t.Fatalf("outside Slurm: ok %v, %v", ok, err)
	}
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// TestJobsProvisioner: workers as batch jobs of their own. Stop sends SIGTERM
// to the batch shell (the trainer, exec'd) and the job ends; Close ends the
// rest.
func TestJobsProvisioner(t *testing.T) {
	c := testslurm.New(t, testslurm.DefaultConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	exe := testExe(t)
	dir := t.TempDir()
	p, err := New(Config{
		Mode: Jobs, Argv: []string{exe}, Grace: 2 * time.Second, Environ: c.Environ(), OutputDir: dir, PollInterval: 100 * time.Millisecond,
		Env: func(i int) []string { return []string{envHelper + "=worker", "GOROVOD_SECRET=" + secretHex()} },
	})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			_ = p.Close(context.Background())
		}
	}()
	if err := p.Start(ctx, 2); err != nil {
		t.Fatal(err)
	}
	ws := p.Workers()
	readyOf := func(i int) string {
		for _, l := range strings.Split(readFile(filepath.Join(dir, "gorovod-worker-"+ws[i].ID+".out")), "\n") {
			if strings.HasPrefix(l, "ready ") {
				return l
			}
		}
		return ""
	}
	for i := range 2 {
		waitCond(t, time.Minute, fmt.Sprintf("job %s to start", ws[i].ID), func() (bool, string) {
			return readyOf(i) != "", readFile(filepath.Join(dir, "gorovod-worker-"+ws[i].ID+".out"))
		})
	}
	if err := p.Stop(ctx, info(t, readyOf(0))); err != nil {
		t.Fatal(err)
	}
	if got := readFile(filepath.Join(dir, "gorovod-worker-"+ws[0].ID+".out")); !strings.Contains(got, "\nterm ") || !strings.Contains(got, "\nleft") {
		t.Fatalf("worker 0 printed %q", got)
	}
	if ws := p.Workers(); !ws[0].Done || ws[1].Done {
		t.Fatalf("after Stop: %+v", ws)
	}
	closed = true
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got := readFile(filepath.Join(dir, "gorovod-worker-"+ws[1].ID+".out")); !strings.Contains(got, "\nleft") {
		t.Fatalf("worker 1 printed %q", got)
	}
	if jobs, err := c.Jobs(ctx); err != nil || len(jobs) > 0 {
		t.Fatalf("jobs left: %v %v", jobs, err)
	}
}

// TestJobsPreempted: a worker job in a preemptible partition is preempted by
// a more urgent job; the worker gets SIGTERM from Slurm, leaves, and its job
// ends, which the provisioner sees.
func TestJobsPreempted(t *testing.T) {
	cfg := testslurm.DefaultConfig()
	cfg.Preemption, cfg.PreemptGrace = true, 5*time.Second
	c := testslurm.New(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	exe := testExe(t)
	dir := t.TempDir()
	p, err := New(Config{
		Mode: Jobs, Argv: []string{exe}, Grace: 2 * time.Second, Environ: c.Environ(), OutputDir: dir, PollInterval: 100 * time.Millisecond,
		CPUsPerWorker: cfg.CPUs / 2, ExtraArgs: []string{"--partition=spot"},
		Env: func(i int) []string { return []string{envHelper + "=worker"} },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	if err := p.Start(ctx, 2); err != nil {
		t.Fatal(err)
	}
	ws := p.Workers()
	outOf := func(i int) string { return readFile(filepath.Join(dir, "gorovod-worker-"+ws[i].ID+".out")) }
	for i := range 2 {
		waitCond(t, time.Minute, fmt.Sprintf("job %s to start", ws[i].ID), func() (bool, string) {
			return strings.Contains(outOf(i), "ready "), outOf(i)
		})
	}
	urgent, err := c.Run(ctx, "sbatch", "--parsable", "--partition=urgent", fmt.Sprintf("--cpus-per-task=%d", cfg.CPUs/2),
		"--output=/dev/null", "--wrap=sleep 1")
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	waitCond(t, time.Minute, "a worker to be preempted", func() (bool, string) {
		ws := p.Workers()
		return ws[0].Done || ws[1].Done, fmt.Sprintf("%+v", ws)
	})
	preempted, kept := 0, 1
	if !p.Workers()[0].Done {
		preempted, kept = 1, 0
	}
	if out := outOf(preempted); !strings.Contains(out, "\nterm ") || !strings.Contains(out, "\nleft") {
		t.Fatalf("the preempted worker printed %q", out)
	}
	if out := outOf(kept); strings.Contains(out, "\nterm ") {
		t.Fatalf("the other worker was signalled too: %q", out)
	}
	t.Logf("job %s preempted worker job %s; it left and its job ended %v after the urgent job's submission", urgent, ws[preempted].ID, time.Since(t0).Round(time.Millisecond))
}
