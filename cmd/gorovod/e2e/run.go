package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TrainerLine is what the synthetic trainer prints per committed step.
type TrainerLine struct {
	Worker     int    `json:"-"` // the launcher's worker index, from the "[i]" prefix
	WorkerName string // the member name, from the line's "worker"
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

// UnmarshalJSON reads a list of indices and ignores anything else.
func (s *sampleList) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '[' {
		return json.Unmarshal(b, (*[]int)(s))
	}
	return nil
}

// RunJobHarness follows a running `gorovod run`: its trainers' step lines,
// its engine events (--json), its workers' pids and its whole output. Mu
// guards Lines, Events, Pids and Log; Notify is signalled at each line read;
// Exited gets the launcher's exit.
type RunJobHarness struct {
	Cmd    *exec.Cmd
	Mu     sync.Mutex
	Lines  []TrainerLine
	Events []string // the engine's JSON lines (--json)
	Pids   map[int]int
	Log    strings.Builder
	Notify chan struct{}
	Exited chan error
}

var (
	prefixRe = regexp.MustCompile(`^\[(\d+)\] (\{.*\})$`)
	pidRe    = regexp.MustCompile(`^gorovod run: worker (\d+) pid (\d+)( started| \(adopted\))?$`)
)

// StartRunJob runs `gorovod run args...` (Binary) and follows its output.
func StartRunJob(t *testing.T, args ...string) *RunJobHarness {
	t.Helper()
	return StartRunJobWith(t, Binary, args...)
}

// StartRunJobWith runs `launcher run args...`: gorovod, or a program running
// its command line with more heuristics (examples/custom-launcher).
func StartRunJobWith(t *testing.T, launcher string, args ...string) *RunJobHarness {
	t.Helper()
	return StartRunJobArgv(t, append([]string{launcher, "run"}, args...))
}

// LogTailOnFailure has t log the last 12 KiB of h's output, named what, if
// the test fails.
func (h *RunJobHarness) LogTailOnFailure(t *testing.T, what string) {
	t.Cleanup(func() {
		if t.Failed() {
			log := h.LogText()
			t.Logf("%s (last 12 KiB):\n%s", what, log[max(0, len(log)-12<<10):])
		}
	})
}

// StartRunJobArgv runs argv, a `gorovod run` command line (behind a prefix
// such as nsenter's), and follows its output. The launcher is stopped after
// 3 minutes.
func StartRunJobArgv(t *testing.T, argv []string) *RunJobHarness {
	t.Helper()
	return StartRunJobArgvWithin(t, argv, 3*time.Minute)
}

// StartRunJobArgvWithin is StartRunJobArgv for a job that may run for up to
// limit (a long fault).
func StartRunJobArgvWithin(t *testing.T, argv []string, limit time.Duration) *RunJobHarness {
	t.Helper()
	if testing.Short() {
		t.Skip("starts real worker processes; skipped with -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	DumpOnCancel(cmd)
	return StartHarness(t, cmd)
}

// StartHarness starts cmd, a `gorovod run` (or a command running one), and
// follows what it prints.
func StartHarness(t *testing.T, cmd *exec.Cmd) *RunJobHarness {
	t.Helper()
	h := &RunJobHarness{Cmd: cmd, Pids: map[int]int{}, Notify: make(chan struct{}, 1), Exited: make(chan error, 1)}
	stdout, _ := h.Cmd.StdoutPipe()
	stderr, _ := h.Cmd.StderrPipe()
	if err := h.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var readers sync.WaitGroup
	readers.Go(func() { h.Read(stdout) })
	readers.Go(func() { h.Read(stderr) })
	go func() {
		readers.Wait()
		h.Exited <- h.Cmd.Wait()
	}()
	t.Cleanup(func() {
		h.Mu.Lock()
		pids := maps.Clone(h.Pids) // the reader may still add one
		h.Mu.Unlock()
		for _, pid := range pids {
			if pid > 0 { // kill(0) would be this process group
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		_ = h.Cmd.Process.Kill()
	})
	return h
}

// Read takes the launcher's output from r, line by line, until r ends.
func (h *RunJobHarness) Read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<22)
	for sc.Scan() {
		h.readLine(sc.Text(), time.Now())
	}
}

// readLine takes one line of the launcher's output, printed at.
func (h *RunJobHarness) readLine(line string, at time.Time) {
	h.Mu.Lock()
	if m := prefixRe.FindStringSubmatch(line); m != nil {
		var tl TrainerLine
		if json.Unmarshal([]byte(m[2]), &tl) == nil {
			var named struct {
				Worker string `json:"worker"`
			}
			_ = json.Unmarshal([]byte(m[2]), &named)
			tl.WorkerName = named.Worker
			tl.Worker, _ = strconv.Atoi(m[1])
			tl.At = at
			h.Lines = append(h.Lines, tl)
		} else {
			// A worker's own words (an error, a goroutine dump): kept
			// for the log a failing test prints.
			fmt.Fprintln(&h.Log, line)
		}
	} else if strings.HasPrefix(line, `{"event":`) {
		h.Events = append(h.Events, line)
	} else if m := pidRe.FindStringSubmatch(line); m != nil {
		i, _ := strconv.Atoi(m[1])
		h.Pids[i], _ = strconv.Atoi(m[2])
		fmt.Fprintln(&h.Log, line)
	} else {
		fmt.Fprintln(&h.Log, line)
	}
	h.Mu.Unlock()
	select {
	case h.Notify <- struct{}{}:
	default:
	}
}

// LogText is the launcher's log so far.
func (h *RunJobHarness) LogText() string {
	h.Mu.Lock()
	defer h.Mu.Unlock()
	return h.Log.String()
}

// WaitAllAtStep waits (up to 2 minutes) until workers distinct workers have
// printed step step or a later one.
func (h *RunJobHarness) WaitAllAtStep(t *testing.T, step int64, workers int) {
	t.Helper()
	h.WaitFor(t, fmt.Sprintf("step %d on every worker", step), 2*time.Minute, func(lines []TrainerLine) bool {
		seen := map[int]bool{}
		for _, l := range lines {
			if l.Step >= step {
				seen[l.Worker] = true
			}
		}
		return len(seen) == workers
	})
}

// WaitFor waits until cond holds over the lines seen so far.
func (h *RunJobHarness) WaitFor(t *testing.T, what string, timeout time.Duration, cond func(lines []TrainerLine) bool) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		h.Mu.Lock()
		ok := cond(h.Lines)
		h.Mu.Unlock()
		if ok {
			return
		}
		select {
		case <-h.Notify:
		case <-deadline:
			h.TimedOut(t, what)
		}
	}
}

