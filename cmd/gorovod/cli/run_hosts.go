package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/internal/netaddr"
	"github.com/gorovod/gorovod/job"
	"github.com/gorovod/gorovod/job/hosts"
	"github.com/gorovod/gorovod/job/launch"
)

// hostOptions is the multi-host part of `gorovod run`'s command line, as
// horovodrun has it: where the workers run (-H, --hostfile,
// --host-discovery-script), how other hosts are reached (ssh), and which
// addresses the job's processes bind to and advertise.
type hostOptions struct {
	list, hostfile, script string
	slots                  int
	cooldown               string
	sshPort                int
	sshIdentity            string
	sshOptions             stringList
	startTimeout           seconds
	elasticTimeout         seconds
	probeTimeout           seconds
	networkInterface       string
	gossipAddr, advertise  string

	// Set by prepare.
	static   []hosts.Host // -H or --hostfile
	cool     hosts.Cooldown
	anyHosts bool // a host option was given: workers may run elsewhere
}

// seconds is a duration flag that takes plain seconds ("30", as horovodrun's
// timeouts) or a Go duration ("30s", "1m30s").
type seconds time.Duration

func (s *seconds) String() string { return time.Duration(*s).String() }

func (s *seconds) Set(v string) error {
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		*s = seconds(f * float64(time.Second))
	} else if d, err := time.ParseDuration(v); err == nil {
		*s = seconds(d)
	} else {
		return fmt.Errorf("%q: want seconds (30) or a duration (30s, 2m)", v)
	}
	if *s <= 0 {
		return fmt.Errorf("%q: must be positive", v)
	}
	return nil
}

func (h *hostOptions) register(fs *flag.FlagSet) {
	for _, name := range []string{"H", "hosts"} {
		fs.StringVar(&h.list, name, "", "`hosts` to run workers on, with their slots: host1:2,host2:2 (a host without :N has 1 slot; localhost runs here); other hosts are reached over ssh")
	}
	fs.StringVar(&h.hostfile, "hostfile", "", "a `file` of hosts, one \"host slots=N\" per line, instead of -H")
	fs.StringVar(&h.script, "host-discovery-script", "", "a `command` run every second that prints the available hosts, one host:slots per line (elastic: hosts come and go)")
	for _, name := range []string{"slots", "slots-per-host"} {
		fs.IntVar(&h.slots, name, 1, "slots of a host the discovery script prints without :N")
	}
	fs.StringVar(&h.cooldown, "blacklist-cooldown-range", "", "`MIN,MAX` seconds a host that lost a worker stays blacklisted: MIN·2^k plus up to MIN of jitter, at most MAX (default: for good, as Horovod)")
	for _, name := range []string{"p", "ssh-port"} {
		fs.IntVar(&h.sshPort, name, 0, "ssh `port` of the hosts (default: the ssh configuration's)")
	}
	for _, name := range []string{"i", "ssh-identity-file"} {
		fs.StringVar(&h.sshIdentity, name, "", "ssh identity (private key) `file` (default: the ssh configuration's)")
	}
	fs.Var(&h.sshOptions, "ssh-option", "an ssh `Name=value` option passed as -o (repeatable), e.g. User=ubuntu or UserKnownHostsFile=FILE")
	h.startTimeout = seconds(30 * time.Second)
	fs.Var(&h.startTimeout, "start-timeout", "`seconds` a worker has to start on its host (and the driver to start); the job's first world waits this long for all --np workers before it starts with those that came (at least --min-np, with a warning)")
	fs.Var(&h.elasticTimeout, "elastic-timeout", "`seconds` a worker waits for a world after a change, e.g. for --min-np workers; and, past --start-timeout, a job waits for enough workers to join for its first world before it fails, naming those that did not; a worker that never joined and is out of the job's view for half of it is woken (SIGCONT), and any woken worker still out a quarter of it later is stopped and replaced (default 600)")
	fs.Var(&h.probeTimeout, "probe-timeout", "`seconds` a worker blamed for a failed collective, or declared dead by gossip, has to answer the liveness probe of the driver (or of the worker proposing in its place once this process is gone) before it is left out of the next world; longer keeps a worker that is starved of CPU or behind a slow link in its world, and holds the next world that long when one is frozen (default 0.5)")
	fs.StringVar(&h.networkInterface, "network-interface", "", "`names` of the interfaces (comma-separated, the first a host has) whose address the driver and workers bind to and advertise; default: the address on the route to the driver")
	fs.StringVar(&h.gossipAddr, "gossip-addr", "", "`host[:port]` the driver's gossip binds to (default: --network-interface's address, or the one on the route to the first remote host, or loopback)")
	fs.StringVar(&h.advertise, "advertise-addr", "", "`host` workers reach the driver at, when it differs from the bind address (a wildcard bind, NAT)")
}

