package scheduler

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"math/bits"
	"slices"
)

// The genetic algorithm's operators work on rows of replica counts (one row
// per job, stride bytes, the nodes then zero padding). Most rows are sparse —
// a job sits on a few nodes — so each row is read a 64-bit word at a time and
// empty words are skipped.

const (
	lowBits  = 0x0101010101010101
	lowBytes = 0x00ff00ff00ff00ff
)

// word reads the 8 counts at row[i:i+8].
func word(row []uint8, i int) uint64 { return binary.LittleEndian.Uint64(row[i : i+8]) }

// nonzeroBytes has the low bit of each byte set where w's byte is not zero.
func nonzeroBytes(w uint64) uint64 {
	w |= w >> 4
	w |= w >> 2
	w |= w >> 1
	return w & lowBits
}

// byteSum adds w's 8 bytes.
func byteSum(w uint64) int {
	t := (w & lowBytes) + (w >> 8 & lowBytes) // four 16-bit lanes, each ≤ 510
	return int((t * 0x0001000100010001) >> 48)
}

// rowStats returns how many nodes a row uses and how many replicas it has.
func rowStats(row []uint8) (nodes, replicas int) {
	for i := 0; i < len(row); i += 8 {
		if w := word(row, i); w != 0 {
			nodes += bits.OnesCount64(nonzeroBytes(w))
			replicas += byteSum(w)
		}
	}
	return nodes, replicas
}

// fitness is the power mean of the jobs' scaled speed-ups in state s.
func (pr *problem) fitness(s []uint8) float64 {
	W := pr.stride
	sum := 0.0
	for j := range pr.jobs {
		row := s[j*W : (j+1)*W]
		nodes, reps := rowStats(row)
		sp := 0.0
		if reps > 0 {
			sp = pr.speedupOf(j, nodes, reps) * pr.scale
		}
		if !slices.Equal(row, pr.base[j*W:(j+1)*W]) {
			sp *= pr.factor[j] // the job is moved: it pays for the restart
		}
		// 1e-3 keeps a job with nothing from zeroing the mean (p < 0).
		if pr.power == -1 {
			sum += 1 / (sp + 1e-3)
		} else {
			sum += math.Pow(sp+1e-3, pr.power)
		}
	}
	mean := sum / float64(len(pr.jobs))
	if pr.power == -1 {
		return 1 / mean
	}
	return math.Pow(mean, 1/pr.power)
}

// repair makes s a valid allocation, in this order (Pollux's, after a job's
// replicas on nodes it may not use are dropped and its count on each node
// is cut to its cap, Job.MaxPerNode): a node keeps
// at most one distributed job (the first in priority order; the node's
// replicas of every job after a second distributed one are dropped, as
// Pollux's repair does), a job over its maximum keeps replicas on randomly
// chosen nodes up to it, a node over capacity serves jobs in priority order,
// and a job under its minimum gets nothing.
func (pr *problem) repair(s []uint8, r *rng) {
	N, W, J := pr.nodes, pr.stride, len(pr.jobs)
	// (0) Only the nodes a job may use (Job.Eligible), at most its cap
	// on each (Job.MaxPerNode).
	for j, room := range pr.room {
		if room == nil {
			continue
		}
		row := s[j*W : (j+1)*W]
		for n, v := range room {
			row[n] = min(row[n], v)
		}
	}
	// (1) One distributed job per node. Whether a job is distributed is
	// decided on the state as it came; seen1/seen2: a first/second
	// distributed job has been met on the node.
	seen1, seen2 := pr.seen1, pr.seen2
	clear(seen1)
	clear(seen2)
	any2 := false
	for j := 0; j < J; j++ {
		row := s[j*W : (j+1)*W]
		used, _ := rowStats(row)
		if used <= 1 && !any2 {
			continue
		}
		for i := 0; i < W; i += 8 {
			for m := nonzeroBytes(word(row, i)); m != 0; m &= m - 1 {
				n := i + bits.TrailingZeros64(m)>>3
				switch {
				case seen2[n]:
					row[n] = 0
				case used > 1 && seen1[n]:
					seen2[n], any2 = true, true
					row[n] = 0
				case used > 1:
					seen1[n] = true
				}
			}
		}
	}
	// (2) Maximum replicas, (3) node capacity in priority order, (4)
	// minimum replicas, row by row.
	left := pr.left
	for n := range left {
		left[n] = int(pr.cap[n])
	}
	for j := 0; j < J; j++ {
		row := s[j*W : (j+1)*W]
		_, reps := rowStats(row)
		if reps == 0 {
			continue
		}
		if reps > pr.maxRep[j] {
			perm := pr.perm
			for i := range perm {
				perm[i] = i
			}
			for i := N - 1; i > 0; i-- {
				k := r.intn(i + 1)
				perm[i], perm[k] = perm[k], perm[i]
			}
			keep := pr.maxRep[j]
			for _, n := range perm {
				v := min(int(row[n]), keep)
				row[n] = uint8(v)
				keep -= v
			}
		}
		reps = 0
		for i := 0; i < W; i += 8 {
			for m := nonzeroBytes(word(row, i)); m != 0; m &= m - 1 {
				n := i + bits.TrailingZeros64(m)>>3
				v := min(int(row[n]), left[n])
				row[n] = uint8(v)
				left[n] -= v
				reps += v
			}
		}
		if reps < pr.minRep[j] {
			// What the job took stays taken, as in Pollux's repair
			// (capacity is settled for all jobs before minimums).
			clear(row)
		}
	}
}

