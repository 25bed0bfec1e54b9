package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/netip"
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
	"github.com/gorovod/gorovod/collective/transport"
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
	Lanes       int           `json:"lanes,omitempty"`
	Security    string        `json:"security,omitempty"`
	LogLevel    string        `json:"log_level,omitempty"`
	Phases      bool          `json:"phases,omitempty"`
	PieceBytes  int           `json:"hier_piece_bytes,omitempty"`
	Sources     int           `json:"stripe_sources,omitempty"`
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
	// PhasesUS is gorovod's rank 0's mean time per allreduce of each phase
	// of its algorithm (benchmark.Result.PhasesUS).
	PhasesUS map[string]float64 `json:"phases_us,omitempty"`
	// Rate is the worker hosts' link rate in bit/s (0: unshaped).
	Rate int64 `json:"link_bps"`
	// RankCPU is the CPU the worker hosts' processes used during the run,
	// in cores (CPU seconds per second of the run); MachineCPU is the
	// whole machine's busy share over the run (every agent's load), 0-1.
	RankCPU    float64 `json:"rank_cpu_cores"`
	MachineCPU float64 `json:"machine_cpu_busy"`
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
	impls := flag.String("impls", "gorovod,mpi-tcp,mpi-tcp-yield", "what to run: gorovod, mpi-tcp (Open MPI's default: its ranks poll while they wait), mpi-tcp-yield (mpi_yield_when_idle=1, what Open MPI picks when oversubscribed), gloo (PyTorch's Gloo backend, bench/peers/gloo_allreduce.py under "+glooPython+")")
	ratesFlag := flag.String("rates", "0", "link rates of the worker hosts to measure at, bit/s with K, M, G suffixes (1G,10G); 0: unshaped")
	lanesFlag := flag.String("lanes", "0", "gorovod's TCP lanes per link to measure (0: the transport's choice); each is a gorovod column")
	securityFlag := flag.String("security", "default", "gorovod's frame protection to measure: default, plain, authenticated, encrypted (gorovod run --security); each is a gorovod column, with every lane count")
	delay := flag.Duration("delay", 0, "extra delay on every packet a host sends (netem-like, ± a half)")
	keepOrder := flag.Bool("keep-order", false, "with --delay, keep each flow's packets in order (netem's default with jitter reorders them)")
	jsonOut := flag.String("json", "", "also write every result as a JSON line to this file")
	pieceBytes := flag.String("piece-bytes", "0", "gorovod's hierarchical allreduce pieces (collective.Config.HierarchicalPieceBytes; 0: its default, -1: one piece)")
	phases := flag.Bool("phases", false, "have gorovod's workers time the phases of their algorithm and print each rank's mean per allreduce (the hierarchical allreduce's local-reduce-scatter, cross-allreduce, local-allgather)")
	showLanes := flag.Bool("show-lanes", false, "print the lanes each gorovod worker's TCP links chose (--lanes 0; the workers log at debug level)")
	opFlag := flag.String("op", "allreduce", "what gorovod measures: allreduce, or replicate (a joiner's state: the last host's rank receives the buffer from the others, in stripes; gorovod only)")
	sourcesFlag := flag.String("sources", "0", "with --op replicate, how many holders feed the receiver at once (collective.Config.StripeSources; 0: chosen from the link kinds); each is a gorovod column")
	receiverRateFlag := flag.String("receiver-rate", "", "with --op replicate, the receiving host's link rate (default: --rates'), e.g. a joiner on a faster link than the holders")
	flag.Parse()

	var sizes []int
	for s := range strings.SplitSeq(*sizesFlag, ",") {
		n, err := benchmark.ParseSize(s)
		if err != nil {
			return err
		}
		sizes = append(sizes, n)
	}
	counts, err := intList("--hosts", *hostCounts, 1)
	if err != nil {
		return err
	}
	var rates []int64
	for s := range strings.SplitSeq(*ratesFlag, ",") {
		r, err := parseRate(s)
		if err != nil {
			return fmt.Errorf("--rates: %w", err)
		}
		rates = append(rates, r)
	}
	lanes, err := intList("--lanes", *lanesFlag, 0)
	if err != nil {
		return err
	}
	implList, err := parseImpls(*impls)
	if err != nil {
		return fmt.Errorf("--impls: %w", err)
	}
	sources, err := intList("--sources", *sourcesFlag, 0)
	if err != nil {
		return err
	}
	receiverRate := int64(-1) // the others'
	switch *opFlag {
	case "allreduce":
		if *sourcesFlag != "0" || *receiverRateFlag != "" {
			return fmt.Errorf("--sources and --receiver-rate are for --op replicate")
		}
	case "replicate":
		if !slices.Equal(implList, []string{"gorovod"}) {
			return fmt.Errorf("--op replicate measures gorovod only (--impls gorovod)")
		}
		if slices.Min(counts) < 2 {
			return fmt.Errorf("--op replicate needs at least 2 hosts (holders, then the receiver)")
		}
		if *receiverRateFlag != "" {
			if receiverRate, err = parseRate(*receiverRateFlag); err != nil {
				return fmt.Errorf("--receiver-rate: %w", err)
			}
		}
	default:
		return fmt.Errorf("--op %q: want allreduce or replicate", *opFlag)
	}
	want := func(impl string) bool { return slices.Contains(implList, impl) }
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

	pieces := -1
	if *pieceBytes != "-1" {
		if pieces, err = benchmark.ParseSize(*pieceBytes); err != nil {
			return fmt.Errorf("--piece-bytes: %w", err)
		}
	}

	var mpiBin string
	if want("mpi-tcp") || want("mpi-tcp-yield") {
		mpiBin = filepath.Join(net.Dir(), "mpi_allreduce")
		src, err := findPeerFile("mpi_allreduce.c")
		if err != nil {
			return err
		}
		if out, err := exec.Command("mpicc", "-O2", "-o", mpiBin, src).CombinedOutput(); err != nil {
			return fmt.Errorf("mpicc: %v: %s", err, out)
		}
	}

	var glooScript string
	if want("gloo") {
		if glooScript, err = findPeerFile("gloo_allreduce.py"); err != nil {
			return err
		}
	}

	var securities []string
	for s := range strings.SplitSeq(*securityFlag, ",") {
		if _, err := transport.ParseSecurity(s); err != nil {
			return fmt.Errorf("--security: %w", err)
		}
		if s == "" {
			s = "default"
		}
		securities = append(securities, s)
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
	// Every implementation a run compares: gorovod once per lane count and
	// security setting.
	var order []string
	gorovodCols := map[string]gorovodColumn{}
	if want("gorovod") {
		for _, n := range lanes {
			for _, sec := range securities {
				for _, k := range sources {
					c := gorovodColumn{lanes: n, security: sec, sources: k}
					order = append(order, c.name())
					gorovodCols[c.name()] = c
				}
			}
		}
	}
	for _, impl := range []string{"mpi-tcp", "mpi-tcp-yield", "gloo"} {
		if want(impl) {
			order = append(order, impl)
		}
	}
	turn := 0
	for rep := 1; rep <= *reps; rep++ {
		for _, rate := range rates {
			for _, h := range workers {
				if err := h.Shape(testhosts.Link{Rate: rate}); err != nil {
					return err
				}
			}
			for _, k := range counts {
				if receiverRate >= 0 {
					// The receiver is the last host's rank; the host
					// before it, a holder now, may have been the
					// receiver of a smaller count.
					for _, h := range workers[:k] {
						r := rate
						if h == workers[k-1] {
							r = receiverRate
						}
						if err := h.Shape(testhosts.Link{Rate: r}); err != nil {
							return err
						}
					}
				}
				for _, size := range sizes {
					// Interleaved: who goes first rotates from run to run.
					turn++
					for i := range order {
						impl := order[(i+turn)%len(order)]
						var rs []result
						var err error
						t1 := time.Now()
						cpu := startCPUWatch(workers[:k])
						switch {
						case strings.HasPrefix(impl, "gorovod"):
							rs, err = runGorovod(ctx, net, head, workers[:k], *slots, *gorovod, workerSpec{
								Op: *opFlag, DType: "float32", Reduce: "sum", Sizes: []int{size}, Warmup: *warmup, Iters: *iters,
								IOTimeout: time.Minute, ChunkBytes: collective.DefaultConfig().ChunkBytes,
								SmallBytes: collective.DefaultConfig().SmallMessageBytes, Transport: *transportName, BatchTimeUS: 1000,
								Lanes: gorovodCols[impl].lanes, Security: gorovodCols[impl].security, Algorithm: *algorithm,
								LogLevel: map[bool]string{true: "debug"}[*showLanes], Phases: *phases, PieceBytes: pieces,
								Sources: gorovodCols[impl].sources,
							})
						case impl == "gloo":
							rs, err = runGloo(ctx, net, head, workers[:k], *slots, glooScript, size, *warmup, *iters)
						default:
							rs, err = runMPI(ctx, net, head, workers[:k], *slots, mpiBin, strconv.Itoa(size), *warmup, *iters, impl == "mpi-tcp-yield")
						}
						rankCPU, machineCPU := cpu.stop()
						if err != nil {
							return fmt.Errorf("%s on %d hosts at %s, rep %d: %w", impl, k, rateName(rate), rep, err)
						}
						for i := range rs {
							rs[i].Impl, rs[i].Hosts, rs[i].Rep, rs[i].Rate = impl, k, rep, rate
							rs[i].RankCPU, rs[i].MachineCPU = rankCPU, machineCPU
							b, _ := json.Marshal(rs[i])
							fmt.Fprintf(jsonW, "%s\n", b)
						}
						fmt.Fprintf(os.Stderr, "rep %d, %s, %d hosts, %s, %s: %v, ranks %.2f cores, machine %.0f%% busy\n",
							rep, rateName(rate), k, human(size), impl, time.Since(t1).Round(time.Millisecond), rankCPU, 100*machineCPU)
						for _, r := range rs {
							if len(r.PhasesUS) > 0 {
								fmt.Fprintf(os.Stderr, "  %s phases (rank 0, mean ms per allreduce): %s\n", human(r.Bytes), phaseLine(r.PhasesUS))
							}
						}
						results = append(results, rs...)
					}
				}
			}
		}
	}
	what := "allreduce float32 sum"
	if *opFlag == "replicate" {
		what = "replicate float32 (every host's ranks but the last host's hold the buffer; the last rank receives it)"
		if receiverRate >= 0 {
			what += fmt.Sprintf(", the receiver's host at %s", rateName(receiverRate))
		}
	}
	report(os.Stdout, what, results, order, rates, counts, sizes, *slots, *reps, *transportName, *delay, *keepOrder)
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
	specJSON, _ := json.Marshal(spec)
	jobID := launch.NewJobID()
	env := func(i int) []string {
		return envconfig.Worker{JobID: jobID, Rank: i, Size: np, Secret: secret, Rendezvous: rdv.Addr()}.Environ()
	}
	parse := func(line []byte) (result, bool) {
		var r benchmark.Result
		if json.Unmarshal(line, &r) != nil || r.Op == "" {
			return result{}, false
		}
		return result{Bytes: r.Bytes, TimeU: r.TimeUS, BusBW: r.BusBW, Right: r.Correct, Algo: r.Algorithm, PhasesUS: r.PhasesUS}, true
	}
	rs, other, err := runRanks(ctx, net, head, hosts, slots, []string{bin, "_bench-worker", string(specJSON)}, env, parse, false)
	if err != nil {
		return nil, err
	}
	for _, line := range other {
		if strings.Contains(line, "bench phases rank") {
			fmt.Fprintf(os.Stderr, "  %s\n", line)
		}
	}
	if spec.LogLevel == "debug" {
		for _, line := range other {
			if strings.Contains(line, "lanes chosen") {
				fmt.Fprintf(os.Stderr, "%s lanes%d: %s\n", hosts[0].Name, spec.Lanes, line)
			}
		}
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
		"--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", hostInterface, "--mca", "oob_tcp_if_include", hostInterface,
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
		if r, ok := parsePeerResult(sc.Bytes()); ok {
			r.NP = np
			rs = append(rs, r)
		} else {
			other = append(other, sc.Text())
		}
	}
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("mpirun: %v\n%s\n%s", err, strings.Join(other, "\n"), stderr.String())
	}
	return rs, nil
}

