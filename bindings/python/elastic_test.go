package python

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	stdsync "sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/bindings/internal/buildtest"
)

// liveJob is a `gorovod run` whose output the test watches while it runs.
type liveJob struct {
	cmd  *exec.Cmd
	mu   stdsync.Mutex
	out  strings.Builder
	news chan struct{} // closed and replaced at every line
	done chan error
}

func startJob(t testing.TB, ctx context.Context, env []string, argv ...string) *liveJob {
	t.Helper()
	j := &liveJob{news: make(chan struct{}), done: make(chan error, 1)}
	j.cmd = exec.CommandContext(ctx, argv[0], argv[1:]...)
	j.cmd.Env = env
	j.cmd.WaitDelay = 10 * time.Second
	pipe, err := j.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	j.cmd.Stderr = j.cmd.Stdout
	if err := j.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			j.mu.Lock()
			j.out.WriteString(sc.Text() + "\n")
			close(j.news)
			j.news = make(chan struct{})
			j.mu.Unlock()
		}
		j.done <- j.cmd.Wait()
	}()
	return j
}

func (j *liveJob) output() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.out.String()
}

// waitFor waits until the output matches re and returns the match.
func (j *liveJob) waitFor(t testing.TB, re *regexp.Regexp, limit time.Duration) []string {
	t.Helper()
	deadline := time.After(limit)
	for {
		j.mu.Lock()
		m := re.FindStringSubmatch(j.out.String())
		news := j.news
		j.mu.Unlock()
		if m != nil {
			return m
		}
		select {
		case <-news:
		case <-deadline:
			t.Fatalf("no %q within %v:\n%s", re, limit, j.output())
		}
	}
}

func (j *liveJob) wait(t testing.TB, limit time.Duration) string {
	t.Helper()
	select {
	case err := <-j.done:
		if err != nil && !stoppedWhileExiting(t, j.output()) {
			t.Fatalf("gorovod run: %v\n%s", err, j.output())
		}
	case <-time.After(limit):
		t.Fatalf("the job did not end within %v:\n%s", limit, j.output())
	}
	return j.output()
}

// sampleCoverage reads the elastic test's logs: for each data epoch, how
// many samples of 0..samples-1 were never trained on, and how many were
// trained on more than once.
func sampleCoverage(t *testing.T, dir string, epochs, samples int) (missing, repeated []int) {
	t.Helper()
	counts := make([][]int, epochs)
	for e := range counts {
		counts[e] = make([]int, samples)
	}
	logs, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil || len(logs) == 0 {
		t.Fatalf("no worker logs in %s (%v)", dir, err)
	}
	for _, name := range logs {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 {
				continue // a line cut short by kill -9
			}
			e, err := strconv.Atoi(f[0])
			if err != nil || e < 0 || e >= epochs {
				t.Fatalf("%s: bad line %q", name, line)
			}
			for _, s := range f[1:] {
				i, err := strconv.Atoi(s)
				if err != nil || i < 0 || i >= samples {
					continue // cut short
				}
				counts[e][i]++
			}
		}
	}
	missing, repeated = make([]int, epochs), make([]int, epochs)
	for e := range counts {
		for _, c := range counts[e] {
			if c == 0 {
				missing[e]++
			} else if c > 1 {
				repeated[e] += c - 1
			}
		}
	}
	return missing, repeated
}

var (
	workerPid = regexp.MustCompile(`gorovod run: worker (\d+) pid (\d+)`)
	driverPid = regexp.MustCompile(`driver \S+ \(pid (\d+)\)`)
)

func pidOf(t testing.TB, j *liveJob, worker int) int {
	t.Helper()
	for _, m := range workerPid.FindAllStringSubmatch(j.output(), -1) {
		if m[1] == strconv.Itoa(worker) {
			pid, _ := strconv.Atoi(m[2])
			return pid
		}
	}
	t.Fatalf("no pid for worker %d:\n%s", worker, j.output())
	return 0
}

