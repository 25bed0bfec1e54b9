package launch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/job/rendezvous"
)

const envChild = "LAUNCH_TEST_CHILD"

// TestMain turns this test binary into a worker when the launcher starts it.
func TestMain(m *testing.M) {
	if mode := os.Getenv(envChild); mode != "" {
		os.Exit(child(mode))
	}
	os.Exit(m.Run())
}

func child(mode string) int {
	switch mode {
	case "hello":
		w, err := envconfig.Load(os.Getenv)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		addrs, err := rendezvous.Join(ctx, w.Rendezvous, w.Rank, fmt.Sprintf("addr-%d", w.Rank))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 4
		}
		fmt.Printf("rank %d of %d sees %s GOMAXPROCS=%s OMP_NUM_THREADS=%s\n", w.Rank, w.Size, strings.Join(addrs, ","), os.Getenv("GOMAXPROCS"), os.Getenv("OMP_NUM_THREADS"))
		fmt.Fprintf(os.Stderr, "no newline at the end")
		return 0
	case "fail-odd":
		w, err := envconfig.Load(os.Getenv)
		if err != nil {
			return 3
		}
		if w.Rank%2 == 1 {
			fmt.Fprintln(os.Stderr, "odd rank failing")
			return 7
		}
		return 0
	case "affinity":
		cpus, err := allowedCPUs()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
		fmt.Println(cpus)
		return 0
	case "env":
		_, inherited := os.LookupEnv("LAUNCH_TEST_INHERITED")
		fmt.Printf("given=%s inherited=%v\n", os.Getenv("LAUNCH_TEST_GIVEN"), inherited)
		return 0
	case "tick":
		// A worker that goes on printing: its output shows it alive.
		fmt.Println("ready")
		for i := 0; ; i++ {
			time.Sleep(20 * time.Millisecond)
			if _, err := fmt.Printf("tick %d\n", i); err != nil {
				return 7
			}
		}
	case "hang":
		fmt.Println("ready")
		// Stand in for a long computation until the launcher stops us.
		time.Sleep(time.Hour)
	case "whoami":
		host, _ := os.Hostname()
		dir, _ := os.Getwd()
		fmt.Printf("host %s gomaxprocs %s dir %s pid %d\n", host, os.Getenv("GOMAXPROCS"), dir, os.Getpid())
		return 0
	case "signals":
		// Reports the signals it gets; leaves on SIGTERM.
		sigs := make(chan os.Signal, 4)
		signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGINT, syscall.SIGTERM)
		fmt.Println("ready")
		for s := range sigs {
			fmt.Println("got", s)
			if s == syscall.SIGTERM {
				return 0
			}
		}
	case "pause":
		// Pauses itself (SIGSTOP) once ready; exits 0 on SIGINT, which it
		// can act on only once it runs again.
		stop := make(chan os.Signal, 1)
		signal.Notify(stop, syscall.SIGINT)
		fmt.Println("ready")
		if err := syscall.Kill(os.Getpid(), syscall.SIGSTOP); err != nil {
			return 6
		}
		<-stop
		fmt.Println("stopped by SIGINT")
		return 0
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
		fmt.Println("ready")
		time.Sleep(time.Hour)
	case "launcher":
		return remoteLauncherChild()
	case "lines":
		for i := range 1000 {
			fmt.Printf("line %d\n", i)
		}
		fmt.Fprintf(os.Stderr, "no newline at the end")
		return 0
	}
	return 5
}

type lines struct {
	mu sync.Mutex
	by map[string][]string
}

func (l *lines) out(rank int, stream string, line []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := fmt.Sprintf("%d/%s", rank, stream)
	l.by[k] = append(l.by[k], string(line))
}

