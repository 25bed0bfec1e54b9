package service

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/util/workqueue"

	"github.com/gorovod/gorovod/cluster/kube"
	"github.com/gorovod/gorovod/cluster/kube/api"
	"github.com/gorovod/gorovod/cluster/scheduler"
)

var errCachesNotSynced = errors.New("service: the informers' caches did not sync")

// ErrInvalidConfig is wrapped by every error about a Config that cannot run.
var ErrInvalidConfig = errors.New("service: invalid configuration")

// Config configures the scheduler service. A zero field means its default.
type Config struct {
	// Namespaces are the namespaces whose GorovodJobs are scheduled; empty:
	// all namespaces.
	Namespaces []string
	// Interval is the time between timed scheduling rounds (60 s, Pollux's
	// and AdaptDL's); a round also runs EventDelay after the cluster
	// changes (a job created or deleted, a node added, removed or changing
	// its slots, a pod not the jobs' bound to a node or ended).
	Interval time.Duration
	// EventDelay is how long a round waits after the first of a burst of
	// cluster changes, so that the burst's changes share one round
	// (default 1 s; negative: none).
	EventDelay time.Duration
	// MinRoundGap is the least time from one round's end to the next
	// round's start, whatever calls for it, so that a storm of changes
	// cannot run rounds back to back (default 2 s; negative: none).
	MinRoundGap time.Duration
	// Policy shares the slots: "pollux" (the default), "optimus" or
	// "tiresias".
	Policy string
	// RestartPenalty is Pollux's δ, what a resize costs a job: gorovod
	// resizes a running job live, in seconds rather than a checkpoint
	// restart's minute (default 2 s).
	RestartPenalty time.Duration
	// Identity names this replica in the Lease and in status.scheduledBy
	// (default: the host name and a random suffix).
	Identity string
	// LeaderElection makes replicas take turns; off, this replica always
	// schedules (run only one).
	LeaderElection LeaderElection
	// DriverResources are the driver pod's container resources (default:
	// requests of 250m CPU and 128 MiB).
	DriverResources corev1.ResourceRequirements
	// CustomizeDriver, when set, edits each driver pod before it is
	// created (a node selector, tolerations, an image pull policy).
	CustomizeDriver func(*corev1.Pod)
	// MaxDriverRestarts bounds the driver pods started in place of a job's
	// driver that was killed or deleted while the job ran (default 3;
	// negative: none, such a job fails).
	MaxDriverRestarts int
	// Logger receives the service's notices. Default: discarded.
	Logger *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
	// OnRound, when set, is called after each round this replica runs as
	// the leader, with the round's error.
	OnRound func(error)
	// Metrics, when set, records the service's rounds, leadership, jobs and
	// slots (NewMetrics).
	Metrics *Metrics
}

// LeaderElection configures the Lease the replicas compete for.
type LeaderElection struct {
	Enabled bool
	// LeaseName and LeaseNamespace name the Lease (gorovod-scheduler in
	// gorovod-system).
	LeaseName, LeaseNamespace string
	// LeaseDuration, RenewDeadline and RetryPeriod are client-go's (15 s,
	// 10 s, 2 s): a replica that cannot renew for RenewDeadline stops
	// leading; another takes over LeaseDuration after the last renewal.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Interval:          60 * time.Second,
		EventDelay:        time.Second,
		MinRoundGap:       2 * time.Second,
		Policy:            "pollux",
		RestartPenalty:    2 * time.Second,
		MaxDriverRestarts: 3,
		LeaderElection: LeaderElection{LeaseName: "gorovod-scheduler", LeaseNamespace: "gorovod-system",
			LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second},
	}
}

