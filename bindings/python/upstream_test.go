package python

import (
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/bindings/internal/buildtest"
)

// horovodScripts maps each Horovod example these tests run to its path in
// a Horovod checkout. The repository carries none of Horovod's code: the
// tests run against a checkout fetched for the run and named by
// GOROVOD_HOROVOD_SRC (`git clone https://github.com/horovod/horovod`),
// and skip without one. Measured against horovod/horovod at 2626dc8.
var horovodScripts = map[string]string{
	"pytorch_mnist.py":         filepath.Join("examples", "pytorch", "pytorch_mnist.py"),
	"pytorch_mnist_elastic.py": filepath.Join("examples", "elastic", "pytorch", "pytorch_mnist_elastic.py"),
}

// horovodScript returns the path of Horovod's script name in the checkout
// GOROVOD_HOROVOD_SRC names, and skips the test when there is none.
func horovodScript(t *testing.T, name string) string {
	t.Helper()
	src := os.Getenv("GOROVOD_HOROVOD_SRC")
	if src == "" {
		t.Skip("no Horovod checkout: set GOROVOD_HOROVOD_SRC to one (git clone https://github.com/horovod/horovod) to run Horovod's own examples")
	}
	rel, ok := horovodScripts[name]
	if !ok {
		t.Fatalf("no Horovod script %q", name)
	}
	path := filepath.Join(src, rel)
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("GOROVOD_HOROVOD_SRC=%s is not a Horovod checkout: %v", src, err)
	}
	return path
}

// needTorchvision skips the test when the modules Horovod's examples import
// beside torch are missing (CI installs them: see .ci/run).
func needTorchvision(t *testing.T) {
	t.Helper()
	needTorch(t)
	if out, err := exec.Command(Python, "-c", "import torchvision, filelock, packaging").CombinedOutput(); err != nil {
		t.Skipf("torchvision, filelock or packaging cannot be imported by %s (apt-get install python3-torchvision python3-filelock python3-packaging): %v\n%s",
			Python, err, out)
	}
	if _, err := os.Stat(fashionMNIST); err != nil {
		t.Skipf("Fashion-MNIST is missing (apt-get install dataset-fashion-mnist): %v", err)
	}
}

