package multi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/multi"
	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/internal/testing/testhosts"
	"github.com/gorovod/gorovod/job/launch"
	"github.com/gorovod/gorovod/job/rendezvous"
)

// envWorker makes this test binary a worker of TestAutoAcrossHosts; its value
// is the Remote mode.
const envWorker = "GOROVOD_MULTI_TEST_WORKER"

func TestMain(m *testing.M) {
	if remote := os.Getenv(envWorker); remote != "" {
		if err := hostWorker(multi.Mode(remote)); err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

type workerReport struct {
	Rank  int
	Addr  string
	Links []string // kind of link to each rank ("" for itself)
	Sum   []float32
}

// hostWorker joins the world through the launcher's rendezvous, says which
// kind of link reaches each peer, and allreduces a vector over them.
func hostWorker(remote multi.Mode) error {
	env, err := envconfig.Load(os.Getenv)
	if err != nil {
		return err
	}
	cfg := multi.DefaultConfig()
	cfg.Mode, cfg.Remote, cfg.ListenAddr, cfg.Secret = multi.Auto, remote, env.ListenAddr, env.Secret
	cfg.SHM.RingBytes = 1 << 20
	tr, err := multi.Listen(cfg)
	if err != nil {
		return err
	}
	defer tr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addrs, err := rendezvous.Join(ctx, env.Rendezvous, env.Rank, tr.Addr())
	if err != nil {
		return err
	}
	world := transport.World{JobID: env.JobID, Epoch: 1, Rank: env.Rank, Addrs: addrs}
	links, err := tr.Connect(ctx, world)
	if err != nil {
		return err
	}
	rep := workerReport{Rank: env.Rank, Addr: tr.Addr(), Links: make([]string, len(links))}
	for i, l := range links {
		if l != nil {
			rep.Links[i] = kind(l)
			l.Close()
		}
	}
	// The collectives over a fresh world of the same transport.
	world.Epoch = 2
	comm, err := collective.New(ctx, tr, world, collective.DefaultConfig())
	if err != nil {
		return err
	}
	defer comm.Close()
	rep.Sum = make([]float32, 1<<16)
	for i := range rep.Sum {
		rep.Sum[i] = float32(env.Rank*len(rep.Sum) + i)
	}
	if err := collective.Allreduce(ctx, comm, rep.Sum, rep.Sum, collective.Sum); err != nil {
		return err
	}
	rep.Sum = rep.Sum[:4]
	return json.NewEncoder(os.Stdout).Encode(rep)
}

func kind(l transport.Link) string {
	t := fmt.Sprintf("%T", l)
	for _, k := range []string{"shm", "tcp", "sctp"} {
		if strings.Contains(t, k+".") {
			return k
		}
	}
	return t
}

// TestAutoAcrossHosts: workers started over ssh on two hosts with two slots
// each, auto transport: the pairs on one host share memory, the pairs across
// hosts use the network transport (TCP, or SCTP when asked), and an
// allreduce over that mixed world is right.
func TestAutoAcrossHosts(t *testing.T) {
	n, hs := testhosts.NewHosts(t, testhosts.Config{}, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prefix, err := hs[0].Exec()
	if err != nil {
		t.Fatal(err)
	}
	ssh := launch.SSH{Command: append(prefix, append([]string{"ssh"}, n.SSHArgs()...)...)}
	for _, remote := range []multi.Mode{multi.TCP, multi.SCTP} {
		t.Run(string(remote), func(t *testing.T) {
			ln, err := hs[0].Listen("tcp", ":0")
			if err != nil {
				t.Fatal(err)
			}
			rdv, err := rendezvous.Serve(ln, 4)
			if err != nil {
				t.Fatal(err)
			}
			defer rdv.Close()
			secret := launch.NewSecret()
			var mu sync.Mutex
			reports := map[int]workerReport{}
			var out []string
			j, err := launch.Start(ctx, launch.Spec{
				Argv: []string{os.Args[0]}, NP: 4, SSH: ssh, HostSlots: func(string) int { return 2 },
				Host: func(i int) string { return hs[i/2].Name },
				Env: func(i int) []string {
					w := envconfig.Worker{JobID: "auto-hosts-" + string(remote), Rank: i, Size: 4, Secret: secret, Rendezvous: rdv.Addr()}
					return append(w.Environ(), envWorker+"="+string(remote))
				},
				Output: func(i int, stream string, line []byte) {
					mu.Lock()
					defer mu.Unlock()
					var r workerReport
					if stream == "stdout" && json.Unmarshal(line, &r) == nil {
						reports[i] = r
						return
					}
					out = append(out, fmt.Sprintf("[%d] %s", i, line))
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := j.Wait(); err != nil {
				t.Fatalf("%v\n%s", err, strings.Join(out, "\n"))
			}
			n := float32(1 << 16)
			for r := range 4 {
				rep, ok := reports[r]
				if !ok {
					t.Fatalf("no report from rank %d", r)
				}
				if host := hs[r/2].Addr.String(); !strings.HasPrefix(rep.Addr, host+":") {
					t.Errorf("rank %d listens at %s, not on its host %s", r, rep.Addr, host)
				}
				for p, k := range rep.Links {
					want := string(remote)
					switch {
					case p == r:
						want = ""
					case p/2 == r/2:
						want = "shm"
					}
					if k != want {
						t.Errorf("rank %d reaches rank %d over %q, want %q", r, p, k, want)
					}
				}
				for i, v := range rep.Sum {
					// Σ_r (r·n + i) over 4 ranks = 6n + 4i.
					if want := 6*n + 4*float32(i); v != want {
						t.Errorf("rank %d: sum[%d] = %v, want %v", r, i, v, want)
					}
				}
			}
			t.Logf("links of rank 0: %q", reports[0].Links)
		})
	}
}
