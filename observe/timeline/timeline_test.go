package timeline

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/inproc"
)

// traceEvent is the part of a Trace Event Format event the tests check.
type traceEvent struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat"`
	Ph   string         `json:"ph"`
	TS   float64        `json:"ts"`
	Dur  float64        `json:"dur"`
	PID  int            `json:"pid"`
	TID  int            `json:"tid"`
	S    string         `json:"s"`
	Args map[string]any `json:"args"`
}

// parseTrace reads a finished trace strictly: it must be one valid JSON
// array of events.
func parseTrace(t *testing.T, b []byte) []traceEvent {
	t.Helper()
	var evs []traceEvent
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&evs); err != nil {
		t.Fatalf("trace is not a valid JSON array of events: %v\n%s", err, b)
	}
	if dec.More() {
		t.Fatalf("data after the trace's array")
	}
	return evs
}

func closeTimeline(t *testing.T, tl *Timeline) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tl.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// world builds p communicators over the in-process transport, each tracing
// into its own timeline.
func world(t *testing.T, p int, cfg collective.Config, tls []*Timeline) []*collective.Communicator {
	t.Helper()
	w := transport.World{JobID: "timeline-test", Epoch: 7, Addrs: make([]string, p)}
	mesh := inproc.Mesh(inproc.Config{JobID: w.JobID, Epoch: w.Epoch, IOTimeout: 10 * time.Second}, p)
	comms := make([]*collective.Communicator, p)
	for r := range comms {
		w.Rank = r
		c := cfg
		c.Tracer = tls[r].CollectiveTracer()
		comm, err := collective.NewFromLinks(w, mesh[r], c)
		if err != nil {
			t.Fatal(err)
		}
		comms[r] = comm
		t.Cleanup(func() { comm.Close() })
	}
	return comms
}

