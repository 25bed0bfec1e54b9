package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/benchmark"
	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/internal/testing/testhosts"
	"github.com/gorovod/gorovod/job/launch"
	"github.com/gorovod/gorovod/job/rendezvous"
)

// workerSpec mirrors the JSON `gorovod bench` hands its workers (cmd/gorovod/cli/bench.go).
type workerSpec struct {
	Op          string        `json:"op"`
	DType       string        `json:"dtype"`
	Reduce      string        `json:"redop"`
	Sizes       []int         `json:"sizes"`
	Warmup      int           `json:"warmup"`
	Iters       int           `json:"iters"`
	IOTimeout   time.Duration `json:"io_timeout"`
	ChunkBytes  int           `json:"chunk_bytes"`
	SmallBytes  int           `json:"small_bytes"`
	Algorithm   string        `json:"algorithm,omitempty"`
	Transport   string        `json:"transport"`
	SocketBuf   int           `json:"socket_buffer"`
	BatchTimeUS int           `json:"batch_time_us"`
}

type result struct {
	Impl  string  `json:"impl"`
	NP    int     `json:"np"`
	Hosts int     `json:"hosts"`
	Rep   int     `json:"rep"`
	Bytes int     `json:"bytes"`
	TimeU float64 `json:"time_us"`
	BusBW float64 `json:"busbw_gbps"`
	Right bool    `json:"correct"`
	Algo  string  `json:"algorithm,omitempty"` // gorovod's, as its worker reports it
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "multihost:", err)
		os.Exit(1)
	}
}

func run() error {
	gorovod := flag.String("gorovod", "", "the gorovod binary (go build -o /tmp/gorovod ./cmd/gorovod)")
	hostCounts := flag.String("hosts", "2,3", "host counts to measure")
	slots := flag.Int("slots", 1, "ranks per host")
	sizesFlag := flag.String("sizes", "4K,256K,4M,64M", "message sizes")
	iters := flag.Int("iters", 20, "timed samples per size")
	warmup := flag.Int("warmup", 5, "untimed runs per size")
	reps := flag.Int("reps", 3, "repetitions of every run (interleaved)")
	transportName := flag.String("transport", "tcp", "gorovod's transport between ranks: tcp, auto, sctp")
	algorithm := flag.String("algorithm", "", "gorovod's allreduce algorithm (gorovod bench --algorithm): auto (the default), ring, hierarchical, recursive-doubling")
	impls := flag.String("impls", "gorovod,mpi-tcp,mpi-tcp-yield", "what to run: gorovod, mpi-tcp (Open MPI's default: its ranks poll while they wait), mpi-tcp-yield (mpi_yield_when_idle=1, what Open MPI picks when oversubscribed)")
	delay := flag.Duration("delay", 0, "extra delay on every packet a host sends (netem-like, ± a half)")
	keepOrder := flag.Bool("keep-order", false, "with --delay, keep each flow's packets in order (netem's default with jitter reorders them)")
	jsonOut := flag.String("json", "", "also write every result as a JSON line to this file")
	flag.Parse()

	var sizes []int
	for s := range strings.SplitSeq(*sizesFlag, ",") {
		n, err := benchmark.ParseSize(s)
		if err != nil {
			return err
		}
		sizes = append(sizes, n)
	}
	var counts []int
	for s := range strings.SplitSeq(*hostCounts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("--hosts: %q", s)
		}
		counts = append(counts, n)
	}
	want := func(impl string) bool { return slices.Contains(strings.Split(*impls, ","), impl) }
	if want("gorovod") && *gorovod == "" {
		return fmt.Errorf("--gorovod PATH is required to run gorovod")
	}

	net, err := testhosts.New(testhosts.Config{Prefix: "gvhbench"})
	if err != nil {
		return err
	}
	defer net.Close()
	ctx := context.Background()
	t0 := time.Now()
	all, err := net.AddHosts(ctx, slices.Max(counts)+1)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "%d hosts up in %v\n", len(all), time.Since(t0).Round(time.Millisecond))
	head, workers := all[0], all[1:]
	if *delay > 0 {
		for _, h := range all {
			if err := h.Impair(testhosts.Impairment{Delay: *delay, Jitter: *delay / 2, KeepOrder: *keepOrder}); err != nil {
				return err
			}
		}
	}

	var mpiBin string
	if want("mpi-tcp") || want("mpi-tcp-yield") {
		mpiBin = filepath.Join(net.Dir(), "mpi_allreduce")
		src, err := findPeerSource()
		if err != nil {
			return err
		}
		if out, err := exec.Command("mpicc", "-O2", "-o", mpiBin, src).CombinedOutput(); err != nil {
			return fmt.Errorf("mpicc: %v: %s", err, out)
		}
	}

	var results []result
	var jsonW io.Writer = io.Discard
	if *jsonOut != "" {
		f, err := os.Create(*jsonOut)
		if err != nil {
			return err
		}
		defer f.Close()
		jsonW = f
	}
	for rep := 1; rep <= *reps; rep++ {
		for _, k := range counts {
			// Interleaved: who goes first rotates with the repetition.
			order := []string{"gorovod", "mpi-tcp", "mpi-tcp-yield"}
			for range rep - 1 {
				order = append(order[1:], order[0])
			}
			for _, impl := range order {
				if !want(impl) {
					continue
				}
				var rs []result
				var err error
				t1 := time.Now()
				switch impl {
				case "gorovod":
					rs, err = runGorovod(ctx, net, head, workers[:k], *slots, *gorovod, workerSpec{
						Op: "allreduce", DType: "float32", Reduce: "sum", Sizes: sizes, Warmup: *warmup, Iters: *iters,
						IOTimeout: time.Minute, ChunkBytes: collective.DefaultConfig().ChunkBytes,
						SmallBytes: collective.DefaultConfig().SmallMessageBytes, Transport: *transportName, BatchTimeUS: 1000,
						Algorithm: *algorithm,
					})
				case "mpi-tcp", "mpi-tcp-yield":
					rs, err = runMPI(ctx, net, head, workers[:k], *slots, mpiBin, *sizesFlag, *warmup, *iters, impl == "mpi-tcp-yield")
				}
				if err != nil {
					return fmt.Errorf("%s on %d hosts, rep %d: %w", impl, k, rep, err)
				}
				for i := range rs {
					rs[i].Impl, rs[i].Hosts, rs[i].Rep = impl, k, rep
					b, _ := json.Marshal(rs[i])
					fmt.Fprintf(jsonW, "%s\n", b)
				}
				fmt.Fprintf(os.Stderr, "rep %d, %d hosts, %s: %d sizes in %v\n", rep, k, impl, len(rs), time.Since(t1).Round(time.Millisecond))
				results = append(results, rs...)
			}
		}
	}
	report(os.Stdout, results, counts, sizes, *slots, *reps, *transportName, *delay, *keepOrder)
	return nil
}

