package heuristics

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// writeScript writes an executable shell script into dir.
func writeScript(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func newExecFor(t *testing.T, params map[string]any) (Heuristic, error) {
	t.Helper()
	raw, err := json.Marshal(params)
	if err != nil {
		t.Fatal(err)
	}
	return NewRegistry().New(Spec{Name: "exec", Params: raw})
}

func mustExec(t *testing.T, params map[string]any) *execHeuristic {
	t.Helper()
	h, err := newExecFor(t, params)
	if err != nil {
		t.Fatal(err)
	}
	return h.(*execHeuristic)
}

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC)

// testPeriod is a world of k workers (w0, w1, ...) that ran steady steps at
// the given throughput after skip warm-up steps, starting at step first.
func testPeriod(epoch uint64, k int, throughput float64, skip, steady int, first int64) *Period {
	p := &Period{Epoch: epoch, Skip: skip, Start: t0.Add(time.Duration(epoch) * time.Minute)}
	for i := range k {
		p.Members = append(p.Members, fmt.Sprintf("w%d", i))
	}
	const batch = 64
	stepTime := time.Duration(float64(batch) / throughput * float64(time.Second))
	for i := range skip + steady {
		s := StepStats{Step: first + int64(i) + 1, GlobalBatch: batch, Time: stepTime,
			Compute: map[string]time.Duration{}, Samples: map[string]int{}}
		for j, m := range p.Members {
			// w0 computes longer in odd steps: the median must ignore that.
			c := stepTime / 2 * time.Duration(j+1) / time.Duration(k)
			if j == 0 && i%2 == 1 {
				c = stepTime
			}
			s.Compute[m], s.Samples[m] = c, batch/k
		}
		p.Steps = append(p.Steps, s)
	}
	return p
}

// testHistory chains periods of (workers, throughput) with 2 warm-up and
// steady steady steps each; the last is current.
func testHistory(steady int, worlds ...[2]float64) *History {
	h := &History{Start: t0, MinWorkers: 1, MaxWorkers: 6, TotalSteps: 1000}
	var step int64
	for i, w := range worlds {
		p := testPeriod(uint64(i+1), int(w[0]), w[1], 2, steady, step)
		step += int64(len(p.Steps))
		if i > 0 {
			h.Periods[i-1].End = p.Start
		}
		h.Periods = append(h.Periods, p)
	}
	h.Step = step
	h.Now = t0.Add(time.Duration(len(worlds)) * time.Minute)
	return h
}

func TestExecExamplePlugin(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build the example plugin")
	}
	bin := filepath.Join(t.TempDir(), "heuristic-plugin")
	build := exec.Command(gobin, "build", "-o", bin, "github.com/gorovod/gorovod/examples/heuristic-plugin")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the example plugin: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		name     string
		args     []string
		h        *History
		edit     func(*History)
		want     Action
		count    int
		settled  bool
		inReason string
	}{
		{name: "one worker measured: grow", h: testHistory(8, [2]float64{1, 100}), want: Grow, count: 1},
		{name: "current world not yet measured: wait", h: testHistory(2, [2]float64{1, 100}),
			want: Hold, inReason: "waiting for 5 steady steps"},
		{name: "second worker paid: grow", h: testHistory(8, [2]float64{1, 100}, [2]float64{2, 190}), want: Grow, count: 1},
		{name: "third worker did not pay: shrink", h: testHistory(8, [2]float64{1, 100}, [2]float64{2, 190}, [2]float64{3, 200}),
			want: Shrink, count: 1, inReason: "worker 3 adds 10.0/s"},
		{name: "both neighbours measured: settled",
			h:    testHistory(8, [2]float64{1, 100}, [2]float64{2, 190}, [2]float64{3, 200}, [2]float64{2, 188}),
			want: Hold, settled: true, inReason: "worker 3 added only"},
		{name: "at the job's maximum: settled", h: testHistory(8, [2]float64{5, 500}, [2]float64{6, 600}),
			want: Hold, settled: true, inReason: "most workers allowed, 6"},
		{name: "worker does not pay but the job needs it: settled", h: testHistory(8, [2]float64{1, 100}, [2]float64{2, 110}),
			edit: func(h *History) { h.MinWorkers = 2 }, want: Hold, settled: true, inReason: "the job needs 2"},
		{name: "a lower bar keeps growing", args: []string{"--min-gain", "0.05"},
			h: testHistory(8, [2]float64{1, 100}, [2]float64{2, 190}, [2]float64{3, 200}), want: Grow, count: 1},
		{name: "a measurement needs more steps", args: []string{"--min-steps", "20"}, h: testHistory(8, [2]float64{1, 100}),
			want: Hold, inReason: "waiting for 20 steady steps"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := mustExec(t, map[string]any{"command": append([]string{bin}, tc.args...)})
			if got, want := e.Name(), "exec(heuristic-plugin)"; got != want {
				t.Errorf("Name() = %q, want %q", got, want)
			}
			if tc.edit != nil {
				tc.edit(tc.h)
			}
			d, err := decideNow(context.Background(), e, tc.h)
			if err != nil {
				t.Fatal(err)
			}
			if d.Action != tc.want || d.Count != tc.count || d.Settled != tc.settled {
				t.Errorf("decision %+v, want %v count %d settled %v", d, tc.want, tc.count, tc.settled)
			}
			if !strings.Contains(d.Reason, tc.inReason) {
				t.Errorf("reason %q does not say %q", d.Reason, tc.inReason)
			}
		})
	}
}

