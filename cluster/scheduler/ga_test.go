package scheduler

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"
)

// referenceRepair is Pollux's repair written as its numpy code reads
// (cumulative sums over jobs and nodes), on an unpadded jobs × nodes matrix.
// The fast repair must agree with it exactly, including its use of the
// random stream (one shuffle per job over its maximum, in job order).
func referenceRepair(pr *problem, s [][]int, r *rng) {
	J, N := len(s), pr.nodes
	// distributed = count_nonzero(states, axis=nodes) > 1
	dist := make([]bool, J)
	for j := range s {
		nz := 0
		for _, v := range s[j] {
			if v > 0 {
				nz++
			}
		}
		dist[j] = nz > 1
	}
	// mask = states * distributed > 0; mask = cumsum(mask, axis=jobs) > 1
	for n := 0; n < N; n++ {
		c := 0
		for j := 0; j < J; j++ {
			if s[j][n] > 0 && dist[j] {
				c++
			}
			if c > 1 {
				s[j][n] = 0
			}
		}
	}
	// shuffle nodes; states = diff(minimum(cumsum(states), max_replicas))
	for j := 0; j < J; j++ {
		sum := 0
		for _, v := range s[j] {
			sum += v
		}
		if sum <= pr.maxRep[j] {
			continue // the cumulative sum never reaches the cap
		}
		perm := make([]int, N)
		for i := range perm {
			perm[i] = i
		}
		for i := N - 1; i > 0; i-- {
			k := r.intn(i + 1)
			perm[i], perm[k] = perm[k], perm[i]
		}
		prev := 0
		cum := 0
		for _, n := range perm {
			cum += s[j][n]
			capped := min(cum, pr.maxRep[j])
			s[j][n] = capped - prev
			prev = capped
		}
	}
	// states = diff(minimum(cumsum(states, axis=jobs), node_resources))
	for n := 0; n < N; n++ {
		prev, cum := 0, 0
		for j := 0; j < J; j++ {
			cum += s[j][n]
			capped := min(cum, int(pr.cap[n]))
			s[j][n] = capped - prev
			prev = capped
		}
	}
	// states[sum(states, axis=nodes) < min_replicas] = 0
	for j := 0; j < J; j++ {
		sum := 0
		for _, v := range s[j] {
			sum += v
		}
		if sum < pr.minRep[j] {
			clear(s[j])
		}
	}
}

// testProblem builds a problem for jobs on a cluster, as Allocate would.
func testProblem(t testing.TB, jobs []Job, cluster Cluster, current Allocation, now time.Duration) (*Pollux, *problem) {
	t.Helper()
	p := NewPollux(PolluxConfig{Seed: 7})
	if err := validateJobs(jobs); err != nil {
		t.Fatal(err)
	}
	return p, p.newProblem(now, jobs, cluster, current)
}

func linearJobs(n int) []Job {
	jobs := make([]Job, n)
	for i := range jobs {
		jobs[i] = Job{ID: fmt.Sprintf("j%d", i), Submitted: time.Duration(i) * time.Second,
			Goodput:             func(nodes, replicas int) float64 { return float64(replicas) },
			MaxProfiledReplicas: 1 + i%5, MinReplicas: i % 3}
	}
	return jobs
}

func TestRepairMatchesPolluxReference(t *testing.T) {
	for _, tc := range []struct {
		name         string
		nodes, gpus  int
		jobs, trials int
	}{
		{"1 node", 1, 4, 3, 500},
		{"5 nodes", 5, 4, 6, 2000},
		{"16 nodes", 16, 4, 20, 2000},
		{"9 nodes of 8", 9, 8, 12, 2000}, // rows span two words
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, pr := testProblem(t, linearJobs(tc.jobs), NewCluster(tc.nodes, tc.gpus), nil, time.Hour)
			gen := newRNG(42)
			for trial := 0; trial < tc.trials; trial++ {
				// Random states, denser than the search makes them, so
				// every rule fires.
				ref := make([][]int, tc.jobs)
				s := make([]uint8, tc.jobs*pr.stride)
				for j := range ref {
					ref[j] = make([]int, tc.nodes)
					for n := range ref[j] {
						if gen.intn(3) == 0 {
							v := gen.intn(tc.gpus + 1)
							ref[j][n] = v
							s[j*pr.stride+n] = uint8(v)
						}
					}
				}
				r1, r2 := newRNG(uint64(trial)), newRNG(uint64(trial))
				referenceRepair(pr, ref, &r1)
				pr.repair(s, &r2)
				for j := range ref {
					for n := range ref[j] {
						if int(s[j*pr.stride+n]) != ref[j][n] {
							t.Fatalf("trial %d: job %d node %d: repair gave %d, Pollux's rules %d", trial, j, n, s[j*pr.stride+n], ref[j][n])
						}
					}
					for n := tc.nodes; n < pr.stride; n++ {
						if s[j*pr.stride+n] != 0 {
							t.Fatalf("trial %d: padding of job %d written", trial, j)
						}
					}
				}
				if r1 != r2 {
					t.Fatalf("trial %d: repair used the random stream differently", trial)
				}
			}
		})
	}
}

