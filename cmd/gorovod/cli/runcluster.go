package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/gorovod/gorovod/cluster/kube"
	"github.com/gorovod/gorovod/cluster/slurm"
	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/internal/netaddr"
	"github.com/gorovod/gorovod/job"
)

// clusterOptions are `gorovod run`'s flags for cluster engines and for the
// workers' leave notice.
type clusterOptions struct {
	slurm          bool
	slurmArgs      stringList
	slurmCPUs      int
	kubernetes     bool
	kubeImage      string
	kubeNamespace  string
	kubeJob        string
	kubeconfig     string
	kubeTemplate   string
	kubeGossipPort int
	leaveNotice    time.Duration
	// gorovodJob names the GorovodJob the driver runs (gorovodjob.go);
	// gorovodJobDriver follows it once started.
	gorovodJob       string
	gorovodJobDriver *gorovodJobDriver
}

// kubeGossipPort is the driver's gossip port in a pod: the containerPort of
// deploy/kubernetes/driver.yaml.
const kubeGossipPort = 7946

func (c *clusterOptions) addFlags(fs *flag.FlagSet) {
	fs.BoolVar(&c.slurm, "slurm", false, "inside a Slurm allocation (salloc, sbatch): workers are srun steps on its nodes, at most its task count")
	fs.Var(&c.slurmArgs, "slurm-arg", "an `argument` for every worker's srun, such as --gres=gpu:1 (repeatable)")
	fs.IntVar(&c.slurmCPUs, "slurm-cpus-per-worker", 0, "CPUs of each worker step (default: the allocation's --cpus-per-task, else 1)")
	fs.BoolVar(&c.kubernetes, "kubernetes", false, "workers are pods of this namespace, created through the Kubernetes API (the driver runs in a pod, or uses --kubeconfig)")
	fs.StringVar(&c.kubeImage, "kubernetes-image", "", "the worker pods' container `image` (required with --kubernetes unless the pod template has one)")
	fs.StringVar(&c.kubeNamespace, "kubernetes-namespace", "", "the workers' namespace (default: the driver's pod's, else \"default\")")
	fs.StringVar(&c.kubeJob, "kubernetes-job", "", "the job's `name`, a DNS label: pods <name>-worker-<n>, label gorovod.io/job (default: the job id)")
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", kubeconfigUsage+" (with --kubernetes)")
	fs.StringVar(&c.kubeTemplate, "kubernetes-pod-template", "", "a Pod manifest `file` (YAML or JSON) the worker pods start from: node selectors, tolerations, resources, volumes")
	fs.IntVar(&c.kubeGossipPort, "kubernetes-gossip-port", kubeGossipPort, "the driver's gossip port in its pod")
	fs.StringVar(&c.gorovodJob, "gorovodjob", "", "run the GorovodJob `name`d (its driver pod, which the gorovod scheduler creates): the workers, image and command of its spec, on the nodes of its status.allocation, followed live (docs/clusters.md)")
	fs.DurationVar(&c.leaveNotice, "leave-notice", 0, "how long a worker has from SIGTERM until it must be gone, given to the workers (default: theirs, 25 s; keep it below Slurm's KillWait, and it is the pods' termination grace period)")
}

// check validates the flags against the rest of the command line.
func (c *clusterOptions) check(np, maxNP int) error {
	switch {
	case c.slurm && c.kubernetes:
		return errors.New("give --slurm or --kubernetes, not both")
	case !c.slurm && (len(c.slurmArgs) > 0 || c.slurmCPUs != 0):
		return errors.New("--slurm-arg and --slurm-cpus-per-worker need --slurm")
	case c.slurmCPUs < 0:
		return fmt.Errorf("--slurm-cpus-per-worker %d must be positive", c.slurmCPUs)
	case !c.kubernetes && (c.kubeImage != "" || c.kubeNamespace != "" || c.kubeJob != "" || c.kubeconfig != "" || c.kubeTemplate != ""):
		return errors.New("the --kubernetes-* and --kubeconfig flags need --kubernetes")
	case c.kubeGossipPort < 1 || c.kubeGossipPort > 65535:
		return fmt.Errorf("--kubernetes-gossip-port %d is not a port", c.kubeGossipPort)
	case c.leaveNotice < 0 || c.leaveNotice > envconfig.MaxLeaveNotice:
		return fmt.Errorf("--leave-notice %v: want a duration between 0 and %v", c.leaveNotice, envconfig.MaxLeaveNotice)
	}
	return nil
}