// Probabilities of the mutations, as 64-bit thresholds for rng.next.
var tenPercent = threshold(0.1)

func threshold(p float64) uint64 {
	if p >= 1 {
		return math.MaxUint64
	}
	return uint64(p * (1 << 64))
}

// mutate applies Pollux's three mutations to s: reset a job to its current
// allocation (probability 0.1 per job); drop replicas (for 10 % of the jobs,
// each node's count is zeroed with probability 0.1); and grow: on every node
// with a free GPU, a job's count is raised to a uniform value between it and
// the node's size (at most the job's cap there, problem.room), with
// probability 1/(nodes with a free GPU), combined with
// 1/(such nodes the job already uses) where it is already there.
func (pr *problem) mutate(s []uint8, r *rng) {
	W, J := pr.stride, len(pr.jobs)
	for j := 0; j < J; j++ {
		if r.next() < tenPercent {
			copy(s[j*W:(j+1)*W], pr.base[j*W:(j+1)*W])
		}
	}
	for j := 0; j < J; j++ {
		if r.next() < tenPercent {
			row := s[j*W : (j+1)*W]
			// Zeroing a zero changes nothing: draw for the others only.
			for i := 0; i < W; i += 8 {
				for m := nonzeroBytes(word(row, i)); m != 0; m &= m - 1 {
					if r.next() < tenPercent {
						row[i+bits.TrailingZeros64(m)>>3] = 0
					}
				}
			}
		}
	}
	pr.grow(s, r)
}

// grow is mutate's third step: raise counts on nodes with a free GPU.
func (pr *problem) grow(s []uint8, r *rng) {
	W, J := pr.stride, len(pr.jobs)
	free := pr.free
	for n := range free {
		free[n] = int(pr.cap[n])
	}
	for j := 0; j < J; j++ {
		row := s[j*W : (j+1)*W]
		for i := 0; i < W; i += 8 {
			for m := nonzeroBytes(word(row, i)); m != 0; m &= m - 1 {
				n := i + bits.TrailingZeros64(m)>>3
				free[n] -= int(row[n])
			}
		}
	}
	freeNodes := pr.freeNodes[:0]
	for n, f := range free {
		if f >= 1 {
			freeNodes = append(freeNodes, n)
		}
	}
	if len(freeNodes) == 0 {
		return
	}
	p1 := 1 / float64(len(freeNodes))
	t1 := threshold(p1)
	for j := 0; j < J; j++ {
		row := s[j*W : (j+1)*W]
		present := 0
		for _, n := range freeNodes {
			if row[n] > 0 {
				present++
			}
		}
		t12 := t1
		if present > 0 {
			p2 := 1 / float64(present)
			t12 = threshold(p1 + p2 - p1*p2)
		}
		room := pr.room[j]
		for _, n := range freeNodes {
			top := pr.cap[n]
			if room != nil {
				if top = min(top, room[n]); top == 0 {
					continue
				}
			}
			v := row[n]
			t := t1
			if v > 0 {
				t = t12
			}
			if r.next() < t && v < top {
				row[n] = v + uint8(r.intn(int(top-v)+1))
			}
		}
	}
}