func TestExecBadPlugins(t *testing.T) {
	_, haveSetsid := exec.LookPath("setsid")
	for _, tc := range []struct {
		name      string
		body      string // the script; $DIR is its directory
		timeout   string
		want      []string // in the error
		isTimeout bool     // errors.Is(err, ErrPluginTimeout)
		cleanup   bool     // the script wrote the pid of a process to kill to $DIR/pid
		setsid    bool
	}{
		{name: "garbage", body: `echo hello`, want: []string{
			"heuristics: exec plugin ", "/p.sh: bad decision on stdout: not a JSON object: \"hello\\n\""}},
		{name: "nothing", body: `true`, want: []string{"bad decision on stdout: no output"}},
		{name: "only white space", body: `echo; echo`, want: []string{"no output"}},
		{name: "two objects", body: `echo '{"action":"hold","reason":"a"}{"action":"hold","reason":"b"}'`,
			want: []string{"more output after the decision object"}},
		{name: "trailing text", body: `echo '{"action":"hold","reason":"a"}'; echo done`,
			want: []string{"more output after the decision object"}},
		{name: "unfinished object", body: `printf '{"action":'`, want: []string{"bad decision on stdout: unexpected EOF"}},
		{name: "null", body: `echo null`, want: []string{"not a JSON object"}},
		{name: "unknown field", body: `echo '{"action":"hold","reasn":"x"}'`, want: []string{`unknown field "reasn"`}},
		{name: "unknown action", body: `echo '{"action":"jump","reason":"x"}'`, want: []string{`unknown action "jump"`}},
		{name: "count of the wrong type", body: `echo '{"action":"grow","count":"2"}'`, want: []string{"bad decision on stdout", "count"}},
		{name: "grow by zero", body: `echo '{"action":"grow","count":0,"reason":"x"}'`,
			want: []string{"bad decision on stdout: grow decision needs a positive count, got 0"}},
		{name: "replace without worker", body: `echo '{"action":"replace"}'`, want: []string{"replace decision names no worker"}},
		{name: "replace of a non-member", body: `echo '{"action":"replace","worker":"w9","reason":"slow"}'`,
			want: []string{`worker "w9" is not a member of the current world [w0 w1]`}},
		{name: "long bad output is cut", body: `printf 'x%.0s' $(seq 1 500)`, want: []string{`"` + strings.Repeat("x", 200) + `"...`}},
		{name: "exit status and stderr", body: `echo '{"action":"hold"}'; echo "boom: no model" >&2; exit 3`,
			want: []string{"exit status 3", `stderr: "boom: no model"`}},
		{name: "bad decision carries stderr", body: `echo 'Traceback: KeyError' >&2; echo '{}x'`,
			want: []string{"more output", `stderr: "Traceback: KeyError"`}},
		{name: "stderr is cut to its end", body: `printf 'y%.0s' $(seq 1 5000) >&2; echo " the end" >&2; exit 1`,
			want: []string{"exit status 1", `stderr: "...yyy`, `the end"`}},
		{name: "sleeps forever", body: `exec sleep 1000`, timeout: "300ms", isTimeout: true,
			want: []string{"/p.sh: timed out after 300ms"}},
		{name: "child holds stdout while it sleeps", body: "sleep 1000 &\nsleep 1000", timeout: "300ms", isTimeout: true,
			want: []string{"timed out after 300ms"}},
		{name: "escaped child holds stdout", body: "setsid sleep 1000 &\necho $! > \"$DIR/pid\"\nexec sleep 1000",
			timeout: "300ms", isTimeout: true, cleanup: true, setsid: true, want: []string{"timed out after 300ms"}},
		{name: "exits but a child holds stdout", body: "sleep 1000 &\necho '{\"action\":\"hold\",\"reason\":\"x\"}'",
			timeout: "300ms", want: []string{"exited, but its stdout stayed open"}},
		{name: "endless output", body: `exec yes`, want: []string{"printed more than 1048576 bytes on stdout"}},
		{name: "large output", body: `head -c 2000000 /dev/zero | tr '\0' a; echo '{}'`, want: []string{"printed more than 1048576 bytes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.setsid && haveSetsid != nil {
				t.Skip("no setsid command")
			}
			dir := t.TempDir()
			script := writeScript(t, dir, "p.sh", "DIR="+strconv.Quote(dir)+"\n"+tc.body)
			if tc.cleanup {
				t.Cleanup(func() {
					if b, err := os.ReadFile(filepath.Join(dir, "pid")); err == nil {
						if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
							_ = syscall.Kill(pid, syscall.SIGKILL)
						}
					}
				})
			}
			params := map[string]any{"command": script}
			if tc.timeout != "" {
				params["timeout"] = tc.timeout
			}
			e := mustExec(t, params)
			h := testHistory(3, [2]float64{2, 100})
			start := time.Now()
			d, err := decideNow(context.Background(), e, h)
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("Decide took %v", took)
			}
			if err == nil {
				t.Fatalf("no error; decision %+v", d)
			}
			t.Logf("error: %v", err)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if errors.Is(err, ErrPluginTimeout) != tc.isTimeout {
				t.Errorf("errors.Is(%q, ErrPluginTimeout) = %v", err, !tc.isTimeout)
			}
			var pe *PluginError
			if !errors.As(err, &pe) || pe.Program != script {
				t.Errorf("error %#v is not a *PluginError for %s", err, script)
			}
			if len(err.Error()) > 3000 {
				t.Errorf("error is %d bytes long", len(err.Error()))
			}
		})
	}
}

