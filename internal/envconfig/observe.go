package envconfig

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The variables that switch on what a worker shows of itself. `gorovod run`
// sets them from its flags; a binding or a launcher of its own sets them
// the same way.
const (
	// EnvTimeline is the job's timeline file (`gorovod run
	// --timeline-filename`, Horovod's HOROVOD_TIMELINE): each worker writes
	// its part beside it (TimelinePart), which the driver merges into it.
	EnvTimeline = "GOROVOD_TIMELINE"
	// EnvStallCheckTime is how long a collective may wait for ranks that
	// have not entered it before the stall inspector warns (Horovod's
	// HOROVOD_STALL_CHECK_TIME_SECONDS): a Go duration ("60s") or seconds
	// ("60"); "0" or "off" turns the inspector off.
	EnvStallCheckTime = "GOROVOD_STALL_CHECK_TIME"
	// EnvLogLevel and EnvLogFormat are the library's logging in a worker
	// whose trainer sets no logger of its own: debug, info, warn or error;
	// text or json (as `gorovod run --log-level/--log-format`).
	EnvLogLevel  = "GOROVOD_LOG_LEVEL"
	EnvLogFormat = "GOROVOD_LOG_FORMAT"
)

// Observability is what a worker's environment says about its timeline,
// stall inspector and logging.
type Observability struct {
	Timeline string // EnvTimeline: the job's timeline file ("" none)
	// StallCheck is EnvStallCheckTime: 0 when unset (the default applies),
	// negative when the inspector is off.
	StallCheck time.Duration
	LogLevel   string // EnvLogLevel ("" unset)
	LogFormat  string // EnvLogFormat ("" unset)
}

// LoadObservability reads an Observability through getenv.
func LoadObservability(getenv func(string) string) (Observability, error) {
	o := Observability{Timeline: getenv(EnvTimeline), LogLevel: getenv(EnvLogLevel), LogFormat: getenv(EnvLogFormat)}
	d, err := ParseStallCheck(getenv(EnvStallCheckTime))
	if err != nil {
		return o, fmt.Errorf("%s: %w", EnvStallCheckTime, err)
	}
	o.StallCheck = d
	return o, nil
}

// ParseStallCheck reads a stall check time as EnvStallCheckTime gives it:
// "" is 0 (the default), "0" or "off" is -1 (off), otherwise a positive Go
// duration or number of seconds.
func ParseStallCheck(v string) (time.Duration, error) {
	switch strings.TrimSpace(v) {
	case "":
		return 0, nil
	case "0", "off":
		return -1, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		secs, ferr := strconv.ParseFloat(v, 64)
		if ferr != nil {
			return 0, fmt.Errorf("%q is neither a duration (60s) nor a number of seconds", v)
		}
		d = time.Duration(secs * float64(time.Second))
	}
	if d <= 0 {
		return 0, fmt.Errorf("%q: a stall check time must be positive (0 or off turns the check off)", v)
	}
	return d, nil
}

// Environ renders o as NAME=value entries for a child process (unset fields
// are left out; an inspector that is off is "off").
func (o Observability) Environ() []string {
	var env []string
	if o.Timeline != "" {
		env = append(env, EnvTimeline+"="+o.Timeline)
	}
	switch {
	case o.StallCheck < 0:
		env = append(env, EnvStallCheckTime+"=off")
	case o.StallCheck > 0:
		env = append(env, EnvStallCheckTime+"="+o.StallCheck.String())
	}
	if o.LogLevel != "" {
		env = append(env, EnvLogLevel+"="+o.LogLevel)
	}
	if o.LogFormat != "" {
		env = append(env, EnvLogFormat+"="+o.LogFormat)
	}
	return env
}

// TimelinePart is the file one process of job jobID writes its timeline to,
// beside the job's timeline file base: base.JOBID.PART.json, PART being
// "driver", "worker<launch index>" or, for a worker started by hand,
// "<host>-<pid>".
func TimelinePart(base, jobID, part string) string {
	return base + "." + jobID + "." + part + ".json"
}

// TimelineParts is the glob pattern of every TimelinePart of job jobID
// (for merging them into base).
func TimelineParts(base, jobID string) string {
	return globEscape(base) + "." + globEscape(jobID) + ".*.json"
}

// globEscape quotes the characters filepath.Match treats specially.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
