package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/cmd/gorovod/e2e"
)

func TestMain(m *testing.M) { os.Exit(e2e.Main(m)) }

func runGorovod(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return runWith(t, e2e.Binary, args...)
}

// runWith runs a program to its end and returns its output and exit status.
func runWith(t *testing.T, program string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, program, args...)
	e2e.DumpOnCancel(cmd)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("running %s %v: %v", filepath.Base(program), args, err)
	}
	return out.String(), errb.String(), code
}

func TestBenchJSONEveryCollective(t *testing.T) {
	for _, tc := range []struct {
		op string
		np int
	}{
		{"allreduce", 2}, {"allreduce", 3}, {"broadcast", 3}, {"allgather", 3}, {"reducescatter", 2}, {"alltoall", 3},
		{"replicate", 4},
	} {
		t.Run(fmt.Sprintf("%s/np=%d", tc.op, tc.np), func(t *testing.T) {
			out, errs, code := runGorovod(t, "bench", tc.op, "--np", fmt.Sprint(tc.np),
				"--min-bytes", "4K", "--max-bytes", "256K", "--factor", "8", "--iters", "3", "--warmup", "1", "--json")
			if code != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errs)
			}
			var sizes []int
			sc := bufio.NewScanner(strings.NewReader(out))
			for sc.Scan() {
				var r map[string]any
				if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
					t.Fatalf("not JSON: %q", sc.Text())
				}
				for _, f := range []string{"op", "np", "bytes", "time_us", "algbw_gbps", "busbw_gbps", "correct"} {
					if _, ok := r[f]; !ok {
						t.Fatalf("field %q missing in %s", f, sc.Text())
					}
				}
				if r["op"] != tc.op || r["np"] != float64(tc.np) || r["correct"] != true || r["time_us"].(float64) <= 0 {
					t.Fatalf("bad result %s", sc.Text())
				}
				sizes = append(sizes, int(r["bytes"].(float64)))
			}
			if len(sizes) != 3 {
				t.Fatalf("want 3 sizes (4K, 32K, 256K), got %v", sizes)
			}
		})
	}
}

// TestBenchLanes: --lanes reaches every worker's TCP transport (its links
// have that many connections), and striped frames reduce correctly.
func TestBenchLanes(t *testing.T) {
	out, errs, code := runGorovod(t, "bench", "allreduce", "--np", "2", "--transport", "tcp", "--lanes", "3",
		"--min-bytes", "1M", "--max-bytes", "1M", "--iters", "2", "--warmup", "1", "--json", "--log-level", "debug")
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errs)
	}
	if !strings.Contains(out, `"correct":true`) {
		t.Fatalf("no correct result:\n%s", out)
	}
	if n := strings.Count(errs, "link connected"); n != 2 || strings.Count(errs, "lanes=3") != 2 {
		t.Fatalf("want both workers' link with lanes=3 in the debug log, got %d links:\n%s", n, errs)
	}
}

func TestBenchTable(t *testing.T) {
	out, errs, code := runGorovod(t, "bench", "allreduce", "--np", "2", "--min-bytes", "4K", "--max-bytes", "4K", "--iters", "2", "--dtype", "bfloat16", "--op", "max")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"busbw(GB/s)", "bfloat16", "max", "yes"} {
		if !strings.Contains(out, want) {
			t.Fatalf("table lacks %q:\n%s", want, out)
		}
	}
}

// TestBenchAlgorithm: --hosts declares hosts among the workers, --algorithm
// forces the algorithm, and every result names the one that ran.
func TestBenchAlgorithm(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string // the algorithm of each size: 4K, 256K
	}{
		{[]string{"allreduce", "--np", "4", "--hosts", "2"}, []string{"recursive-doubling", "hierarchical"}},
		{[]string{"allreduce", "--np", "3", "--hosts", "2", "--algorithm", "ring"}, []string{"ring", "ring"}},
		{[]string{"allreduce", "--np", "3"}, []string{"recursive-doubling", "ring"}},
		{[]string{"allgather", "--np", "4", "--hosts", "2", "--algorithm", "hierarchical"}, []string{"hierarchical", "hierarchical"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			args := append([]string{"bench"}, tc.args...)
			out, errs, code := runGorovod(t, append(args, "--min-bytes", "4K", "--max-bytes", "256K", "--factor", "64", "--iters", "2", "--warmup", "1", "--json")...)
			if code != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errs)
			}
			var got []string
			sc := bufio.NewScanner(strings.NewReader(out))
			for sc.Scan() {
				var r struct {
					Algorithm string `json:"algorithm"`
					Correct   bool   `json:"correct"`
				}
				if err := json.Unmarshal(sc.Bytes(), &r); err != nil || !r.Correct {
					t.Fatalf("bad result %q (%v)", sc.Text(), err)
				}
				got = append(got, r.Algorithm)
			}
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Fatalf("algorithms %v, want %v", got, tc.want)
			}
		})
	}
}