func TestExecCancelled(t *testing.T) {
	dir := t.TempDir()
	e := mustExec(t, map[string]any{"command": writeScript(t, dir, "p.sh", `exec sleep 1000`)})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := decideNow(ctx, e, testHistory(3, [2]float64{1, 100}))
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrPluginTimeout) {
		t.Fatalf("error %v, want context.Canceled", err)
	}
}

func TestExecEvalEvery(t *testing.T) {
	dir := t.TempDir()
	// Counts its runs and says whether it is settled from its first argument.
	script := writeScript(t, dir, "p.sh", `echo run >> "`+dir+`/count"
echo "{\"action\":\"hold\",\"reason\":\"ran\",\"settled\":$1}"`)
	failing := writeScript(t, dir, "fail.sh", `echo run >> "`+dir+`/count"; exit 1`)
	runs := func() int {
		b, err := os.ReadFile(filepath.Join(dir, "count"))
		if errors.Is(err, os.ErrNotExist) {
			return 0
		}
		if err != nil {
			t.Fatal(err)
		}
		return bytes.Count(b, []byte("run"))
	}
	type call struct {
		step    int64
		runs    int // the total after the call
		reason  string
		settled bool
		err     bool
	}
	for _, tc := range []struct {
		name   string
		params map[string]any
		calls  []call
	}{
		{name: "default every 10", params: map[string]any{"command": []string{script, "false"}}, calls: []call{
			{step: 3, runs: 1, reason: "ran"},
			{step: 8, runs: 1, reason: "next plugin evaluation at step 13"},
			{step: 12, runs: 1, reason: "next plugin evaluation at step 13"},
			{step: 13, runs: 2, reason: "ran"},
			{step: 40, runs: 3, reason: "ran"},
			{step: 2, runs: 4, reason: "ran"}, // the count restarted
			{step: 5, runs: 4, reason: "next plugin evaluation at step 12"},
		}},
		{name: "a settled hold stays settled", params: map[string]any{"command": []string{script, "true"}, "eval_every": 5}, calls: []call{
			{step: 0, runs: 1, reason: "ran", settled: true},
			{step: 4, runs: 1, reason: "next plugin evaluation at step 5", settled: true},
			{step: 5, runs: 2, reason: "ran", settled: true},
		}},
		{name: "every call", params: map[string]any{"command": []string{script, "false"}, "eval_every": 0}, calls: []call{
			{step: 1, runs: 1, reason: "ran"},
			{step: 1, runs: 2, reason: "ran"},
			{step: 2, runs: 3, reason: "ran"},
		}},
		{name: "a failed run counts", params: map[string]any{"command": failing}, calls: []call{
			{step: 1, runs: 1, err: true},
			{step: 2, runs: 1, reason: "next plugin evaluation at step 11"},
			{step: 11, runs: 2, err: true},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.Remove(filepath.Join(dir, "count")); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Fatal(err)
			}
			e := mustExec(t, tc.params)
			h := testHistory(3, [2]float64{2, 100})
			for _, c := range tc.calls {
				h.Step = c.step
				d, err := decideNow(context.Background(), e, h)
				if (err != nil) != c.err {
					t.Fatalf("step %d: error %v, want error %v", c.step, err, c.err)
				}
				if got := runs(); got != c.runs {
					t.Errorf("step %d: %d runs, want %d", c.step, got, c.runs)
				}
				if err == nil && (d.Action != Hold || d.Reason != c.reason || d.Settled != c.settled) {
					t.Errorf("step %d: decision %+v, want hold %q settled %v", c.step, d, c.reason, c.settled)
				}
			}
		})
	}
}

