package job

import (
	"cmp"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestJobRecord writes a job's record as the runner does and reads it back,
// and refuses records that are not one.
func TestJobRecord(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "job")
	earlier, err := openJobRecord(dir, "job-0", false) // the directory used before
	if err != nil {
		t.Fatal(err)
	}
	earlier.started(WorkerRef{Index: 0, PID: 99})
	earlier.started(WorkerRef{Index: 2, PID: 98})
	earlier.ended(Outcome{})
	earlier.close()
	r, err := openJobRecord(dir, "job-1", false)
	if err != nil {
		t.Fatal(err)
	}
	r.started(WorkerRef{Index: 0, PID: 100})
	r.started(WorkerRef{Index: 1, PID: 101, Host: "node\t2"})
	r.gossip(0, "127.0.0.1:4000")
	r.gossip(0, "127.0.0.1:4001") // it rejoined: the last one counts
	r.exited(WorkerExited{Worker: WorkerRef{Index: 1}, State: Lost, Err: errors.New("signal: killed\nagain")})
	r.exited(WorkerExited{Worker: WorkerRef{Index: 0}, State: Finished})
	r.ended(Outcome{Workers: []WorkerRecord{{State: Finished}, {State: Lost}}, TrainingFinished: true})
	r.close()
	r.line("after", "close") // dropped, not a panic
	var none *jobRecord
	none.started(WorkerRef{}) // Config.OutputDir unset
	none.close()

	got, err := ReadJobRecord(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := JobRecord{JobID: "job-1", RunnerPID: os.Getpid(), Ended: true, Verdict: "ok", Workers: []RecordedWorker{
		{Index: 0, PID: 100, Exited: true, State: "finished", Gossip: "127.0.0.1:4001"},
		{Index: 1, PID: 101, Host: "node 2", Exited: true, State: "lost", Why: "signal: killed again"},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the job's directory: %v (%v), want mode 0700", fi.Mode(), err)
	}

	for _, tc := range []struct{ name, text, err string }{
		{"no job line", "started\t0\t1\t\n", "no job line"},
		{"unknown line", "job\tj\t1\nstopped\t0\n", "line 2: malformed"},
		{"exit of no worker", "job\tj\t1\nexited\t3\tlost\t\n", "line 2: malformed"},
		{"gossip address of no worker", "job\tj\t1\ngossip\t3\t127.0.0.1:1\n", "line 2: malformed"},
		{"bad pid", "job\tj\tx\n", "line 1: malformed"},
		{"unknown stop reason", "job\tj\t1\nstarted\t0\t2\t\nexited\t0\tstopped\tsignal: interrupt\ttired\n", `line 3: unknown stop reason "tired"`},
		{"empty stop reason", "job\tj\t1\nstarted\t0\t2\t\nexited\t0\tstopped\tsignal: interrupt\t\n", `line 3: unknown stop reason ""`},
		{"stop reason in another case", "job\tj\t1\nstarted\t0\t2\t\nexited\t0\tstopped\t\tStuck\n", `line 3: unknown stop reason "Stuck"`},
		{"stop reason of a worker not stopped", "job\tj\t1\nstarted\t0\t2\t\nexited\t0\tfinished\t\tstuck\n", `line 3: a stop reason (stuck) for a worker that ended "finished"`},
		{"exited line with a sixth field", "job\tj\t1\nstarted\t0\t2\t\nexited\t0\tstopped\t\tstuck\tmore\n", "line 3: malformed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := t.TempDir()
			if err := os.WriteFile(filepath.Join(d, recordFile), []byte(tc.text), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := ReadJobRecord(d); err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("got %v, want an error saying %q", err, tc.err)
			}
		})
	}
	if _, err := ReadJobRecord(t.TempDir()); err == nil {
		t.Error("a directory without a record: no error")
	}
}

// TestJobRecordStopReason writes the end of a worker the runner stopped,
// for every StopReason, and reads the reason back, as a runner that takes
// the job back does; an exited line without a reason (the end of a worker
// not stopped, or a record that does not give it) reads as NoStopReason.
func TestJobRecordStopReason(t *testing.T) {
	var reasons []StopReason
	for r := NoStopReason; !strings.HasPrefix(r.String(), "StopReason("); r++ {
		reasons = append(reasons, r)
	}
	if len(reasons) < 6 {
		t.Fatalf("reasons %v: want NoStopReason and the five the runner gives", reasons)
	}
	for _, why := range reasons {
		t.Run(cmp.Or(why.String(), "none"), func(t *testing.T) {
			dir := t.TempDir()
			r, err := openJobRecord(dir, "job-1", false)
			if err != nil {
				t.Fatal(err)
			}
			r.started(WorkerRef{Index: 0, PID: 100})
			r.started(WorkerRef{Index: 1, PID: 101})
			r.exited(WorkerExited{Worker: WorkerRef{Index: 0}, State: Stopped, StopReason: why, Err: errors.New("signal: interrupt")})
			r.exited(WorkerExited{Worker: WorkerRef{Index: 1}, State: Finished})
			r.close()
			got, err := ReadJobRecord(dir)
			if err != nil {
				t.Fatal(err)
			}
			want := []RecordedWorker{
				{Index: 0, PID: 100, Exited: true, State: "stopped", Why: "signal: interrupt", StopReason: why},
				{Index: 1, PID: 101, Exited: true, State: "finished"},
			}
			if !reflect.DeepEqual(got.Workers, want) {
				t.Errorf("got  %+v\nwant %+v", got.Workers, want)
			}
			text, err := os.ReadFile(filepath.Join(dir, recordFile))
			if err != nil {
				t.Fatal(err)
			}
			// Only a stopped worker's line has the fifth field.
			wantLines := "exited\t0\tstopped\tsignal: interrupt\n"
			if why != NoStopReason {
				wantLines = "exited\t0\tstopped\tsignal: interrupt\t" + why.String() + "\n"
			}
			wantLines += "exited\t1\tfinished\t\n"
			if !strings.HasSuffix(string(text), wantLines) {
				t.Errorf("record:\n%s\nwant it to end with\n%s", text, wantLines)
			}
		})
	}

	// A runner gives a reason only with the state "stopped": a WorkerExited
	// of another state carries none to write.
	dir := t.TempDir()
	r, err := openJobRecord(dir, "job-1", false)
	if err != nil {
		t.Fatal(err)
	}
	r.started(WorkerRef{Index: 0, PID: 100})
	r.exited(WorkerExited{Worker: WorkerRef{Index: 0}, State: Lost, StopReason: StopStuck, Err: errors.New("signal: killed")})
	r.close()
	if got, err := ReadJobRecord(dir); err != nil || got.Workers[0].StopReason != NoStopReason || got.Workers[0].State != "lost" {
		t.Errorf("a lost worker's end: %+v, %v; want lost, no stop reason", got.Workers, err)
	}
}

// FuzzReadJobRecord reads arbitrary records: never a panic, and what it
// reads is consistent (a stop reason only for a stopped worker, never a
// reason String does not name).
func FuzzReadJobRecord(f *testing.F) {
	for _, s := range []string{
		"job\tj\t1\nstarted\t0\t2\t\nexited\t0\tstopped\tsignal: interrupt\tstranded\n",
		"job\tj\t1\nstarted\t0\t2\th\nrunning\t0\t3\ngossip\t0\t127.0.0.1:1\nexited\t0\tstopped\t\nadopted\t4\nended\tok\n",
		"job\tj\t1\nstarted\t0\t2\t\nexited\t0\tfinished\t\tstuck\n",
		"job\tj\t1\nstarted\t0\t2\t\nexited\t0\tstopped\t\thost-dropped\nexited\t0\tstopped\t\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, recordFile), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		rec, err := ReadJobRecord(dir)
		if err != nil {
			return
		}
		for _, w := range rec.Workers {
			if w.StopReason != NoStopReason && (w.State != Stopped.String() || strings.HasPrefix(w.StopReason.String(), "StopReason(")) {
				t.Errorf("worker %d: state %q, stop reason %v", w.Index, w.State, w.StopReason)
			}
		}
	})
}
