package membership

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/hashicorp/memberlist"
)

// delegate receives memberlist's callbacks. It lives apart from Member so the
// callbacks stay out of Member's API. memberlist calls the event methods under
// its node lock and NotifyMsg from its receive loops: nothing here blocks or
// calls back into memberlist.
type delegate struct{ m *Member }

var (
	_ memberlist.Delegate      = (*delegate)(nil)
	_ memberlist.EventDelegate = (*delegate)(nil)
	_ memberlist.AliveDelegate = (*delegate)(nil)
	_ memberlist.MergeDelegate = (*delegate)(nil)
)

// NodeMeta returns the current sealed encoding, validated to fit when it was
// stored.
func (d *delegate) NodeMeta(limit int) []byte {
	b := *d.m.metaBytes.Load()
	if len(b) > limit {
		// Unreachable (MarshalBinary enforces MaxMetaSize, which leaves room
		// for the seal within memberlist's limit); returning it would make
		// memberlist panic.
		d.m.log.Error("membership: metadata over memberlist's limit", "bytes", len(b), "limit", limit)
		return nil
	}
	return b
}

// NotifyMsg receives a Send from another member (b is only valid during the call).
func (d *delegate) NotifyMsg(b []byte) {
	m := d.m
	var f frame
	if err := decodeFrame(b, &f); err != nil {
		m.messagesMalformed.Add(1)
		m.log.Debug("membership: dropped a malformed message", "bytes", len(b), "err", err)
		return
	}
	if f.jobID != m.jobID {
		m.messagesForeign.Add(1)
		m.log.Debug("membership: dropped a message of another job", "job", f.jobID, "from", f.from)
		return
	}
	if len(f.payload) > m.cfg.MaxMessageSize {
		m.messagesMalformed.Add(1)
		m.log.Debug("membership: dropped an oversized message", "bytes", len(f.payload), "from", f.from)
		return
	}
	if f.kind == frameReach {
		return // its delivery was the answer
	}
	if ok, refused := m.authenticate(&f, b); !ok {
		refused.Add(1)
		m.log.Debug("membership: dropped a message not signed by its sender or seen before", "from", f.from, "seq", f.seq)
		return
	}
	if f.kind == frameMeta {
		m.told(f.from, f.payload)
		return
	}
	m.mu.Lock()
	e, known := m.nodes[f.from]
	from := Node{Name: f.from}
	if known {
		if f.kind == frameBye {
			e.bye = true
		}
		from = e.node.clone()
	}
	m.mu.Unlock()
	if f.kind != frameData {
		return
	}
	msg := Message{From: from, Payload: bytes.Clone(f.payload), At: time.Now()}
	m.msgMu.Lock()
	defer m.msgMu.Unlock()
	if m.msgClosed {
		m.messagesDropped.Add(1)
		return
	}
	select {
	case m.msgs <- msg:
		m.messagesReceived.Add(1)
	default:
		m.messagesDropped.Add(1)
	}
}

func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d *delegate) LocalState(join bool) []byte                { return nil }
func (d *delegate) MergeRemoteState(buf []byte, join bool)     {}

// NotifyAlive admits a node into memberlist's view only when its metadata
// decodes, names this job and is sealed by the node's own key, and it is at
// the gossip address first seen under its name: every alive message,
// gossiped or merged, passes here, so a stranger holding the secret never
// becomes a member, nor changes what a member published or where it is.
// (A stale copy that the member did seal passes here and is not applied:
// see nodeChanged.)
func (d *delegate) NotifyAlive(n *memberlist.Node) error {
	if _, _, err := d.m.admit(n.Name, n.Meta); err != nil {
		return err
	}
	return d.m.pinAddr(n.Name, addrPort(n.Addr, n.Port))
}

// NotifyMerge refuses a join with a cluster that holds any node of another
// job; memberlist then fails that join on both sides.
//
// The addresses of the refused nodes are remembered so that Join can tell a
// seed of another job (fail at once) from a seed that is not up yet (retry).
// All of them: the seed we dialled is somewhere in its own state, not
// necessarily first.
func (d *delegate) NotifyMerge(peers []*memberlist.Node) error {
	var first error
	var refused []netip.AddrPort
	for _, p := range peers {
		_, _, err := d.m.admit(p.Name, p.Meta)
		if err == nil {
			err = d.m.pinAddr(p.Name, addrPort(p.Addr, p.Port))
		}
		if err != nil {
			if first == nil {
				first = err
			}
			refused = append(refused, addrPort(p.Addr, p.Port))
		}
	}
	if len(refused) > 0 {
		d.m.mu.Lock()
		// Bounded: what Join needs is the latest refused cluster.
		if len(d.m.foreignAddrs)+len(refused) > maxForeignAddrs {
			clear(d.m.foreignAddrs)
		}
		for _, a := range refused {
			d.m.foreignAddrs[a] = struct{}{}
		}
		d.m.mu.Unlock()
	}
	return first
}

func (d *delegate) NotifyJoin(n *memberlist.Node)   { d.m.nodeChanged(EventJoined, n) }
func (d *delegate) NotifyUpdate(n *memberlist.Node) { d.m.nodeChanged(EventUpdated, n) }
func (d *delegate) NotifyLeave(n *memberlist.Node)  { d.m.nodeGone(n) }

