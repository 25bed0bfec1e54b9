package membership

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"
)

// Bounds the cluster tests assert. The tuned defaults do much better on an
// idle machine (see the latencies the tests log); the bounds leave room for
// -race on two shared, loaded cores without letting a real regression (for
// example memberlist's 4-5 s local-config detection) pass.
const (
	joinBound   = 5 * time.Second // all members see all; expect well under 1 s
	leaveBound  = 2 * time.Second // graceful leave seen as Left; expect < 300 ms
	detectBound = 3 * time.Second // crash seen as Failed; expect ~0.6-1.2 s
)

// testSecret is new in every test process: test binaries of this package run
// concurrently (go test ./... from several checkouts, -count, other engineers)
// and a member of one, dialling a port that a member of another has since
// bound, would otherwise really join it.
var testSecret = []byte("membership test secret " + randHex(16))

const testJob = "job-test"

// testLogger discards, unless GOROVOD_MEMBERSHIP_LOG=debug|info|warn asks for
// memberlist's and this package's diagnostics on stderr. (Not t.Log:
// memberlist's goroutines may still log after a test returns.)
func testLogger() *slog.Logger {
	var lvl slog.Level
	switch os.Getenv("GOROVOD_MEMBERSHIP_LOG") {
	case "debug":
		lvl = slog.LevelDebug
	case "info":
		lvl = slog.LevelInfo
	case "warn":
		lvl = slog.LevelWarn
	default:
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// testConfig returns the defaults with the test secret and a short readable name.
func testConfig(name string) Config {
	cfg := DefaultConfig()
	cfg.Secret = testSecret
	cfg.Name = name + "-" + randHex(3)
	cfg.Logger = testLogger()
	return cfg
}

func testMeta(i int) Meta {
	return Meta{
		JobID:          testJob,
		CollectiveAddr: fmt.Sprintf("127.0.0.1:%d", 40000+i),
		Host:           "host-a",
		GPUs:           i % 3,
		Extra:          map[string]string{"slot": fmt.Sprint(i)},
	}
}

// join starts a member and shuts it down when the test ends.
func join(t *testing.T, cfg Config, meta Meta) *Member {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	m, err := Join(ctx, cfg, meta)
	if err != nil {
		t.Fatalf("Join %s: %v", cfg.Name, err)
	}
	t.Cleanup(func() { _ = m.Shutdown() })
	return m
}

// joinAll starts members 1..n-1 at the same time (as workers of a job do), each
// through seeds(i), and returns them in order.
func joinAll(t *testing.T, first []*Member, n int, seeds func(i int) []string) []*Member {
	t.Helper()
	ms := slices.Clone(first)
	ms = slices.Grow(ms, n-len(first))[:n]
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := len(first); i < n; i++ {
		wg.Go(func() {
			cfg := testConfig(fmt.Sprintf("m%d", i))
			cfg.Seeds = seeds(i)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			ms[i], errs[i] = Join(ctx, cfg, testMeta(i))
		})
	}
	wg.Wait()
	for i := len(first); i < n; i++ {
		if ms[i] != nil {
			t.Cleanup(func() { _ = ms[i].Shutdown() })
		}
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Join member %d: %v", i, err)
		}
	}
	return ms
}

// waitFor waits until cond holds, re-checking it after every event m reports
// (m's state changes exactly when it queues an event). It consumes m's events.
func waitFor(t *testing.T, m *Member, deadline time.Time, what string, cond func() bool) {
	t.Helper()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for !cond() {
		select {
		case _, ok := <-m.Events():
			if !ok {
				t.Fatalf("%s: %s's events closed", what, m.Name())
			}
		case <-timer.C:
			t.Fatalf("%s: not reached by %s in time; members %v", what, m.Name(), names(m.Members()))
		}
	}
}

// waitEvent returns the first event of m that matches, consuming the others.
func waitEvent(t *testing.T, m *Member, deadline time.Time, what string, match func(Event) bool) Event {
	t.Helper()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		select {
		case e, ok := <-m.Events():
			if !ok {
				t.Fatalf("%s: %s's events closed", what, m.Name())
			}
			if match(e) {
				return e
			}
		case <-timer.C:
			t.Fatalf("%s: no matching event at %s in time; members %v", what, m.Name(), names(m.Members()))
		}
	}
}

// eventually polls cond until it holds or the deadline passes, for state that
// no event announces (counters).
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %v", what, timeout)
		}
		<-tick.C
	}
}

func names(ns []Node) []string {
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = n.Name
	}
	return out
}

func hasMember(m *Member, name string) bool {
	return slices.Contains(names(m.Members()), name)
}

// waitConverged waits until every member lists exactly the names of ms, and
// returns how long that took from start.
func waitConverged(t *testing.T, ms []*Member, start time.Time) time.Duration {
	t.Helper()
	want := make([]string, len(ms))
	for i, m := range ms {
		want[i] = m.Name()
	}
	sort.Strings(want)
	deadline := start.Add(joinBound)
	seesAll := func(m *Member) bool {
		got := names(m.Members())
		sort.Strings(got)
		return slices.Equal(got, want)
	}
	for {
		for _, m := range ms {
			waitFor(t, m, deadline, "convergence", func() bool { return seesAll(m) })
		}
		// All at once: a member that saw all may have lost one while the
		// others caught up (a probe that timed out on a loaded machine
		// makes a member suspect, then dead, until it refutes).
		i := slices.IndexFunc(ms, func(m *Member) bool { return !seesAll(m) })
		if i < 0 {
			return time.Since(start)
		}
		t.Logf("member %d lost sight of a member after seeing all (now %v); waiting again", i, names(ms[i].Members()))
	}
}

// freePort returns a port that was free for both TCP and UDP on loopback a
// moment ago (memberlist needs the same port for both).
func freePort(t *testing.T) int {
	t.Helper()
	for range 20 {
		l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
		l.Close()
		if err == nil {
			u.Close()
			return port
		}
	}
	t.Fatal("no free TCP+UDP port")
	return 0
}

// freePortExcept is freePort, never returning taken.
func freePortExcept(t *testing.T, taken int) int {
	t.Helper()
	for range 20 {
		if port := freePort(t); port != taken {
			return port
		}
	}
	t.Fatalf("no free TCP+UDP port other than %d", taken)
	return 0
}

// signedFrame is the frame member from sends to the member named to: signed
// with from's key, under from's next sequence number to it.
func signedFrame(from *Member, to string, kind uint8, payload []byte) []byte {
	return signFrame(from.signKey, to, &frame{kind: kind, jobID: from.jobID, from: from.name, seq: from.nextSeq(to), payload: payload})
}

// unsignedFrame is a well-formed frame whose signature is all zeros.
func unsignedFrame(job, from string, kind uint8, payload []byte) []byte {
	return appendFrame(nil, &frame{kind: kind, jobID: job, from: from, seq: 1, payload: payload, sig: make([]byte, frameSigSize)})
}

// sealAs is meta sealed by member m as its seq-th metadata: what m would
// have published then.
func sealAs(t *testing.T, m *Member, meta Meta, seq uint64) []byte {
	t.Helper()
	enc, err := meta.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return sealMeta(m.signKey, m.name, enc, seq)
}
