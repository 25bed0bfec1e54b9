package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gorovod/gorovod/cluster/kube/api"
	"github.com/gorovod/gorovod/internal/testing/testio"
	"github.com/gorovod/gorovod/internal/testing/testkube"
)

// installCRD applies the install manifest file (the GorovodJob resource
// among it) and returns once the resource is served.
func installCRD(ctx context.Context, t *testing.T, cfg *rest.Config, file string) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := testkube.ApplyManifest(ctx, dyn, file); err != nil {
		t.Fatal(err)
	}
}

// gorovod runs the command line in this process and returns what it printed.
func gorovod(ctx context.Context, args ...string) (stdout, stderr string, err error) {
	var out, errb bytes.Buffer
	err = Main(ctx, args, Config{Stdout: &out, Stderr: &errb})
	if err != nil {
		var ce *commandError
		if errors.As(err, &ce) {
			fmt.Fprintf(&errb, "gorovod %s: %v\n", ce.command, ce.err)
		}
	}
	return out.String(), errb.String(), err
}

// The job commands against a real API server with a kubeconfig file:
// clear errors without the CRD, with an unreachable server and without any
// configuration; submit from a manifest and from flags, refusing bad ones;
// jobs in a table (the context's namespace, -n, -A), with the scheduler's
// and the driver's status; delete; logs of a job whose driver pod does not
// exist. (`gorovod logs` of a running pod: TestLogsOfRunningPod.)
func TestJobCommandsAgainstAPIServer(t *testing.T) {
	cp := testkube.New(t, testkube.DefaultConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin, err := kubernetes.NewForConfig(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"team-a", "team-b"} {
		if err := cp.Namespace(ctx, admin, ns); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	write := func(name, text string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	// Two contexts: the current one, whose namespace is team-a, and one
	// whose server does not answer.
	kc := cp.Kubeconfig(cp.AdminToken)
	kc = strings.Replace(kc, "    cluster: gorovod-test\n    user: user\n", "    cluster: gorovod-test\n    user: user\n    namespace: team-a\n", 1)
	kc = strings.Replace(kc, "contexts:\n", "contexts:\n- name: nowhere\n  context:\n    cluster: nowhere\n    user: user\n", 1)
	kc = strings.Replace(kc, "clusters:\n", "clusters:\n- name: nowhere\n  cluster:\n    server: https://127.0.0.1:1\n    insecure-skip-tls-verify: true\n", 1)
	kubeconfig := write("kubeconfig", kc)
	t.Setenv("KUBECONFIG", kubeconfig) // as kubectl finds it
	t.Setenv("HOME", dir)

	manifest := write("job.yaml", `apiVersion: gorovod.io/v1alpha1
kind: GorovodJob
metadata:
  name: mnist
spec:
  image: gorovod.local/fashion-mnist:test
  command: ["/bin/fashion-mnist", "--epochs", "1"]
  minWorkers: 1
  maxWorkers: 4
  batch: {initial: 64, max: 512}
  priority: 1
`)
	for _, tc := range []struct {
		name string
		args []string
		want string // in stderr
	}{
		{"no CRD: jobs", []string{"jobs"}, "kubectl apply -f deploy/kubernetes/gorovod.yaml"},
		{"no CRD: submit", []string{"submit", manifest}, "apply deploy/kubernetes/gorovod.yaml"},
		{"unreachable", []string{"jobs", "--context", "nowhere"}, "cannot reach the Kubernetes API server at https://127.0.0.1:1"},
		{"unknown context", []string{"jobs", "--context", "missing"}, `context "missing" does not exist`},
		{"missing kubeconfig", []string{"jobs", "--kubeconfig", filepath.Join(dir, "absent")}, "absent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, err := gorovod(ctx, tc.args...)
			if err == nil || !strings.Contains(stderr, tc.want) {
				t.Fatalf("err %v, stderr %q: want an error saying %q", err, stderr, tc.want)
			}
		})
	}
	t.Run("no configuration", func(t *testing.T) {
		t.Setenv("KUBECONFIG", filepath.Join(dir, "none"))
		t.Setenv("KUBERNETES_SERVICE_HOST", "")
		_, stderr, err := gorovod(ctx, "jobs")
		if err == nil || !strings.Contains(stderr, "no Kubernetes cluster configured") {
			t.Fatalf("err %v, stderr %q", err, stderr)
		}
	})

	installCRD(ctx, t, cp.AdminConfig(), "../../../deploy/kubernetes/gorovod.yaml")
	dyn, err := dynamic.NewForConfig(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}

	if _, stderr, err := gorovod(ctx, "jobs"); err != nil || !strings.Contains(stderr, "No gorovodjobs in namespace team-a") {
		t.Fatalf("jobs before any: %v %q", err, stderr)
	}
	// Submit: the manifest into the context's namespace, flags into -n.
	if out, stderr, err := gorovod(ctx, "submit", manifest); err != nil || !strings.Contains(out, "gorovodjob team-a/mnist submitted") {
		t.Fatalf("submit: %v %q %q", err, out, stderr)
	}
	if out, stderr, err := gorovod(ctx, "submit", "-n", "team-b", "--name", "synth", "--image", "gorovod.local/synthetic:test",
		"--min-workers", "2", "--max-workers", "3", "--priority", "5", "--node-selector", "example.com/pool=a100,zone=z1", "--node-selector", "disk=ssd",
		"--probe-timeout", "3s", "--require-node", "example.com/gpu in (a100,h100)", "--require-node", "!example.com/spot",
		"--prefer-node", "zone=z1:30", "--prefer-node", "disk=ssd", "--max-workers-per-node", "1", "--gpu", "--", "/bin/synthetic", "--steps", "100"); err != nil || !strings.Contains(out, "team-b/synth submitted") {
		t.Fatalf("submit with flags: %v %q %q", err, out, stderr)
	}
	u, err := dyn.Resource(api.GroupVersionResource()).Namespace("team-b").Get(ctx, "synth", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	synth, err := api.FromUnstructured(u)
	if err != nil {
		t.Fatal(err)
	}
	if pt := synth.Spec.ProbeTimeout; pt == nil || pt.Duration != 3*time.Second {
		t.Fatalf("submitted spec.probeTimeout %v, want 3s", pt)
	}
	synth.Spec.ProbeTimeout = nil
	if synth.Spec.MaxWorkersPerNode != 1 {
		t.Fatalf("submitted spec.maxWorkersPerNode %d, want 1", synth.Spec.MaxWorkersPerNode)
	}
	synth.Spec.MaxWorkersPerNode = 0
	if q := synth.Spec.Resources.Limits[api.GPUResource]; q.Value() != 1 || len(synth.Spec.Resources.Limits) != 1 || !synth.Spec.WantsGPUs() {
		t.Fatalf("submitted spec.resources %+v, want limits of one nvidia.com/gpu (--gpu)", synth.Spec.Resources)
	}
	synth.Spec.Resources = corev1.ResourceRequirements{}
	in := func(key string, values ...string) corev1.NodeSelectorTerm {
		return corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: key, Operator: corev1.NodeSelectorOpIn, Values: values}}}
	}
	wantRequired := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{in("example.com/gpu", "a100", "h100"),
		{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "example.com/spot", Operator: corev1.NodeSelectorOpDoesNotExist}}}}}
	wantPreferred := []corev1.PreferredSchedulingTerm{{Weight: 30, Preference: in("zone", "z1")}, {Weight: 1, Preference: in("disk", "ssd")}}
	if !reflect.DeepEqual(synth.Spec.RequiredNodeAffinity, wantRequired) || !reflect.DeepEqual(synth.Spec.PreferredNodeAffinity, wantPreferred) {
		t.Fatalf("submitted spec.requiredNodeAffinity %+v, spec.preferredNodeAffinity %+v; want %+v, %+v",
			synth.Spec.RequiredNodeAffinity, synth.Spec.PreferredNodeAffinity, wantRequired, wantPreferred)
	}
	synth.Spec.RequiredNodeAffinity, synth.Spec.PreferredNodeAffinity = nil, nil
	if want := (api.Spec{Image: "gorovod.local/synthetic:test", Command: []string{"/bin/synthetic", "--steps", "100"}, MinWorkers: 2, MaxWorkers: 3, Priority: 5,
		NodeSelector: map[string]string{"example.com/pool": "a100", "zone": "z1", "disk": "ssd"}}); fmt.Sprint(synth.Spec) != fmt.Sprint(want) {
		t.Fatalf("submitted spec %+v, want %+v", synth.Spec, want)
	}

	// A manifest's preferences and the flags': added; its requirement:
	// replaced by the flags'.
	placed := write("placed.yaml", strings.Replace(readFile(t, manifest), "name: mnist", "name: placed", 1)+
		"  requiredNodeAffinity: {nodeSelectorTerms: [{matchExpressions: [{key: zone, operator: In, values: [z1]}]}]}\n"+
		"  preferredNodeAffinity: [{weight: 5, preference: {matchExpressions: [{key: zone, operator: In, values: [z1]}]}}]\n")
	if out, stderr, err := gorovod(ctx, "submit", "-n", "team-b", placed, "--require-node", "zone=z2", "--prefer-node", "disk=ssd:100"); err != nil || !strings.Contains(out, "team-b/placed submitted") {
		t.Fatalf("submit a manifest with --require-node and --prefer-node: %v %q %q", err, out, stderr)
	}
	if u, err := dyn.Resource(api.GroupVersionResource()).Namespace("team-b").Get(ctx, "placed", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if gj, err := api.FromUnstructured(u); err != nil {
		t.Fatal(err)
	} else if want := []corev1.PreferredSchedulingTerm{{Weight: 5, Preference: in("zone", "z1")}, {Weight: 100, Preference: in("disk", "ssd")}}; !reflect.DeepEqual(gj.Spec.PreferredNodeAffinity, want) ||
		!reflect.DeepEqual(gj.Spec.RequiredNodeAffinity, &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{in("zone", "z2")}}) {
		t.Fatalf("submitted spec.requiredNodeAffinity %+v, spec.preferredNodeAffinity %+v", gj.Spec.RequiredNodeAffinity, gj.Spec.PreferredNodeAffinity)
	}
	if _, stderr, err := gorovod(ctx, "delete", "-n", "team-b", "placed"); err != nil {
		t.Fatalf("delete placed: %v %q", err, stderr)
	}

	// Bad input, refused before anything is sent, or by the API server.
	bad := func(name, text string) string { return write(name, text) }
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"again", []string{"submit", manifest}, "gorovodjob mnist already exists in namespace team-a"},
		{"invalid spec", []string{"submit", bad("min0.yaml", strings.Replace(readFile(t, manifest), "minWorkers: 1", "minWorkers: 0", 1))}, "spec.minWorkers must be ≥ 1"},
		{"max below min", []string{"submit", "--name", "x", "--image", "i", "--min-workers", "3", "--max-workers", "2", "--", "t"}, "spec.maxWorkers 2 is below spec.minWorkers 3"},
		{"no command", []string{"submit", "--name", "x", "--image", "i"}, "spec.command is empty"},
		{"probe timeout 0", []string{"submit", "--name", "x", "--image", "i", "--probe-timeout", "0s", "--", "t"}, "spec.probeTimeout 0s must be above 0"},
		{"probe timeout above 10m", []string{"submit", "--name", "x", "--image", "i", "--probe-timeout", "11m", "--", "t"}, "at most 10m0s"},
		{"bad node selector", []string{"submit", "--name", "x", "--image", "i", "--node-selector", "pool", "--", "t"}, "want KEY=VALUE"},
		{"workers per node negative", []string{"submit", "--name", "x", "--image", "i", "--max-workers-per-node", "-1", "--", "t"}, "spec.maxWorkersPerNode must be 0 to 255, got -1"},
		{"workers per node above the bound", []string{"submit", "--name", "x", "--image", "i", "--max-workers-per-node", "256", "--", "t"}, "spec.maxWorkersPerNode must be 0 to 255, got 256"},
		{"workers per node not a number", []string{"submit", "--name", "x", "--image", "i", "--max-workers-per-node", "two", "--", "t"}, "want a whole number"},
		{"bad node selector key", []string{"submit", "--name", "x", "--image", "i", "--node-selector", "-pool=a", "--", "t"}, "spec.nodeSelector: key \"-pool\""},
		{"bad node affinity", []string{"submit", bad("affinity.yaml", readFile(t, manifest)+"  requiredNodeAffinity: {nodeSelectorTerms: [{matchExpressions: [{key: zone, operator: Equal}]}]}\n")},
			"operator \"Equal\""},
		{"bad node preference", []string{"submit", bad("prefer.yaml", readFile(t, manifest)+"  preferredNodeAffinity: [{weight: 0, preference: {matchExpressions: [{key: zone, operator: In, values: [z1]}]}}]\n")},
			"spec.preferredNodeAffinity[0].weight 0: want 1 to 100"},
		{"bad --prefer-node weight", []string{"submit", "--name", "x", "--image", "i", "--prefer-node", "zone=z1:0", "--", "t"},
			`invalid value "zone=z1:0" for flag -prefer-node: weight "0" (after the last ':'): want an integer 1 to 100`},
		{"bad --require-node", []string{"submit", manifest, "--require-node", "zone in (z1"}, `invalid value "zone in (z1" for flag -require-node: not a label selector`},
		{"too many --prefer-node", append([]string{"submit", manifest}, slices.Repeat([]string{"--prefer-node", "zone=z1"}, api.MaxPreferredTerms+1)...),
			"spec.preferredNodeAffinity has 17 terms: at most 16"},
		{"no name", []string{"submit", "--image", "i", "--", "t"}, "--name is required"},
		{"unknown field", []string{"submit", bad("typo.yaml", strings.Replace(readFile(t, manifest), "maxWorkers", "maxWorkerz", 1))}, "not a GorovodJob manifest"},
		{"not YAML", []string{"submit", bad("junk.yaml", "{{{")}, "not a GorovodJob manifest"},
		{"another kind", []string{"submit", bad("pod.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {}\n")}, "want apiVersion gorovod.io/v1alpha1, kind GorovodJob"},
		{"bad name", []string{"submit", "--name", "Not_A_Label", "--image", "i", "--", "t"}, "Not_A_Label"},
		{"namespace clash", []string{"submit", "-n", "team-b", bad("ns.yaml", strings.Replace(readFile(t, manifest), "  name: mnist\n", "  name: mnist\n  namespace: team-a\n", 1))}, "namespace team-a is not --namespace team-b"},
		{"unknown job: delete", []string{"delete", "nosuch"}, `gorovodjob "nosuch" not found in namespace team-a`},
		{"unknown job: logs", []string{"logs", "nosuch"}, `gorovodjob "nosuch" not found in namespace team-a`},
		{"no driver pod: logs", []string{"logs", "mnist", "-f"}, "pod mnist-driver of gorovodjob mnist not found in namespace team-a"},
		{"no worker pod: logs", []string{"logs", "--worker", "3", "mnist"}, "pod mnist-worker-3 of gorovodjob mnist not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, err := gorovod(ctx, tc.args...)
			if err == nil || !strings.Contains(stderr, tc.want) {
				t.Fatalf("err %v, stderr %q: want an error saying %q", err, stderr, tc.want)
			}
		})
	}

	// The scheduler's and the driver's status (as they write it: merge
	// patches of the status subresource) show in the table.
	patch := `{"status":{"phase":"Running","allocation":["node-a","node-a","node-b"],"worldSize":3,"step":420,
		"goodput":{"model":{"perf":{"alpha_c":0.01,"beta_c":0.0001,"alpha_n":0.02,"beta_n":0.0002,"alpha_r":0.03,"beta_r":0.0003,"gamma":1.5},"grad":{"sqr":1,"var":2},"init_batch":64},"maxProfiledWorkers":3,"fittedAt":"2026-01-01T00:00:00Z"}}}`
	if _, err := dyn.Resource(api.GroupVersionResource()).Namespace("team-a").Patch(ctx, "mnist", types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	out, stderr, err := gorovod(ctx, "jobs")
	if err != nil {
		t.Fatalf("jobs: %v %s", err, stderr)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "NAME PHASE WORKERS GOODPUT STEP AGE" {
		t.Fatalf("jobs:\n%s", out)
	}
	f := strings.Fields(lines[1])
	if len(f) != 6 || f[0] != "mnist" || f[1] != "Running" || f[2] != "3/3" || f[3] == "-" || f[4] != "420" || !strings.HasSuffix(f[5], "s") {
		t.Fatalf("jobs row %q", lines[1])
	}
	out, _, err = gorovod(ctx, "jobs", "-A")
	if err != nil || !strings.Contains(out, "NAMESPACE") || !strings.Contains(out, "team-b") || !strings.Contains(out, "team-a") {
		t.Fatalf("jobs -A: %v\n%s", err, out)
	}
	if row := strings.Fields(strings.Split(strings.TrimSpace(out), "\n")[2]); len(row) != 7 || row[1] != "synth" || row[2] != "-" || row[3] != "0/0" || row[4] != "-" {
		t.Fatalf("jobs -A, the job without status: %q", row)
	}
	if out, _, err := gorovod(ctx, "jobs", "--namespace", "team-b"); err != nil || !strings.Contains(out, "synth") || strings.Contains(out, "mnist") {
		t.Fatalf("jobs --namespace team-b: %v\n%s", err, out)
	}
	if out, _, err := gorovod(ctx, "jobs", "--kubeconfig", kubeconfig, "--context", "gorovod-test", "-n", "team-a"); err != nil || !strings.Contains(out, "mnist") {
		t.Fatalf("jobs with --kubeconfig and --context: %v\n%s", err, out)
	}

	// Delete: gone from the API server.
	if out, stderr, err := gorovod(ctx, "delete", "mnist"); err != nil || !strings.Contains(out, "gorovodjob team-a/mnist deleted") {
		t.Fatalf("delete: %v %q %q", err, out, stderr)
	}
	if _, err := dyn.Resource(api.GroupVersionResource()).Namespace("team-a").Get(ctx, "mnist", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("mnist after delete: %v", err)
	}
	if out, stderr, err := gorovod(ctx, "delete", "-n", "team-b", "synth", "nosuch"); err == nil || !strings.Contains(out, "team-b/synth deleted") || !strings.Contains(stderr, `"nosuch" not found`) {
		t.Fatalf("delete of one that exists and one that does not: %v %q %q", err, out, stderr)
	}

	// The scheduler's metrics: served where --metrics-addr says, the
	// address printed; an address it cannot listen on is an error.
	if _, stderr, err := gorovod(ctx, "scheduler", "--kubeconfig", kubeconfig, "--metrics-addr", "127.0.0.1:99999"); err == nil || !strings.Contains(err.Error(), "--metrics-addr") {
		t.Fatalf("scheduler with a bad --metrics-addr: %v %q", err, stderr)
	}
	sctx, stop := context.WithCancel(ctx)
	logs := &testio.Buffer{}
	done := make(chan error, 1)
	go func() {
		// No --kubeconfig: the scheduler finds the API server through
		// $KUBECONFIG, as kubectl does.
		done <- Main(sctx, []string{"scheduler", "--metrics-addr", "127.0.0.1:0", "--interval", "1s"}, Config{Stdout: io.Discard, Stderr: logs})
	}()
	url := regexp.MustCompile(`metrics at (http://127\.0\.0\.1:\d+/metrics)`)
	var scraped string
	for deadline := time.Now().Add(time.Minute); ; {
		if m := url.FindStringSubmatch(logs.String()); m != nil {
			if resp, err := http.Get(m[1]); err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				scraped = string(b)
				if regexp.MustCompile(`(?m)^gorovod_scheduler_rounds_total\{result="ok"\} [1-9]`).MatchString(scraped) {
					break
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no scheduler round in the metrics within a minute; log %q, metrics %q", logs.String(), scraped)
		}
		time.Sleep(100 * time.Millisecond) // polling the endpoint, as a scraper does
	}
	for _, want := range []string{"gorovod_scheduler_leader 1", `gorovod_scheduler_jobs{phase="Running"} 0`, "gorovod_scheduler_slots 0", "gorovod_scheduler_round_seconds_count"} {
		if !strings.Contains(scraped, want) {
			t.Errorf("the scheduler's metrics lack %q:\n%s", want, scraped)
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("the scheduler after its context ended: %v", err)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
