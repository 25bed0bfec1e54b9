package job_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"testing"

	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/job"
	"github.com/gorovod/gorovod/membership"
	"github.com/gorovod/gorovod/sync/driver"
)

// TestAdoptingBindsItsOwnAddress: where a runner that takes a job back
// binds its driver. A runner whose own address is known (Adoption.OwnAddr,
// a driver pod's IP) binds the workers' seed only when the seed is at that
// address: a pod on another node listens at its own IP and contacts the
// workers, even though this host would let it bind the seed (127.0.0.2
// and 127.0.0.3 are both this host's, as the test cluster's nodes are). At
// its own IP with the seed's port taken, it listens at another port. A
// runner whose address is only a default (`gorovod run --attach`) tries the
// seed first, as before. Every attempt contacts the recorded workers.
func TestAdoptingBindsItsOwnAddress(t *testing.T) {
	const seed = "127.0.0.2:7946"
	contact := []string{"127.0.0.3:41000", "127.0.0.2:41001"}
	for _, tc := range []struct {
		name    string
		own     membership.Config
		ownAddr bool
		taken   string   // the address another process has
		want    []string // the addresses tried, in order
	}{
		{"a pod on another node", membership.Config{BindAddr: "127.0.0.3", BindPort: 7946}, true, "", []string{"127.0.0.3:7946"}},
		{"a pod at the seed's IP", membership.Config{BindAddr: "127.0.0.2", BindPort: 7946}, true, "", []string{seed}},
		{"a pod at the seed's IP, its port taken", membership.Config{BindAddr: "127.0.0.2", BindPort: 7946}, true, seed, []string{seed, "127.0.0.2:0"}},
		{"an address that is only a default", membership.Config{BindAddr: "127.0.0.3"}, false, "", []string{seed}},
		{"a default address, the seed's port taken", membership.Config{BindAddr: "127.0.0.3"}, false, seed, []string{seed, "127.0.0.3:0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := envconfig.ElasticWorker{JobID: "job-own", Secret: []byte("0123456789abcdef"), Seeds: []string{seed}, MinWorkers: 1}.Environ()
			var tried []string
			cfg := job.Config{Argv: []string{"true"}, Workers: 1, Gossip: tc.own,
				Adopt: &job.Adoption{Dir: t.TempDir(), Env: env, Contact: contact, OwnAddr: tc.ownAddr},
				StartDriver: func(_ context.Context, dc driver.Config) (job.Driver, error) {
					addr := net.JoinHostPort(dc.Membership.BindAddr, strconv.Itoa(dc.Membership.BindPort))
					tried = append(tried, addr)
					if !slices.Equal(dc.Contact, contact) {
						t.Errorf("the driver at %s contacts %v, want the recorded workers %v", addr, dc.Contact, contact)
					}
					if addr == tc.taken {
						return nil, fmt.Errorf("listen tcp %s: bind: address already in use", addr)
					}
					return &fakeDriver{finished: make(chan struct{})}, nil
				}}
			// No worker of the record runs: Start fails once the driver
			// is up, which is all this test looks at.
			if _, err := job.Start(context.Background(), cfg); err == nil {
				t.Fatal("a job with no worker running was taken back")
			}
			if !slices.Equal(tried, tc.want) {
				t.Fatalf("the driver was started at %v, want %v", tried, tc.want)
			}
		})
	}
}
