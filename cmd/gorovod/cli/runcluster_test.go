package cli

import (
	"context"
	"net"
	"strconv"
	"testing"

	"github.com/gorovod/gorovod/job"
	"github.com/gorovod/gorovod/membership"
)

// TestDriverBindsItsPodIP: `gorovod run --kubernetes` in a pod (the driver
// pod the gorovod scheduler makes, driver.yaml's) binds its driver's gossip
// to the pod IP (GOROVOD_POD_IP) and --kubernetes-gossip-port, where the
// workers in other pods reach it, after the host options have chosen their
// default, loopback; an address given with --gossip-addr stays, and so does
// loopback outside a pod or before the pod has an IP. A driver that takes a
// job back at its pod IP binds the workers' seed only there
// (job.Adoption.OwnAddr).
func TestDriverBindsItsPodIP(t *testing.T) {
	for _, tc := range []struct {
		name    string
		hosts   hostOptions
		podIP   string
		adopt   bool
		want    string
		ownAddr bool
	}{
		{"a pod", hostOptions{}, "198.18.0.7", false, "198.18.0.7:7946", false},
		{"a pod taking a job back", hostOptions{}, "198.18.0.7", true, "198.18.0.7:7946", true},
		{"a host-network pod of a test node", hostOptions{}, "127.0.0.3", true, "127.0.0.3:7946", true},
		{"no pod IP", hostOptions{}, "", true, "127.0.0.1:0", false},
		{"--gossip-addr", hostOptions{gossipAddr: "198.18.0.9:5000"}, "198.18.0.7", true, "198.18.0.9:5000", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := job.Config{Gossip: membership.DefaultConfig()}
			if tc.adopt {
				cfg.Adopt = &job.Adoption{}
			}
			if err := tc.hosts.gossip(context.Background(), &cfg, func(string) {}); err != nil {
				t.Fatal(err)
			}
			c := clusterOptions{kubeGossipPort: kubeGossipPort}
			c.podGossip(&cfg, tc.podIP)
			if got := net.JoinHostPort(cfg.Gossip.BindAddr, strconv.Itoa(cfg.Gossip.BindPort)); got != tc.want {
				t.Errorf("the driver binds %s, want %s", got, tc.want)
			}
			if tc.adopt && cfg.Adopt.OwnAddr != tc.ownAddr {
				t.Errorf("OwnAddr %v, want %v", cfg.Adopt.OwnAddr, tc.ownAddr)
			}
		})
	}
}