// individual is one allocation in the population.
type individual struct {
	s    []uint8
	fit  float64
	hash uint64
	// pref is the state's preference score (problem.preferenceScore),
	// which breaks ties of fit.
	pref int
	// NSGA-II only: the cluster utility (second objective), the
	// non-dominated front and the crowding distance in it.
	util  float64
	rank  int
	crowd float64
}

// crossoverRate is the probability a mating recombines its parents (pymoo's
// default, which Pollux uses); otherwise the offspring are copies.
const crossoverRate = 0.9

var crossoverThreshold = threshold(crossoverRate)

// matingRounds bounds the retries for offspring unlike any individual of the
// generation. pymoo retries up to 100 times; when a few jobs leave few
// distinct allocations, more retries only repeat the same ones.
const matingRounds = 5

func (p *Pollux) getState(size int) []uint8 {
	if n := len(p.pool); n > 0 {
		s := p.pool[n-1]
		p.pool = p.pool[:n-1]
		if cap(s) >= size {
			return s[:size]
		}
	}
	return make([]uint8, size)
}

func (p *Pollux) putState(s []uint8) { p.pool = append(p.pool, s) }

// search runs the genetic algorithm (elitist: parents and offspring compete
// for the next generation) and returns the best state found.
func (p *Pollux) search(ctx context.Context, pr *problem) ([]uint8, error) {
	J, W := len(pr.jobs), pr.stride
	size := J * W
	P := p.cfg.Population
	nsga2 := p.cfg.Selection == NSGA2
	seen := make(map[uint64]struct{}, 4*P)
	var pop []individual
	add := func(dst *[]individual, s []uint8) {
		h := hashState(s)
		if _, dup := seen[h]; dup {
			p.putState(s)
			return
		}
		seen[h] = struct{}{}
		ind := individual{s: s, fit: pr.fitness(s), hash: h, pref: pr.preferenceScore(s)}
		if nsga2 {
			ind.util = pr.utility(s)
		}
		*dst = append(*dst, ind)
	}
	truncate := func() {
		if nsga2 {
			rankAndCrowd(pop)
			sortByRank(pop)
		} else {
			sortPopulation(pop)
		}
		if len(pop) > P {
			for _, ind := range pop[P:] {
				p.putState(ind.s)
			}
			pop = pop[:P]
		}
	}
	// Initial population: the allocation in force, then the previous
	// round's population mapped onto this round's jobs and nodes.
	s := p.getState(size)
	copy(s, pr.base)
	pr.repair(s, &p.rng)
	add(&pop, s)
	prevRow := make(map[string]int, len(p.prevJobs))
	for i, id := range p.prevJobs {
		prevRow[id] = i
	}
	cols := min(pr.nodes, p.prevNodes)
	for _, old := range p.prevPop {
		s := p.getState(size)
		clear(s)
		for j, job := range pr.jobs {
			if i, ok := prevRow[job.ID]; ok {
				copy(s[j*W:j*W+cols], old[i*p.prevStride:i*p.prevStride+cols])
			}
		}
		pr.repair(s, &p.rng)
		add(&pop, s)
	}
	truncate()

	var off, next []individual
	for gen := 0; gen < p.cfg.Generations; gen++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		clear(seen)
		for _, ind := range pop {
			seen[ind.hash] = struct{}{}
		}
		off = off[:0]
		for round := 0; round < matingRounds && len(off) < P; round++ {
			for want := P - len(off); want > 0; want -= 2 {
				a, b := p.tournament(pop), p.tournament(pop)
				c1, c2 := p.getState(size), p.getState(size)
				copy(c1, a.s)
				copy(c2, b.s)
				if p.rng.next() < crossoverThreshold {
					// Single-point crossover over jobs: the first
					// `point` jobs come from the other parent.
					point := p.rng.intn(J)
					copy(c1[:point*W], b.s[:point*W])
					copy(c2[:point*W], a.s[:point*W])
				}
				for _, c := range [2][]uint8{c1, c2} {
					pr.mutate(c, &p.rng)
					pr.repair(c, &p.rng)
					add(&off, c)
				}
			}
		}
		if nsga2 {
			pop = append(pop, off...)
			truncate()
			continue
		}
		// The next generation: the best P of parents and offspring
		// (parents first among equals), by merging the sorted lists.
		sortPopulation(off)
		next = next[:0]
		i, k := 0, 0
		for len(next) < P && (i < len(pop) || k < len(off)) {
			if k == len(off) || (i < len(pop) && !better(&off[k], &pop[i])) {
				next = append(next, pop[i])
				i++
			} else {
				next = append(next, off[k])
				k++
			}
		}
		for _, ind := range pop[i:] {
			p.putState(ind.s)
		}
		for _, ind := range off[k:] {
			p.putState(ind.s)
		}
		pop, next = next, pop
	}
	if len(pop) == 0 {
		return nil, errors.New("scheduler: pollux: empty population")
	}
	// The next round starts from this round's non-dominated allocations
	// under (fitness, cluster utility): what pymoo's result holds and
	// Pollux carries over. Carrying the whole population instead makes the
	// next search a refinement of stale allocations (on workload 2 of the
	// study, average JCT 15 % above the paper's; this way, within 1 %).
	top := 0
	for i := range pop {
		if better(&pop[i], &pop[top]) {
			top = i
		}
	}
	best := slices.Clone(pop[top].s)
	sortPopulation(pop)
	for _, old := range p.prevPop {
		p.putState(old)
	}
	p.prevPop = p.prevPop[:0]
	for _, i := range pr.nonDominated(pop) {
		p.prevPop = append(p.prevPop, pop[i].s)
		pop[i].s = nil
	}
	for _, ind := range pop {
		if ind.s != nil {
			p.putState(ind.s)
		}
	}
	p.prevJobs = p.prevJobs[:0]
	for _, job := range pr.jobs {
		p.prevJobs = append(p.prevJobs, job.ID)
	}
	p.prevNodes, p.prevStride = pr.nodes, W
	return best, nil
}

