package job_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/internal/testing/testio"
	"github.com/gorovod/gorovod/job"
	"github.com/gorovod/gorovod/observe/timeline"
)

// recorder is a Sink that keeps every event (output lines copied) and lets a
// test wait for one.
type recorder struct {
	mu     sync.Mutex
	events []job.Event
	notify chan struct{}
}

func newRecorder() *recorder { return &recorder{notify: make(chan struct{}, 1)} }

func (r *recorder) Event(e job.Event) {
	if o, ok := e.(job.WorkerOutput); ok {
		o.Line = slices.Clone(o.Line)
		e = o
	}
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

func (r *recorder) all() []job.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// waitFor waits until cond holds over the events so far.
func (r *recorder) waitFor(t *testing.T, what string, cond func([]job.Event) bool) {
	t.Helper()
	deadline := time.After(time.Minute)
	for !cond(r.all()) {
		select {
		case <-r.notify:
		case <-deadline:
			t.Fatalf("timed out waiting for %s; events:\n%s", what, describe(r.all()))
		}
	}
}

func describe(evs []job.Event) string {
	var b strings.Builder
	for _, e := range evs {
		switch e := e.(type) {
		case job.WorkerOutput:
			fmt.Fprintf(&b, "[%d] %s\n", e.Worker, e.Line)
		default:
			fmt.Fprintf(&b, "%T %+v\n", e, e)
		}
	}
	return b.String()
}

// worldOf is a condition: a world of n members has formed.
func worldOf(n int) func([]job.Event) bool {
	return func(evs []job.Event) bool {
		return slices.ContainsFunc(evs, func(e job.Event) bool {
			w, ok := e.(job.WorldChanged)
			return ok && len(w.World.Members) == n
		})
	}
}

func config(t *testing.T, r *recorder, workers int, env ...string) job.Config {
	t.Helper()
	if testing.Short() {
		t.Skip("starts real worker processes; skipped with -short")
	}
	return job.Config{Argv: []string{os.Args[0]}, Workers: workers, Env: env, Sinks: []job.Sink{r}}
}

func run(t *testing.T, cfg job.Config) (job.Outcome, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return job.Run(ctx, cfg)
}

// A job of two workers trains to the end: both finish, every event arrives
// in order, and the outcome accounts for everything.
func TestRunTrainsToTheEnd(t *testing.T) {
	r := newRecorder()
	cfg := config(t, r, 2, envSteps+"=40", envStepTime+"=20ms")
	cfg.MinWorkers = 2 // both train every step
	cfg.ElasticTimeout = 7 * time.Minute
	o, err := run(t, cfg)
	if err != nil {
		t.Fatalf("job failed: %v\n%s", err, describe(r.all()))
	}
	if !o.TrainingFinished || o.Count(job.Finished) != 2 || len(o.Workers) != 2 {
		t.Fatalf("outcome %+v", o)
	}
	if len(o.World.Members) != 2 || o.World.Number == 0 {
		t.Fatalf("last world %+v", o.World)
	}
	if o.LastStep < 10 || o.LastStep > 40 {
		t.Errorf("last step reported %d, want within [10, 40] (step statistics every 10 steps)", o.LastStep)
	}
	for _, w := range o.Workers {
		if w.Name == "" || w.PID == 0 || w.Exited.Before(w.Started) {
			t.Errorf("worker record %+v", w)
		}
	}
	evs := r.all()
	kinds := map[string][]int{} // event type → positions
	steps := map[int]int{}      // launch index → committed steps printed
	minimum := map[int]string{} // launch index → the minimum its environment gave it
	for i, e := range evs {
		kinds[fmt.Sprintf("%T", e)] = append(kinds[fmt.Sprintf("%T", e)], i)
		if out, ok := e.(job.WorkerOutput); ok && out.Stream == "stdout" && strings.HasPrefix(string(out.Line), `{"step"`) {
			steps[out.Worker]++
		}
		if out, ok := e.(job.WorkerOutput); ok && out.Stream == "stdout" && strings.HasPrefix(string(out.Line), "min workers ") {
			minimum[out.Worker] = string(out.Line)
		}
	}
	// Each worker's environment carries the job's minimum
	// (GOROVOD_MIN_WORKERS), which a worker taking over proposing keeps to,
	// and its elastic timeout (GOROVOD_ELASTIC_TIMEOUT), its longest wait
	// for a world.
	if want := "min workers 2, elastic timeout 7m0s"; minimum[0] != want || minimum[1] != want {
		t.Fatalf("what each worker read from its environment: %v, want %q for both", minimum, want)
	}
	first := func(k string) int { return kinds["job."+k][0] }
	if len(kinds["job.JobStarted"]) != 1 || len(kinds["job.WorkerStarted"]) != 2 || len(kinds["job.WorkerExited"]) != 2 ||
		len(kinds["job.TrainingFinished"]) != 1 || len(kinds["job.JobEnded"]) != 1 || len(kinds["job.WorldChanged"]) < 1 {
		t.Fatalf("events:\n%s", describe(evs))
	}
	if !(first("JobStarted") < first("WorkerStarted") && first("TrainingFinished") < kinds["job.JobEnded"][0] &&
		kinds["job.JobEnded"][0] == len(evs)-1) {
		t.Fatalf("events out of order:\n%s", describe(evs))
	}
	if steps[0] != 40 || steps[1] != 40 {
		t.Fatalf("committed steps printed per worker %v, want 40 each", steps)
	}
	w := evs[first("WorldChanged")].(job.WorldChanged)
	if len(w.Joined) != len(w.World.Members) || len(w.Left) != 0 {
		t.Fatalf("first world %+v: every member joined", w)
	}
}

// A worker that exits with an error of its own fails the job, and the error
// names it; one killed by a signal is lost, which the job survives, but not
// when no worker finishes.
func TestRunVerdicts(t *testing.T) {
	for _, tc := range []struct {
		name, modes string
		want        map[job.WorkerState]int
		err         string
	}{
		{"failing worker", "train,fail", map[job.WorkerState]int{job.Finished: 1, job.Failed: 1}, "job failed: worker 1: exit status 3"},
		{"killed worker", "train,kill", map[job.WorkerState]int{job.Finished: 1, job.Lost: 1}, ""},
		{"all killed", "kill", map[job.WorkerState]int{job.Lost: 2}, "job failed: no worker finished"},
		{"not a trainer", "exit", map[job.WorkerState]int{job.Finished: 2},
			"job failed: 2 workers exited without training a step (none joined a world and reported a step or the end of training): is the command a gorovod trainer?"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecorder()
			o, err := run(t, config(t, r, 2, envModes+"="+tc.modes))
			for s, n := range tc.want {
				if o.Count(s) != n {
					t.Errorf("%d workers %v, want %d: %+v", o.Count(s), s, n, o.Workers)
				}
			}
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("job failed: %v\n%s", err, describe(r.all()))
			case tc.err != "" && (err == nil || err.Error() != tc.err || !errors.Is(err, job.ErrFailed)):
				t.Fatalf("error %v, want %q wrapping ErrFailed", err, tc.err)
			}
			var we *job.WorkerError
			var xe *exec.ExitError
			if tc.modes == "train,fail" && (!errors.As(err, &we) || we.Worker != 1 || !errors.As(err, &xe) || xe.ExitCode() != 3) {
				t.Fatalf("error %v does not carry worker 1's exit status", err)
			}
		})
	}
}