// sshCommand is the ssh client, run on the head, that reaches the hosts.
func sshCommand(net *testhosts.Net, head *testhosts.Host) ([]string, error) {
	prefix, err := head.Exec()
	if err != nil {
		return nil, err
	}
	return append(append(prefix, "ssh"), net.SSHArgs()...), nil
}

// runGorovod starts the benchmark workers on the hosts over ssh; they meet at
// a rendezvous on the head and bind to the address their route to it leaves
// from (their host's).
func runGorovod(ctx context.Context, net *testhosts.Net, head *testhosts.Host, hosts []*testhosts.Host, slots int, bin string, spec workerSpec) ([]result, error) {
	np := len(hosts) * slots
	ln, err := head.Listen("tcp", ":0")
	if err != nil {
		return nil, err
	}
	secret := launch.NewSecret()
	rcfg := rendezvous.DefaultConfig(np)
	rcfg.Secret = secret // the bench workers sign their joins with it
	rdv, err := rendezvous.ServeConfig(ln, rcfg)
	if err != nil {
		return nil, err
	}
	defer rdv.Close()
	ssh, err := sshCommand(net, head)
	if err != nil {
		return nil, err
	}
	specJSON, _ := json.Marshal(spec)
	jobID := launch.NewJobID()
	var mu sync.Mutex
	var rs []result
	var other []string
	job, err := launch.Start(ctx, launch.Spec{
		Argv: []string{bin, "_bench-worker", string(specJSON)}, NP: np, SSH: launch.SSH{Command: ssh},
		Host:      func(i int) string { return hosts[i/slots].Name },
		HostSlots: func(string) int { return slots },
		Env: func(i int) []string {
			return envconfig.Worker{JobID: jobID, Rank: i, Size: np, Secret: secret, Rendezvous: rdv.Addr()}.Environ()
		},
		Output: func(i int, stream string, line []byte) {
			mu.Lock()
			defer mu.Unlock()
			var r benchmark.Result
			if i == 0 && stream == "stdout" && json.Unmarshal(line, &r) == nil && r.Op != "" {
				rs = append(rs, result{NP: np, Bytes: r.Bytes, TimeU: r.TimeUS, BusBW: r.BusBW, Right: r.Correct, Algo: r.Algorithm})
				return
			}
			other = append(other, fmt.Sprintf("[%d] %s", i, line))
		},
	})
	if err != nil {
		return nil, err
	}
	if err := job.Wait(); err != nil {
		return nil, fmt.Errorf("%w\n%s", err, strings.Join(other, "\n"))
	}
	return rs, nil
}