func onAll(t *testing.T, comms []*collective.Communicator, fn func(ctx context.Context, c *collective.Communicator) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() { errs[r] = fn(ctx, c) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// TestCollectivesTraced runs real collectives with a timeline per rank and
// checks what each trace holds: the metadata naming the process and its
// tracks, one complete event per collective with its description, and its
// phases nested inside it.
func TestCollectivesTraced(t *testing.T) {
	const p = 3
	dir := t.TempDir()
	tls := make([]*Timeline, p)
	for r := range tls {
		var err error
		tls[r], err = Create(filepath.Join(dir, fmt.Sprintf("rank%d.json", r)), Config{ProcessName: fmt.Sprintf("rank %d", r), SortIndex: r, PID: 1000 + r})
		if err != nil {
			t.Fatal(err)
		}
	}
	cfg := collective.DefaultConfig()
	cfg.SmallMessageBytes = 4 << 10
	cfg.ChunkBytes = 4 << 10
	comms := world(t, p, cfg, tls)
	onAll(t, comms, func(ctx context.Context, c *collective.Communicator) error {
		big := make([]float32, 16<<10) // 64 KiB: the ring
		small := make([]float64, 8)    // recursive doubling
		if err := collective.Allreduce(ctx, c, big, big, collective.Average); err != nil {
			return err
		}
		if err := collective.Allreduce(ctx, c, small, small, collective.Sum); err != nil {
			return err
		}
		if err := collective.Broadcast(ctx, c, small, 2); err != nil {
			return err
		}
		return c.Barrier(ctx)
	})
	tls[0].Instant(TrackElastic, "world 7", "elastic", time.Now(), Int("workers", p), Str("note", "quote \" backslash \\ newline \n ctl \x01 bad \xff"))
	tls[0].Counter("world size", time.Now(), p)
	tls[0].SetProcessLabel("rank 0 of 3")
	for _, tl := range tls {
		closeTimeline(t, tl)
	}

	for r := range p {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank%d.json", r)))
		if err != nil {
			t.Fatal(err)
		}
		evs := parseTrace(t, b)
		meta := map[string]bool{}
		var colls, phases []traceEvent
		for _, ev := range evs {
			if ev.PID != 1000+r {
				t.Fatalf("event with pid %d in rank %d's trace", ev.PID, r)
			}
			switch {
			case ev.Ph == "M":
				meta[fmt.Sprintf("%s/%d/%v", ev.Name, ev.TID, ev.Args["name"])] = true
			case ev.Cat == "collective":
				colls = append(colls, ev)
			case ev.Cat == "phase":
				phases = append(phases, ev)
			}
		}
		for _, want := range []string{fmt.Sprintf("process_name/0/rank %d", r), "thread_name/1/collectives", "thread_name/2/elastic", "thread_name/3/training", "thread_name/4/stalls"} {
			if !meta[want] {
				t.Errorf("rank %d: metadata %q missing (have %v)", r, want, meta)
			}
		}
		wantColls := []struct {
			name, algo, dtype, op string
			bytes                 float64
		}{
			{"allreduce", "ring", "float32", "average", 64 << 10},
			{"allreduce", "recursive-doubling", "float64", "sum", 64},
			{"broadcast", "tree", "float64", "", 64},
			{"barrier", "dissemination", "", "", 0},
		}
		if len(colls) != len(wantColls) {
			t.Fatalf("rank %d: %d collective events, want %d: %+v", r, len(colls), len(wantColls), colls)
		}
		for i, w := range wantColls {
			ev := colls[i]
			if ev.Name != w.name || ev.Ph != "X" || ev.TID != int(TrackCollectives) || ev.Args["algorithm"] != w.algo ||
				ev.Args["seq"] != float64(i+1) || ev.Args["epoch"] != float64(7) || ev.Args["rank"] != float64(r) ||
				ev.Args["size"] != float64(p) || ev.Args["bytes"] != w.bytes || ev.Dur <= 0 {
				t.Errorf("rank %d: collective %d is %+v, want %+v", r, i, ev, w)
			}
			if d, _ := ev.Args["dtype"].(string); d != w.dtype {
				t.Errorf("rank %d: collective %d dtype %q, want %q", r, i, d, w.dtype)
			}
			if o, _ := ev.Args["op"].(string); o != w.op {
				t.Errorf("rank %d: collective %d op %q, want %q", r, i, o, w.op)
			}
		}
		if colls[2].Args["root"] != float64(2) {
			t.Errorf("broadcast root %v", colls[2].Args["root"])
		}
		// The ring's two halves; the other collectives are one piece.
		var names []string
		for _, ph := range phases {
			names = append(names, ph.Name)
			parent := colls[int(ph.Args["seq"].(float64))-1]
			if ph.TS < parent.TS || ph.TS+ph.Dur > parent.TS+parent.Dur+0.001 || ph.Args["collective"] != parent.Name {
				t.Errorf("rank %d: phase %+v is not inside its collective %+v", r, ph, parent)
			}
		}
		want := "reduce-scatter allgather"
		if got := strings.Join(names, " "); got != want {
			t.Errorf("rank %d: phases %q, want %q", r, got, want)
		}
		if phases[0].Args["reduce_us"] == nil {
			t.Errorf("rank %d: the reduce-scatter phase has no reduce time: %+v", r, phases[0])
		}
		if r == 0 {
			var inst, counter, label bool
			for _, ev := range evs {
				inst = inst || (ev.Ph == "i" && ev.Name == "world 7" && ev.Args["note"] == "quote \" backslash \\ newline \n ctl \x01 bad \ufffd" && ev.S == "t")
				counter = counter || (ev.Ph == "C" && ev.Name == "world size" && ev.Args["value"] == float64(p))
				label = label || (ev.Ph == "M" && ev.Name == "process_labels" && ev.Args["labels"] == "rank 0 of 3")
			}
			if !inst || !counter || !label {
				t.Errorf("instant %v, counter %v, label %v missing from:\n%s", inst, counter, label, b)
			}
		}
	}

	// The merged trace holds every event of the three.
	var srcs []string
	total := 0
	for r := range p {
		srcs = append(srcs, filepath.Join(dir, fmt.Sprintf("rank%d.json", r)))
		b, _ := os.ReadFile(srcs[r])
		total += len(parseTrace(t, b))
	}
	n, err := MergeFiles(filepath.Join(dir, "job.json"), srcs...)
	if err != nil || n != total {
		t.Fatalf("merged %d events (%v), want %d", n, err, total)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "job.json"))
	if got := len(parseTrace(t, b)); got != total {
		t.Fatalf("merged trace has %d events, want %d", got, total)
	}
}

func TestNilTimelineIsANoOp(t *testing.T) {
	var tl *Timeline
	tl.Complete(TrackTraining, "step", "step", time.Now(), time.Now())
	tl.Instant(TrackElastic, "x", "y", time.Now())
	tl.Counter("c", time.Now(), 1)
	tl.SetProcessLabel("l")
	if tl.CollectiveTracer() != nil || tl.Dropped() != 0 || tl.Close(context.Background()) != nil {
		t.Fatal("a nil timeline did something")
	}
}

// blockingWriter blocks every Write until released: a disk that has stalled.
type blockingWriter struct {
	release chan struct{}
	buf     bytes.Buffer
}

func (w *blockingWriter) Write(p []byte) (int, error) {
	<-w.release
	return w.buf.Write(p)
}

// TestFullBufferDropsAndNeverBlocks: with the writer stuck, recording goes on
// at full speed, dropping and counting what does not fit; the trace then says
// how many were lost; Close gives up when its context ends.
func TestFullBufferDropsAndNeverBlocks(t *testing.T) {
	w := &blockingWriter{release: make(chan struct{})}
	// The header is written before New returns: release it, then stall.
	go func() { w.release <- struct{}{} }()
	tl := New(w, Config{Capacity: 64, FlushInterval: time.Millisecond})
	// New wrote the header in one flush; from now on every write blocks.
	done := make(chan struct{})
	go func() {
		defer close(done)
		now := time.Now()
		for range 10000 {
			tl.Complete(TrackTraining, "step", "training", now, now.Add(time.Millisecond), Int("step", 1))
		}
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("recording blocked on a stalled writer")
	}
	if d := tl.Dropped(); d < 10000-2*64 {
		t.Fatalf("dropped %d of 10000 events with room for 128", d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	err := tl.Close(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close on a stalled writer: %v, want a deadline error", err)
	}
	close(w.release) // the disk recovers
	closeTimeline(t, tl)
	evs := parseTrace(t, w.buf.Bytes())
	var steps int
	var reported float64
	for _, ev := range evs {
		if ev.Name == "step" {
			steps++
		}
		if ev.Name == "timeline dropped events" {
			reported = ev.Args["dropped_total"].(float64)
		}
	}
	if steps+int(tl.Dropped()) != 10000 || reported != float64(tl.Dropped()) {
		t.Fatalf("%d steps written, %d dropped, %v reported dropped: they must add up to 10000", steps, tl.Dropped(), reported)
	}
}

func TestRecordingDoesNotAllocate(t *testing.T) {
	tl := New(io.Discard, Config{Capacity: 1 << 16, FlushInterval: time.Hour})
	defer closeTimeline(t, tl)
	tr := tl.CollectiveTracer()
	op := collective.OpInfo{Collective: "allreduce", Algorithm: "ring", DType: collective.Float32, Op: collective.Sum, Count: 1024, Bytes: 4096, Size: 4}
	now := time.Now()
	for name, fn := range map[string]func(){
		"Complete": func() { tl.Complete(TrackTraining, "step", "training", now, now, Int("step", 3), Str("phase", "fwd")) },
		"Instant":  func() { tl.Instant(TrackElastic, "world", "elastic", now, Int("epoch", 3)) },
		"Counter":  func() { tl.Counter("world size", now, 4) },
		"CollectiveEnd": func() {
			tr.CollectiveStart(op, now)
			tr.CollectivePhase(op, collective.PhaseInfo{Phase: collective.PhaseReduceScatter, Start: now, End: now})
			tr.CollectiveEnd(op, now, now, nil)
		},
	} {
		if a := testing.AllocsPerRun(1000, fn); a != 0 {
			t.Errorf("%s allocates %.1f times per call", name, a)
		}
	}
}

// The kill -9 test runs this test binary as a process that traces until it is
// killed.
const childEnv = "GOROVOD_TIMELINE_TEST_CHILD"

func TestMain(m *testing.M) {
	if path := os.Getenv(childEnv); path != "" {
		os.Exit(runChild(path))
	}
	os.Exit(m.Run())
}

func runChild(path string) int {
	tl, err := Create(path, Config{ProcessName: "doomed", FlushInterval: 5 * time.Millisecond})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	deadline := time.Now().Add(time.Minute) // a child whose parent vanished
	for i := 0; time.Now().Before(deadline); i++ {
		now := time.Now()
		tl.Complete(TrackTraining, "step", "training", now, now.Add(time.Microsecond), Int("step", int64(i)))
		if i%100 == 0 {
			time.Sleep(time.Millisecond) // a trainer's pace
		}
	}
	return 0
}

// TestKilledProcessLeavesALoadableTrace: a process killed with SIGKILL while
// tracing leaves a file whose events up to the cut can be read and merged.
func TestKilledProcessLeavesALoadableTrace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "doomed.json")
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), childEnv+"="+path)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if fi, err := os.Stat(path); err == nil && fi.Size() > 64<<10 {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("the child wrote no trace")
		}
		time.Sleep(5 * time.Millisecond) // polling a file another process writes
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	evs, err := ReadEvents(bufio.NewReader(f))
	if err != nil && !errors.Is(err, ErrTruncated) {
		t.Fatalf("reading the killed process's trace: %v", err)
	}
	steps := 0
	for _, raw := range evs {
		var ev traceEvent
		if err := json.Unmarshal(raw, &ev); err != nil {
			t.Fatalf("event %s: %v", raw, err)
		}
		if ev.Name == "step" {
			if ev.Args["step"] != float64(steps) {
				t.Fatalf("step %v after %d steps: events lost or reordered", ev.Args["step"], steps)
			}
			steps++
		}
	}
	if steps < 100 {
		t.Fatalf("only %d steps read from a %d-event trace (%v)", steps, len(evs), err)
	}
	var merged bytes.Buffer
	f.Seek(0, 0)
	n, err := Merge(&merged, bufio.NewReader(f))
	if err != nil || n != len(evs) {
		t.Fatalf("merged %d events (%v), want %d", n, err, len(evs))
	}
	parseTrace(t, merged.Bytes())
	t.Logf("killed after %d steps; the trace gave %d events (%v)", steps, len(evs), err)
}

func TestReadEvents(t *testing.T) {
	cases := []struct {
		in      string
		n       int
		wantErr string
	}{
		{`[{"name":"a","ph":"i"},{"name":"b","ph":"i"}]`, 2, ""},
		{`[{"name":"a","ph":"i"},{"name":"b","ph":"i"}`, 2, ""},                // no closing bracket: allowed
		{`[{"name":"a","ph":"i"},{"name":"b","p`, 1, "cut off"},                // killed mid-event
		{`{"displayTimeUnit":"ms","traceEvents":[{"name":"a"}],"x":1}`, 1, ""}, // the object form
		{`{"other":1}`, 0, "without traceEvents"},
		{`{"traceEvents":5}`, 0, "not an array"},
		{`[1,2]`, 0, "not a JSON object"},
		{`"hello"`, 0, "not a trace"},
		{``, 0, "cut off"},
	}
	for _, tc := range cases {
		evs, err := ReadEvents(strings.NewReader(tc.in))
		if len(evs) != tc.n || (tc.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("ReadEvents(%q) = %d events, %v; want %d, %q", tc.in, len(evs), err, tc.n, tc.wantErr)
		}
	}
}
