package tcp_test

import (
	"context"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/conformance"
	"github.com/gorovod/gorovod/collective/transport/tcp"
)

// TestDefaultSecurity: with the default setting a link between two ranks
// of one host (both ends 127.0.0.1) is plain and one between two hosts
// (rank 1 dials rank 0 at 127.0.0.2 from 127.0.0.1: the ends' addresses
// differ, as between two machines) authenticated; explicit
// settings apply to both; ranks whose settings disagree are refused by
// the handshake, fatally.
func TestDefaultSecurity(t *testing.T) {
	for _, tc := range []struct {
		name           string
		secA, secB     transport.Security
		host0          string // rank 0's listen address
		sealed, secret bool
		refused        bool
	}{
		{"default, one host", transport.SecurityDefault, transport.SecurityDefault, "127.0.0.1", false, false, false},
		{"default, two hosts", transport.SecurityDefault, transport.SecurityDefault, "127.0.0.2", true, false, false},
		{"plain, two hosts", transport.SecurityPlain, transport.SecurityPlain, "127.0.0.2", false, false, false},
		{"authenticated, one host", transport.SecurityAuthenticated, transport.SecurityAuthenticated, "127.0.0.1", true, false, false},
		{"encrypted, two hosts", transport.SecurityEncrypted, transport.SecurityEncrypted, "127.0.0.2", true, true, false},
		{"encrypted against default", transport.SecurityEncrypted, transport.SecurityDefault, "127.0.0.2", false, false, true},
		{"plain against authenticated", transport.SecurityPlain, transport.SecurityAuthenticated, "127.0.0.1", false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkNoLeaks(t)
			cfgA, cfgB := testConfig(), testConfig()
			cfgA.Security, cfgB.Security = tc.secA, tc.secB
			cfgA.ListenAddr = tc.host0 + ":0"
			trs := []*tcp.Transport{listen(t, cfgA), listen(t, cfgB)}
			ctx := conformance.TimeoutCtx(t, 10*time.Second)
			if tc.refused {
				cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
				defer cancel()
				links, errs := conformance.ConnectAllErr(cctx, trs, "sec", 1)
				conformance.CloseAll(links)
				// Rank 1 dials rank 0 and hears why it is refused.
				conformance.AsHandshakeError(t, errs[1], 0, "data plane security")
				return
			}
			links := conformance.ConnectAll(t, ctx, trs, "sec", 1)
			for r := range links {
				sealed, secret := tcp.Sealed(links[r][1-r])
				if sealed != tc.sealed || secret != tc.secret {
					t.Errorf("rank %d's link: sealed %v, encrypted %v; want %v, %v", r, sealed, secret, tc.sealed, tc.secret)
				}
			}
			if err := conformance.Exchange(ctx, links, meshSizes); err != nil {
				t.Fatal(err)
			}
		})
	}
}