func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig()
	if c.Interval == 0 {
		c.Interval = d.Interval
	}
	if c.Policy == "" {
		c.Policy = d.Policy
	}
	if c.EventDelay == 0 {
		c.EventDelay = d.EventDelay
	}
	c.EventDelay = max(c.EventDelay, 0)
	if c.MinRoundGap == 0 {
		c.MinRoundGap = d.MinRoundGap
	}
	c.MinRoundGap = max(c.MinRoundGap, 0)
	if c.RestartPenalty == 0 {
		c.RestartPenalty = d.RestartPenalty
	}
	if c.MaxDriverRestarts == 0 {
		c.MaxDriverRestarts = d.MaxDriverRestarts
	}
	le := &c.LeaderElection
	if le.LeaseName == "" {
		le.LeaseName = d.LeaderElection.LeaseName
	}
	if le.LeaseNamespace == "" {
		le.LeaseNamespace = d.LeaderElection.LeaseNamespace
	}
	if le.LeaseDuration == 0 {
		le.LeaseDuration = d.LeaderElection.LeaseDuration
	}
	if le.RenewDeadline == 0 {
		le.RenewDeadline = d.LeaderElection.RenewDeadline
	}
	if le.RetryPeriod == 0 {
		le.RetryPeriod = d.LeaderElection.RetryPeriod
	}
	switch {
	case c.Interval < 0 || c.RestartPenalty < 0:
		return c, fmt.Errorf("%w: negative interval or restart penalty", ErrInvalidConfig)
	case le.LeaseDuration <= le.RenewDeadline || le.RenewDeadline <= le.RetryPeriod || le.RetryPeriod <= 0:
		return c, fmt.Errorf("%w: want lease duration > renew deadline > retry period > 0, got %v, %v, %v",
			ErrInvalidConfig, le.LeaseDuration, le.RenewDeadline, le.RetryPeriod)
	}
	if _, err := newPolicy(c.Policy, c.RestartPenalty); err != nil {
		return c, err
	}
	if c.Identity == "" {
		host, _ := os.Hostname()
		var b [4]byte
		_, _ = rand.Read(b[:])
		c.Identity = host + "_" + hex.EncodeToString(b[:])
	}
	if c.DriverResources.Requests == nil && c.DriverResources.Limits == nil {
		c.DriverResources = defaultDriverResources()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c, nil
}

// Policies names the policies Config.Policy takes.
var Policies = []string{"pollux", "optimus", "tiresias"}

func newPolicy(name string, penalty time.Duration) (scheduler.Policy, error) {
	switch name {
	case "pollux":
		return scheduler.NewPollux(scheduler.PolluxConfig{RestartPenalty: penalty, NoRestartPenalty: penalty == 0}), nil
	case "optimus":
		return scheduler.NewOptimus(), nil
	case "tiresias":
		return scheduler.NewTiresias(scheduler.TiresiasConfig{}), nil
	}
	return nil, fmt.Errorf("%w: unknown policy %q (want pollux, optimus or tiresias)", ErrInvalidConfig, name)
}

// Service is the scheduler service.
type Service struct {
	cfg  Config
	kube kubernetes.Interface
	dyn  dynamic.Interface

	// Only the leader's term touches what follows.
	policy scheduler.Policy
	// written is what this leader last wrote of each job's scheduler
	// fields (the informer's copy may lag behind its own writes).
	written map[types.UID]api.Status
	// boundNamespaces have the driver's ServiceAccount and RoleBinding.
	boundNamespaces map[string]bool
	// leading says whether writes are still allowed (nil: always).
	leading func() bool
}

// New returns a service on the clients.
func New(cfg Config, kube kubernetes.Interface, dyn dynamic.Interface) (*Service, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Service{cfg: cfg, kube: kube, dyn: dyn}, nil
}

// Identity is this replica's name in the Lease and in status.scheduledBy.
func (s *Service) Identity() string { return s.cfg.Identity }

// roundKey is the work queue's one item: "run a round".
const roundKey = "round"