// findPeerFile finds bench/peers/NAME above the working directory.
func findPeerFile(name string) (string, error) {
	for dir, _ := os.Getwd(); dir != "/"; dir = filepath.Dir(dir) {
		p := filepath.Join(dir, "bench", "peers", name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("bench/peers/%s not found above the working directory", name)
}

// report prints, per link rate, host count and size, each
// implementation's median bus bandwidth over the repetitions (GB/s), its
// share of the link rate and the CPU its ranks used, and each gorovod
// column's ratio to Open MPI's default and to Gloo (ratioPeers).
func report(w io.Writer, what string, rs []result, impls []string, rates []int64, counts, sizes []int, slots, reps int, tr string, delay time.Duration, keepOrder bool) {
	fmt.Fprintf(w, "%s across namespaced hosts (%d rank(s) per host, gorovod transport %s, %d reps interleaved", what, slots, tr, reps)
	if delay > 0 {
		fmt.Fprintf(w, ", %v ± %v on every packet", delay, delay/2)
		if keepOrder {
			fmt.Fprint(w, ", each flow in order")
		}
	}
	fmt.Fprintln(w, "): busbw GB/s median [min–max], its share of the link rate, the ranks' CPU in cores (median)")
	fmt.Fprintln(w)
	fmt.Fprint(w, "| link | hosts | size |")
	for _, impl := range impls {
		fmt.Fprintf(w, " %s |", impl)
	}
	ratios := ratioColumns(impls)
	for _, rc := range ratios {
		fmt.Fprintf(w, " %s / %s |", rc[0], rc[1])
	}
	fmt.Fprint(w, "\n|---|---:|---:|")
	fmt.Fprint(w, strings.Repeat("---:|", len(impls)+len(ratios)))
	fmt.Fprintln(w)
	for _, rate := range rates {
		for _, k := range counts {
			for _, s := range sizes {
				fmt.Fprintf(w, "| %s | %d | %s |", rateName(rate), k, human(s))
				for _, impl := range impls {
					v, ok := stats(rs, impl, rate, k, s)
					fmt.Fprintf(w, " %s |", cell(v, ok, rate, medianCPU(rs, impl, rate, k, s)))
				}
				for _, rc := range ratios {
					g, gok := stats(rs, rc[0], rate, k, s)
					m, mok := stats(rs, rc[1], rate, k, s)
					if gok && mok && m[1] > 0 {
						fmt.Fprintf(w, " %.2f |", g[1]/m[1])
					} else {
						fmt.Fprint(w, " – |")
					}
				}
				fmt.Fprintln(w)
			}
		}
	}
	for _, r := range rs {
		if !r.Right {
			fmt.Fprintf(w, "\nWRONG RESULT: %+v\n", r)
		}
	}
}

// stats returns min, median and max busbw of one cell.
func stats(rs []result, impl string, rate int64, hosts, bytes int) ([3]float64, bool) {
	var v []float64
	for _, r := range rs {
		if r.Impl == impl && r.Rate == rate && r.Hosts == hosts && r.Bytes == bytes {
			v = append(v, r.BusBW)
		}
	}
	if len(v) == 0 {
		return [3]float64{}, false
	}
	sort.Float64s(v)
	return [3]float64{v[0], median(v), v[len(v)-1]}, true
}

// medianCPU is the median over a cell's runs of the cores its ranks used.
func medianCPU(rs []result, impl string, rate int64, hosts, bytes int) float64 {
	var v []float64
	for _, r := range rs {
		if r.Impl == impl && r.Rate == rate && r.Hosts == hosts && r.Bytes == bytes {
			v = append(v, r.RankCPU)
		}
	}
	if len(v) == 0 {
		return 0
	}
	sort.Float64s(v)
	return median(v)
}

func median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 0 {
		return (sorted[n/2-1] + sorted[n/2]) / 2
	}
	return sorted[n/2]
}

func cell(s [3]float64, ok bool, rate int64, cpu float64) string {
	if !ok {
		return "–"
	}
	share := ""
	if rate > 0 {
		share = fmt.Sprintf(" %.0f%%", 100*s[1]*1e9*8/float64(rate))
	}
	return fmt.Sprintf("%.3f [%.3f–%.3f]%s, %.1f cores", s[1], s[0], s[2], share, cpu)
}

// gorovodColumn is one gorovod setting a run measures.
type gorovodColumn struct {
	lanes    int    // TCP lanes per link; 0: the transport's choice
	security string // gorovod run --security; "default": the transport's choice
	sources  int    // --op replicate: holders per receiver; 0: the collective's choice
}

// name is the column's name: gorovod, then what differs from the defaults.
func (c gorovodColumn) name() string {
	n := "gorovod"
	if c.lanes != 0 {
		n += fmt.Sprintf("-lanes%d", c.lanes)
	}
	if c.security != "default" {
		n += "-" + c.security
	}
	if c.sources != 0 {
		n += fmt.Sprintf("-sources%d", c.sources)
	}
	return n
}

// intList reads a comma-separated list of integers of at least least, for
// flag name.
func intList(name, s string, least int) ([]int, error) {
	var out []int
	for v := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < least {
			return nil, fmt.Errorf("%s: %q", name, v)
		}
		out = append(out, n)
	}
	return out, nil
}

