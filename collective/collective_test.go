package collective

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"testing"
	"time"
)

// configs exercise both algorithm families: "small" sends everything down the
// latency path, "ring" everything of at least p elements down the ring, with
// tiny chunks so that every pipelining boundary is crossed.
var testConfigs = []struct {
	name string
	cfg  Config
}{
	{"small", Config{SmallMessageBytes: 1 << 30, ChunkBytes: 64, AbortTimeout: time.Second}},
	{"ring", Config{SmallMessageBytes: -1, ChunkBytes: 64, AbortTimeout: time.Second}},
}

var testSizes = []int{0, 1, 2, 3, 7, 8, 33, 100, 1001}

// testMeshes runs the reference tests over both an in-process mesh and real
// loopback TCP sockets.
var testMeshes = []struct {
	name string
	mk   meshFunc
}{
	{"inproc", inprocMesh},
	{"tcp", tcpMesh},
}

func inputs(dt DType, op ReduceOp, p, n int) [][]float64 {
	in := make([][]float64, p)
	for r := range in {
		in[r] = make([]float64, n)
		for i := range in[r] {
			in[r][i] = testValue(dt, op, r, i)
		}
	}
	return in
}

func TestAllreduceAgainstReference(t *testing.T) {
	for _, m := range testMeshes {
		for _, tc := range testConfigs {
			for p := 1; p <= 8; p++ {
				comms := newWorld(t, m.mk, p, tc.cfg)
				t.Run(fmt.Sprintf("%s/%s/p=%d", m.name, tc.name, p), func(t *testing.T) {
					for _, dt := range allDTypes {
						for _, op := range allOps {
							for _, n := range testSizes {
								for _, inPlace := range []bool{true, false} {
									checkAllreduce(t, comms, dt, op, n, inPlace, 1, 1)
								}
							}
						}
					}
				})
			}
		}
	}
}

func TestAllreduceScaling(t *testing.T) {
	scales := []struct{ pre, post float64 }{{2, 1}, {1, 0.5}, {0.5, 4}, {3, 1}}
	for _, tc := range testConfigs {
		for _, p := range []int{1, 3, 4} {
			comms := newWorld(t, inprocMesh, p, tc.cfg)
			t.Run(fmt.Sprintf("%s/p=%d", tc.name, p), func(t *testing.T) {
				for _, dt := range allDTypes {
					for _, op := range allOps {
						for _, s := range scales {
							checkAllreduce(t, comms, dt, op, 37, false, s.pre, s.post)
						}
					}
				}
			})
		}
	}
}

func checkAllreduce(t *testing.T, comms []*Communicator, dt DType, op ReduceOp, n int, inPlace bool, pre, post float64) {
	t.Helper()
	p := len(comms)
	in := inputs(dt, op, p, n)
	want := referenceReduce(dt, op, in, pre, post)
	sends := make([][]byte, p)
	recvs := make([][]byte, p)
	for r := range p {
		sends[r] = encode(dt, in[r])
		recvs[r] = sends[r]
		if !inPlace {
			recvs[r] = make([]byte, len(sends[r]))
		}
	}
	errs := onAll(t, comms, 20*time.Second, func(ctx context.Context, c *Communicator) error {
		r := c.Rank()
		return c.Allreduce(ctx, HostBuffer(dt, sends[r]), HostBuffer(dt, recvs[r]), op, Prescale(pre), Postscale(post))
	})
	what := fmt.Sprintf("allreduce %v %v n=%d inplace=%v pre=%v post=%v", dt, op, n, inPlace, pre, post)
	for r := range p {
		if errs[r] != nil {
			t.Fatalf("%s: rank %d: %v", what, r, errs[r])
		}
		if err := sameElems(dt, recvs[r], want); err != nil {
			t.Fatalf("%s: rank %d: %v", what, r, err)
		}
		if !bytes.Equal(recvs[r], recvs[0]) {
			t.Fatalf("%s: rank %d result differs bitwise from rank 0", what, r)
		}
		if !inPlace && !bytes.Equal(sends[r], encode(dt, in[r])) {
			t.Fatalf("%s: rank %d: send buffer modified", what, r)
		}
	}
}