// Run runs the service until ctx ends: it keeps informers on the jobs, the
// nodes and the driver pods, and, while it leads (always, without leader
// election), runs the scheduling rounds. It returns nil when ctx ends, or the
// error that stopped it (informers that never synced).
func (s *Service) Run(ctx context.Context) error {
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "gorovod-scheduler"})
	defer queue.ShutDown()
	// A change waits EventDelay: the delaying queue keeps one pending
	// round at the earliest time asked, so the changes of a burst share it.
	src, err := s.startInformers(ctx, func() { queue.AddAfter(roundKey, s.cfg.EventDelay) })
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	if !s.cfg.LeaderElection.Enabled {
		s.lead(ctx, src, queue, nil)
		return nil
	}
	le := s.cfg.LeaderElection
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: le.LeaseName, Namespace: le.LeaseNamespace},
		Client:     s.kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: s.cfg.Identity},
	}
	for ctx.Err() == nil {
		var elector *leaderelection.LeaderElector
		// The term's goroutine is started by the elector; closed keeps one
		// that starts after Run returned from leading at all, so that
		// term.Wait covers every term.
		var (
			mu     sync.Mutex
			closed bool
			term   sync.WaitGroup
		)
		elector, err = leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, Name: le.LeaseName,
			LeaseDuration: le.LeaseDuration, RenewDeadline: le.RenewDeadline, RetryPeriod: le.RetryPeriod,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(termCtx context.Context) {
					mu.Lock()
					if closed {
						mu.Unlock()
						return
					}
					term.Add(1)
					mu.Unlock()
					defer term.Done()
					s.cfg.Logger.Info("leading", "identity", s.cfg.Identity)
					s.lead(termCtx, src, queue, elector.IsLeader)
				},
				OnStoppedLeading: func() { s.cfg.Logger.Info("not leading", "identity", s.cfg.Identity) },
			},
		})
		if err != nil {
			return fmt.Errorf("service: leader election: %w", err)
		}
		elector.Run(ctx)
		mu.Lock()
		closed = true
		mu.Unlock()
		// The term's rounds have ended (Run cancels the term's context;
		// wait for its last write to return), then the lease goes.
		term.Wait()
		if ctx.Err() != nil {
			s.release(lock)
		}
	}
	return nil
}

// release gives the lease up when this replica holds it, so that the next
// replica need not wait for it to expire. It runs only after this replica's
// last write has returned.
func (s *Service) release(lock *resourcelock.LeaseLock) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.LeaderElection.RenewDeadline)
	defer cancel()
	rec, _, err := lock.Get(ctx)
	if err != nil || rec.HolderIdentity != s.cfg.Identity {
		return
	}
	now := metav1.NewTime(time.Now())
	rec.HolderIdentity = ""
	rec.LeaseDurationSeconds = 1
	rec.RenewTime, rec.AcquireTime = now, now
	if err := lock.Update(ctx, *rec); err != nil {
		s.cfg.Logger.Warn("releasing the lease", "err", err)
	}
}

// lead runs rounds until ctx ends: at once, every interval, and whenever the
// informers trigger one; never sooner than MinRoundGap after the last one
// ended.
func (s *Service) lead(ctx context.Context, src source, queue workqueue.TypedRateLimitingInterface[string], leading func() bool) {
	s.beginTerm(leading)
	s.cfg.Metrics.leading(true)
	defer s.cfg.Metrics.leading(false)
	queue.Add(roundKey)
	tick := time.NewTicker(s.cfg.Interval)
	defer tick.Stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				queue.Add(roundKey)
			}
		}
	}()
	items := make(chan string)
	go func() {
		defer close(items)
		for {
			key, shutdown := queue.Get()
			if shutdown {
				return
			}
			select {
			case items <- key:
			case <-ctx.Done():
				// The term ended: leave the item to the next one.
				queue.Done(key)
				queue.Add(key)
				return
			}
		}
	}()
	var lastEnd time.Time
	for {
		select {
		case <-ctx.Done():
			<-done
			return
		case key, ok := <-items:
			if !ok {
				<-done
				return
			}
			if !s.awaitGap(ctx, lastEnd) {
				// The term ended: leave the item to the next one.
				queue.Done(key)
				queue.Add(key)
				<-done
				return
			}
			began := time.Now()
			err := s.round(ctx, src)
			lastEnd = time.Now()
			s.cfg.Metrics.round(lastEnd.Sub(began), err)
			queue.Done(key)
			if s.cfg.OnRound != nil {
				s.cfg.OnRound(err)
			}
			switch {
			case err != nil && ctx.Err() == nil:
				s.cfg.Logger.Warn("scheduling round", "err", err)
				queue.AddRateLimited(key)
			case err == nil:
				queue.Forget(key)
			}
		}
	}
}

