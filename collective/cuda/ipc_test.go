//go:build cuda

package cuda

// The same-host tests need CUDA IPC, which works only between processes: the
// test re-runs this binary as two worker processes (TestMain below) that
// meet through a rendezvous on 127.0.0.1 and talk over the tcp transport,
// each opening GPU GOROVOD_CUDA_DEVICE (default 0). Workers report on stdout,
// one JSON object a line.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/tcp"
	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/job/launch"
	"github.com/gorovod/gorovod/job/rendezvous"
)

// envIPCWorker makes TestMain run an IPC worker scenario instead of the tests.
const envIPCWorker = "GOROVOD_CUDA_IPC_WORKER"

// ipcWorkerTimeout bounds a worker's whole run, ipcJobTimeout the test's
// wait for both (the lead's GPU runs must finish in about a minute).
const (
	ipcWorkerTimeout = 50 * time.Second
	ipcJobTimeout    = 55 * time.Second
)

func TestMain(m *testing.M) {
	if s := os.Getenv(envIPCWorker); s != "" {
		if err := ipcWorker(s); err != nil {
			ipcEmit(ipcEvent{Rank: -1, Kind: "error", Msg: err.Error()})
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// ipcEvent is one line a worker prints.
type ipcEvent struct {
	Rank   int    `json:"rank"`
	Kind   string `json:"kind"` // group, case, done, copy, bench, error
	IPC    bool   `json:"ipc,omitempty"`
	Reason string `json:"reason,omitempty"`
	Msg    string `json:"msg,omitempty"`
	// done
	IPCCalls  int64 `json:"ipc_calls,omitempty"`
	HostCalls int64 `json:"host_calls,omitempty"`
	Remaps    int64 `json:"remaps,omitempty"`
	Reused    int64 `json:"reused,omitempty"`
	// copy, bench
	Path     string  `json:"path,omitempty"` // ipc, host, copy
	DType    string  `json:"dtype,omitempty"`
	Bytes    int     `json:"bytes,omitempty"`
	Iters    int     `json:"iters,omitempty"`
	MedianNs int64   `json:"median_ns,omitempty"`
	BusGBps  float64 `json:"bus_GBps,omitempty"` // bytes / median (2(p-1)/p = 1 for p = 2)
}

func ipcEmit(e ipcEvent) {
	b, _ := json.Marshal(e)
	fmt.Printf("%s\n", b)
}

// ipcWorker is one rank: it joins the world, opens the GPU and runs scenario.
func ipcWorker(scenario string) error {
	env, err := envconfig.Load(os.Getenv)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), ipcWorkerTimeout)
	defer cancel()
	ordinal := 0
	if v := os.Getenv("GOROVOD_CUDA_DEVICE"); v != "" {
		if ordinal, err = strconv.Atoi(v); err != nil {
			return fmt.Errorf("GOROVOD_CUDA_DEVICE=%q: %v", v, err)
		}
	}
	dev, err := NewDevice(ctx, ordinal)
	if err != nil {
		return fmt.Errorf("rank %d: NewDevice(%d): %w", env.Rank, ordinal, err)
	}
	defer dev.Close()
	cfg := tcp.DefaultConfig()
	cfg.Secret, cfg.IOTimeout = env.Secret, 20*time.Second
	t, err := tcp.Listen(cfg)
	if err != nil {
		return err
	}
	defer t.Close()
	addrs, err := rendezvous.JoinSecret(ctx, env.Rendezvous, env.Rank, t.Addr(), env.Secret)
	if err != nil {
		return fmt.Errorf("rank %d: rendezvous: %w", env.Rank, err)
	}
	w := transport.World{JobID: env.JobID, Epoch: 1, Rank: env.Rank, Addrs: addrs}
	ccfg := collective.DefaultConfig()
	var hook *sameHostAllreducer
	if scenario == "hook" {
		// The communicator's own Allreduce hands device buffers to the
		// same-host group, as the C binding's communicators do.
		hcfg := DefaultSameHostConfig()
		hcfg.HostSync = true
		newHook := SameHostAllreducer(hcfg, nil)
		ccfg.NewDeviceAllreducer = func() collective.DeviceAllreducer {
			hook = newHook().(*sameHostAllreducer)
			return hook
		}
	}
	c, err := collective.New(ctx, t, w, ccfg)
	if err != nil {
		return fmt.Errorf("rank %d: communicator: %w", env.Rank, err)
	}
	defer c.Close()
	switch scenario {
	case "check":
		err = ipcCheckScenario(ctx, c, dev, DefaultSameHostConfig())
	case "checkhostsync":
		cfg := DefaultSameHostConfig()
		cfg.HostSync = true
		err = ipcCheckScenario(ctx, c, dev, cfg)
	case "bench":
		err = ipcBenchScenario(ctx, c, dev)
	case "deadpeer":
		err = ipcDeadPeerScenario(ctx, c, dev, DefaultSameHostConfig())
	case "deadpeerhostsync":
		cfg := DefaultSameHostConfig()
		cfg.HostSync, cfg.SyncTimeout = true, 5*time.Second
		err = ipcDeadPeerScenario(ctx, c, dev, cfg)
	case "three":
		err = ipcThreeScenario(ctx, c, dev)
	case "hook":
		err = ipcHookScenario(ctx, c, dev, hook)
	default:
		err = fmt.Errorf("unknown scenario %q", scenario)
	}
	if err != nil {
		return fmt.Errorf("rank %d: %w", env.Rank, err)
	}
	return nil
}

// ipcCase is one allreduce of the check scenario.
type ipcCase struct {
	dt    collective.DType
	op    collective.ReduceOp
	count int
	// inplace; outofplace (send and receive in one allocation); separate
	// (send and receive allocated apart, used for buffers of 2 MiB and more:
	// smaller allocations share the driver's blocks, and a block is mapped
	// whole, so a second handle into it fails as already mapped and the call
	// takes the host path); wrapped (in place, at an odd offset into a
	// larger allocation).
	mode      string
	pre, post float64
}

func (k ipcCase) String() string {
	return fmt.Sprintf("%v/%v/n=%d/%s/pre=%g/post=%g", k.dt, k.op, k.count, k.mode, k.pre, k.post)
}

func ipcCases() []ipcCase {
	var cs []ipcCase
	modes := []string{"inplace", "outofplace", "wrapped"}
	i := 0
	for _, dt := range []collective.DType{collective.Float32, collective.BFloat16, collective.Float16} {
		for _, op := range []collective.ReduceOp{collective.Sum, collective.Average} {
			// Odd counts leave shares of unequal length; the largest is
			// 12 MiB of float32.
			for _, n := range []int{1, 2, 7, 1000, 65537, 3<<20 + 5} {
				mode := modes[i%3]
				if n*dt.Size() >= 2<<20 && mode == "outofplace" {
					mode = "separate"
				}
				cs = append(cs, ipcCase{dt: dt, op: op, count: n, mode: mode, pre: 1, post: 1})
				i++
			}
		}
	}
	cs = append(cs,
		ipcCase{dt: collective.Float32, op: collective.Average, count: 16 << 20, mode: "inplace", pre: 1, post: 1}, // 64 MiB
		ipcCase{dt: collective.BFloat16, op: collective.Sum, count: 2<<20 + 3, mode: "separate", pre: 1, post: 1},
		ipcCase{dt: collective.Float32, op: collective.Sum, count: 4099, mode: "outofplace", pre: 0.25, post: 3},
		ipcCase{dt: collective.BFloat16, op: collective.Average, count: 4099, mode: "wrapped", pre: 2, post: 0.5},
		ipcCase{dt: collective.Float32, op: collective.Max, count: 1001, mode: "inplace", pre: 1, post: 1},
		ipcCase{dt: collective.Float32, op: collective.Min, count: 1001, mode: "outofplace", pre: 1, post: 1},
		ipcCase{dt: collective.Float32, op: collective.Product, count: 1001, mode: "wrapped", pre: 1, post: 1},
		ipcCase{dt: collective.Int32, op: collective.Average, count: 1001, mode: "inplace", pre: 1, post: 1},
		ipcCase{dt: collective.Float64, op: collective.Sum, count: 1001, mode: "outofplace", pre: 1, post: 1},
	)
	return cs
}

// ipcInputs is every rank's input of case i (each rank computes all of them).
func ipcInputs(k ipcCase, i, p int) [][]byte {
	in := make([][]byte, p)
	for r := range p {
		in[r] = randomFinite(rand.New(rand.NewPCG(uint64(i), uint64(r))), k.dt, k.count)
	}
	return in
}

// ipcExpected is the host kernels' result for two ranks (in has two inputs): each input
// prescaled, reduced, then scaled as the host path's final step.
func ipcExpected(k ipcCase, in [][]byte) []byte {
	a, b := in[0], in[1]
	if k.pre != 1 {
		a, b = hostScale(k.dt, a, k.pre, 1), hostScale(k.dt, b, k.pre, 1)
	}
	op := k.op
	if op == collective.Average {
		op = collective.Sum
	}
	want := hostReduce(k.dt, op, a, b)
	if factor, divisor := finalScaling(k.dt, k.op, k.post, 2); factor != 1 || divisor > 1 {
		want = hostScale(k.dt, want, factor, divisor)
	}
	return want
}

// runIPCCase allreduces case k's input through g and returns the result and
// whether an out-of-place send buffer was left as it was.
func runIPCCase(ctx context.Context, g *SameHostGroup, dev *Device, k ipcCase, input []byte, rank int) ([]byte, error) {
	size := len(input)
	var send, recv *Memory
	var frees []*Memory
	defer func() {
		for _, m := range frees {
			m.Free()
		}
	}()
	alloc := func(n int) (*Memory, error) {
		m, err := dev.Alloc(ctx, n)
		if err == nil {
			frees = append(frees, m)
		}
		return m, err
	}
	var err error
	switch k.mode {
	case "inplace", "separate":
		if send, err = alloc(size); err != nil {
			return nil, err
		}
		recv = send
		if k.mode == "separate" {
			if recv, err = alloc(size); err != nil {
				return nil, err
			}
		}
	case "outofplace":
		gap := 256 + 512*rank
		whole, err := alloc(2*size + gap)
		if err != nil {
			return nil, err
		}
		if send, err = dev.Wrap(ctx, whole.Ptr(), size); err != nil {
			return nil, err
		}
		if recv, err = dev.Wrap(ctx, whole.Ptr()+uintptr(size+gap), size); err != nil {
			return nil, err
		}
	case "wrapped":
		// An offset that differs between ranks, inside a larger allocation:
		// the handle names the allocation, the offset must travel with it.
		off := 256 + 512*rank
		whole, err := alloc(size + 4096)
		if err != nil {
			return nil, err
		}
		if send, err = dev.Wrap(ctx, whole.Ptr()+uintptr(off), size); err != nil {
			return nil, err
		}
		recv = send
	}
	if err := send.CopyFromHost(ctx, 0, input); err != nil {
		return nil, err
	}
	sb := collective.Buffer{DType: k.dt, Count: k.count, Device: send}
	rb := collective.Buffer{DType: k.dt, Count: k.count, Device: recv}
	if err := g.AllreduceScaled(ctx, sb, rb, k.op, k.pre, k.post); err != nil {
		return nil, err
	}
	out := make([]byte, size)
	if err := recv.CopyToHost(ctx, out, 0); err != nil {
		return nil, err
	}
	if send != recv && k.pre == 1 {
		kept := make([]byte, size)
		if err := send.CopyToHost(ctx, kept, 0); err != nil {
			return nil, err
		}
		if err := sameBits(k.dt, kept, input, false); err != nil {
			return nil, fmt.Errorf("the send buffer changed: %v", err)
		}
	}
	return out, nil
}

// ipcCheckScenario runs every case through the IPC path and the host path
// and holds both to the host kernels' result.
func ipcCheckScenario(ctx context.Context, c *collective.Communicator, dev *Device, cfg SameHostConfig) error {
	r, p := c.Rank(), c.Size()
	if p != 2 {
		return fmt.Errorf("the check scenario's expectations are for 2 ranks, not %d", p)
	}
	g, err := NewSameHostGroup(ctx, c, dev, cfg)
	if err != nil {
		return fmt.Errorf("NewSameHostGroup: %w", err)
	}
	defer g.Close()
	ipcEmit(ipcEvent{Rank: r, Kind: "group", IPC: g.IPC(), Reason: g.Reason() + g.SyncReason()})
	if !g.IPC() {
		return fmt.Errorf("the group fell back to the host path: %s", g.Reason())
	}
	if g.HostSync() != cfg.HostSync {
		return fmt.Errorf("HostSync %v, asked for %v: %s", g.HostSync(), cfg.HostSync, g.SyncReason())
	}
	// The same calls on a group told to use the host path: the comparison
	// the bit-identity claim is about.
	hostCfg := DefaultSameHostConfig()
	hostCfg.Disable = true
	hg, err := NewSameHostGroup(ctx, c, dev, hostCfg)
	if err != nil {
		return fmt.Errorf("NewSameHostGroup(Disable): %w", err)
	}
	defer hg.Close()
	if hg.IPC() {
		return fmt.Errorf("a group with Disable set uses IPC")
	}
	cases := ipcCases()
	for i, k := range cases {
		in := ipcInputs(k, i, p)
		want := ipcExpected(k, in)
		host, err := runIPCCase(ctx, hg, dev, k, in[r], r)
		if err != nil {
			return fmt.Errorf("case %v (host path): %w", k, err)
		}
		for _, x := range []struct {
			name string
			g    *SameHostGroup
		}{{"IPC", g}} {
			got, err := runIPCCase(ctx, x.g, dev, k, in[r], r)
			if err != nil {
				return fmt.Errorf("case %v (%s): %w", k, x.name, err)
			}
			if fb := x.g.LastFallback(); fb != "" {
				return fmt.Errorf("case %v (%s) fell back to the host path: %s", k, x.name, fb)
			}
			// Two operands, one rounding: exactly the host kernels' bits.
			if err := sameBits(k.dt, got, want, false); err != nil {
				return fmt.Errorf("case %v (%s): result differs from the host kernels': %v", k, x.name, err)
			}
			if err := sameBits(k.dt, got, host, false); err != nil {
				return fmt.Errorf("case %v (%s): result differs from the host path's: %v", k, x.name, err)
			}
		}
		ipcEmit(ipcEvent{Rank: r, Kind: "case", Msg: k.String()})
	}
	// The same allocation call after call, as a training loop's gradients:
	// from the second call on the ranks skip the mapping agreement.
	const rounds = 4
	k := ipcCase{dt: collective.Float32, op: collective.Average, count: 100003, mode: "inplace", pre: 1, post: 1}
	m, err := dev.Alloc(ctx, k.count*k.dt.Size())
	if err != nil {
		return err
	}
	defer m.Free()
	reusedBefore := g.Stats().Reused
	for round := range rounds {
		in := ipcInputs(k, 1000+round, p)
		want := ipcExpected(k, in)
		if err := m.CopyFromHost(ctx, 0, in[r]); err != nil {
			return err
		}
		buf := collective.Buffer{DType: k.dt, Count: k.count, Device: m}
		if err := g.Allreduce(ctx, buf, buf, k.op); err != nil {
			return fmt.Errorf("repeated call %d: %w", round, err)
		}
		got := make([]byte, m.Size())
		if err := m.CopyToHost(ctx, got, 0); err != nil {
			return err
		}
		if err := sameBits(k.dt, got, want, false); err != nil {
			return fmt.Errorf("repeated call %d: result differs from the host kernels': %v", round, err)
		}
	}
	st, hst := g.Stats(), hg.Stats()
	ipcEmit(ipcEvent{Rank: r, Kind: "done", IPCCalls: st.IPC, HostCalls: st.Host, Remaps: st.Remaps, Reused: st.Reused})
	if st.IPC != int64(len(cases)+rounds) || st.Host != 0 {
		return fmt.Errorf("IPC group ran %d calls through IPC and %d through the host, want %d and 0", st.IPC, st.Host, len(cases)+rounds)
	}
	if n := st.Reused - reusedBefore; n != rounds-1 {
		return fmt.Errorf("%d of %d repeated calls on one allocation skipped the mapping agreement, want %d", n, rounds, rounds-1)
	}
	if hst.IPC != 0 || hst.Host != int64(len(cases)) {
		return fmt.Errorf("host group ran %d calls through IPC and %d through the host, want 0 and %d", hst.IPC, hst.Host, len(cases))
	}
	return c.Barrier(ctx)
}

// ipcBenchScenario times in-place Average allreduces of zeroed device buffers
// through the IPC path and the host path; rank 0 reports medians, and first
// the device-to-device copy bandwidth of the same sizes, the yardstick.
func ipcBenchScenario(ctx context.Context, c *collective.Communicator, dev *Device) error {
	r := c.Rank()
	median := func(ds []time.Duration) time.Duration {
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	if r == 0 {
		for _, size := range []int{64 << 20, 256 << 20} {
			src, err := dev.Alloc(ctx, size)
			if err != nil {
				return err
			}
			dst, err := dev.Alloc(ctx, size)
			if err != nil {
				src.Free()
				return err
			}
			var ds []time.Duration
			for i := range 12 {
				start := time.Now()
				if err := dst.CopyFrom(ctx, 0, src, 0, size); err != nil {
					return err
				}
				if i >= 2 {
					ds = append(ds, time.Since(start))
				}
			}
			src.Free()
			dst.Free()
			m := median(ds)
			ipcEmit(ipcEvent{Rank: r, Kind: "copy", Path: "copy", Bytes: size, Iters: len(ds), MedianNs: m.Nanoseconds(),
				BusGBps: float64(size) / m.Seconds() / 1e9})
		}
	}
	g, err := NewSameHostGroup(ctx, c, dev, DefaultSameHostConfig())
	if err != nil {
		return err
	}
	defer g.Close()
	ipcEmit(ipcEvent{Rank: r, Kind: "group", IPC: g.IPC(), Reason: g.Reason()})
	if !g.IPC() {
		return fmt.Errorf("the group fell back to the host path: %s", g.Reason())
	}
	hostCfg := DefaultSameHostConfig()
	hostCfg.Disable = true
	hg, err := NewSameHostGroup(ctx, c, dev, hostCfg)
	if err != nil {
		return err
	}
	defer hg.Close()
	syncCfg := DefaultSameHostConfig()
	syncCfg.HostSync = true
	sg, err := NewSameHostGroup(ctx, c, dev, syncCfg)
	if err != nil {
		return err
	}
	defer sg.Close()
	if !sg.HostSync() {
		return fmt.Errorf("no board: %s", sg.SyncReason())
	}
	for _, path := range []string{"ipc", "ipc-hostsync", "host"} {
		grp := map[string]*SameHostGroup{"ipc": g, "ipc-hostsync": sg, "host": hg}[path]
		for _, dt := range []collective.DType{collective.Float32, collective.BFloat16} {
			for _, size := range benchSizes {
				m, err := dev.Alloc(ctx, size)
				if err != nil {
					return err
				}
				if err := m.CopyFromHost(ctx, 0, make([]byte, size)); err != nil {
					m.Free()
					return err
				}
				buf := collective.Buffer{DType: dt, Count: size / dt.Size(), Device: m}
				warm, iters := 3, min(max((1<<30)/size, 10), 200)
				if path == "host" {
					warm, iters = 1, min(max((64<<20)/size, 3), 50)
				}
				var ds []time.Duration
				for i := range warm + iters {
					start := time.Now()
					if err := grp.Allreduce(ctx, buf, buf, collective.Average); err != nil {
						m.Free()
						return fmt.Errorf("%s %v %s: %w", path, dt, sizeName(size), err)
					}
					if i >= warm {
						ds = append(ds, time.Since(start))
					}
				}
				m.Free()
				if fb := grp.LastFallback(); path != "host" && fb != "" {
					return fmt.Errorf("ipc %v %s fell back to the host path: %s", dt, sizeName(size), fb)
				}
				if r == 0 {
					md := median(ds)
					ipcEmit(ipcEvent{Rank: r, Kind: "bench", Path: path, DType: dt.String(), Bytes: size, Iters: iters,
						MedianNs: md.Nanoseconds(), BusGBps: float64(size) / md.Seconds() / 1e9})
				}
			}
		}
	}
	return c.Barrier(ctx)
}

// ipcThreeScenario runs allreduces among three processes, where each share
// is a chain of two reductions (local operand first, then the other ranks in
// rank order) whose order differs from share to share. The inputs are small
// integers, so every order gives the same exact sum and the expectation is
// exact for every dtype; Average then scales it by 1/3 as the host does.
func ipcThreeScenario(ctx context.Context, c *collective.Communicator, dev *Device) error {
	r, p := c.Rank(), c.Size()
	g, err := NewSameHostGroup(ctx, c, dev, DefaultSameHostConfig())
	if err != nil {
		return err
	}
	defer g.Close()
	if !g.IPC() {
		return fmt.Errorf("the group fell back to the host path: %s", g.Reason())
	}
	calls := 0
	for _, dt := range []collective.DType{collective.Float32, collective.BFloat16, collective.Float16, collective.Int32} {
		for _, op := range []collective.ReduceOp{collective.Sum, collective.Average, collective.Max} {
			for i, n := range []int{1, 2, 3, 1000, 65537, 3<<20 + 5} {
				k := ipcCase{dt: dt, op: op, count: n, mode: []string{"inplace", "outofplace", "wrapped"}[i%3], pre: 1, post: 1}
				in, want := smallIntegerCase(dt, op, n, p)
				got, err := runIPCCase(ctx, g, dev, k, in[r], r)
				if err != nil {
					return fmt.Errorf("case %v: %w", k, err)
				}
				if fb := g.LastFallback(); fb != "" {
					return fmt.Errorf("case %v fell back to the host path: %s", k, fb)
				}
				if err := sameBits(dt, got, want, false); err != nil {
					return fmt.Errorf("case %v: result differs from the exact one: %v", k, err)
				}
				calls++
			}
		}
	}
	st := g.Stats()
	ipcEmit(ipcEvent{Rank: r, Kind: "done", IPCCalls: st.IPC, HostCalls: st.Host, Remaps: st.Remaps, Reused: st.Reused})
	if st.IPC != int64(calls) || st.Host != 0 {
		return fmt.Errorf("%d calls through IPC and %d through the host, want %d and 0", st.IPC, st.Host, calls)
	}
	return c.Barrier(ctx)
}

// ipcHookScenario runs allreduces of device buffers through the
// communicator's own Allreduce, whose DeviceAllreducer (SameHostAllreducer,
// meeting on the board) must take every one through IPC, against exact
// results.
func ipcHookScenario(ctx context.Context, c *collective.Communicator, dev *Device, hook *sameHostAllreducer) error {
	r, p := c.Rank(), c.Size()
	calls := 0
	for _, dt := range []collective.DType{collective.Float32, collective.BFloat16} {
		for _, op := range []collective.ReduceOp{collective.Sum, collective.Average} {
			for _, n := range []int{1, 1000, 3<<20 + 5} {
				in, want := smallIntegerCase(dt, op, n, p)
				m, err := dev.Alloc(ctx, len(in[r]))
				if err != nil {
					return err
				}
				if err := m.CopyFromHost(ctx, 0, in[r]); err != nil {
					m.Free()
					return err
				}
				buf := collective.Buffer{DType: dt, Count: n, Device: m}
				err = c.Allreduce(ctx, buf, buf, op)
				got := make([]byte, len(in[r]))
				if err == nil {
					err = m.CopyToHost(ctx, got, 0)
				}
				m.Free()
				if err != nil {
					return fmt.Errorf("%v %v n=%d: %w", dt, op, n, err)
				}
				if err := sameBits(dt, got, want, false); err != nil {
					return fmt.Errorf("%v %v n=%d: result differs from the exact one: %v", dt, op, n, err)
				}
				calls++
			}
		}
	}
	if hook == nil || hook.group == nil {
		return fmt.Errorf("the communicator made no same-host group")
	}
	st := hook.group.Stats()
	ipcEmit(ipcEvent{Rank: r, Kind: "done", IPC: hook.group.IPC(), Reason: hook.group.Reason(), IPCCalls: st.IPC, HostCalls: st.Host, Remaps: st.Remaps, Reused: st.Reused})
	if !hook.group.IPC() || !hook.group.HostSync() {
		return fmt.Errorf("the group uses IPC %v (%s), the board %v (%s); want both", hook.group.IPC(), hook.group.Reason(), hook.group.HostSync(), hook.group.SyncReason())
	}
	if st.IPC != int64(calls) || st.Host != 0 {
		return fmt.Errorf("%d calls through IPC and %d through the host, want %d and 0", st.IPC, st.Host, calls)
	}
	return c.Barrier(ctx)
}

// smallIntegerCase is every rank's input of n small integers (exact in
// every dtype, so any order of reduction gives the same bits) and the
// exact result of op over p ranks.
func smallIntegerCase(dt collective.DType, op collective.ReduceOp, n, p int) (in [][]byte, want []byte) {
	in = make([][]byte, p)
	for q := range p {
		rng := rand.New(rand.NewPCG(uint64(n), uint64(q)))
		vals := make([]float64, n)
		for j := range vals {
			vals[j] = float64(rng.IntN(17) - 8)
		}
		in[q] = encodeSmall(dt, vals)
	}
	kop := op
	if op == collective.Average {
		kop = collective.Sum
	}
	want = in[0]
	for q := 1; q < p; q++ {
		want = hostReduce(dt, kop, want, in[q])
	}
	if factor, divisor := finalScaling(dt, op, 1, p); factor != 1 || divisor > 1 {
		want = hostScale(dt, want, factor, divisor)
	}
	return in, want
}

// encodeSmall encodes small integers (exact in every dtype used) as dt.
func encodeSmall(dt collective.DType, vals []float64) []byte {
	var b []byte
	for _, v := range vals {
		switch dt {
		case collective.Float32:
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(v)))
		case collective.BFloat16:
			b = binary.LittleEndian.AppendUint16(b, uint16(collective.NewBF16(float32(v))))
		case collective.Float16:
			b = binary.LittleEndian.AppendUint16(b, uint16(collective.NewF16(float32(v))))
		case collective.Int32:
			b = binary.LittleEndian.AppendUint32(b, uint32(int32(v)))
		}
	}
	return b
}