func TestExecHistoryJSON(t *testing.T) {
	for _, includeSteps := range []bool{false, true} {
		t.Run(fmt.Sprintf("include_steps=%v", includeSteps), func(t *testing.T) {
			dir := t.TempDir()
			in := filepath.Join(dir, "in.json")
			script := writeScript(t, dir, "p.sh", `cat > "`+in+`"; echo '{"action":"hold","reason":"x"}'`)
			e := mustExec(t, map[string]any{"command": script, "include_steps": includeSteps})
			// Worlds of 1, 2, 1 (unmeasured) and 2 workers: the newest
			// measured period of each size is listed.
			h := testHistory(4, [2]float64{1, 100}, [2]float64{2, 180}, [2]float64{1, 90}, [2]float64{2, 170})
			h.Periods[2].Steps = h.Periods[2].Steps[:2]
			h.MaxWorkers = 0
			if _, err := decideNow(context.Background(), e, h); err != nil {
				t.Fatal(err)
			}
			raw, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}

			// The names and types a plugin reads, as the documentation gives them.
			var doc map[string]any
			if err := json.Unmarshal(raw, &doc); err != nil {
				t.Fatal(err)
			}
			for key, want := range map[string]any{
				"protocol": 1.0, "now": "2025-03-01T12:04:00.123456Z", "start": "2025-03-01T12:00:00.123456Z",
				"elapsed_seconds": 240.0, "step": float64(h.Step), "total_steps": 1000.0,
				"remaining_steps": float64(1000 - h.Step), "min_workers": 1.0, "max_workers": 0.0, "workers": 2.0,
			} {
				if doc[key] != want {
					t.Errorf("%s = %#v, want %#v", key, doc[key], want)
				}
			}
			if got := fmt.Sprint(doc["members"]); got != "[w0 w1]" {
				t.Errorf("members = %s", got)
			}
			periods := doc["periods"].([]any)
			if len(periods) != 4 {
				t.Fatalf("%d periods", len(periods))
			}
			for i, p := range periods {
				p := p.(map[string]any)
				for _, key := range []string{"epoch", "workers", "members", "start", "duration_seconds", "steady_steps",
					"throughput", "step_time_seconds", "global_batch", "compute_seconds"} {
					if _, ok := p[key]; !ok {
						t.Errorf("period %d has no %q: %v", i, key, p)
					}
				}
				if _, ok := p["end"]; ok != (i < 3) {
					t.Errorf("period %d: end present %v", i, ok)
				}
				if _, ok := p["steps"]; ok != (includeSteps && i != 2) {
					t.Errorf("period %d: steps present %v", i, ok)
				}
			}
			for _, key := range []string{"workers", "epoch", "steps", "throughput", "step_time_seconds", "global_batch"} {
				if _, ok := doc["measurements"].([]any)[0].(map[string]any)[key]; !ok {
					t.Errorf("measurement has no %q", key)
				}
			}

			// The values, through the Go types.
			var ph PluginHistory
			dec := json.NewDecoder(bytes.NewReader(raw))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&ph); err != nil {
				t.Fatal(err)
			}
			p1 := ph.Periods[1]
			if p1.Epoch != 2 || p1.Workers != 2 || p1.SteadySteps != 4 || p1.GlobalBatch != 64 ||
				!p1.End.Equal(ph.Periods[2].Start) || p1.DurationSeconds != 60 {
				t.Errorf("period 1 = %+v", p1)
			}
			if d := p1.Throughput - 180; d > 0.01 || d < -0.01 {
				t.Errorf("throughput %v, want 180", p1.Throughput)
			}
			if d := p1.StepTimeSeconds - 64.0/180; d > 1e-6 || d < -1e-6 {
				t.Errorf("step time %v, want %v", p1.StepTimeSeconds, 64.0/180)
			}
			// w1 computes half the step; w0 a quarter, or all of it in odd
			// steps: their medians are those.
			st := h.Periods[1].Steps[0].Time.Seconds()
			if c := p1.ComputeSeconds; len(c) != 2 || !near(c["w1"], st/2) || !near(c["w0"], st) {
				t.Errorf("compute seconds %v, step time %v", c, st)
			}
			if ph.Periods[2].SteadySteps != 0 || ph.Periods[2].Throughput != 0 || len(ph.Periods[2].ComputeSeconds) != 0 {
				t.Errorf("unmeasured period %+v", ph.Periods[2])
			}
			var ms []string
			for _, m := range ph.Measurements {
				ms = append(ms, fmt.Sprintf("%d@%d:%.0f/%d", m.Workers, m.Epoch, m.Throughput, m.Steps))
			}
			if got, want := strings.Join(ms, " "), "1@1:100/4 2@4:170/4"; got != want {
				t.Errorf("measurements %s, want %s", got, want)
			}
			if includeSteps {
				steps := ph.Periods[3].Steps
				if len(steps) != 4 || steps[0].Step != h.Periods[3].Steps[2].Step || steps[0].GlobalBatch != 64 ||
					!near(steps[0].TimeSeconds, 64.0/170) {
					t.Errorf("steps %+v", steps)
				}
			}
		})
	}
}