// admit opens a node's sealed metadata and checks its job and its signing
// key. It returns the metadata and the sequence number it was sealed under.
func (m *Member) admit(name string, raw []byte) (Meta, uint64, error) {
	meta, seq, err := m.openMeta(name, raw)
	if err != nil {
		m.nodesRejected.Add(1)
		if errors.Is(err, ErrMetaUnsealed) {
			m.metaRefused.Add(1)
		}
		return meta, 0, fmt.Errorf("membership: node %s: %w", name, err)
	}
	if meta.JobID != m.jobID {
		m.nodesRejected.Add(1)
		return meta, 0, fmt.Errorf("membership: node %s belongs to job %q, not %q", name, meta.JobID, m.jobID)
	}
	if err := m.pin(name, &meta); err != nil {
		m.nodesRejected.Add(1)
		return meta, 0, err
	}
	m.acceptedMeta(name, raw)
	return meta, seq, nil
}

// nodeChanged records a joined or updated member and queues the event.
func (m *Member) nodeChanged(kind EventKind, n *memberlist.Node) {
	now := time.Now()
	meta, seq, err := m.admit(n.Name, n.Meta)
	if err != nil {
		// NotifyAlive keeps such nodes out of memberlist, so this does not
		// happen; never let one into Members if it does.
		m.log.Warn("membership: ignored a node", "err", err)
		return
	}
	node := Node{Name: n.Name, Addr: addrPort(n.Addr, n.Port), Meta: meta}
	m.mu.Lock()
	if m.staleMetaLocked(n.Name, seq) {
		// A copy older than one this member already applied: a lagging
		// peer's, or a secret holder's replay (an old CollectiveAddr or
		// State under a new incarnation). The member refutes it in gossip.
		m.mu.Unlock()
		m.log.Debug("membership: ignored a member's older metadata", "node", n.Name, "seq", seq)
		return
	}
	e := m.nodes[n.Name]
	if e == nil {
		e = &nodeEntry{}
		m.nodes[n.Name] = e
		kind = EventJoined
	} else if meta.State < e.node.Meta.State {
		// The member told us its newer metadata directly (Tell) before this
		// gossip of an older one arrived: a member's state never goes back.
		node.Meta = e.node.Meta
	}
	if kind == EventUpdated && e.node.Name != "" && e.node.Addr == node.Addr && e.node.Meta.Equal(node.Meta) {
		// Gossip catching up with what the member told us: no news.
		m.mu.Unlock()
		return
	}
	e.node = node
	m.setAliveLocked(n.Name, true)
	if n.Name == m.name {
		m.selfAddr = node.Addr
	}
	m.mu.Unlock()
	m.log.Debug("membership: member "+kind.String(), "node", node.Name, "addr", node.Addr, "state", meta.State)
	m.events.push(Event{Kind: kind, Node: node.clone(), At: now})
}

// told applies metadata a member sent us directly (Tell). It is news only
// when it moves the member's State forward (joining, ready, leaving): a copy
// that arrives after gossip brought a newer state changes nothing, and a
// member not in the view yet is left to gossip, which brings its address.
func (m *Member) told(name string, raw []byte) {
	now := time.Now()
	meta, seq, err := m.admit(name, raw)
	if err != nil {
		m.messagesMalformed.Add(1)
		m.log.Debug("membership: dropped metadata told directly", "from", name, "err", err)
		return
	}
	m.mu.Lock()
	e := m.nodes[name]
	if e == nil || name == m.name || meta.State <= e.node.Meta.State || m.staleMetaLocked(name, seq) {
		m.mu.Unlock()
		return
	}
	e.node.Meta = meta
	node := e.node.clone()
	m.mu.Unlock()
	m.log.Debug("membership: member updated (told directly)", "node", node.Name, "addr", node.Addr, "state", meta.State)
	m.events.push(Event{Kind: EventUpdated, Node: node, At: now})
}

// departed reports whether name is not an alive member of the cluster as
// this member knows it, or is one that is on its way out (it said goodbye,
// or published State=leaving).
func (m *Member) departed(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.nodes[name]
	return e == nil || e.bye || e.node.Meta.State == StateLeaving
}

// nodeGone removes a dead or departed member and queues Left or Failed.
func (m *Member) nodeGone(n *memberlist.Node) {
	now := time.Now()
	m.mu.Lock()
	e := m.nodes[n.Name]
	if e == nil {
		m.mu.Unlock()
		return
	}
	delete(m.nodes, n.Name)
	m.setAliveLocked(n.Name, false)
	kind := EventFailed
	if e.bye || e.node.Meta.State == StateLeaving {
		kind = EventLeft
	}
	node := e.node
	m.mu.Unlock()
	m.log.Debug("membership: member "+kind.String(), "node", node.Name, "addr", node.Addr)
	m.events.push(Event{Kind: kind, Node: node.clone(), At: now})
}

func addrPort(ip net.IP, port uint16) netip.AddrPort {
	a, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(a.Unmap(), port)
}