// A worker still waiting to join when training is over is stopped, and
// counts as stopped rather than failed; a worker added while the job runs is
// placed and announced.
func TestLateJoinerIsStopped(t *testing.T) {
	r := newRecorder()
	cfg := config(t, r, 2, envModes+"=train,train,wait", envSteps+"=100", envStepTime+"=20ms")
	cfg.MinWorkers = 2
	cfg.MaxWorkers = 3
	j, err := job.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, "a world of 2", worldOf(2))
	if err := j.AddWorkers(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	var limit *job.LimitError
	if err := j.AddWorkers(context.Background(), 1); !errors.As(err, &limit) || limit.Max != 3 {
		t.Fatalf("a fourth worker beyond MaxWorkers 3: %v", err)
	}
	o, err := j.Wait()
	if err != nil {
		t.Fatalf("job failed: %v\n%s", err, describe(r.all()))
	}
	if o.Count(job.Finished) != 2 || o.Count(job.Stopped) != 1 || o.Workers[2].State != job.Stopped {
		t.Fatalf("workers %+v", o.Workers)
	}
	if !slices.ContainsFunc(r.all(), func(e job.Event) bool {
		s, ok := e.(job.WorkerStarted)
		return ok && s.Worker.Index == 2 && !s.Initial
	}) {
		t.Fatal("no WorkerStarted for the added worker")
	}
	if err := j.AddWorkers(context.Background(), 1); err == nil {
		t.Fatal("a worker added to a job that has ended")
	}
}