// TimedOut fails the test for a wait on what that timed out, with the
// job's log and, first, the goroutine dumps of its processes (the workers'
// through the launcher, by DumpOnCancel's SIGQUIT), so that a hang says
// where it hung.
func (h *RunJobHarness) TimedOut(t *testing.T, what string) {
	t.Helper()
	if h.Cmd.Cancel != nil {
		_ = h.Cmd.Cancel()
		select {
		case err := <-h.Exited:
			h.Exited <- err
		case <-time.After(30 * time.Second):
		}
	}
	t.Fatalf("timed out waiting for %s; launcher log, with goroutine dumps:\n%s", what, h.LogText())
}

// Pid is the process id of the launcher's worker with that index, waiting a
// while for the launcher to print it.
func (h *RunJobHarness) Pid(t *testing.T, worker int) int {
	t.Helper()
	// The launcher's line with the pid can come after the worker's own
	// Lines (an adopted worker's output is relayed as soon as it is
	// followed): wait for it a while, woken by each line read.
	deadline := time.After(30 * time.Second)
	for {
		h.Mu.Lock()
		pid, ok := h.Pids[worker]
		h.Mu.Unlock()
		if ok {
			return pid
		}
		select {
		case <-h.Notify:
		case <-deadline:
			t.Fatalf("no pid for worker %d", worker)
		}
	}
}

// MaxStep is the newest step in lines.
func MaxStep(lines []TrainerLine) int64 {
	var m int64
	for _, l := range lines {
		m = max(m, l.Step)
	}
	return m
}

// LastSize is the world size of the newest line.
func LastSize(lines []TrainerLine) int {
	if len(lines) == 0 {
		return 0
	}
	return lines[len(lines)-1].Size
}

// SizeAfter is a condition for WaitFor: a step after step committed by a
// world of size workers.
func SizeAfter(step int64, size int) func([]TrainerLine) bool {
	// The harness only appends lines, and WaitFor asks again at every new
	// one: each call looks at the lines the last one had not seen. (At 16
	// workers a thousand lines a second arrive; scanning all of them at
	// each made the test itself a busy process on the machine it measures.)
	seen := 0
	return func(lines []TrainerLine) bool {
		for ; seen < len(lines); seen++ {
			if l := lines[seen]; l.Step > step && l.Size == size {
				return true
			}
		}
		return false
	}
}

// CheckElasticInvariantsSteps checks an elastic job's step lines through its
// world changes: the workers of one world hold the same parameters at each
// step, no worker goes back by more than the interrupted step, training
// reached steps, and the committed steps cover each epoch of samples
// exactly: no sample lost, none trained twice.
func CheckElasticInvariantsSteps(t *testing.T, lines []TrainerLine, samples int, steps int64) {
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
	if MaxStep(lines) != steps {
		t.Fatalf("training stopped at step %d", MaxStep(lines))
	}
	// Samples: the committed record of each step is its newest world's. The
	// committed steps of a data epoch must tile its order exactly: no sample
	// lost, none processed twice. (Each step's range covers every worker's
	// share, also the share of a worker that died before it could print.)
	type span struct{ start, global int }
	byEpoch := map[uint64]map[int64]span{}
	firstLine := map[int64]TrainerLine{}
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
				l.Step, l.WorldEpoch, prev, f.WorkerName, f.Rank, f.Size, sp, l.WorkerName, l.Rank, l.Size)
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

// HaveFashionMNIST says whether Debian's Fashion-MNIST data is installed
// (.ci/install puts it there).
func HaveFashionMNIST() bool {
	_, err := os.Stat("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz")
	return err == nil
}

// Disagreement checks that the workers of one world hold the same parameters
// after each step, and says where they do not. A step number alone does not
// name one run of a step: workers that lose sight of each other (gossip
// declaring a loaded worker dead) train on in worlds of their own, each the
// same step numbers from the same state, until they meet again and the new
// world takes one of their states (the others' steps are rolled back). So
// the lines are compared per step and world: its epoch number and, as two
// proposers cut off from each other may number their worlds alike, its rank
// 0's name (world_rank0, where the trainer reports it).
func Disagreement(lines []TrainerLine) (string, bool) {
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
// Worker, world and plan, so that a failed agreement says what differed.
func describeSteps(lines []TrainerLine, from, to int64) string {
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
