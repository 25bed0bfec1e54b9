package scheduler

import "slices"

// What follows turns a policy's allocation into one that live elastic jobs
// can be given: a gorovod job has no checkpoint to be suspended into, so once
// started it keeps at least its minimum, and a job starts only with at least
// its minimum. Package pool (local slots) and package cluster/kube/service
// (a Kubernetes cluster) both carry allocations out through these, and the
// simulator (cluster/simulator, Config.Elastic) predicts them so.

// RepairToMinimums makes the worker counts want fit slots slots, in place. The
// jobs are given in priority order (the first the most important); floor is
// each job's minimum and running says which jobs already run. A running job
// keeps at least its floor, a job not running starts only with at least its
// floor, and the total fits: the last jobs not running give up their slots
// first, then the running jobs with the most above their floors, one slot at a
// time. Where even the running jobs' floors do not fit (the cluster lost
// nodes), the last running jobs are given nothing until the rest fit.
func RepairToMinimums(want, floor []int, running []bool, slots int) {
	total := 0
	for i := range want {
		switch {
		case running[i]:
			want[i] = max(want[i], floor[i])
		case want[i] < floor[i]:
			want[i] = 0
		}
		total += want[i]
	}
	for total > slots {
		drop := -1
		for i := range want {
			if !running[i] && want[i] > 0 {
				drop = i
			}
		}
		if drop >= 0 {
			total -= want[drop]
			want[drop] = 0
			continue
		}
		most := -1
		for i := range want {
			if want[i] > floor[i] && (most < 0 || want[i]-floor[i] > want[most]-floor[most]) {
				most = i
			}
		}
		if most >= 0 {
			want[most]--
			total--
			continue
		}
		for i := len(want) - 1; i >= 0; i-- {
			if want[i] > 0 {
				total -= want[i]
				want[i] = 0
				break
			}
		}
	}
}

// AdmitByPriority admits waiting jobs in priority order, in place, after
// RepairToMinimums: a job not running that was given nothing is given its
// floor where the floor fits in the free slots plus what the jobs after it
// that are not running were given and what the running jobs hold above their
// floors; those give way (the last first, then the running jobs with the most
// above their floors). A policy that leaves an important job waiting while a
// less important one starts, or slots idle, is overruled so.
func AdmitByPriority(want, floor []int, running []bool, slots int) {
	total := 0
	for _, w := range want {
		total += w
	}
	for i := range want {
		if running[i] || want[i] > 0 || floor[i] < 1 {
			continue
		}
		spare := slots - total
		for k := i + 1; k < len(want); k++ {
			if !running[k] {
				spare += want[k]
			}
		}
		for k := range want {
			if running[k] {
				spare += want[k] - floor[k]
			}
		}
		if spare < floor[i] {
			continue
		}
		for k := len(want) - 1; k > i && slots-total < floor[i]; k-- {
			if !running[k] && want[k] > 0 {
				total -= want[k]
				want[k] = 0
			}
		}
		for slots-total < floor[i] {
			most := -1
			for k := range want {
				if running[k] && want[k] > floor[k] && (most < 0 || want[k]-floor[k] > want[most]-floor[most]) {
					most = k
				}
			}
			want[most]--
			total--
		}
		want[i] = floor[i]
		total += floor[i]
	}
}

// RepairCounts repairs the worker counts want of jobs ids (in priority
// order) with RepairToMinimums, then AdmitByPriority, and returns them by
// job.
func RepairCounts(ids []string, want, floor []int, running []bool, slots int) map[string]int {
	RepairToMinimums(want, floor, running, slots)
	AdmitByPriority(want, floor, running, slots)
	counts := make(map[string]int, len(ids))
	for i, id := range ids {
		counts[id] = want[i]
	}
	return counts
}

// KeepOneCurrent edits the proposal of each job (ids, in priority order)
// that keeps workers but none of its current slots' nodes, so that it keeps
// one of them: a job's training state lives in its workers' memory, and a
// world whose every member leaves before a newcomer joined ends the job
// unfinished. Those jobs come first in the order returned, so that
// PlaceCounts gives them the slot before another job's proposal takes it.
func KeepOneCurrent(ids []string, counts map[string]int, proposed, current Allocation) (Allocation, []string) {
	out := make(Allocation, len(proposed))
	for id, nodes := range proposed {
		out[id] = nodes
	}
	var first, rest []string
	for _, id := range ids {
		p, cur := out[id], current[id]
		if counts[id] > 0 && len(p) > 0 && len(cur) > 0 && !slices.ContainsFunc(p, func(n int) bool { return slices.Contains(cur, n) }) {
			p = slices.Clone(p)
			p[0] = cur[0]
			slices.Sort(p)
			out[id] = p
			first = append(first, id)
		} else {
			rest = append(rest, id)
		}
	}
	return out, append(first, rest...)
}

