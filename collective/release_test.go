package collective

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
)

// TestRelease: a healthy communicator hands over the links Release asks
// for, open and working, and closes the others; one that has failed hands
// over nothing. Either way it runs no collective afterwards.
func TestRelease(t *testing.T) {
	for _, tc := range []struct {
		name   string
		failed bool
	}{
		{"healthy", false},
		{"failed", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms := newWorld(t, inprocMesh, 3, Config{})
			noErrors(t, onAll(t, comms, 5*time.Second, func(ctx context.Context, c *Communicator) error {
				v := []float32{1}
				return Allreduce(ctx, c, v, v, Sum)
			}))
			if tc.failed {
				comms[0].Abort(errors.New("test"))
			}
			out := comms[0].Release(func(r int) bool { return r == 1 })
			if tc.failed {
				if out != nil {
					t.Fatalf("a failed communicator handed over %v", out)
				}
			} else {
				if out == nil || out[1] == nil || out[2] != nil {
					t.Fatalf("handed over %v, want the link to rank 1 alone", out)
				}
				// The link to rank 1 still carries frames; the one to rank 2 is closed.
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				h := transport.Header{Kind: transport.FrameData, Length: 1}
				if err := out[1].Send(ctx, &h, []byte{7}); err != nil {
					t.Fatalf("the handed-over link: %v", err)
				}
				var got transport.Header
				if err := comms[1].links[0].RecvHeader(ctx, &got); err != nil || got.Length != 1 {
					t.Fatalf("rank 1 receiving on the handed-over link: %+v, %v", got, err)
				}
				if err := comms[2].links[0].RecvHeader(ctx, &got); !errors.Is(err, transport.ErrPeerClosed) {
					t.Fatalf("rank 2's link to a released rank 0: %v, want ErrPeerClosed", err)
				}
				out[1].Close()
			}
			v := []float32{1}
			if err := Allreduce(context.Background(), comms[0], v, v, Sum); !errors.Is(err, ErrClosed) && !errors.Is(err, ErrAborted) {
				t.Fatalf("a collective after Release: %v, want ErrClosed or ErrAborted", err)
			}
		})
	}
}
