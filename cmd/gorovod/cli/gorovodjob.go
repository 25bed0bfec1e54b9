package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/gorovod/gorovod/cluster/kube"
	"github.com/gorovod/gorovod/cluster/kube/api"
	"github.com/gorovod/gorovod/cluster/kube/service"
	"github.com/gorovod/gorovod/cluster/steer"
	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/job"
)

// gorovodJobConfig tunes the driver of a GorovodJob.
type gorovodJobConfig struct {
	// StatusEvery is how often the driver writes the job's world size,
	// step and goodput model into its status (when they changed).
	StatusEvery time.Duration
	// Hold is how long a node whose worker was preempted (a drain, an
	// eviction, someone deleting its pod) gets no new worker while the
	// scheduler's allocation still names it: the scheduler is expected to
	// take it out of the allocation; any change of the allocation ends the
	// hold.
	Hold time.Duration
	// DeliverTimeout bounds the wait for the job to take in a new host list
	// before the world's target moves.
	DeliverTimeout time.Duration
}

func defaultGorovodJobConfig() gorovodJobConfig {
	return gorovodJobConfig{StatusEvery: 3 * time.Second, Hold: time.Minute, DeliverTimeout: 5 * time.Second}
}

// errJobDeleted ends the job when its GorovodJob is deleted.
var errJobDeleted = errors.New("the gorovodjob was deleted: the job is stopped")

// gorovodJobDriver is what `gorovod run --gorovodjob NAME` adds to `gorovod
// run --kubernetes`: it reads the GorovodJob's spec, waits for the gorovod
// scheduler's allocation (status.allocation: a node per worker), places
// each worker pod on a node of it (spec.nodeName) and follows it as it
// changes, live: every entry of the allocation is a host of the job's
// Discovery ("<node>/<k>", one slot each), so that a node taken away stops
// its workers (they leave gracefully: the world moves on without them at a
// committed step), and a node added is where the steering heuristic's
// next worker starts. It writes the job's world size, step and fitted
// goodput model into the GorovodJob's status every few seconds, and ends
// the job when the GorovodJob is deleted.
type gorovodJobDriver struct {
	cfg       gorovodJobConfig
	name      string
	clients   *kubeClients
	spec      api.Spec
	steer     *steer.Steer
	disc      *allocationDiscovery
	report    func(format string, args ...any)
	cancel    context.CancelCauseFunc
	stopWatch chan struct{}
	perNode   int
	publishMu sync.Mutex // one host list and target at a time
	uid       types.UID  // the GorovodJob's
	kl        *kube.Launcher
	// adopting is the record of the running job this driver takes back
	// (gorovodjob_adopt.go), and secret its job secret; nil for a new job.
	adopting *api.Adoption
	secret   []byte

	mu       sync.Mutex
	alloc    []string
	seen     bool                 // the GorovodJob was read
	gone     bool                 // it was deleted
	changed  chan struct{}        // poked on every change of the above
	held     map[string]time.Time // node → end of its hold
	podHost  map[int]string       // launch index → host of its pod
	occupied map[string]int       // host → launch index of its pod, until the pod ends
	last     string               // the status patch last written
	recorded bool                 // status.adoption written
}

// fromGorovodJob says whether a run flag is one --gorovodjob takes from the
// GorovodJob's spec instead.
func fromGorovodJob(flag string) bool {
	switch flag {
	case "np", "min-np", "max-np", "num-proc", "min-num-proc", "max-num-proc", "heuristic", "heuristic-opt",
		"heuristic-config", "replace-stragglers", "kubernetes", "kubernetes-image", "kubernetes-job", "slurm",
		"H", "hosts", "hostfile", "host-discovery-script", "probe-timeout":
		return true
	}
	return false
}