// awaitGap waits until MinRoundGap has passed since lastEnd (zero: no round
// yet); false when ctx ended first.
func (s *Service) awaitGap(ctx context.Context, lastEnd time.Time) bool {
	if lastEnd.IsZero() {
		return ctx.Err() == nil
	}
	wait := s.cfg.MinRoundGap - time.Since(lastEnd)
	if wait <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// source is where a round reads the cluster: the informers' caches in the
// service, the API directly in tests.
type source interface {
	Jobs() ([]*unstructured.Unstructured, error)
	Nodes() ([]*corev1.Node, error)
	// Pods returns the pods bound to a node that have not ended, of every
	// namespace.
	Pods() ([]*corev1.Pod, error)
	// DriverPod returns a job's driver pod, nil when it does not exist.
	DriverPod(ctx context.Context, namespace, name string) (*corev1.Pod, error)
}

// informerSource reads the informers' caches.
type informerSource struct {
	jobs  []cache.GenericLister
	nodes cache.Indexer
	pods  []cache.Indexer
	// bound are the pods bound to nodes, of every namespace.
	bound cache.Indexer
	kube  kubernetes.Interface
}

func (s *informerSource) Jobs() ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for _, l := range s.jobs {
		objs, err := l.List(labels.Everything())
		if err != nil {
			return nil, err
		}
		for _, o := range objs {
			if u, ok := o.(*unstructured.Unstructured); ok {
				out = append(out, u)
			}
		}
	}
	return out, nil
}

func (s *informerSource) Nodes() ([]*corev1.Node, error) {
	var out []*corev1.Node
	for _, o := range s.nodes.List() {
		if n, ok := o.(*corev1.Node); ok {
			out = append(out, n)
		}
	}
	return out, nil
}

func (s *informerSource) Pods() ([]*corev1.Pod, error) {
	var out []*corev1.Pod
	for _, o := range s.bound.List() {
		if p, ok := o.(*corev1.Pod); ok {
			out = append(out, p)
		}
	}
	return out, nil
}

func (s *informerSource) DriverPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	for _, idx := range s.pods {
		o, ok, err := idx.GetByKey(namespace + "/" + name)
		if err != nil {
			return nil, err
		}
		if ok {
			if p, ok := o.(*corev1.Pod); ok {
				return p, nil
			}
		}
	}
	// Not in the cache: it may be too new for it; ask.
	p, err := s.kube.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return p, err
}

