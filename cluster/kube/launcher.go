package kube

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/job"
)

// secretVars are the job variables that go into the job's Secret, never
// into a pod spec.
var secretVars = []string{envconfig.EnvSecret}

// Launcher starts an elastic job's workers as pods: the job.Launcher of
// `gorovod run --kubernetes`. Each launch creates one worker pod, as the
// Provisioner makes them (labels, the Secret, the headless Service, owner
// references, the downward API), named by the job's launch index and running
// the job's command with the job's environment — the job secret through the
// Secret. What a job.Process needs of a pod:
//
//   - Signal: any signal but SIGKILL deletes the pod with its grace period
//     (the kubelet sends SIGTERM: the trainer leaves the job gracefully, and
//     is killed after the grace period); SIGKILL deletes it at once.
//   - Done: closed once the trainer container has exited, or the pod is gone
//     without it (deleted, evicted, given up after PendingTimeout).
//   - Err: nil for exit status 0; the signal of a status above 128 (143 for
//     SIGTERM); SIGKILL for a pod that went without its container ending,
//     which the job survives like a killed process.
//
// A pod that someone else deletes or that the cluster disrupts (a
// preemption, a drain) is reported through the launch's Notice; the
// autoscaling engine replaces the worker if its heuristic wants the job's
// size back (package heuristics). The worker's output stays with the pod
// (kubectl logs): the Role of deploy/kubernetes/rbac.yaml does not read logs.
type Launcher struct {
	p *Provisioner

	mu      sync.Mutex
	secret  map[string]string
	notices map[int]func(string)
}

var (
	_ job.Launcher      = (*Launcher)(nil)
	_ job.WorkerAdopter = (*Launcher)(nil)
)

// NewLauncher starts watching the job's pods as New does. Of cfg, Command,
// SecretEnv and the job variables of Env come from each launch (the job's
// command and environment) and are ignored here; cfg.OnEvent still receives
// every pod event.
func NewLauncher(ctx context.Context, cfg Config) (*Launcher, error) {
	l := &Launcher{notices: map[int]func(string){}}
	onEvent := cfg.OnEvent
	cfg.OnEvent = func(e Event) {
		l.noticeEvent(e)
		if onEvent != nil {
			onEvent(e)
		}
	}
	cfg.Command, cfg.SecretEnv = nil, nil
	p, err := New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	l.p = p
	return l, nil
}

// Provisioner is the launcher's provisioner (its pods, its Close).
func (l *Launcher) Provisioner() *Provisioner { return l.p }

// Launch creates worker r.Index's pod and returns once the API server has
// it; the pod starts when the cluster schedules it. r.Host places the pod
// only through Config.NodeName; without it the cluster places pods.
func (l *Launcher) Launch(ctx context.Context, r job.LaunchRequest) (job.Process, error) {
	var extra []corev1.EnvVar
	secret := map[string]string{}
	for _, kv := range r.Env {
		name, value, ok := strings.Cut(kv, "=")
		switch {
		case !ok || name == "":
			return nil, fmt.Errorf("kube: environment entry %q is not NAME=value", kv)
		case isSecretVar(name):
			secret[name] = value
		case name != envconfig.EnvLaunchIndex: // the pod sets its own
			extra = appendEnv(extra, corev1.EnvVar{Name: name, Value: value})
		}
	}
	if err := l.setSecret(secret); err != nil {
		return nil, err
	}
	l.setNotice(r.Index, r.Notice)
	node := ""
	if l.p.cfg.NodeName != nil {
		node = l.p.cfg.NodeName(r.Host)
	}
	var annotations map[string]string
	if r.Host != "" {
		annotations = map[string]string{AnnotationHost: r.Host}
	}
	st, err := l.p.create(ctx, r.Index, r.Argv, extra, node, annotations)
	if err != nil {
		l.mu.Lock()
		delete(l.notices, r.Index)
		l.mu.Unlock()
		return nil, err
	}
	return l.follow(ctx, st), nil
}

// follow is the job.Process of a worker pod: stopped (SIGTERM through the
// kubelet) when ctx ends.
func (l *Launcher) follow(ctx context.Context, st *podState) *Pod {
	w := &Pod{l: l, st: st}
	go func() {
		select {
		case <-st.ended:
		case <-ctx.Done():
			// The job stops its workers: SIGTERM through the kubelet.
			_ = w.Signal(job.StopSignal)
		}
	}()
	return w
}

// Adopt takes back worker r.Index's pod, made by an earlier driver of the
// job (job.WorkerAdopter): the pod the watch found with that index, still
// running. Its end is known as for a pod this launcher made (Err gives the
// trainer's exit status). secretEnv, the job's secret variables, must be
// those of the job's Secret: later launches carry the same.
func (l *Launcher) Adopt(ctx context.Context, r job.AdoptRequest) (job.Process, error) {
	l.p.mu.Lock()
	var st *podState
	for _, s := range l.p.byName {
		if s.Index == r.Index {
			st = s
		}
	}
	var running bool
	if st != nil {
		running = st.Running && !st.Ended && !st.Deleted
	}
	l.p.mu.Unlock()
	switch {
	case st == nil:
		return nil, fmt.Errorf("kube: no pod of job %s has worker index %d", l.p.cfg.Job, r.Index)
	case !running:
		return nil, fmt.Errorf("kube: pod %s is not running", st.Pod)
	}
	l.setNotice(r.Index, r.Notice)
	return l.follow(ctx, st), nil
}

