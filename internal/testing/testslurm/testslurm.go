package testslurm

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/internal/testing/testdaemon"
)

// Programs are the commands the harness and its tests run.
var Programs = []string{"munged", "slurmctld", "slurmd", "slurmstepd", "srun", "salloc", "sbatch", "scancel", "squeue", "sinfo"}

// Config shapes the cluster.
type Config struct {
	// CPUs is the node's CPU count as Slurm sees it (more than the machine
	// has is fine: slurm.conf overrides the hardware). Default 8.
	CPUs int
	// KillWait is the time between SIGTERM and SIGKILL when Slurm ends a job
	// (scancel, time limit, preemption); whole seconds. Default 3 s (Slurm's
	// own default is 30 s).
	KillWait time.Duration
	// StartTimeout bounds the wait for the node to be idle. Default 60 s.
	StartTimeout time.Duration
	// Preemption adds two partitions without oversubscription on the node,
	// "spot" and "urgent": a job in urgent that needs CPUs held by jobs in
	// spot preempts them (PreemptMode=CANCEL: SIGTERM, then after
	// PreemptGrace SIGTERM again and SIGKILL KillWait later).
	Preemption   bool
	PreemptGrace time.Duration // whole seconds
}

// DefaultConfig returns 8 CPUs, KillWait 3 s, 60 s to start.
func DefaultConfig() Config {
	return Config{CPUs: 8, KillWait: 3 * time.Second, StartTimeout: time.Minute}
}

// Cluster is a running Slurm cluster.
type Cluster struct {
	Dir      string // everything the cluster writes, removed by Stop
	Conf     string // slurm.conf
	NodeName string
	Name     string // ClusterName
	cfg      Config
	daemons  []*testdaemon.Proc // started in order, stopped in reverse
}

// Missing returns the programs the harness needs that are not installed, and
// a reason the harness cannot run here ("" when it can).
func Missing() string {
	var missing []string
	for _, p := range Programs {
		if _, err := exec.LookPath(p); err != nil {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return fmt.Sprintf("Slurm programs not installed (%s; apt-get install slurm-wlm munge)", strings.Join(missing, ", "))
	}
	if os.Geteuid() != 0 {
		return "the Slurm harness runs slurmd as root"
	}
	return ""
}

// New starts a cluster for t and stops it when t ends; it skips t when Slurm
// is not installed here, and logs the daemons' logs if t failed.
func New(t testing.TB, cfg Config) *Cluster {
	t.Helper()
	if why := Missing(); why != "" {
		t.Skip(why)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(c.Logs(4000))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			t.Errorf("stopping the Slurm cluster: %v", err)
		}
	})
	return c
}

// Start writes a configuration and starts munged, slurmctld and slurmd, then
// waits for the node to be idle. A daemon that loses its port to another
// process (the ports are picked free but not reserved) makes Start try again
// with new ports, up to three times.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	def := DefaultConfig()
	if cfg.CPUs <= 0 {
		cfg.CPUs = def.CPUs
	}
	if cfg.KillWait <= 0 {
		cfg.KillWait = def.KillWait
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = def.StartTimeout
	}
	return testdaemon.RetryPortTaken(ctx, 3, func() (*Cluster, error) { return start(ctx, cfg) })
}