// startGorovodJob connects to the GorovodJob named by --gorovodjob, waits for
// its allocation, and sets the run's options from its spec. The context it
// returns ends when the GorovodJob is deleted (its cause errJobDeleted).
func startGorovodJob(ctx context.Context, o *runOptions, fs *flag.FlagSet, report func(string, ...any)) (context.Context, *gorovodJobDriver, error) {
	var bad []string
	fs.Visit(func(f *flag.Flag) {
		if fromGorovodJob(f.Name) {
			bad = append(bad, "--"+f.Name)
		}
	})
	switch {
	case len(bad) > 0:
		return ctx, nil, usageError{fmt.Sprintf("--gorovodjob takes the workers, image and command from the GorovodJob: drop %s", strings.Join(bad, ", "))}
	case len(o.argv) > 0:
		return ctx, nil, usageError{"--gorovodjob takes the trainer command from the GorovodJob's spec.command: give none"}
	}
	ns := o.cluster.kubeNamespace
	if ns == "" {
		if pod, ok, err := envconfig.LoadKubernetesPod(os.Getenv); err == nil && ok {
			ns = pod.Namespace
		}
	}
	kf := kubeFlags{kubeconfig: o.cluster.kubeconfig, namespace: ns}
	clients, err := kf.connect(ctx)
	if err != nil {
		return ctx, nil, err
	}
	gj, err := clients.getJob(ctx, o.cluster.gorovodJob)
	if err != nil {
		return ctx, nil, err
	}
	if err := gj.Spec.Validate(); err != nil {
		return ctx, nil, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	d := &gorovodJobDriver{cfg: defaultGorovodJobConfig(), name: gj.Name, clients: clients, spec: gj.Spec, report: report,
		cancel: cancel, stopWatch: make(chan struct{}), changed: make(chan struct{}, 1), held: map[string]time.Time{},
		podHost: map[int]string{}, occupied: map[string]int{}, uid: gj.UID}
	d.disc = &allocationDiscovery{delivered: make(chan struct{})}
	if a := gj.Status.Adoption; a != nil && !a.Ended {
		adopt, err := d.takeBack(a)
		if err != nil {
			cancel(err)
			return ctx, nil, err
		}
		o.adopt = adopt
		report("GorovodJob %s/%s: taking running job %s back (its workers' seed %s)", clients.namespace, d.name, a.JobID, a.Seeds[0])
	}
	if err := d.watch(ctx); err != nil {
		cancel(err)
		return ctx, nil, err
	}
	fewest := max(int(gj.Spec.MinWorkers), 1)
	report("GorovodJob %s/%s: waiting for the scheduler's allocation (at least %d workers)", clients.namespace, d.name, fewest)
	alloc, err := d.waitAllocation(ctx, fewest)
	if err != nil {
		d.stop()
		cancel(err)
		return ctx, nil, err
	}
	for _, n := range nodeCounts(alloc) {
		d.perNode = max(d.perNode, n.count)
	}
	var recorded *steer.Recorded
	if o.adopt != nil {
		recorded = recordedGoodput(d.name, gj.Status.Goodput, report)
	}
	st := steer.New(steer.Config{Target: len(alloc), InitBatch: int(gj.Spec.Batch.Initial), WorkersPerNode: d.perNode,
		GrowOnly: true, Allocator: "the gorovod scheduler", Recorded: recorded})
	d.mu.Lock()
	d.steer = st
	d.mu.Unlock()
	d.publish()
	report("GorovodJob %s/%s: allocation %s", clients.namespace, d.name, strings.Join(alloc, ","))

	o.argv = slices.Clone(gj.Spec.Command)
	o.np, o.minNP, o.maxNP = len(alloc), fewest, int(gj.Spec.MaxWorkers)
	if pt := gj.Spec.ProbeTimeout; pt != nil && o.adopt == nil {
		// The driver's, and every worker's (GOROVOD_PROBE_TIMEOUT). A job
		// taken back keeps the one its workers were given (takeBack).
		o.hosts.probeTimeout = seconds(pt.Duration)
	}
	if o.maxNP > 0 {
		o.np = min(o.np, o.maxNP)
	}
	o.cluster.kubernetes, o.cluster.kubeJob, o.cluster.kubeImage, o.cluster.kubeNamespace = true, d.name, gj.Spec.Image, clients.namespace
	o.cluster.gorovodJobDriver = d
	return ctx, d, nil
}

// usageError is a bad command line found after the flags were parsed.
type usageError struct{ msg string }

func (u usageError) Error() string { return u.msg }

// watch reads the GorovodJob and follows it: a get, then a watch from its
// resource version (restarted after a lost connection; after an expired
// version, from a fresh get) — only get and watch, what the driver's Role
// allows (no list: it may see no other job).
func (d *gorovodJobDriver) watch(ctx context.Context) error {
	u, err := d.clients.jobs(d.clients.namespace).Get(ctx, d.name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("gorovodjob %s: %w", d.name, d.clients.apiError(err))
	}
	d.observe(u)
	wctx, cancel := context.WithCancel(ctx)
	go func() {
		<-d.stopWatch
		cancel()
	}()
	go d.follow(wctx, u.GetResourceVersion())
	return nil
}

// follow watches the GorovodJob from resource version rv until ctx ends or
// the job is deleted.
func (d *gorovodJobDriver) follow(ctx context.Context, rv string) {
	jobs := d.clients.jobs(d.clients.namespace)
	lw := &cache.ListWatch{WatchFunc: func(o metav1.ListOptions) (watch.Interface, error) {
		o.FieldSelector = "metadata.name=" + d.name
		return jobs.Watch(ctx, o)
	}}
	for ctx.Err() == nil {
		rw, err := watchtools.NewRetryWatcher(rv, lw)
		if err != nil {
			d.report("watching gorovodjob %s: %v", d.name, err)
			return
		}
		expired := false
		for !expired {
			select {
			case <-ctx.Done():
				rw.Stop()
				return
			case ev, ok := <-rw.ResultChan():
				if !ok {
					expired = true
					break
				}
				switch ev.Type {
				case watch.Added, watch.Modified:
					d.observe(ev.Object)
				case watch.Deleted:
					rw.Stop()
					d.deleted()
					return
				case watch.Error:
					expired = true
				}
			}
		}
		rw.Stop()
		// Start again from what the job is now.
		retry := time.NewTimer(time.Second)
		select {
		case <-ctx.Done():
			retry.Stop()
			return
		case <-retry.C:
		}
		gctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		u, err := jobs.Get(gctx, d.name, metav1.GetOptions{})
		cancel()
		switch {
		case apierrors.IsNotFound(err):
			d.deleted()
			return
		case err != nil:
			d.report("reading gorovodjob %s: %v", d.name, d.clients.apiError(err))
			continue // from the same version
		}
		d.observe(u)
		rv = u.GetResourceVersion()
	}
}

// deleted ends the job: its GorovodJob is gone.
func (d *gorovodJobDriver) deleted() {
	d.mu.Lock()
	d.gone = true
	d.mu.Unlock()
	d.poke()
	d.report("GorovodJob %s/%s was deleted: stopping the job", d.clients.namespace, d.name)
	d.cancel(errJobDeleted)
}

// stop ends the watch and the context startGorovodJob returned, once the
// job is over.
func (d *gorovodJobDriver) stop() {
	select {
	case <-d.stopWatch:
	default:
		close(d.stopWatch)
	}
	d.cancel(nil)
}

func (d *gorovodJobDriver) poke() {
	select {
	case d.changed <- struct{}{}:
	default:
	}
}

// observe takes in a new version of the GorovodJob.
func (d *gorovodJobDriver) observe(obj any) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	gj, err := api.FromUnstructured(u)
	if err != nil {
		d.report("reading gorovodjob %s: %v", d.name, err)
		return
	}
	d.mu.Lock()
	d.seen = true
	changed := !slices.Equal(d.alloc, gj.Status.Allocation)
	if changed {
		d.alloc = slices.Clone(gj.Status.Allocation)
		clear(d.held) // the scheduler decided again
	}
	started := d.steer != nil
	d.mu.Unlock()
	if !changed {
		return
	}
	d.poke()
	if started {
		d.report("the gorovod scheduler allocates %d workers: %s", len(gj.Status.Allocation), strings.Join(gj.Status.Allocation, ","))
		d.publish()
	}
}

