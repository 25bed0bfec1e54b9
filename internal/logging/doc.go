// Package logging builds the slog loggers of gorovod's commands from their
// --log-level (debug, info, warn, error) and --log-format (text, json) flags,
// and owns the handler wrappers the library's own logging needs: RateLimiter,
// which lets the first of a run of identical records through and sums up the
// rest in one record per window, so that a stranger sending garbage to a
// gossip port cannot fill the log.
//
// Library packages take a *slog.Logger in their Config (nil discards); only
// commands build loggers, here.
package logging
