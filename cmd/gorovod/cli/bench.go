package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"runtime/trace"
	"strings"
	"sync"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/benchmark"
	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/multi"
	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/internal/logging"
	"github.com/gorovod/gorovod/job/launch"
	"github.com/gorovod/gorovod/job/rendezvous"
)

// benchWorkerCommand is the hidden subcommand each benchmark worker runs.
const benchWorkerCommand = "_bench-worker"

// workerSpec is what the launcher hands every benchmark worker.
type workerSpec struct {
	Op         string        `json:"op"`
	DType      string        `json:"dtype"`
	Reduce     string        `json:"redop"`
	Sizes      []int         `json:"sizes"`
	Warmup     int           `json:"warmup"`
	Iters      int           `json:"iters"`
	IOTimeout  time.Duration `json:"io_timeout"`
	ChunkBytes int           `json:"chunk_bytes"`
	SmallBytes int           `json:"small_bytes"`
	// Algorithm forces the allreduce or allgather algorithm ("" auto).
	Algorithm string `json:"algorithm,omitempty"`
	// Hosts > 1 declares the workers as that many hosts (consecutive ranks
	// on one host, as even as np allows): the collectives see that topology
	// and the auto transport puts only the ranks of one declared host on
	// shared memory, the others on TCP.
	Hosts       int           `json:"hosts,omitempty"`
	Transport   string        `json:"transport"`
	SocketBuf   int           `json:"socket_buffer"`
	SpinTime    time.Duration `json:"spin_time,omitempty"`
	Security    string        `json:"security,omitempty"`
	Lanes       int           `json:"lanes,omitempty"`
	BatchTimeUS int           `json:"batch_time_us"`
	// The workers log (to their stderr, which the launcher relays) with
	// the command's --log-level and --log-format.
	LogLevel  string `json:"log_level,omitempty"`
	LogFormat string `json:"log_format,omitempty"`
	// ProfileDir, when set, is where every worker writes a CPU profile
	// (cpu-rank<r>.pprof) and an execution trace (trace-rank<r>.out) of its
	// measurement: where the time of a collective goes, per rank.
	ProfileDir string `json:"profile_dir,omitempty"`
	// Phases, when set, has every worker time the phases of its
	// collectives (benchmark.PhaseTimes): rank 0 reports them in its
	// results, the others on stderr.
	Phases bool `json:"phases,omitempty"`
	// HierPieceBytes is collective.Config.HierarchicalPieceBytes (0: the
	// default).
	HierPieceBytes int `json:"hier_piece_bytes,omitempty"`
	// StripeSources is collective.Config.StripeSources (0: chosen from the
	// link kinds).
	StripeSources int `json:"stripe_sources,omitempty"`
}

func benchCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	op := "allreduce"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		op, args = args[0], args[1:]
	}
	fs := flag.NewFlagSet("gorovod bench", flag.ContinueOnError)
	np := fs.Int("np", 2, "number of local worker processes")
	minBytes := fs.String("min-bytes", "4K", "smallest message size (K, M, G suffixes)")
	maxBytes := fs.String("max-bytes", "64M", "largest message size")
	factor := fs.Int("factor", 2, "multiply the size by this much between measurements")
	dtype := fs.String("dtype", "float32", "element type: float32, float64, float16, bfloat16, int32, int64, uint8")
	redop := fs.String("op", "sum", "reduce op for allreduce / reducescatter: sum, average, min, max, product (not adasum)")
	iters := fs.Int("iters", 20, "timed samples per size (the median is reported)")
	warmup := fs.Int("warmup", 5, "untimed runs per size")
	asJSON := fs.Bool("json", false, "print one JSON object per size instead of a table")
	transportName := fs.String("transport", "auto", "transport between the workers: auto (shared memory on one host, TCP between hosts), tcp, shm, sctp")
	ioTimeout := fs.Duration("io-timeout", 30*time.Second, "fail when a peer is silent this long")
	timeout := fs.Duration("timeout", 30*time.Minute, "give up on the whole run after this long")
	def := collective.DefaultConfig()
	chunk := fs.String("chunk-bytes", fmt.Sprint(def.ChunkBytes), fmt.Sprintf("ring pipelining chunk (0: %d, or what the transport suggests on one host: 1M over TCP when the workers outnumber the CPUs)", collective.DefaultChunkBytes))
	pieceBytes := fs.String("piece-bytes", fmt.Sprint(def.HierarchicalPieceBytes), "the hierarchical allreduce of at least twice this runs as pieces of about this size whose phases overlap (-1: one piece)")
	batchTime := fs.Duration("batch-time", time.Millisecond, "run small messages back to back for at least this long per sample (0: one collective per sample)")
	sockBuf := fs.String("socket-buffer", "0", "TCP SO_SNDBUF/SO_RCVBUF (0: the transport's default, 4M between ranks of one host when each has a CPU and the kernel grants it; auto: the kernel's autotuning)")
	small := fs.String("small-bytes", fmt.Sprint(def.SmallMessageBytes), "largest message that uses the latency-optimal algorithm")
	algorithm := fs.String("algorithm", string(collective.AlgorithmAuto), fmt.Sprintf("allreduce or allgather algorithm: %v (allgather: auto, ring, hierarchical)", collective.Algorithms()))
	stripeSources := fs.Int("stripe-sources", 0, "replicate: how many holders feed the receiver at once (0: chosen from the link kinds)")
	hosts := fs.Int("hosts", 1, "declare the np workers as this many hosts (consecutive ranks share one): the topology the collectives see, and shared memory only inside each host with --transport auto")
	spinTime := fs.Duration("spin-time", 0, "how long a waiting call polls before it parks (0: the transport's default, 100µs; negative: never poll)")
	placement := fs.String("placement", string(launch.PlaceBalanced), "pin workers to CPUs: balanced (each worker to its share of the CPUs) or none")
	security := securityFlags(fs)
	lanes := lanesFlag(fs)
	profileDir := fs.String("profile", "", "write each worker's CPU profile and execution trace into this directory (cpu-rank<r>.pprof, trace-rank<r>.out)")
	logOpts := logging.DefaultOptions()
	logOpts.Register(fs)
	usage := fmt.Sprintf("Usage: gorovod bench [%s] [flags]\n\n"+
		"Measures a collective across --np local worker processes and prints, per\n"+
		"message size, the median time, algorithm bandwidth and bus bandwidth.\n"+
		"The workers talk through --transport: auto (the default) puts processes\n"+
		"of one host on shared memory and others on TCP.", strings.Join(benchmark.Ops(), "|"))
	if err := parseFlags(fs, args, usage, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErr(stderr, "unexpected arguments %q", fs.Args())
	}
	if err := logOpts.Validate(); err != nil {
		return usageErr(stderr, "%v", err)
	}
	spec, err := buildWorkerSpec(op, *minBytes, *maxBytes, *factor, *dtype, *redop, *iters, *warmup, *chunk, *small, *algorithm, *hosts)
	if err != nil {
		return usageErr(stderr, "%v", err)
	}
	mode, err := multi.ParseMode(*transportName)
	if err != nil {
		return usageErr(stderr, "transport %q is not available (%v are)", *transportName, multi.Modes())
	}
	if *np < 1 {
		return usageErr(stderr, "--np %d must be at least 1", *np)
	}
	if *hosts < 1 || *hosts > *np {
		return usageErr(stderr, "--hosts %d must be between 1 and --np (%d)", *hosts, *np)
	}
	place, err := launch.ParsePlacement(*placement)
	if err != nil {
		return usageErr(stderr, "--placement: %v", err)
	}
	spec.Transport, spec.IOTimeout = string(mode), *ioTimeout
	if *pieceBytes == "-1" {
		spec.HierPieceBytes = -1
	} else if spec.HierPieceBytes, err = benchmark.ParseSize(*pieceBytes); err != nil || spec.HierPieceBytes == 0 {
		return usageErr(stderr, "--piece-bytes %q: want a size or -1", *pieceBytes)
	}
	spec.LogLevel, spec.LogFormat = logOpts.Level, logOpts.Format
	if *batchTime < 0 {
		return usageErr(stderr, "--batch-time %v is negative", *batchTime)
	}
	spec.BatchTimeUS = int(batchTime.Microseconds())
	spec.SpinTime = *spinTime
	sec, err := security.value()
	if err != nil {
		return usageErr(stderr, "%v", err)
	}
	spec.Security = sec.String()
	if err := checkLanes(*lanes); err != nil {
		return usageErr(stderr, "%v", err)
	}
	spec.Lanes = *lanes
	if *stripeSources < 0 {
		return usageErr(stderr, "--stripe-sources %d is negative", *stripeSources)
	}
	spec.StripeSources = *stripeSources
	if *sockBuf == "auto" {
		spec.SocketBuf = -1 // tcp.Config: negative is the kernel's autotuning
	} else if spec.SocketBuf, err = benchmark.ParseSize(*sockBuf); err != nil {
		return usageErr(stderr, "--socket-buffer: %v", err)
	}
	if *profileDir != "" {
		if err := os.MkdirAll(*profileDir, 0o755); err != nil {
			return usageErr(stderr, "--profile: %v", err)
		}
		if spec.ProfileDir, err = filepath.Abs(*profileDir); err != nil {
			return usageErr(stderr, "--profile: %v", err)
		}
	}
	if err := runBench(ctx, *np, place, spec, *asJSON, *timeout, stdout, stderr); err != nil {
		return &commandError{command: "bench", err: err}
	}
	return nil
}

