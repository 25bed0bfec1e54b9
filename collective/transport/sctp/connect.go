package sctp

import (
	"context"

	"github.com/gorovod/gorovod/collective/transport"
)

// Connect connects this worker to every other rank of w: it dials each lower
// rank and waits for each higher rank to dial in. It returns one link per rank
// (links[w.Rank] is nil) or, having closed everything it opened, an error naming
// the rank that failed, exactly as the TCP transport's Connect does: a
// *transport.HandshakeError when a peer it dialed refused it or failed
// authentication, a *transport.PeerError otherwise; when ctx ends first, the
// PeerError lists every rank still missing and why.
func (t *Transport) Connect(ctx context.Context, w transport.World) ([]transport.Link, error) {
	return t.mesh.Connect(ctx, w)
}
