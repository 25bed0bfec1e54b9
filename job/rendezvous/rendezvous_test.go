package rendezvous

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestJoinDeliversAllAddresses(t *testing.T) {
	for _, n := range []int{1, 2, 5} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			s, err := Listen("127.0.0.1:0", n)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			want := make([]string, n)
			got := make(chan []string, n)
			errs := make(chan error, n)
			for r := range n {
				want[r] = fmt.Sprintf("127.0.0.1:%d", 1000+r)
				go func() {
					a, err := Join(ctx, s.Addr(), r, want[r])
					errs <- err
					got <- a
				}()
			}
			for range n {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
				if a := <-got; !slices.Equal(a, want) {
					t.Fatalf("got %v, want %v", a, want)
				}
			}
			all, err := s.Wait(ctx)
			if err != nil || !slices.Equal(all, want) {
				t.Fatalf("Wait: %v %v", all, err)
			}
		})
	}
}

func TestBadRequests(t *testing.T) {
	s, err := Listen("127.0.0.1:0", 2)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := Join(ctx, s.Addr(), 7, "x:1"); err == nil {
		t.Fatal("rank outside the world accepted")
	}
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("garbage\n"))
	c.Close()
	short, cancelShort := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancelShort()
	if _, err := Join(short, s.Addr(), 0, "x:1"); err == nil {
		t.Fatal("join returned before rank 1 joined")
	}
	if _, err := s.Wait(short); err == nil {
		t.Fatal("Wait returned with a rank missing")
	}
}

// joinAll joins every rank of s concurrently, rank r with address addrs[r],
// and returns what each was told.
func joinAll(t *testing.T, ctx context.Context, s *Server, addrs []string, secret []byte) [][]string {
	t.Helper()
	got := make([][]string, len(addrs))
	errs := make([]error, len(addrs))
	var wg sync.WaitGroup
	for r := range addrs {
		wg.Go(func() { got[r], errs[r] = JoinSecret(ctx, s.Addr(), r, addrs[r], secret) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return got
}

// sendLine sends one raw line to the server and returns its reply line.
func sendLine(t *testing.T, addr, line string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(line)); err != nil {
		t.Fatal(err)
	}
	rep, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("reply to %q: %v", line, err)
	}
	return rep
}

// waitJoined waits until rank has joined s.
func waitJoined(t *testing.T, ctx context.Context, s *Server, rank int) {
	t.Helper()
	for ctx.Err() == nil {
		s.mu.Lock()
		joined := s.addrs[rank] != ""
		s.mu.Unlock()
		if joined {
			return
		}
		runtime.Gosched()
	}
	t.Fatalf("rank %d did not join: %v", rank, ctx.Err())
}

func withSecret(size int, secret []byte) Config {
	cfg := DefaultConfig(size)
	cfg.Secret = secret
	return cfg
}

// TestJoinAfterTheWorldIsFull: a rank joining again once every rank has
// joined is refused, and the server (and the process it runs in) goes on.
func TestJoinAfterTheWorldIsFull(t *testing.T) {
	secret := []byte("0123456789abcdef")
	for _, tc := range []struct {
		name   string
		cfg    Config
		attack string
		secret []byte
	}{
		{"open, same address", DefaultConfig(2), `{"rank":1,"addr":"127.0.0.1:1001"}` + "\n", nil},
		{"open, other address", DefaultConfig(2), `{"rank":1,"addr":"127.0.0.1:9"}` + "\n", nil},
		{"signed, unsigned attack", withSecret(2, secret), `{"rank":1,"addr":"127.0.0.1:1001"}` + "\n", secret},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ListenConfig("127.0.0.1:0", tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			want := []string{"127.0.0.1:1000", "127.0.0.1:1001"}
			joinAll(t, ctx, s, want, tc.secret)
			if rep := sendLine(t, s.Addr(), tc.attack); !strings.Contains(rep, "error") {
				t.Fatalf("late join answered %q, want an error", rep)
			}
			// A signed second join of rank 1 is refused too.
			if _, err := JoinSecret(ctx, s.Addr(), 1, "127.0.0.1:1001", tc.secret); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "already joined") {
				t.Fatalf("second join of rank 1: %v, want refused as already joined", err)
			}
			if got, err := s.Wait(ctx); err != nil || !slices.Equal(got, want) {
				t.Fatalf("Wait after the attack: %v %v, want %v", got, err, want)
			}
		})
	}
}

