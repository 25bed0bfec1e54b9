package mesh

import "net"

// AdvertiseAddr is the address a transport bound at bound gives its peers:
// advertise when set — with bound's port when advertise names none (or port
// 0), so that a transport bound to a wildcard address on any port can
// advertise just its host — and otherwise the bound address itself.
func AdvertiseAddr(advertise string, bound net.Addr) string {
	if advertise == "" {
		return bound.String()
	}
	_, port, err := net.SplitHostPort(bound.String())
	if err != nil {
		return advertise
	}
	host, p, err := net.SplitHostPort(advertise)
	switch {
	case err != nil: // no port: a host, or a bare IPv6 address
		return net.JoinHostPort(trimBrackets(advertise), port)
	case p == "0":
		return net.JoinHostPort(host, port)
	}
	return advertise
}

func trimBrackets(h string) string {
	if len(h) > 1 && h[0] == '[' && h[len(h)-1] == ']' {
		return h[1 : len(h)-1]
	}
	return h
}
