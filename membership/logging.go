package membership

import (
	"bytes"
	"context"
	"log"
	"log/slog"
)

// newMemberlistLogger adapts slog to the *log.Logger memberlist writes to.
// memberlist formats each line as "[LEVEL] memberlist: message"; the level
// becomes the slog level, so its chatty DEBUG lines cost one Enabled check
// when the handler does not want them.
func newMemberlistLogger(l *slog.Logger) *log.Logger {
	return log.New(logWriter{l}, "", 0)
}

type logWriter struct{ l *slog.Logger }

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

// Write receives one formatted line per call (log.Logger serializes calls).
func (w logWriter) Write(p []byte) (int, error) {
	level, line := parseLevel(bytes.TrimSpace(p))
	ctx := context.Background()
	if !w.l.Enabled(ctx, level) {
		return len(p), nil
	}
	line = bytes.TrimPrefix(line, []byte("memberlist: "))
	w.l.Log(ctx, level, string(line), "component", "memberlist")
	return len(p), nil
}
