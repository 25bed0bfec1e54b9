package sctp

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/conformance"
	"github.com/gorovod/gorovod/collective/transport/internal/framesec"
)

// TestTamperedMessages: on sealed links, messages changed on the way (one
// bit), replayed, or sent without the link's keys break the receiving link
// with an error naming the sender and wrapping ErrFrameAuth, and nothing
// from them is delivered. The test writes to the association beneath rank
// 0's link, as someone on the path would, sealing with rank 0's sealer
// where the attack starts from a genuine message.
func TestTamperedMessages(t *testing.T) {
	const unit = messageBytes - framesec.TagSize // a sealed message's frame bytes
	header := func(length int) []byte {
		h := transport.Header{Kind: transport.FrameData, JobID: transport.JobHash("pair"), Epoch: 1, Sender: 0, Length: uint32(length)}
		b := make([]byte, transport.HeaderSize+min(length, unit-transport.HeaderSize))
		h.Encode(b)
		return b
	}
	sealed := func(s *framesec.Sealer, msg []byte) []byte {
		return s.SealTo(make([]byte, len(msg)+framesec.TagSize), msg)
	}
	flip := func(b []byte, i int) []byte { b[i] ^= 0x01; return b }
	for _, sec := range []transport.Security{transport.SecurityAuthenticated, transport.SecurityEncrypted} {
		for _, tc := range []struct {
			name string
			msgs func(s *framesec.Sealer) [][]byte
			// ok is how many receive steps (header, payload, header, ...)
			// succeed before the failure.
			ok int
		}{
			{"header bit", func(s *framesec.Sealer) [][]byte { return [][]byte{flip(sealed(s, header(4)), 20)} }, 0},
			{"tag bit", func(s *framesec.Sealer) [][]byte {
				m := sealed(s, header(4))
				return [][]byte{flip(m, len(m)-1)}
			}, 0},
			{"continuation bit", func(s *framesec.Sealer) [][]byte {
				// The header message carries unit-HeaderSize payload bytes,
				// the continuation the other HeaderSize+10.
				return [][]byte{sealed(s, header(unit+10)), flip(sealed(s, make([]byte, transport.HeaderSize+10)), 3)}
			}, 1},
			{"replayed frame", func(s *framesec.Sealer) [][]byte {
				m := sealed(s, header(4))
				return [][]byte{m, m}
			}, 2},
			{"unsealed frame", func(s *framesec.Sealer) [][]byte { return [][]byte{header(4)} }, 0},
		} {
			t.Run(sec.String()+"/"+tc.name, func(t *testing.T) {
				cfg := testCfg()
				cfg.Security = sec
				a, b := pairOf(t, cfg)
				if a.wseal == nil || b.rseal == nil {
					t.Fatal("links are not sealed")
				}
				for _, m := range tc.msgs(a.wseal) {
					if _, err := a.c.stream.Write(m); err != nil {
						t.Fatal(err)
					}
				}
				ctx := conformance.TimeoutCtx(t, 10*time.Second)
				steps := 0
				var err error
				for err == nil {
					var h transport.Header
					if err = b.RecvHeader(ctx, &h); err != nil {
						break
					}
					steps++
					if err = b.RecvPayload(ctx, make([]byte, h.Length)); err != nil {
						break
					}
					steps++
				}
				if steps != tc.ok {
					t.Fatalf("failed after %d receive steps (%v), want %d", steps, err, tc.ok)
				}
				conformance.AsPeerError(t, err, 0, transport.ErrFrameAuth)
				if !errors.Is(err, transport.ErrPeerClosed) {
					t.Errorf("error %v is not a broken link", err)
				}
				var h transport.Header
				if err := b.RecvHeader(context.Background(), &h); !errors.Is(err, transport.ErrFrameAuth) {
					t.Fatalf("RecvHeader after the failure: %v", err)
				}
			})
		}
	}
}

