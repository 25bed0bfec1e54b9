package job

import "slices"

// placement decides where workers go: on the first host, in the discovery's
// order, with a free slot (as Horovod fills hosts), counting the workers of
// the job still running on each; and how many workers the job started on
// each host at first, the share a later worker there is given. It holds the
// Discovery's latest host list. The roster's mu guards it.
type placement struct {
	hosts   []Host
	running map[string]int // workers running per host name
	share   map[string]int // workers started on each host with the job
}

func newPlacement() placement { return placement{running: map[string]int{}} }

// pick returns the host for one more worker, or false when every slot is
// taken.
func (p *placement) pick() (string, bool) {
	for _, h := range p.hosts {
		if h.Slots == 0 || p.running[h.Name] < h.Slots {
			return h.Name, true
		}
	}
	return "", false
}

// has reports whether the host is in the current list.
func (p *placement) has(name string) bool {
	return slices.ContainsFunc(p.hosts, func(h Host) bool { return h.Name == name })
}

// take counts one more worker running (or starting) on host.
func (p *placement) take(host string) { p.running[host]++ }

// release counts one worker less on host: it exited, or its launch failed.
func (p *placement) release(host string) { p.running[host]-- }

// shareOf is how many workers the job started on host (at least 1): a
// worker added there later gets as many (GOMAXPROCS).
func (p *placement) shareOf(host string) int { return max(1, p.share[host]) }

// unlisted returns the hosts that run workers of the job but are not in
// the current list, in name order: a job taken back runs its workers where
// the runner that died placed them, and the first list this runner takes
// may name none of those hosts.
func (p *placement) unlisted() []string {
	var out []string
	for name, n := range p.running {
		if n > 0 && !p.has(name) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// setHosts takes a new host list from the Discovery and returns the hosts
// it dropped.
func (p *placement) setHosts(hosts []Host) (dropped []string) {
	for _, h := range p.hosts {
		if !slices.ContainsFunc(hosts, func(n Host) bool { return n.Name == h.Name }) {
			dropped = append(dropped, h.Name)
		}
	}
	p.hosts = hosts
	return dropped
}