func start(t *testing.T, ctx context.Context, np int, mode string, l *lines) *Job {
	t.Helper()
	rdv, err := rendezvous.Listen("127.0.0.1:0", np)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdv.Close() })
	secret := NewSecret()
	env := func(i int) []string {
		w := envconfig.Worker{JobID: "launch-test", Rank: i, Size: np, Secret: secret, Rendezvous: rdv.Addr()}
		return append(w.Environ(), envChild+"="+mode)
	}
	j, err := Start(ctx, Spec{Argv: []string{os.Args[0]}, NP: np, Env: env, Output: l.out, CPUs: 8, StopGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func TestWorkersFindEachOtherAndOutputIsRouted(t *testing.T) {
	l := &lines{by: map[string][]string{}}
	j := start(t, context.Background(), 3, "hello", l)
	if err := j.Wait(); err != nil {
		t.Fatal(err)
	}
	for r := range 3 {
		out := l.by[fmt.Sprintf("%d/stdout", r)]
		want := fmt.Sprintf("rank %d of 3 sees addr-0,addr-1,addr-2 GOMAXPROCS=2 OMP_NUM_THREADS=2", r)
		if len(out) != 1 || out[0] != want {
			t.Errorf("rank %d stdout %q, want %q", r, out, want)
		}
		if errOut := l.by[fmt.Sprintf("%d/stderr", r)]; len(errOut) != 1 || errOut[0] != "no newline at the end" {
			t.Errorf("rank %d stderr %q", r, errOut)
		}
	}
}

func TestFailedWorkersAreNamed(t *testing.T) {
	l := &lines{by: map[string][]string{}}
	err := start(t, context.Background(), 4, "fail-odd", l).Wait()
	var failed []int
	for _, e := range unwrapAll(err) {
		var ee *WorkerError
		if errors.As(e, &ee) {
			failed = append(failed, ee.Worker)
		}
	}
	if fmt.Sprint(failed) != "[1 3]" {
		t.Fatalf("failed ranks %v, err %v", failed, err)
	}
}

func unwrapAll(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

func TestCancelStopsWorkers(t *testing.T) {
	l := &lines{by: map[string][]string{}}
	ctx, cancel := context.WithCancel(context.Background())
	j := start(t, ctx, 2, "hang", l)
	deadline := time.Now().Add(20 * time.Second)
	for {
		l.mu.Lock()
		ready := len(l.by["0/stdout"]) > 0 && len(l.by["1/stdout"]) > 0
		l.mu.Unlock()
		if ready {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("workers never became ready")
		}
		select {
		case <-j.Done():
			t.Fatal("workers exited early")
		case <-time.After(10 * time.Millisecond):
		}
	}
	cancel()
	select {
	case <-j.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("cancel did not stop the workers")
	}
	if err := j.Wait(); err == nil {
		t.Fatal("stopped workers reported success")
	}
}

func TestAddWorkerWhileRunning(t *testing.T) {
	l := &lines{by: map[string][]string{}}
	j, err := Start(context.Background(), Spec{Argv: []string{os.Args[0]}, NP: 1, Output: l.out,
		Env: func(i int) []string { return []string{envChild + "=hang"} }, StopGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	i, err := j.Add()
	if err != nil || i != 1 {
		t.Fatalf("Add = %d, %v", i, err)
	}
	if len(j.PIDs()) != 2 {
		t.Fatalf("%d workers", len(j.PIDs()))
	}
	j.Signal(syscall.SIGKILL)
	<-j.Done()
	if _, err := j.Add(); err == nil {
		t.Fatal("Add after the job ended succeeded")
	}
}

func TestBadSpecs(t *testing.T) {
	if _, err := Start(context.Background(), Spec{NP: 1}); err == nil {
		t.Error("no command accepted")
	}
	if _, err := Start(context.Background(), Spec{Argv: []string{"true"}, NP: 0}); err == nil {
		t.Error("zero workers accepted")
	}
	if _, err := Start(context.Background(), Spec{Argv: []string{"/nonexistent/binary"}, NP: 1}); err == nil {
		t.Error("missing binary accepted")
	}
}

func TestBalancedCPUs(t *testing.T) {
	for _, tc := range []struct {
		np   int
		cpus []int
		want string // worker 0 … np, the last one added after the start
	}{
		{1, []int{0, 1}, "[[0 1] [0 1]]"},
		{2, []int{0, 1}, "[[0] [1] [0]]"},
		{4, []int{0, 1}, "[[0] [1] [0] [1] [0]]"},
		{3, []int{0, 1}, "[[0] [1] [0] [0]]"},
		{5, []int{2, 3, 5}, "[[2] [3] [5] [2] [3] [2]]"},
		{2, []int{2, 3, 5, 7, 8}, "[[2 3] [5 7 8] [2 3]]"},
		{3, []int{4}, "[[4] [4] [4] [4]]"},
	} {
		var got [][]int
		for i := range tc.np + 1 {
			got = append(got, balancedCPUs(i, tc.np, tc.cpus))
		}
		if fmt.Sprint(got) != tc.want {
			t.Errorf("np %d on %v: %v, want %s", tc.np, tc.cpus, got, tc.want)
		}
	}
}

// TestBalancedPlacement: each worker process runs pinned to its share.
func TestBalancedPlacement(t *testing.T) {
	allowed, err := allowedCPUs()
	if err != nil {
		t.Fatal(err)
	}
	for _, np := range []int{1, 2, 4} {
		l := &lines{by: map[string][]string{}}
		j, err := Start(context.Background(), Spec{Argv: []string{os.Args[0]}, NP: np, Output: l.out, Placement: PlaceBalanced,
			Env: func(int) []string { return []string{envChild + "=affinity"} }})
		if err != nil {
			t.Fatal(err)
		}
		if err := j.Wait(); err != nil {
			t.Fatal(err)
		}
		for i := range np {
			want := fmt.Sprint(balancedCPUs(i, np, allowed))
			if got := l.by[fmt.Sprintf("%d/stdout", i)]; len(got) != 1 || got[0] != want {
				t.Errorf("np %d worker %d runs on %q, want %s", np, i, got, want)
			}
		}
	}
	// Without a placement the workers may use every CPU the launcher may.
	l := &lines{by: map[string][]string{}}
	j, err := Start(context.Background(), Spec{Argv: []string{os.Args[0]}, NP: 2, Output: l.out,
		Env: func(int) []string { return []string{envChild + "=affinity"} }})
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Wait(); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if got := l.by[fmt.Sprintf("%d/stdout", i)]; len(got) != 1 || got[0] != fmt.Sprint(allowed) {
			t.Errorf("unplaced worker %d runs on %q, want %v", i, got, allowed)
		}
	}
	if _, err := Start(context.Background(), Spec{Argv: []string{"true"}, NP: 1, Placement: "everywhere"}); err == nil {
		t.Error("unknown placement accepted")
	}
}

// TestEnviron: a Spec.Environ replaces this process's environment as the
// workers' base.
func TestEnviron(t *testing.T) {
	t.Setenv("LAUNCH_TEST_INHERITED", "1")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var lines []string
	job, err := Start(context.Background(), Spec{
		Argv: []string{exe}, NP: 1,
		Environ: []string{envChild + "=env", "LAUNCH_TEST_GIVEN=yes"},
		Output: func(_ int, _ string, line []byte) {
			mu.Lock()
			defer mu.Unlock()
			lines = append(lines, string(line))
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := job.Wait(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(lines, "|"); got != "given=yes inherited=false" {
		t.Fatalf("worker printed %q", got)
	}
}

// TestShareCPUs: each of n workers gets GOMAXPROCS and OMP_NUM_THREADS of
// max(1, cpus/n), except where the launcher's own environment sets them.
func TestShareCPUs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		environ []string
		cpus, n int
		want    []string
	}{
		{"both set here", nil, 8, 3, []string{"GOMAXPROCS=2", "OMP_NUM_THREADS=2"}},
		{"more workers than cpus", nil, 2, 4, []string{"GOMAXPROCS=1", "OMP_NUM_THREADS=1"}},
		{"no workers counted as one", nil, 4, 0, []string{"GOMAXPROCS=4", "OMP_NUM_THREADS=4"}},
		{"user's GOMAXPROCS kept", []string{"HOME=/", "GOMAXPROCS=3"}, 8, 2, []string{"OMP_NUM_THREADS=4"}},
		{"user's OMP_NUM_THREADS kept", []string{"OMP_NUM_THREADS=6"}, 8, 2, []string{"GOMAXPROCS=4"}},
		{"both kept", []string{"OMP_NUM_THREADS=6", "GOMAXPROCS=1"}, 8, 2, nil},
		{"a prefix is not the variable", []string{"GOMAXPROCSX=1", "MY_OMP_NUM_THREADS=2"}, 2, 2, []string{"GOMAXPROCS=1", "OMP_NUM_THREADS=1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := shareCPUsIn(tc.environ, tc.cpus, tc.n); !slices.Equal(got, tc.want) {
				t.Errorf("shareCPUsIn(%q, %d, %d) = %q, want %q", tc.environ, tc.cpus, tc.n, got, tc.want)
			}
		})
	}
}