// PlaceCounts gives each job (ids, in priority order) its count of workers on
// the cluster's nodes. Where the policy's placement (proposed) has the job's
// count and fits, it is kept. Otherwise the job keeps what it can of its
// current nodes (a shrinking job leaves the nodes where it has the fewest
// workers), then grows on nodes it already uses, then fills the node with
// the most free slots before the next (packing, so that a small job is not
// spread). The counts must fit the cluster (RepairToMinimums).
//
// A job with an eligible set (eligible[id], as Job.Eligible; nil or absent:
// every node) gets only nodes of the set: a proposal outside it is not kept,
// and such jobs are placed before the others where proposals are not kept,
// so that a job free to go anywhere does not take the only slots another
// may use. Where its count does not fit its nodes, it gets what there is.
//
// A job with a preference (preference[id], as Job.Preference) ranks nodes
// by their score first in each of those steps: a shrinking job leaves its
// nodes of lowest score first, and a growing one takes the free node of
// highest score, its own nodes before others of the same score. A proposal
// that fits is kept whatever its score (the policy weighed it), and a
// preference changes no count.
//
// A job with a cap per node (maxPerNode[id] above 0, as Job.MaxPerNode) gets
// at most that many workers on each node in every step: a proposal over it
// is not kept, nor current workers beyond it on a node, and growth moves to
// the next node at the cap. Such jobs are placed with the pinned ones, before
// those free to go anywhere; where its count does not fit under the cap, it
// gets what there is (the caller sizes counts by CapacityFor).
func PlaceCounts(cluster Cluster, ids []string, counts map[string]int, proposed, current Allocation, eligible map[string][]bool, preference map[string][]int, maxPerNode map[string]int) Allocation {
	out := Allocation{}
	free := slices.Clone(cluster.GPUs)
	fits := func(id string, nodes []int) bool {
		need := make(map[int]int)
		for _, n := range nodes {
			if n < 0 || n >= len(free) || !eligibleNode(eligible[id], n) {
				return false
			}
			need[n]++
		}
		for n, k := range need {
			if free[n] < k || (maxPerNode[id] > 0 && k > maxPerNode[id]) {
				return false
			}
		}
		return true
	}
	for _, id := range ids {
		if n := counts[id]; n > 0 && len(proposed[id]) == n && fits(id, proposed[id]) {
			out[id] = slices.Clone(proposed[id])
			for _, node := range out[id] {
				free[node]--
			}
		}
	}
	pinnedFirst := slices.Clone(ids)
	slices.SortStableFunc(pinnedFirst, func(a, b string) int {
		switch pa, pb := eligible[a] != nil || maxPerNode[a] > 0, eligible[b] != nil || maxPerNode[b] > 0; {
		case pa && !pb:
			return -1
		case pb && !pa:
			return 1
		}
		return 0
	})
	for _, id := range pinnedFirst {
		n := counts[id]
		if n == 0 || out[id] != nil {
			continue
		}
		score := func(node int) int { return preferenceOf(preference[id], node) }
		limit := maxPerNode[id]
		// Keep the current nodes, of highest score then most used first,
		// as far as they fit (at most the cap on each).
		held := map[int]int{}
		for _, node := range current[id] {
			if node >= 0 && node < len(free) && eligibleNode(eligible[id], node) && (limit <= 0 || held[node] < limit) {
				held[node]++
			}
		}
		order := make([]int, 0, len(held))
		for node := range held {
			order = append(order, node)
		}
		slices.SortFunc(order, func(a, b int) int {
			if sa, sb := score(a), score(b); sa != sb {
				return sb - sa
			}
			if held[a] != held[b] {
				return held[b] - held[a]
			}
			return a - b
		})
		var nodes []int
		var have []int // the job's workers per node, where it is capped
		if limit > 0 {
			have = make([]int, len(free))
		}
		take := func(node int) {
			nodes = append(nodes, node)
			free[node]--
			if have != nil {
				have[node]++
			}
		}
		for _, node := range order {
			for k := 0; k < held[node] && free[node] > 0 && len(nodes) < n; k++ {
				take(node)
			}
		}
		// Grow: the free node of highest score, where the job already is
		// before elsewhere (in the order above), then the most free; a
		// node at the job's cap has no room for it.
		for len(nodes) < n {
			best := -1
			for _, node := range order {
				if nodeRoom(free, node, nil, limit, have) > 0 {
					best = node
					break
				}
			}
			if other := mostFreeNode(free, eligible[id], preference[id], limit, have); other >= 0 && (best < 0 || score(other) > score(best)) {
				best = other
			}
			if best < 0 {
				break // the counts did not fit: the job gets what there is
			}
			for nodeRoom(free, best, nil, limit, have) > 0 && len(nodes) < n {
				take(best)
			}
		}
		slices.Sort(nodes)
		out[id] = nodes
	}
	return out
}
