package collective

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
)

// countingLink counts the payload bytes a rank sends to its peer.
type countingLink struct {
	transport.Link
	sent *atomic.Int64
}

func (l countingLink) Send(ctx context.Context, h *transport.Header, payload []byte) error {
	l.sent.Add(int64(len(payload)))
	return l.Link.Send(ctx, h, payload)
}

// countingMesh is inprocMesh with every link counting into sent[from][to].
func countingMesh(sent [][]atomic.Int64) meshFunc {
	return func(t testing.TB, w transport.World) [][]transport.Link {
		mesh := inprocMesh(t, w)
		for r, links := range mesh {
			for q, l := range links {
				if l != nil {
					links[q] = countingLink{Link: l, sent: &sent[r][q]}
				}
			}
		}
		return mesh
	}
}

// TestBroadcastOrder: the order a broadcast runs over starts at the root,
// has every host's ranks adjacent, the root's host first, and is a
// permutation whose pos and rank agree.
func TestBroadcastOrder(t *testing.T) {
	for _, tc := range []struct {
		hosts []string
		root  int
		want  []int
	}{
		{[]string{"a", "b", "a", "b"}, 0, []int{0, 2, 1, 3}},
		{[]string{"a", "b", "a", "b"}, 2, []int{2, 0, 1, 3}},
		{[]string{"a", "b", "a", "b"}, 3, []int{3, 1, 0, 2}},
		{[]string{"a", "b", "c", "a", "b", "c"}, 4, []int{4, 1, 2, 5, 0, 3}},
		{[]string{"a", "a", "a", "b"}, 1, []int{1, 2, 0, 3}},
		{[]string{"a", "b", "b", "b"}, 3, []int{3, 1, 2, 0}},
		{[]string{"x", "y", "z"}, 1, []int{1, 2, 0}},
	} {
		w := transport.World{JobID: "j", Addrs: make([]string, len(tc.hosts)), Hosts: tc.hosts}
		g := newGroups(topologyOf(w), 0)
		order := g.broadcastOrder(tc.root)
		got := make([]int, len(tc.hosts))
		for v := range got {
			got[v] = order.rank(v)
			if order.pos(got[v]) != v {
				t.Errorf("%v root %d: rank %d at position %d, but pos says %d", tc.hosts, tc.root, got[v], v, order.pos(got[v]))
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%v root %d: order %v, want %v", tc.hosts, tc.root, got, tc.want)
		}
	}
}

// TestBroadcastOverHosts: broadcasts on every host layout from every root,
// down the tree (small) and the chain (large, several chunks), deliver the
// root's data; the chain's data crosses between hosts exactly once per host
// other than the root's, whatever the ranks' numbering (the layouts include
// hosts whose ranks are not numbered consecutively, and roots that are not
// their host's first rank).
func TestBroadcastOverHosts(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ChunkBytes = 4 << 10
	for _, l := range testLayouts {
		p := len(l.hosts)
		if p == 1 {
			continue
		}
		sent := make([][]atomic.Int64, p)
		for r := range sent {
			sent[r] = make([]atomic.Int64, p)
		}
		comms := newHostWorld(t, countingMesh(sent), l, cfg)
		t.Run(l.name, func(t *testing.T) {
			for _, n := range []int{100, cfg.SmallMessageBytes + 3*cfg.ChunkBytes + 5} {
				chain := n > cfg.SmallMessageBytes
				for root := range p {
					for r := range sent {
						for q := range sent[r] {
							sent[r][q].Store(0)
						}
					}
					want := make([]byte, n)
					for i := range want {
						want[i] = byte(i*7 + root)
					}
					bufs := make([][]byte, p)
					errs := onAll(t, comms, 30*time.Second, func(ctx context.Context, c *Communicator) error {
						r := c.Rank()
						bufs[r] = make([]byte, n)
						if r == root {
							copy(bufs[r], want)
						}
						return c.Broadcast(ctx, HostBuffer(Uint8, bufs[r]), root)
					})
					noErrors(t, errs)
					for r := range p {
						if !bytes.Equal(bufs[r], want) {
							t.Fatalf("%d bytes from root %d: rank %d got other data", n, root, r)
						}
					}
					var across, within int64
					for r := range sent {
						for q := range sent[r] {
							if l.hosts[r] != l.hosts[q] {
								across += sent[r][q].Load()
							} else {
								within += sent[r][q].Load()
							}
						}
					}
					if total := int64(n) * int64(p-1); across+within != total {
						t.Fatalf("%d bytes from root %d: %d bytes sent in all, want %d (each rank receives it once)", n, root, across+within, total)
					}
					if hosts := len(l.hostsSet()); chain && across != int64(n)*int64(hosts-1) {
						t.Fatalf("chain broadcast of %d bytes from root %d over %d hosts: %d bytes crossed between hosts, want %d (once into each other host)",
							n, root, hosts, across, int64(n)*int64(hosts-1))
					}
				}
			}
		})
	}
}