func usageErr(stderr io.Writer, format string, args ...any) error {
	fmt.Fprintf(stderr, "gorovod bench: "+format+"\n", args...)
	return ErrUsage
}

func buildWorkerSpec(op, minB, maxB string, factor int, dtype, redop string, iters, warmup int, chunk, small, algorithm string, hosts int) (workerSpec, error) {
	lo, err := benchmark.ParseSize(minB)
	if err != nil {
		return workerSpec{}, fmt.Errorf("--min-bytes: %w", err)
	}
	hi, err := benchmark.ParseSize(maxB)
	if err != nil {
		return workerSpec{}, fmt.Errorf("--max-bytes: %w", err)
	}
	if hi < lo {
		return workerSpec{}, fmt.Errorf("--max-bytes %d is below --min-bytes %d", hi, lo)
	}
	if factor < 2 {
		return workerSpec{}, fmt.Errorf("--factor %d must be at least 2", factor)
	}
	chunkBytes, err := benchmark.ParseSize(chunk)
	if err != nil {
		return workerSpec{}, fmt.Errorf("--chunk-bytes: %w", err)
	}
	smallBytes, err := benchmark.ParseSize(small)
	if err != nil {
		return workerSpec{}, fmt.Errorf("--small-bytes: %w", err)
	}
	spec := workerSpec{Op: op, DType: dtype, Reduce: redop, Sizes: benchmark.Sizes(lo, hi, factor),
		Warmup: warmup, Iters: iters, ChunkBytes: chunkBytes, SmallBytes: smallBytes, BatchTimeUS: 1000, Hosts: hosts}
	alg, err := collective.ParseAlgorithm(algorithm)
	if err != nil {
		return workerSpec{}, fmt.Errorf("--algorithm: %w", err)
	}
	if alg != collective.AlgorithmAuto {
		spec.Algorithm = string(alg)
	}
	if _, err := spec.benchmarkSpec(); err != nil {
		return workerSpec{}, err
	}
	if _, err := spec.collectiveConfig(); err != nil {
		return workerSpec{}, err
	}
	return spec, nil
}

func (s workerSpec) benchmarkSpec() (benchmark.Spec, error) {
	dt, err := collective.ParseDType(s.DType)
	if err != nil {
		return benchmark.Spec{}, err
	}
	op, err := collective.ParseReduceOp(s.Reduce)
	if err != nil {
		return benchmark.Spec{}, err
	}
	b := benchmark.Spec{Op: s.Op, DType: dt, Reduce: op, Sizes: s.Sizes, Warmup: s.Warmup, Iters: s.Iters,
		BatchTime: time.Duration(s.BatchTimeUS) * time.Microsecond}
	return b, b.Validate()
}