// ipcDeadPeerScenario has rank 1 exit abruptly after one allreduce, with
// rank 0's buffers mapped; rank 0's next allreduce must fail, in bounded
// time, with the communicator's error.
func ipcDeadPeerScenario(ctx context.Context, c *collective.Communicator, dev *Device, cfg SameHostConfig) error {
	r := c.Rank()
	g, err := NewSameHostGroup(ctx, c, dev, cfg)
	if err != nil {
		return err
	}
	if g.HostSync() != cfg.HostSync {
		return fmt.Errorf("HostSync %v, asked for %v: %s", g.HostSync(), cfg.HostSync, g.SyncReason())
	}
	defer g.Close()
	if !g.IPC() {
		return fmt.Errorf("the group fell back to the host path: %s", g.Reason())
	}
	m, err := dev.Alloc(ctx, 1<<20)
	if err != nil {
		return err
	}
	defer m.Free()
	if err := m.CopyFromHost(ctx, 0, make([]byte, 1<<20)); err != nil {
		return err
	}
	buf := collective.Buffer{DType: collective.Float32, Count: 1 << 18, Device: m}
	if err := g.Allreduce(ctx, buf, buf, collective.Sum); err != nil {
		return fmt.Errorf("first allreduce: %w", err)
	}
	if r == 1 {
		ipcEmit(ipcEvent{Rank: r, Kind: "exiting"})
		os.Exit(0) // a process that dies: nothing closed, nothing said
	}
	start := time.Now()
	err = g.Allreduce(ctx, buf, buf, collective.Sum)
	took := time.Since(start)
	if err == nil {
		return fmt.Errorf("an allreduce with rank 1 gone succeeded")
	}
	var pe *collective.PeerError
	var ge *PeerGoneError
	var te *SyncTimeoutError
	ipcEmit(ipcEvent{Rank: r, Kind: "deadpeer", Msg: fmt.Sprintf("%v (PeerError %v, PeerGoneError %v, SyncTimeoutError %v)",
		err, errors.As(err, &pe), errors.As(err, &ge), errors.As(err, &te)), MedianNs: took.Nanoseconds()})
	if !errors.As(err, &pe) && !errors.As(err, &ge) && !errors.As(err, &te) {
		return fmt.Errorf("the error names no peer: %v", err)
	}
	return nil
}

