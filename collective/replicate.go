package collective

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"sync"
)

// Replicate copies buf from holders — ranks whose buf holds the same bytes —
// into buf on receivers. Each receiver gets its copy in contiguous stripes
// from up to k holders at once, one stripe per holder, over the direct links
// between them; each receiver starts at another holder, so that several
// receivers spread over the holders rather than all taking from the same k.
// Ranks in neither set
// take no part and return at once (they still call it: every rank numbers
// its collectives in the same order).
//
// Every rank must pass the same holders and receivers (ascending, without
// repeats, disjoint; holders not empty when receivers are not), the same
// buffer shape and the same Config.StripeSources: every rank computes the
// same plan from them (replicaPlan), and a rank whose inputs differ gets a
// *MismatchError. A holder that dies or stalls mid-transfer fails its
// receivers with a *PeerError naming it, and a receiver that does fails its
// holders the same way; as for every collective, the failure spends the
// communicator.
//
// k is Config.StripeSources when set. Otherwise it follows the link kinds:
// a receiver whose host runs holders takes its stripes from up to
// autoLocalSources of them only (shared memory or loopback: each stripe
// is a memory copy, and several use several cores, while a stripe from
// another host would be far slower and the stripes are equal, so the
// slowest sets the time); a receiver with no holder on its host takes
// them from one holder on each of up to autoRemoteSources other hosts
// (ranks of one host share its network link, so two sources there add no
// bandwidth, while sources on different hosts each add their host's
// upload). A stripe is never smaller than Config.ChunkBytes: below that
// the frames' latency outweighs what parallel links add.
func (c *Communicator) Replicate(ctx context.Context, buf Buffer, holders, receivers []int) error {
	if err := buf.validate("replicate"); err != nil {
		return err
	}
	if err := c.checkReplicaSets(holders, receivers); err != nil {
		return err
	}
	d := opDesc{coll: collReplicate, dtype: buf.DType, count: uint64(buf.Count),
		aux: replicaLayout(holders, receivers, c.cfg.StripeSources)}
	return c.run(ctx, d, algoStripes, func(ctx *opContext, o *opRun) error {
		if len(receivers) == 0 || buf.Count == 0 {
			return nil
		}
		esz := buf.DType.Size()
		plan := replicaPlan(c.topo, holders, receivers, buf.Count, esz, c.cfg.StripeSources, c.cfg.ChunkBytes)
		return o.runStripes(ctx, memOf(buf), plan, max(esz, c.cfg.ChunkBytes/esz*esz))
	})
}

// Default numbers of stripes per receiver (Replicate), from the link kinds.
const (
	// autoLocalSources: holders on the receiver's own host. Four memory
	// copies in parallel reach the memory bandwidth a receiver can absorb
	// on common servers; more would take cores from the training holders.
	autoLocalSources = 4
	// autoRemoteSources: holders on other hosts, one per host. The
	// receiver's own network link bounds the rate; four senders keep it
	// busy while each sends a quarter.
	autoRemoteSources = 4
)

// checkReplicaSets reports holders and receivers Replicate cannot run with.
func (c *Communicator) checkReplicaSets(holders, receivers []int) error {
	p := c.Size()
	in := make([]bool, p)
	for _, set := range []struct {
		name  string
		ranks []int
	}{{"holders", holders}, {"receivers", receivers}} {
		for i, r := range set.ranks {
			switch {
			case r < 0 || r >= p:
				return fmt.Errorf("collective: replicate %s: rank %d outside the world of %d", set.name, r, p)
			case i > 0 && r <= set.ranks[i-1]:
				return fmt.Errorf("collective: replicate %s %v are not in increasing order without repeats", set.name, set.ranks)
			case in[r]:
				return fmt.Errorf("collective: replicate: rank %d is both a holder and a receiver", r)
			}
			in[r] = true
		}
	}
	if len(holders) == 0 && len(receivers) > 0 {
		return fmt.Errorf("collective: replicate to %d receivers from no holder", len(receivers))
	}
	return nil
}

// replicaLayout digests Replicate's plan inputs for the frames' Aux field:
// ranks that disagree on them see a mismatch instead of misplacing stripes.
func replicaLayout(holders, receivers []int, k int) uint32 {
	h := fnv.New32a()
	var b [8]byte
	put := func(v int) {
		binary.LittleEndian.PutUint64(b[:], uint64(v))
		h.Write(b[:])
	}
	put(len(holders))
	for _, r := range holders {
		put(r)
	}
	put(len(receivers))
	for _, r := range receivers {
		put(r)
	}
	put(k)
	return h.Sum32()
}

// stripe is one holder's part of one receiver's copy: bytes [off, off+n).
type stripe struct {
	from, to int
	off, n   int
}

