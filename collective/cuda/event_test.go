//go:build cuda

package cuda

import (
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"testing"
	"time"
)

// TestWaitEvent: memory that work on another stream (the framework's, in
// real use) is still writing is complete once WaitEvent on an event recorded
// behind that work returns; the device's own copies run on streams of their
// own, so a WaitEvent that returned early would read the old bytes.
func TestWaitEvent(t *testing.T) {
	d := openDevice(t)
	const n = 64 << 20 // 64 MiB: a memset that is still running when WaitEvent starts
	m := upload(t, d, make([]byte, n))
	ctx := context.Background()

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := d.drv.ctxSetCurrent(d.ctx); err != nil {
		t.Fatal(err)
	}
	s, err := d.drv.streamCreate(streamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	defer d.drv.streamDestroy(s)
	// The CUevent handle, which a framework passes as an integer.
	handle, err := d.drv.eventCreate(eventDisableTiming)
	if err != nil {
		t.Fatal(err)
	}
	defer d.drv.eventDestroy(handle)

	for round, pattern := range []uint32{0x3f800000, 0x40000000, 0xdeadbeef} {
		// A queue of work ahead of the event (2 GiB of writes, about a
		// millisecond on an H200): only the last memset writes the pattern,
		// so a read before the event has passed sees another value.
		for i := range 32 {
			v := pattern
			if i < 31 {
				v ^= 1
			}
			if err := d.drv.memsetD32Async(uint64(m.Ptr()), v, n/4, s); err != nil {
				t.Fatal(err)
			}
		}
		if err := d.drv.eventRecord(handle, s); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := d.WaitEvent(wctx, handle)
		cancel()
		if err != nil {
			t.Fatalf("round %d: WaitEvent: %v", round, err)
		}
		got := make([]byte, n)
		if err := m.CopyToHost(ctx, got, 0); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < n; i += 4 {
			if v := binary.LittleEndian.Uint32(got[i:]); v != pattern {
				t.Fatalf("round %d: word %d is %#x after WaitEvent, want %#x: it returned before the work behind the event ended", round, i/4, v, pattern)
			}
		}
	}

	if err := d.WaitEvent(ctx, 0); err != nil {
		t.Errorf("WaitEvent of no event: %v", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := d.WaitEvent(cancelled, handle); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitEvent with an ended context: got %v, want context.Canceled", err)
	}
	// Without a deadline the driver blocks instead of polling.
	if err := d.drv.memsetD32Async(uint64(m.Ptr()), 7, n/4, s); err != nil {
		t.Fatal(err)
	}
	if err := d.drv.eventRecord(handle, s); err != nil {
		t.Fatal(err)
	}
	if err := d.WaitEvent(context.Background(), handle); err != nil {
		t.Fatalf("WaitEvent, blocking: %v", err)
	}
	got := make([]byte, 4)
	if err := m.CopyToHost(ctx, got, n-4); err != nil {
		t.Fatal(err)
	}
	if v := binary.LittleEndian.Uint32(got); v != 7 {
		t.Fatalf("last word %d after a blocking WaitEvent, want 7", v)
	}
}

func TestWaitEventClosed(t *testing.T) {
	d := openDevice(t)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	// The handle is never touched: a closed device refuses first.
	if err := d.WaitEvent(context.Background(), 1); !errors.Is(err, ErrClosed) {
		t.Errorf("WaitEvent after Close: got %v, want ErrClosed", err)
	}
}