func TestMutateGrowsOnFreeNodesOnly(t *testing.T) {
	jobs := linearJobs(6)
	cluster := NewCluster(4, 4)
	current := Allocation{"j0": {0, 0}, "j1": {1, 1, 1, 1}, "j2": {2}}
	_, pr := testProblem(t, jobs, cluster, current, time.Hour)
	r := newRNG(3)
	grew := map[int]int{}
	for trial := 0; trial < 5000; trial++ {
		s := slices.Clone(pr.base)
		pr.grow(s, &r)
		for j := range jobs {
			row, base := s[j*pr.stride:(j+1)*pr.stride], pr.base[j*pr.stride:(j+1)*pr.stride]
			for n := 0; n < pr.nodes; n++ {
				if row[n] > pr.cap[n] {
					t.Fatalf("job %d got %d on node %d of %d GPUs", j, row[n], n, pr.cap[n])
				}
				if row[n] < base[n] {
					t.Fatalf("grow shrank job %d on node %d", j, n)
				}
				if row[n] > base[n] {
					grew[n]++
				}
			}
		}
	}
	// Node 1 is full; nodes 0, 2 and 3 have room.
	if grew[1] != 0 || grew[0] == 0 || grew[2] == 0 || grew[3] == 0 {
		t.Fatalf("grows per node %v: want none on the full node 1, some on the others", grew)
	}
	// The whole mutation also resets jobs to where they run now.
	kept := 0
	for trial := 0; trial < 1000; trial++ {
		s := make([]uint8, len(pr.base))
		pr.mutate(s, &r)
		if slices.Equal(s[:pr.stride], pr.base[:pr.stride]) {
			kept++
		}
	}
	if kept == 0 {
		t.Fatal("mutation never reset job j0 to its current allocation")
	}
}

func TestWordHelpers(t *testing.T) {
	for _, tc := range []struct {
		row           []uint8
		nodes, copies int
	}{
		{[]uint8{0, 0, 0, 0, 0, 0, 0, 0}, 0, 0},
		{[]uint8{1, 0, 0, 0, 0, 0, 0, 0}, 1, 1},
		{[]uint8{0, 0, 0, 0, 0, 0, 0, 255}, 1, 255},
		{[]uint8{255, 255, 255, 255, 255, 255, 255, 255}, 8, 2040},
		{[]uint8{4, 0, 2, 0, 128, 1, 0, 16, 0, 0, 0, 0, 0, 0, 0, 3}, 6, 154},
	} {
		n, r := rowStats(tc.row)
		if n != tc.nodes || r != tc.copies {
			t.Errorf("rowStats(%v) = %d nodes, %d replicas; want %d, %d", tc.row, n, r, tc.nodes, tc.copies)
		}
	}
}

// bruteForceBest enumerates every state the repair leaves unchanged (the
// valid allocations) and returns the best fitness.
func bruteForceBest(pr *problem) float64 {
	J, N, W := len(pr.jobs), pr.nodes, pr.stride
	s := make([]uint8, J*W)
	best := math.Inf(-1)
	var rec func(i int)
	rec = func(i int) {
		if i == J*N {
			c := slices.Clone(s)
			r := newRNG(0)
			pr.repair(c, &r)
			if slices.Equal(c, s) {
				best = max(best, pr.fitness(s))
			}
			return
		}
		j, n := i/N, i%N
		for v := 0; v <= int(pr.cap[n]); v++ {
			s[j*W+n] = uint8(v)
			rec(i + 1)
		}
		s[j*W+n] = 0
	}
	rec(0)
	return best
}

