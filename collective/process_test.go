package collective

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/tcp"
	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/job/launch"
	"github.com/gorovod/gorovod/job/rendezvous"
)

// The process tests re-run this test binary as worker processes: with
// envWorkerScenario set, TestMain runs that scenario as one rank instead of the
// tests.
const envWorkerScenario = "GOROVOD_TEST_SCENARIO"

func TestMain(m *testing.M) {
	if s := os.Getenv(envWorkerScenario); s != "" {
		if err := workerMain(s); err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// event is what a worker reports on stdout, one JSON object a line.
type event struct {
	Rank  int    `json:"rank"`
	Kind  string `json:"kind"` // "step", "done", "error"
	Step  int    `json:"step,omitempty"`
	Type  string `json:"type,omitempty"` // the error's type
	Peer  int    `json:"peer"`           // the rank the error names
	Cause string `json:"cause,omitempty"`
	Msg   string `json:"msg,omitempty"`
}

func emit(e event) {
	b, _ := json.Marshal(e)
	fmt.Printf("%s\n", b)
}

func workerMain(scenario string) error {
	env, err := envconfig.Load(os.Getenv)
	if err != nil {
		return err
	}
	cfg := tcp.DefaultConfig()
	// The failure scenario needs a short I/O timeout to see a frozen peer
	// quickly; the others a long one, so a loaded CI machine cannot fail them.
	cfg.Secret, cfg.IOTimeout = env.Secret, 20*time.Second
	if scenario == "loop" || scenario == "hierloop" {
		cfg.IOTimeout = time.Second
	}
	t, err := tcp.Listen(cfg)
	if err != nil {
		return err
	}
	defer t.Close()
	ctx := context.Background()
	joinCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	addrs, err := rendezvous.JoinSecret(joinCtx, env.Rendezvous, env.Rank, t.Addr(), env.Secret)
	if err != nil {
		return err
	}
	w := transport.World{JobID: env.JobID, Epoch: 1, Rank: env.Rank, Addrs: addrs}
	ccfg := Config{SmallMessageBytes: 4096, ChunkBytes: 16 << 10, AbortTimeout: 200 * time.Millisecond}
	if scenario == "hierloop" {
		// Two ranks a declared host, the hierarchical allreduce forced.
		w.Hosts = make([]string, len(addrs))
		for r := range w.Hosts {
			w.Hosts[r] = fmt.Sprintf("host%d", r/2)
		}
		ccfg.Algorithm = AlgorithmHierarchical
	}
	c, err := New(joinCtx, t, w, ccfg)
	if err != nil {
		return err
	}
	defer c.Close()
	switch scenario {
	case "reference":
		return referenceScenario(ctx, c)
	case "loop", "hierloop":
		return loopScenario(ctx, c)
	}
	return fmt.Errorf("unknown scenario %q", scenario)
}

// referenceScenario runs every collective, dtype and op against the reference.
func referenceScenario(ctx context.Context, c *Communicator) error {
	p, r := c.Size(), c.Rank()
	for _, dt := range allDTypes {
		for _, op := range allOps {
			for _, n := range []int{0, 1, 7, 1000, 30001} {
				in := inputs(dt, op, p, n)
				want := referenceReduce(dt, op, in, 1, 1)
				buf := encode(dt, in[r])
				if err := c.Allreduce(ctx, HostBuffer(dt, buf), HostBuffer(dt, buf), op); err != nil {
					return err
				}
				if err := sameElems(dt, buf, want); err != nil {
					return fmt.Errorf("allreduce %v %v n=%d: %w", dt, op, n, err)
				}
				counts := evenCounts(n, p)
				seg := make([]byte, counts[r]*dt.Size())
				if err := c.ReduceScatter(ctx, HostBuffer(dt, encode(dt, in[r])), HostBuffer(dt, seg), op); err != nil {
					return err
				}
				off := 0
				for i := range r {
					off += counts[i]
				}
				if err := sameElems(dt, seg, want[off:off+counts[r]]); err != nil {
					return fmt.Errorf("reducescatter %v %v n=%d: %w", dt, op, n, err)
				}
			}
		}
		for _, n := range []int{0, 3, 20000} {
			all := make([]byte, p*n*dt.Size())
			if err := c.Allgather(ctx, HostBuffer(dt, encode(dt, inputs(dt, Sum, p, n)[r])), HostBuffer(dt, all)); err != nil {
				return err
			}
			for q := range p {
				part := all[q*n*dt.Size() : (q+1)*n*dt.Size()]
				if !bytes.Equal(part, encode(dt, inputs(dt, Sum, p, n)[q])) {
					return fmt.Errorf("allgather %v n=%d: block of rank %d differs", dt, n, q)
				}
			}
			b := make([]byte, n*dt.Size())
			if r == p-1 {
				copy(b, encode(dt, inputs(dt, Sum, p, n)[r]))
			}
			if err := c.Broadcast(ctx, HostBuffer(dt, b), p-1); err != nil {
				return err
			}
			if !bytes.Equal(b, encode(dt, inputs(dt, Sum, p, n)[p-1])) {
				return fmt.Errorf("broadcast %v n=%d differs", dt, n)
			}
			send := encode(dt, inputs(dt, Sum, p, p*n)[r])
			recv := make([]byte, len(send))
			if err := c.Alltoall(ctx, HostBuffer(dt, send), HostBuffer(dt, recv)); err != nil {
				return err
			}
			for q := range p {
				from := encode(dt, inputs(dt, Sum, p, p*n)[q])
				bs := n * dt.Size()
				if !bytes.Equal(recv[q*bs:(q+1)*bs], from[r*bs:(r+1)*bs]) {
					return fmt.Errorf("alltoall %v n=%d: block from rank %d differs", dt, n, q)
				}
			}
		}
	}
	emit(event{Rank: r, Kind: "done"})
	return c.Barrier(ctx)
}

// loopScenario allreduces until something breaks, reporting every step and
// then the error, classified.
func loopScenario(ctx context.Context, c *Communicator) error {
	buf := make([]float32, 256<<10)
	for step := 1; ; step++ {
		err := Allreduce(ctx, c, buf, buf, Sum)
		if err == nil {
			emit(event{Rank: c.Rank(), Kind: "step", Step: step})
			continue
		}
		e := event{Rank: c.Rank(), Kind: "error", Peer: -1, Msg: err.Error()}
		var pe *PeerError
		var ra *RemoteAbortError
		switch {
		case errors.As(err, &pe):
			e.Type, e.Peer = "PeerError", pe.Rank
			switch {
			case errors.Is(err, ErrPeerTimeout):
				e.Cause = "timeout"
			case errors.Is(err, ErrPeerClosed):
				e.Cause = "closed"
			}
		case errors.As(err, &ra):
			e.Type, e.Peer = "RemoteAbortError", ra.Rank
		default:
			e.Type = fmt.Sprintf("%T", err)
		}
		emit(e)
		return nil
	}
}

// processJob launches np copies of this test binary running scenario and
// collects their events.
type processJob struct {
	*launch.Job
	mu     sync.Mutex
	events []event
	stderr strings.Builder
	notify chan struct{}
}

func startProcesses(t *testing.T, np int, scenario string) *processJob {
	t.Helper()
	if testing.Short() {
		t.Skip("process tests start real worker processes; skipped with -short")
	}
	pj := &processJob{notify: make(chan struct{}, 1)}
	output := func(rank int, stream string, line []byte) {
		pj.mu.Lock()
		defer pj.mu.Unlock()
		var e event
		if stream == "stdout" && json.Unmarshal(line, &e) == nil && e.Kind != "" {
			pj.events = append(pj.events, e)
			select {
			case pj.notify <- struct{}{}:
			default:
			}
			return
		}
		fmt.Fprintf(&pj.stderr, "[%d %s] %s\n", rank, stream, line)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	env, stop, err := launch.FixedWorld(launch.NewJobID(), np)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	job, err := launch.Start(ctx, launch.Spec{
		Argv: []string{os.Args[0]}, NP: np, Output: output, StopGrace: time.Second,
		Env: func(i int) []string { return append(env(i), envWorkerScenario+"="+scenario) },
	})
	if err != nil {
		t.Fatal(err)
	}
	pj.Job = job
	t.Cleanup(func() {
		job.Signal(syscall.SIGKILL)
		<-job.Done()
	})
	return pj
}

// waitFor waits until cond holds over the events seen so far.
func (pj *processJob) waitFor(t *testing.T, timeout time.Duration, what string, cond func([]event) bool) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		pj.mu.Lock()
		ok := cond(pj.events)
		pj.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-pj.notify:
		case <-pj.Done():
			pj.mu.Lock()
			ok := cond(pj.events)
			pj.mu.Unlock()
			if !ok {
				t.Fatalf("workers exited before %s; output:\n%s", what, pj.stderr.String())
			}
			return
		case <-deadline:
			t.Fatalf("timed out waiting for %s; output:\n%s", what, pj.stderr.String())
		}
	}
}

