package membership

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// captureHandler keeps the records at WARN and above that reach it: what a
// user running at the default log level would see.
type captureHandler struct {
	mu    *sync.Mutex
	lines *[]string
	attrs []slog.Attr
}

func newCapture() captureHandler {
	return captureHandler{mu: new(sync.Mutex), lines: new([]string)}
}

func (h captureHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h captureHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
	for _, a := range h.attrs {
		fmt.Fprintf(&b, " %s", a)
	}
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s", a)
		return true
	})
	h.mu.Lock()
	*h.lines = append(*h.lines, b.String())
	h.mu.Unlock()
	return nil
}
func (h captureHandler) WithAttrs(as []slog.Attr) slog.Handler {
	h.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	return h
}
func (h captureHandler) WithGroup(string) slog.Handler { return h }

func (h captureHandler) get() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), *h.lines...)
}

var repeatedRE = regexp.MustCompile(`\(repeated (\d+) times in the last 1 s\)`)

// accounted sums, over the lines whose message contains what, the records
// they stand for: a line that went through is one, a summary line the count
// it gives.
func accounted(lines []string, what string) int {
	n := 0
	for _, l := range lines {
		if !strings.Contains(l, what) {
			continue
		}
		if m := repeatedRE.FindStringSubmatch(l); m != nil {
			k, _ := strconv.Atoi(m[1])
			n += k
		} else {
			n++
		}
	}
	return n
}

// TestGarbageToGossipPortIsRateLimited: a stranger sends garbage UDP packets
// and TCP streams to a real member's gossip port for a few seconds, as fast
// as the tests' loopback allows. memberlist logs an ERROR for every one; the
// log must show each distinct error once per window with a count, and the
// counts must add up to what was sent over TCP (which cannot drop).
func TestGarbageToGossipPortIsRateLimited(t *testing.T) {
	capture := newCapture()
	cfg := testConfig("target")
	cfg.Logger = slog.New(capture)
	cfg.LogRepeatWindow = time.Second
	m := join(t, cfg, testMeta(0))
	addr := m.Local().Addr.String()

	const flood = 2500 * time.Millisecond
	udp, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	garbage := []byte("GET / HTTP/1.0 this is not gossip")
	udpSent, tcpSent := 0, 0
	start := time.Now()
	pace := time.NewTicker(time.Millisecond) // a flood, without taking the shared machine's cores
	defer pace.Stop()
	for time.Since(start) < flood {
		<-pace.C
		for range 20 {
			if _, err := udp.Write(garbage); err == nil {
				udpSent++
			}
		}
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(garbage); err != nil {
			t.Fatal(err)
		}
		c.Close()
		tcpSent++
	}
	// Every TCP stream is read and refused; the summaries come at the end
	// of each window.
	const tcpError = "encryption is configured but remote state is not encrypted"
	deadline := time.Now().Add(15 * time.Second)
	for accounted(capture.get(), tcpError) < tcpSent {
		if time.Now().After(deadline) {
			t.Fatalf("the log accounts for %d of %d TCP garbage streams:\n%s",
				accounted(capture.get(), tcpError), tcpSent, strings.Join(capture.get(), "\n"))
		}
		time.Sleep(20 * time.Millisecond) // polling the captured log: no event announces a summary
	}
	lines := capture.get()
	udpSeen := accounted(lines, "Decrypt packet failed")
	t.Logf("sent %d UDP packets and %d TCP streams in %v; %d log lines account for %d UDP and %d TCP errors:\n%s",
		udpSent, tcpSent, flood, len(lines), udpSeen, accounted(lines, tcpError), strings.Join(lines, "\n"))
	if got := accounted(lines, tcpError); got != tcpSent {
		t.Errorf("TCP errors accounted %d, sent %d", got, tcpSent)
	}
	if udpSeen < 1 || udpSeen > udpSent {
		t.Errorf("UDP errors accounted %d of %d sent", udpSeen, udpSent)
	}
	// Per distinct error: a line when a window opens and a summary when it
	// closes, and windows open at most once a second.
	windows := int(time.Since(start)/time.Second) + 1
	if max := 2 * 2 * windows; len(lines) > max {
		t.Errorf("%d log lines for 2 distinct errors over %d windows, want at most %d", len(lines), windows, max)
	}
	for _, l := range lines {
		if !strings.Contains(l, tcpError) && !strings.Contains(l, "Decrypt packet failed") {
			t.Errorf("unexpected log line %q", l)
		}
		if !strings.Contains(l, "from=127.0.0.1:") {
			t.Errorf("line %q does not name the sender", l)
		}
	}
}

// TestGracefulShutdownIsQuiet: a job's members leave one by one and the last
// shuts down, as at the end of a run; at the default level (WARN) nothing is
// logged.
func TestGracefulShutdownIsQuiet(t *testing.T) {
	const n = 4
	captures := make([]captureHandler, n)
	ms := make([]*Member, n)
	for i := range ms {
		captures[i] = newCapture()
		cfg := testConfig(fmt.Sprintf("q%d", i))
		cfg.Logger = slog.New(captures[i])
		if i > 0 {
			cfg.Seeds = []string{ms[0].Local().Addr.String()}
		}
		ms[i] = join(t, cfg, testMeta(i))
	}
	waitConverged(t, ms, time.Now())
	for i := n - 1; i >= 1; i-- {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		if err := ms[i].Leave(ctx); err != nil {
			t.Errorf("member %d leave: %v", i, err)
		}
		cancel()
		waitFor(t, ms[0], time.Now().Add(leaveBound), "leave seen", func() bool { return !hasMember(ms[0], ms[i].Name()) })
	}
	if err := ms[0].Shutdown(); err != nil {
		t.Fatal(err)
	}
	for i, c := range captures {
		if lines := c.get(); len(lines) > 0 {
			t.Errorf("member %d logged at WARN or above during a graceful shutdown:\n%s", i, strings.Join(lines, "\n"))
		}
	}
}