// ipcJob is the events and output of one run of two workers.
type ipcJob struct {
	mu     sync.Mutex
	events []ipcEvent
	other  strings.Builder
}

// runIPCWorkers runs scenario on np worker processes and returns their
// events; any worker failure fails tb with everything the workers printed.
func runIPCWorkers(tb testing.TB, scenario string, np int) []ipcEvent {
	tb.Helper()
	exe, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	j := &ipcJob{}
	output := func(rank int, stream string, line []byte) {
		j.mu.Lock()
		defer j.mu.Unlock()
		var e ipcEvent
		if stream == "stdout" && json.Unmarshal(line, &e) == nil && e.Kind != "" {
			if e.Rank < 0 {
				e.Rank = rank
			}
			j.events = append(j.events, e)
			return
		}
		fmt.Fprintf(&j.other, "[%d %s] %s\n", rank, stream, line)
	}
	ctx, cancel := context.WithTimeout(context.Background(), ipcJobTimeout)
	defer cancel()
	env, stop, err := launch.FixedWorld(launch.NewJobID(), np)
	if err != nil {
		tb.Fatal(err)
	}
	defer stop()
	job, err := launch.Start(ctx, launch.Spec{
		Argv: []string{exe}, NP: np, Output: output, StopGrace: time.Second,
		Env: func(i int) []string { return append(env(i), envIPCWorker+"="+scenario) },
	})
	if err != nil {
		tb.Fatal(err)
	}
	defer func() {
		job.Signal(syscall.SIGKILL)
		<-job.Done()
	}()
	werr := job.Wait()
	j.mu.Lock()
	defer j.mu.Unlock()
	var errs []string
	for _, e := range j.events {
		if e.Kind == "error" {
			errs = append(errs, fmt.Sprintf("worker %d: %s", e.Rank, e.Msg))
		}
	}
	if werr != nil || len(errs) > 0 {
		tb.Fatalf("%s workers failed: %v\n%s\nother output:\n%s", scenario, werr, strings.Join(errs, "\n"), j.other.String())
	}
	return slices.Clone(j.events)
}