// Cancelling the job's context stops its workers and ends the job.
func TestCancelStopsTheJob(t *testing.T) {
	r := newRecorder()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	j, err := job.Start(ctx, config(t, r, 2, envSteps+"=100000"))
	if err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, "a world of 2", worldOf(2))
	cancel()
	select {
	case <-j.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the job did not end after its context was cancelled")
	}
	o, _ := j.Wait()
	if o.TrainingFinished || o.Count(job.Running) != 0 {
		t.Fatalf("outcome after cancel %+v", o)
	}
}

func TestBadConfigs(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  job.Config
	}{
		{"no command", job.Config{}},
		{"negative workers", job.Config{Argv: []string{"true"}, Workers: -1}},
		{"min above workers", job.Config{Argv: []string{"true"}, Workers: 2, MinWorkers: 3}},
		{"max below workers", job.Config{Argv: []string{"true"}, Workers: 3, MaxWorkers: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := job.Start(context.Background(), tc.cfg); !errors.Is(err, job.ErrInvalidConfig) {
				t.Fatalf("error %v, want ErrInvalidConfig", err)
			}
		})
	}
	if testing.Short() {
		return
	}
	_, err := job.Run(context.Background(), job.Config{Argv: []string{"/nonexistent/trainer"}, Workers: 2})
	if err == nil || !strings.Contains(err.Error(), "starting worker") {
		t.Fatalf("a trainer that does not exist: %v", err)
	}
}

// A worker started by hand with the job's environment joins the job: it shows
// in the worlds' Joined lists but not among the job's processes.
func TestHandStartedWorkerJoins(t *testing.T) {
	r := newRecorder()
	// Long enough for the hand-started worker to join before training ends.
	cfg := config(t, r, 1, envSteps+"=400", envStepTime+"=20ms")
	cfg.JobFile = true
	cfg.ProbeTimeout = 2 * time.Second
	j, err := job.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	jobFile, err := os.ReadFile(j.JobFile())
	if err != nil {
		t.Fatalf("job file: %v", err)
	}
	// A worker started by hand learns the job's minimum and its size too
	// (the voters of the first world, should it take over proposing), and
	// the driver's probe timeout (what it waits for a blamed worker then).
	for _, want := range []string{envconfig.EnvMinWorkers + "=1", envconfig.EnvFirstWorld + "=1", envconfig.EnvProbeTimeout + "=2s"} {
		if !slices.Contains(j.Environ(), want) || !strings.Contains(string(jobFile), want) {
			t.Fatalf("the job's environment %q and file %q lack %s", j.Environ(), jobFile, want)
		}
	}
	r.waitFor(t, "a world of 1", worldOf(1))
	hand := exec.Command(os.Args[0])
	hand.Env = append(append(os.Environ(), j.Environ()...), envSteps+"=400", envStepTime+"=20ms")
	var handOut testio.Buffer
	hand.Stdout, hand.Stderr = &handOut, &handOut
	if err := hand.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hand.Process.Kill(); hand.Wait() })
	r.waitFor(t, "a world of 2", worldOf(2))
	o, err := j.Wait()
	if err != nil {
		t.Fatalf("job failed: %v\n%s", err, describe(r.all()))
	}
	if len(o.Workers) != 1 {
		t.Fatalf("the job's processes: %+v", o.Workers)
	}
	var joined, byHand []string
	for _, e := range r.all() {
		if w, ok := e.(job.WorldChanged); ok {
			joined = append(joined, w.Joined...)
			byHand = append(byHand, w.ByHand...)
		}
	}
	if !slices.Contains(joined, o.Workers[0].Name) || len(joined) < 2 {
		t.Fatalf("members joined %v; the launched one is %s", joined, o.Workers[0].Name)
	}
	// The hand-started worker is named as such, and counted in the outcome.
	if len(byHand) != 1 || slices.Contains(byHand, o.Workers[0].Name) {
		t.Fatalf("started by hand: %v (joined %v)", byHand, joined)
	}
	// It finished training: in the last world, or, when the launched
	// worker's last collective failed after it had completed its own, out
	// of the world in which the launched one redid the last step.
	if len(o.HandStarted) != 1 || o.HandStarted[0].Name != byHand[0] || !o.HandStarted[0].Finished ||
		o.HandStarted[0].InLastWorld != (o.World.Rank(byHand[0]) >= 0) {
		t.Fatalf("outcome's hand-started workers %+v, want %s finished (last world %v)\n%s\nthe hand-started worker printed:\n%s",
			o.HandStarted, byHand[0], o.World, describe(r.all()), handOut.String())
	}
	if _, err := os.Stat(j.JobFile()); !os.IsNotExist(err) {
		t.Fatalf("job file left behind: %v", err)
	}
}

