package metrics

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestServerBoundsConnections: more clients than MaxConns, some scraping and
// then keeping their connection idle, some sending nothing. The server never
// has more than MaxConns open, closes the idle and the silent ones by its
// timeouts (so every client is served in the end), and a fresh scrape
// succeeds afterwards.
func TestServerBoundsConnections(t *testing.T) {
	cfg := DefaultServerConfig()
	cfg.MaxConns, cfg.IdleTimeout, cfg.ReadHeaderTimeout = 3, 300*time.Millisecond, 300*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := Serve(ctx, NewJob().Registry(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer ccancel()
		_ = s.Close(cctx)
	}()

	const clients = 10
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	for i := range clients {
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			defer c.Close()
			// The server's timeouts, not this deadline, must end the
			// connection; this one only keeps a broken server from hanging
			// the test.
			_ = c.SetDeadline(time.Now().Add(60 * time.Second))
			r := bufio.NewReader(c)
			if i%2 == 0 { // scrape, then stay idle on the keep-alive connection
				if _, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n"); err != nil {
					errs <- err
					return
				}
				resp, err := http.ReadResponse(r, nil)
				if err != nil {
					errs <- err
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					errs <- errors.New(resp.Status)
					return
				}
			}
			_, err := io.Copy(io.Discard, r) // until the server closes it
			if err != nil && !errors.Is(err, syscall.ECONNRESET) {
				errs <- err
				return
			}
			errs <- nil
		})
	}
	wg.Wait()
	for range clients {
		if err := <-errs; err != nil {
			t.Fatalf("client: %v", err)
		}
	}
	if _, peak := s.ln.counts(); peak > cfg.MaxConns || peak < 1 {
		t.Fatalf("%d connections open at once, MaxConns %d", peak, cfg.MaxConns)
	}
	scrape(t, s.Addr())
}
