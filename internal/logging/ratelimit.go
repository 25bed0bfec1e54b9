package logging

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// RateLimitConfig configures a RateLimiter.
type RateLimitConfig struct {
	// Window is how long, after a record goes through, identical ones are
	// counted instead of written; at its end one record says how many there
	// were. Default 5 s.
	Window time.Duration
	// MaxKeys bounds how many distinct records are tracked at once (default
	// 256). Beyond it, records with new keys share one entry, so a flood of
	// records that all differ is limited too.
	MaxKeys int
	// Key says which records are identical: by default those with the same
	// level and message (attributes such as a sender's address may differ).
	Key func(slog.Record) string
}

// DefaultRateLimitConfig returns a 5 s window over at most 256 distinct records.
func DefaultRateLimitConfig() RateLimitConfig {
	return RateLimitConfig{Window: 5 * time.Second, MaxKeys: 256}
}

// overflowKey is the entry records share once MaxKeys are tracked.
const overflowKey = "\x00overflow"

// RateLimiter is a slog.Handler that passes the first of a run of identical
// records and holds back the rest for Window; when the window ends it writes
// the last one held back once, its message followed by "(repeated N times in
// the last 5 s)" and a "repeated" attribute. A record that arrives after a
// quiet window goes through at once. Handlers derived with WithAttrs and
// WithGroup share the counting.
type RateLimiter struct {
	next slog.Handler
	st   *limitState
}

type limitState struct {
	cfg     RateLimitConfig
	mu      sync.Mutex
	entries map[string]*limitEntry
}

type limitEntry struct {
	start time.Time // the record that went through
	held  int       // identical records since, not written
	last  slog.Record
	h     slog.Handler // writes the summary: the handler the last one came through
	timer *time.Timer
	level slog.Level // the most severe held back
	// overflow: this entry holds records of many kinds (MaxKeys reached).
	overflow bool
}

// NewRateLimiter wraps next; zero fields of cfg take the defaults.
func NewRateLimiter(next slog.Handler, cfg RateLimitConfig) *RateLimiter {
	d := DefaultRateLimitConfig()
	if cfg.Window <= 0 {
		cfg.Window = d.Window
	}
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = d.MaxKeys
	}
	if cfg.Key == nil {
		cfg.Key = func(r slog.Record) string { return r.Level.String() + "\x00" + r.Message }
	}
	return &RateLimiter{next: next, st: &limitState{cfg: cfg, entries: map[string]*limitEntry{}}}
}

// Enabled reports whether the wrapped handler wants records at level.
func (h *RateLimiter) Enabled(ctx context.Context, level slog.Level) bool {
	return h.next.Enabled(ctx, level)
}

// WithAttrs returns a handler with attrs added that counts with h.
func (h *RateLimiter) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &RateLimiter{next: h.next.WithAttrs(attrs), st: h.st}
}

// WithGroup returns a handler in group name that counts with h.
func (h *RateLimiter) WithGroup(name string) slog.Handler {
	return &RateLimiter{next: h.next.WithGroup(name), st: h.st}
}

// Handle writes r, or counts it when an identical record went through less
// than Window ago.
func (h *RateLimiter) Handle(ctx context.Context, r slog.Record) error {
	st := h.st
	now := time.Now()
	key := st.cfg.Key(r)
	st.mu.Lock()
	e := st.entries[key]
	if e == nil && len(st.entries) >= st.cfg.MaxKeys {
		st.pruneLocked(now)
		if len(st.entries) >= st.cfg.MaxKeys {
			key = overflowKey
			e = st.entries[key]
		}
	}
	if e != nil && now.Sub(e.start) < st.cfg.Window {
		if e.held == 0 || r.Level > e.level {
			e.level = r.Level
		}
		e.held++
		e.last, e.h = r.Clone(), h.next
		if e.timer == nil {
			e.timer = time.AfterFunc(e.start.Add(st.cfg.Window).Sub(now), func() { st.flush(key, e) })
		}
		st.mu.Unlock()
		return nil
	}
	// e's window has ended. If it held records back, its timer has not
	// written their summary yet (it fires late on a loaded machine): the
	// summary is written here, before this record opens the next window, so
	// that no window writes more than two lines and each count is its own.
	var ended *limitEntry
	if e != nil && e.held > 0 {
		e.timer.Stop()
		delete(st.entries, key) // the timer's flush, if already running, sees this and writes nothing
		ended, e = e, nil
	}
	if e == nil {
		st.entries[key] = &limitEntry{start: now, overflow: key == overflowKey}
	} else {
		// A window that held nothing back ended without a timer.
		e.start = now
	}
	st.mu.Unlock()
	if ended != nil {
		st.write(ended)
	}
	return h.next.Handle(ctx, r)
}

// pruneLocked forgets entries whose window has ended with nothing held back.
func (st *limitState) pruneLocked(now time.Time) {
	for k, e := range st.entries {
		if e.held == 0 && now.Sub(e.start) >= st.cfg.Window {
			delete(st.entries, k)
		}
	}
}

// flush ends e's window, unless Flush already did: it writes the summary of
// what was held back.
func (st *limitState) flush(key string, e *limitEntry) {
	st.mu.Lock()
	if st.entries[key] != e {
		st.mu.Unlock()
		return
	}
	delete(st.entries, key)
	st.mu.Unlock()
	st.write(e)
}

func (st *limitState) write(e *limitEntry) {
	if e.held == 0 {
		return
	}
	msg := fmt.Sprintf("%s (repeated %d times in the last %s)", e.last.Message, e.held, formatWindow(st.cfg.Window))
	if e.overflow {
		msg = fmt.Sprintf("%d more log records held back in the last %s (too many different ones); the last: %s",
			e.held, formatWindow(st.cfg.Window), e.last.Message)
	}
	r := slog.NewRecord(time.Now(), e.level, msg, e.last.PC)
	e.last.Attrs(func(a slog.Attr) bool {
		r.AddAttrs(a)
		return true
	})
	r.AddAttrs(slog.Int("repeated", e.held))
	_ = e.h.Handle(context.Background(), r)
}

// Flush writes, now, the summaries of every window that holds records back
// (a program about to exit calls it so that no count is lost).
func (h *RateLimiter) Flush() {
	st := h.st
	st.mu.Lock()
	var pending []*limitEntry
	for k, e := range st.entries {
		if e.held > 0 {
			if e.timer != nil {
				e.timer.Stop()
			}
			pending = append(pending, e)
			delete(st.entries, k)
		}
	}
	st.mu.Unlock()
	for _, e := range pending {
		st.write(e)
	}
}

// formatWindow writes whole seconds as "5 s", anything else as Go does.
func formatWindow(d time.Duration) string {
	if d >= time.Second && d%time.Second == 0 {
		return fmt.Sprintf("%d s", d/time.Second)
	}
	return d.String()
}