// utility is Pollux's cluster utility of a state: the jobs' speed-ups summed
// over the GPUs of the nodes in use (its second objective, which sizes the
// cluster when it autoscales).
func (pr *problem) utility(s []uint8) float64 {
	W := pr.stride
	used := pr.left // scratch
	clear(used)
	sum := 0.0
	for j := range pr.jobs {
		row := s[j*W : (j+1)*W]
		nodes, reps := rowStats(row)
		if reps == 0 {
			continue
		}
		sum += pr.speedupOf(j, nodes, reps)
		for n := 0; n < pr.nodes; n++ {
			used[n] += int(row[n])
		}
	}
	gpus := 0
	for n, u := range used {
		if u > 0 {
			gpus += int(pr.cap[n])
		}
	}
	if gpus == 0 {
		return 0
	}
	return sum / float64(gpus)
}

// nonDominated returns the indexes of the individuals no other beats in both
// fitness and utility (pop is sorted by decreasing fitness).
func (pr *problem) nonDominated(pop []individual) []int {
	util := make([]float64, len(pop))
	for i := range pop {
		util[i] = pr.utility(pop[i].s)
	}
	var out []int
	bestUtil := math.Inf(-1)
	for i := 0; i < len(pop); {
		// Among equal fitness, only the highest utility survives (and its
		// equals).
		k, top := i, math.Inf(-1)
		for ; k < len(pop) && pop[k].fit == pop[i].fit; k++ {
			top = max(top, util[k])
		}
		if top > bestUtil {
			for x := i; x < k; x++ {
				if util[x] == top {
					out = append(out, x)
				}
			}
			bestUtil = top
		}
		i = k
	}
	return out
}

// tournament picks one of two random individuals (binary tournament): the
// fitter, or under NSGA-II the one that dominates, else the less crowded,
// else either.
func (p *Pollux) tournament(pop []individual) *individual {
	a, b := &pop[p.rng.intn(len(pop))], &pop[p.rng.intn(len(pop))]
	if p.cfg.Selection != NSGA2 {
		if better(b, a) {
			return b
		}
		return a
	}
	switch {
	case dominates(a, b):
		return a
	case dominates(b, a):
		return b
	case a.crowd > b.crowd:
		return a
	case b.crowd > a.crowd:
		return b
	case p.rng.next()&1 == 0:
		return a
	}
	return b
}