// setNotice keeps where the pod events of worker index go (nowhere when
// notice is nil).
func (l *Launcher) setNotice(index int, notice func(string)) {
	if notice == nil {
		notice = func(string) {}
	}
	l.mu.Lock()
	l.notices[index] = notice
	l.mu.Unlock()
}

// Detach leaves the job's pods to a driver that takes the job back
// (Provisioner.Detach): stopping the job no longer deletes them.
func (l *Launcher) Detach() { l.p.Detach() }

// AdoptSecret sets the job's secret variables of an adopted job (those of
// its Secret, which the adopting driver read): the launches that replace
// workers carry them, and the provisioner finds the Secret by them.
func (l *Launcher) AdoptSecret(secretEnv map[string]string) error {
	return l.setSecret(maps.Clone(secretEnv))
}

func isSecretVar(name string) bool {
	for _, s := range secretVars {
		if s == name {
			return true
		}
	}
	return false
}

// setSecret puts the job's secret variables into the provisioner's Secret
// before its first pod; every launch of a job carries the same.
func (l *Launcher) setSecret(secret map[string]string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.secret == nil {
		l.secret = secret
		l.p.mu.Lock()
		l.p.cfg.SecretEnv = maps.Clone(secret)
		l.p.mu.Unlock()
		return nil
	}
	if !maps.Equal(l.secret, secret) {
		return errors.New("kube: a launch with another job secret than the job's first")
	}
	return nil
}

// noticeEvent tells the job of a worker the cluster took away.
func (l *Launcher) noticeEvent(e Event) {
	if !e.Preempted && e.Kind != PodGaveUp {
		return
	}
	l.mu.Lock()
	notice := l.notices[e.Index]
	l.mu.Unlock()
	if notice == nil {
		return
	}
	switch {
	case e.Kind == PodGaveUp:
		notice(fmt.Sprintf("pod %s did not start in time (%s); deleted", e.Pod, e.Reason))
	case e.Kind == PodEnded:
		notice(fmt.Sprintf("pod %s was preempted (exit code %d%s)", e.Pod, e.ExitCode, reasonSuffix(e.Reason)))
	case e.Kind == PodDeleted:
		notice(fmt.Sprintf("pod %s was %s", e.Pod, e.Reason))
	}
}

func reasonSuffix(r string) string {
	if r == "" {
		return ""
	}
	return ", " + r
}

// Close deletes the pods still there, the Service and the Secret, and stops
// watching (Provisioner.Close).
func (l *Launcher) Close(ctx context.Context) error { return l.p.Close(ctx) }

// Pod is a worker running as a pod: a job.Process.
type Pod struct {
	l  *Launcher
	st *podState
}

var _ job.Process = (*Pod)(nil)

// Name is the pod's name.
func (w *Pod) Name() string { return w.st.Pod }

// PID is 0: the trainer's process id in its container is not known here.
func (w *Pod) PID() int { return 0 }

// Signal deletes the pod: with its grace period (SIGTERM first) for any
// signal but SIGKILL, at once for SIGKILL. SIGCONT, which only wakes a
// paused process (launch.SignalAwake), does nothing: the API cannot pause a
// container's process, nor deliver a signal to one.
func (w *Pod) Signal(sig os.Signal) error {
	select {
	case <-w.st.ended:
		return nil
	default:
	}
	if sig == syscall.SIGCONT {
		return nil
	}
	var grace *int64
	if sig == syscall.SIGKILL {
		zero := int64(0)
		grace = &zero
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return w.l.p.deletePod(ctx, w.st, grace)
}

// Done is closed once the trainer container has exited or the pod is gone.
func (w *Pod) Done() <-chan struct{} { return w.st.ended }

// Err is, after Done, how the worker ended (see Launcher).
func (w *Pod) Err() error {
	select {
	case <-w.st.ended:
	default:
		return nil
	}
	w.l.p.mu.Lock()
	ws := w.st.Worker
	w.l.p.mu.Unlock()
	switch {
	case ws.GaveUp || !ws.Exited:
		return &job.ExitError{Code: -1, Signal: syscall.SIGKILL}
	case ws.ExitCode == 0:
		return nil
	case ws.ExitCode > 128 && ws.ExitCode <= 128+64:
		return &job.ExitError{Code: -1, Signal: syscall.Signal(ws.ExitCode - 128)}
	}
	return &job.ExitError{Code: int(ws.ExitCode)}
}

// deletePod asks for a pod's deletion (grace nil: its own grace period) as
// the provisioner's decision.
func (p *Provisioner) deletePod(ctx context.Context, st *podState, grace *int64) error {
	p.mu.Lock()
	if p.detached {
		p.mu.Unlock()
		return nil
	}
	st.byUs = true
	p.mu.Unlock()
	if err := p.pods.Delete(ctx, st.Pod, metav1.DeleteOptions{GracePeriodSeconds: grace}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("kube: deleting pod %s: %w", st.Pod, err)
	}
	return nil
}
