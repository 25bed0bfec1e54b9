package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/gorovod/gorovod/cluster/kube/service"
	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/internal/logging"
	"github.com/gorovod/gorovod/observe/metrics"
)

// schedulerCommand is `gorovod scheduler`: the scheduler service of a
// Kubernetes cluster (deploy/kubernetes/gorovod.yaml runs it).
func schedulerCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gorovod scheduler", flag.ContinueOnError)
	def := service.DefaultConfig()
	policy := fs.String("policy", def.Policy, "scheduling policy: pollux, optimus or tiresias")
	interval := fs.Duration("interval", def.Interval, "time between timed scheduling rounds (a round also runs --event-delay after a job arrives or ends, a node comes, goes, is cordoned or tainted, or another pod is bound to a node or ends)")
	eventDelay := fs.Duration("event-delay", def.EventDelay, "how long a round waits after the first of a burst of cluster changes, so that the burst shares one round (0: none)")
	minRoundGap := fs.Duration("min-round-gap", def.MinRoundGap, "the least time from one round's end to the next one's start, so that a storm of changes cannot run rounds back to back (0: none)")
	penalty := fs.Duration("restart-penalty", def.RestartPenalty, "Pollux: what a resize costs a job (δ)")
	namespaces := fs.String("namespaces", "", "comma-separated `namespaces` whose GorovodJobs are scheduled (default: all)")
	leaderElect := fs.Bool("leader-elect", false, "take turns with other replicas through a Lease: only the leader schedules")
	leaseName := fs.String("lease-name", def.LeaderElection.LeaseName, "the Lease's name (with --leader-elect)")
	leaseNamespace := fs.String("lease-namespace", def.LeaderElection.LeaseNamespace, "the Lease's namespace (with --leader-elect)")
	leaseDuration := fs.Duration("lease-duration", def.LeaderElection.LeaseDuration, "how long a Lease holds after its last renewal: another replica takes over after it")
	renewDeadline := fs.Duration("renew-deadline", def.LeaderElection.RenewDeadline, "how long the leader tries to renew before it stops scheduling")
	retryPeriod := fs.Duration("retry-period", def.LeaderElection.RetryPeriod, "time between tries to acquire or renew the Lease")
	identity := fs.String("identity", "", "this replica's name in the Lease and in the jobs' status.scheduledBy (default: host name and a random suffix)")
	kubeconfig := fs.String("kubeconfig", "", kubeconfigUsage)
	kubeContext := fs.String("context", "", "the kubeconfig `context` to use (default: its current context)")
	metricsAddr := fs.String("metrics-addr", "", "serve Prometheus metrics of the scheduler (leadership, rounds and their time, jobs by phase, slots and allocated slots) at http://`host:port`/metrics (port 0 picks one; the address is printed on stderr). The endpoint is unauthenticated, and a host-less :9100 binds every interface: use 127.0.0.1:9100 unless scrapers on other hosts must reach it")
	logOpts := logging.DefaultOptions()
	logOpts.Register(fs)
	usage := `Usage: gorovod scheduler [flags]

Runs the scheduler service of a Kubernetes cluster: it shares the nodes'
slots (allocatable nvidia.com/gpu, else the extended resource gorovod.io/slot,
else the node label gorovod.io/slots=N; only Ready, schedulable nodes) among
the GorovodJobs with a scheduling policy (a job that asks for nvidia.com/gpu
on GPU nodes only, any other on the nodes without GPUs only), writes each
job's allocation into its status, and starts each admitted job's driver pod,
which grows and shrinks the job in place. deploy/kubernetes/gorovod.yaml installs it (two replicas,
--leader-elect).`
	if err := parseFlags(fs, args, usage, stdout, stderr); err != nil {
		return err
	}
	usageErr := func(format string, args ...any) error {
		fmt.Fprintf(stderr, "gorovod scheduler: "+format+"\nRun 'gorovod scheduler --help' for the flags.\n", args...)
		return ErrUsage
	}
	if err := logOpts.Validate(); err != nil {
		return usageErr("%v", err)
	}
	if fs.NArg() != 0 {
		return usageErr("unexpected arguments %q", fs.Args())
	}
	if *interval <= 0 {
		return usageErr("--interval must be positive")
	}
	if *eventDelay < 0 || *minRoundGap < 0 {
		return usageErr("--event-delay and --min-round-gap must not be negative")
	}
	if !slices.Contains(service.Policies, *policy) {
		return usageErr("unknown --policy %q (want pollux, optimus or tiresias)", *policy)
	}
	log, _ := logOpts.Logger(stderr)
	cfg := def
	cfg.Policy, cfg.Interval, cfg.RestartPenalty, cfg.Identity, cfg.Logger = *policy, *interval, *penalty, *identity, log
	// The Config's zero is its default; the flags' zero is none.
	cfg.EventDelay, cfg.MinRoundGap = *eventDelay, *minRoundGap
	if cfg.EventDelay == 0 {
		cfg.EventDelay = -1
	}
	if cfg.MinRoundGap == 0 {
		cfg.MinRoundGap = -1
	}
	for _, ns := range strings.Split(*namespaces, ",") {
		if ns = strings.TrimSpace(ns); ns != "" {
			cfg.Namespaces = append(cfg.Namespaces, ns)
		}
	}
	cfg.LeaderElection = service.LeaderElection{Enabled: *leaderElect, LeaseName: *leaseName, LeaseNamespace: *leaseNamespace,
		LeaseDuration: *leaseDuration, RenewDeadline: *renewDeadline, RetryPeriod: *retryPeriod}
	r, err := resolveKube(*kubeconfig, *kubeContext, envconfig.LoadKubeAccess(os.Getenv))
	if err != nil {
		return fmt.Errorf("gorovod scheduler: %w", err)
	}
	restCfg := r.config
	kube, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("gorovod scheduler: %w", err)
	}
	dyn, err := dynamic.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("gorovod scheduler: %w", err)
	}
	var reg *prometheus.Registry
	if *metricsAddr != "" {
		reg = prometheus.NewRegistry()
		if cfg.Metrics, err = service.NewMetrics(reg); err != nil {
			return fmt.Errorf("gorovod scheduler: %w", err)
		}
	}
	svc, err := service.New(cfg, kube, dyn)
	if err != nil {
		return usageErr("%v", err)
	}
	if reg != nil {
		srv, err := metrics.Serve(ctx, reg, metrics.ServerConfig{Addr: *metricsAddr, Logger: log})
		if err != nil {
			return fmt.Errorf("gorovod scheduler: --metrics-addr: %w", err)
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			_ = srv.Close(cctx)
		}()
		fmt.Fprintf(stderr, "gorovod scheduler: metrics at http://%s/metrics\n", srv.Addr())
	}
	log.Info("scheduler starting", "identity", svc.Identity(), "policy", cfg.Policy, "interval", cfg.Interval,
		"namespaces", cfg.Namespaces, "leader_elect", cfg.LeaderElection.Enabled)
	if err := svc.Run(ctx); err != nil {
		return fmt.Errorf("gorovod scheduler: %w", err)
	}
	return nil
}
