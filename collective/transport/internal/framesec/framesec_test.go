package framesec_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"testing"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/internal/framesec"
)

var (
	secret = []byte("framesec test secret")
	hello  = []byte("the hello as sent, with job, epoch, ranks, size, security and nonce")
	nonceA = bytes.Repeat([]byte{0xa}, 32)
	nonceD = bytes.Repeat([]byte{0xd}, 32)
)

func derive(t *testing.T, sec transport.Security, secret, hello, nA, nD []byte, dialer bool) framesec.Keys {
	t.Helper()
	k, err := framesec.Derive(sec, secret, hello, nA, nD, dialer)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestDerive: the two ends agree on each direction's key, the directions
// differ, and every input of the derivation changes the keys.
func TestDerive(t *testing.T) {
	sec := transport.SecurityAuthenticated
	d := derive(t, sec, secret, hello, nonceA, nonceD, true)
	a := derive(t, sec, secret, hello, nonceA, nonceD, false)
	if d.Send != a.Recv || d.Recv != a.Send {
		t.Fatal("the ends disagree on the keys")
	}
	if d.Send == d.Recv {
		t.Fatal("both directions have the same key")
	}
	other := func(b []byte) []byte { c := bytes.Clone(b); c[len(c)-1] ^= 1; return c }
	for name, k := range map[string]framesec.Keys{
		"secret":  derive(t, sec, other(secret), hello, nonceA, nonceD, true),
		"hello":   derive(t, sec, secret, other(hello), nonceA, nonceD, true),
		"nonce A": derive(t, sec, secret, hello, other(nonceA), nonceD, true),
		"nonce D": derive(t, sec, secret, hello, nonceA, other(nonceD), true),
		"swapped": derive(t, sec, secret, hello, nonceD, nonceA, true),
	} {
		if k.Send == d.Send || k.Recv == d.Recv {
			t.Errorf("another %s gives the same keys", name)
		}
	}
	if p := derive(t, transport.SecurityPlain, secret, hello, nonceA, nonceD, true); p.Send != ([16]byte{}) || p.Security != transport.SecurityPlain {
		t.Errorf("plain keys %+v", p)
	}
}

func TestWireSize(t *testing.T) {
	const h, tag, s = transport.HeaderSize, framesec.TagSize, framesec.SegmentSize
	for _, tc := range []struct {
		sec  transport.Security
		n    int
		want int
	}{
		{transport.SecurityPlain, 0, h},
		{transport.SecurityPlain, 100, h + 100},
		{transport.SecurityAuthenticated, 0, h + tag},
		{transport.SecurityAuthenticated, 1, h + tag + 1 + tag},
		{transport.SecurityEncrypted, s, h + tag + s + tag},
		{transport.SecurityEncrypted, s + 1, h + tag + s + 1 + 2*tag},
		{transport.SecurityAuthenticated, 3 * s, h + tag + 3*s + 3*tag},
	} {
		if got := framesec.WireSize(tc.sec, tc.n); got != tc.want {
			t.Errorf("WireSize(%v, %d) = %d, want %d", tc.sec, tc.n, got, tc.want)
		}
	}
}

func pair(t testing.TB, sec transport.Security) (*framesec.Sealer, *framesec.Sealer) {
	t.Helper()
	k := [framesec.KeySize]byte{1, 2, 3}
	s, err := framesec.NewSealer(sec, k)
	if err != nil {
		t.Fatal(err)
	}
	o, err := framesec.NewSealer(sec, k)
	if err != nil {
		t.Fatal(err)
	}
	return s, o
}

// TestSealOpen: every way of sealing opens with every way of opening, in
// order; encryption hides the unit, authentication leaves it readable; a
// unit opened out of order (replayed, skipped) or under another key fails.
func TestSealOpen(t *testing.T) {
	unit := []byte("sixty-four bytes of header, or a segment of payload, to protect!")
	for _, sec := range []transport.Security{transport.SecurityAuthenticated, transport.SecurityEncrypted} {
		t.Run(sec.String(), func(t *testing.T) {
			s, o := pair(t, sec)
			inPlace := append(bytes.Clone(unit), make([]byte, framesec.TagSize)...)
			s.SealInPlace(inPlace)
			sealedTo := s.SealTo(make([]byte, len(unit)+framesec.TagSize), unit)
			if bytes.Contains(inPlace, unit) != (sec == transport.SecurityAuthenticated) {
				t.Fatalf("sealed unit readable: %v", bytes.Contains(inPlace, unit))
			}
			var tagged []byte
			if sec == transport.SecurityAuthenticated {
				tag := make([]byte, framesec.TagSize)
				s.Tag(tag, unit)
				tagged = tag
			}
			got, err := o.OpenInPlace(bytes.Clone(inPlace))
			if err != nil || !bytes.Equal(got, unit) {
				t.Fatalf("OpenInPlace = %q, %v", got, err)
			}
			dst := make([]byte, len(unit))
			if err := o.OpenTo(dst, sealedTo); err != nil || !bytes.Equal(dst, unit) {
				t.Fatalf("OpenTo = %q, %v", dst, err)
			}
			if tagged != nil {
				if err := o.Verify(unit, tagged); err != nil {
					t.Fatalf("Verify: %v", err)
				}
			}
			// Replaying the first unit: the receiver expects the next one.
			if _, err := o.OpenInPlace(bytes.Clone(inPlace)); !errors.Is(err, transport.ErrFrameAuth) {
				t.Fatalf("replayed unit: %v", err)
			}
			// Skipping one: the sender's next unit no longer matches either.
			next := s.SealTo(make([]byte, len(unit)+framesec.TagSize), unit)
			if _, err := o.OpenInPlace(next); !errors.Is(err, transport.ErrFrameAuth) {
				t.Fatalf("unit after a lost one: %v", err)
			}
			// Another key.
			other, err := framesec.NewSealer(sec, [framesec.KeySize]byte{9})
			if err != nil {
				t.Fatal(err)
			}
			fresh, _ := pair(t, sec)
			b := fresh.SealTo(make([]byte, len(unit)+framesec.TagSize), unit)
			if _, err := other.OpenInPlace(b); !errors.Is(err, transport.ErrFrameAuth) {
				t.Fatalf("unit under another key: %v", err)
			}
		})
	}
	if _, err := framesec.NewSealer(transport.SecurityPlain, [framesec.KeySize]byte{}); err == nil {
		t.Fatal("a sealer for plain frames")
	}
}

// FuzzOpen: arbitrary bytes never pass as a sealed unit; a unit sealed by
// the peer opens to exactly what was sealed; changing any one bit of it, or
// cutting it, makes it fail. In both settings.
func FuzzOpen(f *testing.F) {
	f.Add([]byte{}, uint16(0), false)
	f.Add(make([]byte, transport.HeaderSize), uint16(3), true)
	f.Add(bytes.Repeat([]byte{0xff}, 1000), uint16(999*8+7), false)
	f.Fuzz(func(t *testing.T, b []byte, bit uint16, encrypt bool) {
		sec := transport.SecurityAuthenticated
		if encrypt {
			sec = transport.SecurityEncrypted
		}
		// Arbitrary bytes, as a forger without the key would send them.
		_, o := pair(t, sec)
		if got, err := o.OpenInPlace(bytes.Clone(b)); !errors.Is(err, transport.ErrFrameAuth) {
			t.Fatalf("forged unit of %d bytes opened: %q, %v", len(b), got, err)
		}
		if len(b) >= framesec.TagSize {
			if err := o.OpenTo(make([]byte, len(b)-framesec.TagSize), b); !errors.Is(err, transport.ErrFrameAuth) {
				t.Fatalf("forged unit opened with OpenTo: %v", err)
			}
		}

		// b as a unit the peer sealed.
		s, o := pair(t, sec)
		sealed := s.SealTo(make([]byte, len(b)+framesec.TagSize), b)
		got, err := o.OpenInPlace(bytes.Clone(sealed))
		if err != nil || !bytes.Equal(got, b) {
			t.Fatalf("round trip of %d bytes: %v", len(b), err)
		}
		s, o = pair(t, sec)
		sealed = s.SealTo(make([]byte, len(b)+framesec.TagSize), b)
		changed := bytes.Clone(sealed)
		i := int(bit) % (8 * len(changed))
		changed[i/8] ^= 1 << (i % 8)
		if _, err := o.OpenInPlace(changed); !errors.Is(err, transport.ErrFrameAuth) {
			t.Fatalf("unit with bit %d flipped opened: %v", i, err)
		}
		_, o = pair(t, sec)
		if _, err := o.OpenInPlace(sealed[:len(sealed)-1]); !errors.Is(err, transport.ErrFrameAuth) {
			t.Fatalf("cut unit opened: %v", err)
		}
	})
}

// BenchmarkSegment: what sealing and opening one 256 KiB segment costs per
// setting, against HMAC-SHA256, the standard library's other MAC, as a
// reference for the choice of AES-GCM.
func BenchmarkSegment(b *testing.B) {
	seg := make([]byte, framesec.SegmentSize)
	for _, sec := range []transport.Security{transport.SecurityAuthenticated, transport.SecurityEncrypted} {
		b.Run(sec.String()+"/seal", func(b *testing.B) {
			s, _ := pair(b, sec)
			dst := make([]byte, len(seg)+framesec.TagSize)
			b.SetBytes(int64(len(seg)))
			for b.Loop() {
				if sec == transport.SecurityAuthenticated {
					s.Tag(dst[len(seg):], seg)
				} else {
					s.SealTo(dst, seg)
				}
			}
		})
		b.Run(sec.String()+"/open", func(b *testing.B) {
			s, o := pair(b, sec)
			sealed := make([]byte, len(seg)+framesec.TagSize)
			dst := make([]byte, len(seg))
			b.SetBytes(int64(len(seg)))
			for b.Loop() {
				b.StopTimer()
				s.SealTo(sealed, seg)
				b.StartTimer()
				var err error
				if sec == transport.SecurityAuthenticated {
					err = o.Verify(sealed[:len(seg)], sealed[len(seg):])
				} else {
					err = o.OpenTo(dst, sealed)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("hmac-sha256", func(b *testing.B) {
		m := hmac.New(sha256.New, secret)
		var sum [sha256.Size]byte
		b.SetBytes(int64(len(seg)))
		for b.Loop() {
			m.Reset()
			m.Write(seg)
			m.Sum(sum[:0])
		}
	})
}

// TestRekeyKeys: both ends of a link derive matching keys for the new
// world (each one's Send the other's Recv) and the same next chaining
// secret; keys differ from the old ones, and any change of a nonce, the
// epoch or a rank gives other keys.
func TestRekeyKeys(t *testing.T) {
	var chain [framesec.ChainSize]byte
	copy(chain[:], "a chaining secret of 32 bytes!!!")
	w := transport.World{JobID: "job", Epoch: 7, Rank: 0, Addrs: []string{"a", "b", "c"}}
	a := transport.NewRekeyMsg(w, 2, 0)
	w.Rank = 2
	b := transport.NewRekeyMsg(w, 0, 0)
	job := transport.JobHash("job")
	for _, sec := range []transport.Security{transport.SecurityAuthenticated, transport.SecurityEncrypted, transport.SecurityPlain} {
		ka, err := framesec.Rekey(sec, &chain, job, &a, &b)
		if err != nil {
			t.Fatal(err)
		}
		kb, err := framesec.Rekey(sec, &chain, job, &b, &a)
		if err != nil {
			t.Fatal(err)
		}
		if ka.Send != kb.Recv || ka.Recv != kb.Send || ka.Chain != kb.Chain {
			t.Fatalf("%v: the two ends derived different keys", sec)
		}
		if ka.Chain == chain {
			t.Fatalf("%v: the chaining secret did not change", sec)
		}
		if sec != transport.SecurityPlain && ka.Send == ka.Recv {
			t.Fatalf("%v: both directions share a key", sec)
		}
		for name, edit := range map[string]func(m *transport.RekeyMsg){
			"nonce": func(m *transport.RekeyMsg) { m.Nonce[0] ^= 1 },
			"epoch": func(m *transport.RekeyMsg) { m.Epoch++ },
			"rank":  func(m *transport.RekeyMsg) { m.From = 1 },
		} {
			c := a
			edit(&c)
			kc, err := framesec.Rekey(sec, &chain, job, &c, &b)
			if err != nil {
				t.Fatal(err)
			}
			if kc.Chain == ka.Chain || (sec != transport.SecurityPlain && kc.Send == ka.Send) {
				t.Fatalf("%v: another %s gave the same keys", sec, name)
			}
		}
	}
	mac := framesec.RekeyMAC(&chain, []byte("message"))
	if other := framesec.RekeyMAC(&chain, []byte("messagf")); other == mac {
		t.Fatal("two messages have one MAC")
	}
}

// TestSub: a link's second stream gets keys the two ends agree on, that
// differ from the link's own keys and between labels, and none for a plain
// link.
func TestSub(t *testing.T) {
	sec := transport.SecurityEncrypted
	d := derive(t, sec, secret, hello, nonceA, nonceD, true)
	a := derive(t, sec, secret, hello, nonceA, nonceD, false)
	sub := func(k framesec.Keys, label string) framesec.Keys {
		t.Helper()
		s, err := k.Sub(label)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	ds, as := sub(d, "x"), sub(a, "x")
	if ds.Send != as.Recv || ds.Recv != as.Send {
		t.Fatal("the ends disagree on the sub-stream's keys")
	}
	if ds.Security != sec {
		t.Fatalf("sub-stream security %v, want %v", ds.Security, sec)
	}
	for _, k := range [][framesec.KeySize]byte{d.Send, d.Recv, sub(d, "y").Send, sub(d, "y").Recv} {
		if k == ds.Send || k == ds.Recv {
			t.Fatal("a sub-stream key equals another key of the link")
		}
	}
	if ds.Send == ds.Recv {
		t.Fatal("both sub-stream directions have the same key")
	}
	plain := sub(framesec.Keys{Security: transport.SecurityPlain}, "x")
	if plain.Security != transport.SecurityPlain || plain.Send != ([framesec.KeySize]byte{}) {
		t.Fatalf("plain link's sub-stream: %+v", plain)
	}
}