// TestSquat: a process without the job secret that joins first, as a rank
// that has not joined yet, is refused; the legitimate ranks then complete
// the world with their own addresses. Without a secret the first join of a
// rank holds it and a second is refused without disturbing the world.
func TestSquat(t *testing.T) {
	secret := []byte("0123456789abcdef")
	want := []string{"127.0.0.1:2000", "127.0.0.1:2001", "127.0.0.1:2002"}
	for _, tc := range []struct {
		name    string
		cfg     Config
		squat   func(ctx context.Context, addr string) error
		refused string
	}{
		{"unsigned", withSecret(3, secret), func(ctx context.Context, addr string) error {
			_, err := Join(ctx, addr, 1, "127.0.0.1:6666")
			return err
		}, "not signed"},
		{"wrong secret", withSecret(3, secret), func(ctx context.Context, addr string) error {
			_, err := JoinSecret(ctx, addr, 1, "127.0.0.1:6666", []byte("fedcba9876543210"))
			return err
		}, "not signed"},
		{"signature of another address", withSecret(3, secret), func(ctx context.Context, addr string) error {
			m := hex.EncodeToString(mac(secret, joinMessage(1, "127.0.0.1:2001")))
			c, err := net.Dial("tcp", addr)
			if err != nil {
				return err
			}
			defer c.Close()
			fmt.Fprintf(c, `{"rank":1,"addr":"127.0.0.1:6666","mac":%q}`+"\n", m)
			rep, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				return err
			}
			return errors.New(rep)
		}, "not signed"},
		{"garbage signature", withSecret(3, secret), func(ctx context.Context, addr string) error {
			return errors.New(sendLine(t, addr, `{"rank":1,"addr":"127.0.0.1:6666","mac":"zz"}`+"\n"))
		}, "not signed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ListenConfig("127.0.0.1:0", tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := tc.squat(ctx, s.Addr()); err == nil || !strings.Contains(err.Error(), tc.refused) {
				t.Fatalf("squat: %v, want refused (%s)", err, tc.refused)
			}
			for r, got := range joinAll(t, ctx, s, want, secret) {
				if !slices.Equal(got, want) {
					t.Fatalf("rank %d got %v, want %v", r, got, want)
				}
			}
		})
	}
	t.Run("open server, second join of a rank", func(t *testing.T) {
		s, err := Listen("127.0.0.1:0", 3)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		first := make(chan error, 1)
		go func() {
			got, err := Join(ctx, s.Addr(), 0, want[0])
			if err == nil && !slices.Equal(got, want) {
				err = fmt.Errorf("rank 0 got %v", got)
			}
			first <- err
		}()
		waitJoined(t, ctx, s, 0)
		if _, err := Join(ctx, s.Addr(), 0, "127.0.0.1:6666"); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "already joined") {
			t.Fatalf("second join of rank 0: %v", err)
		}
		for r := 1; r < 3; r++ {
			go func() { _, _ = Join(ctx, s.Addr(), r, want[r]) }()
		}
		if err := <-first; err != nil {
			t.Fatal(err)
		}
	})
}

// TestForgedReply: a worker holding the secret refuses a reply that is not
// signed with it (a process that took the rendezvous port).
func TestForgedReply(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			bufio.NewReader(c).ReadString('\n')
			c.Write([]byte(`{"addrs":["127.0.0.1:6666"],"mac":"00"}` + "\n"))
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := JoinSecret(ctx, ln.Addr().String(), 0, "127.0.0.1:1", []byte("0123456789abcdef")); err == nil || !strings.Contains(err.Error(), "reply not signed") {
		t.Fatalf("forged reply: %v, want refused", err)
	}
}