func TestPolluxFindsOptimum(t *testing.T) {
	amdahl := func(serial, nodePenalty float64) func(int, int) float64 {
		return func(nodes, replicas int) float64 {
			r := float64(replicas)
			return r / (1 + serial*(r-1)) / (1 + nodePenalty*float64(nodes-1))
		}
	}
	for _, tc := range []struct {
		name        string
		nodes, gpus int
		jobs        []Job
		current     Allocation
		// want, when set, is the expected allocation's replica counts.
		want map[string]int
	}{
		{
			name: "two linear jobs split one node", nodes: 1, gpus: 4,
			jobs: []Job{
				{ID: "a", Goodput: amdahl(0, 0), MaxProfiledReplicas: 4},
				{ID: "b", Goodput: amdahl(0, 0), MaxProfiledReplicas: 4},
			},
			want: map[string]int{"a": 2, "b": 2},
		},
		{
			name: "a job that does not scale keeps one GPU", nodes: 1, gpus: 4,
			jobs: []Job{
				{ID: "scales", Goodput: amdahl(0, 0), MaxProfiledReplicas: 4},
				{ID: "flat", Goodput: func(n, r int) float64 { return 1 }, MaxProfiledReplicas: 4},
			},
			want: map[string]int{"scales": 3, "flat": 1},
		},
		{
			name: "three jobs, two nodes, network cost", nodes: 2, gpus: 3,
			jobs: []Job{
				{ID: "a", Goodput: amdahl(0.05, 0.4), MaxProfiledReplicas: 3},
				{ID: "b", Goodput: amdahl(0.3, 0.1), MaxProfiledReplicas: 2},
				{ID: "c", Goodput: amdahl(0.01, 0.9), MaxProfiledReplicas: 3, Attained: time.Hour},
			},
			current: Allocation{"a": {0, 0}, "c": {1}},
		},
		{
			name: "four jobs, three nodes, replica caps", nodes: 3, gpus: 2,
			jobs: []Job{
				{ID: "a", Goodput: amdahl(0.1, 0.2), MaxProfiledReplicas: 1},
				{ID: "b", Goodput: amdahl(0.02, 0.05), MaxProfiledReplicas: 3},
				{ID: "c", Goodput: amdahl(0.5, 0), MaxProfiledReplicas: 2, Restarts: 3},
				{ID: "d"}, // never measured: assumed to scale perfectly
			},
			current: Allocation{"b": {0, 1}, "c": {2}},
		},
	} {
		for _, sel := range []Selection{Elitist, NSGA2} {
			t.Run(fmt.Sprintf("%s/selection %d", tc.name, sel), func(t *testing.T) {
				now := time.Hour
				cluster := NewCluster(tc.nodes, tc.gpus)
				_, pr := testProblem(t, slices.Clone(tc.jobs), cluster, tc.current, now)
				want := bruteForceBest(pr)
				p := NewPollux(PolluxConfig{Seed: 7, Selection: sel})
				alloc, err := p.Allocate(context.Background(), now, slices.Clone(tc.jobs), cluster, tc.current)
				if err != nil {
					t.Fatal(err)
				}
				s := make([]uint8, len(pr.jobs)*pr.stride)
				for j, job := range pr.jobs {
					for _, n := range alloc[job.ID] {
						s[j*pr.stride+n]++
					}
				}
				if got := pr.fitness(s); math.Abs(got-want) > 1e-12 {
					t.Fatalf("allocation %v has fitness %v; the best valid allocation has %v", alloc, got, want)
				}
				for id, n := range tc.want {
					if len(alloc[id]) != n {
						t.Errorf("job %s got %d replicas, want %d (allocation %v)", id, len(alloc[id]), n, alloc)
					}
				}
			})
		}
	}
}

