package membership

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// TestFreshSequenceNumbers: each sequence number from a sender is accepted
// once, in any order within the replay window, and never once it has fallen
// behind the window.
func TestFreshSequenceNumbers(t *testing.T) {
	for _, tc := range []struct {
		name string
		seqs []uint64
		want []bool
	}{
		{"in order", []uint64{1, 2, 3}, []bool{true, true, true}},
		{"a repeat", []uint64{1, 2, 2}, []bool{true, true, false}},
		{"overtaken, then late", []uint64{1, 3, 2, 2}, []bool{true, true, true, false}},
		{"late within the window", []uint64{100, 37, 37}, []bool{true, true, false}},
		{"behind the window", []uint64{100, 36}, []bool{true, false}},
		{"a jump clears the window", []uint64{5, 500, 5, 499, 499}, []bool{true, true, false, true, false}},
		{"the first repeated after a jump of exactly the window", []uint64{1, 65, 1, 2}, []bool{true, true, false, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var a peerAuth
			for i, seq := range tc.seqs {
				if got := a.fresh(seq); got != tc.want[i] {
					t.Fatalf("sequence number %d (#%d): fresh %v, want %v", seq, i, got, tc.want[i])
				}
			}
		})
	}
}

// sendRaw puts bytes on memberlist's reliable channel to member to, as a
// process holding the job secret but following no rules would.
func sendRaw(t *testing.T, from *Member, to *Member, b []byte) {
	t.Helper()
	addr := to.Local().Addr
	if err := from.ml.SendReliable(&memberlist.Node{Name: to.Name(), Addr: net.IP(addr.Addr().AsSlice()), Port: addr.Port()}, b); err != nil {
		t.Fatalf("raw send: %v", err)
	}
}

// TestSenderIsAuthenticated runs three members over loopback gossip, one of
// them (mallory) holding the job secret but trying to pass messages off as
// another's: a frame naming alice but signed by mallory, a frame alice
// signed for bob delivered again (replay) or to carol (redirect), and
// metadata that publishes another key under alice's name. Each is refused
// and counted; alice's own messages still arrive, named as hers.
func TestSenderIsAuthenticated(t *testing.T) {
	alice := join(t, testConfig("alice"), testMeta(0))
	seed := []string{alice.Local().Addr.String()}
	cfg := testConfig("bob")
	cfg.Seeds = seed
	bob := join(t, cfg, testMeta(1))
	cfg = testConfig("carol")
	cfg.Seeds = seed
	carol := join(t, cfg, testMeta(2))
	cfg = testConfig("mallory")
	cfg.Seeds = seed
	mallory := join(t, cfg, testMeta(3))
	all := []*Member{alice, bob, carol, mallory}
	waitConverged(t, all, time.Now())

	receive := func(m *Member, want string) {
		t.Helper()
		select {
		case msg := <-m.Messages():
			if string(msg.Payload) != want || msg.From.Name != alice.Name() {
				t.Fatalf("%s got %q from %s, want %q from %s", m.Name(), msg.Payload, msg.From.Name, want, alice.Name())
			}
		case <-time.After(joinBound):
			t.Fatalf("%s got nothing", m.Name())
		}
	}

	// Alice's own frame, through mallory's hands: delivered once.
	genuine := signedFrame(alice, bob.Name(), frameData, []byte("from alice"))
	sendRaw(t, mallory, bob, genuine)
	receive(bob, "from alice")

	for _, tc := range []struct {
		name    string
		to      *Member
		frame   []byte
		counter func(Stats) uint64
	}{
		{"spoofed sender", bob,
			signFrame(mallory.signKey, bob.Name(), &frame{kind: frameData, jobID: testJob, from: alice.Name(), seq: 1000, payload: []byte("done")}),
			func(s Stats) uint64 { return s.MessagesUnverified }},
		{"spoofed sender, unsigned", bob, unsignedFrame(testJob, alice.Name(), frameData, []byte("done")),
			func(s Stats) uint64 { return s.MessagesUnverified }},
		{"replayed", bob, genuine, func(s Stats) uint64 { return s.MessagesReplayed }},
		{"redirected to another member", carol, genuine, func(s Stats) uint64 { return s.MessagesUnverified }},
		{"payload changed", bob, append(append([]byte(nil), genuine[:len(genuine)-frameSigSize-1]...), append([]byte{'!'}, genuine[len(genuine)-frameSigSize:]...)...),
			func(s Stats) uint64 { return s.MessagesUnverified }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.counter(tc.to.Stats())
			sendRaw(t, mallory, tc.to, tc.frame)
			eventually(t, joinBound, "the refusal counted", func() bool { return tc.counter(tc.to.Stats()) == before+1 })
			// Nothing was delivered: the next message is alice's next one.
			if err := alice.Send(t.Context(), tc.to.Local(), []byte("next")); err != nil {
				t.Fatal(err)
			}
			receive(tc.to, "next")
		})
	}

	// Metadata that puts mallory's key under alice's name is refused by
	// every member that knows alice's: as an alive message, and told directly.
	forged := alice.Local().Meta
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	forged.SigningKey = pub
	enc, err := forged.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	enc = sealMeta(priv, alice.Name(), enc, 1<<20)
	addr := alice.Local().Addr
	err = (&delegate{bob}).NotifyAlive(&memberlist.Node{Name: alice.Name(), Addr: net.IP(addr.Addr().AsSlice()), Port: addr.Port(), Meta: enc})
	if !errors.Is(err, ErrSigningKeyChanged) {
		t.Fatalf("an alive message with another key under alice's name: %v", err)
	}
	if got := bob.Stats().KeysRefused; got != 1 {
		t.Fatalf("KeysRefused = %d, want 1", got)
	}
	if err := bob.UpdateMeta(t.Context(), func(m *Meta) { m.SigningKey = pub }); err == nil {
		t.Fatal("UpdateMeta changed the signing key")
	}
}

// BenchmarkSignVerifyFrame: what signing costs a sender and verifying a
// receiver, per control message of 256 bytes.
func BenchmarkSignVerifyFrame(b *testing.B) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	f := frame{kind: frameData, jobID: testJob, from: "sender-1-abcdef", seq: 1, payload: make([]byte, 256)}
	for b.Loop() {
		f.seq++
		if !verifyFrame(pub, "receiver", signFrame(priv, "receiver", &f)) {
			b.Fatal("does not verify")
		}
	}
}
