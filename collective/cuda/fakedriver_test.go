package cuda

// Device and Memory through their whole driver path without a GPU, against
// internal/testing/fakecuda: a libcuda stand-in built here with gcc, whose
// device memory is host memory at moved addresses, whose streams run their
// work at once, and which runs float32's sum and scale kernels. What it
// checks is the plumbing a GPU cannot be asked about here: each driver
// function reached by its exported name with cuda.h's parameter order, the
// lanes, the staging buffers, events, Wrap's checks, errors, Close. The
// kernels' arithmetic and real devices are cuda_test.go's (tag cuda, on a
// GPU).

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/internal/testing/fakecuda"
)

// openFake builds the fake driver (internal/testing/fakecuda, with the gcc
// flags given) and opens its device 0.
func openFake(t *testing.T, cflags ...string) *Device {
	t.Helper()
	cfg := DefaultDeviceConfig()
	cfg.Driver = fakecuda.Build(t, cflags...)
	d, err := NewDeviceConfig(context.Background(), 0, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return d
}

func float32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func randomFloat32s(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.IntN(2001)-1000) / 8 // exact in float32, sums exact too
	}
	return v
}

func TestFakeDriverMemory(t *testing.T) {
	d := openFake(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	if name, err := d.Name(); err != nil || name != "gorovod fake GPU" {
		t.Fatalf("Name: %q, %v", name, err)
	}

	tests := []struct {
		name string
		run  func(t *testing.T)
	}{{
		name: "copies to, from and within the device",
		run: func(t *testing.T) {
			const n = 1 << 20
			in := make([]byte, n)
			for i := range in {
				in[i] = byte(rng.Uint32())
			}
			m, err := d.Alloc(ctx, n)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Free()
			if err := m.CopyFromHost(ctx, 0, in); err != nil {
				t.Fatal(err)
			}
			// Overlapping ranges of one memory go through a staging buffer.
			want := append([]byte(nil), in...)
			copy(want[100:], want[:n/2])
			if err := m.CopyFrom(ctx, 100, m, 0, n/2); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, n)
			if err := m.CopyToHost(ctx, got, 0); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatal("the device's bytes differ from the host's copies")
			}
		},
	}, {
		name: "reduce from host and scale, float32",
		run: func(t *testing.T) {
			a, b := randomFloat32s(rng, 3000), randomFloat32s(rng, 3000)
			m, err := d.Alloc(ctx, 4*len(a))
			if err != nil {
				t.Fatal(err)
			}
			defer m.Free()
			if err := m.CopyFromHost(ctx, 0, float32Bytes(a)); err != nil {
				t.Fatal(err)
			}
			if err := m.ReduceFromHost(ctx, 0, m, 0, float32Bytes(b), collective.Float32, collective.Sum); err != nil {
				t.Fatal(err)
			}
			if err := m.Scale(ctx, 0, 4*len(a), collective.Float32, 0.5, 1); err != nil {
				t.Fatal(err)
			}
			want := make([]float32, len(a))
			for i := range a {
				want[i] = (a[i] + b[i]) * 0.5
			}
			got := make([]byte, 4*len(a))
			if err := m.CopyToHost(ctx, got, 0); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, float32Bytes(want)) {
				t.Fatal("(a + b) * 0.5 on the device differs from the host's")
			}
		},
	}, {
		name: "a kernel the driver refuses",
		run: func(t *testing.T) {
			m, err := d.Alloc(ctx, 16)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Free()
			err = m.ReduceFromHost(ctx, 0, m, 0, make([]byte, 16), collective.Int32, collective.Sum)
			var de *DriverError
			if !errors.As(err, &de) || de.Op != "cuLaunchKernel(gorovod_sum_int32)" ||
				!strings.Contains(err.Error(), "CUDA_ERROR_NOT_SUPPORTED (CUDA error 801)") {
				t.Fatalf("got %v, want the launch's DriverError named by the driver", err)
			}
		},
	}, {
		name: "wrap",
		run: func(t *testing.T) {
			m, err := d.Alloc(ctx, 64)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Free()
			w, err := d.Wrap(ctx, m.Ptr()+16, 48)
			if err != nil {
				t.Fatalf("Wrap of device memory: %v", err)
			}
			if err := w.CopyFromHost(ctx, 0, []byte("wrapped")); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, 7)
			if err := m.CopyToHost(ctx, got, 16); err != nil || string(got) != "wrapped" {
				t.Fatalf("the wrapped memory's bytes: %q, %v", got, err)
			}
			var ue *UsageError
			if _, err := d.Wrap(ctx, m.Ptr()+16, 49); !errors.As(err, &ue) || !strings.Contains(err.Error(), "past the end") {
				t.Errorf("Wrap past the allocation: got %v, want a UsageError", err)
			}
			host := make([]byte, 8)
			var de *DriverError
			if _, err := d.Wrap(ctx, uintptrOf(host), 8); !errors.As(err, &de) || !strings.Contains(err.Error(), "not CUDA device memory") {
				t.Errorf("Wrap of host memory: got %v, want a DriverError saying it is not device memory", err)
			}
		},
	}, {
		name: "wait for a recorded event",
		run: func(t *testing.T) {
			ev, err := d.drv.eventCreate(eventDisableTiming)
			if err != nil {
				t.Fatal(err)
			}
			defer d.drv.eventDestroy(ev)
			// Not recorded: the fake's query says not ready until it is.
			wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			err = d.WaitEvent(wctx, ev)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("WaitEvent before the record: got %v, want the context's deadline", err)
			}
			if err := d.drv.eventRecord(ev, 0); err != nil {
				t.Fatal(err)
			}
			wctx, cancel = context.WithTimeout(ctx, time.Minute)
			defer cancel()
			if err := d.WaitEvent(wctx, ev); err != nil {
				t.Fatalf("WaitEvent after the record: %v", err)
			}
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, tt.run)
	}
}

