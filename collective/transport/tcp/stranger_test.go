package tcp_test

import (
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/conformance"
	"github.com/gorovod/gorovod/collective/transport/internal/handshake"
)

// strangers is what a port scanner, a misconfigured client or an attacker
// might send to a transport's port.
var strangers = []struct {
	name  string
	bytes func() []byte
}{
	{"nothing", func() []byte { return nil }},
	{"garbage", func() []byte { return []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n") }},
	{"random", func() []byte {
		b := make([]byte, 4096)
		rand.Read(b)
		return b
	}},
	{"half hello", func() []byte {
		h := handshake.Hello{JobHash: transport.JobHash("stranger"), Epoch: 1, From: 1, To: 0, Size: 2, Security: rawSecurity}
		b := make([]byte, handshake.HelloSize)
		h.Encode(b)
		return b[:handshake.HelloSize/2]
	}},
	{"hello then nothing", func() []byte {
		h := handshake.Hello{JobHash: transport.JobHash("stranger"), Epoch: 1, From: 1, To: 0, Size: 2, Security: rawSecurity}
		b := make([]byte, handshake.HelloSize)
		h.Encode(b)
		return b
	}},
	{"hello of the mesh's world, bad response", func() []byte {
		h := handshake.Hello{JobHash: transport.JobHash("mesh"), Epoch: 1, From: 3, To: 0, Size: 4, Security: rawSecurity}
		b := make([]byte, handshake.HelloSize+handshake.ResponseSize)
		h.Encode(b)
		rand.Read(b[handshake.HelloSize:])
		return b
	}},
	{"frame instead of hello", func() []byte {
		h := transport.Header{Kind: transport.FrameData, JobID: transport.JobHash("mesh"), Epoch: 1}
		b := make([]byte, transport.HeaderSize+16)
		h.Encode(b)
		return b
	}},
}

// TestStrangers: while strangers connect to every transport and send garbage,
// nothing or a partial handshake, the real mesh still connects and works, and
// the strangers' connections are dropped within the handshake timeout.
func TestStrangers(t *testing.T) {
	checkNoLeaks(t)
	cfg := testConfig()
	cfg.HandshakeTimeout = 500 * time.Millisecond
	trs := listenN(t, 4, cfg)
	ctx := conformance.TimeoutCtx(t, 30*time.Second)

	// Strangers first, so that they hold connections while the mesh handshakes.
	var conns []net.Conn
	for _, tr := range trs {
		for range strangers {
			for range 3 {
				c, err := net.Dial("tcp", tr.Addr())
				if err != nil {
					t.Fatal(err)
				}
				conns = append(conns, c)
			}
		}
	}
	var wg sync.WaitGroup
	for i, c := range conns {
		s := strangers[(i/3)%len(strangers)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.Write(s.bytes())
		}()
	}
	wg.Wait()

	links := conformance.ConnectAll(t, ctx, trs, "mesh", 1)
	if err := conformance.Exchange(ctx, links, meshSizes); err != nil {
		t.Fatal(err)
	}

	// Every stranger is hung up on (possibly after a short reject) within the
	// handshake timeout.
	for i, c := range conns {
		s := strangers[(i/3)%len(strangers)]
		c.SetReadDeadline(time.Now().Add(10 * cfg.HandshakeTimeout))
		_, err := io.Copy(io.Discard, c)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("stranger %q: connection still open after %v", s.name, 10*cfg.HandshakeTimeout)
		}
		c.Close()
	}

	// The mesh still works, and strangers arriving now do no harm either.
	for _, s := range strangers {
		c, err := net.Dial("tcp", trs[0].Addr())
		if err != nil {
			t.Fatal(err)
		}
		c.Write(s.bytes())
		defer c.Close()
	}
	if err := conformance.Exchange(ctx, links, meshSizes); err != nil {
		t.Fatal(err)
	}
}

// TestStrangerFlood: more strangers than the handshake limit do not stop the
// transport from serving real peers once they are gone.
func TestStrangerFlood(t *testing.T) {
	checkNoLeaks(t)
	cfg := testConfig()
	cfg.HandshakeTimeout = 300 * time.Millisecond
	trs := listenN(t, 2, cfg)
	var conns []net.Conn
	for range 300 {
		c, err := net.Dial("tcp", trs[0].Addr())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	ctx := conformance.TimeoutCtx(t, 30*time.Second)
	if err := conformance.Exchange(ctx, conformance.ConnectAll(t, ctx, trs, "flood", 1), meshSizes); err != nil {
		t.Fatal(err)
	}
}