// With Config.Timeline, every worker writes its part beside the file, the
// runner adds its own, and the parts are merged into the file at the end;
// the workers' statistics reach the sinks with their loss.
func TestTimelineMergedAtTheEnd(t *testing.T) {
	r := newRecorder()
	cfg := config(t, r, 2, envSteps+"=30", envStepTime+"=5ms")
	cfg.MinWorkers = 2
	cfg.Timeline = filepath.Join(t.TempDir(), "job.json")
	o, err := run(t, cfg)
	if err != nil {
		t.Fatalf("job failed: %v\n%s", err, describe(r.all()))
	}
	if o.Timeline != cfg.Timeline {
		t.Fatalf("outcome's timeline %q, want %q\n%s", o.Timeline, cfg.Timeline, describe(r.all()))
	}
	parts, _ := filepath.Glob(cfg.Timeline + ".*")
	if len(parts) != 0 {
		t.Fatalf("parts left behind: %v", parts)
	}
	f, err := os.Open(cfg.Timeline)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	raw, err := timeline.ReadEvents(f)
	if err != nil {
		t.Fatalf("the merged timeline does not parse: %v", err)
	}
	names := map[int]string{} // pid → process name
	count := map[string]int{} // "pid name" → events
	for _, b := range raw {
		var e struct {
			Name string         `json:"name"`
			Pid  int            `json:"pid"`
			Args map[string]any `json:"args"`
		}
		if err := json.Unmarshal(b, &e); err != nil {
			t.Fatal(err)
		}
		if e.Name == "process_name" {
			names[e.Pid], _ = e.Args["name"].(string)
		}
		count[fmt.Sprint(e.Pid, " ", e.Name)]++
	}
	if len(names) != 3 {
		t.Fatalf("processes in the timeline: %v", names)
	}
	for _, w := range o.Workers {
		if !strings.HasPrefix(names[w.PID], fmt.Sprintf("worker %d (", w.Index)) || count[fmt.Sprint(w.PID, " step")] != 30 ||
			count[fmt.Sprint(w.PID, " allreduce")] < 30 || count[fmt.Sprint(w.PID, " state broadcast")] == 0 {
			t.Errorf("worker %d (pid %d, %q): events %v", w.Index, w.PID, names[w.PID], count)
		}
	}
	if !strings.HasPrefix(names[os.Getpid()], "driver (") || count[fmt.Sprint(os.Getpid(), " worker 0 started")] != 1 ||
		count[fmt.Sprint(os.Getpid(), " training finished")] != 1 {
		t.Errorf("the driver's events: %v", count)
	}
	var losses int
	for _, e := range r.all() {
		if s, ok := e.(job.StepsReported); ok {
			for _, st := range s.Steps {
				if st.HasLoss && float32(st.Loss) == float32(1/float64(st.Step)) && st.Bytes == 64*4 { // the wire carries a float32
					losses++
				}
			}
		}
	}
	if losses != 60 {
		t.Errorf("%d steps reported with their loss and bytes, want 60", losses)
	}
}
