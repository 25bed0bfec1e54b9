package scheduler

import (
	"context"
	"errors"
	"math"
	"math/bits"
	"slices"
	"sort"
	"time"
)

// PolluxConfig configures the Pollux policy. A zero field means its default.
type PolluxConfig struct {
	// Population is the genetic algorithm's population size (100).
	Population int
	// Generations is how many generations each round runs (100).
	Generations int
	// Fairness is the exponent p of the power mean of the jobs' speed-ups
	// that Pollux maximizes (−1: the harmonic mean; more negative is
	// fairer, 1 maximizes the plain sum). 0 means −1.
	Fairness float64
	// RestartPenalty is what a reallocation costs a job (δ in Pollux's
	// re-allocation factor (age − restarts·δ)/(age + δ)): the time it
	// spends rescaling. 0 means 30 s, the checkpoint-restart cost the
	// paper charges; set NoRestartPenalty for a free rescale.
	RestartPenalty time.Duration
	// NoRestartPenalty makes reallocations free (RestartPenalty ignored).
	NoRestartPenalty bool
	// ReplicaGrowth caps a job at this many times the largest replica count
	// it has been measured at (2).
	ReplicaGrowth int
	// Seed seeds the genetic algorithm: the same seed and the same inputs
	// give the same allocations.
	Seed uint64
}

// DefaultPolluxConfig returns the configuration of Pollux's simulator study.
func DefaultPolluxConfig() PolluxConfig {
	return PolluxConfig{Population: 100, Generations: 100, Fairness: -1,
		RestartPenalty: 30 * time.Second, ReplicaGrowth: 2, Seed: 1}
}

func (c PolluxConfig) withDefaults() PolluxConfig {
	d := DefaultPolluxConfig()
	if c.Population <= 0 {
		c.Population = d.Population
	}
	if c.Generations <= 0 {
		c.Generations = d.Generations
	}
	if c.Fairness == 0 {
		c.Fairness = d.Fairness
	}
	if c.RestartPenalty <= 0 {
		c.RestartPenalty = d.RestartPenalty
	}
	if c.NoRestartPenalty {
		c.RestartPenalty = 0
	}
	if c.ReplicaGrowth <= 0 {
		c.ReplicaGrowth = d.ReplicaGrowth
	}
	return c
}

// Pollux is the scheduling policy of Pollux (Qiao et al., OSDI'21): each round
// it searches the allocations of GPUs to jobs (a jobs × nodes matrix of
// replica counts) with a genetic algorithm for the one maximizing the power
// mean (p = Fairness) of the jobs' speed-ups, where a job's speed-up is its
// predicted goodput over its goodput on a fair share of the cluster, scaled by
// the re-allocation factor when the allocation moves the job. Allocations keep
// at most one distributed job on a node and each job within
// [MinReplicas, min(MaxReplicas, ReplicaGrowth × MaxProfiledReplicas)]; jobs
// that have attained less GPU time get the contested GPUs first. The final
// population seeds the next round's search.
type Pollux struct {
	cfg PolluxConfig
	rng rng
	// The previous round's final population, for warm starts.
	prevJobs  []string
	prevNodes int
	prevPop   [][]uint8
	// Reused buffers.
	ga gaState
}

// NewPollux returns a Pollux policy for one cluster.
func NewPollux(cfg PolluxConfig) *Pollux {
	cfg = cfg.withDefaults()
	return &Pollux{cfg: cfg, rng: newRNG(cfg.Seed)}
}

// Name implements Policy.
func (p *Pollux) Name() string { return "pollux" }

// Allocate implements Policy.
func (p *Pollux) Allocate(ctx context.Context, now time.Duration, jobs []Job, cluster Cluster, current Allocation) (Allocation, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := cluster.validate(); err != nil {
		return nil, err
	}
	if err := validateJobs(jobs); err != nil {
		return nil, err
	}
	if len(jobs) == 0 {
		return Allocation{}, nil
	}
	pr := p.newProblem(now, jobs, cluster, current)
	best, err := p.search(ctx, pr)
	if err != nil {
		return nil, err
	}
	alloc := make(Allocation, len(pr.jobs))
	for j, job := range pr.jobs {
		var nodes []int
		for n := 0; n < pr.nodes; n++ {
			for c := 0; c < int(best[j*pr.nodes+n]); c++ {
				nodes = append(nodes, n)
			}
		}
		if len(nodes) > 0 {
			alloc[job.ID] = nodes
		}
	}
	return alloc, nil
}