// startInformers starts the informers and waits for their caches; trigger
// is called on every change that calls for a round.
func (s *Service) startInformers(ctx context.Context, trigger func()) (source, error) {
	namespaces := s.cfg.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	src := &informerSource{kube: s.kube}
	var synced []cache.InformerSynced
	jobHandler := cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { trigger() },
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*unstructured.Unstructured)
			c, ok2 := cur.(*unstructured.Unstructured)
			if !ok1 || !ok2 || o.GetGeneration() != c.GetGeneration() {
				trigger()
			}
		},
		DeleteFunc: func(any) { trigger() },
	}
	podHandler := cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*corev1.Pod)
			c, ok2 := cur.(*corev1.Pod)
			if !ok1 || !ok2 || o.Status.Phase != c.Status.Phase {
				trigger()
			}
		},
		DeleteFunc: func(any) { trigger() },
	}
	for _, ns := range namespaces {
		df := dynamicinformer.NewFilteredDynamicSharedInformerFactory(s.dyn, 0, ns, nil)
		ji := df.ForResource(api.GroupVersionResource())
		if _, err := ji.Informer().AddEventHandler(jobHandler); err != nil {
			return nil, err
		}
		src.jobs = append(src.jobs, ji.Lister())
		synced = append(synced, ji.Informer().HasSynced)
		df.Start(ctx.Done())

		pf := informers.NewSharedInformerFactoryWithOptions(s.kube, 0, informers.WithNamespace(ns),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = kube.LabelRole + "=" + RoleDriver }))
		pi := pf.Core().V1().Pods().Informer()
		if _, err := pi.AddEventHandler(podHandler); err != nil {
			return nil, err
		}
		src.pods = append(src.pods, pi.GetIndexer())
		synced = append(synced, pi.HasSynced)
		pf.Start(ctx.Done())
	}
	nf := informers.NewSharedInformerFactory(s.kube, 0)
	ni := nf.Core().V1().Nodes().Informer()
	if _, err := ni.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { trigger() },
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*corev1.Node)
			c, ok2 := cur.(*corev1.Node)
			// Its labels and name decide which jobs may use it.
			if !ok1 || !ok2 || NodeSlots(o) != NodeSlots(c) || !maps.Equal(o.Labels, c.Labels) {
				trigger()
			}
		},
		DeleteFunc: func(any) { trigger() },
	}); err != nil {
		return nil, err
	}
	src.nodes = ni.GetIndexer()
	synced = append(synced, ni.HasSynced)
	nf.Start(ctx.Done())
	// Every namespace's pods on nodes: what they request is not the jobs'
	// to have. A pod bound or ended (it leaves the informer's selection: a
	// delete), or whose requests change, calls for a round, unless it is
	// one of the scheduled jobs' (their driver's changes come from the
	// driver informer, their workers are the allocation's own); EventDelay
	// and MinRoundGap keep a busy cluster's churn from running rounds back
	// to back.
	bf := informers.NewSharedInformerFactoryWithOptions(s.kube, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = "spec.nodeName!=,status.phase!=" + string(corev1.PodSucceeded) + ",status.phase!=" + string(corev1.PodFailed)
	}))
	bi := bf.Core().V1().Pods().Informer()
	if _, err := bi.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if !s.jobsPod(obj) {
				trigger()
			}
		},
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*corev1.Pod)
			c, ok2 := cur.(*corev1.Pod)
			if !ok1 || !ok2 || (!s.jobsPod(c) && !sameSlotRequests(o, c)) {
				trigger()
			}
		},
		DeleteFunc: func(obj any) {
			if !s.jobsPod(obj) {
				trigger()
			}
		},
	}); err != nil {
		return nil, err
	}
	src.bound = bi.GetIndexer()
	synced = append(synced, bi.HasSynced)
	bf.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return nil, errCachesNotSynced
	}
	return src, nil
}

// jobsPod says whether a pod (or a deleted pod's tombstone) is labelled as
// a GorovodJob's in a namespace this service schedules. A pod so labelled
// whose job does not exist is counted as another's by the rounds but calls
// for none: the next timed round sees it.
func (s *Service) jobsPod(obj any) bool {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return false
	}
	if _, ok := p.Labels[kube.LabelJob]; !ok {
		return false
	}
	return len(s.cfg.Namespaces) == 0 || slices.Contains(s.cfg.Namespaces, p.Namespace)
}

// sameSlotRequests says whether two versions of a pod take the same slots
// (its node and what it requests of the resources that take slots).
func sameSlotRequests(a, b *corev1.Pod) bool {
	if a.Spec.NodeName != b.Spec.NodeName {
		return false
	}
	for _, r := range slotResources {
		qa, qb := podRequest(a, r), podRequest(b, r)
		if qa.Cmp(qb) != 0 {
			return false
		}
	}
	return true
}