func near(a, b float64) bool { return a-b < 1e-6 && b-a < 1e-6 }

func TestExecEnvDirAndStderr(t *testing.T) {
	dir, work := t.TempDir(), t.TempDir()
	script := writeScript(t, dir, "p.sh", `echo "first line" >&2
printf 'unfinished' >&2
echo "{\"action\":\"hold\",\"reason\":\"$(pwd) $GOROVOD_TEST_A $0 $#\"}"`)
	e := mustExec(t, map[string]any{"command": script, "dir": work, "env": map[string]string{"GOROVOD_TEST_A": "a b"}})
	var forwarded bytes.Buffer
	e.stderr = &forwarded
	d, err := decideNow(context.Background(), e, testHistory(3, [2]float64{1, 100}))
	if err != nil {
		t.Fatal(err)
	}
	realWork, err := filepath.EvalSymlinks(work)
	if err != nil {
		t.Fatal(err)
	}
	if want := realWork + " a b " + script + " 0"; d.Reason != want {
		t.Errorf("reason %q, want %q", d.Reason, want)
	}
	if got, want := forwarded.String(), "exec(p.sh): first line\nexec(p.sh): unfinished\n"; got != want {
		t.Errorf("forwarded stderr %q, want %q", got, want)
	}
}

func TestExecRegistry(t *testing.T) {
	dir := t.TempDir()
	// Says its arguments as the reason.
	script := writeScript(t, dir, "say.sh", `echo "{\"action\":\"hold\",\"reason\":\"$*\"}"`)
	if err := os.WriteFile(filepath.Join(dir, "data.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		spec   func() (Spec, error)
		reason string // of a decision; "" when the construction must fail
		err    string
	}{
		{name: "command as a list", reason: "a b c", spec: func() (Spec, error) {
			return Spec{Name: "exec", Params: json.RawMessage(`{"command": [` + strconv.Quote(script) + `, "a b", "c"]}`)}, nil
		}},
		{name: "command as a string", reason: "a b c", spec: func() (Spec, error) {
			return Spec{Name: "exec", Params: json.RawMessage(`{"command": ` + strconv.Quote(script+"  a  b\tc") + `}`)}, nil
		}},
		{name: "command from --heuristic-opt", reason: "--min-gain 0.3", spec: func() (Spec, error) {
			return SpecFromOptions("exec", []string{"command=" + script + " --min-gain 0.3", "timeout=2s", "eval_every=5"})
		}},
		{name: "command as a list from --heuristic-opt", reason: "x", spec: func() (Spec, error) {
			return SpecFromOptions("exec", []string{`command=[` + strconv.Quote(script) + `,"x"]`})
		}},
		{name: "from PATH", reason: "", err: "", spec: func() (Spec, error) {
			return Spec{Name: "exec", Params: json.RawMessage(`{"command": "true"}`)}, nil
		}},
		{name: "no command", err: `exec: needs a "command"`, spec: func() (Spec, error) {
			return Spec{Name: "exec"}, nil
		}},
		{name: "empty command", err: `needs a "command"`, spec: func() (Spec, error) {
			return Spec{Name: "exec", Params: json.RawMessage(`{"command": "  "}`)}, nil
		}},
		{name: "command not found", err: "command: exec: \"no-such-plugin-x\": executable file not found", spec: func() (Spec, error) {
			return Spec{Name: "exec", Params: json.RawMessage(`{"command": "no-such-plugin-x --flag"}`)}, nil
		}},
		{name: "command not executable", err: "permission denied", spec: func() (Spec, error) {
			return Spec{Name: "exec", Params: json.RawMessage(`{"command": ` + strconv.Quote(filepath.Join(dir, "data.txt")) + `}`)}, nil
		}},
		{name: "command of the wrong type", err: "command must be a list of strings", spec: func() (Spec, error) {
			return Spec{Name: "exec", Params: json.RawMessage(`{"command": 3}`)}, nil
		}},
		{name: "unknown parameter", err: `unknown field "timout"`, spec: func() (Spec, error) {
			return Spec{Name: "exec", Params: json.RawMessage(`{"command": "true", "timout": "1s"}`)}, nil
		}},
		{name: "zero timeout", err: "timeout must be positive", spec: func() (Spec, error) {
			return Spec{Name: "exec", Params: json.RawMessage(`{"command": "true", "timeout": "0s"}`)}, nil
		}},
		{name: "negative eval_every", err: "eval_every must not be negative", spec: func() (Spec, error) {
			return Spec{Name: "exec", Params: json.RawMessage(`{"command": "true", "eval_every": -1}`)}, nil
		}},
		{name: "missing dir", err: "dir: ", spec: func() (Spec, error) {
			return Spec{Name: "exec", Params: json.RawMessage(`{"command": "true", "dir": ` + strconv.Quote(filepath.Join(dir, "nope")) + `}`)}, nil
		}},
		{name: "dir is a file", err: "is not a directory", spec: func() (Spec, error) {
			return Spec{Name: "exec", Params: json.RawMessage(`{"command": "true", "dir": ` + strconv.Quote(filepath.Join(dir, "data.txt")) + `}`)}, nil
		}},
		{name: "bad env name", err: `env: bad variable name "A=B"`, spec: func() (Spec, error) {
			return Spec{Name: "exec", Params: json.RawMessage(`{"command": "true", "env": {"A=B": "x"}}`)}, nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := tc.spec()
			if err != nil {
				t.Fatal(err)
			}
			h, err := NewRegistry().New(s)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.name == "from PATH" {
				if h.Name() != "exec(true)" {
					t.Errorf("Name() = %q", h.Name())
				}
				return
			}
			if h.Name() != "exec(say.sh)" {
				t.Errorf("Name() = %q", h.Name())
			}
			d, err := decideNow(context.Background(), h, testHistory(3, [2]float64{1, 100}))
			if err != nil {
				t.Fatal(err)
			}
			if d.Reason != tc.reason {
				t.Errorf("reason %q, want %q", d.Reason, tc.reason)
			}
		})
	}
	if !slices.Contains(NewRegistry().Names(), "exec") {
		t.Error("exec is not registered")
	}
}

func TestParsePluginDecision(t *testing.T) {
	members := []string{"w0", "w1"}
	for _, tc := range []struct {
		out  string
		want Decision
		err  string
	}{
		{out: " \n{\"action\":\"shrink\",\"count\":2,\"reason\":\"r\",\"numbers\":{\"x\":1.5}}\n\n",
			want: Decision{Action: Shrink, Count: 2, Reason: "r", Numbers: map[string]float64{"x": 1.5}}},
		{out: `{}`, want: Decision{Action: Hold}},
		{out: `{"action":"REPLACE","worker":"w1","reason":"slow","settled":false}`, want: Decision{Action: Replace, Worker: "w1", Reason: "slow"}},
		{out: `{"action":"hold","reason":"done","settled":true}`, want: Decision{Action: Hold, Reason: "done", Settled: true}},
		{out: `{"action":"grow","count":1,"worker":"w7"}`, err: `worker "w7" is not a member`},
		{out: `[{"action":"hold"}]`, err: "not a JSON object"},
		{out: `{"action":"hold"} {"action":"hold"}`, err: "more output after"},
		{out: `{"action":"hold","count":1.5}`, err: "count"},
	} {
		d, err := parsePluginDecision([]byte(tc.out), members)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want %q", tc.out, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.out, err)
			continue
		}
		if fmt.Sprintf("%+v", d) != fmt.Sprintf("%+v", tc.want) {
			t.Errorf("%s: %+v, want %+v", tc.out, d, tc.want)
		}
	}
}

