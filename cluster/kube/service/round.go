package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gorovod/gorovod/cluster/kube/api"
	"github.com/gorovod/gorovod/cluster/scheduler"
	"github.com/gorovod/gorovod/heuristics/goodput"
)

// errNotLeading stops a round whose replica lost the lease.
var errNotLeading = errors.New("service: not the leader")

// beginTerm resets what a leader keeps between rounds: a new leader starts
// from the API alone.
func (s *Service) beginTerm(leading func() bool) {
	s.policy, _ = newPolicy(s.cfg.Policy, s.cfg.RestartPenalty)
	s.written = nil
	s.boundNamespaces = map[string]bool{}
	s.leading = leading
}

// seed reads every job's status from the API server (not the cache, which
// may lag behind the previous leader's last writes).
func (s *Service) seed(ctx context.Context) error {
	namespaces := s.cfg.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	written := map[types.UID]api.Status{}
	for _, ns := range namespaces {
		list, err := s.dyn.Resource(api.GroupVersionResource()).Namespace(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return fmt.Errorf("service: listing gorovodjobs: %w", err)
		}
		for i := range list.Items {
			if j, err := api.FromUnstructured(&list.Items[i]); err == nil {
				written[j.UID] = schedulerFields(j.Status)
			}
		}
	}
	s.written = written
	return nil
}

// schedulerFields is the part of a status the scheduler writes.
func schedulerFields(st api.Status) api.Status {
	return api.Status{Phase: st.Phase, Message: st.Message, Allocation: slices.Clone(st.Allocation),
		Reallocations: st.Reallocations, Driver: st.Driver, DriverRestarts: st.DriverRestarts, SubmitTime: st.SubmitTime, StartTime: st.StartTime,
		CompletionTime: st.CompletionTime, ObservedGeneration: st.ObservedGeneration, ScheduledBy: st.ScheduledBy,
		AllocationTime: st.AllocationTime, AttainedWorkerSeconds: st.AttainedWorkerSeconds}
}

// entry is one job in a round.
type entry struct {
	job *api.GorovodJob
	id  string     // namespace/name: the policy's job ID
	old api.Status // the scheduler's fields as last written
	st  api.Status // as this round leaves them
	// For a job its spec keeps on some nodes (api.Spec.Pinned), or one
	// that may not use some of the round's nodes for their kind of slots
	// (SlotKind.Fits): which nodes of the round's cluster it may use, by
	// index, and how many of all the cluster's nodes (those without free
	// slots too) match it; for its messages, those nodes (where: "the N
	// <where>") and the clause that says there is none ("no <none>").
	eligible    []bool
	matching    int
	where, none string
	// For a job with spec.preferredNodeAffinity: each node's score (the
	// summed weights of the terms it matches), by index in the round's
	// cluster.
	preference []int
	// stranded: a running job its matching nodes cannot hold at its
	// minimum (their labels changed) keeps its minimum where it is
	// (allocate); this round's message says so.
	stranded bool
}

