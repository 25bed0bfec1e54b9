package testhosts

import "testing"

// flowOf tells flows apart by protocol, addresses and ports, and keeps the
// fragments and non-IPv4 packets it cannot read from splitting a flow.
func TestFlowOf(t *testing.T) {
	ipv4 := func(proto byte, src, dst byte, fragment uint16, ihl byte, ports ...byte) []byte {
		p := make([]byte, int(ihl)*4)
		p[0] = 0x40 | ihl
		p[6], p[7] = byte(fragment>>8), byte(fragment)
		p[9] = proto
		copy(p[12:16], []byte{198, 18, 0, src})
		copy(p[16:20], []byte{198, 18, 0, dst})
		return append(p, ports...)
	}
	tcp := ipv4(6, 2, 3, 0, 5, 0x10, 0x00, 0x08, 0xae)
	for _, tc := range []struct {
		name string
		a, b []byte
		same bool
	}{
		{"same TCP packet", tcp, ipv4(6, 2, 3, 0, 5, 0x10, 0x00, 0x08, 0xae), true},
		{"other source port", tcp, ipv4(6, 2, 3, 0, 5, 0x10, 0x01, 0x08, 0xae), false},
		{"other destination", tcp, ipv4(6, 2, 4, 0, 5, 0x10, 0x00, 0x08, 0xae), false},
		{"UDP on the same ports", tcp, ipv4(17, 2, 3, 0, 5, 0x10, 0x00, 0x08, 0xae), false},
		{"IP options move the ports", ipv4(6, 2, 3, 0, 6, 0x10, 0x00, 0x08, 0xae), tcp, true},
		{"a fragment's ports are not read", ipv4(17, 2, 3, 0x2000, 5, 1, 2, 3, 4), ipv4(17, 2, 3, 0x0010, 5, 5, 6, 7, 8), true},
		{"truncated: no ports", ipv4(6, 2, 3, 0, 5), ipv4(6, 2, 3, 0, 5, 0x10), true},
		{"not IPv4", []byte{0x60, 1, 2}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := flowOf(tc.a) == flowOf(tc.b); got != tc.same {
				t.Errorf("same flow: %v, want %v (%x, %x)", got, tc.same, flowOf(tc.a), flowOf(tc.b))
			}
		})
	}
}