// waitAllocation waits until the allocation names at least min workers.
func (d *gorovodJobDriver) waitAllocation(ctx context.Context, min int) ([]string, error) {
	for {
		d.mu.Lock()
		alloc, gone := slices.Clone(d.alloc), d.gone
		d.mu.Unlock()
		switch {
		case gone:
			return nil, fmt.Errorf("gorovodjob %s: %w", d.name, errJobDeleted)
		case len(alloc) >= min:
			return alloc, nil
		}
		select {
		case <-d.changed:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

type nodeCount struct {
	node  string
	count int
}

// nodeCounts are the allocation's nodes in the order they first appear,
// with the workers of each.
func nodeCounts(alloc []string) []nodeCount {
	var out []nodeCount
	for _, n := range alloc {
		i := slices.IndexFunc(out, func(c nodeCount) bool { return c.node == n })
		if i < 0 {
			out = append(out, nodeCount{node: n})
			i = len(out) - 1
		}
		out[i].count++
	}
	return out
}

// slotHost is the job's host for the k-th worker on node; slotNode is its
// inverse. Node names are DNS subdomains: no '/'.
func slotHost(node string, k int) string { return fmt.Sprintf("%s/%d", node, k) }

func slotNode(host string) string {
	if i := strings.LastIndexByte(host, '/'); i >= 0 {
		return host[:i]
	}
	return host
}

// publish hands the job its hosts and moves the world's target to their
// count. A node's hosts are as many as the allocation names it, those of its
// running workers first (a node named fewer times stops only the workers
// beyond the count; one named as often keeps them all); a node on hold keeps
// only its running workers' hosts.
func (d *gorovodJobDriver) publish() {
	d.publishMu.Lock()
	defer d.publishMu.Unlock()
	d.mu.Lock()
	hosts, next := slotHosts(d.alloc, d.occupied, d.held, time.Now())
	d.mu.Unlock()
	if !next.IsZero() {
		time.AfterFunc(time.Until(next)+time.Millisecond, d.publish)
	}
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.DeliverTimeout)
	defer cancel()
	// The job takes the hosts in before the target moves: a grow finds its
	// new slot, and a node taken away stops its workers itself (the
	// heuristic never shrinks: it would pick the newest workers).
	if err := d.disc.set(ctx, hosts); err != nil {
		d.report("the job did not take in the new hosts within %v", d.cfg.DeliverTimeout)
	}
	target := len(hosts)
	if d.spec.MaxWorkers > 0 {
		target = min(target, int(d.spec.MaxWorkers))
	}
	d.steer.SetTarget(target)
}

// slotHosts are the job's hosts for an allocation (see publish), given the
// hosts of running workers and the nodes on hold; next is when the first
// hold ends (zero: none).
func slotHosts(alloc []string, occupied map[string]int, held map[string]time.Time, now time.Time) (hosts []job.Host, next time.Time) {
	for _, c := range nodeCounts(alloc) {
		var names []string
		for host := range occupied {
			if slotNode(host) == c.node {
				names = append(names, host)
			}
		}
		slices.SortFunc(names, func(a, b string) int { return slotIndex(a) - slotIndex(b) })
		names = names[:min(len(names), c.count)]
		if until, ok := held[c.node]; ok && now.Before(until) {
			if next.IsZero() || until.Before(next) {
				next = until
			}
		} else {
			for k := 0; len(names) < c.count; k++ {
				if h := slotHost(c.node, k); !slices.Contains(names, h) {
					names = append(names, h)
				}
			}
		}
		slices.SortFunc(names, func(a, b string) int { return slotIndex(a) - slotIndex(b) })
		for _, h := range names {
			hosts = append(hosts, job.Host{Name: h, Slots: 1})
		}
	}
	return hosts, next
}

// slotIndex is k of a host <node>/<k>.
func slotIndex(host string) int {
	k, err := strconv.Atoi(host[strings.LastIndexByte(host, '/')+1:])
	if err != nil {
		return -1
	}
	return k
}

// configure sets what the GorovodJob says of its worker pods.
func (d *gorovodJobDriver) configure(kc *kube.Config) {
	kc.Env = append(kc.Env, d.spec.Env...)
	kc.Resources = workerResources(d.spec.Resources)
	kc.NodeName = slotNode
	// The taints of the GPU and slot nodes, which the scheduler counts as
	// tolerated (service.WorkerTolerations); the template's own come too.
	customize := kc.Customize
	kc.Customize = func(pod *corev1.Pod) {
		for _, t := range slices.Concat(service.WorkerTolerations, d.spec.Tolerations) {
			if !slices.ContainsFunc(pod.Spec.Tolerations, func(have corev1.Toleration) bool { return have.MatchToleration(&t) }) {
				pod.Spec.Tolerations = append(pod.Spec.Tolerations, t)
			}
		}
		pinWorker(pod, d.spec)
		if customize != nil {
			customize(pod)
		}
	}
	onEvent := kc.OnEvent
	kc.OnEvent = func(e kube.Event) {
		d.podEvent(e)
		if onEvent != nil {
			onEvent(e)
		}
	}
}

// pinWorker gives a worker pod the job's node selection, added to what the
// pod template has: the kubelet of a node the pod is bound to
// (spec.nodeName) admits it only where the node matches both, as the
// scheduler's allocation does. The job's node preferences are added to the
// template's too (the pod is bound by the gorovod scheduler, which placed
// it by them; they tell a reader of the pod what the job asked for).
func pinWorker(pod *corev1.Pod, spec api.Spec) {
	if len(spec.NodeSelector) > 0 {
		if pod.Spec.NodeSelector == nil {
			pod.Spec.NodeSelector = map[string]string{}
		}
		maps.Copy(pod.Spec.NodeSelector, spec.NodeSelector)
	}
	required := spec.RequiredNodeAffinity
	if required == nil && len(spec.PreferredNodeAffinity) == 0 {
		return
	}
	if pod.Spec.Affinity == nil {
		pod.Spec.Affinity = &corev1.Affinity{}
	}
	if pod.Spec.Affinity.NodeAffinity == nil {
		pod.Spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	na := pod.Spec.Affinity.NodeAffinity
	// Preferences add up: the job's terms go after the template's.
	for _, t := range spec.PreferredNodeAffinity {
		na.PreferredDuringSchedulingIgnoredDuringExecution = append(na.PreferredDuringSchedulingIgnoredDuringExecution, *t.DeepCopy())
	}
	if required == nil {
		return
	}
	own := na.RequiredDuringSchedulingIgnoredDuringExecution
	if own == nil || len(own.NodeSelectorTerms) == 0 {
		na.RequiredDuringSchedulingIgnoredDuringExecution = required.DeepCopy()
		return
	}
	// Terms are ORed, a term's requirements ANDed: both selections hold
	// where some pair of terms, one of each, holds together.
	var both []corev1.NodeSelectorTerm
	for _, a := range own.NodeSelectorTerms {
		for _, b := range required.NodeSelectorTerms {
			both = append(both, corev1.NodeSelectorTerm{
				MatchExpressions: slices.Concat(a.MatchExpressions, b.MatchExpressions),
				MatchFields:      slices.Concat(a.MatchFields, b.MatchFields),
			})
		}
	}
	na.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{NodeSelectorTerms: both}
}

// workerResources are a worker's resources: the spec's, with one
// gorovod.io/slot (the extended resource a node without GPUs advertises for
// its worker slots, docs/clusters.md) where they ask for neither a GPU nor
// a slot.
func workerResources(r corev1.ResourceRequirements) corev1.ResourceRequirements {
	r = *r.DeepCopy()
	for _, name := range []corev1.ResourceName{api.GPUResource, api.SlotResource} {
		if _, ok := r.Limits[name]; ok {
			return r
		}
		if _, ok := r.Requests[name]; ok {
			return r
		}
	}
	if r.Limits == nil {
		r.Limits = corev1.ResourceList{}
	}
	if r.Requests == nil {
		r.Requests = corev1.ResourceList{}
	}
	// Extended resources are requested as much as limited.
	r.Limits[api.SlotResource] = resource.MustParse("1")
	r.Requests[api.SlotResource] = resource.MustParse("1")
	return r
}

// placed wraps the job's launcher to know each worker's node.
type placedLauncher struct {
	job.Launcher
	d *gorovodJobDriver
}

func (p placedLauncher) Launch(ctx context.Context, r job.LaunchRequest) (job.Process, error) {
	p.d.mu.Lock()
	p.d.podHost[r.Index] = r.Host
	p.d.occupied[r.Host] = r.Index
	p.d.mu.Unlock()
	proc, err := p.Launcher.Launch(ctx, r)
	if err != nil {
		p.d.vacate(r.Index)
	}
	return proc, err
}

// vacate frees the host of worker index once its pod has ended.
func (d *gorovodJobDriver) vacate(index int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if host, ok := d.podHost[index]; ok && d.occupied[host] == index {
		delete(d.occupied, host)
	}
}

// podEvent reports a worker pod its node did not admit yet, frees the host of
// a worker whose pod ended, and puts the node of a preempted worker on hold: the hosts are published again without the
// node's free ones (for every pod of the node that ends while it is held).
func (d *gorovodJobDriver) podEvent(e kube.Event) {
	if e.Kind == kube.PodRejected {
		// The slot's previous pod (this job's or another's) is still
		// terminating: the launcher makes the pod again.
		d.report("worker pod %s not admitted yet: %s", e.Pod, e.Reason)
		return
	}
	ended := e.Kind == kube.PodEnded || e.Kind == kube.PodDeleted || e.Kind == kube.PodGaveUp
	if !ended {
		return
	}
	d.vacate(e.Index)
	d.mu.Lock()
	host, ok := d.podHost[e.Index]
	node := slotNode(host)
	heldNow := ok && time.Now().Before(d.held[node])
	fresh := ok && e.Preempted && e.Kind != kube.PodGaveUp && !heldNow
	if fresh {
		d.held[node] = time.Now().Add(d.cfg.Hold)
	}
	d.mu.Unlock()
	if fresh {
		d.report("worker pod %s on node %s was preempted: no new worker there for %v unless the allocation changes", e.Pod, node, d.cfg.Hold)
	}
	if fresh || heldNow {
		go d.publish() // not on the pod watch's goroutine: publish waits for the job
	}
}

// started records what a replacement driver needs (status.adoption), then
// writes the job's status every StatusEvery until the job ends, and once
// more then.
func (d *gorovodJobDriver) started(ctx context.Context, j *job.Job, minWorkers int, probeTimeout time.Duration) {
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	d.writeAdoption(actx, j.ID(), []string{j.DriverAddr()}, minWorkers, probeTimeout)
	cancel()
	go func() {
		t := time.NewTicker(d.cfg.StatusEvery)
		defer t.Stop()
		for {
			select {
			case <-j.Done():
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				d.writeStatus(cctx, j)
				cancel()
				return
			case <-ctx.Done():
				return
			case <-t.C:
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				d.writeStatus(cctx, j)
				cancel()
			}
		}
	}()
}

// writeStatus patches status.worldSize, status.step, status.goodput and,
// once the adoption record is written, status.adoption.workers (a JSON
// merge patch of the status subresource with only those fields: the
// scheduler's are left alone) when they changed.
func (d *gorovodJobDriver) writeStatus(ctx context.Context, j *job.Job) {
	st := j.Status()
	fields := map[string]any{"worldSize": st.Workers, "step": st.Step}
	d.mu.Lock()
	recorded := d.recorded
	d.mu.Unlock()
	if ws := j.WorkerGossipAddrs(); recorded && len(ws) > 0 {
		// Where a replacement at another address finds the workers.
		fields["adoption"] = map[string]any{"workers": ws}
	}
	if f := d.steer.Model(); f.OK {
		fields["goodput"] = api.GoodputStatus{Model: f.Model, MaxProfiledWorkers: int32(f.MaxProfiled),
			WorkersPerNode: int32(max(d.perNode, 1)), FittedAt: metav1.NewTime(f.At), Profile: goodputProfile(f.Profile)}
	}
	body, err := json.Marshal(map[string]any{"status": fields})
	if err != nil {
		d.report("gorovodjob status: %v", err)
		return
	}
	d.mu.Lock()
	same := d.last == string(body)
	d.mu.Unlock()
	if same {
		return
	}
	_, err = d.clients.jobs(d.clients.namespace).Patch(ctx, d.name, types.MergePatchType, body, metav1.PatchOptions{}, "status")
	switch {
	case apierrors.IsNotFound(err):
		return // deleted: the watch ends the job
	case err != nil:
		d.report("writing gorovodjob %s's status: %v", d.name, d.clients.apiError(err))
		return
	}
	d.mu.Lock()
	d.last = string(body)
	d.mu.Unlock()
}

// allocationDiscovery is the job's Discovery: the hosts publish sets.
type allocationDiscovery struct {
	mu        sync.Mutex
	hosts     []job.Host
	version   int
	given     int  // the version found last took
	running   bool // Discover is running
	wake      chan struct{}
	delivered chan struct{} // closed (and replaced) when found took a list
}

// set replaces the host list and, while the job discovers, waits until it
// has taken it in (or ctx ends).
func (a *allocationDiscovery) set(ctx context.Context, hosts []job.Host) error {
	a.mu.Lock()
	a.hosts = slices.Clone(hosts)
	a.version++
	v, running, wake := a.version, a.running, a.wake
	a.mu.Unlock()
	if !running {
		return nil
	}
	select {
	case wake <- struct{}{}:
	default:
	}
	for {
		a.mu.Lock()
		done, delivered := a.given >= v || !a.running, a.delivered
		a.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-delivered:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// tookLocked records that found took version v and wakes set's waiters
// (under mu).
func (a *allocationDiscovery) tookLocked(v int) {
	a.given = max(a.given, v)
	close(a.delivered)
	a.delivered = make(chan struct{})
}

// Discover implements job.Discovery.
func (a *allocationDiscovery) Discover(ctx context.Context, found func([]job.Host)) error {
	a.mu.Lock()
	a.running, a.wake = true, make(chan struct{}, 1)
	wake := a.wake
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.running = false
		a.tookLocked(0)
		a.mu.Unlock()
	}()
	for {
		a.mu.Lock()
		hosts, v, fresh := slices.Clone(a.hosts), a.version, a.version > a.given
		a.mu.Unlock()
		if fresh {
			found(hosts)
			a.mu.Lock()
			a.tookLocked(v)
			a.mu.Unlock()
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return nil
		}
	}
}
