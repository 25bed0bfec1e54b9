package testhosts_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorovod/gorovod/internal/testing/testhosts"
)

// rtts measures n one-byte TCP round trips from a client on one host to an
// echo server on another.
func rtts(t *testing.T, c net.Conn, n int) []time.Duration {
	t.Helper()
	out := make([]time.Duration, n)
	b := []byte{0}
	for i := range out {
		t0 := time.Now()
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, b); err != nil {
			t.Fatal(err)
		}
		out[i] = time.Since(t0)
	}
	slices.Sort(out)
	return out
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

func below(ds []time.Duration, limit time.Duration) float64 {
	k := 0
	for _, d := range ds {
		if d < limit {
			k++
		}
	}
	return float64(k) / float64(len(ds))
}

// TestImpairDelay: every packet the impaired host sends waits Delay ± Jitter.
// Noise on a loaded machine only lengthens round trips, so the assertions are
// about what cannot happen: a round trip shorter than the minimum delay, or,
// with jitter, no round trip shorter than the mean delay.
func TestImpairDelay(t *testing.T) {
	if err := testhosts.CanImpair(); err != nil {
		t.Skip(err)
	}
	_, hs := newNet(t, 2)
	ln := serve(t, hs[1], func(c net.Conn) { _, _ = io.Copy(c, c) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := hs[0].Dial(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	base := rtts(t, c, 50)
	t.Logf("no delay: min %v median %v", base[0], base[len(base)/2])

	if err := hs[0].Impair(testhosts.Impairment{Delay: 2 * time.Millisecond, Jitter: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	jit := rtts(t, c, 200)
	t.Logf("2ms ± 1ms: min %v median %v max %v, %.0f%% under 2ms", jit[0], jit[len(jit)/2], jit[len(jit)-1], 100*below(jit, 2*time.Millisecond))
	if jit[0] < time.Millisecond {
		t.Errorf("a round trip took %v, less than the minimum delay of 1ms", jit[0])
	}
	// Uniform jitter puts about half the delays under the mean, but load
	// lengthens round trips (a clean-clone .ci/run saw 14% while other
	// packages ran), so only none at all proves the jitter missing: a fixed
	// 2ms delay gives none.
	if below(jit, 2*time.Millisecond) == 0 {
		t.Errorf("no round trip of %d under the mean delay of 2ms; uniform jitter gives about half", len(jit))
	}

	if err := hs[0].Impair(testhosts.Impairment{Delay: 2 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	fixed := rtts(t, c, 50)
	t.Logf("2ms: min %v median %v", fixed[0], fixed[len(fixed)/2])
	if fixed[0] < 2*time.Millisecond {
		t.Errorf("a round trip took %v with a fixed delay of 2ms", fixed[0])
	}

	if err := hs[0].Heal(); err != nil {
		t.Fatal(err)
	}
	healed := rtts(t, c, 50)
	t.Logf("healed: min %v median %v", healed[0], healed[len(healed)/2])
	if healed[0] >= time.Millisecond {
		t.Errorf("after Heal the fastest round trip still took %v", healed[0])
	}
}

// TestImpairLoss: Loss drops that fraction of what the host sends (measured
// with UDP probes echoed back by the other host, whose replies are not
// impaired), and a loss of 1 is a partition.
func TestImpairLoss(t *testing.T) {
	if err := testhosts.CanImpair(); err != nil {
		t.Skip(err)
	}
	_, hs := newNet(t, 2)
	echo, err := hs[1].ListenPacket("udp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		b := make([]byte, 64)
		for {
			n, from, err := echo.ReadFrom(b)
			if err != nil {
				return
			}
			_, _ = echo.WriteTo(b[:n], from)
		}
	}()
	probe, err := hs[0].ListenPacket("udp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	const probes = 200
	got := make(chan uint32, probes)
	go func() {
		b := make([]byte, 64)
		for {
			n, _, err := probe.ReadFrom(b)
			if err != nil {
				close(got)
				return
			}
			if n == 4 {
				got <- binary.BigEndian.Uint32(b)
			}
		}
	}()
	if err := hs[0].Impair(testhosts.Impairment{Loss: 0.3}); err != nil {
		t.Fatal(err)
	}
	seen := map[uint32]bool{}
	for i := range uint32(probes) {
		if _, err := probe.WriteTo(binary.BigEndian.AppendUint32(nil, i), echo.LocalAddr()); err != nil {
			t.Fatal(err)
		}
		// Wait for this probe's echo (or give up on it: lost); late echoes
		// still count when they arrive.
		timer := time.NewTimer(50 * time.Millisecond)
	wait:
		for {
			select {
			case s := <-got:
				seen[s] = true
				if s == i {
					break wait
				}
			case <-timer.C:
				break wait
			}
		}
		timer.Stop()
	}
	drain := time.After(200 * time.Millisecond)
	for done := false; !done; {
		select {
		case s := <-got:
			seen[s] = true
		case <-drain:
			done = true
		}
	}
	loss := 1 - float64(len(seen))/probes
	t.Logf("loss 0.3: %d of %d probes lost (%.2f)", probes-len(seen), probes, loss)
	// 200 probes at p = 0.3: standard deviation 0.032; these bounds are 3.7 of it.
	if loss < 0.18 || loss > 0.42 {
		t.Errorf("measured loss %.2f, want about 0.3", loss)
	}

	if err := hs[0].Impair(testhosts.Impairment{Loss: 1}); err != nil {
		t.Fatal(err)
	}
	ln := serve(t, hs[1], func(net.Conn) {})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if c, err := hs[0].Dial(ctx, "tcp", ln.Addr().String()); !isTimeout(err) {
		if c != nil {
			c.Close()
		}
		t.Errorf("dial out of a host losing everything: %v, want a timeout", err)
	}
	if err := hs[0].Heal(); err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	c, err := hs[0].Dial(ctx2, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("dial after Heal: %v", err)
	}
	c.Close()
}

// TestImpairOrder sends numbered UDP datagrams back to back from one host to
// another under 2 ms ± 1 ms and reads their one-way delays (sender and
// receiver share this process's clock). Without KeepOrder the jitter lets
// later datagrams overtake earlier ones, as netem's time-sorted queue does;
// with it none is overtaken, and every delay still stays at or above the
// minimum of 1 ms.
func TestImpairOrder(t *testing.T) {
	if err := testhosts.CanImpair(); err != nil {
		t.Skip(err)
	}
	_, hs := newNet(t, 2)
	recv, err := hs[1].ListenPacket("udp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer recv.Close()
	// All datagrams may arrive before the loop below reads one (on a loaded
	// machine): the default buffer (212992 bytes) holds 256 of them, and
	// the rest were dropped by the receiving socket, not by the delayer.
	rc, err := recv.(*net.UDPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20)
	}); err != nil || serr != nil {
		t.Fatalf("receive buffer: %v %v", err, serr)
	}
	send, err := hs[0].ListenPacket("udp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer send.Close()
	const datagrams = 300
	for _, tc := range []struct {
		name string
		im   testhosts.Impairment
	}{
		{"reordering", testhosts.Impairment{Delay: 2 * time.Millisecond, Jitter: time.Millisecond}},
		{"KeepOrder", testhosts.Impairment{Delay: 2 * time.Millisecond, Jitter: time.Millisecond, KeepOrder: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := hs[0].Impair(tc.im); err != nil {
				t.Fatal(err)
			}
			sent := make([]time.Time, datagrams)
			for i := range sent {
				sent[i] = time.Now()
				if _, err := send.WriteTo(binary.BigEndian.AppendUint32(nil, uint32(i)), recv.LocalAddr()); err != nil {
					t.Fatal(err)
				}
			}
			var order []int
			var delays []time.Duration
			b := make([]byte, 64)
			_ = recv.SetReadDeadline(time.Now().Add(5 * time.Second))
			for len(order) < datagrams {
				n, _, err := recv.ReadFrom(b)
				if err != nil {
					t.Fatalf("after %d of %d datagrams: %v", len(order), datagrams, err)
				}
				if n != 4 {
					continue
				}
				i := int(binary.BigEndian.Uint32(b))
				order = append(order, i)
				delays = append(delays, time.Since(sent[i]))
			}
			overtaken := 0
			for k := 1; k < len(order); k++ {
				if order[k] < order[k-1] {
					overtaken++
				}
			}
			slices.Sort(delays)
			t.Logf("%s: one-way delay min %v median %v max %v; %d of %d datagrams arrived after a later one",
				tc.name, delays[0], delays[len(delays)/2], delays[len(delays)-1], overtaken, datagrams)
			if delays[0] < time.Millisecond {
				t.Errorf("a datagram arrived after %v, under the minimum delay of 1ms", delays[0])
			}
			switch {
			case tc.im.KeepOrder && overtaken > 0:
				t.Errorf("KeepOrder: %d datagrams of one flow were overtaken", overtaken)
			case !tc.im.KeepOrder && overtaken == 0:
				// 300 datagrams sent within well under 1 ms of each other,
				// each delayed uniformly over 2 ms: in order only by a
				// vanishing chance.
				t.Errorf("jitter without KeepOrder reordered nothing")
			}
		})
	}
}