// TestAllreduceIPC runs allreduces of f32, bf16 and f16 (Sum, Average, with
// pre/postscale, a few other ops and dtypes), in place, out of place and at
// offsets inside larger allocations, from 1 element to 64 MiB, between two
// processes on one GPU through CUDA IPC, and checks that every call used
// IPC and gave the host kernels' and the host path's bits.
func TestAllreduceIPC(t *testing.T) {
	openDevice(t) // skips without a GPU
	checkIPCEvents(t, runIPCWorkers(t, "check", 2))
}

// TestAllreduceIPCHostSync is TestAllreduceIPC with the ranks meeting on the
// shared-memory board (SameHostConfig.HostSync).
func TestAllreduceIPCHostSync(t *testing.T) {
	openDevice(t)
	checkIPCEvents(t, runIPCWorkers(t, "checkhostsync", 2))
}

func checkIPCEvents(t *testing.T, events []ipcEvent) {
	t.Helper()
	done := 0
	for _, e := range events {
		switch e.Kind {
		case "group":
			if !e.IPC {
				t.Errorf("rank %d: group without IPC: %s", e.Rank, e.Reason)
			}
		case "done":
			done++
			t.Logf("rank %d: %d allreduces through IPC (%d on the last call's allocations), %d through the host; cached mappings dropped %d times",
				e.Rank, e.IPCCalls, e.Reused, e.HostCalls, e.Remaps)
		}
	}
	if done != 2 {
		t.Fatalf("%d of 2 workers finished", done)
	}
}

