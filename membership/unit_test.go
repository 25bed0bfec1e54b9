package membership

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestConfigDefaults(t *testing.T) {
	if _, err := (Config{}).withDefaults(); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("a Config without Secret: %v, want ErrInvalidConfig", err)
	}
	secret := []byte("s")
	c, err := Config{Secret: secret}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	d := DefaultConfig()
	if c.ProbeInterval != d.ProbeInterval || c.ProbeTimeout != d.ProbeTimeout || c.SuspicionMult != d.SuspicionMult ||
		c.GossipInterval != d.GossipInterval || c.PushPullInterval != d.PushPullInterval || c.BindAddr != "127.0.0.1" ||
		c.MaxMessageSize != d.MaxMessageSize || c.Logger == nil {
		t.Fatalf("zero fields not defaulted: %+v", c)
	}
	if c.Name == "" {
		t.Fatal("no generated name")
	}
	secret[0] = 'x'
	if c.Secret[0] != 's' {
		t.Fatal("Config keeps the caller's Secret slice")
	}

	for _, tc := range []struct {
		name   string
		change func(*Config)
	}{
		{"probe timeout not below interval", func(c *Config) { c.ProbeTimeout = c.ProbeInterval }},
		{"name too long", func(c *Config) { c.Name = strings.Repeat("n", 256) }},
		{"message size over the hard limit", func(c *Config) { c.MaxMessageSize = maxMessageSizeLimit + 1 }},
		{"bind port out of range", func(c *Config) { c.BindPort = 70000 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Secret = []byte("s")
			tc.change(&c)
			if _, err := c.withDefaults(); !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %v, want ErrInvalidConfig", err)
			}
		})
	}
}

func TestGeneratedNamesAreUnique(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		n, err := generateName()
		if err != nil {
			t.Fatal(err)
		}
		if seen[n] {
			t.Fatalf("name %q generated twice", n)
		}
		seen[n] = true
	}
}

func TestGossipKey(t *testing.T) {
	a1, err := gossipKey([]byte("secret a"))
	if err != nil {
		t.Fatal(err)
	}
	a2, _ := gossipKey([]byte("secret a"))
	b, _ := gossipKey([]byte("secret b"))
	long, _ := gossipKey(bytes.Repeat([]byte("x"), 1000))
	if len(a1) != 32 || len(long) != 32 {
		t.Fatalf("key sizes %d, %d; memberlist's AES-256 needs 32", len(a1), len(long))
	}
	if !bytes.Equal(a1, a2) || bytes.Equal(a1, b) {
		t.Fatal("the key is not a function of the secret")
	}
	if bytes.Contains(a1, []byte("secret a")) {
		t.Fatal("the key contains the secret")
	}
}

func ev(kind EventKind, name string, gpus int) Event {
	return Event{Kind: kind, Node: Node{Name: name, Meta: Meta{GPUs: gpus}}}
}

func TestEventQueueCoalesces(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []Event
		want []Event
	}{
		{"distinct members keep order",
			[]Event{ev(EventJoined, "a", 0), ev(EventJoined, "b", 0), ev(EventFailed, "c", 0)},
			[]Event{ev(EventJoined, "a", 0), ev(EventJoined, "b", 0), ev(EventFailed, "c", 0)}},
		{"joined then updated stays joined with the new meta",
			[]Event{ev(EventJoined, "a", 1), ev(EventUpdated, "a", 2), ev(EventUpdated, "a", 3)},
			[]Event{ev(EventJoined, "a", 3)}},
		{"updates collapse to the latest",
			[]Event{ev(EventUpdated, "a", 1), ev(EventJoined, "b", 0), ev(EventUpdated, "a", 2)},
			[]Event{ev(EventUpdated, "a", 2), ev(EventJoined, "b", 0)}},
		{"latest state wins: joined then failed",
			[]Event{ev(EventJoined, "a", 1), ev(EventFailed, "a", 1)},
			[]Event{ev(EventFailed, "a", 1)}},
		{"latest state wins: failed then joined again",
			[]Event{ev(EventFailed, "a", 1), ev(EventJoined, "a", 1)},
			[]Event{ev(EventJoined, "a", 1)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := newEventQueue()
			for _, e := range tc.in {
				q.push(e)
			}
			var got []Event
			for e, ok := q.pop(); ok; e, ok = q.pop() {
				got = append(got, e)
			}
			if !slices.EqualFunc(got, tc.want, func(a, b Event) bool {
				return a.Kind == b.Kind && a.Node.Name == b.Node.Name && a.Node.Meta.GPUs == b.Node.Meta.GPUs
			}) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			if int(q.coalesced.Load()) != len(tc.in)-len(tc.want) {
				t.Fatalf("coalesced %d, want %d", q.coalesced.Load(), len(tc.in)-len(tc.want))
			}
		})
	}
}

