package cli

import (
	"runtime"
	"testing"
	"time"
)

// Workers added while the job runs get a GPU nobody holds, in ring order,
// and a departed worker's GPU goes to the next one.
func TestDevicePool(t *testing.T) {
	p := newDevicePool([]string{"GPU-a", "GPU-b", "GPU-c"})
	exited := map[int]chan struct{}{}
	take := func(i int) string {
		d, _ := p.take(i)
		exited[i] = make(chan struct{})
		p.releaseWhenDone(i, exited[i])
		return d
	}
	for i, want := range []string{"GPU-a", "GPU-b", "GPU-c", ""} {
		if got := take(i); got != want {
			t.Fatalf("worker %d got %q, want %q", i, got, want)
		}
	}
	close(exited[1])
	// The release runs on its own goroutine: wait for it on the pool itself.
	deadline := time.Now().Add(5 * time.Second)
	for {
		p.mu.Lock()
		_, held := p.owner["GPU-b"]
		p.mu.Unlock()
		if !held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("GPU-b not released after its worker exited")
		}
		runtime.Gosched()
	}
	if got := take(4); got != "GPU-b" {
		t.Fatalf("worker 4 got %q, want the freed GPU-b", got)
	}
	var none *devicePool
	if d, ok := none.take(0); ok || d != "" {
		t.Fatal("a nil pool handed out a device")
	}
	none.releaseWhenDone(0, nil)
}
