package job

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/gorovod/gorovod/heuristics"
	"github.com/gorovod/gorovod/membership"
	"github.com/gorovod/gorovod/sync/driver"
)

// ErrInvalidConfig is wrapped by every error about a Config that cannot run.
var ErrInvalidConfig = errors.New("job: invalid configuration")

// Config describes a job and how to run it. A zero field means its default
// (DefaultConfig); only Argv is required.
type Config struct {
	// Argv is the worker command: every worker process runs it.
	Argv []string
	// Env holds NAME=value entries every worker gets besides the job's own
	// (GOROVOD_JOB_ID, GOROVOD_SECRET, GOROVOD_SEEDS, GOROVOD_LAUNCH_INDEX).
	Env []string
	// Workers is how many workers start with the job. Default 1.
	Workers int
	// MinWorkers is the fewest workers the job trains with once it has
	// started (with fewer it waits for more); the first world waits for
	// Workers (StartTimeout). Default 1.
	MinWorkers int
	// MaxWorkers is the most workers, for AddWorkers and the autoscaling
	// engine; 0 means no limit.
	MaxWorkers int
	// ReplaceLost has the runner's floor under MinWorkers (floor in
	// minimum.go, which restores the minimum whatever the cause) replace a
	// worker lost (killed, lost with its host, stopped with a host the
	// Discovery dropped) at once, on a free slot, as Horovod's elastic driver
	// refills its slots, rather than once the shortage has been seen twice,
	// minimumCheck apart. Three replacements in a row lost before they joined
	// stop the floor.
	ReplaceLost bool

	// Autoscaling configures the engine that measures the job and carries out
	// its heuristic's decisions (no heuristic: it measures and holds). Its
	// MinWorkers and MaxWorkers are the ones above.
	Autoscaling heuristics.EngineConfig

	// JobID and Secret name the job and authenticate its members. Default:
	// fresh ones.
	JobID  string
	Secret []byte
	// Gossip is the driver's membership configuration: where it binds and
	// what it advertises (the address workers join through, GOROVOD_SEEDS),
	// and the failure detector's timings. JobID and Secret above override its
	// fields. Default membership.DefaultConfig(): loopback, any port.
	Gossip membership.Config

	// ProbeTimeout is how long the job's proposer waits for a worker blamed
	// for a failure, or declared dead by gossip, to answer its liveness
	// probe before it leaves it out of the next world
	// (driver.Config.ProbeTimeout): the driver's, and, through
	// GOROVOD_PROBE_TIMEOUT, that of a worker that takes over proposing when
	// the runner dies. Longer keeps a worker starved of CPU, or behind a slow
	// link, in its world; it also holds the next world that long when a
	// worker is frozen (a dead one is out at once). Default 500 ms
	// (epoch.DefaultProposerConfig).
	ProbeTimeout time.Duration

	// Launcher starts the worker processes. Default: &LocalLauncher{}.
	Launcher Launcher
	// Discovery tells the runner the hosts workers may run on and how many
	// each takes. Default: this host, without limit.
	Discovery Discovery
	// StartDriver starts the job's driver, the proposer of its world epochs.
	// Default: driver.Start, adapted to the Driver interface.
	StartDriver func(ctx context.Context, cfg driver.Config) (Driver, error)

	// Sinks receive the job's events (worker lines among them), in order,
	// one call at a time.
	Sinks []Sink
	// Logger receives the driver's diagnostics. Default: discarded.
	Logger *slog.Logger
	// JobFile asks for a file holding what a worker started by hand needs to
	// join (readable by this user only: it holds the secret); its path is in
	// the JobStarted event and Job.JobFile. It is removed when the job ends
	// (or Start fails); the files of launchers that died without removing
	// theirs (named after their pid) are removed when a job starts.
	JobFile bool
	// OutputDir, when set, is the job's directory (created mode 0700 if
	// missing, left in place after the job): each worker on this host writes
	// its stdout and stderr to files there itself, worker-<index>.stdout and
	// worker-<index>.stderr, which the runner reads back (the Sinks get the
	// lines as without it), and the runner records its workers' starts and
	// ends and the job's end in record.tsv (outputdir.go, ReadJobRecord).
	// Workers then outlive the runner: without it they write to pipes to
	// it, and a worker whose runner died (kill -9) dies of SIGPIPE at its
	// next line. Launchers other than LocalLauncher may not use it.
	OutputDir string

	// StartTimeout bounds the job's start: the driver's start, the wait for
	// the first host list, and the wait for the first world. The first world
	// waits for all Workers (as Horovod starts a job with -np workers),
	// or for those still running when some exited before joining; if they
	// have not all joined StartTimeout after their launch, it forms with
	// those that did (at least MinWorkers) and the job says so in a Notice
	// (and a WARN log line). MinWorkers is the floor from then on. Default
	// 30 s, as Horovod's --start-timeout.
	StartTimeout time.Duration
	// ElasticTimeout bounds a wait for workers, as Horovod's
	// --elastic-timeout: each worker waits at most this long for a world
	// after a change (the workers get it as GOROVOD_ELASTIC_TIMEOUT), and a
	// job whose first world has not formed by StartTimeout, with too few
	// workers joined to form it (paused, hung, or stuck before they reach
	// the job), fails ElasticTimeout later with a *StartError naming those
	// that never joined. After the first world, a process of the job that
	// never joined and is out of the driver's view for half of it is woken
	// (SIGCONT), and any woken process still out a quarter of it later is
	// stopped (StopUnresponsive) and replaced (unresponsive.go). Default
	// 10 min.
	ElasticTimeout time.Duration
	// WakeAfter is how long a worker process that was in the driver's view
	// may run out of it (paused, or cut off) before the runner wakes it
	// (SIGCONT); at most half of ElasticTimeout. A paused worker holds the
	// job's state and, at the job's minimum, the job waits for it: woken,
	// it trains on. Waking a process that is not stopped does nothing, so
	// this can be short; stopping one stays bound to ElasticTimeout.
	// Default 10 s.
	WakeAfter time.Duration
	// FinishGrace is how long workers get to exit by themselves once a worker
	// reported the end of training; those still running then are stopped,
	// unless they are finishing the last step. Default 3 s.
	FinishGrace time.Duration
	// RescueLimit bounds the wait for members of the last world still
	// finishing its last step after training was reported finished. Default
	// 1 minute.
	RescueLimit time.Duration
	// ExitLimit bounds the wait for members of the last world that reported
	// the end of training and are still exiting (a Python trainer's
	// interpreter can take seconds to tear down torch): they are stopped only
	// this long after training was reported over. Default 30 s.
	ExitLimit time.Duration
	// RemoveGrace is how long a worker the engine removed from the job has
	// to exit by itself, then after SIGTERM, then after SIGKILL. Default 10 s.
	RemoveGrace time.Duration
	// KeepExitedWorkers is how many records of exited workers the job
	// keeps (Job.Workers, Outcome.Workers), the newest; the older ones are
	// only counted, by how they ended (Outcome.EarlierWorkers), so that a
	// job whose world changes for weeks keeps its memory. Every running
	// worker's record is kept. Default 1024.
	KeepExitedWorkers int

	// Timeline, if set, is the file the job's Chrome trace goes to: every
	// worker writes its part beside it (GOROVOD_TIMELINE), the runner adds
	// its own (worlds, workers, decisions, stalls), and the parts are merged
	// into it when the job ends (Outcome.Timeline).
	Timeline string
	// StallCheck is how long a collective may wait for ranks that have not
	// entered it before the workers warn and the runner names the missing
	// ranks (a Stalled event and a WARN log line). Default 60 s, as Horovod;
	// negative turns the inspector off. Workers get it through their
	// environment (GOROVOD_STALL_CHECK_TIME).
	StallCheck time.Duration
	// Adopt, when set, takes back a running job whose runner died
	// (ReadAdoption of its directory; adopt.go) instead of starting one:
	// JobID, Secret and OutputDir are the job's, the driver binds the dead
	// driver's gossip address and learns the workers' world before it
	// proposes, the workers of the record still running on this host are
	// followed by pid, and the floor (MinWorkers), AddWorkers and the engine
	// work as in the job that started them (Argv, Env and the hosts should be
	// the job's). Workers is not started: it is only the share of a host.
	Adopt *Adoption
}

