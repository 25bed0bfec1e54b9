package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/cluster/kube/api"
	"github.com/gorovod/gorovod/internal/testing/testdaemon"
	"github.com/gorovod/gorovod/internal/testing/testkube"
)

// partition is a loopback TCP proxy to the API server that can be cut (its
// connections closed, new ones closed at once) and healed.
type partition struct {
	ln       net.Listener
	upstream string
	mu       sync.Mutex
	cut      bool
	conns    map[net.Conn]bool
	accepted int // connections forwarded since the last heal
	wg       sync.WaitGroup
}

func newPartition(t *testing.T, upstream string) *partition {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &partition{ln: ln, upstream: upstream, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.sever()
		p.wg.Wait()
	})
	return p
}

func (p *partition) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			continue
		}
		up, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c], p.conns[up] = true, true
		p.accepted++
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

func (p *partition) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// sever closes every connection.
func (p *partition) sever() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

func (p *partition) setCut(cut bool) {
	p.mu.Lock()
	p.cut = cut
	p.accepted = 0
	p.mu.Unlock()
	if cut {
		p.sever()
	}
}

func (p *partition) forwarded() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// TestLeaderPartitioned cuts the leader off the API server: it stops
// leading within its renew deadline, the other replica takes over once the
// lease has expired, and when the cut heals the old leader writes nothing —
// though jobs arrive and end meanwhile — while the new one goes on.
func TestLeaderPartitioned(t *testing.T) {
	cp := testkube.New(t, testkube.DefaultConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const ns = "cut"
	e := newE2E(ctx, t, cp, ns, "n1", "n2")
	recCtx, stopRecording := context.WithCancel(ctx)
	rec := record(recCtx, t, e.admin, e.adminDyn, ns)

	viaProxy := cp.ConfigFor(e.token)
	p := newPartition(t, strings.TrimPrefix(viaProxy.Host, "https://"))
	viaProxy.Host = "https://" + p.ln.Addr().String()
	a := startReplica(ctx, t, viaProxy, "sched-a", nil)
	e.holder("sched-a")
	b := startReplica(ctx, t, cp.ConfigFor(e.token), "sched-b", nil)
	e.submit("first", 1, 2)
	e.until("first runs", time.Minute, running("first"))

	p.setCut(true)
	cutAt := time.Now()
	e.holder("sched-b")
	t.Logf("sched-b took over %v after sched-a was cut off", time.Since(cutAt).Round(time.Millisecond))
	e.submit("second", 2, 2)
	e.until("second runs", time.Minute, running("first", "second"))
	aRounds := a.rounds.Load()

	p.setCut(false)
	// sched-a is back: it reaches the API server again (it campaigns),
	// while jobs change under sched-b.
	e.submit("third", 1, 1)
	if err := testdaemon.WaitFor(ctx, 100*time.Millisecond, func() error {
		if n := p.forwarded(); n == 0 {
			return errors.New("sched-a has not reconnected")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	since := b.rounds.Load()
	if err := testdaemon.WaitFor(ctx, 100*time.Millisecond, func() error {
		if n := b.rounds.Load() - since; n < 3 {
			return fmt.Errorf("%d rounds by sched-b since the heal", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n := a.rounds.Load() - aRounds; n != 0 {
		t.Errorf("sched-a ran %d rounds after sched-b took over", n)
	}
	if j := e.get("third"); j.Status.ScheduledBy != "sched-b" || j.Status.Phase == "" {
		t.Errorf("third: %+v", j.Status)
	}
	if j := e.get("first"); j.Status.Phase != api.PhaseRunning {
		t.Errorf("first: %+v", j.Status)
	}
	stopRecording()
	<-rec.done
	by := rec.check(t)
	t.Logf("writes by replica: %v; lease records: %d", by, len(rec.holders))
	if by["sched-a"] == 0 || by["sched-b"] == 0 {
		t.Errorf("both replicas should have written: %v", by)
	}
}