// TestExecDocPythonExample runs the Python plugin of
// docs/heuristic-plugins.md, so that the listing keeps working.
func TestExecDocPythonExample(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	doc, err := os.ReadFile("../docs/heuristic-plugins.md")
	if err != nil {
		t.Fatal(err)
	}
	_, listing, ok := strings.Cut(string(doc), "```python\n")
	listing, _, ok2 := strings.Cut(listing, "```")
	if !ok || !ok2 {
		t.Fatal("no python listing in docs/heuristic-plugins.md")
	}
	script := filepath.Join(t.TempDir(), "policy.py")
	if err := os.WriteFile(script, []byte(listing), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		h       *History
		want    Action
		settled bool
	}{
		{name: "unmeasured", h: testHistory(2, [2]float64{1, 100}), want: Hold},
		{name: "grow", h: testHistory(8, [2]float64{1, 100}, [2]float64{2, 190}), want: Grow},
		{name: "shrink", h: testHistory(8, [2]float64{1, 100}, [2]float64{2, 190}, [2]float64{3, 200}), want: Shrink},
		{name: "settled", h: testHistory(8, [2]float64{1, 100}, [2]float64{2, 190}, [2]float64{3, 200}, [2]float64{2, 188}),
			want: Hold, settled: true},
		{name: "at the maximum", h: testHistory(8, [2]float64{5, 500}, [2]float64{6, 600}), want: Hold, settled: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := mustExec(t, map[string]any{"command": []string{python, script}})
			d, err := decideNow(context.Background(), e, tc.h)
			if err != nil {
				t.Fatal(err)
			}
			if d.Action != tc.want || d.Settled != tc.settled || (d.Action != Hold && d.Count != 1) {
				t.Errorf("decision %+v, want %v settled %v", d, tc.want, tc.settled)
			}
		})
	}
}