// TestElastic trains tests/elastic_test.py (elastic.run, TorchState,
// ElasticSampler, DistributedOptimizer) under `gorovod run --min-np 1
// --max-np 4` while workers die (kill -9), freeze (SIGSTOP) and join (the
// driver's SIGUSR1): training goes on in each new world, every sample of
// every data epoch is trained on, and the final world's parameters are
// identical.
func TestElastic(t *testing.T) {
	needTorch(t)
	const samples, epochs = 2400, 2
	for _, tc := range []struct {
		name string
		// change changes the world once the job trains with 3 workers;
		// want is the world size it must then train in.
		change func(t *testing.T, j *liveJob)
		final  int
	}{
		{"kill -9 then add", func(t *testing.T, j *liveJob) {
			if err := syscall.Kill(pidOf(t, j, 2), syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			j.waitFor(t, regexp.MustCompile(`step \d+ epoch \d+ world 2 `), 2*time.Minute)
			driver, _ := strconv.Atoi(j.waitFor(t, driverPid, time.Second)[1])
			if err := syscall.Kill(driver, syscall.SIGUSR1); err != nil {
				t.Fatal(err)
			}
			j.waitFor(t, regexp.MustCompile(`gorovod run: worker 3 pid`), time.Minute)
			j.waitFor(t, regexp.MustCompile(`step \d+ epoch \d+ world 3 rank 2`), 2*time.Minute)
		}, 3},
		{"SIGTERM", func(t *testing.T, j *liveJob) {
			// A graceful leave: the worker trains on until the others
			// have moved to a world without it, then exits with status 0.
			if err := syscall.Kill(pidOf(t, j, 2), syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			j.waitFor(t, regexp.MustCompile(`this worker left the job`), 2*time.Minute)
			j.waitFor(t, regexp.MustCompile(`step \d+ epoch \d+ world 2 `), 2*time.Minute)
		}, 2},
		{"SIGSTOP", func(t *testing.T, j *liveJob) {
			pid := pidOf(t, j, 1)
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			// The survivors go on without the frozen worker; then it is
			// killed (it was started by this test's job).
			j.waitFor(t, regexp.MustCompile(`step \d+ epoch \d+ world 2 `), 2*time.Minute)
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
			defer cancel()
			env := pyEnv(t, "ELASTIC_LOG_DIR="+logs, "GOROVOD_IO_TIMEOUT=30")
			j := startJob(t, ctx, env, buildtest.Gorovod(t), "run", "--np", "3", "--min-np", "1", "--max-np", "4", "--",
				Python, "tests/elastic_test.py", "--samples", strconv.Itoa(samples), "--epochs", strconv.Itoa(epochs))
			j.waitFor(t, regexp.MustCompile(`step 20 epoch 0 world 3 `), 2*time.Minute)
			tc.change(t, j)
			out := j.wait(t, 4*time.Minute)
			wantPasses(t, out, tc.final)
			missing, repeated := sampleCoverage(t, logs, epochs, samples)
			for e := range missing {
				if missing[e] != 0 {
					t.Errorf("epoch %d: %d of %d samples never trained on", e, missing[e], samples)
				}
			}
			t.Logf("samples trained on more than once, per epoch (a rolled-back step, and the padding of an epoch's end): %v", repeated)
			if t.Failed() {
				t.Log(out)
			}
		})
	}
}

// TestElasticProcessSets: tests/elastic_process_sets_test.py adds a process
// set at the start of the function elastic.run wraps and allreduces on it
// every step; a worker killed mid-training changes the world, which removes
// the set (the script checks), and the survivors add the new world's with a
// higher id and train on to the end with identical parameters.
func TestElasticProcessSets(t *testing.T) {
	needTorch(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	j := startJob(t, ctx, pyEnv(t, "GOROVOD_IO_TIMEOUT=30"), buildtest.Gorovod(t), "run", "--np", "3", "--min-np", "1",
		"--max-np", "3", "--", Python, "tests/elastic_process_sets_test.py", "--steps", "300")
	before := j.waitFor(t, regexp.MustCompile(`step 20 world 3 rank \d set (\d+)`), 2*time.Minute)
	if err := syscall.Kill(pidOf(t, j, 2), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	after := j.waitFor(t, regexp.MustCompile(`step \d+ world 2 rank \d set (\d+)`), 2*time.Minute)
	oldID, _ := strconv.Atoi(before[1])
	newID, _ := strconv.Atoi(after[1])
	if newID <= oldID {
		t.Fatalf("the set added after the world change has id %d, the old world's %d: want a higher one", newID, oldID)
	}
	wantPasses(t, j.wait(t, 4*time.Minute), 2)
}

// TestElasticExample runs the Horovod-style elastic Fashion-MNIST trainer
// with a worker killed mid-training: it finishes, with identical parameters
// on the surviving workers.
func TestElasticExample(t *testing.T) {
	needTorch(t)
	if _, err := os.Stat(fashionMNIST); err != nil {
		t.Skipf("Fashion-MNIST is missing (apt-get install dataset-fashion-mnist): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	j := startJob(t, ctx, pyEnv(t), buildtest.Gorovod(t), "run", "--np", "3", "--min-np", "1", "--max-np", "3", "--",
		Python, "../../examples/pytorch/pytorch_mnist_elastic.py", "--epochs", "2", "--train-samples", "6000",
		"--log-interval", "5")
	j.waitFor(t, regexp.MustCompile(`Epoch 1: 3 workers`), 2*time.Minute)
	j.waitFor(t, regexp.MustCompile(`Train Epoch: 1 \[\d+/6000 \(\d+%\)\].*\n(.*\n)*.*Train Epoch: 1 \[\d+/6000 \(\d+%\)\]`), 2*time.Minute)
	if err := syscall.Kill(pidOf(t, j, 2), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	out := j.wait(t, 4*time.Minute)
	if !strings.Contains(out, "Epoch 2: 2 workers") {
		t.Fatalf("epoch 2 did not train with the 2 survivors:\n%s", out)
	}
	if n := strings.Count(out, "Test set: Average loss"); n < 2 {
		t.Fatalf("%d test evaluations printed, want 2:\n%s", n, out)
	}
	// Parameters agree within each world: compare the lines of epoch 2.
	var epoch2 []string
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "Train Epoch: 2 ") {
			epoch2 = append(epoch2, line)
		}
	}
	wantSameParameters(t, strings.Join(epoch2, "\n"), 2, 3)
}

// TestInterrupt: Ctrl-C (SIGINT) reaches a script blocked in a collective
// as KeyboardInterrupt, within a second or so, not when the collective ends;
// the same Ctrl-C to gorovod run ends the job.
func TestInterrupt(t *testing.T) {
	needTorch(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	j := startJob(t, ctx, pyEnv(t), buildtest.Gorovod(t), "run", "--np", "2", "--min-np", "2", "--",
		Python, "tests/interrupt_test.py")
	waiting, _ := strconv.Atoi(j.waitFor(t, regexp.MustCompile(`rank 1 pid (\d+) waiting`), 2*time.Minute)[1])
	blocked, _ := strconv.Atoi(j.waitFor(t, regexp.MustCompile(`rank 0 pid (\d+) blocked`), 2*time.Minute)[1])
	defer syscall.Kill(waiting, syscall.SIGKILL) // a process of this test's job
	time.Sleep(500 * time.Millisecond)           // let rank 0 enter the wait (nothing to observe from outside)
	if err := syscall.Kill(blocked, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	j.waitFor(t, regexp.MustCompile(`INTERRUPTED after`), 10*time.Second)
	// Ctrl-C in a terminal reaches gorovod run as well, which stops the job.
	// (Killing rank 1 instead would have the runner replace it: the job
	// keeps --min-np workers while training is not over.)
	if err := j.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-j.done:
	case <-time.After(time.Minute):
		t.Fatalf("the job did not end after gorovod run was interrupted:\n%s", j.output())
	}
}

// TestWorldChangeBeforeElasticLoop: a script converted from non-elastic
// Horovod broadcasts its parameters and optimizer state before its elastic
// loop (tests/prebroadcast_test.py). One of its 3 ranks is killed with kill
// -9 while they broadcast: both survivors' broadcasts raise
// HorovodInternalError, Horovod's recoverable error, not a MismatchError
// and not a hang.
func TestWorldChangeBeforeElasticLoop(t *testing.T) {
	needTorch(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	j := startJob(t, ctx, pyEnv(t), buildtest.Gorovod(t), "run", "--np", "3", "--min-np", "2", "--",
		Python, "tests/prebroadcast_test.py")
	pids := map[string]int{}
	for _, rank := range []string{"0", "1", "2"} {
		pids[rank], _ = strconv.Atoi(j.waitFor(t, regexp.MustCompile(`rank `+rank+` pid (\d+) broadcasting`), 2*time.Minute)[1])
	}
	if err := syscall.Kill(pids["2"], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for _, rank := range []string{"0", "1"} {
		j.waitFor(t, regexp.MustCompile(`rank `+rank+`: (HorovodInternalError|\w+Error: .*|no error within)`), time.Minute)
	}
	select {
	case <-j.done: // the job fails: its survivors exited with an error of their own
	case <-time.After(time.Minute):
		t.Fatalf("the job did not end after its survivors' errors:\n%s", j.output())
	}
	out := j.output()
	for _, rank := range []string{"0", "1"} {
		if !strings.Contains(out, "rank "+rank+": HorovodInternalError\n") {
			t.Errorf("rank %s did not raise HorovodInternalError", rank)
		}
	}
	if t.Failed() || strings.Contains(out, "MismatchError") {
		t.Fatalf("want HorovodInternalError on ranks 0 and 1, and no MismatchError:\n%s", out)
	}
}

// TestStoppedWorkerEndsQuietly: a Python worker that its job stops (SIGINT:
// here the job cannot go on after the other rank raised) ends with one
// line saying where it was stopped, not a KeyboardInterrupt traceback,
// while the failed rank's traceback stays; gorovod run's last line says
// why it stopped the worker. With -v the traceback is printed too.
func TestStoppedWorkerEndsQuietly(t *testing.T) {
	needTorch(t)
	for _, tc := range []struct {
		name      string
		flags     []string
		traceback bool // the stopped worker prints its traceback
	}{
		{"by default", nil, false},
		{"with -v", []string{"-v"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			argv := append([]string{buildtest.Gorovod(t), "run", "--np", "2"}, tc.flags...)
			c := exec.CommandContext(ctx, argv[0], append(argv[1:], "--", Python, "tests/stopped_test.py")...)
			c.Env = pyEnv(t)
			c.WaitDelay = 20 * time.Second
			b, err := c.CombinedOutput()
			out := string(b)
			if ctx.Err() != nil {
				t.Fatalf("the job did not end: %v\n%s", ctx.Err(), out)
			}
			if c.ProcessState == nil || c.ProcessState.ExitCode() != 1 {
				t.Fatalf("gorovod run: %v, want exit status 1 (the job failed)\n%s", err, out)
			}
			failed := regexp.MustCompile(`(?m)^\[(\d+)\] RuntimeError: rank 1 fails on purpose$`).FindStringSubmatch(out)
			waiting := regexp.MustCompile(`(?m)^\[(\d+)\] rank 0 pid \d+ waiting$`).FindStringSubmatch(out)
			if failed == nil || waiting == nil {
				t.Fatalf("no failing rank 1 and waiting rank 0 in the output:\n%s", out)
			}
			stopped := waiting[1]
			if !strings.Contains(out, "["+failed[1]+"] Traceback (most recent call last):") {
				t.Fatalf("the failed worker [%s] printed no traceback:\n%s", failed[1], out)
			}
			quiet := regexp.MustCompile(`(?m)^\[` + stopped + `\] gorovod: stopped by SIGINT \(KeyboardInterrupt\) at stopped_test\.py:\d+ in <module>; ` +
				"`gorovod run -v` shows the traceback$")
			traceback := strings.Contains(out, "["+stopped+"] Traceback (most recent call last):")
			if traceback != tc.traceback || quiet.MatchString(out) == tc.traceback {
				t.Fatalf("the stopped worker [%s]: traceback %v, one line %v; want traceback %v\n%s", stopped, traceback, quiet.MatchString(out), tc.traceback, out)
			}
			if want := "1 stopped (the job could not go on: below its minimum for good)"; !strings.Contains(out, want) {
				t.Fatalf("gorovod run's last line lacks %q:\n%s", want, out)
			}
		})
	}
}
