package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Server serves a registry's metrics over HTTP: GET /metrics in
// Prometheus's text format (or OpenMetrics, as the scraper asks).
type Server struct {
	srv  *http.Server
	ln   *limitListener
	done chan struct{}
	err  error
}

// ServerConfig configures Serve. The endpoint has no authentication: bind it
// to loopback, or to an interface only the scrapers reach. The bounds keep
// any client that reaches it from holding the server's connections,
// goroutines or memory for long.
type ServerConfig struct {
	// Addr is host:port to listen on; port 0 picks a free one (Addr says
	// which). A host-less ":9100" listens on every interface. Default
	// "127.0.0.1:0".
	Addr string
	// Logger receives errors serving a scrape; nil discards.
	Logger *slog.Logger
	// ReadHeaderTimeout bounds a client's request headers (a slow or
	// malicious client holds no goroutine for longer). Default 5 s.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request. Default 10 s.
	ReadTimeout time.Duration
	// WriteTimeout bounds a request from its headers to the end of the
	// reply (a client that stops reading). Default 30 s.
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that sends no next
	// request. Default 60 s (Prometheus scrapes every 15 s to 60 s).
	IdleTimeout time.Duration
	// MaxConns bounds the connections open at once; more wait in the
	// listener's backlog until one closes. Default 16.
	MaxConns int
}

// DefaultServerConfig is the configuration Serve completes a ServerConfig's
// zero fields from.
func DefaultServerConfig() ServerConfig {
	return ServerConfig{Addr: "127.0.0.1:0", ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 60 * time.Second, MaxConns: 16}
}

// Serve listens on cfg.Addr and serves g's metrics until ctx ends or Close
// is called. It returns once listening, so Addr is known.
func Serve(ctx context.Context, g prometheus.Gatherer, cfg ServerConfig) (*Server, error) {
	d := DefaultServerConfig()
	if cfg.Addr == "" {
		cfg.Addr = d.Addr
	}
	for _, f := range []struct{ v, d *time.Duration }{
		{&cfg.ReadHeaderTimeout, &d.ReadHeaderTimeout}, {&cfg.ReadTimeout, &d.ReadTimeout},
		{&cfg.WriteTimeout, &d.WriteTimeout}, {&cfg.IdleTimeout, &d.IdleTimeout},
	} {
		if *f.v <= 0 {
			*f.v = *f.d
		}
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = d.MaxConns
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var lc net.ListenConfig
	tcp, err := lc.Listen(ctx, "tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	ln := newLimitListener(tcp, cfg.MaxConns)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{
		ErrorLog:          slogErrorLog{log},
		ErrorHandling:     promhttp.ContinueOnError,
		EnableOpenMetrics: true,
	}))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "gorovod metrics: GET /metrics")
	})
	s := &Server{
		srv: &http.Server{Handler: mux, ReadHeaderTimeout: cfg.ReadHeaderTimeout, ReadTimeout: cfg.ReadTimeout,
			WriteTimeout: cfg.WriteTimeout, IdleTimeout: cfg.IdleTimeout, MaxHeaderBytes: 16 << 10,
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)},
		ln:   ln,
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			s.err = err
		}
	}()
	go func() {
		select {
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_ = s.Close(sctx)
		case <-s.done:
		}
	}()
	return s, nil
}

// Addr is the address the server listens on (with the port it got).
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the server: scrapes in progress may finish until ctx ends,
// then their connections are cut.
func (s *Server) Close(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if err != nil {
		_ = s.srv.Close()
	}
	<-s.done
	if s.err != nil {
		return fmt.Errorf("metrics: serving: %w", s.err)
	}
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	return nil
}

// slogErrorLog is promhttp's error log, through slog.
type slogErrorLog struct{ l *slog.Logger }

func (e slogErrorLog) Println(v ...any) { e.l.Warn(fmt.Sprint(v...), "component", "metrics") }
