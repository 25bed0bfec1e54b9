package job

import (
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
