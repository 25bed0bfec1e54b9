package spin

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const envHog = "SPIN_TEST_HOG_CPU"

// TestMain turns the test binary into a CPU hog when a test starts it so:
// the spinning goroutine's thread pinned to the CPU the variable names.
func TestMain(m *testing.M) {
	if v := os.Getenv(envHog); v != "" {
		cpu, err := strconv.Atoi(v)
		if err != nil {
			os.Exit(2)
		}
		runtime.LockOSThread()
		var one unix.CPUSet
		one.Set(cpu)
		if err := unix.SchedSetaffinity(0, &one); err != nil {
			os.Exit(3)
		}
		for {
		}
	}
	os.Exit(m.Run())
}

// TestYieldPausesBehindABusyProcess: a poll's sched_yield that hands the CPU
// to a process that keeps it (a whole time slice) makes the budget stop
// yielding to other processes for a while; a NewYieldingBudget's after the
// second such yield.
func TestYieldPausesBehindABusyProcess(t *testing.T) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	cpu := 0
	for !set.IsSet(cpu) {
		cpu++
	}
	var one unix.CPUSet
	one.Set(cpu)
	// This goroutine's thread and the hog share one CPU. The thread stays
	// locked: it ends with the test instead of serving others pinned.
	runtime.LockOSThread()
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Fatal(err)
	}
	hog := exec.Command(os.Args[0], "-test.run=^$")
	hog.Env = append(os.Environ(), envHog+"="+strconv.Itoa(cpu))
	if err := hog.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = hog.Process.Kill()
		_ = hog.Wait()
	})
	// Without yields to other processes, nothing is ever found.
	quiet := NewBudget(time.Hour, 1, false)
	w := quiet.Begin(nil)
	for range 2000 {
		w.Again(never)
	}
	if !quiet.noYieldUntil.IsZero() {
		t.Fatal("a budget that does not yield to processes paused its yields")
	}
	for _, tc := range []struct {
		name  string
		b     Budget
		first time.Duration
	}{
		{"NewBudget", NewBudget(time.Hour, 1, true), yieldPause},
		{"NewYieldingBudget", NewYieldingBudget(time.Hour/YieldingFactor, 1), blipPause},
	} {
		b := tc.b
		w := b.Begin(nil)
		pauseFound := func() time.Duration {
			t.Helper()
			b.noYieldUntil = time.Time{}
			deadline := time.Now().Add(20 * time.Second)
			for b.noYieldUntil.IsZero() {
				if time.Now().After(deadline) {
					t.Fatalf("%s: yields to a busy process on the same CPU never took a time slice", tc.name)
				}
				w.Again(never)
			}
			return time.Until(b.noYieldUntil)
		}
		// The pause doubles while slow yields recur (here: right after it).
		for i, want := range []time.Duration{tc.first, 2 * tc.first, 4 * tc.first} {
			if got := pauseFound(); got < want-tc.first/10 || got > want+time.Second {
				t.Errorf("%s, slow yield %d: yielding paused for %v, want about %v", tc.name, i, got, want)
			}
		}
	}
}