func TestProcessesAgainstReference(t *testing.T) {
	for _, np := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			pj := startProcesses(t, np, "reference")
			if err := pj.Wait(); err != nil {
				t.Fatalf("%v\n%s", err, pj.stderr.String())
			}
			done := 0
			for _, e := range pj.events {
				if e.Kind == "done" {
					done++
				}
			}
			if done != np {
				t.Fatalf("%d of %d workers finished", done, np)
			}
		})
	}
}

// stepsPast reports whether every rank in ranks has done at least n steps.
func stepsPast(ranks []int, n int) func([]event) bool {
	return func(ev []event) bool {
		best := map[int]int{}
		for _, e := range ev {
			if e.Kind == "step" {
				best[e.Rank] = max(best[e.Rank], e.Step)
			}
		}
		for _, r := range ranks {
			if best[r] < n {
				return false
			}
		}
		return true
	}
}

func errorsFrom(ranks []int) func([]event) bool {
	return func(ev []event) bool {
		seen := map[int]bool{}
		for _, e := range ev {
			if e.Kind == "error" {
				seen[e.Rank] = true
			}
		}
		for _, r := range ranks {
			if !seen[r] {
				return false
			}
		}
		return true
	}
}

func TestProcessPeerFailures(t *testing.T) {
	cases := []struct {
		name     string
		signal   syscall.Signal
		cause    string // what the victim's neighbours must see
		scenario string
		np       int
	}{
		{"SIGSTOP", syscall.SIGSTOP, "timeout", "loop", 3},
		{"SIGKILL", syscall.SIGKILL, "closed", "loop", 3},
		// Two declared hosts of two ranks, the hierarchical allreduce: the
		// victim's partners inside its host and across hosts see it.
		{"hierarchical/SIGSTOP", syscall.SIGSTOP, "timeout", "hierloop", 4},
		{"hierarchical/SIGKILL", syscall.SIGKILL, "closed", "hierloop", 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			np, victim := tc.np, tc.np-1
			var survivors, all []int
			for r := range np {
				all = append(all, r)
				if r != victim {
					survivors = append(survivors, r)
				}
			}
			pj := startProcesses(t, np, tc.scenario)
			pj.waitFor(t, 60*time.Second, "the first steps", stepsPast(all, 3))
			if err := syscall.Kill(pj.PIDs()[victim], tc.signal); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			// The I/O timeout is 1 s: a frozen peer must be reported well
			// within a few of those, a dead one at once.
			pj.waitFor(t, 10*time.Second, "the survivors' errors", errorsFrom(survivors))
			elapsed := time.Since(start)
			pj.mu.Lock()
			defer pj.mu.Unlock()
			namedVictim := false
			for _, e := range pj.events {
				if e.Kind != "error" {
					continue
				}
				if e.Type != "PeerError" && e.Type != "RemoteAbortError" {
					t.Errorf("rank %d: untyped error %s: %s", e.Rank, e.Type, e.Msg)
				}
				if e.Type == "PeerError" && e.Peer == victim {
					namedVictim = true
					if e.Cause != tc.cause {
						t.Errorf("rank %d: cause %q, want %q (%s)", e.Rank, e.Cause, tc.cause, e.Msg)
					}
				}
			}
			if !namedVictim {
				t.Errorf("no survivor named rank %d: %+v", victim, pj.events)
			}
			t.Logf("%s of rank %d reported by the survivors after %v", tc.name, victim, elapsed)
		})
	}
}
