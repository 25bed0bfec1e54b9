package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
)

// Options are the settings the suite needs to vary; a Factory maps them onto
// its transport's configuration and keeps its own defaults for the rest.
type Options struct {
	// Secret is the job secret.
	Secret []byte
	// IOTimeout bounds the silence of a blocked call.
	IOTimeout time.Duration
	// HandshakeTimeout bounds each handshake exchange.
	HandshakeTimeout time.Duration
	// SpinTime is how long a waiting call polls before it parks, for
	// transports that poll (zero: the transport's default).
	SpinTime time.Duration
}

// Factory makes the transports under test.
type Factory struct {
	// New returns a new listening transport with settings o, for one rank. The
	// suite closes it (Close may be called more than once).
	New func(t testing.TB, o Options) transport.Transport
	// Packages are fragments of the function names of the transport's own
	// goroutines ("collective/transport/tcp." for example): after every test
	// none of them may still run.
	Packages []string
	// ZeroAllocs asks the suite to check that sending and receiving frames in
	// the steady state allocates nothing.
	ZeroAllocs bool
}

func defaultOptions() Options {
	return Options{
		Secret:           []byte("conformance secret, not for production"),
		IOTimeout:        20 * time.Second,
		HandshakeTimeout: 2 * time.Second,
	}
}

// Run runs the whole suite as subtests of t.
func Run(t *testing.T, f Factory) {
	s := &suite{f: f}
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"Mesh", s.testMesh},
		{"HeaderFields", s.testHeaderFields},
		{"Ordering", s.testOrdering},
		{"Large", s.testLarge},
		{"ZeroByte", s.testZeroByte},
		{"Inline", s.testInline},
		{"Bidirectional", s.testBidirectional},
		{"ConcurrentSenders", s.testConcurrentSenders},
		{"AbortFrame", s.testAbortFrame},
		{"Misuse", s.testMisuse},
		{"PeerClose", s.testPeerClose},
		{"PeerCloseWakesRecv", s.testPeerCloseWakesRecv},
		{"SendToClosedPeer", s.testSendToClosedPeer},
		{"CloseWakes", s.testCloseWakes},
		{"WakesWhilePolling", s.testWakesWhilePolling},
		{"SilentPeerCostsNoCPU", s.testSilentPeerCostsNoCPU},
		{"ContextCancel", s.testContextCancel},
		{"ContextDeadline", s.testContextDeadline},
		{"CancelledContext", s.testCancelledContext},
		{"IOTimeout", s.testIOTimeout},
		{"SlowReceiverIsNotSilent", s.testSlowReceiver},
		{"WrongSecret", s.testWrongSecret},
		{"WrongJob", s.testWrongJob},
		{"StaleEpoch", s.testStaleEpoch},
		{"Epochs", s.testEpochs},
		{"SizeOneWorld", s.testSizeOne},
		{"Validate", s.testValidate},
		{"MissingRank", s.testMissingRank},
		{"CloseDuringConnect", s.testCloseDuringConnect},
		{"LinksOutliveTransport", s.testLinksOutlive},
		{"ZeroAllocs", s.testZeroAllocs},
		{"InPlace", s.testInPlace},
		{"Collectives", s.testCollectives},
	} {
		t.Run(tc.name, tc.fn)
	}
}

type suite struct{ f Factory }

// ---- helpers ----

// start checks for leaked goroutines when the test's cleanups are done; call
// it first so its cleanup runs last.
func (s *suite) start(t *testing.T) {
	t.Helper()
	CheckNoLeaks(t, s.f.Packages...)
}

// The helpers below are exported for the transports' own tests, which need
// the same worlds, frames and checks as the suite.

