package shm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorovod/gorovod/collective/transport"
)

func testPairFor(t testing.TB, singleMin int) *testPair {
	t.Helper()
	p, err := newTestPair(minRingBytes, 2*time.Second, 0, singleMin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.close)
	return p
}

// writeRecord puts raw bytes into a's outgoing ring (b's incoming one) at the
// current tail and publishes them, as a hostile or broken peer could.
func (p *testPair) writeRaw(b []byte) {
	r := p.a.out
	for _, c := range b {
		r.data[p.a.wtail&r.mask] = c
		p.a.wtail++
	}
	atomic.StoreUint64(r.tail, p.a.wtail)
}

func record(h transport.Header, kind byte, payload []byte) []byte {
	if h.Kind == 0 {
		h.Kind = transport.FrameData
	}
	h.JobID, h.Epoch, h.Sender, h.Length = transport.JobHash("pair"), 1, 0, uint32(len(payload))
	b := make([]byte, recordAlign)
	h.Encode(b)
	b[offKind] = kind
	b = append(b, payload...)
	return append(b, make([]byte, padding(len(payload)))...)
}

// TestCorruptRing: whatever a peer writes into the region, the receiver
// reports a FrameError naming it (or the peer's failure) and stays broken; it
// never reads out of bounds or hangs.
func TestCorruptRing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(p *testPair)
		recv  bool // RecvHeader succeeds and RecvPayload fails
	}{
		{"producer counter beyond the ring", func(p *testPair) {
			atomic.StoreUint64(p.a.out.tail, 5*minRingBytes)
		}, false},
		{"producer counter behind the consumer", func(p *testPair) {
			atomic.StoreUint64(p.a.out.tail, ^uint64(0)-3)
		}, false},
		{"bad magic", func(p *testPair) {
			r := record(transport.Header{}, recInline, []byte("data"))
			r[0] = 'X'
			p.writeRaw(r)
		}, false},
		{"other sender", func(p *testPair) {
			r := record(transport.Header{}, recInline, []byte("data"))
			binary.LittleEndian.PutUint32(r[4:], 5)
			p.writeRaw(r)
		}, false},
		{"other epoch", func(p *testPair) {
			r := record(transport.Header{}, recInline, []byte("data"))
			binary.LittleEndian.PutUint64(r[16:], 7)
			p.writeRaw(r)
		}, false},
		{"unknown record kind", func(p *testPair) {
			p.writeRaw(record(transport.Header{}, 9, []byte("data")))
		}, false},
		{"huge length", func(p *testPair) {
			r := record(transport.Header{}, recInline, nil)
			binary.LittleEndian.PutUint32(r[44:], transport.MaxPayload+1)
			p.writeRaw(r)
		}, false},
		{"single copy out of sequence", func(p *testPair) {
			r := record(transport.Header{}, recSingle, nil)
			binary.LittleEndian.PutUint32(r[44:], 100)
			binary.LittleEndian.PutUint64(r[offSeq:], 5)
			p.writeRaw(r)
		}, false},
		{"single copy of unmapped memory", func(p *testPair) {
			r := record(transport.Header{}, recSingle, nil)
			binary.LittleEndian.PutUint32(r[44:], 100)
			binary.LittleEndian.PutUint64(r[offAddr:], 8) // the zero page is never mapped
			binary.LittleEndian.PutUint64(r[offSeq:], 1)
			p.writeRaw(r)
		}, true},
		{"payload cut short by the peer's close", func(p *testPair) {
			r := record(transport.Header{}, recInline, make([]byte, 1000))
			p.writeRaw(r[:recordAlign+100])
			atomic.StoreUint32(p.b.peerClosed, 1)
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := testPairFor(t, 0)
			tc.write(p)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var h transport.Header
			err := p.b.RecvHeader(ctx, &h)
			if tc.recv {
				if err != nil {
					t.Fatalf("RecvHeader: %v", err)
				}
				err = p.b.RecvPayload(ctx, make([]byte, h.Length))
			}
			var pe *transport.PeerError
			if !errors.As(err, &pe) || pe.Rank != 0 {
				t.Fatalf("error %v is not a PeerError naming rank 0", err)
			}
			var fe *transport.FrameError
			if !errors.As(err, &fe) && !errors.Is(err, transport.ErrPeerClosed) {
				t.Fatalf("error %v is neither a FrameError nor ErrPeerClosed", err)
			}
			if fe != nil && fe.Peer != 0 {
				t.Errorf("FrameError names peer %d", fe.Peer)
			}
			// The link stays broken.
			if err2 := p.b.RecvHeader(ctx, &h); err2 == nil || errors.Is(err2, context.DeadlineExceeded) {
				t.Errorf("second RecvHeader: %v", err2)
			}
		})
	}
}