// TestDefaultSecurity: by default an association between two ranks of one
// host (both ends 127.0.0.1) is plain and one whose ends' addresses differ
// (rank 0 listens on 127.0.0.2, as another host would) is authenticated.
func TestDefaultSecurity(t *testing.T) {
	for _, tc := range []struct {
		host0  string
		sealed bool
	}{
		{"127.0.0.1", false},
		{"127.0.0.2", true},
	} {
		t.Run(tc.host0, func(t *testing.T) {
			cfg0, cfg1 := testCfg(), testCfg()
			cfg0.ListenAddr = tc.host0 + ":0"
			trs := make([]*Transport, 2)
			for i, cfg := range []Config{cfg0, cfg1} {
				tr, err := Listen(cfg)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { tr.Close() })
				trs[i] = tr
			}
			a, b := conformance.ConnectPair(t, trs[0], trs[1])
			for _, l := range []*link{a.(*link), b.(*link)} {
				if sealed := l.wseal != nil && l.rseal != nil; sealed != tc.sealed {
					t.Errorf("rank %d's link sealed %v, want %v", 1-l.PeerRank, sealed, tc.sealed)
				}
			}
			ctx := conformance.TimeoutCtx(t, 10*time.Second)
			if err := conformance.Exchange(ctx, [][]transport.Link{{nil, a}, {b, nil}}, []int{0, 100, messageBytes + 5}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestForgedFlowControlReports: on sealed links the receiver's reports of
// how much it has read travel sealed under keys of their own. A report
// forged, changed, replayed or sent in clear by someone on the path breaks
// the sender's link with an error naming the peer, instead of stalling the
// sender or letting it overrun the peer's buffer; genuine reports keep a
// transfer many windows long going.
func TestForgedFlowControlReports(t *testing.T) {
	report := func(v uint64) []byte {
		b := make([]byte, creditReportSize)
		binary.LittleEndian.PutUint64(b, v)
		return b
	}
	sealed := func(s *framesec.Sealer, b []byte) []byte {
		return s.SealTo(make([]byte, len(b)+framesec.TagSize), b)
	}
	for _, sec := range []transport.Security{transport.SecurityAuthenticated, transport.SecurityEncrypted} {
		for _, tc := range []struct {
			name   string
			msgs   func(s *framesec.Sealer) [][]byte
			target error // nil: a frame error (wrong size)
		}{
			{"clear report", func(*framesec.Sealer) [][]byte { return [][]byte{report(1 << 40)} }, nil},
			{"forged tag", func(*framesec.Sealer) [][]byte {
				return [][]byte{append(report(1<<40), make([]byte, framesec.TagSize)...)}
			}, transport.ErrFrameAuth},
			{"changed report", func(s *framesec.Sealer) [][]byte {
				m := sealed(s, report(1))
				m[0] ^= 0x40
				return [][]byte{m}
			}, transport.ErrFrameAuth},
			{"replayed report", func(s *framesec.Sealer) [][]byte {
				m := sealed(s, report(1))
				return [][]byte{m, m}
			}, transport.ErrFrameAuth},
		} {
			t.Run(sec.String()+"/"+tc.name, func(t *testing.T) {
				cfg := testCfg()
				cfg.Security = sec
				a, b := pairOf(t, cfg)
				if b.creditSeal == nil || a.creditOpen == nil {
					t.Fatal("flow-control reports are not sealed")
				}
				// Written beneath rank 1's link, as rank 1's reports to
				// rank 0 travel.
				for _, m := range tc.msgs(b.creditSeal) {
					if _, err := b.c.credit.Write(m); err != nil {
						t.Fatal(err)
					}
				}
				select {
				case <-a.creditDone:
				case <-time.After(10 * time.Second):
					t.Fatal("rank 0 still takes reports after the attack")
				}
				ctx := conformance.TimeoutCtx(t, 10*time.Second)
				err := a.Send(ctx, &transport.Header{Kind: transport.FrameData, Length: 4}, make([]byte, 4))
				if err == nil {
					t.Fatal("rank 0 sent on a link whose reports were attacked")
				}
				conformance.AsPeerError(t, err, 1, tc.target)
			})
		}
		t.Run(sec.String()+"/genuine reports", func(t *testing.T) {
			cfg := testCfg()
			cfg.Security = sec
			a, b := pairOf(t, cfg)
			ctx := conformance.TimeoutCtx(t, 30*time.Second)
			// Each frame is several times the flow-control window, so the
			// sender waits for reports many times over.
			if err := conformance.Exchange(ctx, [][]transport.Link{{nil, a}, {b, nil}}, []int{8 << 20, 3 << 20}); err != nil {
				t.Fatal(err)
			}
			if got := a.peerRead.Load(); got == 0 {
				t.Fatal("rank 0 took no report from rank 1")
			}
		})
	}
}
