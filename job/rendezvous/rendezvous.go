package rendezvous

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// maxReply bounds the reply a worker reads (every rank's address, each at
// most maxAddr bytes, JSON-quoted), read as it comes, not allocated up front.
const maxReply = 256 << 20

// maxAddr bounds one rank's address, so the reply stays small.
const maxAddr = 512

// ErrRefused marks a join the server turned down (the reason follows it).
var ErrRefused = errors.New("rendezvous: join refused")

// Config configures a Server.
type Config struct {
	// Size is the number of ranks, 0 .. Size-1.
	Size int
	// Secret, when set, is the job secret the workers hold: a join must
	// carry an HMAC-SHA256 of its rank and address under it (JoinSecret),
	// and the reply carries one the worker checks. Without it, any process
	// that reaches the port can take a rank that has not joined yet.
	Secret []byte
	// ReadTimeout bounds how long a connection may take to send its join
	// line; past it, the connection is closed. Default 10 s.
	ReadTimeout time.Duration
	// WriteTimeout bounds writing a reply to a worker that does not read.
	// Default 10 s.
	WriteTimeout time.Duration
	// MaxPending bounds the connections that have not joined yet (being
	// read, or refused); more wait in the listener's backlog until one
	// ends. Joined ranks, one connection each, are not counted. Default 64.
	MaxPending int
	// MaxLine bounds a join line's bytes. Default 4096.
	MaxLine int
}

// DefaultConfig is the configuration of a server for size ranks, without a
// secret.
func DefaultConfig(size int) Config {
	return Config{Size: size, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, MaxPending: 64, MaxLine: 4096}
}

func (c *Config) fill() error {
	if c.Size < 1 {
		return fmt.Errorf("rendezvous: size %d must be at least 1", c.Size)
	}
	d := DefaultConfig(c.Size)
	if c.ReadTimeout <= 0 {
		c.ReadTimeout = d.ReadTimeout
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = d.WriteTimeout
	}
	if c.MaxPending <= 0 {
		c.MaxPending = d.MaxPending
	}
	if c.MaxLine <= 0 {
		c.MaxLine = d.MaxLine
	}
	return nil
}

type joinRequest struct {
	Rank int    `json:"rank"`
	Addr string `json:"addr"`
	// MAC is hex HMAC-SHA256(secret, joinMessage(rank, addr)); empty
	// without a secret.
	MAC string `json:"mac,omitempty"`
}

type joinReply struct {
	Addrs []string `json:"addrs,omitempty"`
	// MAC is hex HMAC-SHA256(secret, replyMessage(request MAC, addrs)),
	// which binds the reply to the request it answers.
	MAC   string `json:"mac,omitempty"`
	Error string `json:"error,omitempty"`
}

// joinMessage is what a join's MAC covers. Separate labels keep a join's MAC
// from ever being a valid reply MAC, and the job secret is fresh per job.
func joinMessage(rank int, addr string) []byte {
	return []byte("gorovod rendezvous join\x00" + strconv.Itoa(rank) + "\x00" + addr)
}

func replyMessage(reqMAC []byte, addrs []string) []byte {
	b, _ := json.Marshal(addrs)
	return append(append([]byte("gorovod rendezvous reply\x00"), reqMAC...), b...)
}

func mac(secret, msg []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write(msg)
	return h.Sum(nil)
}

// Server collects the addresses of Size ranks.
type Server struct {
	ln      net.Listener
	cfg     Config
	pending chan struct{} // a token per connection not joined yet

	mu      sync.Mutex
	addrs   []string
	waiters []waiter
	isFull  bool
	full    chan struct{}
	closed  bool
	// unjoined counts the connections served that have not joined;
	// peakUnjoined is its highest value (tests check MaxPending with it).
	unjoined, peakUnjoined int
	ctx                    context.Context // ends at Close
	cancel                 context.CancelFunc
	wg                     sync.WaitGroup
}

// waiter is a joined rank waiting for the others.
type waiter struct {
	ch     chan joinReply
	reqMAC []byte
}