// TestCorruptConsumerCounter: a consumer counter that claims more than was
// sent breaks the sender's side.
func TestCorruptConsumerCounter(t *testing.T) {
	p := testPairFor(t, 0)
	atomic.StoreUint64(p.b.in.head, 1<<40) // more than was ever sent
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	h := transport.Header{Kind: transport.FrameData, Length: 200 << 10}
	err := p.a.Send(ctx, &h, make([]byte, 200<<10))
	var fe *transport.FrameError
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), "corrupted") {
		t.Fatalf("Send: %v, want a FrameError about the ring", err)
	}
}

// TestWithdrawnSingleCopy: a single-copy frame whose sender gave up is not
// delivered, even if its bytes could still be read.
func TestWithdrawnSingleCopy(t *testing.T) {
	p := testPairFor(t, 64<<10)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	payload := bytes.Repeat([]byte{7}, 100<<10)
	sctx, scancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer scancel()
	h := transport.Header{Kind: transport.FrameData, Length: uint32(len(payload))}
	if err := p.a.Send(sctx, &h, payload); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Send with nobody reading: %v, want the deadline", err)
	}
	var rh transport.Header
	if err := p.b.RecvHeader(ctx, &rh); err != nil {
		t.Fatal(err)
	}
	err := p.b.RecvPayload(ctx, make([]byte, rh.Length))
	if !errors.Is(err, transport.ErrPeerClosed) || !strings.Contains(err.Error(), "withdrew") {
		t.Fatalf("RecvPayload of a withdrawn frame: %v", err)
	}
}

func TestStem(t *testing.T) {
	p := procID{pid: 1234, start: 99, ns: 4026531836}
	s := newStem(0xdeadbeef, 7, 2, 5, p)
	got, err := parseStem(s.String())
	if err != nil || got != s {
		t.Fatalf("round trip: %+v, %v; want %+v", got, err, s)
	}
	good := s.String()
	for _, bad := range []string{
		"",
		"gorovod-shm-",
		strings.Replace(good, "gorovod-shm-", "gorovod-xxx-", 1),
		good + "-1",
		strings.Replace(good, "-7-", "-07-", 1),
		strings.Replace(good, "-7-", "-x-", 1),
		strings.ToUpper(good),
		strings.Replace(good, "-1234-", "-0-", 1),
		good[:len(good)-1],
		"gorovod-shm-../../etc/passwd",
		good + strings.Repeat("0", maxStemLen),
	} {
		if _, err := parseStem(bad); err == nil {
			t.Errorf("parseStem(%q) succeeded", bad)
		}
	}
}

