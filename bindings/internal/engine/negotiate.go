package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gorovod/gorovod/collective"
)

// Pairing calls by name.
//
// Every rank compares the description of the call at the head of its queue
// with the others' before it runs (agree.go); the description carries the
// call's key (fieldKey): a digest of its name, or, for a call without one,
// of its number among the unnamed calls on its process set in this world
// (as Horovod names an unnamed call by its kind and a counter). When the
// heads' keys are all equal, that is the whole cost: the call runs, or
// fails with a *collective.MismatchError on every rank when some other
// field differs, as before names were compared.
//
// When the keys differ (rank 0 queued a named allreduce and then a barrier,
// rank 1 only the barrier so far), the ranks negotiate: each sends the
// descriptions of its pending calls on the head's process set (the head
// and the queued calls after it, up to maxPending, as far as the first
// call that takes no part in the comparison: a commit, a join, a call on
// another process set), and every rank runs the first call of rank 0's
// list that every rank has pending, each rank its own call of that key,
// taking it out of its queue wherever it stands; the others stay queued.
// Every rank decides from the same table, so every rank runs the same
// call. When that call's descriptions differ in anything but the key, it
// fails on every rank with a *collective.MismatchError. When no call is
// pending on every rank, nothing runs: the ranks negotiate again when a new
// call comes or a short pause has passed, and once some rank has waited
// Config.PairTimeout without any call pairing, every rank fails its head
// call with a *collective.MismatchError that names it.
//
// Unnamed calls pair by their order among the unnamed calls, so a program
// that names nothing pairs its calls by position, as ever; a named call
// may overtake or be overtaken by any other call. Ranks inside Join do
// not negotiate: with one of them the heads are compared as they are.

// maxPending bounds the calls a rank offers in one negotiation: a queue
// longer than that offers its oldest maxPending, and the rest in later
// rounds once those have run.
const maxPending = 32

// maxPause is the longest pause between two negotiations that paired
// nothing: a rank that has nothing new to offer negotiates again after it
// anyway, since a peer may have.
const maxPause = 50 * time.Millisecond

// CallOption adds to a collective what is not one of its arguments.
type CallOption func(*call)

// Name names a collective. Ranks pair calls of the same name, whatever
// their order in each rank's queue (see negotiate.go); calls without a name
// pair by their order among the calls without one. The empty name is none.
func Name(name string) CallOption { return func(c *call) { c.name = name } }

// with applies opts to c and returns it.
func (c *call) with(opts []CallOption) *call {
	for _, o := range opts {
		o(c)
	}
	return c
}

// agrees reports whether c takes part in the comparison of descriptions
// (and so in negotiations): a collective, not a commit, a join, or the
// adaptive batch size's bookkeeping.
func (c *call) agrees() bool { return !c.commit && !c.joins && c.desc[fieldKind] != 0 }

// label is c's description with its name, for errors.
func (c *call) label() string {
	if c.name == "" {
		return c.desc.String()
	}
	return fmt.Sprintf("%s named %q", c.desc.String(), c.name)
}

// keyLocked gives c its key (under mu, in submission order): the digest of
// its name, or of its number among this world's unnamed calls on its set.
//
// A join starts the numbering again: the ranks that join early make no
// calls while the others make theirs, and every rank joins once, at the
// end of its own calls, so the numbers after it are the same everywhere.
func (e *Engine) keyLocked(c *call) {
	if c.joins {
		clear(e.unnamed)
	}
	if !c.agrees() {
		return
	}
	var h digest63
	if c.name != "" {
		h.put(1)
		h.putString(c.name)
	} else {
		h.put(0)
		h.put(e.unnamed[c.set])
		e.unnamed[c.set]++
	}
	c.desc[fieldKey] = h.sum()
}

// pending is what a negotiation for head offers: head, then the queued
// calls after it (all of the queue when head runs on its caller's
// goroutine) on head's set and of its world, up to maxPending, as far as
// the first that is not. Only the running call takes calls out of the
// queue, so they stay there while the negotiation runs.
func (e *Engine) pending(head *call) []*call {
	e.mu.Lock()
	defer e.mu.Unlock()
	rest := e.queue
	if len(rest) > 0 && rest[0] == head {
		rest = rest[1:]
	}
	pending := []*call{head}
	for _, c := range rest {
		if len(pending) == maxPending || !c.agrees() || c.set != head.set || c.gen != head.gen {
			break
		}
		pending = append(pending, c)
	}
	return pending
}

// dequeueLocked takes c out of the queue (under mu), wherever it stands.
func (e *Engine) dequeueLocked(c *call) {
	if i := slices.Index(e.queue, c); i >= 0 {
		e.queue = slices.Delete(e.queue, i, i+1)
	}
}