func TestReduceScatterAgainstReference(t *testing.T) {
	for _, m := range testMeshes {
		for _, tc := range testConfigs {
			for p := 1; p <= 8; p++ {
				comms := newWorld(t, m.mk, p, tc.cfg)
				t.Run(fmt.Sprintf("%s/%s/p=%d", m.name, tc.name, p), func(t *testing.T) {
					for _, dt := range allDTypes {
						for _, op := range allOps {
							for _, n := range testSizes {
								for _, pre := range []float64{1, 2} {
									checkReduceScatter(t, comms, dt, op, n, pre)
								}
							}
						}
					}
				})
			}
		}
	}
}

func checkReduceScatter(t *testing.T, comms []*Communicator, dt DType, op ReduceOp, n int, pre float64) {
	t.Helper()
	p := len(comms)
	in := inputs(dt, op, p, n)
	want := referenceReduce(dt, op, in, pre, 1)
	counts := evenCounts(n, p)
	recvs := make([][]byte, p)
	errs := onAll(t, comms, 20*time.Second, func(ctx context.Context, c *Communicator) error {
		r := c.Rank()
		recvs[r] = make([]byte, counts[r]*dt.Size())
		return c.ReduceScatter(ctx, HostBuffer(dt, encode(dt, in[r])), HostBuffer(dt, recvs[r]), op, Prescale(pre))
	})
	off := 0
	for r := range p {
		if errs[r] != nil {
			t.Fatalf("reducescatter %v %v n=%d: rank %d: %v", dt, op, n, r, errs[r])
		}
		if err := sameElems(dt, recvs[r], want[off:off+counts[r]]); err != nil {
			t.Fatalf("reducescatter %v %v n=%d: rank %d: %v", dt, op, n, r, err)
		}
		off += counts[r]
	}
}

func TestBroadcast(t *testing.T) {
	for _, m := range testMeshes {
		for _, tc := range testConfigs {
			for p := 1; p <= 8; p++ {
				comms := newWorld(t, m.mk, p, tc.cfg)
				t.Run(fmt.Sprintf("%s/%s/p=%d", m.name, tc.name, p), func(t *testing.T) {
					for _, dt := range allDTypes {
						for _, n := range testSizes {
							for root := range p {
								want := encode(dt, inputs(dt, Sum, p, n)[root])
								bufs := make([][]byte, p)
								errs := onAll(t, comms, 20*time.Second, func(ctx context.Context, c *Communicator) error {
									r := c.Rank()
									bufs[r] = make([]byte, len(want))
									if r == root {
										copy(bufs[r], want)
									}
									return c.Broadcast(ctx, HostBuffer(dt, bufs[r]), root)
								})
								noErrors(t, errs)
								for r := range p {
									if !bytes.Equal(bufs[r], want) {
										t.Fatalf("broadcast %v n=%d root=%d: rank %d got wrong data", dt, n, root, r)
									}
								}
							}
						}
					}
				})
			}
		}
	}
}

