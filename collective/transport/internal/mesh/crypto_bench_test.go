package mesh

import (
	"crypto/rand"
	"testing"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/internal/framesec"
	"github.com/gorovod/gorovod/collective/transport/internal/handshake"
)

// BenchmarkLaneHandshakeCrypto is the cryptography of one lane's handshake,
// both ends together: the acceptor's and the dialer's proofs, each made by
// one end and checked by the other, the lane's nonce on both ends and the
// link keys on both ends (HMAC-SHA256 and HKDF-SHA256; no public-key
// operation). What a joiner's connect costs in CPU beyond its messages is
// this times its lanes.
func BenchmarkLaneHandshakeCrypto(b *testing.B) {
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	var hb [handshake.HelloSize]byte
	h := handshake.Hello{JobHash: 1, Epoch: 2, From: 3, To: 1, Size: 16, Security: transport.SecurityAuthenticated, Lanes: 4, Lane: 1}
	_, _ = rand.Read(h.Nonce[:])
	h.Encode(hb[:])
	var nonceA [handshake.NonceSize]byte
	_, _ = rand.Read(nonceA[:])
	for b.Loop() {
		for range 2 {
			_ = handshake.AcceptorMAC(secret, hb[:], &nonceA)
			_ = handshake.DialerMAC(secret, hb[:], &nonceA, &h.Nonce)
			_ = handshake.LaneNonce(secret, hb[:], &nonceA, 1)
		}
		for _, dialer := range []bool{true, false} {
			if _, err := framesec.Derive(h.Security, secret, hb[:], nonceA[:], h.Nonce[:], dialer); err != nil {
				b.Fatal(err)
			}
		}
	}
}
