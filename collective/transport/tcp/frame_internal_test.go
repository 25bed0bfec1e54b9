package tcp

import (
	"fmt"
	"testing"
)

// TestFrameRest: each write of a large frame moves all that is left of it,
// header (or its rest) and payload together, however much the last write took.
func TestFrameRest(t *testing.T) {
	hdr := make([]byte, 64)
	payload := make([]byte, 1<<20+1000)
	var l link
	l.wparts = [][]byte{hdr, payload}
	l.wvec = make([][]byte, 0, 2)
	for _, tc := range []struct {
		done int    // bytes of the frame written so far
		want string // lengths of the write's buffers
	}{
		{0, fmt.Sprint([]int{64, len(payload)})},
		{10, fmt.Sprint([]int{54, len(payload)})},
		{64, fmt.Sprint([]int{len(payload)})},
		{64 + 1000, fmt.Sprint([]int{len(payload) - 1000})},
		{64 + len(payload) - 1, fmt.Sprint([]int{1})},
	} {
		l.frameRest(tc.done)
		var lens []int
		for _, b := range l.wiov {
			lens = append(lens, len(b))
		}
		if fmt.Sprint(lens) != tc.want {
			t.Errorf("after %d bytes: write %v, want %s", tc.done, lens, tc.want)
		}
	}
	// A small frame (header and payload in one buffer) is one buffer.
	l.wparts = [][]byte{make([]byte, 64+smallFrame)}
	if l.frameRest(0); len(l.wiov) != 1 || len(l.wiov[0]) != 64+smallFrame {
		t.Errorf("small frame: %d buffers", len(l.wiov))
	}
}

// TestWorldSocketBuffer: the default buffer is set on a world's links only
// where the host's ranks do not outnumber its CPUs and the kernel grants all
// of it; an explicit size (set before connecting) or autotuning asked for
// leaves them alone. kernelGrants itself is asked for more than a kernel
// grants unless told to (1 GiB) and for a size every kernel grants (4 KiB).
func TestWorldSocketBuffer(t *testing.T) {
	for _, tc := range []struct {
		configured              int
		oversubscribed, granted bool
		want                    int
	}{
		{0, false, true, defaultSocketBuffer},
		{0, true, true, 0},
		{0, false, false, 0},
		{-1, false, true, 0},
		{64 << 10, false, true, 0},
	} {
		if got := worldSocketBuffer(tc.configured, tc.oversubscribed, tc.granted); got != tc.want {
			t.Errorf("worldSocketBuffer(%d, oversubscribed %v, granted %v) = %d, want %d", tc.configured, tc.oversubscribed, tc.granted, got, tc.want)
		}
	}
	if kernelGrants(1 << 30) {
		t.Error("kernelGrants(1 GiB) = true; net.core.rmem_max should cap it")
	}
	if !kernelGrants(4 << 10) {
		t.Error("kernelGrants(4 KiB) = false")
	}
}
