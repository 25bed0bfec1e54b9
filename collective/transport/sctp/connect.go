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

var _ transport.PartialConnector = (*Transport)(nil)

// ConnectSome is Connect for the ranks r of w with want[r] set (all when
// want is nil); the others' links are nil (transport.PartialConnector).
// SCTP links are not carried into a later world: the elastic layer asks
// only for a world's new pairs when the links of the others are kept.
func (t *Transport) ConnectSome(ctx context.Context, w transport.World, want []bool) ([]transport.Link, error) {
	return t.mesh.ConnectSome(ctx, w, want)
}