// TestSweepStale: files of a process that is gone are removed; those of live
// processes, of other pid namespaces and of other programs are left alone.
func TestSweepStale(t *testing.T) {
	dir := t.TempDir()
	self, err := selfProcID()
	if err != nil {
		t.Fatal(err)
	}
	// A process that has exited: its pid, with a start time that cannot match
	// whatever process gets the pid next.
	cmd := exec.Command("/bin/true")
	if err := cmd.Run(); err != nil {
		t.Skip("no /bin/true:", err)
	}
	dead := procID{pid: cmd.Process.Pid, start: 1, ns: self.ns}
	otherNS := procID{pid: cmd.Process.Pid, start: 1, ns: self.ns + 1}
	mk := func(p procID) stem {
		s := newStem(1, 2, 0, 1, p)
		for k := range numFileKinds {
			if err := os.WriteFile(s.path(dir, k), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return s
	}
	mk(dead)
	live := mk(self)
	foreign := mk(otherNS)
	unrelated := filepath.Join(dir, "gorovod-shm-notours.region")
	os.WriteFile(unrelated, nil, 0o600)
	if n := sweepStale(dir, self); n != numFileKinds {
		t.Errorf("removed %d files, want %d", n, numFileKinds)
	}
	left, _ := os.ReadDir(dir)
	want := map[string]bool{filepath.Base(unrelated): true}
	for k := range numFileKinds {
		want[filepath.Base(live.path(dir, k))] = true
		want[filepath.Base(foreign.path(dir, k))] = true
	}
	for _, e := range left {
		if !want[e.Name()] {
			t.Errorf("left %s", e.Name())
		}
		delete(want, e.Name())
	}
	if len(want) > 0 {
		t.Errorf("removed %v", want)
	}
}

// TestOpenChecks: the higher rank opens only what the lower rank would have
// made: owner-only files of the right type and size, for the right world, no
// symbolic links.
func TestOpenChecks(t *testing.T) {
	dir := t.TempDir()
	const rb = minRingBytes
	path := filepath.Join(dir, "region")
	r, err := createRegion(path, rb, 11, 3, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	r.unmap()
	if r, err := openRegion(path, rb, 11, 3, 0, 1); err != nil {
		t.Fatalf("open: %v", err)
	} else {
		r.unmap()
	}
	for _, tc := range []struct {
		name string
		prep func() string
		rb   int
		job  uint64
	}{
		{"other job", func() string { return path }, rb, 12},
		{"other ring size", func() string { return path }, 2 * rb, 11},
		{"mode 0644", func() string {
			p := filepath.Join(dir, "open")
			r, _ := createRegion(p, rb, 11, 3, 0, 1)
			r.unmap()
			os.Chmod(p, 0o644)
			return p
		}, rb, 11},
		{"symbolic link", func() string {
			p := filepath.Join(dir, "link")
			os.Symlink(path, p)
			return p
		}, rb, 11},
		{"FIFO", func() string {
			p := filepath.Join(dir, "fifo")
			unix.Mkfifo(p, 0o600)
			return p
		}, rb, 11},
		{"missing", func() string { return filepath.Join(dir, "nothing") }, rb, 11},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if r, err := openRegion(tc.prep(), tc.rb, tc.job, 3, 0, 1); err == nil {
				r.unmap()
				t.Fatal("openRegion succeeded")
			}
		})
	}
	if _, err := createRegion(path, rb, 11, 3, 0, 1); err == nil {
		t.Error("createRegion over an existing file succeeded")
	}
	if _, err := openReader(path); err == nil {
		t.Error("openReader of a regular file succeeded")
	}
}

func TestSetupMessages(t *testing.T) {
	h := hello{shared: true, uid: 1000, pid: 42, pidNS: 7, probeAddr: 0xc000123456}
	h.host[3], h.probe[5] = 9, 1
	var hb [helloSize]byte
	h.encode(hb[:])
	var hg hello
	if err := decodeHello(hb[:], &hg); err != nil || hg != h {
		t.Errorf("hello: %+v, %v", hg, err)
	}
	st := newStem(1, 2, 3, 4, procID{pid: 5, start: 6, ns: 7})
	o := offer{ringBytes: 1 << 20, name: st.String()}
	var ob [offerSize]byte
	o.encode(ob[:])
	var og offer
	if err := decodeOffer(ob[:], &og); err != nil || og != o {
		t.Errorf("offer: %+v, %v", og, err)
	}
	for _, r := range []reply{{ok: true}, {ok: true, singleCopy: true}, {ok: false, reason: "cannot open: ENOENT"}} {
		var rb [replySize]byte
		r.encode(rb[:], msgReply)
		var rg reply
		if err := decodeReply(rb[:], msgReply, &rg); err != nil || rg != r {
			t.Errorf("reply: %+v, %v; want %+v", rg, err, r)
		}
		if err := decodeReply(rb[:], msgDone, &rg); err == nil {
			t.Error("a reply decoded as done")
		}
	}
	var rb [replySize]byte
	(&reply{reason: "bad\x00\nbytes"}).encode(rb[:], msgDone)
	var rg reply
	if err := decodeReply(rb[:], msgDone, &rg); err != nil || rg.reason != "bad??bytes" {
		t.Errorf("sanitized reason: %q, %v", rg.reason, err)
	}
}

// FuzzSetupMessages: the decoders never panic, and whatever they accept
// re-encodes to the same bytes.
func FuzzSetupMessages(f *testing.F) {
	var hb [helloSize]byte
	(&hello{shared: true, uid: 1}).encode(hb[:])
	f.Add(hb[:])
	var ob [offerSize]byte
	(&offer{ringBytes: 1 << 20, name: "gorovod-shm-x"}).encode(ob[:])
	f.Add(ob[:])
	var rb [replySize]byte
	(&reply{reason: "no"}).encode(rb[:], msgReply)
	f.Add(rb[:])
	f.Fuzz(func(t *testing.T, b []byte) {
		var h hello
		if decodeHello(b, &h) == nil {
			var out [helloSize]byte
			h.encode(out[:])
			if !bytes.Equal(out[:], b) {
				t.Fatalf("hello %x re-encodes as %x", b, out)
			}
		}
		var o offer
		if decodeOffer(b, &o) == nil {
			var out [offerSize]byte
			o.encode(out[:])
			if !bytes.Equal(out[:], b) {
				t.Fatalf("offer %x re-encodes as %x", b, out)
			}
		}
		for _, typ := range []uint8{msgReply, msgDone} {
			var r reply
			if decodeReply(b, typ, &r) == nil {
				var out [replySize]byte
				r.encode(out[:], typ)
				if !bytes.Equal(out[:], b) {
					t.Fatalf("reply %x re-encodes as %x", b, out)
				}
			}
		}
		_, _ = parseStem(string(b))
	})
}

// FuzzRing: a receiver fed arbitrary ring contents and counters returns frames
// or errors; it never panics, reads out of bounds or hangs.
func FuzzRing(f *testing.F) {
	f.Add(record(transport.Header{Seq: 1}, recInline, []byte("hello")), uint16(0))
	f.Add(append(record(transport.Header{}, recInline, nil), record(transport.Header{Kind: transport.FrameAbort}, recInline, []byte("why"))...), uint16(0))
	single := record(transport.Header{}, recSingle, nil)
	binary.LittleEndian.PutUint32(single[44:], 10)
	binary.LittleEndian.PutUint64(single[offSeq:], 1)
	f.Add(single, uint16(3))
	f.Fuzz(func(t *testing.T, data []byte, extra uint16) {
		p, err := newTestPair(minRingBytes, time.Second, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer p.close()
		if len(data) > minRingBytes {
			data = data[:minRingBytes]
		}
		p.writeRaw(data)
		// Sometimes claim more than was written, or more than fits.
		atomic.AddUint64(p.a.out.tail, uint64(extra)*uint64(extra%7))
		// The peer is gone, so waits for bytes that are not there end at once.
		atomic.StoreUint32(p.b.peerClosed, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for range 100 {
			var h transport.Header
			if err := p.b.RecvHeader(ctx, &h); err != nil {
				checkFuzzErr(t, err)
				return
			}
			if h.Length > 1<<20 {
				return
			}
			if err := p.b.RecvPayload(ctx, make([]byte, h.Length)); err != nil {
				checkFuzzErr(t, err)
				return
			}
		}
	})
}

func checkFuzzErr(t *testing.T, err error) {
	var pe *transport.PeerError
	if !errors.As(err, &pe) || pe.Rank != 0 {
		t.Fatalf("error %v is not a PeerError naming rank 0", err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("receiver hung: %v", err)
	}
}

func TestRingBytes(t *testing.T) {
	for _, tc := range []struct{ size, cfg, want int }{
		{2, 0, 4 << 20}, {9, 0, 4 << 20}, {10, 0, 2 << 20}, {17, 0, 2 << 20}, {18, 0, 1 << 20}, {64, 0, 512 << 10}, {129, 0, 256 << 10}, {4096, 0, 256 << 10},
		{2, 128 << 10, 128 << 10}, {100, 8 << 20, 8 << 20},
	} {
		c := Config{RingBytes: tc.cfg}
		if got := c.ringBytes(tc.size); got != tc.want {
			t.Errorf("ringBytes(%d) with RingBytes %d = %d, want %d", tc.size, tc.cfg, got, tc.want)
		}
	}
	for _, bad := range []int{1000, 64 << 10, 3 << 20, 2 << 30} {
		if _, err := (Config{RingBytes: bad}).withDefaults(); err == nil {
			t.Errorf("RingBytes %d accepted", bad)
		}
	}
}

// TestInPlacePiecesAligned: a producer may publish its counter at any byte
// (after the consumer released an odd amount); RecvPayloadInPlace still hands
// over pieces that are multiples of 64 bytes but the last.
func TestInPlacePiecesAligned(t *testing.T) {
	p, err := newTestPair(minRingBytes, 5*time.Second, time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.close)
	payload := make([]byte, 1000)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	rec := record(transport.Header{}, recInline, payload)
	// The head and 100 bytes of the payload now, the rest once the consumer
	// has taken what it may.
	p.writeRaw(rec[:recordAlign+100])
	ctx := context.Background()
	var h transport.Header
	if err := p.b.RecvHeader(ctx, &h); err != nil {
		t.Fatal(err)
	}
	var got []byte
	var sizes []int
	err = p.b.RecvPayloadInPlace(ctx, make([]byte, len(payload)), func(off int, piece []byte) error {
		if len(got) == 0 {
			p.writeRaw(rec[recordAlign+100:])
		}
		got = append(got, piece...)
		sizes = append(sizes, len(piece))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, payload) {
		t.Fatalf("payload differs")
	}
	for i, n := range sizes[:len(sizes)-1] {
		if n%inPlaceAlign != 0 {
			t.Fatalf("piece %d of %v is %d bytes, not a multiple of %d", i, sizes, n, inPlaceAlign)
		}
	}
	if sizes[0] != 64 {
		t.Errorf("pieces %v: the first should be the 64 bytes of the 100 published", sizes)
	}
}