// runMPI runs mpirun on the head with the hosts as its host list; ssh
// starts Open MPI's daemons there; the ranks talk over the TCP BTL on eth0.
func runMPI(ctx context.Context, net *testhosts.Net, head *testhosts.Host, hosts []*testhosts.Host, slots int, bin, sizes string, warmup, iters int, yield bool) ([]result, error) {
	var hostList []string
	for _, h := range hosts {
		hostList = append(hostList, fmt.Sprintf("%s:%d", h.Name, slots))
	}
	np := len(hosts) * slots
	args := []string{"--allow-run-as-root", "--host", strings.Join(hostList, ","), "-np", strconv.Itoa(np),
		"--bind-to", "none", "--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_args", strings.Join(net.SSHArgs(), " "),
		"--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0",
		"--mca", "mpi_yield_when_idle", map[bool]string{false: "0", true: "1"}[yield],
		bin, "--impl", "mpi-tcp", "--sizes", sizes, "--warmup", strconv.Itoa(warmup), "--iters", strconv.Itoa(iters), "--batch-time-us", "1000"}
	cmd := head.Command(ctx, "mpirun", args...)
	cmd.Env = append(os.Environ(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	var rs []result
	var other []string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		var r struct {
			Bytes int     `json:"bytes"`
			TimeU float64 `json:"time_us"`
			BusBW float64 `json:"busbw_gbps"`
			Right bool    `json:"correct"`
		}
		if json.Unmarshal(sc.Bytes(), &r) == nil && r.Bytes > 0 {
			rs = append(rs, result{NP: np, Bytes: r.Bytes, TimeU: r.TimeU, BusBW: r.BusBW, Right: r.Right})
		} else {
			other = append(other, sc.Text())
		}
	}
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("mpirun: %v\n%s\n%s", err, strings.Join(other, "\n"), stderr.String())
	}
	return rs, nil
}

func findPeerSource() (string, error) {
	for dir, _ := os.Getwd(); dir != "/"; dir = filepath.Dir(dir) {
		p := filepath.Join(dir, "bench", "peers", "mpi_allreduce.c")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("bench/peers/mpi_allreduce.c not found above the working directory")
}

// report prints, per host count and size, the median bus bandwidth over the
// repetitions with its range, and gorovod's ratio to Open MPI.
func report(w io.Writer, rs []result, counts, sizes []int, slots, reps int, tr string, delay time.Duration, keepOrder bool) {
	fmt.Fprintf(w, "allreduce float32 sum across namespaced hosts (%d rank(s) per host, gorovod transport %s, %d reps interleaved", slots, tr, reps)
	if delay > 0 {
		fmt.Fprintf(w, ", %v ± %v on every packet", delay, delay/2)
		if keepOrder {
			fmt.Fprint(w, ", each flow in order")
		}
	}
	fmt.Fprintln(w, "): busbw GB/s, median [min–max]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| hosts | size | gorovod | Open MPI TCP | Open MPI TCP, yield | gorovod / best MPI |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|")
	for _, k := range counts {
		for _, s := range sizes {
			g, gok := stats(rs, "gorovod", k, s)
			m, mok := stats(rs, "mpi-tcp", k, s)
			y, yok := stats(rs, "mpi-tcp-yield", k, s)
			best := max(m[1], y[1])
			ratio := "–"
			if gok && (mok || yok) && best > 0 {
				ratio = fmt.Sprintf("%.2f", g[1]/best)
			}
			fmt.Fprintf(w, "| %d | %s | %s | %s | %s | %s |\n", k, human(s), cell(g, gok), cell(m, mok), cell(y, yok), ratio)
		}
	}
	for _, r := range rs {
		if !r.Right {
			fmt.Fprintf(w, "\nWRONG RESULT: %+v\n", r)
		}
	}
}

// stats returns min, median and max busbw of one cell.
func stats(rs []result, impl string, hosts, bytes int) ([3]float64, bool) {
	var v []float64
	for _, r := range rs {
		if r.Impl == impl && r.Hosts == hosts && r.Bytes == bytes {
			v = append(v, r.BusBW)
		}
	}
	if len(v) == 0 {
		return [3]float64{}, false
	}
	sort.Float64s(v)
	med := v[len(v)/2]
	if len(v)%2 == 0 {
		med = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return [3]float64{v[0], med, v[len(v)-1]}, true
}

func cell(s [3]float64, ok bool) string {
	if !ok {
		return "–"
	}
	return fmt.Sprintf("%.3f [%.3f–%.3f]", s[1], s[0], s[2])
}

func human(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dM", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dK", n>>10)
	}
	return strconv.Itoa(n)
}
