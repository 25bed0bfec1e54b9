package rendezvous

import (
	"context"
	"fmt"
	"net"
	"slices"
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
