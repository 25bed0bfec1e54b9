package logging

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// Formats a handler can write.
const (
	FormatText = "text"
	FormatJSON = "json"
)

// Options are a command's logging flags.
type Options struct {
	// Level is debug, info, warn or error (any case); empty means warn.
	Level string
	// Format is text or json; empty means text.
	Format string
}

// DefaultOptions is what a command logs with when no flag says otherwise:
// warnings and errors, as text.
func DefaultOptions() Options { return Options{Level: "warn", Format: FormatText} }

// Register adds --log-level and --log-format to fs, with o's values as the
// defaults, parsed into o.
func (o *Options) Register(fs *flag.FlagSet) {
	d := DefaultOptions()
	if o.Level == "" {
		o.Level = d.Level
	}
	if o.Format == "" {
		o.Format = d.Format
	}
	fs.StringVar(&o.Level, "log-level", o.Level, "least severe log records shown: debug, info, warn or error")
	fs.StringVar(&o.Format, "log-format", o.Format, "log records as text or json (one JSON object per line)")
}

// Validate reports a level or format no handler is built for; a command
// checks it with its other flags, before starting anything.
func (o Options) Validate() error {
	if _, err := ParseLevel(o.Level); err != nil {
		return err
	}
	_, err := parseFormat(o.Format)
	return err
}

// Handler builds the handler o describes, writing to w.
func (o Options) Handler(w io.Writer) (slog.Handler, error) {
	level, err := ParseLevel(o.Level)
	if err != nil {
		return nil, err
	}
	format, err := parseFormat(o.Format)
	if err != nil {
		return nil, err
	}
	return NewHandler(w, level, format), nil
}

// Logger is slog.New(o.Handler(w)).
func (o Options) Logger(w io.Writer) (*slog.Logger, error) {
	h, err := o.Handler(w)
	if err != nil {
		return nil, err
	}
	return slog.New(h), nil
}

// NewHandler returns a text or JSON handler (format FormatText or
// FormatJSON; anything else is text) writing records at level or above to w.
func NewHandler(w io.Writer, level slog.Leveler, format string) slog.Handler {
	opts := &slog.HandlerOptions{Level: level}
	if format == FormatJSON {
		return slog.NewJSONHandler(w, opts)
	}
	return slog.NewTextHandler(w, opts)
}

// ParseLevel reads debug, info, warn (or warning) or error, in any case;
// empty is warn.
func ParseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn", "warning", "":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("log level %q: want debug, info, warn or error", s)
}

func parseFormat(s string) (string, error) {
	switch f := strings.ToLower(strings.TrimSpace(s)); f {
	case FormatText, "":
		return FormatText, nil
	case FormatJSON:
		return f, nil
	}
	return "", fmt.Errorf("log format %q: want text or json", s)
}
