package job

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/gorovod/gorovod/job/launch"
)

// Workers added while the job runs get a GPU nobody holds, in ring order,
// and a departed worker's GPU goes to the next one.
func TestDevicePool(t *testing.T) {
	p := newDevicePool([]string{"GPU-a", "GPU-b", "GPU-c"})
	for i, want := range []string{"GPU-a", "GPU-b", "GPU-c", ""} {
		if got, ok := p.take(i); got != want || ok != (want != "") {
			t.Fatalf("worker %d got %q, %v, want %q", i, got, ok, want)
		}
	}
	p.release(1)
	if got, _ := p.take(4); got != "GPU-b" {
		t.Fatalf("worker 4 got %q, want the freed GPU-b", got)
	}
	p.release(3) // held nothing: frees nothing
	if got, ok := p.take(5); ok {
		t.Fatalf("worker 5 got %q from a full pool", got)
	}
	var none *devicePool
	if d, ok := none.take(0); ok || d != "" {
		t.Fatal("a nil pool handed out a device")
	}
	none.release(0)
}

func TestWorkerRecordJSON(t *testing.T) {
	b, err := json.Marshal(WorkerRecord{WorkerRef: WorkerRef{Index: 2, PID: 7}, Name: "w", State: Failed, Err: errors.New("exit status 3")})
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got["index"] != 2.0 || got["pid"] != 7.0 || got["name"] != "w" || got["state"] != "failed" || got["error"] != "exit status 3" {
		t.Fatalf("JSON %s", b)
	}
}

// TestVerdict is the end of a job's rules 5–7 on outcomes: a worker lost
// with its host is Lost (an elastic job survives it), one left out that
// exited 0 before the end is Excluded, and the job's verdict is whether
// training finished, not whether some worker was lost or excluded on the way.
func TestVerdict(t *testing.T) {
	if got := classify(fmt.Errorf("on h3: %w", &launch.HostError{Host: "h3", Err: errors.New("lost the connection")}), false); got != Lost {
		t.Fatalf("a worker lost with its host is %v, want lost", got)
	}
	rec := func(s WorkerState) WorkerRecord { return WorkerRecord{State: s} }
	for _, tc := range []struct {
		name     string
		workers  []WorkerRecord
		finished bool
		ok       bool
	}{
		{"finished with workers lost and excluded on the way", []WorkerRecord{rec(Finished), rec(Lost), rec(Excluded), rec(Stopped)}, true, true},
		{"a failed worker fails the job", []WorkerRecord{rec(Finished), rec(Failed)}, true, false},
		{"every worker exited 0 but training did not finish", []WorkerRecord{rec(Finished), rec(Excluded)}, false, false},
		{"only excluded workers", []WorkerRecord{rec(Excluded), rec(Excluded)}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := Outcome{Workers: tc.workers, TrainingFinished: tc.finished, LastStep: 10}
			if err := o.Err(); (err == nil) != tc.ok || err != nil && !errors.Is(err, ErrFailed) {
				t.Fatalf("verdict %v, want ok=%v", err, tc.ok)
			}
		})
	}
	p := &proc{rec: WorkerRecord{State: Finished}, presence: presence{out: true}}
	(&roster{}).reclassifyLocked(p)
	if p.rec.State != Excluded {
		t.Fatalf("a worker left out that exited 0 is %v, want excluded", p.rec.State)
	}
	p = &proc{rec: WorkerRecord{State: Finished}}
	(&roster{standing: standing{trainingOver: true}}).reclassifyLocked(p)
	if p.rec.State != Stopped || p.rec.StopReason != StopNotNeeded {
		t.Fatalf("a worker never admitted that exited 0 after the end is %v (%v), want stopped (not-needed)", p.rec.State, p.rec.StopReason)
	}
}

// The events emitted while the stream holds them (Start launching the first
// workers: one may print and fail before the others are launched) reach the
// sinks after the job's announcement, in the order they came, with the
// lines they carry intact.
func TestEventStreamHoldsUntilAnnounced(t *testing.T) {
	var got []string
	s := newEventStream([]Sink{SinkFunc(func(e Event) {
		switch e := e.(type) {
		case WorkerOutput:
			got = append(got, fmt.Sprintf("output %d %s", e.Worker, e.Line))
		case WorkerExited:
			got = append(got, fmt.Sprintf("exited %d %v", e.Worker.Index, e.State))
		case JobStarted:
			got = append(got, "started "+e.JobID)
		case WorkerStarted:
			got = append(got, fmt.Sprintf("worker %d", e.Worker.Index))
		case Notice:
			got = append(got, "notice "+e.Message)
		}
	})})
	s.hold()
	line := []byte("failing on purpose")
	s.emit(WorkerOutput{Worker: 0, Stream: "stderr", Line: line})
	copy(line, "XXXXXXX") // the launcher's buffer, reused once the call returns
	s.emit(WorkerExited{Worker: WorkerRef{Index: 0}, State: Failed})
	s.notice("no GPU for worker 1")
	if len(got) != 0 {
		t.Fatalf("delivered while held: %q", got)
	}
	s.release(JobStarted{JobID: "j"}, WorkerStarted{Worker: WorkerRef{Index: 0}}, WorkerStarted{Worker: WorkerRef{Index: 1}})
	s.emit(WorkerExited{Worker: WorkerRef{Index: 1}, State: Failed})
	want := []string{"started j", "worker 0", "worker 1", "output 0 failing on purpose", "exited 0 failed", "notice no GPU for worker 1", "exited 1 failed"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("events in the order\n%q\nwant\n%q", got, want)
	}
}