func (s workerSpec) collectiveConfig() (collective.Config, error) {
	cfg := collective.DefaultConfig()
	cfg.ChunkBytes, cfg.SmallMessageBytes = s.ChunkBytes, s.SmallBytes
	if s.HierPieceBytes != 0 {
		cfg.HierarchicalPieceBytes = s.HierPieceBytes
	}
	cfg.StripeSources = s.StripeSources
	if s.SmallBytes == 0 {
		cfg.SmallMessageBytes = -1 // --small-bytes 0: no message is small
	}
	if s.Op == "allgather" {
		cfg.AllgatherAlgorithm = collective.Algorithm(s.Algorithm)
	} else {
		cfg.Algorithm = collective.Algorithm(s.Algorithm)
	}
	return cfg, cfg.Validate()
}

// runBench launches np workers and prints rank 0's results as they arrive.
func runBench(ctx context.Context, np int, place launch.Placement, spec workerSpec, asJSON bool, timeout time.Duration, stdout, stderr io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	specJSON, _ := json.Marshal(spec)
	var mu sync.Mutex
	var results []benchmark.Result
	var badLines []string
	if !asJSON {
		fmt.Fprintf(stdout, "# gorovod bench %s: %d processes on %d declared host(s), %s transport, %s, %d warm-up + %d timed samples (median)\n",
			spec.Op, np, max(1, spec.Hosts), spec.Transport, spec.DType, spec.Warmup, spec.Iters)
		fmt.Fprintf(stdout, "%12s %12s %9s %8s %12s %12s %12s %8s  %s\n", "size(B)", "count", "type", "redop", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "correct", "algorithm")
	}
	output := func(rank int, stream string, line []byte) {
		mu.Lock()
		defer mu.Unlock()
		if rank == 0 && stream == "stdout" {
			var r benchmark.Result
			if err := json.Unmarshal(line, &r); err == nil && r.Op != "" {
				results = append(results, r)
				printResult(stdout, r, asJSON)
				return
			}
			badLines = append(badLines, string(line))
		}
		if stream == "stderr" || rank != 0 {
			fmt.Fprintf(stderr, "[%d] %s\n", rank, line)
		}
	}
	env, stop, err := launch.FixedWorld(launch.NewJobID(), np)
	if err != nil {
		return err
	}
	defer stop()
	job, err := launch.Start(ctx, launch.Spec{Argv: []string{self, benchWorkerCommand, string(specJSON)}, NP: np, Env: env, Output: output, Placement: place})
	if err != nil {
		return err
	}
	if err := job.Wait(); err != nil {
		return fmt.Errorf("benchmark failed: %w", err)
	}
	if len(results) != len(spec.Sizes) {
		return fmt.Errorf("benchmark reported %d of %d sizes (unparsed output: %q)", len(results), len(spec.Sizes), badLines)
	}
	for _, r := range results {
		if !r.Correct {
			return fmt.Errorf("wrong result at %d bytes", r.Bytes)
		}
	}
	return nil
}

func printResult(w io.Writer, r benchmark.Result, asJSON bool) {
	if asJSON {
		b, _ := json.Marshal(r)
		fmt.Fprintf(w, "%s\n", b)
		return
	}
	correct := "yes"
	if !r.Correct {
		correct = "NO"
	}
	redop := r.Reduce
	if redop == "" {
		redop = "-"
	}
	algo := r.Algorithm
	if algo == "" {
		algo = "-"
	}
	fmt.Fprintf(w, "%12d %12d %9s %8s %12.1f %12.3f %12.3f %8s  %s\n", r.Bytes, r.Count, r.DType, redop, r.TimeUS, r.AlgBW, r.BusBW, correct, algo)
}