func start(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	if why := Missing(); why != "" {
		return nil, errors.New(why)
	}
	host, err := os.Hostname()
	if err != nil {
		return nil, err
	}
	host, _, _ = strings.Cut(host, ".")
	id := make([]byte, 4)
	_, _ = rand.Read(id)
	suffix := hex.EncodeToString(id)
	dir, err := os.MkdirTemp("", "cluster-slurm-"+suffix+"-")
	if err != nil {
		return nil, err
	}
	// munged insists that everyone may traverse the path to its socket.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, Conf: filepath.Join(dir, "slurm.conf"), NodeName: "gorovod" + suffix, Name: "c" + suffix, cfg: cfg}
	defer func() {
		if err != nil {
			stopCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if stopErr := c.Stop(stopCtx); stopErr != nil {
				err = fmt.Errorf("%w (and stopping: %v)", err, stopErr)
			}
		}
	}()
	for _, sub := range []string{"munge", "state", "spool", "log"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
			return c, err
		}
	}
	key := make([]byte, 128)
	_, _ = rand.Read(key)
	keyFile := filepath.Join(dir, "munge", "munge.key")
	if err := os.WriteFile(keyFile, key, 0o600); err != nil {
		return c, err
	}
	socket := filepath.Join(dir, "munge", "munge.socket")
	munged, err := testdaemon.Start("munged", []string{"munged", "--foreground", "--socket=" + socket, "--key-file=" + keyFile,
		"--pid-file=" + filepath.Join(dir, "munge", "munged.pid"), "--seed-file=" + filepath.Join(dir, "munge", "munged.seed"),
		"--log-file=" + filepath.Join(dir, "log", "munged.log")}, nil, filepath.Join(dir, "log", "munged.out"))
	if err != nil {
		return c, err
	}
	c.daemons = append(c.daemons, munged)
	wait, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()
	if err := testdaemon.WaitFor(wait, 20*time.Millisecond, func() error {
		_, err := os.Stat(socket)
		return err
	}, munged); err != nil {
		return c, fmt.Errorf("munged: %w", err)
	}

	ports, err := testdaemon.FreePorts(2)
	if err != nil {
		return c, err
	}
	conf := c.config(host, socket, ports[0], ports[1])
	if err := os.WriteFile(c.Conf, []byte(conf), 0o644); err != nil {
		return c, err
	}
	ctld, err := testdaemon.Start("slurmctld", []string{"slurmctld", "-D", "-f", c.Conf}, nil, filepath.Join(dir, "log", "slurmctld.out"))
	if err != nil {
		return c, err
	}
	c.daemons = append(c.daemons, ctld)
	slurmd, err := testdaemon.Start("slurmd", []string{"slurmd", "-D", "-f", c.Conf, "-N", c.NodeName}, nil, filepath.Join(dir, "log", "slurmd.out"))
	if err != nil {
		return c, err
	}
	c.daemons = append(c.daemons, slurmd)
	err = testdaemon.WaitFor(wait, 100*time.Millisecond, func() error {
		out, err := c.Command(wait, "sinfo", "--noheader", "--nodes="+c.NodeName, "--format=%T").CombinedOutput()
		if err != nil {
			return fmt.Errorf("sinfo: %v: %s", err, bytes.TrimSpace(out))
		}
		if state := strings.TrimSpace(string(out)); state != "idle" {
			return fmt.Errorf("node %s is %q, not idle", c.NodeName, state)
		}
		return nil
	}, ctld, slurmd)
	if err != nil {
		for _, log := range []string{"slurmctld.log", "slurmd.log"} {
			if strings.Contains(testdaemon.TailFile(filepath.Join(dir, "log", log), 4000), "Address already in use") {
				return c, fmt.Errorf("%w: %w", testdaemon.ErrPortTaken, err)
			}
		}
		return c, fmt.Errorf("waiting for Slurm node %s: %w\n%s", c.NodeName, err, c.Logs(2000))
	}
	return c, nil
}

// config is the cluster's slurm.conf: one node with CPUs slots that takes
// several jobs and steps at once; process tracking by parent pid
// (proctrack/linuxproc) and no task confinement (task/none), which need no
// cgroup setup; no accounting.
func (c *Cluster) config(host, mungeSocket string, ctldPort, slurmdPort int) string {
	d := c.Dir
	return fmt.Sprintf(`# written by gorovod's internal/testing/testslurm
ClusterName=%s
SlurmctldHost=%s(127.0.0.1)
SlurmctldPort=%d
SlurmdPort=%d
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=%s
CredType=cred/munge
StateSaveLocation=%s/state
SlurmdSpoolDir=%s/spool
SlurmctldPidFile=%s/slurmctld.pid
SlurmdPidFile=%s/slurmd.pid
SlurmctldLogFile=%s/log/slurmctld.log
SlurmdLogFile=%s/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
KillWait=%d
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
NodeName=%s NodeHostname=%s NodeAddr=127.0.0.1 CPUs=%d State=UNKNOWN
PartitionName=gorovod Nodes=%s Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
%s`, c.Name, host, ctldPort, slurmdPort, mungeSocket, d, d, d, d, d, d,
		seconds(c.cfg.KillWait), c.NodeName, host, c.cfg.CPUs, c.NodeName, c.preemption())
}

func seconds(d time.Duration) int { return int((d + time.Second - 1) / time.Second) }

func (c *Cluster) preemption() string {
	if !c.cfg.Preemption {
		return ""
	}
	return fmt.Sprintf(`PreemptType=preempt/partition_prio
PreemptMode=CANCEL
PartitionName=spot Nodes=%s MaxTime=INFINITE State=UP OverSubscribe=NO PriorityTier=1 PreemptMode=CANCEL GraceTime=%d
PartitionName=urgent Nodes=%s MaxTime=INFINITE State=UP OverSubscribe=NO PriorityTier=2 PreemptMode=OFF
`, c.NodeName, seconds(c.cfg.PreemptGrace), c.NodeName)
}

