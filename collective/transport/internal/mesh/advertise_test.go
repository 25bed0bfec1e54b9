package mesh

import (
	"net"
	"testing"
)

func TestAdvertiseAddr(t *testing.T) {
	bound := &net.TCPAddr{IP: net.IPv4zero, Port: 4242}
	for adv, want := range map[string]string{
		"":                "0.0.0.0:4242",
		"198.18.0.2":      "198.18.0.2:4242",
		"198.18.0.2:0":    "198.18.0.2:4242",
		"198.18.0.2:5000": "198.18.0.2:5000",
		"h1":              "h1:4242",
		"2001:db8::1":     "[2001:db8::1]:4242",
		"[2001:db8::1]":   "[2001:db8::1]:4242",
		"[2001:db8::1]:7": "[2001:db8::1]:7",
	} {
		if got := AdvertiseAddr(adv, bound); got != want {
			t.Errorf("AdvertiseAddr(%q) = %q, want %q", adv, got, want)
		}
	}
}