// benchWorker is one benchmark process: it joins the others through the
// launcher's rendezvous, builds the communicator and runs the measurement; rank 0
// prints the results as JSON lines.
func benchWorker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) != 1 {
		return errors.New("bench worker: want one JSON spec argument")
	}
	var spec workerSpec
	if err := json.Unmarshal([]byte(args[0]), &spec); err != nil {
		return fmt.Errorf("bench worker: spec: %w", err)
	}
	bspec, err := spec.benchmarkSpec()
	if err != nil {
		return err
	}
	cfg, err := spec.collectiveConfig()
	if err != nil {
		return err
	}
	log, err := logging.Options{Level: spec.LogLevel, Format: spec.LogFormat}.Logger(stderr)
	if err != nil {
		return fmt.Errorf("bench worker: %w", err)
	}
	cfg.Logger = log
	var phases *benchmark.PhaseTimes
	if spec.Phases {
		phases = benchmark.NewPhaseTimes()
		cfg.Tracer = phases
	}
	env, err := envconfig.Load(os.Getenv)
	if err != nil {
		return err
	}
	mode, err := multi.ParseMode(spec.Transport)
	if err != nil {
		return err
	}
	tcfg := multi.DefaultConfig()
	tcfg.Mode, tcfg.ListenAddr, tcfg.Secret, tcfg.IOTimeout = mode, env.ListenAddr, env.Secret, spec.IOTimeout
	if spec.Hosts > 1 {
		// Shared memory only among the ranks of this declared host.
		tcfg.SHM.HostID = declaredHost(env.Rank, env.Size, spec.Hosts)
	}
	tcfg.TCP.SocketBuffer = spec.SocketBuf
	tcfg.TCP.Lanes = spec.Lanes
	tcfg.Logger = log
	tcfg.TCP.SpinTime, tcfg.SHM.SpinTime = spec.SpinTime, spec.SpinTime
	if tcfg.Security, err = transport.ParseSecurity(spec.Security); err != nil {
		return fmt.Errorf("bench worker: %w", err)
	}
	t, err := multi.Listen(tcfg)
	if err != nil {
		return err
	}
	defer t.Close()
	joinCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	addrs, err := rendezvous.JoinSecret(joinCtx, env.Rendezvous, env.Rank, t.Addr(), env.Secret)
	if err != nil {
		return err
	}
	world := transport.World{JobID: env.JobID, Epoch: 1, Rank: env.Rank, Addrs: addrs}
	if spec.Hosts > 1 {
		world.Hosts = make([]string, len(addrs))
		for r := range world.Hosts {
			world.Hosts[r] = declaredHost(r, len(addrs), spec.Hosts)
		}
	}
	comm, err := collective.New(joinCtx, t, world, cfg)
	if err != nil {
		return err
	}
	defer comm.Close()
	if spec.ProfileDir != "" {
		stop, err := startProfiles(spec.ProfileDir, env.Rank)
		if err != nil {
			return err
		}
		defer stop()
	}
	return benchmark.Run(ctx, comm, bspec, func(r benchmark.Result) error {
		if phases != nil {
			r.PhasesUS = phases.Take(r.Bytes)
		}
		if env.Rank != 0 {
			if r.PhasesUS != nil {
				// The other ranks' phases, for a reader of the workers'
				// logs: their split differs from rank 0's.
				b, _ := json.Marshal(r.PhasesUS)
				fmt.Fprintf(stderr, "bench phases rank %d bytes %d: %s\n", env.Rank, r.Bytes, b)
			}
			return nil
		}
		b, _ := json.Marshal(r)
		_, err := fmt.Fprintf(stdout, "%s\n", b)
		return err
	})
}

// declaredHost names the host --hosts declares rank r of np on: hosts of
// consecutive ranks, as even as np allows.
func declaredHost(r, np, hosts int) string {
	return fmt.Sprintf("bench-host-%d", r*hosts/np)
}

// startProfiles starts this worker's CPU profile and execution trace in dir;
// stop ends both and closes the files.
func startProfiles(dir string, rank int) (stop func(), err error) {
	cpuFile, err := os.Create(filepath.Join(dir, fmt.Sprintf("cpu-rank%d.pprof", rank)))
	if err != nil {
		return nil, err
	}
	traceFile, err := os.Create(filepath.Join(dir, fmt.Sprintf("trace-rank%d.out", rank)))
	if err != nil {
		cpuFile.Close()
		return nil, err
	}
	if err := pprof.StartCPUProfile(cpuFile); err != nil {
		cpuFile.Close()
		traceFile.Close()
		return nil, err
	}
	if err := trace.Start(traceFile); err != nil {
		pprof.StopCPUProfile()
		cpuFile.Close()
		traceFile.Close()
		return nil, err
	}
	return func() {
		trace.Stop()
		pprof.StopCPUProfile()
		_ = traceFile.Close()
		_ = cpuFile.Close()
	}, nil
}