func TestRankAndCrowd(t *testing.T) {
	// (fitness, utility) points: a, b, c trade off (front 0); d is
	// dominated by b only (front 1); e by d (front 2); f equals b.
	pop := []individual{
		{fit: 3, util: 1}, // a
		{fit: 2, util: 2}, // b
		{fit: 1, util: 3}, // c
		{fit: 1.5, util: 1.5},
		{fit: 1, util: 1},
		{fit: 2, util: 2},
	}
	rankAndCrowd(pop)
	for i, want := range []int{0, 0, 0, 1, 2, 0} {
		if pop[i].rank != want {
			t.Errorf("point %d (%v, %v): front %d, want %d", i, pop[i].fit, pop[i].util, pop[i].rank, want)
		}
	}
	// The ends of front 0 are infinitely far from crowding; b and its
	// twin are not.
	if !math.IsInf(pop[0].crowd, 1) || !math.IsInf(pop[2].crowd, 1) || math.IsInf(pop[1].crowd, 1) {
		t.Errorf("crowding distances %v, %v, %v", pop[0].crowd, pop[1].crowd, pop[2].crowd)
	}
}

func TestPolluxDeterministicUnderSeed(t *testing.T) {
	jobs, current := benchJobs(25)
	cluster := NewCluster(16, 4)
	run := func(seed uint64) []Allocation {
		p := NewPollux(PolluxConfig{Seed: seed, Population: 40, Generations: 30})
		alloc := current
		var out []Allocation
		for round := 0; round < 4; round++ {
			a, err := p.Allocate(context.Background(), time.Duration(round+2)*time.Hour, slices.Clone(jobs), cluster, alloc)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, a)
			alloc = a
		}
		return out
	}
	a, b := run(11), run(11)
	for i := range a {
		if fmt.Sprint(a[i]) != fmt.Sprint(b[i]) {
			t.Fatalf("round %d: the same seed gave %v and %v", i, a[i], b[i])
		}
	}
	differs := false
	for seed := uint64(12); seed < 20 && !differs; seed++ {
		c := run(seed)
		for i := range a {
			differs = differs || fmt.Sprint(a[i]) != fmt.Sprint(c[i])
		}
	}
	if !differs {
		t.Fatal("eight other seeds all gave the same allocations: the seed is not used")
	}
}

func TestPolluxRestartPenalty(t *testing.T) {
	// One job runs on 2 of 4 GPUs and would go twice as fast on all 4. Young,
	// the move costs more than it gains ((age − restarts·δ)/(age + δ) =
	// 10/40); after an hour it pays.
	for _, tc := range []struct {
		name     string
		age      time.Duration
		penalty  PolluxConfig
		replicas int
	}{
		{"young job stays", 10 * time.Second, PolluxConfig{}, 2},
		{"old job grows", time.Hour, PolluxConfig{}, 4},
		{"free rescale: young job grows", 10 * time.Second, PolluxConfig{NoRestartPenalty: true}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.penalty
			cfg.Seed = 1
			p := NewPollux(cfg)
			jobs := []Job{{ID: "a", Goodput: func(n, r int) float64 { return float64(r) }, MaxProfiledReplicas: 2}}
			alloc, err := p.Allocate(context.Background(), tc.age, jobs, NewCluster(1, 4), Allocation{"a": {0, 0}})
			if err != nil {
				t.Fatal(err)
			}
			if got := len(alloc["a"]); got != tc.replicas {
				t.Fatalf("got %d replicas, want %d", got, tc.replicas)
			}
		})
	}
}

func TestPolluxFairness(t *testing.T) {
	// "fast" gains a lot per GPU, "slow" little. The sum of speed-ups
	// (p = 1) gives "slow" only what "fast" cannot use; the harmonic mean
	// (p = −1) gives it a fairer share.
	jobs := []Job{
		{ID: "fast", Goodput: func(n, r int) float64 { return float64(r) }, MaxProfiledReplicas: 4},
		{ID: "slow", Goodput: func(n, r int) float64 { return 1 + 0.2*float64(r-1) }, MaxProfiledReplicas: 4},
	}
	got := map[float64]int{}
	for _, p := range []float64{1, -1} {
		alloc, err := NewPollux(PolluxConfig{Seed: 3, Fairness: p}).Allocate(context.Background(), time.Hour, slices.Clone(jobs), NewCluster(2, 4), nil)
		if err != nil {
			t.Fatal(err)
		}
		got[p] = len(alloc["slow"])
	}
	if !(got[-1] > got[1]) || got[1] < 1 {
		t.Fatalf("slow job got %d GPUs under p = −1 and %d under p = 1; want more under −1, and some under 1", got[-1], got[1])
	}
}