// parseRate reads a link rate in bit/s: a number with an optional K, M or
// G suffix (decimal, as link speeds are quoted).
func parseRate(s string) (int64, error) {
	s = strings.TrimSpace(s)
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "G"):
		mult, s = 1e9, strings.TrimSuffix(s, "G")
	case strings.HasSuffix(s, "M"):
		mult, s = 1e6, strings.TrimSuffix(s, "M")
	case strings.HasSuffix(s, "K"):
		mult, s = 1e3, strings.TrimSuffix(s, "K")
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%q is not a rate", s)
	}
	return int64(v * float64(mult)), nil
}

// rateName prints a link rate as its flag is written.
func rateName(r int64) string {
	switch {
	case r == 0:
		return "unshaped"
	case r%1e9 == 0:
		return fmt.Sprintf("%d Gbit/s", r/1e9)
	case r%1e6 == 0:
		return fmt.Sprintf("%d Mbit/s", r/1e6)
	}
	return fmt.Sprintf("%d bit/s", r)
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

// knownImpls are the implementations --impls may name.
var knownImpls = []string{"gorovod", "mpi-tcp", "mpi-tcp-yield", "gloo"}

// parseImpls reads --impls: a comma list of knownImpls, each once.
func parseImpls(s string) ([]string, error) {
	var out []string
	for name := range strings.SplitSeq(s, ",") {
		name = strings.TrimSpace(name)
		switch {
		case !slices.Contains(knownImpls, name):
			return nil, fmt.Errorf("%q is not one of %s", name, strings.Join(knownImpls, ", "))
		case slices.Contains(out, name):
			return nil, fmt.Errorf("%s named twice", name)
		}
		out = append(out, name)
	}
	return out, nil
}

// ratioPeers are the implementations every gorovod column is compared with,
// in the report's order, where they ran.
var ratioPeers = []string{"mpi-tcp", "gloo"}

// ratioColumns pairs each gorovod column with each peer of ratioPeers that
// impls holds: {gorovod column, peer}, the peer's columns grouped.
func ratioColumns(impls []string) [][2]string {
	var out [][2]string
	for _, peer := range ratioPeers {
		if !slices.Contains(impls, peer) {
			continue
		}
		for _, impl := range impls {
			if strings.HasPrefix(impl, "gorovod") {
				out = append(out, [2]string{impl, peer})
			}
		}
	}
	return out
}

// parsePeerResult reads one JSON line a peer program prints per size
// (bench/peers/mpi_allreduce.c, gloo_allreduce.py: `gorovod bench --json`'s
// fields); ok is false for any other line.
func parsePeerResult(line []byte) (result, bool) {
	var r struct {
		Bytes int     `json:"bytes"`
		TimeU float64 `json:"time_us"`
		BusBW float64 `json:"busbw_gbps"`
		Right bool    `json:"correct"`
	}
	if json.Unmarshal(line, &r) != nil || r.Bytes <= 0 {
		return result{}, false
	}
	return result{Bytes: r.Bytes, TimeU: r.TimeU, BusBW: r.BusBW, Right: r.Right}, true
}

// hostInterface is the test hosts' one network interface (testhosts.Host.Addr's).
const hostInterface = "eth0"

// glooPython is the interpreter that has torch (Debian's python3-torch).
const glooPython = "/usr/bin/python3"

// glooTimeout is the Gloo process group's timeout: a rank whose peer died
// fails its collective after it instead of waiting for ever. A 256 MiB
// allreduce at 1 Gbit/s takes a few seconds.
const glooTimeout = 5 * time.Minute

// glooArgv is the command every Gloo rank runs: one rank of the job
// (--env-rank: who it is comes from glooEnv), one size, the benchmark's
// method (warm-up, samples, batching to 1 ms).
func glooArgv(script string, size, warmup, iters int) []string {
	return []string{glooPython, script, "--env-rank", "--sizes", strconv.Itoa(size),
		"--warmup", strconv.Itoa(warmup), "--iters", strconv.Itoa(iters), "--batch-time-us", "1000",
		"--timeout", strconv.Itoa(int(glooTimeout.Seconds()))}
}

// glooEnv is rank's environment: what torchrun would set (rank 0 serves the
// store at master), and Gloo bound to the host's interface.
func glooEnv(rank, np int, master netip.AddrPort) []string {
	return []string{
		"RANK=" + strconv.Itoa(rank), "WORLD_SIZE=" + strconv.Itoa(np),
		"MASTER_ADDR=" + master.Addr().String(), "MASTER_PORT=" + strconv.Itoa(int(master.Port())),
		"GLOO_SOCKET_IFNAME=" + hostInterface,
	}
}

// runGloo starts the Gloo ranks on the hosts over ssh as runGorovod starts
// gorovod's (slots per host, rank i on host i/slots); they meet at rank 0's
// store on the first host; the launcher's ssh runs on the head. The first
// rank that fails stops the others.
func runGloo(ctx context.Context, net *testhosts.Net, head *testhosts.Host, hosts []*testhosts.Host, slots int, script string, size, warmup, iters int) ([]result, error) {
	np := len(hosts) * slots
	// A port free on the first host for rank 0's store (the hosts' namespaces
	// hold nothing else that binds ports).
	ln, err := hosts[0].Listen("tcp", ":0")
	if err != nil {
		return nil, err
	}
	master, err := netip.ParseAddrPort(ln.Addr().String())
	ln.Close()
	if err != nil {
		return nil, err
	}
	rs, _, err := runRanks(ctx, net, head, hosts, slots, glooArgv(script, size, warmup, iters),
		func(i int) []string { return glooEnv(i, np, master) }, parsePeerResult, true)
	return rs, err
}

// runRanks starts argv as slots ranks per host over ssh from the head (rank i
// on host i/slots, with env(i)) and waits for them. rs are the results parse
// reads from rank 0's stdout; other is every other line, each behind its
// rank, and follows the error of a rank that failed. With stopOnFailure the
// first rank that fails stops the others (ranks that would otherwise wait
// for it until their own timeout).
func runRanks(ctx context.Context, net *testhosts.Net, head *testhosts.Host, hosts []*testhosts.Host, slots int, argv []string,
	env func(int) []string, parse func([]byte) (result, bool), stopOnFailure bool) (rs []result, other []string, err error) {
	np := len(hosts) * slots
	ssh, err := sshCommand(net, head)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	job, err := launch.Start(ctx, launch.Spec{
		Argv: argv, NP: np, SSH: launch.SSH{Command: ssh},
		Host:      func(i int) string { return hosts[i/slots].Name },
		HostSlots: func(string) int { return slots },
		Env:       env,
		Output: func(i int, stream string, line []byte) {
			mu.Lock()
			defer mu.Unlock()
			if r, ok := parse(line); ok && i == 0 && stream == "stdout" {
				r.NP = np
				rs = append(rs, r)
				return
			}
			other = append(other, fmt.Sprintf("[%d] %s", i, line))
		},
	})
	if err != nil {
		return nil, nil, err
	}
	if stopOnFailure {
		for i := range np {
			go func() {
				<-job.Exited(i)
				if job.Errors()[i] != nil {
					cancel()
				}
			}()
		}
	}
	if err := job.Wait(); err != nil {
		return nil, other, fmt.Errorf("%w\n%s", err, strings.Join(other, "\n"))
	}
	return rs, other, nil
}

// phaseLine prints a worker's phase times (µs) in milliseconds, by name.
func phaseLine(us map[string]float64) string {
	names := slices.Sorted(maps.Keys(us))
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, " %s %.1f", n, us[n]/1e3)
	}
	return strings.TrimSpace(b.String())
}