// decideNow calls Decide and, when that started the plugin, waits for the run
// and collects its answer, as the engine's next evaluation would.
func decideNow(ctx context.Context, h Heuristic, hist *History) (Decision, error) {
	d, err := h.Decide(ctx, hist)
	e, ok := h.(*execHeuristic)
	if !ok || e.pending == nil {
		return d, err
	}
	<-e.pending.done
	return h.Decide(ctx, hist)
}

// The program runs beside the engine: Decide returns at once while it works
// (the engine goes on measuring and following the world), hands over its
// answer at the first call after it, and drops an answer about a world that
// has changed meanwhile, asking again at once.
func TestExecRunsBesideTheEngine(t *testing.T) {
	dir := t.TempDir()
	gate := filepath.Join(dir, "gate")
	if err := syscall.Mkfifo(gate, 0o600); err != nil {
		t.Fatal(err)
	}
	// Each run reads the history, then waits until the test opens the gate.
	script := writeScript(t, dir, "p.sh", `cat > /dev/null
read x < "`+gate+`"
echo '{"action":"grow","count":1,"reason":"answered"}'`)
	e := mustExec(t, map[string]any{"command": script, "eval_every": 20})
	ctx := context.Background()
	release := func() {
		t.Helper()
		opened := make(chan error, 1)
		go func() {
			f, err := os.OpenFile(gate, os.O_WRONLY, 0) // blocks until the plugin reads
			if err == nil {
				_, err = f.WriteString("go\n")
				f.Close()
			}
			opened <- err
		}()
		select {
		case err := <-opened:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the plugin never waited at the gate")
		}
		select {
		case <-e.pending.done:
		case <-time.After(20 * time.Second):
			t.Fatal("the plugin did not answer")
		}
	}
	expect := func(what string, d Decision, err error, action Action, reason string) {
		t.Helper()
		if err != nil || d.Action != action || d.Reason != reason {
			t.Fatalf("%s: decision %+v, error %v; want %v %q", what, d, err, action, reason)
		}
	}

	h := testHistory(3, [2]float64{2, 100})
	first := h.Step
	d, err := e.Decide(ctx, h)
	expect("the first call", d, err, Hold, fmt.Sprintf("plugin started on the history of step %d", first))
	h.Step += 7
	d, err = e.Decide(ctx, h)
	expect("while it runs", d, err, Hold, fmt.Sprintf("plugin evaluating the history of step %d", first))
	release()
	d, err = e.Decide(ctx, h)
	expect("after it answered", d, err, Grow, "answered")
	d, err = e.Decide(ctx, h)
	expect("the call after", d, err, Hold, fmt.Sprintf("next plugin evaluation at step %d", first+20))

	// A new world while the program runs: its answer is about the old one.
	h.Step = first + 20
	d, err = e.Decide(ctx, h)
	expect("the second run", d, err, Hold, fmt.Sprintf("plugin started on the history of step %d", first+20))
	next := testPeriod(2, 3, 150, 2, 3, h.Step+1)
	h.Periods[0].End = next.Start
	h.Periods = append(h.Periods, next)
	h.Step += int64(len(next.Steps))
	release()
	d, err = e.Decide(ctx, h)
	expect("an answer about an old world", d, err, Hold, fmt.Sprintf("plugin started on the history of step %d", h.Step))
	release()
	d, err = e.Decide(ctx, h)
	expect("the answer about the new world", d, err, Grow, "answered")
}

