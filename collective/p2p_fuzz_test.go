package collective

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/collective/transport"
)

// nullLink is a link whose payloads are zeros and whose sends go nowhere:
// the point-to-point state machine alone is under test.
type nullLink struct{ peer int }

func (l nullLink) Peer() int                                             { return l.peer }
func (l nullLink) RemoteAddr() string                                    { return "null" }
func (l nullLink) Send(context.Context, *transport.Header, []byte) error { return nil }
func (l nullLink) RecvHeader(context.Context, *transport.Header) error {
	return errors.New("nullLink: no headers")
}
func (l nullLink) RecvPayload(_ context.Context, p []byte) error { clear(p); return nil }
func (l nullLink) Close() error                                  { return nil }

// FuzzP2PFrames feeds arbitrary runs of point-to-point frame headers, with
// receives posted in between, to the receiving side: it never panics,
// never keeps more than Config.P2PBufferBytes (announcements counted),
// keeps the credit within the window, and rejects what it rejects with a
// *transport.FrameError naming the peer or the bound's error.
func FuzzP2PFrames(f *testing.F) {
	// Each op is 8 bytes: what, flags, tag, seq, count (2), step, length.
	f.Add([]byte{0, 1, 1, 1, 0, 64, 0, 0}) // an announcement
	f.Add([]byte{1, 0, 1, 0, 0, 64, 0, 0, 0, 3, 1, 1, 0, 64, 0, 0, 0, 2, 1, 1, 0, 64, 0, 0})
	f.Add([]byte{0, 0, 2, 1, 0, 3, 0, 3, 0, 0, 2, 2, 0, 2, 0, 2})
	f.Add([]byte{0, 2, 1, 1, 0, 64, 0, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		const limit = 1 << 14
		var failed error
		p := newP2PState(2, limit, func(err error) { failed = err })
		l := nullLink{peer: 1}
		ctx := context.Background()
		for len(ops) >= 8 {
			op := ops[:8]
			ops = ops[8:]
			if op[0]%4 == 1 {
				// Post a receive of op's tag and length.
				r := &p2pRecv{tag: uint64(op[2] % 4), buf: make([]byte, int(op[4])<<8|int(op[5])), done: make(chan struct{})}
				p.mu.Lock()
				p.post(l, 1, r)
				p.mu.Unlock()
				continue
			}
			h := transport.Header{
				Kind: transport.FrameData, Coll: uint8(collP2P),
				Flags: op[1] % 6, Tag: uint64(op[2] % 4), Seq: uint64(op[3] % 4),
				Count: uint64(op[4])<<8 | uint64(op[5]), Step: uint32(op[6] % 8), Length: uint32(op[7]) << 4,
			}
			p.mu.Lock()
			if h.Flags == uint8(p2pCTS) && op[0]%4 == 2 {
				// Have a Send wait for this clear-to-send.
				p.peers[1].awaiting[p2pKey{h.Tag, h.Seq}] = &p2pClear{tag: h.Tag, seq: h.Seq, done: make(chan struct{})}
			}
			p.mu.Unlock()
			if err := p.receiveFrame(ctx, l, 1, &h); err != nil {
				var fe *transport.FrameError
				if !(errors.As(err, &fe) && fe.Peer == 1) && !strings.Contains(err.Error(), "P2PBufferBytes") {
					t.Fatalf("frame %+v: unexpected error %v", h, err)
				}
				break
			}
			p.mu.Lock()
			pp := &p.peers[1]
			want := 0
			for _, m := range pp.kept {
				if m.rendezvous {
					want += transport.HeaderSize
				} else {
					want += int(m.size)
				}
			}
			if p.keptBytes > limit || p.keptBytes < want || pp.credit < 0 || pp.credit > p2pEagerWindow {
				p.mu.Unlock()
				t.Fatalf("after frame %+v: %d bytes kept (bound %d, the kept messages and announcements %d), credit %d", h, p.keptBytes, limit, want, pp.credit)
			}
			p.mu.Unlock()
		}
		p.stop(errors.New("fuzz: done"))
		_ = failed
	})
}