// DefaultConfig returns the defaults; Argv must still be set.
func DefaultConfig() Config {
	return Config{
		Workers:        1,
		MinWorkers:     1,
		Autoscaling:    heuristics.DefaultEngineConfig(),
		Gossip:         membership.DefaultConfig(),
		StartTimeout:   30 * time.Second,
		ElasticTimeout: 10 * time.Minute,
		WakeAfter:      10 * time.Second,
		FinishGrace:    3 * time.Second,
		RescueLimit:    time.Minute,
		ExitLimit:      30 * time.Second,
		RemoveGrace:    10 * time.Second,

		KeepExitedWorkers: 1024,
	}
}

// withDefaults fills the zero fields and checks the rest.
func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig()
	if len(c.Argv) == 0 || c.Argv[0] == "" {
		return c, fmt.Errorf("%w: no worker command (Argv)", ErrInvalidConfig)
	}
	if c.Workers == 0 {
		c.Workers = d.Workers
	}
	if c.MinWorkers == 0 {
		c.MinWorkers = d.MinWorkers
	}
	switch {
	case c.Workers < 1:
		return c, fmt.Errorf("%w: %d workers: at least 1", ErrInvalidConfig, c.Workers)
	case c.MinWorkers < 1 || c.MinWorkers > c.Workers:
		return c, fmt.Errorf("%w: MinWorkers %d must be between 1 and Workers %d", ErrInvalidConfig, c.MinWorkers, c.Workers)
	case c.MaxWorkers < 0 || (c.MaxWorkers != 0 && c.MaxWorkers < c.Workers):
		return c, fmt.Errorf("%w: MaxWorkers %d is below Workers %d", ErrInvalidConfig, c.MaxWorkers, c.Workers)
	case c.ProbeTimeout < 0:
		return c, fmt.Errorf("%w: ProbeTimeout %v is negative", ErrInvalidConfig, c.ProbeTimeout)
	case c.KeepExitedWorkers < 0:
		return c, fmt.Errorf("%w: KeepExitedWorkers %d is negative", ErrInvalidConfig, c.KeepExitedWorkers)
	}
	if c.KeepExitedWorkers == 0 {
		c.KeepExitedWorkers = d.KeepExitedWorkers
	}
	c.Autoscaling.MinWorkers, c.Autoscaling.MaxWorkers = c.MinWorkers, c.MaxWorkers
	if c.JobID == "" {
		c.JobID = NewJobID()
	}
	if len(c.Secret) == 0 {
		c.Secret = NewSecret()
	}
	if c.Launcher == nil {
		c.Launcher = &LocalLauncher{}
	}
	if c.Discovery == nil {
		c.Discovery = StaticHosts(Host{})
	}
	if c.StartDriver == nil {
		c.StartDriver = startDriver
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	for _, f := range []struct {
		v   *time.Duration
		def time.Duration
	}{
		{&c.StartTimeout, d.StartTimeout}, {&c.ElasticTimeout, d.ElasticTimeout}, {&c.WakeAfter, d.WakeAfter}, {&c.FinishGrace, d.FinishGrace},
		{&c.RescueLimit, d.RescueLimit}, {&c.RemoveGrace, d.RemoveGrace},
		{&c.ExitLimit, d.ExitLimit},
	} {
		if *f.v <= 0 {
			*f.v = f.def
		}
	}
	return c, nil
}