// prepare checks the flags and reads the host list; its errors are usage
// errors.
func (h *hostOptions) prepare() error {
	given := 0
	for _, v := range []string{h.list, h.hostfile, h.script} {
		if v != "" {
			given++
		}
	}
	if given > 1 {
		return errors.New("give one of -H, --hostfile and --host-discovery-script")
	}
	h.anyHosts = given > 0
	var err error
	switch {
	case h.list != "":
		if h.static, err = hosts.ParseList(h.list); err != nil {
			return fmt.Errorf("-H: %w", err)
		}
	case h.hostfile != "":
		if h.static, err = hosts.ReadHostfile(h.hostfile); err != nil {
			return fmt.Errorf("--hostfile: %w", err)
		}
	}
	if h.slots < 1 || h.slots > hosts.MaxSlots {
		return fmt.Errorf("--slots %d: want 1 to %d", h.slots, hosts.MaxSlots)
	}
	if h.cooldown != "" {
		lo, hi, ok := strings.Cut(h.cooldown, ",")
		var a, b seconds
		if !ok || a.Set(strings.TrimSpace(lo)) != nil || b.Set(strings.TrimSpace(hi)) != nil {
			return fmt.Errorf("--blacklist-cooldown-range %q: want MIN,MAX in seconds", h.cooldown)
		}
		h.cool = hosts.Cooldown{Min: time.Duration(a), Max: time.Duration(b)}
		if err := h.cool.Check(); err != nil {
			return fmt.Errorf("--blacklist-cooldown-range: %w", err)
		}
	}
	if h.sshPort < 0 || h.sshPort > 65535 {
		return fmt.Errorf("--ssh-port %d outside [1, 65535]", h.sshPort)
	}
	for _, o := range h.sshOptions {
		if !strings.Contains(o, "=") || strings.HasPrefix(o, "-") {
			return fmt.Errorf("--ssh-option %q: want Name=value", o)
		}
	}
	if h.sshIdentity != "" {
		if _, err := os.Stat(h.sshIdentity); err != nil {
			return fmt.Errorf("--ssh-identity-file: %w", err)
		}
	}
	if h.networkInterface != "" {
		if _, err := netaddr.FirstInterfaceAddr(h.networkInterface); err != nil {
			return fmt.Errorf("--network-interface: %w", err)
		}
	}
	return nil
}

// configure points the job at its hosts: the discovery, the ssh launcher
// (this host's workers still start as local processes), the driver's gossip
// address and what the workers need to pick theirs. assignGPUs gives each
// worker of this host a GPU of its own (job.LocalLauncher.AssignGPUs).
// notice reports discovery failures and blacklistings.
func (h *hostOptions) configure(ctx context.Context, cfg *job.Config, placement launch.Placement, assignGPUs bool, notice func(string)) error {
	cfg.StartTimeout = time.Duration(h.startTimeout)
	cfg.ProbeTimeout = time.Duration(h.probeTimeout)     // the workers get it too (GOROVOD_PROBE_TIMEOUT)
	cfg.ElasticTimeout = time.Duration(h.elasticTimeout) // the workers get it too (GOROVOD_ELASTIC_TIMEOUT)
	if h.networkInterface != "" {
		cfg.Env = append(cfg.Env, envconfig.EnvNetworkInterface+"="+h.networkInterface)
	}
	if !h.anyHosts {
		cfg.Launcher = &job.LocalLauncher{Placement: placement, AssignGPUs: assignGPUs}
	} else {
		var src hosts.Discovery = hosts.Static(h.static)
		if h.script != "" {
			src = hosts.Script{Command: h.script, DefaultSlots: h.slots, Timeout: time.Duration(h.startTimeout)}
		}
		w := job.NewHostWatch(src, hosts.WatchConfig{Cooldown: h.cool})
		w.OnError = notice
		cfg.Discovery = w
		cfg.Launcher = &job.SSHLauncher{Local: job.LocalLauncher{Placement: placement, AssignGPUs: assignGPUs}, SSH: launch.SSH{
			Port: h.sshPort, IdentityFile: h.sshIdentity, Options: h.sshOptions,
			ConnectTimeout: min(10*time.Second, time.Duration(h.startTimeout)), StartTimeout: time.Duration(h.startTimeout),
		}}
	}
	return h.gossip(ctx, cfg, notice)
}

