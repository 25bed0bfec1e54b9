package job

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/job/launch"
)

// The signals a worker understands (examples/synthetic and the trainers built
// on package sync follow them).
const (
	// StopSignal stops a worker at once: the job is over, or cancelled.
	StopSignal = syscall.SIGINT
	// LeaveSignal asks a worker to leave the job gracefully: it trains on
	// until the others have moved to a world without it, then exits.
	LeaveSignal = syscall.SIGTERM
)

// Launcher starts worker processes: on this host (LocalLauncher), or, in a
// launcher of its own, over ssh, as Slurm job steps or as Kubernetes pods.
// Launch may be called from several goroutines at once.
type Launcher interface {
	// Launch starts one worker process as r describes. When ctx ends, the
	// launcher stops the process (StopSignal, then SIGKILL after a grace
	// period) and releases what it holds for it.
	Launch(ctx context.Context, r LaunchRequest) (Process, error)
}

// LaunchRequest is one worker process to start.
type LaunchRequest struct {
	// Index is the job's number for the process: 0, 1, ... in start order,
	// never reused. The worker publishes it (GOROVOD_LAUNCH_INDEX in Env), so
	// the runner can tell its processes apart on every host.
	Index int
	// Host is where to start it: a Host.Name from the Discovery ("" is this
	// host).
	Host string
	// Argv is the command; Env holds the NAME=value entries the worker needs
	// (the job's, the launch index, Config.Env), added to the environment the
	// launcher gives its processes. A launcher on another host adds what only
	// it knows: the addresses the worker binds its gossip and collectives to
	// (GOROVOD_GOSSIP_ADDR, GOROVOD_LISTEN_ADDR) there.
	Argv []string
	Env  []string
	// Share is how many of the job's workers share the host at the start: a
	// launcher sizes each process's share of the host (GOMAXPROCS, devices)
	// from it.
	Share int
	// Output receives every line the process prints, stream "stdout" or
	// "stderr"; the line is valid only during the call. Calls for one process
	// come one at a time.
	Output func(stream string, line []byte)
	// OutputDir, when set, is the job's directory (Config.OutputDir): a
	// launcher that can has the process write its output to files there
	// (OutputFiles names them), so that it outlives the launcher.
	OutputDir string
	// Notice reports something a person should know (a worker that gets no
	// GPU of its own), as a sentence.
	Notice func(msg string)
}

// Process is a running worker process, as its launcher sees it.
type Process interface {
	// PID is its process id on its host (0 when the launcher cannot know).
	PID() int
	// Signal sends it a signal (StopSignal, LeaveSignal, SIGKILL, and
	// SIGCONT to wake it: launch.SignalAwake); a launcher that cannot deliver
	// signals maps them onto what it can do, and ignores SIGCONT if its
	// processes cannot be paused.
	Signal(sig os.Signal) error
	// Done is closed once it has exited and its output is drained.
	Done() <-chan struct{}
	// Err is, after Done, nil if it exited with status 0, otherwise why not:
	// an error that KilledBySignal recognizes when a signal ended it (an
	// *exec.ExitError, or an *ExitError from launchers that are not os/exec).
	Err() error
}

// ExitError is how a launcher that does not run its processes through os/exec
// reports the end of one that did not exit with status 0.
type ExitError struct {
	Code   int            // exit status; -1 when a signal ended it
	Signal syscall.Signal // the signal that ended it, when Code is -1
}

func (e *ExitError) Error() string {
	if e.Code == -1 {
		return "signal: " + e.Signal.String()
	}
	return fmt.Sprintf("exit status %d", e.Code)
}

// KilledBySignal reports whether err, a Process's Err, says that a signal
// ended the process: it was killed (kill -9, the OOM killer) or stopped,
// which an elastic job survives, rather than failing by itself.
func KilledBySignal(err error) bool {
	var xe *exec.ExitError
	if errors.As(err, &xe) {
		return xe.ExitCode() == -1
	}
	var ee *ExitError
	return errors.As(err, &ee) && ee.Code == -1
}

// LocalLauncher starts workers as processes of this host. They inherit this
// process's CUDA_VISIBLE_DEVICES (every worker sees the same GPUs, as under
// horovodrun, so that torch.cuda.set_device(hvd.local_rank()) picks one per
// worker) unless AssignGPUs gives each its own.
type LocalLauncher struct {
	// CPUs is how many CPUs the workers share; each gets GOMAXPROCS =
	// max(1, CPUs/Share) unless this process's environment sets GOMAXPROCS.
	// Default runtime.NumCPU().
	CPUs int
	// StopGrace is how long a stopped worker has before SIGKILL. Default 5 s.
	StopGrace time.Duration
	// Placement pins each worker to its share of the CPUs (launch.PlaceBalanced)
	// or leaves them to the kernel (the default).
	Placement launch.Placement
	// AssignGPUs gives each worker one GPU of its own for as long as it
	// runs, as CUDA_VISIBLE_DEVICES (a UUID, which the worker sees as device
	// 0), in ring order (gpu.AssignDevices: NVLink and PCIe topology), when
	// the first launch finds at least as many GPUs on this host as workers
	// share it at the start; with fewer, or none, it says so (LaunchRequest's
	// Notice) and the workers see every GPU. Scripts must then choose device
	// 0, or local_rank() % device_count(), not local_rank().
	AssignGPUs bool

	// discoverGPUs is gpu.System unless a test gives another inventory.
	discoverGPUs gpuInventory

	once    sync.Once
	devices *devicePool // nil without GPUs to hand out
}

// Launch starts the process on this host; r.Host must name no other.
func (l *LocalLauncher) Launch(ctx context.Context, r LaunchRequest) (Process, error) {
	if r.Host != "" && r.Host != "localhost" {
		return nil, fmt.Errorf("job: the local launcher cannot start a worker on host %q", r.Host)
	}
	notice := r.Notice
	if notice == nil {
		notice = func(string) {}
	}
	if l.AssignGPUs {
		l.once.Do(func() { l.devices = assignGPUs(ctx, l.discoverGPUs, max(1, r.Share), notice) })
	}
	cpus := l.CPUs
	if cpus <= 0 {
		cpus = runtime.NumCPU()
	}
	env := slices.Concat(launch.ShareCPUs(cpus, r.Share), r.Env)
	dev, ok := l.devices.take(r.Index)
	if ok {
		env = append(env, envconfig.EnvVisibleDevices+"="+dev)
	} else if l.devices != nil {
		notice(fmt.Sprintf("no free GPU for worker %d: it sees every GPU of the host", r.Index))
	}
	pin, err := launch.PlaceCPUs(l.Placement, r.Index, r.Share, cpus)
	if err != nil {
		return nil, err
	}
	spec := launch.ProcessSpec{
		Argv: r.Argv, Env: env, Output: r.Output, StopSignal: StopSignal, StopGrace: l.StopGrace, CPUs: pin,
	}
	if r.OutputDir != "" {
		spec.OutputFiles = OutputFiles(r.OutputDir, r.Index)
	}
	p, err := launch.StartProcess(ctx, spec)
	if err != nil {
		l.devices.release(r.Index)
		return nil, err
	}
	if ok {
		go func() {
			<-p.Done()
			l.devices.release(r.Index)
		}()
	}
	return p, nil
}

// NewSecret returns a fresh random job secret.
func NewSecret() []byte {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux
	return b
}

// NewJobID returns a fresh job id.
func NewJobID() string { return fmt.Sprintf("job-%x", NewSecret()[:6]) }