// dominates: a is at least as good as b in both objectives and better in one.
func dominates(a, b *individual) bool {
	return a.fit >= b.fit && a.util >= b.util && (a.fit > b.fit || a.util > b.util)
}

// rankAndCrowd assigns each individual its non-dominated front (0 best) and
// its crowding distance within the front, for two objectives.
func rankAndCrowd(pop []individual) {
	order := make([]int, len(pop))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(x, y int) int {
		a, b := &pop[x], &pop[y]
		switch {
		case a.fit != b.fit:
			return cmpDesc(a.fit, b.fit)
		default:
			return cmpDesc(a.util, b.util)
		}
	})
	// In this order, a front's last member is the only one that can
	// dominate a newcomer.
	var last []int
	for _, i := range order {
		f := 0
		for f < len(last) && dominates(&pop[last[f]], &pop[i]) {
			f++
		}
		if f == len(last) {
			last = append(last, i)
		} else {
			last[f] = i
		}
		pop[i].rank = f
	}
	// Crowding distance per front: the normalized gap between the
	// neighbours on each objective, infinite at the ends.
	fronts := make([][]int, len(last))
	for _, i := range order {
		fronts[pop[i].rank] = append(fronts[pop[i].rank], i)
		pop[i].crowd = 0
	}
	for _, fr := range fronts {
		if len(fr) <= 2 {
			for _, i := range fr {
				pop[i].crowd = math.Inf(1)
			}
			continue
		}
		for _, obj := range []func(*individual) float64{
			func(x *individual) float64 { return x.fit },
			func(x *individual) float64 { return x.util },
		} {
			slices.SortStableFunc(fr, func(x, y int) int { return cmpDesc(obj(&pop[y]), obj(&pop[x])) })
			lo, hi := obj(&pop[fr[0]]), obj(&pop[fr[len(fr)-1]])
			pop[fr[0]].crowd, pop[fr[len(fr)-1]].crowd = math.Inf(1), math.Inf(1)
			if hi == lo {
				continue
			}
			for k := 1; k < len(fr)-1; k++ {
				pop[fr[k]].crowd += (obj(&pop[fr[k+1]]) - obj(&pop[fr[k-1]])) / (hi - lo)
			}
		}
	}
}

// sortByRank orders by front, then by decreasing crowding distance.
func sortByRank(pop []individual) {
	slices.SortStableFunc(pop, func(a, b individual) int {
		if a.rank != b.rank {
			return a.rank - b.rank
		}
		return cmpDesc(a.crowd, b.crowd)
	})
}

func cmpDesc(a, b float64) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return 0
}

// better says whether a beats b under elitist selection: a higher fitness,
// or an equal one and a higher preference score.
func better(a, b *individual) bool {
	return a.fit > b.fit || (a.fit == b.fit && a.pref > b.pref)
}

// sortPopulation orders by decreasing fitness, then decreasing preference
// score; ties keep their order, so the search is deterministic.
func sortPopulation(pop []individual) {
	slices.SortStableFunc(pop, func(a, b individual) int {
		switch {
		case better(&a, &b):
			return -1
		case better(&b, &a):
			return 1
		}
		return 0
	})
}

// hashState mixes the state a word at a time (states are whole words).
func hashState(s []uint8) uint64 {
	h := uint64(len(s)) * 0x9e3779b97f4a7c15
	for i := 0; i < len(s); i += 8 {
		h = bits.RotateLeft64(h^word(s, i)*0xbf58476d1ce4e5b9, 27) * 0x94d049bb133111eb
	}
	return h ^ h>>31
}

// rng is SplitMix64: small, fast, and deterministic under a seed.
type rng struct{ s uint64 }

func newRNG(seed uint64) rng { return rng{s: seed} }

func (r *rng) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	z := r.s
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// intn returns a value in [0, n) (Lemire's multiply-shift; the bias is below
// n/2^64).
func (r *rng) intn(n int) int {
	hi, _ := bits.Mul64(r.next(), uint64(n))
	return int(hi)
}