// TestFakeDriverAllreduce runs the collectives' ring and recursive doubling
// on Memory of the fake driver's device, against the same allreduce on host
// memory.
func TestFakeDriverAllreduce(t *testing.T) {
	d := openFake(t)
	rng := rand.New(rand.NewPCG(3, 4))
	cfg := collective.DefaultConfig()
	for _, p := range []int{2, 3} {
		for _, count := range []int{37, cfg.SmallMessageBytes/4 + 1001} {
			t.Run(fmt.Sprintf("p=%d/%d", p, count), func(t *testing.T) {
				in := make([][]byte, p)
				for r := range in {
					in[r] = float32Bytes(randomFloat32s(rng, count))
				}
				host := hostAllreduce(t, p, cfg, collective.Float32, in, collective.Average)
				dev := runWorld(t, p, cfg, func(ctx context.Context, c *collective.Communicator) ([]byte, error) {
					m, err := uploadRank(ctx, d, in[c.Rank()])
					if err != nil {
						return nil, err
					}
					defer m.Free()
					buf := collective.Buffer{DType: collective.Float32, Count: count, Device: m}
					if err := c.Allreduce(ctx, buf, buf, collective.Average); err != nil {
						return nil, err
					}
					out := make([]byte, m.Size())
					return out, m.CopyToHost(ctx, out, 0)
				})
				for r := range p {
					if !bytes.Equal(dev[r], host[r]) {
						t.Fatalf("rank %d: the allreduce on device memory differs from the one on host memory", r)
					}
				}
			})
		}
	}
}

// TestFakeDriverSameHostGroup: a SameHostGroup of in-process ranks on the
// fake driver, whose IPC handles open within the process, reduces GPU to
// GPU (exporting, mapping, the peers' kernels and copies into their
// buffers), in place and out of place, reusing the mappings; where the
// driver cannot export (-DFAKE_NO_IPC) every rank takes the staged path
// and says why. Both against the same allreduce on host memory.
func TestFakeDriverSameHostGroup(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cflags  []string
		wantIPC bool
	}{
		{name: "ipc", wantIPC: true},
		{name: "no ipc", cflags: []string{"-DFAKE_NO_IPC"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := openFake(t, tc.cflags...)
			rng := rand.New(rand.NewPCG(5, 6))
			cfg := collective.DefaultConfig()
			for _, p := range []int{2, 3} {
				const count = 5000
				in := make([][]byte, p)
				for r := range in {
					in[r] = float32Bytes(randomFloat32s(rng, count))
				}
				host := hostAllreduce(t, p, cfg, collective.Float32, in, collective.Average)
				dev := runWorld(t, p, cfg, func(ctx context.Context, c *collective.Communicator) ([]byte, error) {
					g, err := NewSameHostGroup(ctx, c, d, SameHostConfig{MaxMapped: 8})
					if err != nil {
						return nil, err
					}
					defer g.Close()
					if g.IPC() != tc.wantIPC {
						return nil, fmt.Errorf("IPC %v (%s), want %v", g.IPC(), g.Reason(), tc.wantIPC)
					}
					if !tc.wantIPC && !strings.Contains(g.Reason(), "CUDA_ERROR_NOT_SUPPORTED") {
						return nil, fmt.Errorf("the reason for the staged path does not name the driver's error: %q", g.Reason())
					}
					m, err := d.Alloc(ctx, len(in[c.Rank()]))
					if err != nil {
						return nil, err
					}
					defer m.Free()
					out, err := d.Alloc(ctx, len(in[c.Rank()]))
					if err != nil {
						return nil, err
					}
					defer out.Free()
					got, last := make([]byte, m.Size()), []byte(nil)
					// Out of place, then in place twice on the same memory
					// (the second reuses the first's mappings), each from
					// the rank's input.
					for k, dst := range []*Memory{out, m, m} {
						if err := m.CopyFromHost(ctx, 0, in[c.Rank()]); err != nil {
							return nil, err
						}
						send := collective.Buffer{DType: collective.Float32, Count: count, Device: m}
						recv := send
						recv.Device = dst
						if err := g.Allreduce(ctx, send, recv, collective.Average); err != nil {
							return nil, fmt.Errorf("allreduce %d: %w", k, err)
						}
						if err := dst.CopyToHost(ctx, got, 0); err != nil {
							return nil, err
						}
						if k > 0 && !bytes.Equal(got, last) {
							return nil, fmt.Errorf("allreduce %d differs from the first", k)
						}
						last = append(last[:0], got...)
					}
					st := g.Stats()
					if tc.wantIPC && (st.IPC != 3 || st.Host != 0) || !tc.wantIPC && (st.IPC != 0 || st.Host != 3) {
						return nil, fmt.Errorf("stats %+v: the calls did not all go the group's way", st)
					}
					return got, nil
				})
				for r := range p {
					if !bytes.Equal(dev[r], host[r]) {
						t.Fatalf("p=%d rank %d: the group's allreduce differs from the host's", p, r)
					}
				}
			}
		})
	}
}

func TestFakeDriverClose(t *testing.T) {
	d := openFake(t)
	ctx := context.Background()
	m, err := d.Alloc(ctx, 64)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Free(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
	if _, err := d.Alloc(ctx, 64); !errors.Is(err, ErrClosed) {
		t.Errorf("Alloc after Close: got %v, want ErrClosed", err)
	}
	if err := d.WaitEvent(ctx, 1); !errors.Is(err, ErrClosed) {
		t.Errorf("WaitEvent after Close: got %v, want ErrClosed", err)
	}
}

// uintptrOf is the address of b's first byte.
func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }
