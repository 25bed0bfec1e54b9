package testio

import (
	"fmt"
	"sync"
	"testing"
)

// Writers and readers at once: run with -race, and every write is kept.
func TestBufferConcurrent(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 100 {
				fmt.Fprintf(&b, "%d.%d\n", i, j)
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	if got := len(b.Bytes()); got < 4*100*4 {
		t.Fatalf("%d bytes written, want at least %d", got, 4*100*4)
	}
}
