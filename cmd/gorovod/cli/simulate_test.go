package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/cluster/simulator"
)

// toyTraces are the trace files of a model small enough to follow by hand:
// on one GPU a step at local batch 8 takes 1 s, the gradient has no noise,
// and each epoch is 40 steps at batch 8 (three validated).
var toyTraces = map[string]string{
	"placements.csv": "placement,local_bsz,step_time,sync_time\n" +
		"1,4,0.5,0\n1,8,1.0,0\n1,16,2.0,0\n" +
		"2,4,0.6,0.1\n2,8,1.1,0.1\n2,16,2.1,0.1\n" +
		"11,4,0.8,0.3\n11,8,1.3,0.3\n11,16,2.3,0.3\n",
	"scalability.csv": "num_nodes,num_replicas,local_bsz,step_time,sync_time\n6,6,4,2,1\n6,6,16,3,1\n6,24,4,3,2\n6,24,16,4,2\n",
	"validation-8.csv": "progress,iteration,metric,grad_sqr,grad_var\n" +
		"40,40,0,1,0.000001\n80,80,0,1,0.000001\n120,120,0,1,0.000001\n",
	"validation-32.csv": "progress,iteration,metric,grad_sqr,grad_var\n" +
		"40,40,0,1,0.000001\n80,80,0,1,0.000001\n120,120,0,1,0.000001\n",
}

