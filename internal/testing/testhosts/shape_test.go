package testhosts_test

import (
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/internal/testing/testhosts"
)

// transferRate sends n bytes over TCP from one host to another and returns
// the rate the receiver saw, in bits per second, from its first byte to
// its last.
func transferRate(t *testing.T, from, to *testhosts.Host, n int64) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	got := make(chan float64, 1)
	ln := serve(t, to, func(c net.Conn) {
		buf := make([]byte, 256<<10)
		if _, err := io.ReadFull(c, buf[:1]); err != nil {
			got <- 0
			return
		}
		t0 := time.Now()
		k, _ := io.CopyBuffer(io.Discard, io.LimitReader(c, n-1), buf)
		got <- float64(k+1) * 8 / time.Since(t0).Seconds()
	})
	c, err := from.Dial(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.CopyN(c, zeros{}, n); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		return r
	case <-ctx.Done():
		t.Fatal("transfer did not finish")
	}
	return 0
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// TestShapedLink: a host's link of a set rate carries a bulk transfer at
// about that rate in both directions, and at more than twice it once the
// shaping is removed. The bounds are loose (0.5x to 1.1x): the test checks
// that the qdiscs are in place, not how fast anything is.
func TestShapedLink(t *testing.T) {
	if err := testhosts.CanShape(); err != nil {
		t.Skip(err)
	}
	_, hs := newNet(t, 2)
	const rate = 200e6 // bit/s: a second's transfer is 25 MB
	const n = int64(rate / 8)
	if err := hs[1].Shape(testhosts.Link{Rate: rate}); err != nil {
		t.Fatal(err)
	}
	if l := hs[1].Link(); l.Rate != rate || l.Burst < 64<<10 || l.Latency <= 0 {
		t.Fatalf("Link() = %+v, want the rate with its defaults", l)
	}
	for _, tc := range []struct {
		name     string
		from, to *testhosts.Host
	}{
		{"to the shaped host", hs[0], hs[1]},
		{"from the shaped host", hs[1], hs[0]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := transferRate(t, tc.from, tc.to, n)
			t.Logf("%.0f Mbit/s over a link of %.0f Mbit/s", got/1e6, rate/1e6)
			if got < 0.5*rate || got > 1.1*rate {
				t.Fatalf("%.0f Mbit/s over a link shaped to %.0f Mbit/s: want 0.5x to 1.1x", got/1e6, rate/1e6)
			}
		})
	}
	t.Run("unshaped", func(t *testing.T) {
		if err := hs[1].Shape(testhosts.Link{}); err != nil {
			t.Fatal(err)
		}
		for _, dir := range [][2]*testhosts.Host{{hs[0], hs[1]}, {hs[1], hs[0]}} {
			got := transferRate(t, dir[0], dir[1], 2*n)
			t.Logf("%s -> %s: %.0f Mbit/s unshaped", dir[0], dir[1], got/1e6)
			if got < 2*rate {
				t.Fatalf("%s -> %s: %.0f Mbit/s with the shaping removed, want over %.0f", dir[0], dir[1], got/1e6, 2*rate/1e6)
			}
		}
	})
}

// TestShapeRejects: a link that cannot be set up is refused before
// anything changes.
func TestShapeRejects(t *testing.T) {
	if err := testhosts.CanShape(); err != nil {
		t.Skip(err)
	}
	_, hs := newNet(t, 1)
	for _, tc := range []struct {
		name string
		link testhosts.Link
	}{
		{"negative rate", testhosts.Link{Rate: -1}},
		{"negative burst", testhosts.Link{Rate: 1e9, Burst: -1}},
		{"negative latency", testhosts.Link{Rate: 1e9, Latency: -time.Millisecond}},
		{"rate too low", testhosts.Link{Rate: 1000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := hs[0].Shape(tc.link); err == nil {
				t.Fatalf("Shape(%+v) accepted", tc.link)
			}
			if l := hs[0].Link(); l != (testhosts.Link{}) {
				t.Fatalf("Link() = %+v after a refused Shape", l)
			}
		})
	}
}

// TestConfigLink: Config.Link shapes every host as it is added.
func TestConfigLink(t *testing.T) {
	if err := testhosts.CanShape(); err != nil {
		t.Skip(err)
	}
	_, hs := testhosts.NewHosts(t, testhosts.Config{Link: testhosts.Link{Rate: 1e9, Burst: 1 << 20}}, 2)
	for _, h := range hs {
		if l := h.Link(); l.Rate != 1e9 || l.Burst != 1<<20 || l.Latency <= 0 {
			t.Fatalf("%s: Link() = %+v, want Config.Link with its default latency", h, l)
		}
		out, err := h.Run(context.Background(), "tc", "qdisc", "show", "dev", "eth0")
		if err != nil || !strings.Contains(string(out), "tbf") || !strings.Contains(string(out), "rate 1Gbit") {
			t.Fatalf("%s: tc qdisc show dev eth0: %s (%v), want a tbf of 1Gbit", h, out, err)
		}
	}
}
