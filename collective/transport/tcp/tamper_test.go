package tcp_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/conformance"
	"github.com/gorovod/gorovod/collective/transport/internal/framesec"
	"github.com/gorovod/gorovod/collective/transport/internal/handshake"
	"github.com/gorovod/gorovod/collective/transport/tcp"
)

// newTamperProxy is a path that forwards the handshake untouched, then
// holds the first n bytes the dialer sends after it, rewrites them with
// edit and passes them and everything after on.
func newTamperProxy(t *testing.T, target string, n int, edit func([]byte) []byte) *pathProxy {
	t.Helper()
	return newLaneTamperProxy(t, target, n, edit, -1)
}

// newLaneTamperProxy is newTamperProxy for the connections whose hello
// names lane only (all when lane is negative); edit nil cuts them after n
// bytes instead.
func newLaneTamperProxy(t *testing.T, target string, n int, edit func([]byte) []byte, lane int) *pathProxy {
	t.Helper()
	return newPathProxy(t, target, func(client, server net.Conn) {
		// The dialer's side of the handshake: its hello and its proof.
		hello := make([]byte, handshake.HelloSize)
		if _, err := io.ReadFull(client, hello); err != nil {
			return
		}
		if _, err := server.Write(hello); err != nil {
			return
		}
		if _, err := io.CopyN(server, client, handshake.ResponseSize); err != nil {
			return
		}
		var h handshake.Hello
		if lane >= 0 && (handshake.DecodeHello(hello, &h) != nil || int(h.Lane) != lane) {
			io.Copy(server, client)
			return
		}
		held := make([]byte, n)
		if _, err := io.ReadFull(client, held); err != nil {
			return
		}
		if edit == nil {
			// Cut: what was held is lost, and the connection with it.
			client.Close()
			return
		}
		if _, err := server.Write(edit(held)); err != nil {
			return
		}
		io.Copy(server, client)
	})
}

// TestTamperedFrames: a path that changes one bit of a frame, replays,
// drops or reorders frames makes the receiving link fail with a typed
// broken-link error naming the sender, and no frame from the tampered
// point on is delivered, with authentication and with encryption.
func TestTamperedFrames(t *testing.T) {
	const (
		smallLen = 1000
		largeLen = 300 << 10 // two segments
	)
	for _, sec := range []transport.Security{transport.SecurityAuthenticated, transport.SecurityEncrypted} {
		wa := framesec.WireSize(sec, smallLen) // frame A's bytes on the wire
		wb := framesec.WireSize(sec, largeLen) // frame B's
		hdr := transport.HeaderSize + framesec.TagSize
		flip := func(off int) func([]byte) []byte {
			return func(b []byte) []byte { b[off] ^= 0x04; return b }
		}
		for _, tc := range []struct {
			name string
			edit func([]byte) []byte
			// failAt is the first receive step that must fail: 0 A's
			// header, 1 A's payload, 2 B's header, 3 B's payload; -1 none.
			failAt int
		}{
			{"intact", func(b []byte) []byte { return b }, -1},
			{"header bit", flip(24), 0},
			{"header tag bit", flip(transport.HeaderSize + 3), 0},
			{"small payload bit", flip(hdr + smallLen/2), 1},
			{"small payload tag bit", flip(hdr + smallLen + 15), 1},
			{"large payload first segment bit", flip(wa + hdr + 7), 3},
			{"large payload second segment bit", flip(wa + hdr + framesec.SegmentSize + framesec.TagSize + 100), 3},
			{"large payload last tag bit", flip(wa + wb - 1), 3},
			{"replayed frame", func(b []byte) []byte { return append(append(bytes.Clone(b[:wa]), b[:wa]...), b[wa:]...) }, 2},
			{"dropped frame", func(b []byte) []byte { return b[wa:] }, 0},
			{"reordered frames", func(b []byte) []byte { return append(bytes.Clone(b[wa:]), b[:wa]...) }, 0},
		} {
			t.Run(sec.String()+"/"+tc.name, func(t *testing.T) {
				checkNoLeaks(t)
				cfg := testConfig()
				cfg.Security = sec
				trs := listenN(t, 2, cfg)
				proxy := newTamperProxy(t, trs[0].Addr(), wa+wb, tc.edit)
				ctx := conformance.TimeoutCtx(t, 20*time.Second)
				links := connectVia(t, ctx, trs, proxy.addr())
				recv, send := links[0][1], links[1][0]

				payloads := [][]byte{conformance.Pattern(smallLen, 1, 0, 1), conformance.Pattern(largeLen, 1, 0, 2)}
				sent := sendAll(ctx, send, payloads)

				step := 0
				var failure error
				for i, want := range payloads {
					var h transport.Header
					if failure = recv.RecvHeader(ctx, &h); failure != nil {
						break
					}
					step++
					if h.Seq != uint64(i+1) || int(h.Length) != len(want) {
						t.Fatalf("frame %d: header %+v delivered, want seq %d of %d bytes", i, h, i+1, len(want))
					}
					got := make([]byte, h.Length)
					if failure = recv.RecvPayload(ctx, got); failure != nil {
						break
					}
					step++
					if !bytes.Equal(got, want) {
						t.Fatalf("frame %d: a changed payload was delivered", i)
					}
				}
				if tc.failAt < 0 {
					if failure != nil {
						t.Fatalf("untouched frames failed: %v", failure)
					}
					if err := <-sent; err != nil {
						t.Fatalf("send: %v", err)
					}
					return
				}
				if failure == nil || step != tc.failAt {
					t.Fatalf("receive failed at step %d (%v), want a failure at step %d", step, failure, tc.failAt)
				}
				conformance.AsPeerError(t, failure, 1, transport.ErrFrameAuth)
				if !errors.Is(failure, transport.ErrPeerClosed) {
					t.Errorf("error %v is not a broken link (ErrPeerClosed)", failure)
				}
				// The link stays broken: nothing more is delivered from it.
				var h transport.Header
				if err := recv.RecvHeader(ctx, &h); !errors.Is(err, transport.ErrFrameAuth) {
					t.Fatalf("RecvHeader after the failure: %v, want the same error", err)
				}
				// The sender may or may not have finished; the links' cleanup
				// ends it either way.
				recv.Close()
				send.Close()
				<-sent
			})
		}
	}
}