func TestAllgather(t *testing.T) {
	for _, m := range testMeshes {
		for _, tc := range testConfigs {
			for p := 1; p <= 8; p++ {
				comms := newWorld(t, m.mk, p, tc.cfg)
				t.Run(fmt.Sprintf("%s/%s/p=%d", m.name, tc.name, p), func(t *testing.T) {
					for _, dt := range allDTypes {
						for _, n := range testSizes {
							for _, variable := range []bool{false, true} {
								counts := make([]int, p)
								for r := range counts {
									counts[r] = n
									if variable {
										counts[r] = (n + r*5) % (n + 3)
									}
								}
								var want []byte
								parts := make([][]byte, p)
								for r := range p {
									parts[r] = encode(dt, inputs(dt, Sum, p, counts[r])[r])
									want = append(want, parts[r]...)
								}
								recvs := make([][]byte, p)
								errs := onAll(t, comms, 20*time.Second, func(ctx context.Context, c *Communicator) error {
									r := c.Rank()
									recvs[r] = make([]byte, len(want))
									if variable {
										return c.AllgatherV(ctx, HostBuffer(dt, parts[r]), HostBuffer(dt, recvs[r]), counts)
									}
									return c.Allgather(ctx, HostBuffer(dt, parts[r]), HostBuffer(dt, recvs[r]))
								})
								noErrors(t, errs)
								for r := range p {
									if !bytes.Equal(recvs[r], want) {
										t.Fatalf("allgather %v counts=%v: rank %d got wrong data", dt, counts, r)
									}
								}
							}
						}
					}
				})
			}
		}
	}
}

func TestAlltoall(t *testing.T) {
	for _, m := range testMeshes {
		for p := 1; p <= 8; p++ {
			comms := newWorld(t, m.mk, p, Config{SmallMessageBytes: -1, ChunkBytes: 64, AbortTimeout: time.Second})
			t.Run(fmt.Sprintf("%s/p=%d", m.name, p), func(t *testing.T) {
				for _, dt := range allDTypes {
					for _, n := range []int{0, 1, 5, 100} {
						// count[i][j]: elements rank i sends to rank j.
						count := func(i, j int) int { return (n + i*3 + j*7) % (n + 2) }
						blocks := func(i, j int) []float64 {
							v := make([]float64, count(i, j))
							for k := range v {
								v[k] = float64((i*31 + j*17 + k) % 100)
							}
							return v
						}
						recvs := make([][]byte, p)
						wants := make([][]byte, p)
						errs := onAll(t, comms, 20*time.Second, func(ctx context.Context, c *Communicator) error {
							r := c.Rank()
							var send, want []byte
							sc, rc := make([]int, p), make([]int, p)
							for j := range p {
								send = append(send, encode(dt, blocks(r, j))...)
								want = append(want, encode(dt, blocks(j, r))...)
								sc[j], rc[j] = count(r, j), count(j, r)
							}
							recvs[r], wants[r] = make([]byte, len(want)), want
							return c.AlltoallV(ctx, HostBuffer(dt, send), sc, HostBuffer(dt, recvs[r]), rc)
						})
						noErrors(t, errs)
						for r := range p {
							if !bytes.Equal(recvs[r], wants[r]) {
								t.Fatalf("alltoallv %v n=%d: rank %d got wrong data", dt, n, r)
							}
						}
					}
				}
			})
		}
	}
}

func TestBarrier(t *testing.T) {
	for p := 1; p <= 8; p++ {
		comms := newWorld(t, inprocMesh, p, DefaultConfig())
		for range 3 {
			noErrors(t, onAll(t, comms, 10*time.Second, func(ctx context.Context, c *Communicator) error {
				return c.Barrier(ctx)
			}))
		}
	}
}

func TestTypedAPI(t *testing.T) {
	comms := newWorld(t, inprocMesh, 3, DefaultConfig())
	errs := onAll(t, comms, 10*time.Second, func(ctx context.Context, c *Communicator) error {
		x := []float32{1, 2, float32(c.Rank())}
		if err := Allreduce(ctx, c, x, x, Average); err != nil {
			return err
		}
		if x[0] != 1 || x[1] != 2 || x[2] != 1 {
			return fmt.Errorf("typed allreduce got %v", x)
		}
		h := []F16{NewF16(0.5), NewF16(float32(c.Rank()))}
		if err := Allreduce(ctx, c, h, h, Sum); err != nil {
			return err
		}
		if h[0].Float32() != 1.5 || h[1].Float32() != 3 {
			return fmt.Errorf("typed float16 allreduce got %v", h)
		}
		all := make([]int64, 3)
		if err := Allgather(ctx, c, []int64{int64(c.Rank() * 10)}, all); err != nil {
			return err
		}
		if all[0] != 0 || all[1] != 10 || all[2] != 20 {
			return fmt.Errorf("typed allgather got %v", all)
		}
		return nil
	})
	noErrors(t, errs)
}

