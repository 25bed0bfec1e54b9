package linkutil

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
)

// The errors a link returns keep the transports' contract: a *PeerError
// naming the peer, wrapping the sentinel callers test with errors.Is.
func TestErrorsNameThePeer(t *testing.T) {
	b := &Base{PeerRank: 3, Addr: "198.18.0.3:9"}
	err := b.PeerErr("recv", transport.ErrPeerTimeout)
	var pe *transport.PeerError
	if !errors.As(err, &pe) || pe.Rank != 3 || pe.Addr != "198.18.0.3:9" || pe.Op != "recv" {
		t.Fatalf("PeerErr = %#v", err)
	}
	if !errors.Is(err, transport.ErrPeerTimeout) {
		t.Errorf("%v does not wrap ErrPeerTimeout", err)
	}
	broke := b.Failure(syscall.EHOSTUNREACH, false, "connection")
	if !errors.Is(broke, transport.ErrPeerClosed) || !errors.Is(broke, syscall.EHOSTUNREACH) {
		t.Errorf("%v is not both ErrPeerClosed and the system error", broke)
	}
	if got, want := broke.Error(), "connection broke: "+syscall.EHOSTUNREACH.Error(); got != want {
		t.Errorf("message %q, want %q", got, want)
	}
	if got := b.Failure(syscall.ECONNRESET, true, "connection"); got != transport.ErrPeerClosed {
		t.Errorf("a recognized close is %v, want ErrPeerClosed", got)
	}
	b.Closed.Store(true)
	if got := b.Failure(syscall.ECONNRESET, true, "connection"); got != transport.ErrLinkClosed {
		t.Errorf("after Close: %v, want ErrLinkClosed", got)
	}
}

// A wait's end: the context's error wins, then whose deadline it was.
func TestExpiredAndDeadline(t *testing.T) {
	b := &Base{IOTimeout: time.Hour}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, ctxBound := b.Deadline(ctx); !ctxBound {
		t.Error("a context deadline before IOTimeout is not the wait's")
	}
	if _, ctxBound := b.Deadline(context.Background()); ctxBound {
		t.Error("no context deadline, yet the wait's deadline is the context's")
	}
	if err := Expired(ctx, true); err != context.DeadlineExceeded {
		t.Errorf("Expired(ctx bound) = %v", err)
	}
	if err := Expired(ctx, false); err != transport.ErrPeerTimeout {
		t.Errorf("Expired(silence) = %v", err)
	}
	cancel()
	if err := Expired(ctx, false); err != context.Canceled {
		t.Errorf("Expired(cancelled) = %v", err)
	}
	for err, want := range map[error]bool{transport.ErrPeerTimeout: true, context.Canceled: true, context.DeadlineExceeded: true, transport.ErrPeerClosed: false} {
		if IsWait(err) != want {
			t.Errorf("IsWait(%v) = %v", err, !want)
		}
	}
}

// A broken direction stays broken; a wait cut short does not break it, nor
// does ErrLinkClosed (Closed reports that).
func TestBrokenStates(t *testing.T) {
	var b Base
	ctx := context.Background()
	h := transport.Header{Kind: transport.FrameData}
	if err := b.SendReady(ctx, &h, nil); err != nil {
		t.Fatalf("SendReady on a fresh link: %v", err)
	}
	if err := b.SendOpen(ctx); err != nil {
		t.Fatalf("SendOpen on a fresh link: %v", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := b.SendOpen(cancelled); !errors.Is(err, context.Canceled) {
		t.Errorf("SendOpen with an ended context: %v", err)
	}
	_ = b.HeaderFailed(transport.ErrPeerTimeout)
	_ = b.SendFailed(transport.ErrLinkClosed)
	if b.RBroken != nil || b.WBroken != nil {
		t.Fatalf("broken by a wait or a close: %v, %v", b.RBroken, b.WBroken)
	}
	_ = b.SendFailed(transport.ErrPeerClosed)
	if err := b.SendReady(ctx, &h, nil); !errors.Is(err, transport.ErrPeerClosed) {
		t.Errorf("SendReady after a failed send: %v", err)
	}
	if err := b.SendOpen(ctx); !errors.Is(err, transport.ErrPeerClosed) {
		t.Errorf("SendOpen after a failed send: %v", err)
	}
	if err := b.HeaderReady(ctx, 4); err == nil {
		t.Error("HeaderReady with a payload unread")
	}
	if _, err := b.PayloadReady(ctx, 5, 4); err == nil {
		t.Error("PayloadReady with the wrong length")
	}
	if done, err := b.PayloadReady(ctx, 4, 4); done || err != nil {
		t.Errorf("PayloadReady = %v, %v", done, err)
	}
}

func TestConfigHelpers(t *testing.T) {
	if OrDefault("", "x") != "x" || OrDefault("y", "x") != "y" {
		t.Error("OrDefault")
	}
	if Positive(-time.Second, time.Minute) != time.Minute || Positive(time.Second, time.Minute) != time.Second {
		t.Error("Positive")
	}
	if SpinTime(0, 5) != 5 || SpinTime(-1, 5) != 0 || SpinTime(3, 5) != 3 {
		t.Error("SpinTime")
	}
	invalid := errors.New("invalid")
	if _, err := RequireSecret(nil, invalid); !errors.Is(err, invalid) {
		t.Errorf("RequireSecret(nil) = %v", err)
	}
	s := []byte("secret")
	c, err := RequireSecret(s, invalid)
	s[0] = 'X'
	if err != nil || string(c) != "secret" {
		t.Errorf("RequireSecret = %q, %v: not a copy", c, err)
	}
}

// A link can be carried into the next world only when open, unbroken in
// both directions and with no payload left unread.
func TestIntact(t *testing.T) {
	for _, tc := range []struct {
		name    string
		closed  bool
		wbroken error
		rbroken error
		pending int
		want    bool
	}{
		{name: "fresh", want: true},
		{name: "closed", closed: true},
		{name: "send side broken", wbroken: transport.ErrPeerClosed},
		{name: "receive side broken", rbroken: transport.ErrPeerClosed},
		{name: "payload unread", pending: 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var wmu, rmu sync.Mutex
			b := &Base{PeerRank: 1, WBroken: tc.wbroken, RBroken: tc.rbroken}
			b.Closed.Store(tc.closed)
			pending := tc.pending
			if got := b.Intact(&wmu, &rmu, &pending); got != tc.want {
				t.Errorf("Intact = %v, want %v", got, tc.want)
			}
			if !wmu.TryLock() || !rmu.TryLock() {
				t.Error("Intact left a lock held")
			}
		})
	}
}
