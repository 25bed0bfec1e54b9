package netaddr

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// InterfaceAddr returns the address of the interface called name to bind
// to: its first global unicast IPv4 address, else its first global unicast
// IPv6 address (link-local addresses need a zone, which the transports do
// not carry).
func InterfaceAddr(name string) (netip.Addr, error) {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("network interface %q: %w", name, err)
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("network interface %q: %w", name, err)
	}
	return pick(name, ifc.Flags, addrs)
}

func pick(name string, flags net.Flags, addrs []net.Addr) (netip.Addr, error) {
	if flags&net.FlagUp == 0 {
		return netip.Addr{}, fmt.Errorf("network interface %q is down", name)
	}
	var v6 netip.Addr
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a.String())
		if err != nil {
			continue
		}
		ip := p.Addr().Unmap()
		if !ip.IsGlobalUnicast() && !ip.IsLoopback() {
			continue
		}
		if ip.Is4() {
			return ip, nil
		}
		if !v6.IsValid() {
			v6 = ip
		}
	}
	if v6.IsValid() {
		return v6, nil
	}
	return netip.Addr{}, fmt.Errorf("network interface %q has no usable address", name)
}

// FirstInterfaceAddr takes a comma-separated list of interface names (as
// Horovod's --network-interface does: hosts may name their interfaces
// differently) and returns the address of the first that exists here and
// has one.
func FirstInterfaceAddr(names string) (netip.Addr, error) {
	var errs []error
	for name := range strings.SplitSeq(names, ",") {
		if name = strings.TrimSpace(name); name == "" {
			continue
		}
		a, err := InterfaceAddr(name)
		if err == nil {
			return a, nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return netip.Addr{}, fmt.Errorf("no network interface named in %q", names)
	}
	return netip.Addr{}, errors.Join(errs...)
}

// RouteTo returns the local address this host uses to reach target ("host",
// "host:port", "[v6]:port"): the kernel's routing decision, obtained by
// connecting a UDP socket, which sends nothing.
func RouteTo(target string) (netip.Addr, error) {
	host := target
	if h, _, err := net.SplitHostPort(target); err == nil {
		host = h
	}
	c, err := net.Dial("udp", net.JoinHostPort(strings.Trim(host, "[]"), "9"))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("no route to %s: %w", target, err)
	}
	defer c.Close()
	ap, err := netip.ParseAddrPort(c.LocalAddr().String())
	if err != nil {
		return netip.Addr{}, err
	}
	return ap.Addr().Unmap(), nil
}

// IsLoopback reports whether target ("host" or "host:port") is a loopback
// address or "localhost".
func IsLoopback(target string) bool {
	host := target
	if h, _, err := net.SplitHostPort(target); err == nil {
		host = h
	}
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(strings.Trim(host, "[]"))
	return err == nil && a.IsLoopback()
}

// Pick chooses the address a process binds to and advertises: the first of
// the named interfaces when interfaces is not empty; else, when a peer
// (the driver, the rendezvous) is on another host, the address the route to
// it leaves from; else loopback, for a job that stays on this host.
func Pick(interfaces string, peer string) (netip.Addr, error) {
	switch {
	case strings.TrimSpace(interfaces) != "":
		return FirstInterfaceAddr(interfaces)
	case peer != "" && !IsLoopback(peer):
		return RouteTo(peer)
	default:
		return netip.AddrFrom4([4]byte{127, 0, 0, 1}), nil
	}
}
