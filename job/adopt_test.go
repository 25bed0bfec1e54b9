package job

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/sync/epoch"
)

// startSleeper starts a process with env that lives until the test ends
// (killed then by its pid).
func startSleeper(t *testing.T, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	cmd.Env = env
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

// TestReadAdoption looks for the processes of a job's record as a runner
// adopting it does: only a running process of this host whose environment
// names the job and its launch index is adopted; and it refuses a job that
// ended, one without its environment file or with another job's, and one
// whose environment file others could read.
func TestReadAdoption(t *testing.T) {
	const id = "job-adopt"
	env := envconfig.ElasticWorker{JobID: id, Secret: []byte("0123456789abcdef"), Seeds: []string{"127.0.0.1:7946"}}.Environ()
	worker := startSleeper(t, envconfig.EnvJobID+"="+id, envconfig.EnvLaunchIndex+"=0")
	other := startSleeper(t, envconfig.EnvJobID+"=another", envconfig.EnvLaunchIndex+"=1")
	wrongIndex := startSleeper(t, envconfig.EnvJobID+"="+id, envconfig.EnvLaunchIndex+"=7")
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	record := fmt.Sprintf("job\t%s\t1\nstarted\t0\t%d\t\nstarted\t1\t%d\t\nstarted\t2\t%d\t\nstarted\t3\t%d\tnode9\nstarted\t4\t%d\t\nexited\t4\tfinished\t\nstarted\t5\t%d\tlocalhost\n"+
		"gossip\t0\t127.0.0.1:5000\ngossip\t2\t127.0.0.1:5002\ngossip\t3\t198.18.0.9:5003\n",
		id, worker.Process.Pid, other.Process.Pid, dead.Process.Pid, worker.Process.Pid, worker.Process.Pid, wrongIndex.Process.Pid)

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, recordFile), []byte(record), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := writeEnvFile(dir, env); err != nil {
		t.Fatal(err)
	}
	a, err := ReadAdoption(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		running, remote bool
		why             string
	}{
		{true, false, ""},
		{false, false, "another process"},
		{false, false, "gone"},
		{false, true, ""},  // on node9: for the launcher to check there
		{false, false, ""}, // exited under the old runner: its record says how
		{false, false, "another worker of the job than launch index 5"},
	}
	if len(a.Workers) != len(want) {
		t.Fatalf("%d workers, want %d", len(a.Workers), len(want))
	}
	for i, w := range want {
		got := a.Workers[i]
		if got.Running != w.running || got.Remote != w.remote || (w.why == "") != (got.Why == "") || !strings.Contains(got.Why, w.why) {
			t.Errorf("worker %d: running %v remote %v (%q), want %v %v (%q)", i, got.Running, got.Remote, got.Why, w.running, w.remote, w.why)
		}
	}
	if !a.Workers[4].Exited || a.Workers[4].State != "finished" {
		t.Errorf("worker 4: %+v, want its recorded end", a.Workers[4])
	}
	// The driver contacts the workers that may run, not the one gone.
	if want := []string{"127.0.0.1:5000", "198.18.0.9:5003"}; !slices.Equal(a.Contact, want) {
		t.Errorf("contact %v, want %v", a.Contact, want)
	}

	for _, tc := range []struct {
		name   string
		setup  func(dir string)
		refuse string
	}{
		{"ended", func(dir string) {
			f, _ := os.OpenFile(filepath.Join(dir, recordFile), os.O_APPEND|os.O_WRONLY, 0)
			fmt.Fprintf(f, "ended\tok\n")
			f.Close()
		}, "has ended"},
		{"no environment file", func(dir string) { os.Remove(filepath.Join(dir, envFile)) }, "job file"},
		{"another job's environment", func(dir string) {
			_ = writeEnvFile(dir, envconfig.ElasticWorker{JobID: "another", Secret: []byte("0123456789abcdef"), Seeds: []string{"127.0.0.1:1"}}.Environ())
		}, "is of job another"},
		{"environment readable by others", func(dir string) { os.Chmod(filepath.Join(dir, envFile), 0o644) }, "0600"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := t.TempDir()
			if err := os.WriteFile(filepath.Join(d, recordFile), []byte(record), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := writeEnvFile(d, env); err != nil {
				t.Fatal(err)
			}
			tc.setup(d)
			if _, err := ReadAdoption(d); err == nil || !strings.Contains(err.Error(), tc.refuse) {
				t.Errorf("got %v, want a refusal saying %q", err, tc.refuse)
			}
		})
	}
}