// round is one scheduling round (see the package comment).
func (s *Service) round(ctx context.Context, src source) error {
	if s.written == nil {
		if err := s.seed(ctx); err != nil {
			return err
		}
	}
	now := s.cfg.Now()
	stamp := metav1.NewTime(now.Truncate(time.Second))
	objs, err := src.Jobs()
	if err != nil {
		return err
	}
	nodes, err := src.Nodes()
	if err != nil {
		return err
	}
	pods, err := src.Pods()
	if err != nil {
		return err
	}
	scheduled := make(map[string]bool, len(objs))
	for _, u := range objs {
		scheduled[u.GetNamespace()+"/"+u.GetName()] = true
	}
	names, cluster := clusterOf(nodes, OthersRequests(pods, oursIn(scheduled)))
	index := make(map[string]int, len(names))
	for i, n := range names {
		index[n] = i
	}
	var active, changed []*entry
	seen := make(map[types.UID]bool, len(objs))
	for _, u := range objs {
		seen[u.GetUID()] = true
		e, err := s.entryOf(u)
		if err != nil {
			if err := s.failUnreadable(ctx, u, err); err != nil {
				return err
			}
			continue
		}
		if e.st.Phase.Ended() || e.job.DeletionTimestamp != nil {
			continue
		}
		if err := e.job.Spec.Validate(); err != nil {
			end(e, api.PhaseFailed, err.Error(), stamp)
			changed = append(changed, e)
			if err := s.stopDriver(ctx, e); err != nil {
				return err
			}
			continue
		}
		if e.st.Phase == "" {
			e.st.Phase = api.PhasePending
		}
		if e.st.SubmitTime == nil {
			t := metav1.NewTime(e.job.CreationTimestamp.Time)
			e.st.SubmitTime = &t
		}
		if e.st.Phase == api.PhaseRunning && e.st.Driver != "" {
			pod, err := src.DriverPod(ctx, e.job.Namespace, e.st.Driver)
			if err != nil {
				return fmt.Errorf("service: driver pod of %s: %w", e.id, err)
			}
			phase, msg := api.Phase(""), ""
			if pod == nil {
				phase, msg = api.PhaseFailed, fmt.Sprintf("driver pod %s was deleted", e.st.Driver)
			} else {
				phase, msg = driverEnd(pod)
			}
			if phase != "" && driverKilled(pod) {
				replaced, err := s.replaceDriver(ctx, e, msg)
				if err != nil {
					return err
				}
				if replaced {
					active = append(active, e)
					continue
				}
			}
			if phase != "" {
				end(e, phase, msg, stamp)
				changed = append(changed, e)
				if err := s.stopWorkers(ctx, e); err != nil {
					return err
				}
				continue
			}
		}
		active = append(active, e)
	}
	if err := eligibleNodes(active, nodes, names); err != nil {
		return err
	}
	slices.SortFunc(active, func(a, b *entry) int {
		if a.job.Spec.Priority != b.job.Spec.Priority {
			return int(b.job.Spec.Priority) - int(a.job.Spec.Priority)
		}
		if c := a.st.SubmitTime.Compare(b.st.SubmitTime.Time); c != 0 {
			return c
		}
		return compareStrings(a.id, b.id)
	})
	placed, err := s.allocate(ctx, now, active, names, index, cluster)
	if err != nil {
		return err
	}
	for _, e := range active {
		alloc := make([]string, len(placed[e.id]))
		for k, n := range placed[e.id] {
			alloc[k] = names[n]
		}
		if e.st.Phase == api.PhasePending && len(alloc) > 0 {
			if err := s.writable(ctx); err != nil {
				return err
			}
			if err := s.startDriver(ctx, e.job); err != nil {
				s.cfg.Logger.Warn("starting a driver", "job", e.id, "err", err)
				e.st.Message = "starting the driver pod: " + err.Error()
				changed = append(changed, e)
				continue
			}
			e.st.Phase, e.st.Driver, e.st.StartTime = api.PhaseRunning, DriverPodName(e.job.Name), &stamp
		}
		setAllocation(e, alloc, stamp)
		e.st.Message = ""
		switch {
		case len(alloc) == 0:
			e.st.Message = waitingReason(e, cluster, placed)
		case e.stranded:
			e.st.Message = strandedReason(e, cluster, len(alloc))
		}
		changed = append(changed, e)
	}
	for _, e := range changed {
		if err := s.write(ctx, e); err != nil {
			return err
		}
	}
	for uid := range s.written {
		if !seen[uid] {
			delete(s.written, uid) // the job was deleted
		}
	}
	if s.cfg.Metrics != nil {
		byPhase := map[api.Phase]int{}
		for _, st := range s.written {
			byPhase[st.Phase]++
		}
		slots, allocated := 0, 0
		for _, k := range cluster.GPUs {
			slots += k
		}
		for _, e := range active {
			allocated += len(placed[e.id])
		}
		s.cfg.Metrics.state(byPhase, slots, allocated)
	}
	return nil
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// entryOf reads a job and the scheduler's fields as last written.
func (s *Service) entryOf(u *unstructured.Unstructured) (*entry, error) {
	j, err := api.FromUnstructured(u)
	if err != nil {
		return nil, err
	}
	e := &entry{job: j, id: j.Namespace + "/" + j.Name}
	if w, ok := s.written[j.UID]; ok {
		e.old = w
	} else {
		e.old = schedulerFields(j.Status)
	}
	e.st = schedulerFields(e.old)
	return e, nil
}

// allocate asks the policy and makes its answer one the jobs can be given:
// the placement of each job's workers by node index.
func (s *Service) allocate(ctx context.Context, now time.Time, active []*entry, names []string, index map[string]int, cluster scheduler.Cluster) (scheduler.Allocation, error) {
	current := scheduler.Allocation{}
	for _, e := range active {
		for _, n := range e.st.Allocation {
			if k, ok := index[n]; ok {
				current[e.id] = append(current[e.id], k)
			}
		}
	}
	// A running job whose matching nodes can no longer hold its minimum
	// keeps its minimum where it is (keepStranded); the others share the
	// rest. Such a job stays in the policy's view, eligible nowhere, so
	// that a policy's own record of it (Tiresias's queues) goes on.
	kept, cluster := keepStranded(active, current, cluster)
	slots := cluster.TotalGPUs()
	jobs := make([]scheduler.Job, len(active))
	ids := make([]string, len(active))
	perNode := slices.Max(append(slices.Clone(cluster.GPUs), 1))
	for i, e := range active {
		ids[i] = e.id
		jobs[i] = describe(e, now, perNode)
		jobs[i].Eligible = e.eligible
		jobs[i].Preference = e.preference
		if e.stranded {
			jobs[i].Eligible = make([]bool, len(cluster.GPUs))
		}
	}
	proposed := scheduler.Allocation{}
	if len(cluster.GPUs) > 0 && len(active) > 0 {
		var err error
		proposed, err = s.policy.Allocate(ctx, onPolicyClock(now), jobs, cluster, current)
		if err != nil {
			return nil, fmt.Errorf("service: %s: %w", s.policy.Name(), err)
		}
	}
	want := make([]int, len(active))
	floor := make([]int, len(active))
	running := make([]bool, len(active))
	eligible := map[string][]bool{}
	preference := map[string][]int{}
	maxPerNode := map[string]int{}
	for i, e := range active {
		if e.preference != nil {
			preference[e.id] = e.preference
		}
		perNode := int(e.job.Spec.MaxWorkersPerNode)
		if perNode > 0 {
			maxPerNode[e.id] = perNode
		}
		limit := slots
		if m := int(e.job.Spec.MaxWorkers); m > 0 {
			limit = min(limit, m)
		}
		floor[i] = int(e.job.Spec.MinWorkers)
		running[i] = e.st.Phase == api.PhaseRunning
		if e.stranded {
			// Its workers are kept apart (kept), outside slots.
			eligible[e.id] = jobs[i].Eligible
			floor[i], limit = 0, 0
		} else if e.eligible != nil || perNode > 0 {
			if e.eligible != nil {
				eligible[e.id] = e.eligible
			}
			room := scheduler.CapacityFor(cluster, e.eligible, perNode)
			limit = min(limit, room)
			if !running[i] && room < floor[i] {
				// Its nodes cannot hold its minimum (at its cap per
				// node): it waits, and the counts' repair must not
				// admit it (its floor would fit the cluster, not its
				// nodes).
				floor[i] = 0
				limit = 0
			}
		}
		want[i] = min(len(proposed[e.id]), limit)
	}
	counts := scheduler.RepairCounts(ids, want, floor, running, slots)
	proposed, order := scheduler.KeepOneCurrent(ids, counts, proposed, current)
	placed := scheduler.PlaceCounts(cluster, order, counts, proposed, current, eligible, preference, maxPerNode)
	if runningShort(active, counts, placed) {
		// A waiting job's proposal took slots a running job needs to
		// keep its minimum: a pinned or capped job needs them on
		// particular nodes, which the counts alone do not see. The
		// running jobs are placed first, then the others on what is
		// left (those that do not reach their minimum there wait).
		var first, rest []string
		for _, id := range order {
			if running[slices.Index(ids, id)] {
				first = append(first, id)
			} else {
				rest = append(rest, id)
			}
		}
		placed = scheduler.PlaceCounts(cluster, first, counts, proposed, current, eligible, preference, maxPerNode)
		left := scheduler.Cluster{GPUs: slices.Clone(cluster.GPUs)}
		for _, nodes := range placed {
			for _, n := range nodes {
				left.GPUs[n]--
			}
		}
		maps.Copy(placed, scheduler.PlaceCounts(left, rest, counts, proposed, current, eligible, preference, maxPerNode))
	}
	for id, nodes := range kept {
		placed[id] = nodes
	}
	for _, e := range active {
		// Counts fit the cluster's slots, but a pinned or capped job's
		// nodes may be taken by others: a job that would start below its
		// minimum does
		// not start (it waits for the next round).
		if e.st.Phase != api.PhaseRunning && len(placed[e.id]) < int(e.job.Spec.MinWorkers) {
			delete(placed, e.id)
		}
	}
	return placed, nil
}

// runningShort says whether a running job was placed below its minimum
// though its count holds it.
func runningShort(active []*entry, counts map[string]int, placed scheduler.Allocation) bool {
	for _, e := range active {
		floor := int(e.job.Spec.MinWorkers)
		if e.st.Phase == api.PhaseRunning && counts[e.id] >= floor && len(placed[e.id]) < floor {
			return true
		}
	}
	return false
}

// keepStranded finds the running jobs whose matching nodes (all of them,
// free or not) hold fewer slots than their minimum, at their cap per node
// (spec.maxWorkersPerNode) where they have one: their labels changed, or
// nodes left, while the job ran. As Kubernetes leaves a running pod on a node whose
// labels no longer match (IgnoredDuringExecution), such a job keeps its
// minimum on the nodes it holds, its workers on matching nodes first, then
// those on the others (each node's in turn, the most first), and gets no
// worker it does not have: a new worker pod on a node that does not match
// would be refused by its kubelet. It returns the jobs' kept placements and
// the cluster less the slots they keep; it marks the jobs stranded. A job
// whose nodes left gets what is left of them (it may be fewer than its
// minimum, as for any job whose nodes leave).
func keepStranded(active []*entry, current scheduler.Allocation, cluster scheduler.Cluster) (scheduler.Allocation, scheduler.Cluster) {
	kept := scheduler.Allocation{}
	left := scheduler.Cluster{GPUs: slices.Clone(cluster.GPUs)}
	for _, e := range active {
		floor := int(e.job.Spec.MinWorkers)
		perNode := int(e.job.Spec.MaxWorkersPerNode)
		if e.st.Phase != api.PhaseRunning || (e.eligible == nil && perNode == 0) || len(current[e.id]) == 0 ||
			scheduler.CapacityFor(cluster, e.eligible, perNode) >= floor {
			continue
		}
		e.stranded = true
		held := map[int]int{}
		for _, n := range current[e.id] {
			held[n]++
		}
		order := slices.Sorted(maps.Keys(held))
		slices.SortStableFunc(order, func(a, b int) int {
			if ea, eb := e.eligible == nil || e.eligible[a], e.eligible == nil || e.eligible[b]; ea != eb {
				if ea {
					return -1
				}
				return 1
			}
			return held[b] - held[a]
		})
		var nodes []int
		for _, n := range order {
			for k := 0; k < held[n] && (perNode == 0 || k < perNode) && left.GPUs[n] > 0 && len(nodes) < floor; k++ {
				nodes = append(nodes, n)
				left.GPUs[n]--
			}
		}
		slices.Sort(nodes)
		kept[e.id] = nodes
	}
	return kept, left
}

// eligibleNodes sets the eligible nodes (by index in names, the round's
// cluster) of each job its spec keeps on some nodes or that may not use
// some of them for their kind of slots, and how many of all the nodes
// match it; and the nodes' scores for each job with node preferences.
func eligibleNodes(active []*entry, nodes []*corev1.Node, names []string) error {
	byName := make(map[string]*corev1.Node, len(nodes))
	kinds := make(map[string]SlotKind, len(nodes))
	for _, n := range nodes {
		byName[n.Name], kinds[n.Name] = n, KindOf(n)
	}
	for _, e := range active {
		if e.job.Spec.Prefers() {
			score, err := e.job.Spec.NodePreference()
			if err != nil {
				return fmt.Errorf("service: %s: %w", e.id, err) // Validate passed: not reached
			}
			e.preference = make([]int, len(names))
			for i, name := range names {
				e.preference[i] = score(byName[name].Labels, name)
			}
		}
		gpus := e.job.Spec.WantsGPUs()
		restricted := slices.ContainsFunc(names, func(name string) bool { return !kinds[name].Fits(gpus) })
		pinned := e.job.Spec.Pinned()
		if !pinned && !restricted {
			continue
		}
		match := func(map[string]string, string) bool { return true }
		if pinned {
			var err error
			if match, err = e.job.Spec.NodeMatcher(); err != nil {
				return fmt.Errorf("service: %s: %w", e.id, err) // Validate passed: not reached
			}
		}
		// A node counts for a job restricted by kind only if it has
		// slots of the job's kind (a node without slots fits any job).
		fits := func(n *corev1.Node) bool {
			k := kinds[n.Name]
			return !restricted || (k != NoSlots && k.Fits(gpus))
		}
		e.eligible = make([]bool, len(names))
		for i, name := range names {
			n := byName[name]
			e.eligible[i] = fits(n) && match(n.Labels, name)
		}
		for _, n := range nodes {
			if fits(n) && match(n.Labels, n.Name) {
				e.matching++
			}
		}
		e.where, e.none = eligibleText(pinned, restricted, gpus)
	}
	return nil
}

// eligibleText names the nodes a job may use, for its messages: where,
// plural, and none, the clause after "no" when there is none.
func eligibleText(pinned, restricted, gpus bool) (where, none string) {
	const selectors = "spec.nodeSelector and spec.requiredNodeAffinity"
	kinds, kind := "GPU nodes", "GPU node"
	if !gpus {
		kinds, kind = "nodes without GPUs", "node without GPUs"
	}
	switch {
	case !restricted:
		return "nodes matching " + selectors, "node matches " + selectors
	case !pinned && gpus:
		return kinds, "node has nvidia.com/gpu (spec.resources asks for GPUs)"
	case !pinned:
		return kinds, "node without GPUs has slots (spec.resources asks for no GPU)"
	}
	return kinds + " matching " + selectors, kind + " matches " + selectors
}

// waitingReason is the message of a job given no workers, when the round
// placed the others' workers so.
func waitingReason(e *entry, cluster scheduler.Cluster, placed scheduler.Allocation) string {
	minimum := e.job.Spec.MinWorkers
	perNode := int(e.job.Spec.MaxWorkersPerNode)
	if e.eligible == nil && perNode == 0 {
		return fmt.Sprintf("waiting for %d free slots (spec.minWorkers)", minimum)
	}
	if e.eligible != nil && e.matching == 0 {
		return "no " + e.none + ": waiting for one"
	}
	free := scheduler.Cluster{GPUs: slices.Clone(cluster.GPUs)}
	for _, nodes := range placed {
		for _, n := range nodes {
			free.GPUs[n]--
		}
	}
	if perNode == 0 {
		return fmt.Sprintf("waiting for %d free slots (spec.minWorkers) on the %d %s (%d free there)",
			minimum, e.matching, e.where, scheduler.CapacityFor(free, e.eligible, 0))
	}
	where := "nodes"
	if e.eligible != nil {
		where = e.where
	}
	if room := scheduler.CapacityFor(cluster, e.eligible, perNode); room < int(minimum) {
		// Even with every other job gone, the nodes cannot hold its
		// minimum at its cap: it waits for nodes, not for slots.
		nodes := 0
		for n := range cluster.GPUs {
			if e.eligible == nil || (n < len(e.eligible) && e.eligible[n]) {
				nodes++
			}
		}
		return fmt.Sprintf("spec.minWorkers %d at spec.maxWorkersPerNode %d needs at least %d nodes; the %d %s with free slots hold %d of its workers: waiting for more",
			minimum, perNode, (int(minimum)+perNode-1)/perNode, nodes, where, room)
	}
	return fmt.Sprintf("waiting for %d free slots (spec.minWorkers), at most %d a node (spec.maxWorkersPerNode), on the %s (%d free there at that cap)",
		minimum, perNode, where, scheduler.CapacityFor(free, e.eligible, perNode))
}

// strandedReason is the message of a running job that keeps workers on
// nodes that no longer match it, or that no longer hold its minimum at its
// cap per node (keepStranded).
func strandedReason(e *entry, cluster scheduler.Cluster, workers int) string {
	minimum := e.job.Spec.MinWorkers
	perNode := int(e.job.Spec.MaxWorkersPerNode)
	kept := fmt.Sprintf("%d workers", workers)
	if workers == 1 {
		kept = "1 worker"
	}
	if e.eligible != nil && e.matching == 0 {
		return fmt.Sprintf("no %s any more: keeping %s on its nodes until one can hold spec.minWorkers %d",
			e.none, kept, minimum)
	}
	where := "the cluster's nodes"
	if e.eligible != nil {
		where = fmt.Sprintf("the %d %s", e.matching, e.where)
	}
	atCap := ""
	if perNode > 0 {
		atCap = fmt.Sprintf(" at spec.maxWorkersPerNode %d", perNode)
	}
	return fmt.Sprintf("%s hold %d slots%s, below spec.minWorkers %d: keeping %s on its nodes until they can",
		where, scheduler.CapacityFor(cluster, e.eligible, perNode), atCap, minimum, kept)
}

// onPolicyClock is a time on the policies' clock (a duration since the Unix
// epoch), the same for every replica and across restarts.
func onPolicyClock(t time.Time) time.Duration { return time.Duration(t.UnixNano()) }

// describe is what the policy knows of a job.
func describe(e *entry, now time.Time, perNode int) scheduler.Job {
	spec := e.job.Spec
	sj := scheduler.Job{ID: e.id, Submitted: onPolicyClock(e.st.SubmitTime.Time),
		Attained: attained(e.st, now), Restarts: int(e.st.Reallocations),
		MinReplicas: int(spec.MinWorkers), MaxReplicas: int(spec.MaxWorkers), MaxPerNode: int(spec.MaxWorkersPerNode),
		// Tiresias runs a job at the size asked for: its most.
		Replicas: int(max(spec.MaxWorkers, spec.MinWorkers)),
		// An unmeasured job may grow to twice its minimum (Pollux's limit
		// on an extrapolated model), and Optimus sees it scale perfectly.
		MaxProfiledReplicas: int(spec.MinWorkers), RemainingSteps: 1,
		StepTime: func(r int) float64 { return 1 / float64(max(r, 1)) }}
	if g := e.job.Status.Goodput; g != nil {
		lim := goodput.Limits{MaxBatch: int(spec.Batch.Max)}
		sj.Goodput = scheduler.ModelGoodput(g.Model, lim)
		if g.WorkersPerNode > 0 {
			perNode = int(g.WorkersPerNode)
		}
		sj.StepTime = scheduler.ModelStepTime(g.Model, perNode)
		sj.MaxProfiledReplicas = max(sj.MaxProfiledReplicas, int(g.MaxProfiledWorkers))
	}
	return sj
}

// attained is the workers × time a job has held until now.
func attained(st api.Status, now time.Time) time.Duration {
	d := time.Duration(st.AttainedWorkerSeconds) * time.Second
	if st.AllocationTime != nil && now.After(st.AllocationTime.Time) {
		d += time.Duration(len(st.Allocation)) * now.Sub(st.AllocationTime.Time)
	}
	return d
}

// setAllocation gives a job its workers' nodes, counting the service it held
// until now and, after the first, the reallocation.
func setAllocation(e *entry, alloc []string, stamp metav1.Time) {
	slices.Sort(alloc)
	if len(alloc) == 0 {
		alloc = nil
	}
	if slices.Equal(alloc, e.st.Allocation) {
		return
	}
	if e.st.AllocationTime != nil {
		e.st.Reallocations++
	}
	e.st.AttainedWorkerSeconds = int64(attained(e.st, stamp.Time) / time.Second)
	e.st.Allocation, e.st.AllocationTime = alloc, &stamp
}

// end ends a job: its slots are free in this round.
func end(e *entry, phase api.Phase, msg string, stamp metav1.Time) {
	if e.st.Allocation != nil {
		e.st.AttainedWorkerSeconds = int64(attained(e.st, stamp.Time) / time.Second)
		e.st.Allocation, e.st.AllocationTime = nil, &stamp
	}
	e.st.Phase, e.st.Message, e.st.CompletionTime = phase, msg, &stamp
}

// stopDriver deletes the driver pod of a job failed by the scheduler.
func (s *Service) stopDriver(ctx context.Context, e *entry) error {
	if e.old.Driver == "" {
		return nil
	}
	if err := s.writable(ctx); err != nil {
		return err
	}
	err := s.kube.CoreV1().Pods(e.job.Namespace).Delete(ctx, e.old.Driver, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("service: deleting the driver of %s: %w", e.id, err)
	}
	return nil
}

// writable says whether this replica may still write.
func (s *Service) writable(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.leading != nil && !s.leading() {
		return errNotLeading
	}
	return nil
}

// write patches a job's scheduler fields where they changed.
func (s *Service) write(ctx context.Context, e *entry) error {
	e.st.ObservedGeneration = e.job.Generation
	if sameFields(e.st, e.old) {
		return nil // e.st carries the last writer: nothing changed
	}
	e.st.ScheduledBy = s.cfg.Identity
	if err := s.writable(ctx); err != nil {
		return err
	}
	patch, err := statusPatch(e.st)
	if err != nil {
		return err
	}
	out, err := s.dyn.Resource(api.GroupVersionResource()).Namespace(e.job.Namespace).
		Patch(ctx, e.job.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	if apierrors.IsNotFound(err) {
		return nil // deleted meanwhile: its slots are free at the next round
	}
	if err != nil {
		return fmt.Errorf("service: writing the status of %s: %w", e.id, err)
	}
	j, err := api.FromUnstructured(out)
	if err != nil {
		return err
	}
	s.written[j.UID] = schedulerFields(j.Status)
	return nil
}

// sameFields compares two statuses' scheduler fields as the API stores them
// (times to the second).
func sameFields(a, b api.Status) bool {
	pa, err1 := statusPatch(a)
	pb, err2 := statusPatch(b)
	return err1 == nil && err2 == nil && string(pa) == string(pb)
}

// statusPatch is the JSON merge patch setting the scheduler's fields of a
// status and no others; a field to clear is null.
func statusPatch(st api.Status) ([]byte, error) {
	orNull := func(v any, null bool) any {
		if null {
			return nil
		}
		return v
	}
	timeOrNull := func(t *metav1.Time) any {
		if t == nil {
			return nil
		}
		return t.Rfc3339Copy()
	}
	fields := map[string]any{
		"phase":                 orNull(st.Phase, st.Phase == ""),
		"message":               orNull(st.Message, st.Message == ""),
		"allocation":            orNull(st.Allocation, len(st.Allocation) == 0),
		"reallocations":         orNull(st.Reallocations, st.Reallocations == 0),
		"driver":                orNull(st.Driver, st.Driver == ""),
		"driverRestarts":        orNull(st.DriverRestarts, st.DriverRestarts == 0),
		"submitTime":            timeOrNull(st.SubmitTime),
		"startTime":             timeOrNull(st.StartTime),
		"completionTime":        timeOrNull(st.CompletionTime),
		"observedGeneration":    orNull(st.ObservedGeneration, st.ObservedGeneration == 0),
		"scheduledBy":           orNull(st.ScheduledBy, st.ScheduledBy == ""),
		"allocationTime":        timeOrNull(st.AllocationTime),
		"attainedWorkerSeconds": orNull(st.AttainedWorkerSeconds, st.AttainedWorkerSeconds == 0),
	}
	return json.Marshal(map[string]any{"status": fields})
}

// failUnreadable fails a job whose object does not convert (a field of the
// wrong type that the schema let through).
func (s *Service) failUnreadable(ctx context.Context, u *unstructured.Unstructured, cause error) error {
	if phase, _, _ := unstructured.NestedString(u.Object, "status", "phase"); api.Phase(phase).Ended() {
		return nil
	}
	if err := s.writable(ctx); err != nil {
		return err
	}
	now := metav1.NewTime(s.cfg.Now().Truncate(time.Second))
	patch, err := json.Marshal(map[string]any{"status": map[string]any{
		"phase": api.PhaseFailed, "message": "the object does not match the GorovodJob schema: " + cause.Error(), "completionTime": now,
		"observedGeneration": u.GetGeneration(), "scheduledBy": s.cfg.Identity}})
	if err != nil {
		return err
	}
	_, err = s.dyn.Resource(api.GroupVersionResource()).Namespace(u.GetNamespace()).
		Patch(ctx, u.GetName(), types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("service: failing %s/%s: %w", u.GetNamespace(), u.GetName(), err)
	}
	return nil
}
