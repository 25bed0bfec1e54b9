package pool_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/cluster/pool"
)

func TestReadJobs(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		err      string // "" for none
		check    func(t *testing.T, specs []pool.JobSpec)
	}{
		{name: "full", in: `[{"name":"a","argv":["x","--y"],"env":["K=V"],"workers":2,"min_workers":1,"max_workers":4,"submit":"1m30s","init_batch":64,"limits":{"max_batch":512,"max_micro_batch":128}},{"name":"b","argv":["z"]}]`,
			check: func(t *testing.T, s []pool.JobSpec) {
				if len(s) != 2 || s[0].Submit != 90*time.Second || s[0].Limits.MaxBatch != 512 || s[0].Workers != 2 || s[1].Argv[0] != "z" {
					t.Errorf("specs = %+v", s)
				}
			}},
		{name: "not an array", in: `{"name":"a"}`, err: "cannot unmarshal"},
		{name: "unknown field", in: `[{"name":"a","argv":["x"],"max_worker":4}]`, err: `unknown field "max_worker"`},
		{name: "trailing value", in: `[{"name":"a","argv":["x"]}] []`, err: "more than one JSON value"},
		{name: "empty", in: `[]`, err: "no jobs"},
		{name: "no name", in: `[{"argv":["x"]}]`, err: "no name"},
		{name: "twice", in: `[{"name":"a","argv":["x"]},{"name":"a","argv":["x"]}]`, err: "taken"},
		{name: "no argv", in: `[{"name":"a"}]`, err: "no command"},
		{name: "bad submit", in: `[{"name":"a","argv":["x"],"submit":"soon"}]`, err: "submit"},
		{name: "negative submit", in: `[{"name":"a","argv":["x"],"submit":"-1s"}]`, err: "negative submit"},
		{name: "min above max", in: `[{"name":"a","argv":["x"],"min_workers":3,"max_workers":2}]`, err: "must not exceed"},
		{name: "workers below min", in: `[{"name":"a","argv":["x"],"min_workers":3,"workers":2}]`, err: "below min_workers"},
		{name: "batch limits", in: `[{"name":"a","argv":["x"],"init_batch":64,"limits":{"max_batch":32}}]`, err: "below the initial batch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			specs, err := pool.ReadJobs(strings.NewReader(tc.in))
			if tc.err == "" {
				if err != nil {
					t.Fatalf("ReadJobs: %v", err)
				}
				tc.check(t, specs)
				return
			}
			if err == nil || !errors.Is(err, pool.ErrInvalidJobs) || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("ReadJobs error = %v, want ErrInvalidJobs containing %q", err, tc.err)
			}
		})
	}
}

func FuzzReadJobs(f *testing.F) {
	f.Add(`[{"name":"a","argv":["x"],"submit":"5s","max_workers":4}]`)
	f.Add(`[{"name":"a","argv":["x"],"init_batch":64,"limits":{"max_batch":128,"min_micro_batch":8}}]`)
	f.Add(`[{"name":"","argv":[]}]`)
	f.Fuzz(func(t *testing.T, in string) {
		specs, err := pool.ReadJobs(strings.NewReader(in))
		if err != nil {
			if !errors.Is(err, pool.ErrInvalidJobs) {
				t.Fatalf("error %v is not ErrInvalidJobs", err)
			}
			return
		}
		for _, s := range specs {
			if s.Name == "" || len(s.Argv) == 0 || s.Submit < 0 || s.MinWorkers < 0 || s.Workers < 0 || s.MaxWorkers < 0 {
				t.Fatalf("accepted an invalid job %+v", s)
			}
		}
	})
}

func TestConfigErrors(t *testing.T) {
	job := pool.JobSpec{Name: "a", Argv: []string{"x"}}
	for _, tc := range []struct {
		name   string
		change func(c *pool.Config)
		want   error
	}{
		{"no slots", func(c *pool.Config) { c.Slots = 0 }, pool.ErrInvalidConfig},
		{"too many slots", func(c *pool.Config) { c.Slots = 256 }, pool.ErrInvalidConfig},
		{"nodes do not divide", func(c *pool.Config) { c.SlotsPerNode = 3 }, pool.ErrInvalidConfig},
		{"negative interval", func(c *pool.Config) { c.Interval = -time.Second }, pool.ErrInvalidConfig},
		{"no jobs", func(c *pool.Config) { c.Jobs = nil }, pool.ErrInvalidJobs},
		{"a job larger than the pool", func(c *pool.Config) { c.Jobs[0].MinWorkers = 5 }, pool.ErrInvalidJobs},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := pool.DefaultConfig()
			cfg.Slots, cfg.Jobs = 4, []pool.JobSpec{job}
			tc.change(&cfg)
			if _, err := pool.Run(context.Background(), cfg); !errors.Is(err, tc.want) {
				t.Fatalf("Run = %v, want %v", err, tc.want)
			}
		})
	}
}