// TestAllreduceIPCThreeRanks runs the same-host path among three processes
// on one GPU (shares reduced in chains of two), against exact results.
func TestAllreduceIPCThreeRanks(t *testing.T) {
	openDevice(t)
	checkWorkersDone(t, runIPCWorkers(t, "three", 3), 3)
}

// checkWorkersDone logs each worker's counts and fails unless all np
// reported done.
func checkWorkersDone(t *testing.T, events []ipcEvent, np int) {
	t.Helper()
	done := 0
	for _, e := range events {
		if e.Kind == "done" {
			done++
			t.Logf("rank %d: %d allreduces through IPC, %d through the host; cached mappings dropped %d times", e.Rank, e.IPCCalls, e.HostCalls, e.Remaps)
		}
	}
	if done != np {
		t.Fatalf("%d of %d workers finished", done, np)
	}
}

// TestAllreduceIPCThroughCommunicator: a communicator made with
// SameHostAllreducer as its Config.NewDeviceAllreducer (what the C
// binding does) runs its allreduces of device memory through IPC.
func TestAllreduceIPCThroughCommunicator(t *testing.T) {
	openDevice(t)
	checkWorkersDone(t, runIPCWorkers(t, "hook", 2), 2)
}

// TestAllreduceIPCDeadPeer checks that a rank whose peer process died in
// the middle of using the group gets an error within the bounded wait.
func TestAllreduceIPCDeadPeer(t *testing.T) {
	openDevice(t)
	for _, scenario := range []string{"deadpeer", "deadpeerhostsync"} {
		t.Run(scenario, func(t *testing.T) { checkDeadPeer(t, runIPCWorkers(t, scenario, 2)) })
	}
}

