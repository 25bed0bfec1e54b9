package service

import (
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gorovod/gorovod/cluster/kube"
	"github.com/gorovod/gorovod/cluster/kube/api"
	"github.com/gorovod/gorovod/cluster/scheduler"
)

// What gives a node its slots, in the order NodeSlots tries them.
const (
	// GPUResource is the NVIDIA device plugin's resource.
	GPUResource = api.GPUResource
	// SlotResource is the extended resource an operator advertises on a
	// node without GPUs (a node status patch, or a device plugin).
	SlotResource = api.SlotResource
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
	freeOf := func(r corev1.ResourceName) int {
		q, used := n.Status.Allocatable[r], others[r]
		return int(min(max(q.Value()-used.Value(), 0), maxNodeSlots))
	}
	switch KindOf(n) {
	case GPUSlots:
		return freeOf(GPUResource)
	case ResourceSlots:
		return freeOf(SlotResource)
	case LabelSlots:
		k, _ := strconv.Atoi(n.Labels[SlotsLabel]) // KindOf read it
		k = min(k, maxNodeSlots)
		cpu := n.Status.Allocatable[corev1.ResourceCPU]
		used := others[corev1.ResourceCPU]
		if all := cpu.MilliValue(); all > 0 && used.MilliValue() > 0 {
			free := max(all-used.MilliValue(), 0)
			k = int(int64(k) * free / all)
		}
		return k
	}
	return 0
}

// SlotKind is what gives a node its slots, in the order NodeSlots tries
// them.
type SlotKind int

const (
	// NoSlots: none of the below.
	NoSlots SlotKind = iota
	// GPUSlots: allocatable nvidia.com/gpu above 0.
	GPUSlots
	// ResourceSlots: no GPUs, allocatable gorovod.io/slot above 0.
	ResourceSlots
	// LabelSlots: neither resource, the label gorovod.io/slots a count
	// above 0.
	LabelSlots
)

// KindOf is what gives node n its slots, whatever its state (Ready,
// cordoned, tainted).
func KindOf(n *corev1.Node) SlotKind {
	if q, ok := n.Status.Allocatable[GPUResource]; ok && q.Value() > 0 {
		return GPUSlots
	}
	if q, ok := n.Status.Allocatable[SlotResource]; ok && q.Value() > 0 {
		return ResourceSlots
	}
	if k, err := strconv.Atoi(n.Labels[SlotsLabel]); err == nil && k > 0 {
		return LabelSlots
	}
	return NoSlots
}

// Fits says whether the workers of a job may take slots of this kind: a
// job that asks for GPUs (api.Spec.WantsGPUs) those of GPU nodes only, any
// other job those of nodes without GPUs only. The kubelet would not stop
// either: it admits a pod bound to its node whatever extended resource the
// pod asks for that the node lacks, so a GPU job's workers would train
// without a GPU, and another job's would idle the GPU whose slot they
// take. A node without slots fits every job (it holds none of their
// workers).
func (k SlotKind) Fits(wantsGPUs bool) bool {
	return k == NoSlots || (k == GPUSlots) == wantsGPUs
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
