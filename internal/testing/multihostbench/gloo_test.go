package main

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParseImpls(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		bad  bool
	}{
		{in: "gorovod,gloo,mpi-tcp", want: []string{"gorovod", "gloo", "mpi-tcp"}},
		{in: "gloo", want: []string{"gloo"}},
		{in: " gorovod , mpi-tcp-yield", want: []string{"gorovod", "mpi-tcp-yield"}},
		{in: "gorovod,glo", bad: true}, // a typo is an error, not a column left out
		{in: "gloo,gloo", bad: true},
		{in: "", bad: true},
	} {
		got, err := parseImpls(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("parseImpls(%q) = %q, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("parseImpls(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestRatioColumns(t *testing.T) {
	for _, tc := range []struct {
		impls []string
		want  [][2]string
	}{
		{[]string{"gorovod", "mpi-tcp", "gloo"}, [][2]string{{"gorovod", "mpi-tcp"}, {"gorovod", "gloo"}}},
		{[]string{"gorovod-lanes1", "gorovod-lanes4", "gloo"}, [][2]string{{"gorovod-lanes1", "gloo"}, {"gorovod-lanes4", "gloo"}}},
		{[]string{"gorovod", "mpi-tcp-yield"}, nil}, // the yielding Open MPI is shown, not divided by
		{[]string{"mpi-tcp", "gloo"}, nil},
	} {
		if got := ratioColumns(tc.impls); !slices.Equal(got, tc.want) {
			t.Errorf("ratioColumns(%q) = %q, want %q", tc.impls, got, tc.want)
		}
	}
}

func TestParsePeerResult(t *testing.T) {
	for _, tc := range []struct {
		name, line string
		want       result
		ok         bool
	}{
		{"gloo", `{"impl": "gloo", "op": "allreduce", "np": 4, "bytes": 67108864, "count": 16777216, "time_us": 912345.5, "algbw_gbps": 0.0735, "busbw_gbps": 0.110, "correct": true, "iters": 5, "batch": 1}`,
			result{Bytes: 67108864, TimeU: 912345.5, BusBW: 0.110, Right: true}, true},
		{"mpi", `{"impl":"mpi-tcp","op":"allreduce","np":4,"bytes":4096,"time_us":250.0,"busbw_gbps":0.0246,"correct":false}`,
			result{Bytes: 4096, TimeU: 250, BusBW: 0.0246}, true},
		{"log line", "[W socket.cpp:601] [c10d] The client socket has failed to connect", result{}, false},
		{"no size", `{"meta": {"date": "2026-11-29"}}`, result{}, false},
		{"cut short", `{"bytes": 4096, "time_us": 2`, result{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := parsePeerResult([]byte(tc.line))
			if ok != tc.ok || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("parsePeerResult(%q) = %+v, %v; want %+v, %v", tc.line, got, ok, tc.want, tc.ok)
			}
		})
	}
}

// TestGlooRankCommand: each rank runs the peer program as one rank of the
// job, with the benchmark's method, and learns who it is and where to meet
// from the environment torchrun would set; Gloo binds to the host's interface.
func TestGlooRankCommand(t *testing.T) {
	argv := glooArgv("/src/bench/peers/gloo_allreduce.py", 64<<20, 1, 5)
	want := []string{glooPython, "/src/bench/peers/gloo_allreduce.py", "--env-rank", "--sizes", "67108864",
		"--warmup", "1", "--iters", "5", "--batch-time-us", "1000", "--timeout", "300"}
	if !slices.Equal(argv, want) {
		t.Errorf("glooArgv = %q\nwant %q", argv, want)
	}
	env := glooEnv(3, 4, netip.MustParseAddrPort("198.18.0.2:41000"))
	wantEnv := []string{"RANK=3", "WORLD_SIZE=4", "MASTER_ADDR=198.18.0.2", "MASTER_PORT=41000", "GLOO_SOCKET_IFNAME=eth0"}
	if !slices.Equal(env, wantEnv) {
		t.Errorf("glooEnv = %q\nwant %q", env, wantEnv)
	}
}

// TestGlooRanksOnLoopback runs the ranks' command as processes of their own
// on this host (loopback for the hosts' interface): they meet, time one size
// and rank 0 prints a verified result the benchmark parses.
func TestGlooRanksOnLoopback(t *testing.T) {
	if testing.Short() {
		t.Skip("starts torch in two processes (seconds)")
	}
	skipWithoutTorch(t)
	script, err := findPeerFile("gloo_allreduce.py")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	master := netip.MustParseAddrPort(ln.Addr().String())
	ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const np, size = 2, 64 << 10
	outs := make([]bytes.Buffer, np)
	errs := make([]error, np)
	var wg sync.WaitGroup
	for rank := range np {
		argv := glooArgv(script, size, 1, 3)
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Env = append(glooEnv(rank, np, master), "GLOO_SOCKET_IFNAME=lo") // the later entry wins
		cmd.Stdout = &outs[rank]
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		wg.Go(func() {
			if err := cmd.Run(); err != nil {
				errs[rank] = err
				cancel() // the other rank would wait for this one until the timeout
				t.Logf("rank %d: %v\n%s", rank, err, stderr.String())
			}
		})
	}
	wg.Wait()
	for rank, err := range errs {
		if err != nil {
			t.Fatalf("rank %d failed: %v", rank, err)
		}
	}
	if outs[1].Len() != 0 {
		t.Errorf("rank 1 printed %q; only rank 0 reports", outs[1].String())
	}
	lines := strings.Split(strings.TrimSpace(outs[0].String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("rank 0 printed %d lines, want one result: %q", len(lines), lines)
	}
	r, ok := parsePeerResult([]byte(lines[0]))
	if !ok || r.Bytes != size || !r.Right || r.TimeU <= 0 || r.BusBW <= 0 {
		t.Fatalf("rank 0's result %q read as %+v, %v; want a verified %d-byte allreduce", lines[0], r, ok, size)
	}
}
