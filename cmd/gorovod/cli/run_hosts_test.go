package cli

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
)

// A host whose name does not resolve is named, with the flag it came from,
// as the reason the job cannot start; other failures to find the driver's
// address keep the advice about --network-interface.
func TestDriverAddrError(t *testing.T) {
	notFound := fmt.Errorf("no route to node7: %w", &net.OpError{Op: "dial", Net: "udp",
		Err: &net.DNSError{Err: "no such host", Name: "node7", Server: "198.18.0.53:53", IsNotFound: true}})
	for _, tc := range []struct {
		name string
		h    hostOptions
		err  error
		want string
	}{
		{"-H", hostOptions{list: "node7:2"}, notFound,
			`host "node7" of -H: its name does not resolve here (lookup node7 on 198.18.0.53:53: no such host); if only ssh knows it (~/.ssh/config), ` +
				"give --network-interface or --gossip-addr: the driver's address is otherwise the one this host reaches it from"},
		{"--hostfile", hostOptions{hostfile: "hosts.txt"}, notFound, `host "node7" of --hostfile hosts.txt: its name does not resolve here (`},
		{"discovery script", hostOptions{script: "./list.sh"}, notFound, `host "node7" of the --host-discovery-script: its name does not resolve here (`},
		{"no route", hostOptions{list: "node7:2"}, errors.New("no route to node7: network is unreachable"),
			"choosing the driver's address (give --network-interface or --gossip-addr): no route to node7: network is unreachable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.h.driverAddrError("node7", tc.err).Error(); !strings.HasPrefix(got, tc.want) {
				t.Errorf("got %q, want it to begin %q", got, tc.want)
			}
		})
	}
}
