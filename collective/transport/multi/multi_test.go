package multi_test

import (
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/conformance"
	"github.com/gorovod/gorovod/collective/transport/multi"
)

func TestParseMode(t *testing.T) {
	for in, want := range map[string]multi.Mode{"": multi.Auto, "auto": multi.Auto, "TCP": multi.TCP, " shm ": multi.SHM, "sctp": multi.SCTP} {
		if got, err := multi.ParseMode(in); err != nil || got != want {
			t.Errorf("ParseMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := multi.ParseMode("carrier-pigeon"); err == nil {
		t.Error("ParseMode accepted an unknown transport")
	}
}

// factory makes transports of cfg's mode; hosts, when set, gives each new
// transport the next host identity in turn, so that one machine plays several
// hosts and worlds mix shared-memory and network pairs.
func factory(mode, remote multi.Mode, hosts ...string) conformance.Factory {
	var n atomic.Int64
	return conformance.Factory{
		New: func(t testing.TB, o conformance.Options) transport.Transport {
			cfg := multi.DefaultConfig()
			cfg.Mode, cfg.Remote = mode, remote
			cfg.Secret, cfg.IOTimeout, cfg.HandshakeTimeout = o.Secret, o.IOTimeout, o.HandshakeTimeout
			cfg.TCP.SpinTime, cfg.SHM.SpinTime = o.SpinTime, o.SpinTime
			cfg.SHM.RingBytes = 1 << 20 // keep /dev/shm use low
			if len(hosts) > 0 {
				cfg.SHM.HostID = hosts[int(n.Add(1))%len(hosts)]
			}
			tr, err := multi.Listen(cfg)
			if err != nil {
				t.Fatalf("Listen: %v", err)
			}
			t.Cleanup(func() { tr.Close() })
			return tr
		},
		Packages: []string{"collective/transport/shm.", "collective/transport/tcp.", "collective/transport/sctp.", "collective/transport/internal/mesh.", "github.com/pion/"},
	}
}

// checkShmEmpty fails the test if files this process created (its pid is in
// every name) are left in /dev/shm; other processes' setups may be in flight.
func checkShmEmpty(t *testing.T) {
	t.Cleanup(func() {
		entries, _ := os.ReadDir("/dev/shm")
		for _, e := range entries {
			f := strings.Split(e.Name(), "-")
			if strings.HasPrefix(e.Name(), "gorovod-shm-") && len(f) > 6 && f[6] == strconv.Itoa(os.Getpid()) {
				t.Errorf("left in /dev/shm: %s", e.Name())
			}
		}
	})
}

// TestConformance runs the suite over the selector: on one host (every pair
// on shared memory), over two pretend hosts (pairs mixed between shared memory
// and TCP, or SCTP), and with TCP forced.
func TestConformance(t *testing.T) {
	for _, tc := range []struct {
		name         string
		mode, remote multi.Mode
		hosts        []string
	}{
		{"auto one host", multi.Auto, multi.TCP, nil},
		{"auto two hosts over TCP", multi.Auto, multi.TCP, []string{"host-a", "host-b"}},
		{"auto two hosts over SCTP", multi.Auto, multi.SCTP, []string{"host-a", "host-b"}},
		{"forced TCP", multi.TCP, multi.TCP, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if testing.Short() && tc.remote == multi.SCTP {
				t.Skip("SCTP is slow to connect; skipped in -short")
			}
			checkShmEmpty(t)
			conformance.Run(t, factory(tc.mode, tc.remote, tc.hosts...))
		})
	}
}

func TestListenErrors(t *testing.T) {
	cfg := multi.DefaultConfig()
	cfg.Mode = "pigeon"
	if _, err := multi.Listen(cfg); err == nil {
		t.Error("Listen of an unknown mode succeeded")
	}
	cfg = multi.DefaultConfig()
	cfg.Secret = []byte("s")
	cfg.Remote = multi.SHM
	if _, err := multi.Listen(cfg); err == nil {
		t.Error("Listen with shared memory as the remote transport succeeded")
	}
	for _, m := range multi.Modes() {
		cfg := multi.DefaultConfig()
		cfg.Mode = m // no secret
		if tr, err := multi.Listen(cfg); err == nil {
			tr.Close()
			t.Errorf("mode %s: Listen without a secret succeeded", m)
		}
	}
}
