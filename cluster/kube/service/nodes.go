package service

import (
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gorovod/gorovod/cluster/kube"
	"github.com/gorovod/gorovod/cluster/scheduler"
)

// What gives a node its slots, in the order NodeSlots tries them.
const (
	// GPUResource is the NVIDIA device plugin's resource.
	GPUResource corev1.ResourceName = "nvidia.com/gpu"
	// SlotResource is the extended resource an operator advertises on a
	// node without GPUs (a node status patch, or a device plugin).
	SlotResource corev1.ResourceName = "gorovod.io/slot"
	// SlotsLabel is the node label giving a node without GPUs its slots.
	SlotsLabel = "gorovod.io/slots"
)

// WorkerTolerations are the tolerations of a GorovodJob's worker pods (the
// job's driver gives them): the taints a cluster puts on the nodes of an
// extended resource, keyed by the resource's name, as Kubernetes's
// ExtendedResourceToleration admission plugin would add them. A node with
// any other NoSchedule or NoExecute taint has no slots for gorovod.
var WorkerTolerations = []corev1.Toleration{
	{Key: string(GPUResource), Operator: corev1.TolerationOpExists},
	{Key: string(SlotResource), Operator: corev1.TolerationOpExists},
}

// maxNodeSlots is the most a node may hold (the policies' limit).
const maxNodeSlots = 255

// NodeSlots is how many workers the scheduler may place on a node, before
// other pods' requests (FreeSlots): none unless the node is Ready,
// schedulable (not cordoned) and without a NoSchedule or NoExecute taint
// that WorkerTolerations do not tolerate; then its allocatable
// nvidia.com/gpu where above 0, else its allocatable gorovod.io/slot where
// above 0, else its label gorovod.io/slots where a count ≥ 0, else none; at
// most 255.
func NodeSlots(n *corev1.Node) int { return FreeSlots(n, nil) }

// FreeSlots is NodeSlots less what other pods bound to the node request
// (their requests summed, as OthersRequests gives them): GPUs of a GPU node,
// gorovod.io/slot of a node that advertises it; of a node whose slots come
// from its label, the slots in proportion to the CPU the other pods request
// of its allocatable CPU (rounded down). Never below 0.
func FreeSlots(n *corev1.Node, others corev1.ResourceList) int {
	if n.Spec.Unschedulable || n.DeletionTimestamp != nil || !nodeReady(n) || !toleratedByWorkers(n.Spec.Taints) {
		return 0
	}
	for _, r := range []corev1.ResourceName{GPUResource, SlotResource} {
		if q, ok := n.Status.Allocatable[r]; ok && q.Value() > 0 {
			used := others[r]
			return int(min(max(q.Value()-used.Value(), 0), maxNodeSlots))
		}
	}
	v, ok := n.Labels[SlotsLabel]
	if !ok {
		return 0
	}
	k, err := strconv.Atoi(v)
	if err != nil || k <= 0 {
		return 0
	}
	k = min(k, maxNodeSlots)
	cpu := n.Status.Allocatable[corev1.ResourceCPU]
	used := others[corev1.ResourceCPU]
	if all := cpu.MilliValue(); all > 0 && used.MilliValue() > 0 {
		free := max(all-used.MilliValue(), 0)
		k = int(int64(k) * free / all)
	}
	return k
}

// toleratedByWorkers says whether the worker pods may run on a node with
// these taints.
func toleratedByWorkers(taints []corev1.Taint) bool {
	for i := range taints {
		t := &taints[i]
		if t.Effect != corev1.TaintEffectNoSchedule && t.Effect != corev1.TaintEffectNoExecute {
			continue // PreferNoSchedule: a preference, not a bar
		}
		if !slices.ContainsFunc(WorkerTolerations, func(tol corev1.Toleration) bool { return tol.ToleratesTaint(t) }) {
			return false
		}
	}
	return true
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// slotResources are the resources whose requests take slots.
var slotResources = []corev1.ResourceName{GPUResource, SlotResource, corev1.ResourceCPU}

// OthersRequests sums, per node, the requests of GPUs, gorovod.io/slot and
// CPU of the pods bound to it that still hold them (not Succeeded or
// Failed) and are not ours — ours are the pods of the scheduled GorovodJobs,
// whose workers the allocation already counts. A pod's request of a
// resource is the largest of its containers' requests summed and each init
// container's request, plus its overhead; a container that gives only a
// limit requests its limit (the API server's default).
func OthersRequests(pods []*corev1.Pod, ours func(*corev1.Pod) bool) map[string]corev1.ResourceList {
	out := map[string]corev1.ResourceList{}
	for _, p := range pods {
		if p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || ours(p) {
			continue
		}
		use := out[p.Spec.NodeName]
		if use == nil {
			use = corev1.ResourceList{}
			out[p.Spec.NodeName] = use
		}
		for _, r := range slotResources {
			q := podRequest(p, r)
			if q.IsZero() {
				continue
			}
			sum := use[r]
			sum.Add(q)
			use[r] = sum
		}
	}
	return out
}

func podRequest(p *corev1.Pod, r corev1.ResourceName) resource.Quantity {
	request := func(c *corev1.Container) resource.Quantity {
		if q, ok := c.Resources.Requests[r]; ok {
			return q
		}
		return c.Resources.Limits[r]
	}
	var sum resource.Quantity
	for i := range p.Spec.Containers {
		sum.Add(request(&p.Spec.Containers[i]))
	}
	for i := range p.Spec.InitContainers {
		if q := request(&p.Spec.InitContainers[i]); q.Cmp(sum) > 0 {
			sum = q
		}
	}
	if q, ok := p.Spec.Overhead[r]; ok {
		sum.Add(q)
	}
	return sum
}

// oursIn says whether a pod belongs to one of the jobs (namespace/name) the
// scheduler schedules: its gorovod.io/job label names one of them in its
// namespace (the job's driver pod and its workers).
func oursIn(jobs map[string]bool) func(*corev1.Pod) bool {
	return func(p *corev1.Pod) bool {
		j, ok := p.Labels[kube.LabelJob]
		return ok && jobs[p.Namespace+"/"+j]
	}
}

// clusterOf is the policies' cluster: the nodes with free slots, by name.
func clusterOf(nodes []*corev1.Node, others map[string]corev1.ResourceList) (names []string, cluster scheduler.Cluster) {
	slots := map[string]int{}
	for _, n := range nodes {
		if k := FreeSlots(n, others[n.Name]); k > 0 {
			names = append(names, n.Name)
			slots[n.Name] = k
		}
	}
	slices.Sort(names)
	for _, name := range names {
		cluster.GPUs = append(cluster.GPUs, slots[name])
	}
	return names, cluster
}
