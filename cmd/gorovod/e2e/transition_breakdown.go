package e2e

import (
	"cmp"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// WaitEntered waits, at most within, until the log holds size "entered
// world" lines of the first world the driver proposed with size members
// after start. It reads each part of the log once.
func (h *RunJobHarness) WaitEntered(start time.Time, size int, within time.Duration) {
	deadline := time.After(within)
	var ep string
	off, entered := 0, 0
	for {
		text := h.LogText()
		end := strings.LastIndexByte(text, '\n') + 1
		if end > off {
			for _, l := range ParseLogLines(text[off:end], start) {
				switch {
				case ep == "" && l.Worker < 0 && l.Msg == "proposed" && l.Attrs["size"] == strconv.Itoa(size):
					ep = l.Attrs["epoch"]
				case l.Msg == "entered world" && l.Attrs["epoch"] != "" && l.Attrs["epoch"] == ep:
					entered++
				}
			}
			off = end
		}
		if ep != "" && entered >= size {
			return
		}
		select {
		case <-h.Notify:
		case <-deadline:
			return
		}
	}
}

// LogLine is one slog text line of the launcher's log: "[i] " for a
// worker's, none for the driver's.
type LogLine struct {
	Worker int // -1: the driver
	At     time.Time
	Msg    string
	Attrs  map[string]string
}

var (
	slogTimeRe = regexp.MustCompile(`time=(\S+)`)
	slogMsgRe  = regexp.MustCompile(`msg="((?:[^"\\]|\\.)*)"|msg=(\S+)`)
	slogAttrRe = regexp.MustCompile(`(\w[\w.]*)=("(?:[^"\\]|\\.)*"|\S+)`)
	workerRe   = regexp.MustCompile(`^\[(\d+)\] `)
)

// ParseLogLines reads the workers' log lines from a job's output, those
// logged after after.
func ParseLogLines(text string, after time.Time) []LogLine {
	var out []LogLine
	for _, raw := range strings.Split(text, "\n") {
		w := -1
		if m := workerRe.FindStringSubmatch(raw); m != nil {
			w, _ = strconv.Atoi(m[1])
			raw = raw[len(m[0]):]
		}
		tm := slogTimeRe.FindStringSubmatch(raw)
		if tm == nil {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, tm[1])
		if err != nil || at.Before(after.Add(-time.Millisecond)) {
			continue
		}
		l := LogLine{Worker: w, At: at, Attrs: map[string]string{}}
		if m := slogMsgRe.FindStringSubmatch(raw); m != nil {
			l.Msg = cmp.Or(m[1], m[2])
		}
		for _, m := range slogAttrRe.FindAllStringSubmatch(raw, -1) {
			l.Attrs[m[1]] = strings.Trim(m[2], `"`)
		}
		out = append(out, l)
	}
	return out
}
