package stall

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/inproc"
)

// logLines collects log records as "LEVEL message".
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Enabled(context.Context, slog.Level) bool { return true }
func (l *logLines) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.lines = append(l.lines, r.Level.String()+" "+r.Message)
	l.mu.Unlock()
	return nil
}
func (l *logLines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logLines) WithGroup(string) slog.Handler      { return l }
func (l *logLines) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.lines)
}

func world(t *testing.T, p int) []*collective.Communicator {
	t.Helper()
	w := transport.World{JobID: "stall-test", Epoch: 4, Addrs: make([]string, p)}
	mesh := inproc.Mesh(inproc.Config{JobID: w.JobID, Epoch: w.Epoch, IOTimeout: time.Minute}, p)
	comms := make([]*collective.Communicator, p)
	for r := range comms {
		w.Rank = r
		c, err := collective.NewFromLinks(w, mesh[r], collective.DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		comms[r] = c
		t.Cleanup(func() { c.Close() })
	}
	return comms
}

// TestMissingRankFound: ranks 0 and 2 of a world enter an allreduce, rank 1
// does not (its trainer is elsewhere). Both waiting ranks warn, naming the
// collective and the rank they wait for; from the three snapshots the
// driver's Find names rank 1 as missing and the tensors it lacks; once rank
// 1 enters, the collective completes and the warnings stop.
func TestMissingRankFound(t *testing.T) {
	const p = 3
	comms := world(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	logs := make([]*logLines, p)
	ins := make([]*Inspector, p)
	for r, c := range comms {
		logs[r] = &logLines{}
		ins[r] = New(Config{Threshold: 200 * time.Millisecond, Interval: 10 * time.Millisecond, Worker: fmt.Sprintf("w%d", r), Logger: slog.New(logs[r])})
		ins[r].Watch(c)
		ins[r].SetTensors([]string{"grad/dense1", "grad/dense2"})
		go ins[r].Run(ctx)
	}
	errs := make([]error, p)
	var wg sync.WaitGroup
	for _, r := range []int{0, 2} {
		wg.Go(func() {
			buf := make([]float32, 1024)
			errs[r] = collective.Allreduce(ctx, comms[r], buf, buf, collective.Sum)
		})
	}
	for _, r := range []int{0, 2} {
		deadline := time.Now().Add(20 * time.Second)
		for !slices.ContainsFunc(logs[r].get(), func(l string) bool { return strings.HasPrefix(l, "WARN stall:") }) {
			if time.Now().After(deadline) {
				t.Fatalf("rank %d did not warn: %q", r, logs[r].get())
			}
			time.Sleep(10 * time.Millisecond) // polling a log the inspector writes
		}
		warn := logs[r].get()[0]
		for _, want := range []string{fmt.Sprintf("rank %d of world 4", r), "in allreduce #1 (4.0 KiB, recursive-doubling)", "for data from rank 1", "tensors grad/dense1, grad/dense2"} {
			if !strings.Contains(warn, want) {
				t.Errorf("rank %d's warning %q lacks %q", r, warn, want)
			}
		}
	}
	if l := logs[1].get(); len(l) != 0 {
		t.Errorf("rank 1, not in any collective, logged %q", l)
	}
	var snaps []Snapshot
	for _, in := range ins {
		snaps = append(snaps, in.Snapshot())
	}
	st, ok := Find(4, snaps, 200*time.Millisecond)
	if !ok || st.Seq != 1 || st.Collective != "allreduce" || !slices.Equal(st.Waiting, []int{0, 2}) ||
		len(st.Missing) != 1 || st.Missing[1] != 0 || !slices.Equal(st.Tensors, []string{"grad/dense1", "grad/dense2"}) {
		t.Fatalf("Find = %+v, %v", st, ok)
	}
	msg := st.String()
	if !strings.Contains(msg, "missing ranks: 1 (at collective #0, lacks grad/dense1, grad/dense2)") || !strings.Contains(msg, "ranks [0 2] have waited") {
		t.Errorf("message %q", msg)
	}
	t.Log(msg)

	// Rank 1 arrives.
	buf := make([]float32, 1024)
	if err := collective.Allreduce(ctx, comms[1], buf, buf, collective.Sum); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for !slices.ContainsFunc(logs[0].get(), func(l string) bool { return strings.HasPrefix(l, "INFO stall: collective completed") }) {
		if time.Now().After(deadline) {
			t.Fatalf("rank 0 did not log the recovery: %q", logs[0].get())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, ok := Find(4, []Snapshot{ins[0].Snapshot(), ins[1].Snapshot(), ins[2].Snapshot()}, 200*time.Millisecond); ok {
		t.Fatal("a stall found after the collective completed")
	}
}

// TestAbortAfter: a collective stuck past AbortAfter is aborted, with a
// cause that says so.
func TestAbortAfter(t *testing.T) {
	comms := world(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	in := New(Config{Threshold: 100 * time.Millisecond, Interval: 10 * time.Millisecond, AbortAfter: 300 * time.Millisecond})
	in.Watch(comms[0])
	go in.Run(ctx)
	start := time.Now()
	buf := make([]float32, 8)
	err := collective.Allreduce(ctx, comms[0], buf, buf, collective.Sum)
	if !errors.Is(err, collective.ErrAborted) || !strings.Contains(err.Error(), ErrStalled.Error()) {
		t.Fatalf("allreduce: %v", err)
	}
	if took := time.Since(start); took < 300*time.Millisecond || took > 20*time.Second {
		t.Fatalf("aborted after %v", took)
	}
}

// fakeSource reports a fixed progress.
type fakeSource struct{ p collective.Progress }

func (f *fakeSource) Progress() collective.Progress { return f.p }

// TestWarningsRepeatEveryThreshold drives Poll with chosen times.
func TestWarningsRepeatEveryThreshold(t *testing.T) {
	logs := &logLines{}
	var stalls []Snapshot
	in := New(Config{Threshold: time.Minute, Logger: slog.New(logs), OnStall: func(s Snapshot) { stalls = append(stalls, s) }})
	src := &fakeSource{collective.Progress{Epoch: 2, Rank: 1, Size: 4, Started: 7, InFlight: true, WaitingOn: 0,
		Op: collective.OpInfo{Seq: 7, Collective: "broadcast", Algorithm: "tree", Bytes: 3 << 20}}}
	in.Watch(src)
	t0 := time.Unix(1000, 0)
	for _, s := range []int{0, 30, 59, 60, 61, 119, 120, 150} {
		in.Poll(t0.Add(time.Duration(s) * time.Second))
	}
	if len(stalls) != 2 || stalls[0].For != time.Minute || stalls[1].For != 2*time.Minute {
		t.Fatalf("stalls %+v", stalls)
	}
	if got := logs.get(); len(got) != 2 || got[0] != "WARN stall: rank 1 of world 2 has waited 1m0s in broadcast #7 (3.0 MiB, tree) for data from rank 0; a rank that has not entered this collective holds the others up" {
		t.Fatalf("logs %q", got)
	}
	// A new collective starts the clock again; one that ends is logged.
	src.p.Started, src.p.Op.Seq = 8, 8
	in.Poll(t0.Add(151 * time.Second))
	in.Poll(t0.Add(200 * time.Second))
	src.p.InFlight = false
	in.Poll(t0.Add(201 * time.Second))
	if got := logs.get(); len(got) != 3 || !strings.HasPrefix(got[2], "INFO stall: collective completed after a stall") {
		t.Fatalf("logs %q", got)
	}
	if len(stalls) != 2 {
		t.Fatalf("collective #8 (49 s) was reported: %+v", stalls)
	}
}

func TestFind(t *testing.T) {
	snap := func(rank int, started uint64, inFlight bool, wait time.Duration) Snapshot {
		return Snapshot{Epoch: 3, Rank: rank, Size: 4, Started: started, InFlight: inFlight, For: wait, Collective: "allreduce", Taken: time.Unix(100, 0)}
	}
	const th = time.Minute
	cases := []struct {
		name    string
		snaps   []Snapshot
		ok      bool
		waiting []int
		missing map[int]uint64
		unrep   []int
	}{
		{"nobody waited long", []Snapshot{snap(0, 5, true, 10*time.Second), snap(1, 4, false, 0)}, false, nil, nil, nil},
		{"everyone is in it", []Snapshot{snap(0, 5, true, 2*th), snap(1, 5, true, 2*th), snap(2, 5, true, th), snap(3, 5, true, th)}, false, nil, nil, nil},
		{"two behind", []Snapshot{snap(0, 5, true, 2*th), snap(1, 4, false, 0), snap(2, 5, true, th), snap(3, 3, true, 0)}, true, []int{0, 2}, map[int]uint64{1: 4, 3: 3}, nil},
		{"one unreported", []Snapshot{snap(0, 9, true, th), snap(1, 8, false, 0), snap(2, 9, true, th)}, true, []int{0, 2}, map[int]uint64{1: 8}, []int{3}},
		{"another epoch ignored", []Snapshot{snap(0, 5, true, th), {Epoch: 2, Rank: 1, Size: 4, Started: 1}}, false, nil, nil, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st, ok := Find(3, c.snaps, th)
			if ok != c.ok {
				t.Fatalf("ok %v, want %v: %+v", ok, c.ok, st)
			}
			if !ok {
				return
			}
			if !slices.Equal(st.Waiting, c.waiting) || fmt.Sprint(st.Missing) != fmt.Sprint(c.missing) || !slices.Equal(st.Unreported, c.unrep) {
				t.Fatalf("%+v", st)
			}
		})
	}
}
