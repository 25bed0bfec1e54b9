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
	ln   net.Listener
	done chan struct{}
	err  error
}

// ServerConfig configures Serve.
type ServerConfig struct {
	// Addr is host:port to listen on; port 0 picks a free one (Addr says
	// which). Default "127.0.0.1:0".
	Addr string
	// Logger receives errors serving a scrape; nil discards.
	Logger *slog.Logger
	// ReadHeaderTimeout bounds a client's request headers (a slow or
	// malicious client holds no goroutine for longer). Default 5 s.
	ReadHeaderTimeout time.Duration
}

// Serve listens on cfg.Addr and serves g's metrics until ctx ends or Close
// is called. It returns once listening, so Addr is known.
func Serve(ctx context.Context, g prometheus.Gatherer, cfg ServerConfig) (*Server, error) {
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.ReadHeaderTimeout <= 0 {
		cfg.ReadHeaderTimeout = 5 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
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
		srv:  &http.Server{Handler: mux, ReadHeaderTimeout: cfg.ReadHeaderTimeout, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)},
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
