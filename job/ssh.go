package job

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/gorovod/gorovod/job/launch"
)

// SSHLauncher starts workers on other hosts over ssh (the OpenSSH client, as
// horovodrun and mpirun do) and those on this host as Local does. The remote
// host needs nothing of gorovod's but the worker command: ssh runs a small sh
// program there that reads the worker's environment — the job secret
// included — from the connection's stdin (never from a command line), starts
// the worker in a process group of its own, forwards signals and stops the
// group when the connection closes, so no worker outlives its launcher (see
// docs/multihost.md).
//
// A remote worker's start is asynchronous: Launch returns once ssh runs, and
// a host that cannot be reached, refuses the login or does not start the
// worker within SSH.StartTimeout shows as the process's end with a
// *launch.HostError, as does a connection that breaks while the worker runs;
// the runner then counts the worker as lost and blacklists the host
// (Blacklister).
type SSHLauncher struct {
	// SSH is how other hosts are reached: the client, -p, -i, -l, the host
	// key policy, more -o options, the connect and start timeouts.
	SSH launch.SSH
	// StopGrace is how long a stopped remote worker has before SIGKILL.
	// Default 5 s.
	StopGrace time.Duration
	// Local starts the workers of this host ("", "localhost", a loopback
	// address).
	Local LocalLauncher
}

// Blacklister is a Discovery that takes a failing host out of its list, for
// a cooldown or for good, and reports the shorter list; HostWatch is one.
// The runner calls Blacklist for every worker it loses with its host (a
// *launch.HostError).
type Blacklister interface {
	Blacklist(host string)
}

// Launch starts the process on r.Host: here as a child process when the
// host is this one, otherwise over ssh.
func (l *SSHLauncher) Launch(ctx context.Context, r LaunchRequest) (Process, error) {
	if launch.IsLocal(r.Host) {
		r.Host = ""
		return l.Local.Launch(ctx, r)
	}
	out := r.Output
	if out == nil {
		out = func(string, []byte) {}
	}
	spec := launch.RemoteSpec{
		Host: r.Host, Argv: r.Argv, Env: r.Env, Slots: r.Share, Output: out,
		StopSignal: StopSignal, StopGrace: l.StopGrace, SSH: l.SSH,
	}
	if r.OutputDir != "" {
		// The same path on the worker's host: the worker writes its output
		// there, and outlives its launcher as the local ones do.
		spec.OutputFiles = OutputFiles(r.OutputDir, r.Index)
	}
	p, err := launch.StartRemote(ctx, spec)
	if err != nil {
		return nil, err
	}
	return remoteProcess{p}, nil
}

// remoteProcess is a worker on another host, its end in the job's terms.
type remoteProcess struct{ *launch.RemoteProcess }

func (p remoteProcess) Signal(sig os.Signal) error { return p.RemoteProcess.Signal(sig) }

// Err maps the remote end: a signal (exit status 128+n as the remote shell
// reports it) to an *ExitError that KilledBySignal recognizes, another
// status to an *ExitError; the end of an adopted worker, whose status is not
// known, stays a *launch.RemoteExit wrapping ErrExitUnknown. A lost host stays the *launch.HostError the
// launcher reports: a worker lost with its host (ssh could not connect or
// log in, the host did not start the worker in time, or the connection
// broke while it ran), which an elastic job survives (the worker counts as
// Lost) and on which it blacklists the host.
func (p remoteProcess) Err() error {
	err := p.RemoteProcess.Err()
	var re *launch.RemoteExit
	if errors.As(err, &re) {
		if re.Unknown { // an adopted worker: ErrExitUnknown
			return err
		}
		if sig, ok := re.Signal(); ok {
			return fmt.Errorf("on %s: %w", re.Host, &ExitError{Code: -1, Signal: sig})
		}
		return fmt.Errorf("on %s: %w", re.Host, &ExitError{Code: re.Code})
	}
	return err
}

// blacklist tells a Blacklister Discovery that a worker was lost with host,
// and reports whether the Discovery is one (the host is then out of the
// job, now or since an earlier worker's loss).
func (j *Job) blacklist(host string) bool {
	b, ok := j.cfg.Discovery.(Blacklister)
	if ok {
		b.Blacklist(host)
	}
	return ok
}

// Adopt takes back a worker this launcher started on another host, with
// output files there, before the runner died (WorkerAdopter): it follows it
// over ssh (launch.FollowRemote) once the host confirms that the pid is
// that worker of the job.
func (l *SSHLauncher) Adopt(ctx context.Context, r AdoptRequest) (Process, error) {
	out := r.Output
	if out == nil {
		out = func(string, []byte) {}
	}
	p, err := launch.FollowRemote(ctx, launch.FollowSpec{
		Host: r.Host, PID: r.PID, JobID: r.JobID, Index: r.Index, OutputFiles: OutputFiles(r.OutputDir, r.Index),
		Output: out, StopSignal: StopSignal, StopGrace: l.StopGrace, SSH: l.SSH,
	})
	if err != nil {
		return nil, err
	}
	select {
	case <-p.Started():
		return remoteProcess{p}, nil
	case <-p.Done():
		return nil, p.Err()
	case <-ctx.Done():
		<-p.Done()
		return nil, ctx.Err()
	}
}