// TestRecordAdopted reads the record of a job taken back: the adopting
// runner's pid, and the workers of both runners.
func TestRecordAdopted(t *testing.T) {
	dir := t.TempDir()
	text := "job\tj\t10\nstarted\t0\t11\t\nadopted\t20\nexited\t0\tunknown\tpid 11: exit status not known\nstarted\t1\t0\th2\nrunning\t1\t21\n"
	if err := os.WriteFile(filepath.Join(dir, recordFile), []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	rec, err := ReadJobRecord(dir)
	if err != nil {
		t.Fatal(err)
	}
	if rec.RunnerPID != 20 || rec.Adopted != 1 || len(rec.Workers) != 2 || rec.Workers[0].State != "unknown" || parseState(rec.Workers[0].State) != Unknown ||
		rec.Workers[1].PID != 21 || rec.Workers[1].Host != "h2" {
		t.Errorf("got %+v", rec)
	}
	if err := os.WriteFile(filepath.Join(dir, recordFile), []byte("adopted\t20\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadJobRecord(dir); err == nil {
		t.Error("an adopted line before any job line: no error")
	}
}

// TestRecordedEndStands: the end an adopted job's record gives a worker
// is the one the adopting runner reports when the job ends with training
// over — kept among the records or counted among the earlier workers: a
// stopped worker with the reason the record gives, a finished one
// finished (not stopped as never admitted: rule 6 was the dead runner's to
// apply), and a stopped one whose record gives no reason as such.
func TestRecordedEndStands(t *testing.T) {
	recorded := func(i int, state string, why StopReason) AdoptedWorker {
		return AdoptedWorker{RecordedWorker: RecordedWorker{Index: i, PID: 100 + i, Exited: true, State: state, StopReason: why}}
	}
	workers := []AdoptedWorker{
		recorded(0, "finished", NoStopReason),
		recorded(1, "stopped", StopStuck),
		recorded(2, "stopped", StopHostDropped),
		recorded(3, "stopped", NoStopReason),
		recorded(4, "lost", NoStopReason),
	}
	want := WorkerCounts{Finished: 1, Lost: 1, Stopped: 3, StoppedBy: map[StopReason]int{StopStuck: 1, StopHostDropped: 1, NoStopReason: 1}}
	for _, keep := range []int{len(workers), 1} {
		t.Run(fmt.Sprintf("%d records kept", keep), func(t *testing.T) {
			r := newRoster("here", keep)
			r.mu.Lock()
			for _, w := range workers {
				r.putExitedLocked(recordedEnd(w, parseState(w.State), nil))
			}
			r.mu.Unlock()
			r.setTrainingOver()
			recs, earlier, _ := r.final(epoch.World{})
			got := earlier
			for _, rec := range recs {
				got.add(rec)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("counts %+v, want %+v (records %+v)", got, want, recs)
			}
			if keep == len(workers) {
				for i, w := range workers {
					if recs[i].State != parseState(w.State) || recs[i].StopReason != w.StopReason {
						t.Errorf("worker %d: %v (%v), want %s (%v)", i, recs[i].State, recs[i].StopReason, w.State, w.StopReason)
					}
				}
			}
		})
	}
}

// TestAdoptedProcess follows a process that is not this one's child (as
// after its runner died) by its pid: its output file's new lines, its exit
// (status unknown), and stopping it when the job's context ends.
func TestAdoptedProcess(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script string
		cancel bool
	}{
		{"exits by itself", `echo before >> "$1.stdout"; read x < "$2"; echo one >> "$1.stdout"; echo two >> "$1.stdout"`, false},
		{"stopped", `echo before >> "$1.stdout"; read x < "$2"; echo one >> "$1.stdout"; echo two >> "$1.stdout"; trap 'exit 0' INT; while :; do sleep 0.05; done`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			gate := filepath.Join(dir, "gate")
			if err := os.WriteFile(gate, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			os.Remove(gate)
			if err := exec.Command("mkfifo", gate).Run(); err != nil {
				t.Skipf("mkfifo: %v", err)
			}
			prefix := OutputFiles(dir, 0)
			cmd := exec.Command("sh", "-c", tc.script, "sh", prefix, gate)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			// Reaped here as soon as it exits, as init reaps an orphan.
			waited := make(chan struct{})
			go func() { _ = cmd.Wait(); close(waited) }()
			t.Cleanup(func() { _ = cmd.Process.Kill(); <-waited })
			deadline := time.Now().Add(time.Minute)
			for b, _ := os.ReadFile(prefix + ".stdout"); string(b) != "before\n"; b, _ = os.ReadFile(prefix + ".stdout") {
				if time.Now().After(deadline) {
					t.Fatal("the process wrote nothing")
				}
				time.Sleep(10 * time.Millisecond) // a file another process writes: nothing to wait on
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var mu sync.Mutex
			var lines []string
			p, err := adoptProcess(ctx, dir, RecordedWorker{Index: 0, PID: cmd.Process.Pid}, time.Minute, func(stream string, line []byte) {
				mu.Lock()
				lines = append(lines, stream+":"+string(line))
				mu.Unlock()
			})
			if err != nil {
				t.Fatal(err)
			}
			g, err := os.OpenFile(gate, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			g.WriteString("go\n")
			g.Close()
			if tc.cancel {
				for {
					mu.Lock()
					n := len(lines)
					mu.Unlock()
					if n == 2 {
						break
					}
					if time.Now().After(deadline) {
						t.Fatal("no lines")
					}
					time.Sleep(10 * time.Millisecond)
				}
				cancel()
			}
			select {
			case <-p.Done():
			case <-time.After(time.Minute):
				t.Fatal("the process's exit not seen within a minute")
			}
			if !errors.Is(p.Err(), ErrExitUnknown) {
				t.Errorf("Err %v, want ErrExitUnknown", p.Err())
			}
			if err := p.Signal(StopSignal); !errors.Is(err, os.ErrProcessDone) {
				t.Errorf("signalling an exited process: %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			if strings.Join(lines, ",") != "stdout:one,stdout:two" {
				t.Errorf("lines %q, want the two written after adoption", lines)
			}
		})
	}
}

// TestAdoptingTakesTheJobsProbeTimeout: a runner that takes a job back
// probes blamed workers as long as the job's workers do (its environment's
// GOROVOD_PROBE_TIMEOUT, which a worker that took over from the dead runner
// uses) unless its own Config sets another; a job without one keeps the
// default (0 here: driver.Config's default applies).
func TestAdoptingTakesTheJobsProbeTimeout(t *testing.T) {
	for _, tc := range []struct {
		name           string
		job, own, want time.Duration
	}{
		{"the job's", 3 * time.Second, 0, 3 * time.Second},
		{"its own", 3 * time.Second, time.Second, time.Second},
		{"none", 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := envconfig.ElasticWorker{JobID: "job-adopt", Secret: []byte("0123456789abcdef"), Seeds: []string{"127.0.0.1:7946"},
				ProbeTimeout: tc.job}.Environ()
			cfg, err := Config{ProbeTimeout: tc.own, Adopt: &Adoption{Dir: t.TempDir(), Env: env}}.adopting()
			if err != nil {
				t.Fatal(err)
			}
			if cfg.ProbeTimeout != tc.want {
				t.Fatalf("ProbeTimeout %v, want %v", cfg.ProbeTimeout, tc.want)
			}
		})
	}
}

// TestWithSeeds: a runner that took the job back makes its own address the
// job's seed, and changes nothing else of its environment.
func TestWithSeeds(t *testing.T) {
	env := envconfig.ElasticWorker{JobID: "j", Secret: []byte("0123456789abcdef"), Seeds: []string{"127.0.0.1:7946"}, MinWorkers: 2}.Environ()
	got := withSeeds(env, "127.0.0.1:5000")
	w, err := envconfig.LoadElastic(func(name string) string { return lookupEnv(got, name) })
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(w.Seeds, []string{"127.0.0.1:5000"}) || w.JobID != "j" || w.MinWorkers != 2 || len(got) != len(env) {
		t.Errorf("got %v from %v", got, env)
	}
	if lookupEnv(env, envconfig.EnvSeeds) != "127.0.0.1:7946" {
		t.Errorf("the environment it was given changed: %v", env)
	}
}
