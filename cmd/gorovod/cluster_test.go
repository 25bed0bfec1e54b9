package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/cmd/gorovod/e2e"
)

// writeJobs writes a jobs file for `gorovod cluster`.
func writeJobs(t *testing.T, jobs string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "jobs.json")
	if err := os.WriteFile(path, []byte(jobs), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestClusterRunsThreeJobs runs `gorovod cluster --json` on three real jobs
// (two synthetic, and Fashion-MNIST where the data set is installed) arriving
// one after another on three slots: every job finishes, the rounds show
// allocations changing, and no round allocates more than the pool.
func TestClusterRunsThreeJobs(t *testing.T) {
	third := fmt.Sprintf(`{"name": "fmnist", "argv": [%q, "--epochs", "2", "--train-limit", "20000", "--log-every", "0"], "max_workers": 3, "submit": "2s"}`, e2e.FashionMNIST)
	if !e2e.HaveFashionMNIST() {
		t.Log("no Fashion-MNIST data set: a third synthetic job instead")
		third = fmt.Sprintf(`{"name": "fmnist", "argv": [%q, "--steps", "300", "--batch", "32", "--compute", "1ms"], "max_workers": 3, "submit": "2s"}`, e2e.Synthetic)
	}
	jobs := writeJobs(t, fmt.Sprintf(`[
		{"name": "syn-a", "argv": [%q, "--steps", "500", "--batch", "32", "--compute", "1ms", "--model-size", "16384"], "max_workers": 3},
		%s,
		{"name": "syn-b", "argv": [%q, "--steps", "300", "--batch", "32", "--compute", "1ms", "--model-size", "16384"], "max_workers": 3, "submit": "4s"}
	]`, e2e.Synthetic, third, e2e.Synthetic))
	out, errs, code := runGorovod(t, "cluster", "--slots", "3", "--interval", "1s", "--population", "30", "--generations", "30", "--json", jobs)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errs)
	}
	type status struct {
		Name      string  `json:"name"`
		State     string  `json:"state"`
		Allocated int     `json:"allocated"`
		Step      int64   `json:"step"`
		JCT       float64 `json:"jct_s"`
	}
	var result struct {
		Jobs   []status `json:"jobs"`
		AvgJCT float64  `json:"avg_jct_s"`
	}
	sizes := map[string]map[int]bool{}
	rounds := 0
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var line struct {
			Kind  string   `json:"kind"`
			Slots int      `json:"slots"`
			Used  int      `json:"allocated"`
			Jobs  []status `json:"jobs"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		switch line.Kind {
		case "round":
			rounds++
			if line.Used > line.Slots || line.Slots != 3 {
				t.Errorf("a round allocates %d of %d slots", line.Used, line.Slots)
			}
			for _, j := range line.Jobs {
				if j.State == "running" {
					if sizes[j.Name] == nil {
						sizes[j.Name] = map[int]bool{}
					}
					sizes[j.Name][j.Allocated] = true
				}
			}
		case "result":
			if err := json.Unmarshal(sc.Bytes(), &result); err != nil {
				t.Fatal(err)
			}
		default:
			t.Errorf("unknown line kind %q", line.Kind)
		}
	}
	if len(result.Jobs) != 3 {
		t.Fatalf("result has %d jobs:\n%s", len(result.Jobs), out)
	}
	for _, j := range result.Jobs {
		if j.State != "done" || j.JCT <= 0 {
			t.Errorf("job %s: %+v", j.Name, j)
		}
	}
	changed := false
	for _, s := range sizes {
		changed = changed || len(s) > 1
	}
	if !changed {
		t.Errorf("no job's allocation changed over %d rounds: %v", rounds, sizes)
	}
	t.Logf("%d rounds, average JCT %.1f s, sizes %v", rounds, result.AvgJCT, sizes)
}

func TestClusterBadCommandLines(t *testing.T) {
	jobs := writeJobs(t, fmt.Sprintf(`[{"name": "a", "argv": [%q]}]`, e2e.Synthetic))
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"cluster", jobs}, 2, "--slots must be at least 1"},
		{[]string{"cluster", "--slots", "2"}, 2, "want one JOBS.json"},
		{[]string{"cluster", "--slots", "2", "--policy", "fifo", jobs}, 2, "unknown policy"},
		{[]string{"cluster", "--slots", "2", "--interval", "0s", jobs}, 2, "--interval must be positive"},
		{[]string{"cluster", "--slots", "2", "/nonexistent/jobs.json"}, 1, "no such file"},
		{[]string{"cluster", "--slots", "2", writeJobs(t, `[{"name": "a"}]`)}, 1, "no command"},
		{[]string{"cluster", "--slots", "2", writeJobs(t, fmt.Sprintf(`[{"name": "a", "argv": [%q], "min_workers": 3}]`, e2e.Synthetic))}, 1, "the pool has 2 slots"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			_, errs, code := runGorovod(t, tc.args...)
			if code != tc.code || !strings.Contains(errs, tc.want) {
				t.Fatalf("exit %d, stderr %q; want exit %d and %q", code, errs, tc.code, tc.want)
			}
		})
	}
}