// apply sets the job configuration's launcher, hosts, bounds, driver address
// and worker environment for the engine the flags ask for (none: the local
// launcher stays); it returns what to do once the job has ended.
func (c *clusterOptions) apply(ctx context.Context, cfg *job.Config, report func(format string, args ...any)) (closeFn func(), err error) {
	if c.leaveNotice > 0 {
		cfg.Env = append(cfg.Env, envconfig.EnvLeaveNotice+"="+c.leaveNotice.String())
	}
	switch {
	case c.slurm:
		return func() {}, c.applySlurm(ctx, cfg, report)
	case c.kubernetes:
		return c.applyKubernetes(ctx, cfg, report)
	}
	if id, ok := slurmJobID(); ok {
		report("inside Slurm job %s without --slurm: the workers run on this host as plain processes, not as steps of the allocation", id)
	}
	return func() {}, nil
}

func slurmJobID() (string, bool) {
	a, ok, _ := slurm.CurrentAllocation()
	return a.JobID, ok
}

func (c *clusterOptions) applySlurm(ctx context.Context, cfg *job.Config, report func(format string, args ...any)) error {
	a, ok, err := slurm.CurrentAllocation()
	switch {
	case err != nil:
		return fmt.Errorf("--slurm: %w", err)
	case !ok:
		return errors.New("--slurm: not inside a Slurm allocation (no SLURM_JOB_ID): run gorovod under salloc or in an sbatch script")
	case cfg.Workers > a.NTasks:
		return fmt.Errorf("--slurm: --np %d is more than the %d tasks of allocation %s", cfg.Workers, a.NTasks, a.JobID)
	case cfg.MaxWorkers > a.NTasks:
		return fmt.Errorf("--slurm: --max-np %d is more than the %d tasks of allocation %s", cfg.MaxWorkers, a.NTasks, a.JobID)
	}
	if cfg.MaxWorkers == 0 {
		cfg.MaxWorkers = a.NTasks
	}
	l, err := slurm.NewLauncher(slurm.LauncherConfig{JobID: a.JobID, CPUsPerWorker: c.slurmCPUs, ExtraArgs: c.slurmArgs})
	if err != nil {
		return fmt.Errorf("--slurm: %w", err)
	}
	cfg.Launcher, cfg.Discovery = l, a.Discovery()
	// Workers on other nodes must reach the driver: off loopback as soon as
	// one node of the allocation is not this host.
	if cfg.Gossip.BindAddr == "" || netaddr.IsLoopback(cfg.Gossip.BindAddr) {
		other, err := a.RemoteNode(ctx)
		if err != nil {
			return fmt.Errorf("--slurm: %w", err)
		}
		if other != "" {
			addr, err := netaddr.Pick(envconfig.DriverInterfaces(os.Getenv), other)
			if err != nil {
				return fmt.Errorf("--slurm: the driver's address for workers on %s: %w (set %s)", other, err, envconfig.EnvNetworkInterface)
			}
			cfg.Gossip.BindAddr = addr.String()
		}
	}
	nodes := make([]string, len(a.Hosts))
	for i, h := range a.Hosts {
		nodes[i] = h.Name + ":" + strconv.Itoa(h.Slots)
	}
	report("Slurm job %s: %d tasks on %s; at most %d workers", a.JobID, a.NTasks, strings.Join(nodes, ","), cfg.MaxWorkers)
	return nil
}