// CheckNoLeaks makes the test fail if, once its cleanups have run (and up to
// 5 s more), goroutines whose stacks mention one of packages (as in
// Factory.Packages) are still alive. Call it first, so that its cleanup runs
// last.
func CheckNoLeaks(t testing.TB, packages ...string) {
	t.Helper()
	t.Cleanup(func() {
		if err := WaitFor(5*time.Second, func() error {
			if g := Goroutines(packages...); g != "" {
				return fmt.Errorf("goroutines of the transport still running:\n%s", g)
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
	})
}

// Goroutines returns the stacks of the goroutines that mention one of
// packages, "" when there are none.
func Goroutines(packages ...string) string {
	if len(packages) == 0 {
		return ""
	}
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var leaked []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		for _, p := range packages {
			if strings.Contains(g, p) {
				leaked = append(leaked, g)
				break
			}
		}
	}
	return strings.Join(leaked, "\n\n")
}

// DebugLogger is the Logger of a transport's tests: a debug-level text log
// on stderr when the environment variable env is set (GOROVOD_TCP_DEBUG=1 go
// test -v shows the transports' own log), nil (the transport's default,
// discard) otherwise.
func DebugLogger(env string) *slog.Logger {
	if os.Getenv(env) == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// Listen starts a transport with listen(cfg), failing the test if it cannot,
// and closes it when the test ends.
func Listen[C any, T transport.Transport](t testing.TB, listen func(C) (T, error), cfg C) T {
	t.Helper()
	tr, err := listen(cfg)
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

// WaitFor polls cond until it returns nil or the timeout passes.
func WaitFor(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		<-tick.C
	}
}

func (s *suite) listen(t *testing.T, o Options) transport.Transport {
	t.Helper()
	tr := s.f.New(t, o)
	t.Cleanup(func() { tr.Close() })
	return tr
}

func (s *suite) listenN(t *testing.T, n int, o Options) []transport.Transport {
	t.Helper()
	trs := make([]transport.Transport, n)
	for i := range trs {
		trs[i] = s.listen(t, o)
	}
	return trs
}

// AddrsOf is the addresses of trs, a world's Addrs.
func AddrsOf[T transport.Transport](trs []T) []string {
	a := make([]string, len(trs))
	for i, tr := range trs {
		a[i] = tr.Addr()
	}
	return a
}

// ConnectAllErr connects trs as one world (rank i is trs[i]), all at once,
// and returns each rank's links and error.
func ConnectAllErr[T transport.Transport](ctx context.Context, trs []T, job string, epoch uint64) ([][]transport.Link, []error) {
	addrs := AddrsOf(trs)
	links := make([][]transport.Link, len(trs))
	errs := make([]error, len(trs))
	var wg sync.WaitGroup
	for r, tr := range trs {
		wg.Go(func() {
			links[r], errs[r] = tr.Connect(ctx, transport.World{JobID: job, Epoch: epoch, Rank: r, Addrs: addrs})
		})
	}
	wg.Wait()
	return links, errs
}

// ConnectAll connects trs as one world; the links are closed when the test ends.
func ConnectAll[T transport.Transport](t testing.TB, ctx context.Context, trs []T, job string, epoch uint64) [][]transport.Link {
	t.Helper()
	links, errs := ConnectAllErr(ctx, trs, job, epoch)
	t.Cleanup(func() { CloseAll(links) })
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: Connect: %v", r, err)
		}
	}
	return links
}

// CloseAll closes every link of links.
func CloseAll(links [][]transport.Link) {
	for _, ls := range links {
		for _, l := range ls {
			if l != nil {
				l.Close()
			}
		}
	}
}

// pair connects two fresh transports and returns rank 0's link to rank 1 and
// rank 1's link to rank 0.
func (s *suite) pair(t *testing.T, o Options) (transport.Link, transport.Link) {
	t.Helper()
	trs := s.listenN(t, 2, o)
	links := ConnectAll(t, TimeoutCtx(t, 20*time.Second), trs, "pair", 1)
	return links[0][1], links[1][0]
}

// TimeoutCtx is a context that ends after d or with the test.
func TimeoutCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Pattern fills a payload that depends on who sent it to whom and which frame
// it is, so a frame delivered to the wrong place or out of order shows.
func Pattern(n, from, to, idx int) []byte {
	p := make([]byte, n)
	x := uint32(from*7919 + to*104729 + idx*1299709 + 1)
	for i := range p {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		p[i] = byte(x)
	}
	return p
}

// Send sends payload as data frame seq (Seq seq, Step seq) on l.
func Send(ctx context.Context, l transport.Link, seq uint64, payload []byte) error {
	h := transport.Header{Kind: transport.FrameData, Seq: seq, Step: uint32(seq), Length: uint32(len(payload))}
	return l.Send(ctx, &h, payload)
}

// Recv receives the next frame on l and checks that it is data frame seq
// (as Send sends it) carrying want.
func Recv(ctx context.Context, l transport.Link, seq uint64, want []byte) error {
	var h transport.Header
	if err := l.RecvHeader(ctx, &h); err != nil {
		return err
	}
	if h.Seq != seq || h.Step != uint32(seq) || int(h.Length) != len(want) || h.Kind != transport.FrameData {
		return fmt.Errorf("frame %d from rank %d: got seq %d step %d length %d kind %v", seq, l.Peer(), h.Seq, h.Step, h.Length, h.Kind)
	}
	got := make([]byte, h.Length)
	if err := l.RecvPayload(ctx, got); err != nil {
		return err
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("frame %d from rank %d: payload of %d bytes differs", seq, l.Peer(), len(got))
	}
	return nil
}

// AsPeerError checks that err is a *transport.PeerError about rank and, when
// target is not nil, wraps target.
func AsPeerError(t testing.TB, err error, rank int, target error) *transport.PeerError {
	t.Helper()
	var pe *transport.PeerError
	if !errors.As(err, &pe) {
		t.Fatalf("error %v (%T) is not a *transport.PeerError", err, err)
	}
	if pe.Rank != rank {
		t.Errorf("PeerError names rank %d, want %d: %v", pe.Rank, rank, err)
	}
	if target != nil && !errors.Is(err, target) {
		t.Errorf("error %v does not wrap %v", err, target)
	}
	return pe
}

// AsHandshakeError checks that err is a fatal *transport.HandshakeError
// about rank that mentions reason.
func AsHandshakeError(t testing.TB, err error, rank int, reason string) *transport.HandshakeError {
	t.Helper()
	var he *transport.HandshakeError
	if !errors.As(err, &he) {
		t.Fatalf("error %v (%T) is not a *transport.HandshakeError", err, err)
	}
	if he.Rank != rank {
		t.Errorf("HandshakeError names rank %d, want %d: %v", he.Rank, rank, err)
	}
	if !he.Fatal {
		t.Errorf("HandshakeError is not fatal: %v", err)
	}
	if !strings.Contains(he.Error(), reason) {
		t.Errorf("HandshakeError %q does not mention %q", he, reason)
	}
	return he
}

// within runs fn and fails the test unless it returns within d.
func within(t *testing.T, d time.Duration, what string, fn func() error) error {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- fn() }()
	select {
	case err := <-errc:
		return err
	case <-time.After(d):
		t.Fatalf("%s did not return within %v", what, d)
		return nil
	}
}