// replicaPlan computes Replicate's stripes: for every receiver, in order, its
// sources (sourcesFor) and the contiguous stripe each sends, the element
// count split as evenly as it goes (the first count%n stripes one element
// longer). It depends on its arguments only, so every rank computes the
// same plan.
func replicaPlan(topo Topology, holders, receivers []int, count, esz, k, minStripe int) []stripe {
	var plan []stripe
	for i, r := range receivers {
		src := sourcesFor(topo, holders, r, i, k)
		n := min(len(src), count, max(1, count*esz/max(1, minStripe)))
		src = src[:n]
		off := 0
		for j, h := range src {
			elems := count / n
			if j < count%n {
				elems++
			}
			plan = append(plan, stripe{from: h, to: r, off: off * esz, n: elems * esz})
			off += elems
		}
	}
	return plan
}

// sourcesFor picks the holders that feed receiver r, the i-th receiver, in
// stripe order. With k > 0: the first k of the holders on r's host, then of
// the others. With k = 0 (auto, see Replicate): up to autoLocalSources
// holders of r's host when it has any, else one holder on each of up to
// autoRemoteSources hosts. Each list starts at an offset that moves with
// i, so that receivers spread over the holders.
func sourcesFor(topo Topology, holders []int, r, i, k int) []int {
	host := topo.Hosts[r]
	var local, remote []int
	for _, h := range holders {
		if topo.Hosts[h] == host {
			local = append(local, h)
		} else {
			remote = append(remote, h)
		}
	}
	if k > 0 {
		n := min(k, len(holders))
		all := append(rotate(local, i*n), rotate(remote, i*n)...)
		return all[:n]
	}
	if len(local) > 0 {
		n := min(autoLocalSources, len(local))
		return rotate(local, i*n)[:n]
	}
	// One holder per host: hosts in the order of their lowest holder, the
	// holder within a host chosen by i.
	var hosts [][]int
	index := map[int]int{}
	for _, h := range remote {
		x, ok := index[topo.Hosts[h]]
		if !ok {
			x = len(hosts)
			index[topo.Hosts[h]] = x
			hosts = append(hosts, nil)
		}
		hosts[x] = append(hosts[x], h)
	}
	n := min(autoRemoteSources, len(hosts))
	src := make([]int, 0, n)
	for j := range n {
		hs := hosts[(i*n+j)%len(hosts)]
		src = append(src, hs[i%len(hs)])
	}
	return src
}

// rotate returns s starting at position by (modulo its length), in a new slice.
func rotate(s []int, by int) []int {
	out := make([]int, 0, len(s))
	for j := range s {
		out = append(out, s[(by+j)%len(s)])
	}
	return out
}

// runStripes moves this rank's stripes of plan: a holder sends each of its
// stripes to its receiver, a receiver takes each of its stripes from its
// holder, all at once, one goroutine per stripe (they use different links),
// in frames of at most chunk bytes numbered from 0 on each link. The first
// failure cancels the others and is returned.
func (o *opRun) runStripes(ctx *opContext, m memory, plan []stripe, chunk int) error {
	me := o.c.Rank()
	var (
		wg    sync.WaitGroup
		devMu sync.Mutex // device memory copies one at a time
		errMu sync.Mutex
		first error
	)
	for _, s := range plan {
		if s.from != me && s.to != me {
			continue
		}
		wg.Go(func() {
			var err error
			if s.from == me {
				err = o.sendStripe(ctx, m, s, chunk, &devMu)
			} else {
				err = o.recvStripe(ctx, m, s, chunk, &devMu)
			}
			if err != nil {
				ctx.cancel(err)
				errMu.Lock()
				if first == nil {
					first = err
				}
				errMu.Unlock()
			}
		})
	}
	wg.Wait()
	if first == nil {
		return nil
	}
	if cause := ctx.Cause(); cause != nil {
		return cause
	}
	return first
}

func (o *opRun) sendStripe(ctx *opContext, m memory, s stripe, chunk int, devMu *sync.Mutex) error {
	var staging []byte
	if m.dev != nil {
		staging = make([]byte, chunk)
	}
	for step, done := 0, 0; done < s.n; step++ {
		n := min(chunk, s.n-done)
		if m.dev != nil {
			devMu.Lock()
		}
		b, err := m.readable(ctx, s.off+done, n, staging)
		if m.dev != nil {
			devMu.Unlock()
		}
		if err != nil {
			return err
		}
		if err := o.send(ctx, s.to, step, b); err != nil {
			return err
		}
		done += n
	}
	return nil
}

func (o *opRun) recvStripe(ctx *opContext, m memory, s stripe, chunk int, devMu *sync.Mutex) error {
	var staging []byte
	if m.dev != nil {
		staging = make([]byte, chunk)
	}
	for step, done := 0, 0; done < s.n; step++ {
		n := min(chunk, s.n-done)
		b := m.writable(s.off+done, n, staging)
		if err := o.recv(ctx, s.from, step, b); err != nil {
			return err
		}
		if m.dev != nil {
			devMu.Lock()
			err := m.commit(ctx, s.off+done, b)
			devMu.Unlock()
			if err != nil {
				return err
			}
		}
		done += n
	}
	return nil
}
