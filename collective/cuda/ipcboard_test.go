//go:build linux

package cuda

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// openBoards maps one board file p times, as p ranks would.
func openBoards(t *testing.T, p int, timeout time.Duration) []*board {
	t.Helper()
	path, err := createBoardFile(t.TempDir(), p)
	if err != nil {
		t.Fatal(err)
	}
	bs := make([]*board, p)
	for r := range p {
		if bs[r], err = openBoard(path, p, r, timeout, nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { bs[r].close() })
	}
	return bs
}

// TestBoardRounds has three ranks exchange records and agree on failures
// for many rounds, each from its own goroutine and its own mapping.
func TestBoardRounds(t *testing.T) {
	const p, rounds = 3, 300
	bs := openBoards(t, p, 10*time.Second)
	ctx := context.Background()
	rec := func(r, round int) []byte {
		return bytes.Repeat([]byte{byte(r*31 + round)}, callRecordSize)
	}
	errs := make([]error, p)
	var wg sync.WaitGroup
	for r := range p {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := bs[r]
			for round := range rounds {
				all, err := b.exchange(ctx, rec(r, round), "exchange")
				if err != nil {
					errs[r] = err
					return
				}
				for k := range p {
					if !bytes.Equal(all[k*callRecordSize:(k+1)*callRecordSize], rec(k, round)) {
						errs[r] = fmt.Errorf("round %d: rank %d's record differs", round, k)
						return
					}
				}
				// Rank round%4 fails in rounds where that is a rank (3 of 4).
				var local error
				if round%4 == r {
					local = errors.New("this rank's step failed")
				}
				failed, err := b.agree(ctx, local, "agree")
				if err != nil {
					errs[r] = err
					return
				}
				want := -1
				if round%4 < p {
					want = round % 4
				}
				if failed != want {
					errs[r] = fmt.Errorf("round %d: agree says rank %d failed, want %d", round, failed, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

func TestBoardWaitsEnd(t *testing.T) {
	t.Run("timeout", func(t *testing.T) {
		bs := openBoards(t, 3, 50*time.Millisecond)
		// Rank 1 arrives, rank 2 never does.
		if _, err := bs[1].publish(false, nil); err != nil {
			t.Fatal(err)
		}
		s, _ := bs[0].publish(false, nil)
		_, err := bs[0].await(context.Background(), s, "testing")
		var te *SyncTimeoutError
		if !errors.As(err, &te) || fmt.Sprint(te.Missing) != "[2]" || te.Step != "testing" {
			t.Fatalf("err %v, want a SyncTimeoutError missing rank 2", err)
		}
	})
	t.Run("context", func(t *testing.T) {
		bs := openBoards(t, 2, time.Minute)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		s, _ := bs[0].publish(false, nil)
		if _, err := bs[0].await(ctx, s, "testing"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err %v, want the context's", err)
		}
	})
	t.Run("communicator failed", func(t *testing.T) {
		bs := openBoards(t, 2, time.Minute)
		cause := errors.New("peer rank 1 closed the connection")
		bs[0].failed = func() error { return cause }
		s, _ := bs[0].publish(false, nil)
		if _, err := bs[0].await(context.Background(), s, "testing"); !errors.Is(err, cause) {
			t.Fatalf("err %v, want the communicator's", err)
		}
	})
	t.Run("peer exited", func(t *testing.T) {
		bs := openBoards(t, 2, time.Minute)
		bs[0].watchPeers() // rank 1's pid is this process's: alive
		if bs[0].pids == nil {
			t.Fatal("a live peer in this PID namespace is not watched")
		}
		cmd := exec.Command("true")
		if err := cmd.Run(); err != nil {
			t.Skipf("cannot run a short-lived process: %v", err)
		}
		bs[0].pids[1] = cmd.Process.Pid // exited and reaped
		s, _ := bs[0].publish(false, nil)
		start := time.Now()
		_, err := bs[0].await(context.Background(), s, "testing")
		var ge *PeerGoneError
		if !errors.As(err, &ge) || ge.Rank != 1 {
			t.Fatalf("err %v, want a PeerGoneError for rank 1", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("noticed after %v", d)
		}
	})
	t.Run("out of step", func(t *testing.T) {
		bs := openBoards(t, 2, time.Minute)
		for range syncSlots + 1 {
			bs[1].publish(false, nil)
		}
		s, _ := bs[0].publish(false, nil)
		if _, err := bs[0].await(context.Background(), s, "testing"); err == nil || !strings.Contains(err.Error(), "out of step") {
			t.Fatalf("err %v, want the ranks out of step", err)
		}
	})
}

func TestBoardOpenErrors(t *testing.T) {
	path, err := createBoardFile(t.TempDir(), 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := openBoard(path, 3, 0, time.Second, nil); err == nil || !strings.Contains(err.Error(), "want 1536") {
		t.Fatalf("board of another world size: %v", err)
	}
	if _, err := openBoard(path, 2, 2, time.Second, nil); err == nil {
		t.Fatal("rank 2 of 2 accepted")
	}
	if _, err := openBoard(path+".missing", 2, 0, time.Second, nil); err == nil {
		t.Fatal("a missing file accepted")
	}
	b, err := openBoard(path, 2, 0, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	if _, err := b.publish(false, make([]byte, maxBoardRecord+1)); err == nil {
		t.Fatal("an oversized record accepted")
	}
}

func TestBoardName(t *testing.T) {
	got, err := decodeBoardName(encodeBoardName("/dev/shm/gorovod-samehost-123", nil))
	if err != nil || got != "/dev/shm/gorovod-samehost-123" {
		t.Fatalf("round trip: %q, %v", got, err)
	}
	_, err = decodeBoardName(encodeBoardName("", errors.New("read-only file system")))
	if err == nil || !strings.Contains(err.Error(), "read-only file system") {
		t.Fatalf("failure round trip: %v", err)
	}
	if _, err := decodeBoardName(make([]byte, 3)); err == nil {
		t.Fatal("short name accepted")
	}
}
