package linkutil

import (
	"fmt"
	"time"
)

// The helpers a transport's Config.withDefaults uses, so that every
// transport reads a zero (or meaningless) setting the same way.

// OrDefault returns v, or def when v is the zero value: for settings whose
// zero means "the default".
func OrDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Positive returns v, or def when v is zero or negative: for timeouts and
// sizes where only a positive value means anything.
func Positive[T ~int | ~int64](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// SpinTime reads a SpinTime setting: zero is the default, a negative value
// turns polling off (0).
func SpinTime(v, def time.Duration) time.Duration {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

// CopySecret returns a copy of s, so that a caller reusing its slice cannot
// change the secret under a transport.
func CopySecret(s []byte) []byte { return append([]byte(nil), s...) }

// RequireSecret is CopySecret for a transport that cannot work without a
// secret: an empty one is an error wrapping invalid (the transport's
// ErrInvalidConfig).
func RequireSecret(s []byte, invalid error) ([]byte, error) {
	if len(s) == 0 {
		return nil, fmt.Errorf("%w: Secret is required", invalid)
	}
	return CopySecret(s), nil
}
