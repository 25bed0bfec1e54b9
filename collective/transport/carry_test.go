package transport_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
)

// stalledDialer is a PartialConnector whose dials never connect: when
// their context ends it waits for after (the other failure of the carry)
// and then names the rank it could not reach, as a real transport's
// missing-ranks error does.
type stalledDialer struct {
	after <-chan struct{}
}

func (stalledDialer) Addr() string { return "127.0.0.1:1" }
func (stalledDialer) Close() error { return nil }
func (d stalledDialer) Connect(ctx context.Context, w transport.World) ([]transport.Link, error) {
	want := make([]bool, w.Size())
	for r := range want {
		want[r] = r != w.Rank
	}
	return d.ConnectSome(ctx, w, want)
}
func (d stalledDialer) ConnectSome(ctx context.Context, w transport.World, want []bool) ([]transport.Link, error) {
	<-ctx.Done()
	<-d.after
	for r, ok := range want {
		if ok {
			return nil, &transport.PeerError{Rank: r, Addr: w.Addrs[r], Op: "connect", Err: ctx.Err()}
		}
	}
	return nil, ctx.Err()
}

// TestCarryAheadNamesTheMissingPeer: when the carry's deadline ends both
// the wait for the connect ahead (which names nobody) and the dial of a
// missing rank (which names it), in that order, the carry's error is the
// one naming the rank: the session blames that member for the world, and
// a member that never connects (a stuck training loop behind a live
// process) is left out after three such blames. Whichever of the two ends
// first is a matter of scheduling; here the order is forced.
func TestCarryAheadNamesTheMissingPeer(t *testing.T) {
	waited := make(chan struct{})
	ahead := &transport.Ahead{Want: []bool{false, false, true}, Wait: func(ctx context.Context) ([]transport.Link, error) {
		<-ctx.Done()
		defer close(waited)
		return nil, context.Cause(ctx)
	}}
	w := transport.World{JobID: "job", Epoch: 2, Rank: 0, Addrs: []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, _, err := transport.CarryAhead(ctx, stalledDialer{after: waited}, w, nil, ahead, nil, transport.CarryWatch{})
	var pe *transport.PeerError
	if !errors.As(err, &pe) || pe.Rank != 1 {
		t.Fatalf("CarryAhead: %v; want the error naming rank 1, the one never connected", err)
	}
}
