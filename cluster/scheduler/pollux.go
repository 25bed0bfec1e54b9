package scheduler

import (
	"context"
	"math"
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
	// Selection is how the genetic algorithm picks parents and survivors:
	// Elitist (the default) or NSGA2.
	Selection Selection
}

// Selection is a genetic algorithm's selection scheme.
type Selection int

const (
	// Elitist selects on the power mean alone: binary tournaments between
	// random individuals, and the best of parents and offspring survive.
	Elitist Selection = iota
	// NSGA2 is Pollux's own scheme (pymoo's NSGA-II): on the power mean and
	// the cluster utility together, by non-dominated rank then crowding
	// distance; the allocation chosen is the one of best power mean.
	NSGA2
)

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
// at most one distributed job on a node, each job on its eligible nodes
// (Job.Eligible) with at most Job.MaxPerNode replicas on each, and each job
// within [MinReplicas, min(MaxReplicas, ReplicaGrowth × MaxProfiledReplicas,
// what its nodes hold)]; jobs
// that have attained less GPU time get the contested GPUs first. The final
// population seeds the next round's search.
type Pollux struct {
	cfg PolluxConfig
	rng rng
	// The previous round's final population, for warm starts.
	prevJobs   []string
	prevNodes  int
	prevStride int
	prevPop    [][]uint8
	// Reused state buffers.
	pool [][]uint8
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
			for c := 0; c < int(best[j*pr.stride+n]); c++ {
				nodes = append(nodes, n)
			}
		}
		if len(nodes) > 0 {
			alloc[job.ID] = nodes
		}
	}
	return alloc, nil
}

// problem is one round's optimization problem. States are jobs × nodes
// matrices of replica counts, stored row by row with rows padded to a whole
// number of 64-bit words (stride) so the genetic operators can skip empty
// words; the padding stays zero.
type problem struct {
	jobs   []*Job // in priority order: least attained service first
	nodes  int
	stride int
	cap    []uint8 // GPUs per node
	base   []uint8 // the allocation in force
	maxRep []int
	minRep []int
	// room holds, per job with an eligible set (Job.Eligible) or a cap
	// per node (Job.MaxPerNode), the most replicas of the job each node
	// may hold (0 on a node it may not use); nil for the others.
	room [][]uint8
	// prefer holds, per job with a preference (Job.Preference), each
	// node's score; nil for the others, and all nil when no job has one.
	// The score of a state (preferenceScore) breaks ties of fitness.
	prefer  [][]int
	factor  []float64 // re-allocation factor per job
	scale   float64   // speed-up of a fair share → share of one node
	power   float64
	fairN   int
	fairR   int
	baseGP  []float64 // goodput on the fair share; 0: unmeasured job
	speedup [][]float64
	// Scratch for the operators, per node.
	seen1, seen2 []bool
	left, free   []int
	perm         []int
	freeNodes    []int
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
	W := (N + 7) / 8 * 8
	pr.stride = W
	total := cluster.TotalGPUs()
	pr.cap = make([]uint8, N)
	for n, g := range cluster.GPUs {
		pr.cap[n] = uint8(g)
	}
	pr.seen1, pr.seen2 = make([]bool, N), make([]bool, N)
	pr.left, pr.free, pr.perm = make([]int, N), make([]int, N), make([]int, N)
	pr.freeNodes = make([]int, 0, N)
	pr.base = make([]uint8, J*W)
	pr.maxRep = make([]int, J)
	pr.minRep = make([]int, J)
	pr.room = make([][]uint8, J)
	pr.prefer = make([][]int, J)
	pr.factor = make([]float64, J)
	pr.baseGP = make([]float64, J)
	pr.speedup = make([][]float64, J)
	// A replica's dominant share is one GPU of the cluster; a fair share is
	// 1/J of the cluster, on as few nodes as that share of the nodes.
	pr.fairR = max(1, ceilDiv(total, J))
	pr.fairN = max(1, ceilDiv(N, max(total, 1)))
	pr.scale = float64(N) / float64(max(total, 1))
	delta := p.cfg.RestartPenalty.Seconds()
	for j, job := range pr.jobs {
		for _, n := range current[job.ID] {
			if n >= 0 && n < N && pr.base[j*W+n] < 255 {
				pr.base[j*W+n]++
			}
		}
		limit := total
		if job.MaxReplicas > 0 {
			limit = min(limit, job.MaxReplicas)
		}
		if constrained(job) {
			row, room := make([]uint8, W), 0
			for n := 0; n < N; n++ {
				v := nodeRoom(cluster.GPUs, n, job.Eligible, job.MaxPerNode, nil)
				row[n] = uint8(v)
				room += v
			}
			pr.room[j] = row
			limit = min(limit, room)
		}
		if job.Preference != nil {
			row := make([]int, N)
			for n := range row {
				row[n] = preferenceOf(job.Preference, n)
			}
			pr.prefer[j] = row
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

// preferenceScore is the score of state s under the jobs' preferences: each
// replica scores its node's score in its job's preference. It only breaks
// ties between states of equal fitness, so that Pollux's choice of node,
// where its objective leaves it open, follows the preferences.
func (pr *problem) preferenceScore(s []uint8) int {
	W, score := pr.stride, 0
	for j, prefer := range pr.prefer {
		if prefer == nil {
			continue
		}
		row := s[j*W : (j+1)*W]
		for n, v := range prefer {
			score += int(row[n]) * v
		}
	}
	return score
}

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
