package tcp

import (
	"fmt"
	"testing"
)

// TestNextPiece: a large frame goes out in pieces that end at multiples of
// pieceBytes of the payload, the header riding along with the first, however
// much each write took.
func TestNextPiece(t *testing.T) {
	hdr := make([]byte, 64)
	payload := make([]byte, 2*pieceBytes+1000)
	var l link
	l.wfrm[0], l.wfrm[1] = hdr, payload
	for _, tc := range []struct {
		done int    // bytes of the frame written so far
		want string // lengths of the piece's buffers
	}{
		{0, fmt.Sprint([]int{64, pieceBytes})},
		{10, fmt.Sprint([]int{54, pieceBytes})},
		{64, fmt.Sprint([]int{pieceBytes})},
		{64 + 1000, fmt.Sprint([]int{pieceBytes - 1000})},
		{64 + pieceBytes, fmt.Sprint([]int{pieceBytes})},
		{64 + 2*pieceBytes, fmt.Sprint([]int{1000})},
		{64 + 2*pieceBytes + 999, fmt.Sprint([]int{1})},
	} {
		l.nextPiece(tc.done)
		var lens []int
		for _, b := range l.wiov {
			lens = append(lens, len(b))
		}
		if fmt.Sprint(lens) != tc.want {
			t.Errorf("after %d bytes: piece %v, want %s", tc.done, lens, tc.want)
		}
	}
	// A small frame is one piece.
	l.wfrm[0], l.wfrm[1] = make([]byte, 64+smallFrame), nil
	if l.nextPiece(0); len(l.wiov) != 1 || len(l.wiov[0]) != 64+smallFrame {
		t.Errorf("small frame: %d buffers", len(l.wiov))
	}
}
