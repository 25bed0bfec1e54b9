package job

import (
	"encoding/json"
	"errors"
	"testing"
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
