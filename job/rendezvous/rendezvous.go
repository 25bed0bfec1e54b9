package rendezvous

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// maxLine bounds one message, so a stranger cannot make the server buffer more.
const maxLine = 64 << 10

type joinRequest struct {
	Rank int    `json:"rank"`
	Addr string `json:"addr"`
}

type joinReply struct {
	Addrs []string `json:"addrs,omitempty"`
	Error string   `json:"error,omitempty"`
}

// Server collects the addresses of size ranks.
type Server struct {
	ln   net.Listener
	size int

	mu      sync.Mutex
	addrs   []string
	waiters []chan []string
	full    chan struct{}
	done    chan struct{}
	wg      sync.WaitGroup
}

// Listen starts a server for size ranks on addr ("127.0.0.1:0" for any port).
func Listen(addr string, size int) (*Server, error) {
	if size < 1 {
		return nil, fmt.Errorf("rendezvous: size %d must be at least 1", size)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("rendezvous: %w", err)
	}
	return Serve(ln, size)
}

// Serve starts a server for size ranks on a listener the caller made (one
// bound to a routable address, or made inside another network namespace);
// Close closes it.
func Serve(ln net.Listener, size int) (*Server, error) {
	if size < 1 {
		ln.Close()
		return nil, fmt.Errorf("rendezvous: size %d must be at least 1", size)
	}
	s := &Server{ln: ln, size: size, addrs: make([]string, size), full: make(chan struct{}), done: make(chan struct{})}
	s.wg.Go(s.accept)
	return s, nil
}

// Addr is the address workers join.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Wait returns the addresses once every rank has joined.
func (s *Server) Wait(ctx context.Context) ([]string, error) {
	select {
	case <-s.full:
		s.mu.Lock()
		defer s.mu.Unlock()
		return append([]string(nil), s.addrs...), nil
	case <-ctx.Done():
		s.mu.Lock()
		defer s.mu.Unlock()
		var missing []int
		for r, a := range s.addrs {
			if a == "" {
				missing = append(missing, r)
			}
		}
		return nil, fmt.Errorf("rendezvous: ranks %v did not join: %w", missing, ctx.Err())
	}
}

// Close stops the server.
func (s *Server) Close() error {
	close(s.done)
	err := s.ln.Close()
	s.wg.Wait()
	return err
}

func (s *Server) accept() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.wg.Go(func() { s.serve(c) })
	}
}

func (s *Server) serve(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReaderSize(c, 4096).ReadSlice('\n')
	if err != nil {
		return
	}
	var req joinRequest
	reply := func(r joinReply) { b, _ := json.Marshal(r); _, _ = c.Write(append(b, '\n')) }
	if err := json.Unmarshal(line, &req); err != nil {
		reply(joinReply{Error: "malformed join request"})
		return
	}
	ch, err := s.register(req)
	if err != nil {
		reply(joinReply{Error: err.Error()})
		return
	}
	// The worker waits as long as it likes; its own context bounds it.
	_ = c.SetDeadline(time.Time{})
	select {
	case addrs := <-ch:
		reply(joinReply{Addrs: addrs})
	case <-s.done:
		reply(joinReply{Error: "rendezvous closed before every rank joined"})
	}
}

func (s *Server) register(req joinRequest) (chan []string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if req.Rank < 0 || req.Rank >= s.size {
		return nil, fmt.Errorf("rank %d outside world of size %d", req.Rank, s.size)
	}
	if req.Addr == "" {
		return nil, errors.New("empty address")
	}
	if s.addrs[req.Rank] != "" && s.addrs[req.Rank] != req.Addr {
		return nil, fmt.Errorf("rank %d already joined from %s", req.Rank, s.addrs[req.Rank])
	}
	s.addrs[req.Rank] = req.Addr
	ch := make(chan []string, 1)
	s.waiters = append(s.waiters, ch)
	for _, a := range s.addrs {
		if a == "" {
			return ch, nil
		}
	}
	for _, w := range s.waiters {
		w <- append([]string(nil), s.addrs...)
	}
	s.waiters = nil
	close(s.full)
	return ch, nil
}

// Join registers rank's address with the server at server and returns every
// rank's address once all have joined.
func Join(ctx context.Context, server string, rank int, addr string) ([]string, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", server)
	if err != nil {
		return nil, fmt.Errorf("rendezvous: %w", err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	b, _ := json.Marshal(joinRequest{Rank: rank, Addr: addr})
	if _, err := c.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("rendezvous: %w", err)
	}
	line, err := bufio.NewReaderSize(c, maxLine).ReadSlice('\n')
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("rendezvous: waiting for the other ranks: %w", ctx.Err())
		}
		return nil, fmt.Errorf("rendezvous: %w", err)
	}
	var rep joinReply
	if err := json.Unmarshal(line, &rep); err != nil {
		return nil, fmt.Errorf("rendezvous: malformed reply: %w", err)
	}
	if rep.Error != "" {
		return nil, fmt.Errorf("rendezvous: %s", rep.Error)
	}
	return rep.Addrs, nil
}