// TestExecPluginDoesNotSeeTheSecret: a plugin that prints its environment
// finds neither the job secret of the process that runs it nor one its
// configuration names, and does find the rest of the environment.
func TestExecPluginDoesNotSeeTheSecret(t *testing.T) {
	const secret = "5ec2e75ec2e75ec2e75ec2e75ec2e75e"
	t.Setenv("GOROVOD_SECRET", secret)
	t.Setenv("GOROVOD_TEST_KEPT", "kept-value")
	dir := t.TempDir()
	envFile := filepath.Join(dir, "env")
	script := writeScript(t, dir, "p.sh", `env > "`+envFile+`"; echo '{"action":"hold","reason":"x"}'`)
	for _, params := range []map[string]any{
		{"command": script},
		{"command": script, "env": map[string]string{"GOROVOD_SECRET": secret, "GOROVOD_TEST_B": "b"}},
	} {
		e := mustExec(t, params)
		if _, err := decideNow(context.Background(), e, testHistory(3, [2]float64{1, 100})); err != nil {
			t.Fatal(err)
		}
		env, err := os.ReadFile(envFile)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(env), secret) {
			t.Fatalf("plugin %v sees the secret:\n%s", params, env)
		}
		if !strings.Contains(string(env), "GOROVOD_TEST_KEPT=kept-value") {
			t.Fatalf("plugin %v lost the rest of the environment:\n%s", params, env)
		}
	}
}
