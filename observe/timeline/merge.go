package timeline

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// Merge writes one trace holding the events of every input to w, in the
// JSON array format, and returns how many events it wrote. Inputs are
// traces in either of the format's forms (a JSON array of events, or an
// object with a "traceEvents" array): this package's files, complete or cut
// off by a process that was killed — a cut-off input contributes the events
// before the cut. An input that is not a trace at all is an error naming its
// position; nothing is written for it.
func Merge(w io.Writer, inputs ...io.Reader) (int, error) {
	bw := bufio.NewWriter(w)
	if _, err := bw.WriteString("[\n"); err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for i, in := range inputs {
		evs, err := ReadEvents(in)
		if err != nil && len(evs) == 0 {
			errs = append(errs, fmt.Errorf("timeline: input %d: %w", i+1, err))
			continue
		}
		for _, ev := range evs {
			if n > 0 {
				bw.WriteString(",\n")
			}
			bw.Write(ev)
			n++
		}
	}
	bw.WriteString("\n]\n")
	if err := bw.Flush(); err != nil {
		return n, err
	}
	return n, errors.Join(errs...)
}

// MergeFiles merges the trace files srcs into the file dst (see Merge).
func MergeFiles(dst string, srcs ...string) (int, error) {
	var inputs []io.Reader
	for _, s := range srcs {
		f, err := os.Open(s)
		if err != nil {
			return 0, fmt.Errorf("timeline: %w", err)
		}
		defer f.Close()
		inputs = append(inputs, bufio.NewReader(f))
	}
	out, err := os.Create(dst)
	if err != nil {
		return 0, fmt.Errorf("timeline: %w", err)
	}
	n, err := Merge(out, inputs...)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return n, err
}

// ErrTruncated is returned, with the events before the cut, by ReadEvents for
// a trace that ends early (its process was killed while writing it).
var ErrTruncated = errors.New("trace is cut off")

// ReadEvents returns the events of a trace (a JSON array of objects, or an
// object whose "traceEvents" member is one), each as its raw JSON object.
// A trace that ends early gives the complete events before the end and an
// error wrapping ErrTruncated; anything else that is not a trace gives an
// error.
func ReadEvents(r io.Reader) ([]json.RawMessage, error) {
	dec := json.NewDecoder(r)
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("not a trace: %w", eofAsTruncated(err))
	}
	switch tok {
	case json.Delim('['):
	case json.Delim('{'):
		if err := seekTraceEvents(dec); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("not a trace: starts with %v", tok)
	}
	var evs []json.RawMessage
	for dec.More() {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return evs, fmt.Errorf("after %d events: %w", len(evs), eofAsTruncated(err))
		}
		raw = bytes.TrimSpace(raw)
		if len(raw) == 0 || raw[0] != '{' {
			return evs, fmt.Errorf("event %d is not a JSON object", len(evs)+1)
		}
		evs = append(evs, raw)
	}
	if _, err := dec.Token(); err != nil {
		// A missing closing bracket: the format allows it.
		if errors.Is(err, io.EOF) {
			return evs, nil
		}
		return evs, fmt.Errorf("after %d events: %w", len(evs), eofAsTruncated(err))
	}
	return evs, nil
}

// seekTraceEvents advances an object-form trace to its traceEvents array.
func seekTraceEvents(dec *json.Decoder) error {
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return fmt.Errorf("not a trace: %w", eofAsTruncated(err))
		}
		if key == "traceEvents" {
			tok, err := dec.Token()
			if err != nil {
				return fmt.Errorf("not a trace: %w", eofAsTruncated(err))
			}
			if tok != json.Delim('[') {
				return errors.New("not a trace: traceEvents is not an array")
			}
			return nil
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return fmt.Errorf("not a trace: %w", eofAsTruncated(err))
		}
	}
	return errors.New("not a trace: an object without traceEvents")
}

func eofAsTruncated(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return ErrTruncated
	}
	return err
}
