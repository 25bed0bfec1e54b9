package scheduler

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"
)

// benchJobs builds n jobs with Amdahl-like goodput curves of varied
// scalability, some running, some new.
func benchJobs(n int) ([]Job, Allocation) {
	jobs := make([]Job, n)
	alloc := Allocation{}
	node := 0
	for i := range jobs {
		serial := 0.02 + 0.3*float64(i%7)/7
		jobs[i] = Job{
			ID:        fmt.Sprintf("job-%d", i),
			Submitted: time.Duration(i) * time.Minute,
			Attained:  time.Duration(n-i) * time.Hour,
			Goodput: func(nodes, replicas int) float64 {
				r := float64(replicas)
				return r / (1 + serial*(r-1)) / (1 + 0.05*float64(nodes-1))
			},
			MaxProfiledReplicas: 1 + i%8,
			MaxReplicas:         64,
		}
		if i%3 == 0 && node < 16 {
			alloc[jobs[i].ID] = []int{node, node}
			node++
		}
	}
	return jobs, alloc
}

// BenchmarkPolluxRound is one scheduling round of the paper's configuration
// (population 100, 100 generations) on a 16 × 4 cluster.
func BenchmarkPolluxRound(b *testing.B) {
	for _, n := range []int{10, 30, 60} {
		b.Run(fmt.Sprintf("jobs=%d", n), func(b *testing.B) {
			jobs, alloc := benchJobs(n)
			cluster := NewCluster(16, 4)
			p := NewPollux(PolluxConfig{Seed: 1})
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				a, err := p.Allocate(context.Background(), 2*time.Hour, jobs, cluster, alloc)
				if err != nil {
					b.Fatal(err)
				}
				alloc = a
			}
			_ = math.Pi
		})
	}
}