// TestConnectionBounds: a connection that sends nothing is closed after
// ReadTimeout, an over-long line is refused, and no more than MaxPending
// connections are served at once however many are opened; the ranks still
// join afterwards.
func TestConnectionBounds(t *testing.T) {
	cfg := DefaultConfig(2)
	cfg.ReadTimeout, cfg.MaxPending, cfg.MaxLine = 200*time.Millisecond, 3, 256
	s, err := ListenConfig("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	if rep := sendLine(t, s.Addr(), strings.Repeat("x", 1000)+"\n"); !strings.Contains(rep, "too long") {
		t.Fatalf("over-long line answered %q", rep)
	}

	const idle = 12
	var wg sync.WaitGroup
	closed := make(chan error, idle)
	for range idle {
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			defer c.Close()
			// The server, not this deadline, must end the connection.
			_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
			_, err := c.Read(make([]byte, 1))
			closed <- err
		})
	}
	wg.Wait()
	for range idle {
		if err := <-closed; !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("idle connection ended by %v, want closed by the server", err)
		}
	}
	s.mu.Lock()
	peak := s.peakUnjoined
	s.mu.Unlock()
	if peak > cfg.MaxPending {
		t.Fatalf("%d unjoined connections served at once, MaxPending %d", peak, cfg.MaxPending)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	joinAll(t, ctx, s, []string{"a:1", "b:2"}, nil)
}

func TestCloseEndsWaitingRanks(t *testing.T) {
	s, err := Listen("127.0.0.1:0", 2)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := Join(ctx, s.Addr(), 0, "a:1"); done <- err }()
	waitJoined(t, ctx, s, 0)
	s.Close()
	if err := <-done; !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("waiting rank after Close: %v", err)
	}
}

// FuzzAdmit feeds arbitrary join lines to a server: none may panic, a rank
// is registered at most once, and the world is full exactly when every rank
// has an address.
func FuzzAdmit(f *testing.F) {
	secret := []byte("0123456789abcdef")
	signed := func(r int, a string) string {
		return fmt.Sprintf(`{"rank":%d,"addr":%q,"mac":%q}`, r, a, hex.EncodeToString(mac(secret, joinMessage(r, a))))
	}
	f.Add([]byte(signed(0, "a:1")+"\n"+signed(1, "b:2")+"\n"+signed(1, "b:2")), false)
	f.Add([]byte(`{"rank":1,"addr":"x"}`+"\n"+`{"rank":1,"addr":"x"}`+"\n"+`{"rank":0,"addr":"y"}`+"\n"+`{"rank":1,"addr":"x"}`), true)
	f.Add([]byte(`{"rank":-1}`+"\n"+`{"rank":99999999999999999999}`+"\n"+`[]`+"\n"+`{"addr":"\u0000"}`), true)
	f.Fuzz(func(t *testing.T, input []byte, open bool) {
		cfg := withSecret(2, secret)
		if open {
			cfg.Secret = nil
		}
		if err := cfg.fill(); err != nil {
			t.Fatal(err)
		}
		s := newServer(cfg)
		joined := map[int]string{}
		for line := range bytes.SplitSeq(input, []byte("\n")) {
			w, err := s.admit(line)
			if err != nil {
				continue
			}
			var req joinRequest
			if json.Unmarshal(line, &req) != nil {
				t.Fatalf("admitted %q, which does not decode", line)
			}
			if _, ok := joined[req.Rank]; ok {
				t.Fatalf("rank %d admitted twice", req.Rank)
			}
			joined[req.Rank] = req.Addr
			if w.ch == nil {
				t.Fatal("admitted without a reply channel")
			}
		}
		select {
		case <-s.full:
			if len(joined) != cfg.Size {
				t.Fatalf("full with %d of %d ranks", len(joined), cfg.Size)
			}
		default:
			if len(joined) == cfg.Size {
				t.Fatal("every rank joined, world not full")
			}
		}
	})
}