// TestBenchProfile: --profile leaves a CPU profile and an execution trace of
// every worker, which the Go tools read.
func TestBenchProfile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "prof")
	_, errs, code := runGorovod(t, "bench", "allreduce", "--np", "2", "--min-bytes", "64K", "--max-bytes", "64K", "--iters", "3", "--profile", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for r := range 2 {
		for _, name := range []string{fmt.Sprintf("cpu-rank%d.pprof", r), fmt.Sprintf("trace-rank%d.out", r)} {
			b, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			if len(b) == 0 {
				t.Fatalf("%s is empty", name)
			}
		}
		out, err := exec.Command("go", "tool", "pprof", "-top", filepath.Join(dir, fmt.Sprintf("cpu-rank%d.pprof", r))).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "Type: cpu") {
			t.Fatalf("go tool pprof: %v\n%s", err, out)
		}
	}
}

func TestBadCommandLines(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{}, "Usage"},
		{[]string{"frobnicate"}, "unknown command"},
		{[]string{"bench", "allsort"}, "unknown collective"},
		{[]string{"bench", "--np", "0"}, "at least 1"},
		{[]string{"bench", "--min-bytes", "4Q"}, "bad size"},
		{[]string{"bench", "--min-bytes", "64M", "--max-bytes", "4K"}, "below"},
		{[]string{"bench", "--dtype", "float128"}, "unknown dtype"},
		{[]string{"bench", "--op", "median"}, "unknown reduce op"},
		{[]string{"bench", "--op", "adasum"}, "adasum op is not benchmarked"},
		{[]string{"bench", "--factor", "1"}, "at least 2"},
		{[]string{"bench", "--chunk-bytes", "1"}, "ChunkBytes"},
		{[]string{"bench", "--socket-buffer", "lots"}, "bad size"},
		{[]string{"bench", "replicate", "--stripe-sources", "-2"}, "--stripe-sources -2 is negative"},
		{[]string{"bench", "--transport", "carrier-pigeon"}, "not available"},
		{[]string{"bench", "--bogus"}, "flag provided but not defined"},
		{[]string{"bench", "allreduce", "extra"}, "unexpected arguments"},
		{[]string{"bench", "--placement", "everywhere"}, "unknown placement"},
		{[]string{"bench", "--algorithm", "fastest"}, "unknown algorithm"},
		{[]string{"bench", "allgather", "--algorithm", "rd"}, "AllgatherAlgorithm"},
		{[]string{"bench", "--np", "2", "--hosts", "3"}, "--hosts 3"},
		{[]string{"bench", "--lanes", "17"}, "--lanes 17"},
		{[]string{"bench", "--lanes", "-1"}, "--lanes -1"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, errs, code := runGorovod(t, tc.args...)
			if code != 2 {
				t.Fatalf("exit %d, want 2 (stderr %q)", code, errs)
			}
			if !strings.Contains(errs, tc.want) {
				t.Fatalf("stderr %q lacks %q", errs, tc.want)
			}
		})
	}
}

// A command that fails after its command line was read names itself before
// its error, as every other command does ("gorovod simulate: open ...").
func TestFailingCommandsNameThemselves(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"simulate", missing + ".csv"}, "gorovod simulate: open " + missing + ".csv: no such file or directory\n"},
		{[]string{"cluster", "--slots", "2", missing + ".json"}, "gorovod cluster: open " + missing + ".json: no such file or directory\n"},
		{[]string{"report", missing + ".jsonl"}, "gorovod report: open " + missing + ".jsonl: no such file or directory\n"},
		{[]string{"follow", missing}, "gorovod follow: " + missing + ": no such job directory (the one 'gorovod run' makes under $TMPDIR is removed when the job ends; --output-dir DIR keeps it)\n"},
	} {
		t.Run(tc.args[0], func(t *testing.T) {
			_, errs, code := runGorovod(t, tc.args...)
			if code != 1 || errs != tc.want {
				t.Fatalf("exit %d, stderr %q; want 1, %q", code, errs, tc.want)
			}
		})
	}
}

// The commands the usage says take --log-level and --log-format take them,
// and the others, which it does not name, refuse them.
func TestLogFlagsWhereTheUsageSaysSo(t *testing.T) {
	usage, _, _ := runGorovod(t, "help")
	for _, c := range []struct {
		cmd   string
		takes bool
	}{
		{"run", true}, {"bench", true}, {"simulate", true}, {"cluster", true}, {"report", true}, {"scheduler", true},
		{"attach", false}, {"follow", false}, {"submit", false}, {"jobs", false}, {"logs", false}, {"delete", false},
	} {
		_, errs, code := runGorovod(t, c.cmd, "--log-level", "warn", "--log-format", "json", "--help")
		if took := code == 0; took != c.takes {
			t.Errorf("gorovod %s --log-level warn --log-format json --help: exit %d (stderr %q); the usage says it takes them: %v", c.cmd, code, errs, c.takes)
		}
	}
	if !strings.Contains(usage, "run, bench, simulate, cluster, report and scheduler take\n--log-level and --log-format") {
		t.Errorf("the usage does not name the commands that take --log-level:\n%s", usage)
	}
}

func TestWorkerOutsideLauncher(t *testing.T) {
	_, errs, code := runGorovod(t, "_bench-worker", `{"op":"allreduce","dtype":"float32","redop":"sum","sizes":[4096],"iters":1,"chunk_bytes":65536,"small_bytes":0}`)
	if code != 1 || !strings.Contains(errs, "not started by a gorovod launcher") {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
}
