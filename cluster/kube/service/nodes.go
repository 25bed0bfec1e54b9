package service

import (
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"

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

// maxNodeSlots is the most a node may hold (the policies' limit).
const maxNodeSlots = 255

// NodeSlots is how many workers the scheduler places on a node: none unless
// the node is Ready and schedulable (not cordoned); then its allocatable
// nvidia.com/gpu where above 0, else its allocatable gorovod.io/slot where
// above 0, else its label gorovod.io/slots where a count ≥ 0, else none; at
// most 255.
func NodeSlots(n *corev1.Node) int {
	if n.Spec.Unschedulable || n.DeletionTimestamp != nil || !nodeReady(n) {
		return 0
	}
	for _, r := range []corev1.ResourceName{GPUResource, SlotResource} {
		if q, ok := n.Status.Allocatable[r]; ok && q.Value() > 0 {
			return int(min(q.Value(), maxNodeSlots))
		}
	}
	if v, ok := n.Labels[SlotsLabel]; ok {
		if k, err := strconv.Atoi(v); err == nil && k > 0 {
			return min(k, maxNodeSlots)
		}
	}
	return 0
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// clusterOf is the policies' cluster: the nodes with slots, by name.
func clusterOf(nodes []*corev1.Node) (names []string, cluster scheduler.Cluster) {
	slots := map[string]int{}
	for _, n := range nodes {
		if k := NodeSlots(n); k > 0 {
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