func TestPolluxOneDistributedJobPerNode(t *testing.T) {
	jobs := make([]Job, 6)
	for i := range jobs {
		jobs[i] = Job{ID: fmt.Sprint("j", i), Goodput: func(n, r int) float64 { return float64(r) }, MaxProfiledReplicas: 8}
	}
	alloc, err := NewPollux(PolluxConfig{Seed: 5}).Allocate(context.Background(), time.Hour, jobs, NewCluster(4, 4), nil)
	if err != nil {
		t.Fatal(err)
	}
	distributedOn := map[int]int{}
	total := 0
	for _, nodes := range alloc {
		total += len(nodes)
		if p := Placement(nodes); len(p) > 1 {
			for _, n := range slices.Compact(slices.Clone(nodes)) {
				distributedOn[n]++
			}
		}
	}
	for n, c := range distributedOn {
		if c > 1 {
			t.Fatalf("node %d holds %d distributed jobs: %v", n, c, alloc)
		}
	}
	if total != 16 {
		t.Fatalf("%d of 16 GPUs allocated to linearly scaling jobs: %v", total, alloc)
	}
}

func TestPolluxEligibleNodes(t *testing.T) {
	linear := func(n, r int) float64 { return float64(r) }
	for _, tc := range []struct {
		name     string
		eligible map[string][]bool
		current  Allocation
		// fewest replicas each job must get
		least map[string]int
	}{
		{"every job free", nil, nil, map[string]int{"a": 1, "b": 1, "c": 1}},
		{"two pinned jobs and a free one", map[string][]bool{"a": {true, true, false, false}, "b": {false, false, true}}, nil,
			map[string]int{"a": 1, "b": 1, "c": 1}},
		{"a current allocation outside the set is left", map[string][]bool{"a": {false, true}}, Allocation{"a": {3, 3, 3}},
			map[string]int{"a": 1}},
		{"a job no node is eligible for gets nothing", map[string][]bool{"b": {}}, nil, map[string]int{"a": 1, "c": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var jobs []Job
			for _, id := range []string{"a", "b", "c"} {
				jobs = append(jobs, Job{ID: id, Goodput: linear, MaxProfiledReplicas: 4, Eligible: tc.eligible[id]})
			}
			alloc, err := NewPollux(PolluxConfig{Seed: 7}).Allocate(context.Background(), time.Hour, jobs, NewCluster(4, 4), tc.current)
			if err != nil {
				t.Fatal(err)
			}
			for _, j := range jobs {
				for _, n := range alloc[j.ID] {
					if !eligibleNode(j.Eligible, n) {
						t.Errorf("job %s got node %d outside its eligible set %v: %v", j.ID, n, j.Eligible, alloc)
					}
				}
				if e := j.Eligible; e != nil && !slices.Contains(e, true) && len(alloc[j.ID]) > 0 {
					t.Errorf("job %s, eligible nowhere, got %v", j.ID, alloc[j.ID])
				}
				if len(alloc[j.ID]) < tc.least[j.ID] {
					t.Errorf("job %s got %d replicas, want at least %d: %v", j.ID, len(alloc[j.ID]), tc.least[j.ID], alloc)
				}
			}
		})
	}
}