func TestLocalArgumentErrors(t *testing.T) {
	comms := newWorld(t, inprocMesh, 2, DefaultConfig())
	c := comms[0]
	ctx := context.Background()
	f := make([]byte, 16)
	cases := []struct {
		name string
		call func() error
	}{
		{"count mismatch", func() error { return c.Allreduce(ctx, HostBuffer(Float32, f), HostBuffer(Float32, f[:8]), Sum) }},
		{"dtype mismatch", func() error {
			return c.Allreduce(ctx, HostBuffer(Float32, f), HostBuffer(Int32, make([]byte, 16)), Sum)
		}},
		{"bad op", func() error { return c.Allreduce(ctx, HostBuffer(Float32, f), HostBuffer(Float32, f), ReduceOp(99)) }},
		{"bad dtype", func() error { return c.Allreduce(ctx, Buffer{DType: 0, Count: 1}, Buffer{DType: 0, Count: 1}, Sum) }},
		{"short host bytes", func() error {
			return c.Allreduce(ctx, Buffer{DType: Float32, Count: 5, Host: f}, HostBuffer(Float32, f), Sum)
		}},
		{"overlap", func() error { return c.Allreduce(ctx, HostBuffer(Float32, f[:8]), HostBuffer(Float32, f[4:12]), Sum) }},
		{"nan scale", func() error {
			return c.Allreduce(ctx, HostBuffer(Float32, f), HostBuffer(Float32, f), Sum, Postscale(nan()))
		}},
		{"bad root", func() error { return c.Broadcast(ctx, HostBuffer(Float32, f), 2) }},
		{"allgather size", func() error { return c.Allgather(ctx, HostBuffer(Float32, f), HostBuffer(Float32, f)) }},
		{"alltoall indivisible", func() error { return c.Alltoall(ctx, HostBuffer(Uint8, f[:3]), HostBuffer(Uint8, make([]byte, 3))) }},
		{"reducescatter counts", func() error {
			return c.ReduceScatterV(ctx, HostBuffer(Float32, f), HostBuffer(Float32, f[:4]), []int{1, 1}, Sum)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); err == nil {
				t.Fatal("no error")
			}
		})
	}
	// Argument errors are caught before anything is sent: the world still works.
	noErrors(t, onAll(t, comms, 5*time.Second, func(ctx context.Context, c *Communicator) error {
		return c.Barrier(ctx)
	}))
}

func nan() float64 { return math.NaN() }

func TestMaxTagAgreesAcrossRanks(t *testing.T) {
	for _, m := range testMeshes {
		for _, tc := range testConfigs {
			for _, p := range []int{1, 2, 3, 5, 8} {
				comms := newWorld(t, m.mk, p, tc.cfg)
				for _, n := range []int{0, 1, 1000} {
					tags := make([]uint64, p)
					errs := onAll(t, comms, 10*time.Second, func(ctx context.Context, c *Communicator) error {
						tags[c.Rank()] = uint64(10 + (c.Rank()*7)%p) // the largest sits anywhere
						buf := make([]float32, n)
						return Allreduce(ctx, c, buf, buf, Sum, MaxTag(&tags[c.Rank()]))
					})
					noErrors(t, errs)
					want := uint64(0)
					for r := range p {
						want = max(want, uint64(10+(r*7)%p))
					}
					for r, got := range tags {
						if got != want {
							t.Fatalf("%s/%s p=%d n=%d: rank %d tag %d, want %d", m.name, tc.name, p, n, r, got, want)
						}
					}
				}
			}
		}
	}
}
