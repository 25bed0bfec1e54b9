package tcp

import (
	"context"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/internal/spin"
)

// Connect connects this worker to every other rank of w: it dials each lower
// rank and waits for each higher rank to dial in. It returns one link per rank
// (links[w.Rank] is nil) or, having closed everything it opened, an error naming
// the rank that failed: a *transport.HandshakeError when a peer it dialed
// refused it or failed authentication, a *transport.PeerError otherwise.
//
// When ctx ends first, the *transport.PeerError lists every rank still missing
// and unwraps to ctx's error and to each missing rank's last failure; a higher
// rank that dialed in but failed authentication shows there as a
// *transport.HandshakeError. Such a failure does not end Connect by itself:
// anyone who saw a rank's hello could replay it with a bad proof, and the real
// rank may still come.
func (t *Transport) Connect(ctx context.Context, w transport.World) ([]transport.Link, error) {
	return t.ConnectSome(ctx, w, nil)
}

var _ transport.PartialConnector = (*Transport)(nil)

// ConnectSome is Connect for the ranks r of w with want[r] set (all when
// want is nil); the others' links are nil (transport.PartialConnector).
func (t *Transport) ConnectSome(ctx context.Context, w transport.World, want []bool) ([]transport.Link, error) {
	links, err := t.mesh.ConnectSome(ctx, w, want)
	if err != nil {
		return nil, err
	}
	// Ranks on this host that outnumber its CPUs take turns on the cores: a
	// waiting rank's polls then also yield to other processes (package spin),
	// and its sockets keep the kernel's buffer autotuning. Otherwise links
	// between ranks of this host get fixed buffers (Config.SocketBuffer).
	local := 1
	for _, l := range links {
		if ls := lanesOf(l); len(ls) > 0 && ls[0].sameHost() {
			local++
		}
	}
	over := local > spin.HostCPUs()
	buf := worldSocketBuffer(t.cfg.SocketBuffer, over, t.bufGranted)
	for _, l := range links {
		if ls := lanesOf(l); len(ls) > 0 {
			t.log.Debug("gorovod tcp: link connected", "peer", ls[0].PeerRank, "lanes", len(ls), "same_host", ls[0].sameHost())
		}
		for _, tl := range lanesOf(l) {
			if !t.mixed.Load() {
				tl.chunkHint = oversubscribedChunk
			}
			if over {
				tl.oversubscribed()
			}
			if buf > 0 && tl.sameHost() {
				if err := tl.setBuffers(buf); err != nil {
					// Autotuning stays: slower to ramp up, but it works.
					t.log.Debug("gorovod tcp: socket buffers not set", "peer", tl.PeerRank, "bytes", buf, "err", err)
				}
			}
		}
	}
	return links, nil
}
