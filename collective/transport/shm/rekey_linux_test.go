//go:build linux

package shm_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/conformance"
)

// TestRekey: a shared-memory link moves into the next world, where the two
// ends' ranks swap, and carries frames of that world; ends that move to
// different worlds both fail with ErrRekey instead of waiting.
func TestRekey(t *testing.T) {
	a, z := listen(t, testConfig()), listen(t, testConfig())
	la, lz := conformance.ConnectPair(t, a, z)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addrs := []string{z.Addr(), a.Addr()}
	rekey := func(epochA, epochZ uint64) [2]error {
		var errs [2]error
		var wg sync.WaitGroup
		wg.Go(func() {
			errs[0] = la.(transport.RekeyableLink).Rekey(ctx, transport.World{JobID: "pair", Epoch: epochA, Rank: 1, Addrs: addrs}, 0)
		})
		wg.Go(func() {
			errs[1] = lz.(transport.RekeyableLink).Rekey(ctx, transport.World{JobID: "pair", Epoch: epochZ, Rank: 0, Addrs: addrs}, 1)
		})
		wg.Wait()
		return errs
	}
	if got := fmt.Sprintf("%T", la); got != "*shm.link" {
		t.Fatalf("the pair is linked by %s, not shared memory", got)
	}
	if !la.(transport.RekeyableLink).Keepable() {
		t.Fatal("a fresh link is not keepable")
	}
	if errs := rekey(2, 2); errs[0] != nil || errs[1] != nil {
		t.Fatalf("rekey: %v", errs)
	}
	if la.Peer() != 0 || lz.Peer() != 1 {
		t.Fatalf("peers after the rekey: %d and %d, want 0 and 1", la.Peer(), lz.Peer())
	}
	h := transport.Header{Kind: transport.FrameData, Length: 3}
	if err := la.Send(ctx, &h, []byte("abc")); err != nil {
		t.Fatal(err)
	}
	var got transport.Header
	if err := lz.RecvHeader(ctx, &got); err != nil || got.Epoch != 2 || got.Sender != 1 {
		t.Fatalf("epoch 2 frame: %+v, %v", got, err)
	}
	p := make([]byte, 3)
	if err := lz.RecvPayload(ctx, p); err != nil || string(p) != "abc" {
		t.Fatalf("epoch 2 payload %q, %v", p, err)
	}
	for i, err := range rekey(3, 4) {
		if !errors.Is(err, transport.ErrRekey) {
			t.Fatalf("end %d moving to another world than its peer: %v, want ErrRekey", i, err)
		}
	}
}

// TestKeepableAfterClose: Keepable on a closed link, as a failed
// communicator's Salvage asks of links its Abort already closed, says no.
// The peer's flags it reads live in the mapping Close unmaps: read after
// Close, they faulted the process (SIGSEGV in Salvage, seen when a worker
// paused past its exclusion came back).
func TestKeepableAfterClose(t *testing.T) {
	for _, tc := range []struct {
		name  string
		close func(la, lz transport.Link)
		want  bool
	}{
		{"open", func(transport.Link, transport.Link) {}, true},
		{"closed here", func(la, _ transport.Link) { _ = la.Close() }, false},
		{"closed by the peer", func(_, lz transport.Link) { _ = lz.Close() }, false},
		{"closed at both ends", func(la, lz transport.Link) { _ = lz.Close(); _ = la.Close() }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, z := listen(t, testConfig()), listen(t, testConfig())
			la, lz := conformance.ConnectPair(t, a, z)
			tc.close(la, lz)
			if got := la.(transport.RekeyableLink).Keepable(); got != tc.want {
				t.Fatalf("Keepable: %v, want %v", got, tc.want)
			}
		})
	}
}
