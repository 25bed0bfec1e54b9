package handshake_test

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/internal/handshake"
)

func TestHelloDecodeRejects(t *testing.T) {
	valid := handshake.Hello{JobHash: 42, Epoch: 3, From: 2, To: 1, Size: 4, Security: transport.SecurityEncrypted, Lanes: 4, Lane: 3, Nonce: [32]byte{5}}
	for _, tc := range []struct {
		name   string
		mutate func(b []byte) []byte
		reason string
	}{
		{"valid", func(b []byte) []byte { return b }, ""},
		{"short", func(b []byte) []byte { return b[:handshake.HelloSize-1] }, "bytes"},
		{"long", func(b []byte) []byte { return append(b, 0) }, "bytes"},
		{"magic", func(b []byte) []byte { b[0] ^= 1; return b }, "magic"},
		{"version", func(b []byte) []byte { b[4] = 2; return b }, "version"},
		{"type", func(b []byte) []byte { b[5] = 3; return b }, "type"},
		{"status byte", func(b []byte) []byte { b[6] = 1; return b }, "reserved"},
		{"reserved byte", func(b []byte) []byte { b[39] = 1; return b }, "reserved"},
		{"lane past lanes", func(b []byte) []byte { b[38] = 4; return b }, "lane 4 of 4"},
		{"too many lanes", func(b []byte) []byte { b[37] = handshake.MaxLanes; return b }, "lanes"},
		{"security default", func(b []byte) []byte { b[36] = 0; return b }, "security"},
		{"security unknown", func(b []byte) []byte { b[36] = 4; return b }, "security"},
		{"size 1", func(b []byte) []byte { binary.LittleEndian.PutUint32(b[32:], 1); return b }, "world size"},
		{"size huge", func(b []byte) []byte { binary.LittleEndian.PutUint32(b[32:], transport.MaxWorldSize+1); return b }, "world size"},
		{"from out of range", func(b []byte) []byte { binary.LittleEndian.PutUint32(b[24:], 4); return b }, "outside"},
		{"to out of range", func(b []byte) []byte { binary.LittleEndian.PutUint32(b[28:], 9); return b }, "outside"},
		{"self", func(b []byte) []byte { binary.LittleEndian.PutUint32(b[28:], 2); return b }, "itself"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := make([]byte, handshake.HelloSize)
			valid.Encode(b)
			var h handshake.Hello
			err := handshake.DecodeHello(tc.mutate(b), &h)
			if tc.reason == "" {
				if err != nil || h != valid {
					t.Fatalf("DecodeHello = %+v, %v; want %+v", h, err, valid)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("DecodeHello error = %v, want one mentioning %q", err, tc.reason)
			}
		})
	}
}

func TestChallengeEncoding(t *testing.T) {
	// A reject carries no nonce or MAC even if the struct has them, and its
	// reason is sanitized and truncated.
	c := handshake.Challenge{Status: handshake.RejectWrongJob, Nonce: [32]byte{1}, MAC: [32]byte{2},
		Reason: "bad\x00job\n" + strings.Repeat("y", 200)}
	b := make([]byte, handshake.ChallengeSize)
	c.Encode(b)
	var got handshake.Challenge
	if err := handshake.DecodeChallenge(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.Nonce != ([32]byte{}) || got.MAC != ([32]byte{}) {
		t.Errorf("reject carries nonce/MAC: %+v", got)
	}
	if want := "bad?job?" + strings.Repeat("y", handshake.MaxRejectReason-8); got.Reason != want {
		t.Errorf("reason = %q, want %q", got.Reason, want)
	}
	// An accept with a reason byte set is malformed.
	ok := handshake.Challenge{Status: handshake.StatusOK}
	ok.Encode(b)
	b[len(b)-1] = 'x'
	if err := handshake.DecodeChallenge(b, &got); err == nil {
		t.Error("accepting challenge with a reason decoded")
	}
	// An unknown status is malformed.
	ok.Encode(b)
	b[6] = 200
	if err := handshake.DecodeChallenge(b, &got); err == nil {
		t.Error("challenge with status 200 decoded")
	}
}

func TestStatusFatal(t *testing.T) {
	for s := handshake.Status(0); s < 12; s++ {
		retry := s == handshake.StatusOK || s == handshake.RejectNotReady || s == handshake.RejectBusy
		if s.Fatal() == retry {
			t.Errorf("%v.Fatal() = %v", s, s.Fatal())
		}
		if s.String() == "" {
			t.Errorf("status %d has no name", s)
		}
	}
}

func TestMACs(t *testing.T) {
	secret := []byte("secret")
	hello := make([]byte, handshake.HelloSize)
	(&handshake.Hello{JobHash: 1, Epoch: 2, From: 1, To: 0, Size: 2, Nonce: [32]byte{3}}).Encode(hello)
	nA, nD := [32]byte{4}, [32]byte{3}

	a := handshake.AcceptorMAC(secret, hello, &nA)
	d := handshake.DialerMAC(secret, hello, &nA, &nD)
	if handshake.MACEqual(&a, &d) {
		t.Fatal("acceptor and dialer MACs are equal: one could be replayed as the other")
	}
	a2 := handshake.AcceptorMAC(secret, hello, &nA)
	if !handshake.MACEqual(&a, &a2) {
		t.Fatal("AcceptorMAC is not deterministic")
	}
	for name, other := range map[string][32]byte{
		"other secret": handshake.AcceptorMAC([]byte("Secret"), hello, &nA),
		"other nonce":  handshake.AcceptorMAC(secret, hello, &[32]byte{5}),
		"other hello":  handshake.AcceptorMAC(secret, append(bytes.Clone(hello[:handshake.HelloSize-1]), 1), &nA),
	} {
		if handshake.MACEqual(&a, &other) {
			t.Errorf("%s gives the same MAC", name)
		}
	}
}

// TestLaneNonce: a lane's nonce depends on the secret, on the first
// connection's hello and acceptor nonce, and on the lane, so a lane cannot
// be passed off as another link's or another lane's.
func TestLaneNonce(t *testing.T) {
	secret, hello, nonceA := []byte("s"), []byte("hello of the first connection"), [handshake.NonceSize]byte{7}
	base := handshake.LaneNonce(secret, hello, &nonceA, 1)
	if again := handshake.LaneNonce(secret, hello, &nonceA, 1); again != base {
		t.Fatal("LaneNonce is not deterministic")
	}
	otherA := [handshake.NonceSize]byte{8}
	for name, got := range map[string][handshake.NonceSize]byte{
		"secret": handshake.LaneNonce([]byte("t"), hello, &nonceA, 1),
		"hello":  handshake.LaneNonce(secret, []byte("hello of another connection"), &nonceA, 1),
		"nonce":  handshake.LaneNonce(secret, hello, &otherA, 1),
		"lane":   handshake.LaneNonce(secret, hello, &nonceA, 2),
	} {
		if got == base {
			t.Errorf("LaneNonce ignores the %s", name)
		}
	}
}