// Listen starts a server for size ranks, without a secret, on addr
// ("127.0.0.1:0" for any port).
func Listen(addr string, size int) (*Server, error) { return ListenConfig(addr, DefaultConfig(size)) }

// ListenConfig starts a server configured by cfg on addr.
func ListenConfig(addr string, cfg Config) (*Server, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("rendezvous: %w", err)
	}
	return ServeConfig(ln, cfg)
}

// Serve starts a server for size ranks, without a secret, on a listener the
// caller made (one bound to a routable address, or made inside another
// network namespace); Close closes it.
func Serve(ln net.Listener, size int) (*Server, error) { return ServeConfig(ln, DefaultConfig(size)) }

// ServeConfig starts a server configured by cfg on ln; Close closes ln.
func ServeConfig(ln net.Listener, cfg Config) (*Server, error) {
	if err := cfg.fill(); err != nil {
		ln.Close()
		return nil, err
	}
	s := newServer(cfg)
	s.ln = ln
	s.wg.Go(s.accept)
	return s, nil
}

// newServer is a server without a listener yet (admit works on it).
func newServer(cfg Config) *Server {
	s := &Server{cfg: cfg, pending: make(chan struct{}, cfg.MaxPending),
		addrs: make([]string, cfg.Size), full: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
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

// Close stops the server; the ranks still waiting are told so.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.cancel()
	s.mu.Unlock()
	err := s.ln.Close()
	s.wg.Wait()
	return err
}

func (s *Server) accept() {
	for {
		// Past MaxPending unjoined connections, stop accepting: new ones
		// wait in the backlog until a slow one times out.
		select {
		case s.pending <- struct{}{}:
		case <-s.ctx.Done():
			return
		}
		c, err := s.ln.Accept()
		if err != nil {
			<-s.pending
			return
		}
		s.wg.Go(func() { s.serve(c) })
	}
}

func (s *Server) serve(c net.Conn) {
	defer c.Close()
	s.mu.Lock()
	s.unjoined++
	s.peakUnjoined = max(s.peakUnjoined, s.unjoined)
	s.mu.Unlock()
	released := false
	release := func() {
		if !released {
			released = true
			s.mu.Lock()
			s.unjoined--
			s.mu.Unlock()
			<-s.pending
		}
	}
	defer release()
	reply := func(r joinReply) {
		b, _ := json.Marshal(r)
		_ = c.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
		_, _ = c.Write(append(b, '\n'))
	}
	// The read deadline also ends the read when the server closes.
	_ = c.SetReadDeadline(time.Now().Add(s.cfg.ReadTimeout))
	stop := context.AfterFunc(s.ctx, func() { _ = c.SetReadDeadline(time.Unix(1, 0)) })
	line, err := readLine(c, s.cfg.MaxLine)
	stop()
	if err != nil {
		if errors.Is(err, errLineTooLong) {
			reply(joinReply{Error: err.Error()})
		}
		return
	}
	w, err := s.admit(line)
	if err != nil {
		reply(joinReply{Error: err.Error()})
		return
	}
	// Joined: this connection is the rank's, at most one per rank, so it
	// no longer counts against MaxPending. It waits, without reading, for
	// the world to fill or the server to close; the worker's own context
	// bounds how long it waits.
	release()
	select {
	case r := <-w.ch:
		reply(r)
	case <-s.ctx.Done():
		reply(joinReply{Error: "rendezvous closed before every rank joined"})
	}
}

var errLineTooLong = errors.New("join request too long")

// readLine reads up to and without the first '\n', at most max bytes.
func readLine(c net.Conn, max int) ([]byte, error) {
	r := bufio.NewReaderSize(c, max)
	line, err := r.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		return nil, errLineTooLong
	}
	return line, err
}

