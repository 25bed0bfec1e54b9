package job

import (
	"bytes"
	"sync"
)

// eventStream hands the job's events to its sinks (Config.Sinks), one event
// at a time and in order. The runner's own goroutines emit and wait for the
// sinks; the driver's goroutine, which must not wait for them, queues its
// events with later, and a goroutine of the stream's own (run) delivers
// them. While the job's first workers are launched it holds every event
// (hold, release), so that the job's first lines come first.
type eventStream struct {
	sinks []Sink

	emitMu  sync.Mutex // one Sink call at a time; guards holding and held
	holding bool
	held    []Event // emitted while holding, for release

	mu     sync.Mutex
	queued []Event // raised on the driver's goroutine, not yet delivered
	wake   chan struct{}
	stop   chan struct{}
	done   chan struct{}
}

func newEventStream(sinks []Sink) *eventStream {
	return &eventStream{sinks: sinks, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
}

// emit hands e to every sink, one event at a time (or holds it: hold).
func (s *eventStream) emit(e Event) {
	if len(s.sinks) == 0 {
		return
	}
	s.emitMu.Lock()
	defer s.emitMu.Unlock()
	if s.holding {
		if o, ok := e.(WorkerOutput); ok {
			o.Line = bytes.Clone(o.Line) // the caller's only for the call
			e = o
		}
		s.held = append(s.held, e)
		return
	}
	s.deliverLocked(e)
}

func (s *eventStream) deliverLocked(e Event) {
	for _, sink := range s.sinks {
		sink.Event(e)
	}
}

// hold keeps the events emitted from now on until release. Start holds
// them while it launches the job's first workers: one may print, fail or
// exit before the others are launched, and a person must read what job
// it belongs to (JobStarted) before what became of it.
func (s *eventStream) hold() {
	s.emitMu.Lock()
	defer s.emitMu.Unlock()
	s.holding = true
}

// release hands the sinks first, then the events held since hold, in the
// order they came, and stops holding.
func (s *eventStream) release(first ...Event) {
	if len(s.sinks) == 0 {
		return
	}
	s.emitMu.Lock()
	defer s.emitMu.Unlock()
	held := s.held
	s.holding, s.held = false, nil
	for _, e := range first {
		s.deliverLocked(e)
	}
	for _, e := range held {
		s.deliverLocked(e)
	}
}

// notice emits msg as a Notice.
func (s *eventStream) notice(msg string) { s.emit(Notice{At: now(), Message: msg}) }

// later queues e for the sinks without waiting for them.
func (s *eventStream) later(e Event) {
	s.mu.Lock()
	s.queued = append(s.queued, e)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// run hands the queued events to the sinks until flush.
func (s *eventStream) run() {
	defer close(s.done)
	for {
		select {
		case <-s.wake:
			s.emitQueued()
		case <-s.stop:
			return
		}
	}
}

func (s *eventStream) emitQueued() {
	s.mu.Lock()
	evs := s.queued
	s.queued = nil
	s.mu.Unlock()
	for _, e := range evs {
		s.emit(e)
	}
}

// flush stops run and delivers what is left (the last statistics come just
// before the workers exit).
func (s *eventStream) flush() {
	close(s.stop)
	<-s.done
	s.emitQueued()
}
