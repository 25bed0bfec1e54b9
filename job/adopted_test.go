package job_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/job"
)

// TestStopReasonAfterAdoption: a job below its minimum for good (its second
// worker fails, MinWorkers 2) stops its first worker as stranded, and its
// record says why. A runner that takes the job back (Config.Adopt: the
// record without its end, as a runner that died leaves it, and a worker of
// the job still running) reports that worker stopped for the same reason,
// in its outcome, its counts by reason and its JSON.
func TestStopReasonAfterAdoption(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "job")
	r := newRecorder()
	cfg := config(t, r, 2, envModes+"=train,fail")
	cfg.MinWorkers, cfg.ReplaceLost, cfg.OutputDir = 2, true, dir
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	o, _ := job.Run(ctx, cfg)
	if w := o.Workers[0]; w.State != job.Stopped || w.StopReason != job.StopStranded {
		t.Fatalf("worker 0 %v (%v), want stopped (stranded)\n%s", w.State, w.StopReason, describe(r.all()))
	}
	rec, err := job.ReadJobRecord(dir)
	if err != nil {
		t.Fatal(err)
	}
	if w := rec.Workers[0]; w.State != "stopped" || w.StopReason != job.StopStranded {
		t.Fatalf("the record gives worker 0 as %q (%v), want stopped (stranded)", w.State, w.StopReason)
	}

	// The runner died before the job ended: no ended line, and a worker of
	// the job (launch index 2) still runs.
	a := abandonJob(t, dir, rec.JobID, map[int]string{2: ""})

	r = newRecorder()
	j, acancel := takeBack(t, r, a)
	r.waitFor(t, "the job taken back", func(evs []job.Event) bool {
		return slices.ContainsFunc(evs, func(e job.Event) bool {
			s, ok := e.(job.JobStarted)
			return ok && s.Adopted
		})
	})
	acancel() // the adopted worker is stopped, and the job ends
	select {
	case <-j.Done():
	case <-time.After(time.Minute):
		t.Fatalf("the adopted job did not end a minute after its context was cancelled\n%s", describe(r.all()))
	}
	o, _ = j.Wait()
	i := slices.IndexFunc(o.Workers, func(w job.WorkerRecord) bool { return w.Index == 0 })
	if i < 0 {
		t.Fatalf("no record of worker 0 in the adopted job's outcome: %+v", o.Workers)
	}
	if w := o.Workers[i]; w.State != job.Stopped || w.StopReason != job.StopStranded {
		t.Errorf("after adoption, worker 0 %v (%v), want stopped (stranded)\n%s", w.State, w.StopReason, describe(r.all()))
	}
	if n, none := o.CountStopped(job.StopStranded), o.CountStopped(job.NoStopReason); n != 1 || none != 0 {
		t.Errorf("after adoption, %d stopped as stranded and %d for no reason given, want 1 and 0", n, none)
	}
	b, err := json.Marshal(o.Workers[i])
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"stop_reason":"stranded"`) {
		t.Errorf("worker 0's JSON after adoption: %s, want its stop reason", b)
	}
}

// A runner that takes a job back stops the workers it finds on hosts that
// its Discovery's list lacks (an allocation that shrank while no runner
// watched), as it stops those of a host the list drops, and keeps those
// on listed hosts. The list comes before the workers are taken back, and
// no later list drops a host that no list named.
func TestAdoptedWorkersOnUnlistedHostsStop(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "job")
	r := newRecorder()
	cfg := config(t, r, 1, envSteps+"=3")
	cfg.OutputDir = dir
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := job.Run(ctx, cfg); err != nil {
		t.Fatalf("the first runner's job: %v\n%s", err, describe(r.all()))
	}
	rec, err := job.ReadJobRecord(dir)
	if err != nil {
		t.Fatal(err)
	}
	// The runner died before the job ended (no ended line), leaving
	// workers 1 and 2 running: 1 on this host as a local job places it
	// (host ""), 2 on 127.0.0.2, which the new runner's list (the default,
	// this host) does not name.
	a := abandonJob(t, dir, rec.JobID, map[int]string{1: "", 2: "127.0.0.2"})

	r = newRecorder()
	j, acancel := takeBack(t, r, a)
	r.waitFor(t, "worker 2, on the unlisted host, exited", func(evs []job.Event) bool {
		return slices.ContainsFunc(evs, func(e job.Event) bool {
			x, ok := e.(job.WorkerExited)
			return ok && x.Worker.Index == 2
		})
	})
	acancel()
	select {
	case <-j.Done():
	case <-time.After(time.Minute):
		t.Fatalf("the adopted job did not end a minute after its context was cancelled\n%s", describe(r.all()))
	}
	o, _ := j.Wait()
	for _, tc := range []struct {
		index   int
		dropped bool
	}{{1, false}, {2, true}} {
		i := slices.IndexFunc(o.Workers, func(w job.WorkerRecord) bool { return w.Index == tc.index })
		if i < 0 {
			t.Fatalf("no record of worker %d in the adopted job's outcome: %+v", tc.index, o.Workers)
		}
		w := o.Workers[i]
		if got := w.State == job.Stopped && w.StopReason == job.StopHostDropped; got != tc.dropped {
			t.Errorf("worker %d on host %q: %v (%v), stopped as its host's? %v, want %v\n%s", tc.index, w.Host, w.State, w.StopReason, got, tc.dropped, describe(r.all()))
		}
	}
	if !slices.ContainsFunc(r.all(), func(e job.Event) bool {
		n, ok := e.(job.Notice)
		return ok && strings.Contains(n.Message, `host "127.0.0.2" left the job`)
	}) {
		t.Errorf("no notice of host 127.0.0.2 leaving the job\n%s", describe(r.all()))
	}
}

// abandonJob makes the job record in dir one that a runner which died
// leaves (no ended line), with a process of the job still running for
// each launch index in hosts, recorded on its host (a sleeper with the
// job's id and the index in its environment, killed when the test ends),
// and returns the adoption read from it.
func abandonJob(t *testing.T, dir, jobID string, hosts map[int]string) *job.Adoption {
	t.Helper()
	path := filepath.Join(dir, "record.tsv")
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := slices.DeleteFunc(strings.SplitAfter(string(text), "\n"), func(l string) bool { return strings.HasPrefix(l, "ended\t") })
	for _, index := range slices.Sorted(maps.Keys(hosts)) {
		sleeper := exec.Command("sleep", "600")
		sleeper.Env = []string{envconfig.EnvJobID + "=" + jobID, fmt.Sprintf("%s=%d", envconfig.EnvLaunchIndex, index)}
		if err := sleeper.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() })
		lines = append(lines, fmt.Sprintf("started\t%d\t%d\t%s\n", index, sleeper.Process.Pid, hosts[index]))
	}
	if err := os.WriteFile(path, []byte(strings.Join(lines, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := job.ReadAdoption(dir)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// takeBack starts a runner that takes the job of a back (its own workers
// would wait for a world); cancel stops it, and the test's end does.
func takeBack(t *testing.T, r *recorder, a *job.Adoption) (*job.Job, context.CancelFunc) {
	t.Helper()
	cfg := config(t, r, 1, envModes+"=wait")
	cfg.Adopt = a
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	j, err := job.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return j, cancel
}
