package tcp_test

import (
	"net"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport/conformance"
)

// TestHandshakeAdmission: 300 connections that never say a word, more than
// the transport's 256 handshake slots, do not keep a world from forming
// within 3 s, although the handshake timeout (10 s here) would let each of
// them hold its slot that long: strangers from another host are capped by
// HandshakesPerSource, and strangers from the world's own host lose their
// slots after PreAuthTimeout. Each case fails without its mechanism (the
// world waits for the 10 s timeout).
func TestHandshakeAdmission(t *testing.T) {
	for _, tc := range []struct {
		name        string
		strangersAt string // the source address of the strangers
		perSource   int
		preAuth     time.Duration
	}{
		// The world's ranks are on 127.0.0.1; the strangers' host may
		// hold no more than the default per-source limit (0: 64 slots)
		// however long they last.
		{"another host, per-source limit", "127.0.0.2", 0, 10 * time.Second},
		// The strangers share the world's host and no per-source limit
		// applies: the pre-authentication deadline frees their slots.
		{"same host, pre-auth deadline", "127.0.0.1", 1000, 200 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkNoLeaks(t)
			cfg := testConfig()
			cfg.HandshakeTimeout = 10 * time.Second
			cfg.PreAuthTimeout = tc.preAuth
			cfg.HandshakesPerSource = tc.perSource
			trs := listenN(t, 3, cfg)
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(tc.strangersAt)}}
			var conns []net.Conn
			t.Cleanup(func() {
				for _, c := range conns {
					c.Close()
				}
			})
			for range 300 {
				c, err := d.Dial("tcp", trs[0].Addr())
				if err != nil {
					t.Fatal(err)
				}
				conns = append(conns, c)
			}
			start := time.Now()
			ctx := conformance.TimeoutCtx(t, 3*time.Second)
			links := conformance.ConnectAll(t, ctx, trs, "admission", 1)
			if err := conformance.Exchange(ctx, links, meshSizes); err != nil {
				t.Fatal(err)
			}
			t.Logf("world of 3 formed and exchanged in %v beside 300 silent strangers", time.Since(start).Round(time.Millisecond))
		})
	}
}