func (c *clusterOptions) applyKubernetes(ctx context.Context, cfg *job.Config, report func(format string, args ...any)) (func(), error) {
	pod, inPod, err := envconfig.LoadKubernetesPod(os.Getenv)
	if err != nil {
		return nil, fmt.Errorf("--kubernetes: %w", err)
	}
	r, err := resolveKube(c.kubeconfig, "", envconfig.LoadKubeAccess(os.Getenv))
	if err != nil {
		return nil, fmt.Errorf("--kubernetes: %w", err)
	}
	restCfg := r.config
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, fmt.Errorf("--kubernetes: %w", err)
	}
	kc := kube.Config{Client: client, Namespace: c.kubeNamespace, Job: c.kubeJob, Image: c.kubeImage, Grace: c.leaveNotice,
		Logf: func(format string, args ...any) {}}
	if gj := c.gorovodJobDriver; gj != nil {
		gj.configure(&kc)
	}
	if kc.Job == "" {
		if cfg.JobID == "" {
			cfg.JobID = job.NewJobID()
		}
		kc.Job = cfg.JobID
	}
	if c.kubeTemplate != "" {
		if kc.Template, err = readPodTemplate(c.kubeTemplate); err != nil {
			return nil, fmt.Errorf("--kubernetes-pod-template: %w", err)
		}
	}
	if inPod {
		if kc.Namespace == "" {
			kc.Namespace = pod.Namespace
		}
		// Deleting the driver's pod (its Job) deletes the workers.
		kc.Owner = &metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: types.UID(pod.UID)}
		c.podGossip(cfg, pod.IP)
	}
	if gj := c.gorovodJobDriver; gj != nil {
		// The GorovodJob owns the workers: they outlive a driver pod that
		// a replacement takes over from, and go with the job.
		kc.Owner = gj.owner()
	}
	l, err := kube.NewLauncher(ctx, kc)
	if err != nil {
		return nil, fmt.Errorf("--kubernetes: %w", err)
	}
	cfg.Launcher = l
	if gj := c.gorovodJobDriver; gj != nil {
		gj.kl = l
		if cfg.Adopt != nil {
			if err := gj.adoptPods(l, cfg.Adopt); err != nil {
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
				defer cancel()
				l.Detach()
				_ = l.Close(cctx)
				return nil, err
			}
		}
		cfg.Launcher = placedLauncher{Launcher: l, d: gj}
		cfg.Discovery = gj.disc
		cfg.Autoscaling.Heuristic, cfg.Autoscaling.ReplaceStragglers = gj.steer, false
	}
	ns := kc.Namespace
	if ns == "" {
		ns = "default"
	}
	report("Kubernetes: job %s in namespace %s (pods labelled %s=%s)", kc.Job, ns, kube.LabelJob, kc.Job)
	return func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute+2*max(c.leaveNotice, kube.DefaultConfig().Grace))
		defer cancel()
		if err := l.Close(cctx); err != nil {
			report("cleaning up the job's pods: %v", err)
		}
	}, nil
}

// podGossip binds the driver of a pod whose IP is ip (GOROVOD_POD_IP) to
// that IP and --kubernetes-gossip-port, where the workers in other pods
// reach it, unless the host options chose an address other than loopback
// (--gossip-addr, --network-interface): loopback is their default, which no
// other pod reaches. A runner that takes a job back then knows the address
// for its own (job.Adoption.OwnAddr): it binds the workers' seed only at
// that IP.
func (c *clusterOptions) podGossip(cfg *job.Config, ip string) {
	if ip == "" || (cfg.Gossip.BindAddr != "" && !netaddr.IsLoopback(cfg.Gossip.BindAddr)) {
		return
	}
	cfg.Gossip.BindAddr, cfg.Gossip.BindPort = ip, c.kubeGossipPort
	if cfg.Adopt != nil {
		cfg.Adopt.OwnAddr = true
	}
}

// readPodTemplate reads a Pod manifest.
func readPodTemplate(path string) (*corev1.Pod, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(b, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, fmt.Errorf("%s: a %T, not a Pod", path, obj)
	}
	return pod, nil
}