func TestPolluxErrors(t *testing.T) {
	ok := []Job{{ID: "a"}}
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		jobs    []Job
		cluster Cluster
		want    error
	}{
		{"duplicate", context.Background(), []Job{{ID: "a"}, {ID: "a"}}, NewCluster(1, 4), ErrInvalidJob},
		{"empty ID", context.Background(), []Job{{}}, NewCluster(1, 4), ErrInvalidJob},
		{"bounds", context.Background(), []Job{{ID: "a", MinReplicas: 3, MaxReplicas: 2}}, NewCluster(1, 4), ErrInvalidJob},
		{"no nodes", context.Background(), ok, Cluster{}, nil},
		{"canceled", canceled, ok, NewCluster(1, 4), context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewPollux(PolluxConfig{}).Allocate(tc.ctx, 0, tc.jobs, tc.cluster, nil)
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

func TestPolluxPreference(t *testing.T) {
	// Spreading a job over more nodes costs it 10 % a node, so each job's
	// best allocation is on one node, and which one is Pollux's to choose:
	// the preference decides.
	packed := func(n, r int) float64 { return float64(r) * (1 - 0.1*float64(n-1)) }
	for _, tc := range []struct {
		name    string
		jobs    []Job
		current Allocation
		want    Allocation
	}{
		{"node 0 preferred", []Job{{ID: "a", MaxReplicas: 4, Preference: []int{100, 0, 0, 0}}}, nil, Allocation{"a": {0, 0, 0, 0}}},
		{"node 1 preferred", []Job{{ID: "a", MaxReplicas: 4, Preference: []int{0, 100}}}, nil, Allocation{"a": {1, 1, 1, 1}}},
		{"node 2 preferred", []Job{{ID: "a", MaxReplicas: 4, Preference: []int{0, 0, 1, 0}}}, nil, Allocation{"a": {2, 2, 2, 2}}},
		{"node 3 preferred", []Job{{ID: "a", MaxReplicas: 4, Preference: []int{0, 0, 0, 100}}}, nil, Allocation{"a": {3, 3, 3, 3}}},
		{"the larger summed weight", []Job{{ID: "a", MaxReplicas: 4, Preference: []int{0, 30, 31, 0}}}, nil, Allocation{"a": {2, 2, 2, 2}}},
		{"within the eligible nodes", []Job{{ID: "a", MaxReplicas: 4, Eligible: []bool{true, true}, Preference: []int{0, 50, 0, 100}}},
			nil, Allocation{"a": {1, 1, 1, 1}}},
		{"the preferred node is full: the next", []Job{
			{ID: "a", MaxReplicas: 4, Preference: []int{0, 20, 0, 100}},
			{ID: "b", MaxReplicas: 4, Submitted: -time.Hour},
		}, Allocation{"b": {3, 3, 3, 3}}, Allocation{"a": {1, 1, 1, 1}, "b": {3, 3, 3, 3}}},
		{"a running job is not moved to its preferred node", []Job{
			{ID: "a", MaxReplicas: 4, Preference: []int{0, 0, 0, 100}, Submitted: -time.Hour},
		}, Allocation{"a": {0, 0, 0, 0}}, Allocation{"a": {0, 0, 0, 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range tc.jobs {
				tc.jobs[i].Goodput, tc.jobs[i].MaxProfiledReplicas = packed, 4
			}
			alloc, err := NewPollux(PolluxConfig{Seed: 7}).Allocate(context.Background(), time.Hour, tc.jobs, NewCluster(4, 4), tc.current)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(alloc) != fmt.Sprint(tc.want) {
				t.Fatalf("got %v, want %v", alloc, tc.want)
			}
		})
	}
}

// TestPolluxPreferenceKeepsCounts: preferences change where Pollux puts
// replicas, not how many each job gets.
func TestPolluxPreferenceKeepsCounts(t *testing.T) {
	concave := func(k float64) func(n, r int) float64 {
		return func(n, r int) float64 { return math.Pow(float64(r), k) * (1 - 0.05*float64(n-1)) }
	}
	jobs := []Job{
		{ID: "a", Goodput: concave(0.9), MaxProfiledReplicas: 4},
		{ID: "b", Goodput: concave(0.6), MaxProfiledReplicas: 4, MinReplicas: 2},
		{ID: "c", Goodput: concave(0.8), MaxProfiledReplicas: 2, Submitted: time.Minute},
		{ID: "d", Goodput: concave(0.95), MaxProfiledReplicas: 8, Submitted: 2 * time.Minute},
	}
	plain, err := NewPollux(PolluxConfig{Seed: 3}).Allocate(context.Background(), time.Hour, slices.Clone(jobs), NewCluster(3, 4), nil)
	if err != nil {
		t.Fatal(err)
	}
	preferring := slices.Clone(jobs)
	for i := range preferring {
		preferring[i].Preference = []int{0, 10 * i, 100 - 20*i}
	}
	prefer, err := NewPollux(PolluxConfig{Seed: 3}).Allocate(context.Background(), time.Hour, preferring, NewCluster(3, 4), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs {
		if len(plain[j.ID]) != len(prefer[j.ID]) || len(Placement(plain[j.ID])) != len(Placement(prefer[j.ID])) {
			t.Errorf("job %s: %v without preferences, %v with", j.ID, plain[j.ID], prefer[j.ID])
		}
	}
	t.Logf("without preferences %v, with %v", plain, prefer)
}

// TestPolluxMaxPerNode: a job's cap per node (Job.MaxPerNode) holds in every
// allocation Pollux returns, from a fresh search and from a current
// allocation over the cap, and a job whose minimum its nodes cannot hold at
// its cap gets nothing. Spreading a job costs it 10 % a node, so without
// the cap each job would be packed on one node.
func TestPolluxMaxPerNode(t *testing.T) {
	packed := func(n, r int) float64 { return float64(r) * (1 - 0.1*float64(n-1)) }
	for _, tc := range []struct {
		name    string
		jobs    []Job
		current Allocation
		// replicas each job must get; want, where set, the allocation.
		replicas map[string]int
		want     Allocation
	}{
		{"one per node", []Job{{ID: "a", MaxReplicas: 4, MaxPerNode: 1}}, nil,
			map[string]int{"a": 4}, Allocation{"a": {0, 1, 2, 3}}},
		{"two per node", []Job{{ID: "a", MaxReplicas: 4, MaxPerNode: 2}}, nil,
			map[string]int{"a": 4}, nil},
		{"two per node on the preferred nodes", []Job{{ID: "a", MaxReplicas: 4, MaxPerNode: 2, Preference: []int{0, 0, 50, 100}}}, nil,
			map[string]int{"a": 4}, Allocation{"a": {2, 2, 3, 3}}},
		{"one per eligible node", []Job{{ID: "a", MaxReplicas: 4, MaxPerNode: 1, Eligible: []bool{false, true, false, true}}}, nil,
			map[string]int{"a": 2}, Allocation{"a": {1, 3}}},
		{"a current allocation over the cap is cut", []Job{{ID: "a", MaxReplicas: 4, MaxPerNode: 2, Submitted: -time.Hour}},
			Allocation{"a": {0, 0, 0, 0}}, map[string]int{"a": 4}, nil},
		{"a minimum over what the nodes hold at the cap waits", []Job{
			{ID: "a", MinReplicas: 5, MaxReplicas: 8, MaxPerNode: 1},
			{ID: "b", MaxReplicas: 4, Submitted: time.Minute},
		}, nil, map[string]int{"a": 0, "b": 4}, nil},
		{"a capped job beside one packed", []Job{
			{ID: "a", MaxReplicas: 4, MaxPerNode: 1},
			{ID: "b", MaxReplicas: 3, Submitted: time.Minute},
		}, nil, map[string]int{"a": 4, "b": 3}, nil},
	} {
		for _, sel := range []Selection{Elitist, NSGA2} {
			t.Run(fmt.Sprintf("%s/selection=%d", tc.name, sel), func(t *testing.T) {
				for i := range tc.jobs {
					tc.jobs[i].Goodput, tc.jobs[i].MaxProfiledReplicas = packed, 4
				}
				alloc, err := NewPollux(PolluxConfig{Seed: 7, Selection: sel}).Allocate(context.Background(), time.Hour, tc.jobs, NewCluster(4, 4), tc.current)
				if err != nil {
					t.Fatal(err)
				}
				for _, j := range tc.jobs {
					if !withinCap(alloc[j.ID], j.MaxPerNode) {
						t.Errorf("job %s has more than %d replicas on a node: %v", j.ID, j.MaxPerNode, alloc)
					}
					if got := len(alloc[j.ID]); got != tc.replicas[j.ID] {
						t.Errorf("job %s got %d replicas, want %d: %v", j.ID, got, tc.replicas[j.ID], alloc)
					}
				}
				if tc.want != nil && fmt.Sprint(alloc) != fmt.Sprint(tc.want) {
					t.Errorf("got %v, want %v", alloc, tc.want)
				}
			})
		}
	}
}