// gossip sets the driver's gossip bind and advertise addresses: given, or the
// address of --network-interface, or the one this host reaches the first
// remote host from, or loopback for a job that stays here.
func (h *hostOptions) gossip(ctx context.Context, cfg *job.Config, notice func(string)) error {
	g := &cfg.Gossip
	if h.advertise != "" {
		g.AdvertiseAddr = h.advertise
	}
	if h.gossipAddr != "" {
		host, port, err := net.SplitHostPort(h.gossipAddr)
		if err != nil {
			g.BindAddr = h.gossipAddr
			return nil
		}
		g.BindAddr = host
		if g.BindPort, err = strconv.Atoi(port); err != nil {
			return fmt.Errorf("--gossip-addr %q: %v", h.gossipAddr, err)
		}
		return nil
	}
	remote := ""
	for _, x := range h.static {
		if !launch.IsLocal(x.Name) {
			remote = x.Name
			break
		}
	}
	if remote == "" && h.script != "" {
		// The hosts of a discovery script come later; one of them now, or
		// this host's own name, says which network they are on.
		if found, err := (hosts.Script{Command: h.script, DefaultSlots: h.slots}).Discover(ctx); err == nil {
			for _, x := range found {
				if !launch.IsLocal(x.Name) {
					remote = x.Name
					break
				}
			}
		}
		if remote == "" {
			remote, _ = os.Hostname()
		}
	}
	a, err := netaddr.Pick(h.networkInterface, remote)
	if err != nil {
		return h.driverAddrError(remote, err)
	}
	if h.script != "" && a.IsLoopback() && h.networkInterface == "" {
		notice("the driver listens on loopback only: give --network-interface or --gossip-addr for workers on other hosts")
	}
	g.BindAddr = a.String()
	return nil
}

// driverAddrError says why the driver's address could not be chosen from
// the route to remote, the first remote host. Most often its name does not
// resolve here: a typo, or a name only ssh knows (~/.ssh/config), which
// the advice to give --network-interface alone would not tell apart.
func (h *hostOptions) driverAddrError(remote string, err error) error {
	var dns *net.DNSError
	if errors.As(err, &dns) {
		from := "the --host-discovery-script"
		switch {
		case h.list != "":
			from = "-H"
		case h.hostfile != "":
			from = "--hostfile " + h.hostfile
		}
		return fmt.Errorf("host %q of %s: its name does not resolve here (%v); if only ssh knows it (~/.ssh/config), "+
			"give --network-interface or --gossip-addr: the driver's address is otherwise the one this host reaches it from", remote, from, dns)
	}
	return fmt.Errorf("choosing the driver's address (give --network-interface or --gossip-addr): %w", err)
}

// reportExclusions says which workers a world left out while they ran
// (paused, cut off), whether they came back, and whether training finished:
// the job's exit status is about the latter only.
func (d *display) reportExclusions(o job.Outcome) {
	for _, w := range o.Workers {
		if w.Excluded == 0 {
			continue
		}
		where := ""
		if w.Host != "" {
			where = " on " + w.Host
		}
		back := fmt.Sprintf("came back as a new member %d×", w.Rejoined)
		if w.Rejoined == 0 {
			back = "did not come back"
		}
		d.report("worker %d%s was left out of the world %d× (declared failed while paused or cut off) and %s; it ended %s",
			w.Index, where, w.Excluded, back, w.State)
	}
	if n := o.EarlierWorkers.LeftOut; n > 0 {
		d.report("%d more workers, whose records are not kept, were left out of a world while they ran (declared failed while paused or cut off)", n)
	}
	if !o.TrainingFinished {
		d.report("training did not finish")
	}
}
