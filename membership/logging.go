package membership

import (
	"bytes"
	"context"
	"log"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/gorovod/gorovod/internal/logging"
)

// newMemberlistLogger adapts slog to the *log.Logger memberlist writes to.
// memberlist formats each line as "[LEVEL] memberlist: message"; the level
// becomes the slog level, so its chatty DEBUG lines cost one Enabled check
// when the handler does not want them.
//
// Two of memberlist's habits would flood a log, and the adapter stops both:
//   - it logs an ERROR for every packet it cannot decrypt or decode, so a
//     stranger sending garbage to the gossip port writes a line per packet.
//     The sender's "from=ADDR" becomes an attribute, and identical lines at
//     WARN or above (level and message) go through a logging.RateLimiter:
//     the first one, then one line per window saying how many more there
//     were (DEBUG and INFO lines, which a user asks for, all go through);
//   - once this member is leaving (quiet is set), it complains about its own
//     sockets closing under it: those lines drop to DEBUG;
//   - its periodic state exchange may have picked a peer that is leaving
//     (it said goodbye, or its State is leaving) or already gone, and then
//     logs an ERROR when that peer's socket is closed: departed (when set)
//     says which peers those are, and their lines drop to DEBUG. A peer
//     still alive and in the cluster keeps its ERROR.
//
// The returned limiter's Flush writes the counts still held back.
func newMemberlistLogger(l *slog.Logger, repeatWindow time.Duration, quiet *atomic.Bool, departed func(name string) bool) (*log.Logger, *logging.RateLimiter) {
	rl := logging.NewRateLimiter(l.Handler(), logging.RateLimitConfig{Window: repeatWindow})
	return log.New(logWriter{l: l, limited: slog.New(rl), quiet: quiet, departed: departed}, "", 0), rl
}

type logWriter struct {
	l, limited *slog.Logger // limited: through the rate limiter
	quiet      *atomic.Bool
	departed   func(name string) bool
}

// pushPullPeer returns the peer named in memberlist's "Push/Pull with NAME
// failed: ERR" (its state exchange, which it logs without holding its own
// locks, so departed may take the Member's).
func pushPullPeer(line []byte) (string, bool) {
	rest, ok := bytes.CutPrefix(line, []byte("Push/Pull with "))
	if !ok {
		return "", false
	}
	name, _, ok := bytes.Cut(rest, []byte(" failed: "))
	if !ok || len(name) == 0 {
		return "", false
	}
	return string(name), true
}

// parseLevel splits memberlist's "[LEVEL]" tag off a line; untagged lines are Info.
func parseLevel(line []byte) (slog.Level, []byte) {
	if len(line) == 0 || line[0] != '[' {
		return slog.LevelInfo, line
	}
	end := bytes.IndexByte(line, ']')
	if end < 0 {
		return slog.LevelInfo, line
	}
	level := slog.LevelInfo
	switch string(line[1:end]) {
	case "DEBUG":
		level = slog.LevelDebug
	case "INFO":
		level = slog.LevelInfo
	case "WARN":
		level = slog.LevelWarn
	case "ERR", "ERROR":
		level = slog.LevelError
	default:
		return slog.LevelInfo, line
	}
	return level, bytes.TrimSpace(line[end+1:])
}

// splitFrom takes memberlist's trailing " from=ADDR" (its LogAddress and
// LogConn helpers) off a message.
func splitFrom(line []byte) (msg, from []byte) {
	i := bytes.LastIndex(line, []byte(" from="))
	if i < 0 || bytes.IndexByte(line[i+len(" from="):], ' ') >= 0 {
		return line, nil
	}
	return bytes.TrimSpace(line[:i]), line[i+len(" from="):]
}

// Write receives one formatted line per call (log.Logger serializes calls).
func (w logWriter) Write(p []byte) (int, error) {
	level, line := parseLevel(bytes.TrimSpace(p))
	if w.quiet != nil && w.quiet.Load() && level > slog.LevelDebug {
		level = slog.LevelDebug
	}
	line = bytes.TrimPrefix(line, []byte("memberlist: "))
	if level > slog.LevelDebug && w.departed != nil {
		if peer, ok := pushPullPeer(line); ok && w.departed(peer) {
			level = slog.LevelDebug
		}
	}
	ctx := context.Background()
	if !w.l.Enabled(ctx, level) {
		return len(p), nil
	}
	msg, from := splitFrom(line)
	l := w.l
	if level >= slog.LevelWarn {
		l = w.limited
	}
	if from != nil {
		l.Log(ctx, level, string(msg), "component", "memberlist", "from", string(from))
	} else {
		l.Log(ctx, level, string(msg), "component", "memberlist")
	}
	return len(p), nil
}