// admit decodes one join line and registers it; the error is what the
// worker is told.
func (s *Server) admit(line []byte) (waiter, error) {
	var req joinRequest
	if err := json.Unmarshal(line, &req); err != nil {
		return waiter{}, errors.New("malformed join request")
	}
	if req.Rank < 0 || req.Rank >= s.cfg.Size {
		return waiter{}, fmt.Errorf("rank %d outside world of size %d", req.Rank, s.cfg.Size)
	}
	if err := checkAddr(req.Addr); err != nil {
		return waiter{}, err
	}
	var reqMAC []byte
	if s.cfg.Secret != nil {
		got, err := hex.DecodeString(req.MAC)
		if err != nil || !hmac.Equal(got, mac(s.cfg.Secret, joinMessage(req.Rank, req.Addr))) {
			return waiter{}, fmt.Errorf("rank %d: join not signed with the job secret", req.Rank)
		}
		reqMAC = got
	}
	return s.register(req.Rank, req.Addr, reqMAC)
}

// checkAddr bounds an address and keeps control bytes out of the list every
// worker receives (and logs).
func checkAddr(a string) error {
	if a == "" {
		return errors.New("empty address")
	}
	if len(a) > maxAddr {
		return fmt.Errorf("address of %d bytes (at most %d)", len(a), maxAddr)
	}
	for _, r := range a {
		if r < 0x20 || r == 0x7f {
			return errors.New("control character in address")
		}
	}
	return nil
}

func (s *Server) register(rank int, addr string, reqMAC []byte) (waiter, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return waiter{}, errors.New("rendezvous closed")
	}
	// One registration per rank: a second, even with the same address,
	// would otherwise replace or duplicate the first's place in the world.
	if s.addrs[rank] != "" {
		return waiter{}, fmt.Errorf("rank %d already joined", rank)
	}
	s.addrs[rank] = addr
	w := waiter{ch: make(chan joinReply, 1), reqMAC: reqMAC}
	s.waiters = append(s.waiters, w)
	for _, a := range s.addrs {
		if a == "" {
			return w, nil
		}
	}
	for _, w := range s.waiters {
		r := joinReply{Addrs: append([]string(nil), s.addrs...)}
		if s.cfg.Secret != nil {
			r.MAC = hex.EncodeToString(mac(s.cfg.Secret, replyMessage(w.reqMAC, r.Addrs)))
		}
		w.ch <- r
	}
	s.waiters = nil
	if !s.isFull {
		s.isFull = true
		close(s.full)
	}
	return w, nil
}

// Join registers rank's address with the server at server, which has no
// secret, and returns every rank's address once all have joined.
func Join(ctx context.Context, server string, rank int, addr string) ([]string, error) {
	return JoinSecret(ctx, server, rank, addr, nil)
}

// JoinSecret is Join with the job secret: the join is signed with it, and
// the reply must be, by a server holding the same secret.
func JoinSecret(ctx context.Context, server string, rank int, addr string, secret []byte) ([]string, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", server)
	if err != nil {
		return nil, fmt.Errorf("rendezvous: %w", err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	req := joinRequest{Rank: rank, Addr: addr}
	var reqMAC []byte
	if secret != nil {
		reqMAC = mac(secret, joinMessage(rank, addr))
		req.MAC = hex.EncodeToString(reqMAC)
	}
	b, _ := json.Marshal(req)
	if _, err := c.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("rendezvous %s: %w", server, err)
	}
	line, err := bufio.NewReader(io.LimitReader(c, maxReply)).ReadBytes('\n')
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("rendezvous %s: waiting for the other ranks: %w", server, ctx.Err())
		}
		return nil, fmt.Errorf("rendezvous %s: %w", server, err)
	}
	var rep joinReply
	if err := json.Unmarshal(line, &rep); err != nil {
		return nil, fmt.Errorf("rendezvous %s: malformed reply: %w", server, err)
	}
	if rep.Error != "" {
		return nil, fmt.Errorf("%w by %s: %s", ErrRefused, server, rep.Error)
	}
	if secret != nil {
		got, err := hex.DecodeString(rep.MAC)
		if err != nil || !hmac.Equal(got, mac(secret, replyMessage(reqMAC, rep.Addrs))) {
			return nil, fmt.Errorf("rendezvous %s: reply not signed with the job secret", server)
		}
	}
	return rep.Addrs, nil
}