func checkDeadPeer(t *testing.T, events []ipcEvent) {
	t.Helper()
	for _, e := range events {
		if e.Kind == "deadpeer" {
			took := time.Duration(e.MedianNs)
			t.Logf("rank %d: after %v: %s", e.Rank, took, e.Msg)
			if took > 15*time.Second {
				t.Fatalf("the error took %v", took)
			}
			return
		}
	}
	t.Fatalf("rank 0 reported no error: events %+v", events)
}

// BenchmarkAllreduceIPC is an in-place Average allreduce of device buffers
// by two processes sharing the GPU, through CUDA IPC (ipc/...), and the same
// through the communicator's host-staged path (host/...), 4 KiB to 256 MiB
// of float32 and bfloat16, with the device-to-device copy of 64 and 256 MiB
// (copy/...) as the yardstick. The workers time the calls (median of many,
// after warm-up); each sub-benchmark reports that median as ns/op and the
// message size over it as MB/s, which for two ranks is the bus bandwidth.
func BenchmarkAllreduceIPC(b *testing.B) {
	d, err := NewDevice(context.Background(), 0)
	if err != nil {
		b.Skipf("no GPU: %v", err)
	}
	d.Close()
	for _, e := range runIPCWorkers(b, "bench", 2) {
		if e.Kind != "bench" && e.Kind != "copy" {
			continue
		}
		name := e.Path + "/" + sizeName(e.Bytes)
		if e.DType != "" {
			name = e.Path + "/" + e.DType + "/" + sizeName(e.Bytes)
		}
		b.Run(name, func(b *testing.B) {
			b.ReportMetric(float64(e.MedianNs), "ns/op")
			b.ReportMetric(float64(e.Bytes)/float64(e.MedianNs)*1e3, "MB/s")
		})
	}
}

// TestAllreduceIPCBench prints the benchmark's figures as JSON lines when
// GOROVOD_CUDA_IPC_BENCH=1 (for scripts that run tests, not benchmarks).
func TestAllreduceIPCBench(t *testing.T) {
	if os.Getenv("GOROVOD_CUDA_IPC_BENCH") != "1" {
		t.Skip("set GOROVOD_CUDA_IPC_BENCH=1 to run the same-host benchmark as a test")
	}
	openDevice(t)
	for _, e := range runIPCWorkers(t, "bench", 2) {
		if e.Kind == "bench" || e.Kind == "copy" {
			ipcEmit(e)
		}
	}
}