// mnistDataDir lays Debian's Fashion-MNIST out as torchvision's MNIST data
// set expects it under a --data-dir: <dir>/MNIST/raw/<name> uncompressed.
// Fashion-MNIST has MNIST's idx format, sizes and file names, and
// torchvision's MNIST skips its download when those four files exist, so
// the scripts run unchanged with no network.
func mnistDataDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	raw := filepath.Join(dir, "MNIST", "raw")
	if err := os.MkdirAll(raw, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"} {
		if err := gunzipFile(filepath.Join(fashionMNIST, name+".gz"), filepath.Join(raw, name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func gunzipFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	z, err := gzip.NewReader(in)
	if err != nil {
		return err
	}
	out, err := os.Create(to)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, z); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// portScript copies Horovod's script name to dir with the given lines
// replaced, and checks that exactly those lines differ from the original.
func portScript(t *testing.T, name, dir string, replace map[string]string) string {
	t.Helper()
	orig, err := os.ReadFile(horovodScript(t, name))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(orig), "\n")
	changed := 0
	for i, l := range lines {
		if r, ok := replace[l]; ok {
			lines[i] = r
			changed++
		}
	}
	if changed != len(replace) {
		t.Fatalf("%s: %d of the %d lines to replace were found once each; has the upstream script changed?", name, changed, len(replace))
	}
	ported := strings.Join(lines, "\n")
	a, b := strings.Split(string(orig), "\n"), strings.Split(ported, "\n")
	var differ []string
	for i := range a {
		if a[i] != b[i] {
			differ = append(differ, a[i]+" -> "+b[i])
		}
	}
	if len(a) != len(b) || len(differ) != len(replace) {
		t.Fatalf("%s: the port differs from Horovod's script in %v, want only %v", name, differ, replace)
	}
	t.Logf("%s: changed %q", name, differ)
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(ported), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// testSetLine is the line only hvd.rank() 0 prints. The [N] prefix `gorovod
// run` adds is the worker's index, which need not be its rank.
var testSetLine = regexp.MustCompile(`\[\d+\] Test set: Average loss: ([0-9.]+), Accuracy: ([0-9.]+)%`)

// TestUpstreamHorovodScripts runs Horovod's own PyTorch MNIST examples
// (from the checkout GOROVOD_HOROVOD_SRC names)
// under `gorovod run --np 2 --min-np 2` for one full epoch on Fashion-MNIST,
// after changing only their Horovod import lines. pytorch_mnist.py has two:
// `import horovod` (used only by its --num-proc path, horovod.run) and
// `import horovod.torch as hvd`.
func TestUpstreamHorovodScripts(t *testing.T) {
	horovodScript(t, "pytorch_mnist.py")
	needTorchvision(t)
	data := mnistDataDir(t)
	for _, tc := range []struct {
		script  string
		replace map[string]string
	}{
		{"pytorch_mnist.py", map[string]string{
			"import horovod":              "import gorovod as horovod",
			"import horovod.torch as hvd": "import gorovod.torch as hvd",
		}},
		{"pytorch_mnist_elastic.py", map[string]string{
			"import horovod.torch as hvd": "import gorovod.torch as hvd",
		}},
	} {
		t.Run(tc.script, func(t *testing.T) {
			dir := t.TempDir()
			script := portScript(t, tc.script, dir, tc.replace)
			// The scripts take a FileLock in ~/.horovod_lock: keep it in the
			// test's directory.
			env := pyEnv(t, "HOME="+dir)
			out := runPython(t, 2, 8*time.Minute, env, script, "--epochs", "1", "--data-dir", data, "--log-interval", "100")
			wantOneEpochOnTwo(t, out)
		})
	}
}

// TestUpstreamNumProc: pytorch_mnist.py's own launcher path (--num-proc 2:
// horovod.run(main, args=(args,), np=2, ...)) trains one epoch in two
// workers that gorovod.run starts under `gorovod run`, after the same two
// import lines are changed as for TestUpstreamHorovodScripts.
func TestUpstreamNumProc(t *testing.T) {
	horovodScript(t, "pytorch_mnist.py")
	needTorchvision(t)
	needCloudpickle(t)
	data := mnistDataDir(t)
	dir := t.TempDir()
	script := portScript(t, "pytorch_mnist.py", dir, map[string]string{
		"import horovod":              "import gorovod as horovod",
		"import horovod.torch as hvd": "import gorovod.torch as hvd",
	})
	env := pyEnv(t, "HOME="+dir, "GOROVOD="+buildtest.Gorovod(t))
	out := runPython(t, 0, 8*time.Minute, env, script, "--num-proc", "2", "--epochs", "1", "--data-dir", data, "--log-interval", "100")
	if !strings.Contains(out, "Running training through horovod.run") {
		t.Fatalf("the script did not take its --num-proc path:\n%s", out)
	}
	wantOneEpochOnTwo(t, out)
}

// wantOneEpochOnTwo checks the output of pytorch_mnist.py trained for one
// epoch by 2 workers: each worker trains on its half of the 60000 samples
// (DistributedSampler with hvd.size() 2) to the end of the epoch, and rank 0
// alone reports a test accuracy of at least 50% (chance is 10%; one epoch of
// this net on Fashion-MNIST reaches about 73%, measured).
func wantOneEpochOnTwo(t *testing.T, out string) {
	t.Helper()
	for _, w := range []string{"0", "1"} {
		if !strings.Contains(out, "["+w+"] Train Epoch: 1 [25600/30000 (85%)]") {
			t.Fatalf("worker %s did not log its last step of epoch 1 over 30000 samples:\n%s", w, out)
		}
	}
	all := testSetLine.FindAllStringSubmatch(out, -1)
	if len(all) != 1 {
		t.Fatalf("%d test-set loss and accuracy lines, want one (from rank 0):\n%s", len(all), out)
	}
	if acc, err := strconv.ParseFloat(all[0][2], 64); err != nil || acc < 50 {
		t.Fatalf("test accuracy %s%% after one epoch, want at least 50%%:\n%s", all[0][2], out)
	}
	t.Logf("%s", all[0][0])
}

// needCloudpickle skips when Debian's python3-cloudpickle (which gorovod.run
// sends functions with) is missing; .ci/run installs it.
func needCloudpickle(t *testing.T) {
	t.Helper()
	needTorch(t)
	if err := exec.Command(Python, "-c", "import cloudpickle").Run(); err != nil {
		t.Skip("python3-cloudpickle is not installed (apt-get install python3-cloudpickle)")
	}
}

// TestUpstreamElasticWorldChange runs Horovod's own pytorch_mnist_elastic.py
// (its import line changed) through a world change each way: it starts with
// 2 workers, a third is added (SIGUSR1 to gorovod run) and trains, then one
// worker is killed with kill -9; the survivors finish both epochs and rank 0
// reports a test accuracy of at least 50% (76% measured). The script keeps
// no ElasticSampler in its state, so each world change restarts the epoch's
// data (Horovod's behaviour with this script too).
func TestUpstreamElasticWorldChange(t *testing.T) {
	horovodScript(t, "pytorch_mnist_elastic.py")
	needTorchvision(t)
	data := mnistDataDir(t)
	dir := t.TempDir()
	script := portScript(t, "pytorch_mnist_elastic.py", dir, map[string]string{
		"import horovod.torch as hvd": "import gorovod.torch as hvd",
	})
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	j := startJob(t, ctx, pyEnv(t, "HOME="+dir), buildtest.Gorovod(t), "run", "--np", "2", "--min-np", "2", "--max-np", "3", "--",
		Python, script, "--epochs", "2", "--data-dir", data, "--log-interval", "10")
	// Two workers split the 60000 samples: 30000 each.
	j.waitFor(t, regexp.MustCompile(`\[0\] Train Epoch: 1 \[\d+/30000 `), 4*time.Minute)
	driver, _ := strconv.Atoi(j.waitFor(t, driverPid, time.Second)[1])
	if err := syscall.Kill(driver, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	added, _ := strconv.Atoi(j.waitFor(t, regexp.MustCompile(`gorovod run: worker 2 pid (\d+)`), time.Minute)[1])
	j.waitFor(t, regexp.MustCompile(`\[2\] Train Epoch: \d `), 4*time.Minute)
	if err := syscall.Kill(added, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killedAt := len(j.output())
	out := j.wait(t, 8*time.Minute)
	if !regexp.MustCompile(`\[[01]\] Train Epoch: \d `).MatchString(out[killedAt:]) {
		t.Fatalf("the survivors did not train after worker 2 was killed:\n%s", out)
	}
	if !strings.Contains(out, fmt.Sprintf("gorovod run: worker 2 (pid %d) lost", added)) || !strings.Contains(out, " lost, 0 failed;") {
		t.Fatalf("want the killed worker lost and no worker failed:\n%s", out)
	}
	// The script tests once, after training.
	all := testSetLine.FindAllStringSubmatch(out, -1)
	if len(all) != 1 {
		t.Fatalf("%d test-set lines, want one (from rank 0):\n%s", len(all), out)
	}
	if acc, err := strconv.ParseFloat(all[0][2], 64); err != nil || acc < 50 {
		t.Fatalf("test accuracy %s%% after two epochs, want at least 50%%:\n%s", all[0][2], out)
	}
	t.Logf("%s", all[0][0])
}

// horovodTorchDifferences lists the tests of Horovod's own
// test/parallel/test_torch.py (at 2626dc8) that fail under gorovod, each
// with why. TestUpstreamTorchSuite skips them saying so, and fails when one
// of them passes (so that the list stays true) or when any other fails.
// None does today.
var horovodTorchDifferences = map[string]string{}

var torchTestName = regexp.MustCompile(`(?m)^    def (test_\w+)\(self`)

var torchTestResult = regexp.MustCompile(`RESULT rank (\d+) test (\w+): (\w+)`)

// TestUpstreamTorchSuite runs every test of Horovod's own
// test/parallel/test_torch.py (from the checkout GOROVOD_HOROVOD_SRC names)
// alone in a job of two workers (`gorovod run --np 2 --min-np 2`), through
// tests/horovod_torch_suite.py, which changes only its import line and
// stands in for its three helper modules. A test passes when both ranks
// pass it; a GPU test skips; horovodTorchDifferences says why each of the
// others fails.
func TestUpstreamTorchSuite(t *testing.T) {
	src := os.Getenv("GOROVOD_HOROVOD_SRC")
	if src == "" {
		t.Skip("no Horovod checkout: set GOROVOD_HOROVOD_SRC to one (git clone https://github.com/horovod/horovod) to run Horovod's own test_torch.py")
	}
	needTorch(t)
	text, err := os.ReadFile(filepath.Join(src, "test", "parallel", "test_torch.py"))
	if err != nil {
		t.Fatalf("GOROVOD_HOROVOD_SRC=%s is not a Horovod checkout: %v", src, err)
	}
	env, gorovod := pyEnv(t), buildtest.Gorovod(t)
	for _, m := range torchTestName.FindAllStringSubmatch(string(text), -1) {
		name := m[1]
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			c := exec.CommandContext(ctx, gorovod, "run", "--np", "2", "--min-np", "2", "--",
				Python, filepath.Join("tests", "horovod_torch_suite.py"), src, name)
			c.Env, c.WaitDelay = env, 10*time.Second
			out, _ := c.CombinedOutput() // a failing test fails the job: the RESULT lines say which
			outcomes := map[string]string{}
			for _, r := range torchTestResult.FindAllStringSubmatch(string(out), -1) {
				if r[2] == name {
					outcomes[r[1]] = r[3]
				}
			}
			why, known := horovodTorchDifferences[name]
			switch {
			case outcomes["0"] == "skip" && outcomes["1"] == "skip":
				t.Skipf("Horovod's test skips here (a GPU test, or one that does not apply)")
			case outcomes["0"] == "pass" && outcomes["1"] == "pass":
				if known {
					t.Fatalf("passes now: remove it from horovodTorchDifferences (%s)", why)
				}
			case known:
				t.Skipf("a known difference: %s", why)
			default:
				t.Fatalf("rank 0: %q, rank 1: %q\n%s", outcomes["0"], outcomes["1"], out)
			}
		})
	}
}

// torchDistributedDifferences lists the tests of torch's own
// distributed_test.py (those TestUpstreamTorchDistributedSuite runs) that
// fail on the gorovod backend, each with why and the Python versions it
// fails on; the test skips them there saying so and fails when one of them
// passes there or any other fails.
var torchDistributedDifferences = map[string]torchDifference{
	// Python 3.13's pickle says "Can't get local object" where earlier
	// versions said "Can't pickle local object", which torch 2.6's test
	// expects: on Gloo too (a gather_object of a local class on a
	// one-process Gloo group raises the same).
	"test_gather_object":          {why: pickleMessage, fromPython: "3.13"},
	"test_gather_object_subgroup": {why: pickleMessage, fromPython: "3.13"},
}

const pickleMessage = "torch's test wants pickle's error for a local class to say \"Can't pickle local object\"; from Python 3.13 it says \"Can't get local object\", on every backend"

// torchDifference is a known failure of one of torch's tests: why, and the
// Python versions it fails on (fromPython and later; "" for every one).
type torchDifference struct {
	why, fromPython string
}

// appliesTo says whether the difference is expected on Python version
// ("3.13.5").
func (d torchDifference) appliesTo(version string) bool {
	return d.fromPython == "" || !versionBefore(version, d.fromPython)
}

// versionBefore compares dotted version numbers: whether a is below b in
// the components b gives ("3.12.7" is before "3.13"; "3.13.5" is not).
func versionBefore(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i, bp := range bs {
		if i >= len(as) {
			return true
		}
		an, _ := strconv.Atoi(as[i])
		bn, _ := strconv.Atoi(bp)
		if an != bn {
			return an < bn
		}
	}
	return false
}

// torchDistributedTest is the method of torch's DistributedTest._DistTestBase
// (nested two classes deep in distributed_test.py).
var torchDistributedTest = regexp.MustCompile(`(?m)^        def (test_\w+)\(`)

// torchDistributedDevice drops torch's tests of CUDA or NCCL; every other
// test of the file runs (those that skip on both Gloo and MPI skip). The
// suite comes in three groups of several minutes each, which
// GOROVOD_TORCH_DISTRIBUTED_SUITE chooses: "collectives" (names
// torchDistributedCollective matches), "p2p" (torchDistributedP2P:
// point-to-point, barriers, groups and the backend's queries) and "ddp" (the
// others: DistributedDataParallel, its hooks, SyncBatchNorm, the model
// averagers, post-local SGD); "all" or "1" runs the three.
var (
	torchDistributedDevice     = regexp.MustCompile(`cuda|nccl|gpu`)
	torchDistributedCollective = regexp.MustCompile(`^test_(all_reduce|broadcast|all_gather|reduce|gather|scatter|all_to_all|sparse_all_reduce)`)
	torchDistributedP2P        = regexp.MustCompile(`^test_(barrier|send_recv|isend|irecv|batch_isend_irecv|monitored_barrier|new_subgroups|get_|backend_|Backend_enum|destroy_)`)
	torchDistributedGroups     = map[string]func(name string) bool{
		"collectives": torchDistributedCollective.MatchString,
		"p2p":         torchDistributedP2P.MatchString,
		"ddp": func(name string) bool {
			return !torchDistributedCollective.MatchString(name) && !torchDistributedP2P.MatchString(name)
		},
		"all": func(string) bool { return true },
		"1":   func(string) bool { return true },
	}
)

// TestUpstreamTorchDistributedSuite runs PyTorch's own tests of
// torch.distributed backends (the installed torch's
// torch/testing/_internal/distributed/distributed_test.py, which torch's
// test_distributed_spawn.py runs for Gloo) on the "gorovod" backend: each
// test of the group GOROVOD_TORCH_DISTRIBUTED_SUITE chooses alone in a job
// of three workers (three so that the tests of a group of some ranks run
// too), through tests/torch_distributed_suite.py. A test passes when every
// rank passes it, and skips when every rank skips it (where it skips on
// Gloo: CUDA, a feature torch marks for NCCL or MPI only). It runs only when
// asked, since each group takes minutes.
func TestUpstreamTorchDistributedSuite(t *testing.T) {
	group := os.Getenv("GOROVOD_TORCH_DISTRIBUTED_SUITE")
	picked, ok := torchDistributedGroups[group]
	if !ok {
		t.Skipf("GOROVOD_TORCH_DISTRIBUTED_SUITE=%q: set it to collectives, p2p, ddp or all (1) to run torch's own distributed tests (minutes each group)", group)
	}
	needTorch(t)
	where, err := exec.Command(Python, "-c",
		"import os, platform, torch; print(platform.python_version()); print(os.path.join(os.path.dirname(torch.__file__), 'testing', '_internal', 'distributed', 'distributed_test.py'))").Output()
	if err != nil {
		t.Fatalf("where is torch: %v", err)
	}
	pyVersion, file, _ := strings.Cut(strings.TrimSpace(string(where)), "\n")
	text, err := os.ReadFile(file)
	if err != nil {
		t.Skipf("this torch has no distributed tests: %v", err)
	}
	// Three workers, so that the tests of a group of some ranks run too;
	// torch 2.x's run those only from 8 (skip_if_small_worldsize), which
	// GOROVOD_TORCH_DISTRIBUTED_NP=8 gives them.
	np := 3
	if v := os.Getenv("GOROVOD_TORCH_DISTRIBUTED_NP"); v != "" {
		if np, err = strconv.Atoi(v); err != nil || np < 2 {
			t.Fatalf("GOROVOD_TORCH_DISTRIBUTED_NP=%q: want a number of workers, at least 2", v)
		}
	}
	env, gorovod := pyEnv(t), buildtest.Gorovod(t)
	seen := map[string]bool{}
	for _, m := range torchDistributedTest.FindAllStringSubmatch(string(text), -1) {
		name := m[1]
		if seen[name] || !picked(name) || torchDistributedDevice.MatchString(name) {
			continue
		}
		seen[name] = true
		t.Run(name, func(t *testing.T) {
			// The harness's own file barrier and lock live in TEMP_DIR.
			temp := t.TempDir()
			for _, dir := range []string{"barrier", "test_dir"} {
				if err := os.Mkdir(filepath.Join(temp, dir), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			c := exec.CommandContext(ctx, gorovod, "run", "--np", strconv.Itoa(np), "--min-np", strconv.Itoa(np), "--",
				Python, filepath.Join("tests", "torch_distributed_suite.py"), name)
			c.Env, c.WaitDelay = append(env, "TEMP_DIR="+temp), 10*time.Second
			out, _ := c.CombinedOutput() // a failing test fails the job: the RESULT lines say which
			outcomes := map[string]int{}
			for _, r := range torchTestResult.FindAllStringSubmatch(string(out), -1) {
				if r[2] == name {
					outcomes[r[3]]++
				}
			}
			difference, known := torchDistributedDifferences[name]
			known = known && difference.appliesTo(pyVersion)
			why := difference.why
			switch {
			case outcomes["skip"] == np:
				t.Skipf("torch's test skips on this backend here")
			case outcomes["pass"] == np:
				if known {
					t.Fatalf("passes now: remove it from torchDistributedDifferences (%s)", why)
				}
			case known:
				t.Skipf("a known difference: %s", why)
			default:
				t.Fatalf("outcomes %v of %d ranks\n%s", outcomes, np, out)
			}
		})
	}
	if len(seen) == 0 {
		t.Fatalf("no test of torch's distributed_test.py is in group %q", group)
	}
}

func TestTorchDifferenceAppliesTo(t *testing.T) {
	d := torchDifference{fromPython: "3.13"}
	for _, c := range []struct {
		version string
		want    bool
	}{
		{"3.11.2", false},
		{"3.12.7", false},
		{"3.13", true},
		{"3.13.5", true},
		{"3.14.0", true},
		{"4.0", true},
		{"3", false},
	} {
		if got := d.appliesTo(c.version); got != c.want {
			t.Errorf("difference from Python 3.13 applies to %s: %v, want %v", c.version, got, c.want)
		}
	}
	if !(torchDifference{}).appliesTo("3.11.2") {
		t.Error("a difference with no version applies to none")
	}
}