// writeStudy lays out a study as the command finds it by default:
// root/workloads/<workload> and root/traces/<application>/.
func writeStudy(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, contents := range files {
		path := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(contents), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func withToyTraces(app, modelJSON string, files map[string]string) map[string]string {
	for name, contents := range toyTraces {
		files["traces/"+app+"/"+name] = contents
	}
	if modelJSON != "" {
		files["traces/"+app+"/model.json"] = modelJSON
	}
	return files
}

// TestSimulateOwnModels: a traces directory holding only a model of one's
// own (model.json beside its traces) replays a workload naming it, each job
// for its own epochs; two studies with a model of the same name use each
// its own model.json.
func TestSimulateOwnModels(t *testing.T) {
	const header = "name,time,application,num_replicas,batch_size,epochs,max_replicas\n"
	short, long := t.TempDir(), t.TempDir()
	writeStudy(t, short, withToyTraces("toy", `{"max_epochs": 2}`, map[string]string{
		"workloads/w.csv": header + "a,0,toy,1,8,1,\nb,0,toy,1,8,,2\nc,0,toy,1,8,3,1\n",
	}))
	writeStudy(t, long, withToyTraces("toy", `{"max_epochs": 3}`, map[string]string{
		"workloads/w.csv": header + "b,0,toy,1,8,,\n",
	}))
	var stdout, stderr bytes.Buffer
	// Tiresias on 3 GPUs runs each job on one GPU from the first round
	// (60 s), free of start-up costs: 40 s an epoch.
	err := simulateCommand(context.Background(), []string{"--policy", "tiresias", "--nodes", "1", "--gpus-per-node", "3",
		"--rescale-cost", "0", "--json", filepath.Join(short, "workloads", "w.csv"), filepath.Join(long, "workloads", "w.csv")},
		&stdout, &stderr)
	if err != nil {
		t.Fatalf("%v; stderr %s", err, stderr.String())
	}
	want := []map[string]float64{
		{"a": 100, "b": 140, "c": 180}, // 1, the model's 2, 3 epochs
		{"b": 180},                     // the other model.json's 3
	}
	dec := json.NewDecoder(&stdout)
	for i, w := range want {
		var res simulator.Result
		if err := dec.Decode(&res); err != nil {
			t.Fatalf("result %d: %v", i, err)
		}
		got := map[string]float64{}
		for _, j := range res.Jobs {
			got[j.Name] = j.Completed
		}
		if len(got) != len(w) {
			t.Fatalf("result %d: completed %v, want %v", i, got, w)
		}
		for name, c := range w {
			if got[name] != c {
				t.Errorf("result %d: completed %v, want %v", i, got, w)
			}
		}
	}
}

func TestSimulateModelErrors(t *testing.T) {
	const header = "name,time,application,num_replicas,batch_size\n"
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"not built in, no model.json", withToyTraces("toy", "", map[string]string{"workloads/w.csv": header + "a,0,toy,1,8\n"}),
			`application "toy": no model.json in `},
		{"a built-in model not in the traces", withToyTraces("toy", `{"max_epochs": 2}`, map[string]string{"workloads/w.csv": header + "a,0,cifar10,1,128\n"}),
			"loading traces (set --traces): trace cifar10"},
		{"bad model.json", withToyTraces("toy", `{"max_epochs": 2, "max_batch": 8}`, map[string]string{"workloads/w.csv": header + "a,0,toy,1,8\n"}),
			filepath.Join("traces", "toy", "model.json") + `: not a model configuration: json: unknown field "max_batch"`},
		{"more epochs than validated", withToyTraces("toy", `{"max_epochs": 2}`, map[string]string{"workloads/w.csv": header[:len(header)-1] + ",epochs\na,0,toy,1,8,4\n"}),
			"job a: 4 epochs, but the validation traces of toy record 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			writeStudy(t, root, tc.files)
			var stdout, stderr bytes.Buffer
			err := simulateCommand(context.Background(), []string{"--policy", "tiresias", "--nodes", "1",
				filepath.Join(root, "workloads", "w.csv")}, &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestSimulateRecordedWorkload: the measured workload of docs/scheduler.md
// ("The simulator beside the measurement") replays from the traces recorded
// of gorovod's own trainers, the commands of the docs: every job completes
// under each policy, after its submission, in Pollux's study and as the
// scheduler service carries allocations out (--elastic), where Tiresias
// starts a waiting job at its minimum beside the others instead of queueing
// it, so that its jobs finish sooner on average.
func TestSimulateRecordedWorkload(t *testing.T) {
	dir := filepath.Join("..", "..", "..", "bench", "simtrace")
	avgJCT := map[string]float64{} // Tiresias's, by mode
	for _, mode := range []struct {
		name  string
		flags []string
	}{
		{"suspended", nil},
		{"elastic", []string{"--elastic", "--end-cost", "4s"}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			args := append([]string{"--policy", "all", "--nodes", "2", "--gpus-per-node", "2",
				"--interval", "3s", "--rescale-cost", "30ms", "--start-cost", "3s", "--joiner-startup", "2s", "--json",
				"--traces", filepath.Join(dir, "traces")}, mode.flags...)
			err := simulateCommand(context.Background(), append(args, filepath.Join(dir, "workload.csv")), &stdout, &stderr)
			if err != nil {
				t.Fatalf("%v; stderr %s", err, stderr.String())
			}
			dec := json.NewDecoder(&stdout)
			for _, policy := range []string{"pollux", "optimus", "tiresias"} {
				var res simulator.Result
				if err := dec.Decode(&res); err != nil {
					t.Fatalf("%s: %v", policy, err)
				}
				if res.Policy != policy || len(res.Jobs) != 6 {
					t.Fatalf("result %s with %d jobs, want %s with the workload's 6", res.Policy, len(res.Jobs), policy)
				}
				for _, j := range res.Jobs {
					if j.Completed <= j.Submitted {
						t.Errorf("%s: job %s submitted at %v s, completed at %v s", policy, j.Name, j.Submitted, j.Completed)
					}
				}
				if policy == "tiresias" {
					avgJCT[mode.name] = res.AvgJCT
				}
			}
		})
	}
	if s, e := avgJCT["suspended"], avgJCT["elastic"]; !(e > 0 && e < s) {
		t.Fatalf("Tiresias's average JCT %.1f s elastic, %.1f s suspended: want elastic below", e, s)
	}
}

// TestSimulateFlagErrors: bad cost flags are usage errors, before any
// workload is read.
func TestSimulateFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"negative end cost", []string{"--end-cost", "-4s"}, "--end-cost must not be negative"},
		{"negative joiner start-up", []string{"--joiner-startup", "-1s"}, "--joiner-startup and --end-cost must not be negative"},
		{"elastic takes no value", []string{"--elastic=maybe"}, "invalid boolean value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, err := gorovod(context.Background(), append(append([]string{"simulate"}, tc.args...), "w.csv")...)
			if !errors.Is(err, ErrUsage) || !strings.Contains(stderr, tc.want) {
				t.Fatalf("err %v, stderr %q; want a usage error containing %q", err, stderr, tc.want)
			}
		})
	}
}