// Env is what a Slurm client command (srun, sbatch, squeue, ...) needs in its
// environment to talk to this cluster. Jobs inherit it (srun and sbatch
// export their environment), which is how Stop recognizes their processes.
func (c *Cluster) Env() []string { return []string{"SLURM_CONF=" + c.Conf} }

// Environ is this process's environment with Env added, and any Slurm
// variables of an allocation this test may run inside removed.
func (c *Cluster) Environ() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLURM_") {
			env = append(env, kv)
		}
	}
	return append(env, c.Env()...)
}

// Command prepares a Slurm client command against this cluster.
func (c *Cluster) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = c.Environ()
	return cmd
}

// Run runs a Slurm client command and returns its trimmed output.
func (c *Cluster) Run(ctx context.Context, name string, args ...string) (string, error) {
	out, err := c.Command(ctx, name, args...).CombinedOutput()
	s := strings.TrimSpace(string(out))
	if err != nil {
		return s, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, s)
	}
	return s, nil
}

// Allocate makes an allocation of ntasks tasks with no shell (salloc
// --no-shell) and returns its job id.
func (c *Cluster) Allocate(ctx context.Context, ntasks int, extra ...string) (string, error) {
	args := append([]string{"--no-shell", "--ntasks=" + fmt.Sprint(ntasks), "--job-name=gorovod-test"}, extra...)
	out, err := c.Run(ctx, "salloc", args...)
	if err != nil {
		return "", err
	}
	// "salloc: Granted job allocation 7"
	for _, line := range strings.Split(out, "\n") {
		if id, ok := strings.CutPrefix(strings.TrimSpace(line), "salloc: Granted job allocation "); ok {
			return strings.TrimSpace(id), nil
		}
	}
	return "", fmt.Errorf("salloc: no job id in %q", out)
}

// Jobs lists the cluster's jobs that are not finished, as "id state".
func (c *Cluster) Jobs(ctx context.Context) ([]string, error) {
	out, err := c.Run(ctx, "squeue", "--noheader", "--format=%i %T")
	if err != nil || out == "" {
		return nil, err
	}
	return strings.Split(out, "\n"), nil
}

// Leftovers lists the processes the cluster's jobs and daemons run besides
// the daemons themselves: anything holding a socket in its spool directory
// (slurmstepd) or carrying its SLURM_CONF in its environment (srun, tasks,
// batch scripts).
func (c *Cluster) Leftovers() []int {
	daemon := map[int]bool{}
	for _, d := range c.daemons {
		daemon[d.PID()] = true
	}
	var pids []int
	for _, pid := range testdaemon.Marked(c.marker()) {
		if !daemon[pid] {
			pids = append(pids, pid)
		}
	}
	return pids
}

func (c *Cluster) marker() testdaemon.Marker {
	return testdaemon.Marker{Env: c.Env()[0], SocketDir: filepath.Join(c.Dir, "spool")}
}

// Logs returns the end of each daemon's log.
func (c *Cluster) Logs(n int) string {
	var b strings.Builder
	for _, name := range []string{"munged.out", "slurmctld.log", "slurmd.log", "slurmctld.out", "slurmd.out"} {
		fmt.Fprintf(&b, "--- %s\n%s\n", name, testdaemon.TailFile(filepath.Join(c.Dir, "log", name), n))
	}
	return b.String()
}

// Stop cancels every job, waits for their processes to end, stops the
// daemons (SIGTERM, then SIGKILL) and removes the directory. It returns an
// error if anything had to be killed by force or was left behind.
func (c *Cluster) Stop(ctx context.Context) error {
	var errs []error
	if len(c.daemons) == 3 {
		// Kill the jobs' processes at once, then end the jobs (an
		// allocation with no shell has no process to kill).
		_, _ = c.Run(ctx, "scancel", "--signal=KILL", "--full", "--user=root")
		_, _ = c.Run(ctx, "scancel", "--user=root")
		err := testdaemon.WaitFor(ctx, 100*time.Millisecond, func() error {
			jobs, err := c.Jobs(ctx)
			if err != nil {
				return err
			}
			if len(jobs) > 0 {
				return fmt.Errorf("jobs still there: %v", jobs)
			}
			if left := c.Leftovers(); len(left) > 0 {
				return fmt.Errorf("processes still running: %v", left)
			}
			return nil
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("ending the jobs: %w", err))
		}
	}
	for i := len(c.daemons) - 1; i >= 0; i-- {
		if err := c.daemons[i].Stop(10 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if err := testdaemon.KillMarked(c.marker()); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		if err := os.RemoveAll(c.Dir); err != nil {
			errs = append(errs, err)
		}
	} else {
		errs = append(errs, fmt.Errorf("logs kept in %s", c.Dir))
	}
	return errors.Join(errs...)
}