// pair compares head's description with every rank's head and returns
// the call to run now: head when every rank's is the same; one of the
// pending calls when the heads' keys differ and negotiation pairs one
// (negotiate); nil when nothing pairs yet. A non-nil error is the returned
// call's (head's when the exchange itself failed).
func (e *Engine) pair(ctx context.Context, head *call) (*call, error) {
	var chosen *call
	err := e.onSet(e.sess, head.set)(ctx, func(ctx context.Context, c *collective.Communicator) error {
		chosen = head
		all, err := gatherDescriptions(ctx, c, head.desc)
		if err != nil || all == nil {
			return err
		}
		active, joined := splitJoined(all)
		if len(joined) > 0 || sameKey(all, active) {
			return settle(ctx, c, all, head.desc, head.label(), head.layout)
		}
		chosen, err = e.negotiate(ctx, c, head, e.pending(head))
		return err
	})
	if err != nil && chosen == nil {
		chosen = head
	}
	return chosen, err
}

// sameKey reports whether the ranks in active have heads of one key.
func sameKey(all []description, active []int) bool {
	for _, r := range active {
		if all[r][fieldKey] != all[active[0]][fieldKey] {
			return false
		}
	}
	return true
}

// negotiate exchanges every rank's pending calls (the first one head) and
// returns the first call of rank 0's list that every rank has pending (this
// rank's call of that key), with a *collective.MismatchError when the
// ranks' descriptions of it differ; nil when there is none, or head with a
// *collective.MismatchError once some rank has waited Config.PairTimeout
// for a call to pair.
func (e *Engine) negotiate(ctx context.Context, c *collective.Communicator, head *call, pending []*call) (*call, error) {
	const row = 2 + maxPending*numFields // gave up, how many, their descriptions
	mine := make([]int64, row)
	if !e.stuckSince.IsZero() && time.Since(e.stuckSince) >= e.pairTimeout {
		mine[0] = 1
	}
	pending = pending[:min(len(pending), maxPending)]
	mine[1] = int64(len(pending))
	for i, p := range pending {
		copy(mine[2+i*numFields:], p.desc[:])
	}
	flat := make([]int64, row*c.Size())
	if err := collective.Allgather(ctx, c, mine, flat); err != nil {
		return head, err
	}
	lists := make([][]description, c.Size())
	gaveUp := false
	for r := range lists {
		theirs := flat[r*row : (r+1)*row]
		gaveUp = gaveUp || theirs[0] != 0
		n := int(min(max(theirs[1], 0), maxPending))
		lists[r] = make([]description, n)
		for i := range lists[r] {
			copy(lists[r][i][:], theirs[2+i*numFields:])
		}
	}
	indexOf := func(list []description, key int64) int {
		return slices.IndexFunc(list, func(d description) bool { return d[fieldKey] == key })
	}
	for _, d := range lists[0] {
		everywhere := true
		for _, list := range lists[1:] {
			everywhere = everywhere && indexOf(list, d[fieldKey]) >= 0
		}
		if !everywhere {
			continue
		}
		mine := pending[indexOf(lists[c.Rank()], d[fieldKey])]
		for r, list := range lists {
			theirs := list[indexOf(list, d[fieldKey])]
			if f := differs(theirs, mine.desc); f >= 0 {
				return mine, &collective.MismatchError{Peer: r, Field: fieldNames[f], Local: mine.label(), Remote: theirs.String()}
			}
		}
		return mine, nil
	}
	if !gaveUp {
		if e.stuckSince.IsZero() {
			e.stuckSince = time.Now()
		}
		return nil, nil
	}
	// Some rank waited long enough: each fails its head, named after the
	// first rank that has nothing of its key pending.
	for r, list := range lists {
		if indexOf(list, head.desc[fieldKey]) < 0 {
			return head, &collective.MismatchError{Peer: r, Field: "name", Local: head.label(),
				Remote: fmt.Sprintf("no call of that name or number within %v (its pending calls: %s)", e.pairTimeout, listOf(list))}
		}
	}
	// Not reached: head's key pending on every rank would have paired.
	return head, fmt.Errorf("%w: %s is pending on every rank but did not pair", ErrInternal, head.label())
}

// listOf describes a rank's pending calls, the first few.
func listOf(list []description) string {
	const shown = 4
	var parts []string
	for _, d := range list[:min(len(list), shown)] {
		parts = append(parts, d.String())
	}
	if len(list) > shown {
		parts = append(parts, fmt.Sprintf("and %d more", len(list)-shown))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "; ")
}

// pause waits before the next negotiation after one that paired nothing:
// until a new call is submitted (or Close), or a pause that doubles from a
// millisecond up to maxPause has passed.
func (e *Engine) pause() {
	e.backoff = min(max(2*e.backoff, time.Millisecond), maxPause)
	t := time.NewTimer(e.backoff)
	defer t.Stop()
	select {
	case <-e.wake:
	case <-t.C:
	case <-e.ctx.Done():
	}
}
