package sync

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	stdsync "sync"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/inproc"
	"github.com/gorovod/gorovod/observe/timeline"
	"github.com/gorovod/gorovod/sync/epoch"
)

// alone is a world of one: what Train trains in when no launcher started the
// process. It is a real Session — one member, over the in-process transport,
// fed by a source that announces that one world — so the trainer runs exactly
// the code it runs in a job, collectives included.
type alone struct {
	sess *Session
	src  *aloneSource
	tr   transport.Transport
	tl   *timeline.Timeline // cfg.Timeline's
	log  *slog.Logger
}

// startAlone joins the world of one with cfg's session settings.
func startAlone(ctx context.Context, cfg WorkerConfig, state *State) (*alone, error) {
	// No peer will ever connect: the secret only has to be one.
	secret := make([]byte, 16)
	if _, err := rand.Read(secret); err != nil {
		return nil, err
	}
	tr, err := inproc.NewNetwork().Listen(inproc.Config{Secret: secret, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	self := epoch.Member{Name: fmt.Sprintf("alone-%d", os.Getpid()), Addr: tr.Addr()}
	sc := cfg.Session // openSession fills in its zero fields
	sc.JobID, sc.Self, sc.Logger = "alone", self, cfg.Logger
	var tl *timeline.Timeline
	if cfg.Timeline != "" && sc.Timeline == nil {
		if tl, err = openTimeline(cfg.Timeline, workerProcessName(self.Name, ""), "0"); err != nil {
			tr.Close()
			return nil, err
		}
		sc.Timeline = tl
	}
	src := &aloneSource{world: epoch.World{Number: 1, Members: []epoch.Member{self}}, newer: make(chan struct{})}
	sess, err := openSession(ctx, sc, tr, src, state)
	if err != nil {
		tr.Close()
		closeTimeline(tl, cfg.Logger)
		return nil, err
	}
	return &alone{sess: sess, src: src, tr: tr, tl: tl, log: cfg.Logger}, nil
}

func (a *alone) session() *Session { return a.sess }

// requestLeave announces a world without this worker: the next Commit leaves
// the world of one as a worker leaves a job.
func (a *alone) requestLeave(context.Context) error {
	a.src.announce(epoch.World{Number: a.src.Latest() + 1})
	return nil
}

// rejoin: nothing leaves a world of one out but its own leave request.
func (a *alone) rejoin(context.Context) error { return ErrOutForGood }
func (a *alone) outForGood() bool             { return true }

func (a *alone) finish(context.Context) error { return a.close() }
func (a *alone) close() error {
	err := errors.Join(a.sess.Close(), a.tr.Close())
	closeTimeline(a.tl, a.log)
	return err
}

// aloneSource is the epoch source of a world of one.
type aloneSource struct {
	mu    stdsync.Mutex
	world epoch.World
	newer chan struct{} // closed when a world is announced
}

func (s *aloneSource) announce(w epoch.World) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.world = w
	close(s.newer)
	s.newer = make(chan struct{})
}

func (s *aloneSource) Latest() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.world.Number
}

func (s *aloneSource) Await(ctx context.Context, after uint64) (epoch.World, error) {
	for {
		s.mu.Lock()
		w, newer := s.world, s.newer
		s.mu.Unlock()
		if w.Number > after {
			return w, nil
		}
		select {
		case <-newer:
		case <-ctx.Done():
			return epoch.World{}, ctx.Err()
		}
	}
}

// ReportFailure has no one to tell: a world of one has no peers to fail.
func (s *aloneSource) ReportFailure(uint64, epoch.Member, error) {}