// fill sends frames of n bytes on l, with no reader on the other side, until
// a Send fails; it returns that failure.
func fill(ctx context.Context, l transport.Link, n int) error {
	payload := make([]byte, n)
	for i := 0; ; i++ {
		if err := Send(ctx, l, uint64(i), payload); err != nil {
			return err
		}
	}
}

// Exchange has every ordered pair of ranks send sizes, all at once, and checks
// that each frame arrives in order and intact.
func Exchange(ctx context.Context, links [][]transport.Link, sizes []int) error {
	p := len(links)
	var wg sync.WaitGroup
	errs := make(chan error, 2*p*p)
	for me := range p {
		for peer := range p {
			if peer == me {
				continue
			}
			l := links[me][peer]
			if l == nil || l.Peer() != peer {
				return fmt.Errorf("rank %d: link to rank %d missing or misnamed", me, peer)
			}
			wg.Go(func() {
				for i, n := range sizes {
					if err := Send(ctx, l, uint64(i), Pattern(n, me, peer, i)); err != nil {
						errs <- fmt.Errorf("rank %d -> %d frame %d: %w", me, peer, i, err)
						return
					}
				}
			})
			wg.Go(func() {
				for i, n := range sizes {
					if err := Recv(ctx, l, uint64(i), Pattern(n, peer, me, i)); err != nil {
						errs <- fmt.Errorf("rank %d <- %d: %w", me, peer, err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// meshSizes are the frame sizes exchanged by the mesh tests: empty, tiny, a
// page, the inline limit, a multi-piece frame and one over a mebibyte.
func meshSizes() []int { return []int{0, 1, 4096, transport.InlinePayload, 300 << 10, 1<<20 + 3} }