// connectVia connects trs (two transports) as a world in which rank 1
// reaches rank 0 at via.
func connectVia(t *testing.T, ctx context.Context, trs []*tcp.Transport, via string) [][]transport.Link {
	t.Helper()
	addrs := []string{via, trs[1].Addr()}
	links := make([][]transport.Link, len(trs))
	errs := make([]error, len(trs))
	var wg sync.WaitGroup
	for r, tr := range trs {
		wg.Go(func() {
			links[r], errs[r] = tr.Connect(ctx, transport.World{JobID: "job", Epoch: 1, Rank: r, Addrs: addrs})
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: Connect: %v", r, err)
		}
	}
	t.Cleanup(func() { conformance.CloseAll(links) })
	return links
}

// TestTamperedAllreduce: one bit flipped on the path from rank 1 to rank 0
// in the middle of a ring allreduce of 1 MiB makes the allreduce fail on
// rank 0 with an error naming rank 1 and wrapping ErrFrameAuth, and on
// rank 1 too: the flipped chunk is never reduced into a result anyone
// returns.
func TestTamperedAllreduce(t *testing.T) {
	for _, sec := range []transport.Security{transport.SecurityAuthenticated, transport.SecurityEncrypted} {
		t.Run(sec.String(), func(t *testing.T) {
			checkNoLeaks(t)
			cfg := testConfig()
			cfg.Security = sec
			trs := listenN(t, 2, cfg)
			const at = 100_000 // inside rank 1's first 256 KiB chunk
			proxy := newTamperProxy(t, trs[0].Addr(), at+1, func(b []byte) []byte { b[at] ^= 0x10; return b })
			ctx := conformance.TimeoutCtx(t, 20*time.Second)
			links := connectVia(t, ctx, trs, proxy.addr())
			addrs := []string{proxy.addr(), trs[1].Addr()}

			const n = 1 << 18 // float32s: 1 MiB, the ring algorithm
			errs := make([]error, 2)
			var wg sync.WaitGroup
			for r := range 2 {
				wg.Go(func() {
					comm, err := collective.NewFromLinks(transport.World{JobID: "job", Epoch: 1, Rank: r, Addrs: addrs}, links[r],
						collective.Config{SmallMessageBytes: -1, AbortTimeout: time.Second})
					if err != nil {
						errs[r] = err
						return
					}
					defer comm.Close()
					send, recv := make([]float32, n), make([]float32, n)
					for i := range send {
						send[i] = float32(r + 1)
					}
					errs[r] = collective.Allreduce(ctx, comm, send, recv, collective.Sum)
				})
			}
			wg.Wait()
			conformance.AsPeerError(t, errs[0], 1, transport.ErrFrameAuth)
			if errs[1] == nil {
				t.Fatal("rank 1's allreduce succeeded although rank 0 never authenticated its chunk")
			}
			t.Logf("rank 0: %v; rank 1: %v", errs[0], errs[1])
		})
	}
}