// problem is one round's optimization problem.
type problem struct {
	jobs    []*Job // in priority order: least attained service first
	nodes   int
	cap     []uint8 // GPUs per node
	base    []uint8 // the allocation in force, jobs × nodes
	maxRep  []int
	minRep  []int
	factor  []float64 // re-allocation factor per job
	scale   float64   // speed-up of a fair share → share of one node
	power   float64
	fairN   int
	fairR   int
	baseGP  []float64 // goodput on the fair share; 0: unmeasured job
	speedup [][]float64
	dist    []bool // repair's scratch
}

func (p *Pollux) newProblem(now time.Duration, jobs []Job, cluster Cluster, current Allocation) *problem {
	pr := &problem{nodes: len(cluster.GPUs), power: p.cfg.Fairness}
	pr.jobs = make([]*Job, len(jobs))
	for i := range jobs {
		pr.jobs[i] = &jobs[i]
	}
	sort.SliceStable(pr.jobs, func(a, b int) bool {
		x, y := pr.jobs[a], pr.jobs[b]
		if x.Attained != y.Attained {
			return x.Attained < y.Attained
		}
		return x.Submitted < y.Submitted
	})
	J, N := len(pr.jobs), pr.nodes
	total := cluster.TotalGPUs()
	pr.cap = make([]uint8, N)
	for n, g := range cluster.GPUs {
		pr.cap[n] = uint8(g)
	}
	pr.base = make([]uint8, J*N)
	pr.maxRep = make([]int, J)
	pr.minRep = make([]int, J)
	pr.factor = make([]float64, J)
	pr.baseGP = make([]float64, J)
	pr.speedup = make([][]float64, J)
	pr.dist = make([]bool, J)
	// A replica's dominant share is one GPU of the cluster; a fair share is
	// 1/J of the cluster, on as few nodes as that share of the nodes.
	pr.fairR = max(1, ceilDiv(total, J))
	pr.fairN = max(1, ceilDiv(N, max(total, 1)))
	pr.scale = float64(N) / float64(max(total, 1))
	delta := p.cfg.RestartPenalty.Seconds()
	for j, job := range pr.jobs {
		for _, n := range current[job.ID] {
			if n >= 0 && n < N && pr.base[j*N+n] < 255 {
				pr.base[j*N+n]++
			}
		}
		limit := total
		if job.MaxReplicas > 0 {
			limit = min(limit, job.MaxReplicas)
		}
		pr.maxRep[j] = min(limit, max(p.cfg.ReplicaGrowth*job.MaxProfiledReplicas, 1))
		pr.minRep[j] = job.MinReplicas
		age := (now - job.Submitted).Seconds()
		if age+delta > 0 {
			pr.factor[j] = max(age-float64(job.Restarts)*delta, 0) / (age + delta)
		} else {
			pr.factor[j] = 1
		}
		if job.Goodput != nil {
			if g := job.Goodput(pr.fairN, pr.fairR); g > 0 && !math.IsInf(g, 0) {
				pr.baseGP[j] = g
			}
		}
		table := make([]float64, (N+1)*(pr.maxRep[j]+1))
		for i := range table {
			table[i] = -1
		}
		pr.speedup[j] = table
	}
	return pr
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// speedupOf returns job j's speed-up on r replicas over n nodes, computing it
// on first use (goodput predictions cost a batch-size search each).
func (pr *problem) speedupOf(j, n, r int) float64 {
	t := pr.speedup[j]
	i := n*(pr.maxRep[j]+1) + r
	if s := t[i]; s >= 0 {
		return s
	}
	var s float64
	if pr.baseGP[j] == 0 {
		s = float64(r) / float64(pr.fairR) // unmeasured: perfect scaling
	} else {
		s = pr.jobs[j].Goodput(n, r) / pr.baseGP[j]
		if !(s >= 0) || math.IsInf(s, 0) {
			s = 0 // a model that cannot predict this allocation gains nothing
		}
	}
	t[i] = s
	return s
}

// fitness is the power mean of the jobs' scaled speed-ups in state s.
func (pr *problem) fitness(s []uint8) float64 {
	N := pr.nodes
	sum := 0.0
	for j := range pr.jobs {
		row, base := s[j*N:(j+1)*N], pr.base[j*N:(j+1)*N]
		nodes, reps := 0, 0
		moved := false
		for n, v := range row {
			if v > 0 {
				nodes++
				reps += int(v)
			}
			if v != base[n] {
				moved = true
			}
		}
		sp := 0.0
		if reps > 0 {
			sp = pr.speedupOf(j, nodes, reps) * pr.scale
		}
		if moved {
			sp *= pr.factor[j]
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

// repair makes s a valid allocation, in this order (Pollux's): a node keeps
// at most one distributed job (the first in priority order; the node's
// replicas of every job after a second distributed one are dropped, as
// Pollux's repair does), a job over its maximum keeps replicas on randomly
// chosen nodes up to it, a node over capacity serves jobs in priority order,
// and a job under its minimum gets nothing.
func (pr *problem) repair(s []uint8, r *rng, perm []int) {
	N := pr.nodes
	J := len(pr.jobs)
	// (1) One distributed job per node (distributed as the state was).
	dist := pr.dist[:J]
	for j := range dist {
		dist[j] = pr.distributed(s[j*N : (j+1)*N])
	}
	for n := 0; n < N; n++ {
		seen := 0
		for j := 0; j < J; j++ {
			v := s[j*N+n]
			if seen >= 2 {
				s[j*N+n] = 0
				continue
			}
			if v > 0 && dist[j] {
				seen++
				if seen >= 2 {
					s[j*N+n] = 0
				}
			}
		}
	}
	// (2) Maximum replicas.
	for j := 0; j < J; j++ {
		row := s[j*N : (j+1)*N]
		sum := 0
		for _, v := range row {
			sum += int(v)
		}
		if sum <= pr.maxRep[j] {
			continue
		}
		for i := range perm {
			perm[i] = i
		}
		for i := N - 1; i > 0; i-- {
			k := r.intn(i + 1)
			perm[i], perm[k] = perm[k], perm[i]
		}
		left := pr.maxRep[j]
		for _, n := range perm {
			v := min(int(row[n]), left)
			row[n] = uint8(v)
			left -= v
		}
	}
	// (3) Node capacity, in priority order.
	for n := 0; n < N; n++ {
		left := int(pr.cap[n])
		for j := 0; j < J; j++ {
			v := min(int(s[j*N+n]), left)
			s[j*N+n] = uint8(v)
			left -= v
		}
	}
	// (4) Minimum replicas.
	for j := 0; j < J; j++ {
		row := s[j*N : (j+1)*N]
		sum := 0
		for _, v := range row {
			sum += int(v)
		}
		if sum < pr.minRep[j] {
			clear(row)
		}
	}
}

func (pr *problem) distributed(row []uint8) bool {
	used := 0
	for _, v := range row {
		if v > 0 {
			used++
			if used > 1 {
				return true
			}
		}
	}
	return false
}

// mutate applies Pollux's three mutations to s: reset a job to its current
// allocation (probability 0.1 per job); drop replicas (for 10 % of the jobs,
// each node's count is zeroed with probability 0.1); and grow: on every node
// with a free GPU, a job's count is raised to a uniform value between it and
// the node's size, with probability 1/(nodes with a free GPU), combined with
// 1/(such nodes the job already uses) where it is already there.
func (pr *problem) mutate(s []uint8, r *rng, free []int) {
	N := pr.nodes
	J := len(pr.jobs)
	for j := 0; j < J; j++ {
		if r.chance(0.1) {
			copy(s[j*N:(j+1)*N], pr.base[j*N:(j+1)*N])
		}
	}
	for j := 0; j < J; j++ {
		if r.chance(0.1) {
			row := s[j*N : (j+1)*N]
			for n := range row {
				if r.chance(0.1) {
					row[n] = 0
				}
			}
		}
	}
	for n := 0; n < N; n++ {
		free[n] = int(pr.cap[n])
	}
	freeNodes := 0
	for n := 0; n < N; n++ {
		for j := 0; j < J; j++ {
			free[n] -= int(s[j*N+n])
		}
		if free[n] >= 1 {
			freeNodes++
		}
	}
	if freeNodes == 0 {
		return
	}
	p1 := 1 / float64(freeNodes)
	for j := 0; j < J; j++ {
		row := s[j*N : (j+1)*N]
		present := 0
		for n, v := range row {
			if v > 0 && free[n] >= 1 {
				present++
			}
		}
		p12 := p1
		if present > 0 {
			p2 := 1 / float64(present)
			p12 = p1 + p2 - p1*p2
		}
		for n, v := range row {
			if free[n] < 1 {
				continue
			}
			p := p1
			if v > 0 {
				p = p12
			}
			if r.chance(p) && v < pr.cap[n] {
				row[n] = v + uint8(r.intn(int(pr.cap[n]-v)+1))
			}
		}
	}
}

// individual is one allocation in the population.
type individual struct {
	s    []uint8
	fit  float64
	hash uint64
}

type gaState struct {
	free []int
	perm []int
	pool [][]uint8
}

func (g *gaState) get(size int) []uint8 {
	if n := len(g.pool); n > 0 {
		s := g.pool[n-1]
		g.pool = g.pool[:n-1]
		if cap(s) >= size {
			return s[:size]
		}
	}
	return make([]uint8, size)
}

func (g *gaState) put(s []uint8) { g.pool = append(g.pool, s) }

// crossoverRate is the probability a mating recombines its parents (pymoo's
// default, which Pollux uses); otherwise the offspring are copies.
const crossoverRate = 0.9

// matingRounds bounds the retries for offspring unlike any individual seen in
// the generation. pymoo retries up to 100 times; when a few jobs leave few
// distinct allocations, more retries only repeat the same ones.
const matingRounds = 5

// search runs the genetic algorithm and returns the best state found.
func (p *Pollux) search(ctx context.Context, pr *problem) ([]uint8, error) {
	J, N := len(pr.jobs), pr.nodes
	size := J * N
	g := &p.ga
	if len(g.free) < N {
		g.free, g.perm = make([]int, N), make([]int, N)
	}
	free, perm := g.free[:N], g.perm[:N]
	P := p.cfg.Population
	seen := make(map[uint64]struct{}, 4*P)
	var pop []individual
	add := func(dst *[]individual, s []uint8) bool {
		h := hashState(s)
		if _, dup := seen[h]; dup {
			g.put(s)
			return false
		}
		seen[h] = struct{}{}
		*dst = append(*dst, individual{s: s, fit: pr.fitness(s), hash: h})
		return true
	}
	// Initial population: the allocation in force, then the previous
	// round's population mapped onto this round's jobs and nodes.
	s := g.get(size)
	copy(s, pr.base)
	pr.repair(s, &p.rng, perm)
	add(&pop, s)
	prevRow := make(map[string]int, len(p.prevJobs))
	for i, id := range p.prevJobs {
		prevRow[id] = i
	}
	cols := min(N, p.prevNodes)
	for _, old := range p.prevPop {
		s := g.get(size)
		clear(s)
		for j, job := range pr.jobs {
			if i, ok := prevRow[job.ID]; ok {
				copy(s[j*N:j*N+cols], old[i*p.prevNodes:i*p.prevNodes+cols])
			}
		}
		pr.repair(s, &p.rng, perm)
		add(&pop, s)
	}
	sortPopulation(pop)
	if len(pop) > P {
		for _, ind := range pop[P:] {
			g.put(ind.s)
		}
		pop = pop[:P]
	}

	var off []individual
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
				c1, c2 := g.get(size), g.get(size)
				copy(c1, a.s)
				copy(c2, b.s)
				if p.rng.chance(crossoverRate) {
					// Single-point crossover over jobs: the first
					// `point` jobs come from the other parent.
					point := p.rng.intn(J)
					copy(c1[:point*N], b.s[:point*N])
					copy(c2[:point*N], a.s[:point*N])
				}
				for _, c := range [2][]uint8{c1, c2} {
					pr.mutate(c, &p.rng, free)
					pr.repair(c, &p.rng, perm)
					add(&off, c)
				}
			}
		}
		pop = append(pop, off...)
		sortPopulation(pop)
		if len(pop) > P {
			for _, ind := range pop[P:] {
				g.put(ind.s)
			}
			pop = pop[:P]
		}
	}
	// Keep the population for the next round's warm start.
	for _, old := range p.prevPop {
		g.put(old)
	}
	p.prevPop = p.prevPop[:0]
	for _, ind := range pop {
		p.prevPop = append(p.prevPop, ind.s)
	}
	p.prevJobs = p.prevJobs[:0]
	for _, job := range pr.jobs {
		p.prevJobs = append(p.prevJobs, job.ID)
	}
	p.prevNodes = N
	if len(pop) == 0 {
		return nil, errors.New("scheduler: pollux: empty population")
	}
	return slices.Clone(pop[0].s), nil
}

// tournament picks the fitter of two random individuals (binary tournament).
func (p *Pollux) tournament(pop []individual) *individual {
	a, b := &pop[p.rng.intn(len(pop))], &pop[p.rng.intn(len(pop))]
	if b.fit > a.fit {
		return b
	}
	return a
}

// sortPopulation orders by decreasing fitness; ties keep their order, so the
// search is deterministic.
func sortPopulation(pop []individual) {
	slices.SortStableFunc(pop, func(a, b individual) int {
		switch {
		case a.fit > b.fit:
			return -1
		case a.fit < b.fit:
			return 1
		}
		return 0
	})
}

// hashState is FNV-1a over the state's bytes.
func hashState(s []uint8) uint64 {
	h := uint64(14695981039346656037)
	for _, b := range s {
		h ^= uint64(b)
		h *= 1099511628211
	}
	return h
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

func (r *rng) float64() float64 { return float64(r.next()>>11) / (1 << 53) }

func (r *rng) chance(p float64) bool { return r.float64() < p }

// intn returns a value in [0, n) (Lemire's multiply-shift; the bias is below
// n/2^64).
func (r *rng) intn(n int) int {
	hi, _ := bits.Mul64(r.next(), uint64(n))
	return int(hi)
}
