package netaddr_test

import (
	"net"
	"testing"

	"github.com/gorovod/gorovod/internal/netaddr"
	"github.com/gorovod/gorovod/internal/testing/testhosts"
)

// TestOnSeparateHosts: inside a host, its interface's address, and the
// route to another host, are the host's own address.
func TestOnSeparateHosts(t *testing.T) {
	_, hs := testhosts.NewHosts(t, testhosts.Config{}, 2)
	err := hs[0].Do(func() error {
		if a, err := netaddr.InterfaceAddr("eth0"); err != nil || a != hs[0].Addr {
			t.Errorf("eth0 of %s: %v, %v", hs[0], a, err)
		}
		if a, err := netaddr.RouteTo(net.JoinHostPort(hs[1].Addr.String(), "7946")); err != nil || a != hs[0].Addr {
			t.Errorf("route from %s to %s: %v, %v", hs[0], hs[1], a, err)
		}
		if a, err := netaddr.Pick("", hs[1].Addr.String()+":1"); err != nil || a != hs[0].Addr {
			t.Errorf("Pick toward %s: %v, %v", hs[1], a, err)
		}
		if _, err := netaddr.RouteTo("198.19.0.1:1"); err == nil {
			t.Error("a route out of the harness's network")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
