package netaddr

import (
	"net"
	"net/netip"
	"testing"
)

type addr string

func (a addr) Network() string { return "ip+net" }
func (a addr) String() string  { return string(a) }

func TestPick(t *testing.T) {
	cases := []struct {
		flags net.Flags
		addrs []string
		want  string
	}{
		{net.FlagUp, []string{"fe80::1/64", "2001:db8::5/64", "198.18.0.2/24"}, "198.18.0.2"},
		{net.FlagUp, []string{"fe80::1/64", "2001:db8::5/64"}, "2001:db8::5"},
		{net.FlagUp, []string{"127.0.0.1/8"}, "127.0.0.1"},
		{net.FlagUp, []string{"fe80::1/64", "169.254.3.4/16"}, ""},
		{net.FlagUp, nil, ""},
		{0, []string{"198.18.0.2/24"}, ""},
	}
	for _, c := range cases {
		var as []net.Addr
		for _, a := range c.addrs {
			as = append(as, addr(a))
		}
		got, err := pick("eth9", c.flags, as)
		if c.want == "" {
			if err == nil {
				t.Errorf("%v %v: picked %v", c.flags, c.addrs, got)
			}
			continue
		}
		if err != nil || got.String() != c.want {
			t.Errorf("%v %v: %v, %v; want %s", c.flags, c.addrs, got, err, c.want)
		}
	}
}

func TestInterfacesAndRoutes(t *testing.T) {
	lo, err := InterfaceAddr("lo")
	if err != nil || lo != netip.MustParseAddr("127.0.0.1") {
		t.Errorf("lo: %v, %v", lo, err)
	}
	if a, err := FirstInterfaceAddr("nosuch0, lo"); err != nil || a != lo {
		t.Errorf("nosuch0,lo: %v, %v", a, err)
	}
	if _, err := FirstInterfaceAddr("nosuch0,nosuch1"); err == nil {
		t.Error("missing interfaces accepted")
	}
	if _, err := FirstInterfaceAddr(" , "); err == nil {
		t.Error("an empty list accepted")
	}
	if a, err := RouteTo("127.0.0.1:5000"); err != nil || !a.IsLoopback() {
		t.Errorf("route to loopback from %v, %v", a, err)
	}
	if a, err := Pick("", "127.0.0.1:7946"); err != nil || a.String() != "127.0.0.1" {
		t.Errorf("Pick for a local peer: %v, %v", a, err)
	}
	if a, err := Pick("lo", "198.18.0.9:1"); err != nil || a.String() != "127.0.0.1" {
		t.Errorf("Pick with an interface: %v, %v", a, err)
	}
	for target, want := range map[string]bool{"localhost:1": true, "127.0.0.5": true, "[::1]:80": true, "h1:22": false, "198.18.0.2": false} {
		if IsLoopback(target) != want {
			t.Errorf("IsLoopback(%q) = %v", target, !want)
		}
	}
}