// TestEventQueueBounded: a reader that does not read costs one pending event
// per member however many events arrive, and the pump delivers the latest.
func TestEventQueueBounded(t *testing.T) {
	q := newEventQueue()
	for i := range 100_000 {
		q.push(ev(EventUpdated, string(rune('a'+i%10)), i))
	}
	if n := q.len(); n != 10 {
		t.Fatalf("%d pending events for 10 members", n)
	}
	out := make(chan Event)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { q.pump(out, done) })
	last := map[string]int{}
	for range 10 {
		e := <-out
		last[e.Node.Name] = e.Node.Meta.GPUs
	}
	for i := range 10 {
		if want := 100_000 - 10 + i; last[string(rune('a'+i))] != want {
			t.Fatalf("member %c: delivered meta %d, want the latest %d", 'a'+i, last[string(rune('a'+i))], want)
		}
	}
	// Interleaved pushes and pops must not grow the backing array without bound.
	for i := range 10_000 {
		q.push(ev(EventJoined, "x", i))
		q.push(ev(EventJoined, "y", i))
		<-out
	}
	close(done)
	wg.Wait()
	if _, ok := <-out; ok {
		t.Fatal("pump did not close its channel")
	}
	if c := cap(q.order); c > 1024 {
		t.Fatalf("queue array grew to %d", c)
	}
}

// TestLogWriter: memberlist's level tags become slog levels; a failed state
// exchange with a departed peer is not news.
func TestLogWriter(t *testing.T) {
	var mu sync.Mutex
	var got []string
	h := recordHandler{fn: func(r slog.Record) {
		mu.Lock()
		got = append(got, r.Level.String()+" "+r.Message)
		mu.Unlock()
	}, min: slog.LevelInfo}
	var quiet atomic.Bool
	departed := func(name string) bool { return name == "gone" }
	l, _ := newMemberlistLogger(slog.New(h), time.Minute, &quiet, departed)
	l.Printf("[DEBUG] memberlist: noisy")
	l.Printf("[INFO] memberlist: hello")
	l.Printf("[WARN] memberlist: careful")
	l.Printf("[ERR] memberlist: broken")
	l.Printf("untagged line")
	l.Printf("[ERR] memberlist: Decrypt packet failed from=127.0.0.1:1")
	l.Printf("[ERR] memberlist: Decrypt packet failed from=127.0.0.1:2") // the same error: held back
	l.Printf("[INFO] memberlist: hello")                                 // INFO: never held back
	l.Printf("[ERR] memberlist: Push/Pull with gone failed: dial tcp 127.0.0.1:1: connect: connection refused")
	l.Printf("[ERR] memberlist: Push/Pull with alive failed: dial tcp 127.0.0.1:2: i/o timeout")
	quiet.Store(true)
	l.Printf("[ERR] memberlist: Failed to send gossip: use of closed network connection")
	want := []string{"INFO hello", "WARN careful", "ERROR broken", "INFO untagged line", "ERROR Decrypt packet failed", "INFO hello", "ERROR Push/Pull with alive failed: dial tcp 127.0.0.1:2: i/o timeout"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestSplitFrom(t *testing.T) {
	for _, tc := range []struct{ in, msg, from string }{
		{"Decrypt packet failed: bad from=127.0.0.1:45345", "Decrypt packet failed: bad", "127.0.0.1:45345"},
		{"failed to receive: x from=[::1]:7946", "failed to receive: x", "[::1]:7946"},
		{"no address here", "no address here", ""},
		{"from=odd placement here", "from=odd placement here", ""},
	} {
		msg, from := splitFrom([]byte(tc.in))
		if string(msg) != tc.msg || string(from) != tc.from {
			t.Errorf("splitFrom(%q) = %q, %q; want %q, %q", tc.in, msg, from, tc.msg, tc.from)
		}
	}
}

type recordHandler struct {
	fn  func(slog.Record)
	min slog.Level
}

func (h recordHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.min }
func (h recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.fn(r)
	return nil
}
func (h recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h recordHandler) WithGroup(string) slog.Handler      { return h }

func TestFrameDecodeRejects(t *testing.T) {
	good := unsignedFrame("job", "me", frameData, []byte("x"))
	withSeq := func(f frame) []byte {
		f.sig = make([]byte, frameSigSize)
		if f.seq == 0 {
			f.seq = 1
		}
		return appendFrame(nil, &f)
	}
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"bad magic", append([]byte("xx"), good[2:]...)},
		{"version 1", append([]byte{'g', 'm', 1}, good[3:]...)},
		{"unknown kind", append([]byte{'g', 'm', frameVersion, 9}, good[4:]...)},
		{"truncated job", good[:6]},
		{"empty job", withSeq(frame{kind: frameData, from: "me"})},
		{"empty sender", withSeq(frame{kind: frameData, jobID: "job"})},
		{"goodbye with payload", withSeq(frame{kind: frameBye, jobID: "job", from: "me", payload: []byte{1}})},
		{"sequence number 0", append(append(bytes.Clone(good[:4+4+3]), make([]byte, 8)...), good[4+4+3+8:]...)},
		{"no room for the signature", good[:len(good)-1-frameSigSize]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f frame
			if err := decodeFrame(tc.b, &f); err == nil {
				t.Fatalf("accepted %x", tc.b)
			}
		})
	}
}

func TestBoundedTimeout(t *testing.T) {
	if d := boundedTimeout(context.Background(), time.Second); d != time.Second {
		t.Fatalf("no deadline: %v", d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if d := boundedTimeout(ctx, time.Second); d > 100*time.Millisecond || d <= 0 {
		t.Fatalf("deadline 100ms: %v", d)
	}
	past, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	if d := boundedTimeout(past, time.Second); d <= 0 {
		t.Fatalf("past deadline gave %v; memberlist would wait forever", d)
	}
}
