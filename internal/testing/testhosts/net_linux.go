package testhosts

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Config configures a Net. A zero field takes the default.
type Config struct {
	// Prefix starts every namespace name; the harness appends its pid and
	// random bytes. Default "gvh".
	Prefix string
	// SSHPort is where every host's sshd listens. Default 22.
	SSHPort int
	// ShmBytes bounds each host's /dev/shm (a tmpfs: memory is used only as
	// files are written). Default 1 GiB.
	ShmBytes int64
	// StartTimeout bounds bringing up one host (namespace, link, sshd).
	// Default 20 s.
	StartTimeout time.Duration
	// Link is every host's link as it is added (Host.Shape changes it
	// later). Default: unshaped, at memory speed.
	Link Link
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{Prefix: "gvh", SSHPort: 22, ShmBytes: 1 << 30, StartTimeout: 20 * time.Second}
}

func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig()
	if c.Prefix == "" {
		c.Prefix = d.Prefix
	}
	for _, r := range c.Prefix {
		if !(r >= 'a' && r <= 'z') {
			return c, fmt.Errorf("testhosts: Prefix %q must be lower-case letters", c.Prefix)
		}
	}
	if c.SSHPort == 0 {
		c.SSHPort = d.SSHPort
	}
	if c.SSHPort < 1 || c.SSHPort > 65535 {
		return c, fmt.Errorf("testhosts: SSHPort %d outside [1, 65535]", c.SSHPort)
	}
	if c.ShmBytes <= 0 {
		c.ShmBytes = d.ShmBytes
	}
	if c.StartTimeout <= 0 {
		c.StartTimeout = d.StartTimeout
	}
	var err error
	if c.Link, err = c.Link.withDefaults(); err != nil {
		return c, err
	}
	if c.Link.Rate > 0 {
		if err := CanShape(); err != nil {
			return c, err
		}
	}
	return c, nil
}

// Subnet is the range every host address comes from; nothing else is used.
var subnet = netip.MustParsePrefix("198.18.0.0/24")

// maxHosts: .1 is left unused (no gateway), .255 is the broadcast address.
const maxHosts = 253

// ErrUnavailable wraps the reason hosts cannot be created here.
var ErrUnavailable = errors.New("testhosts: network namespaces are not available")

// EnvRequire names the variable that turns NewT's skip into a failure: CI,
// which runs as root, sets it so that the multi-host tests cannot silently
// stop running.
const EnvRequire = "GOROVOD_REQUIRE_TESTHOSTS"

// Net is a set of hosts on one private bridge.
type Net struct {
	cfg        Config
	id         string // every name starts with it
	dir        string // keys, configurations, sshd logs
	sw         string // the switch namespace (holds the bridge)
	clientKey  string
	knownHosts string
	hostsFile  string // bind-mounted over /etc/hosts in every host

	mu     sync.Mutex
	hosts  []*Host // in creation order, removed ones left out
	next   int     // index of the next host (1-based, never reused)
	closed bool
}

// Available reports why hosts cannot be created on this machine (nil when
// they can, as far as can be told without creating one).
func Available() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: not root (euid %d)", ErrUnavailable, os.Geteuid())
	}
	for _, tool := range []string{"ip", "nsenter", "unshare", "ssh", "ssh-keygen", sshdPath} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%w: %s not found (apt-get install iproute2 util-linux openssh-client openssh-server)", ErrUnavailable, tool)
		}
	}
	return nil
}

const sshdPath = "/usr/sbin/sshd"

// NewT returns a Net that t's cleanup closes. It skips t, saying why, where
// hosts cannot be created, unless EnvRequire is set.
func NewT(t testing.TB, cfg Config) *Net {
	t.Helper()
	n, err := New(cfg)
	if errors.Is(err, ErrUnavailable) && os.Getenv(EnvRequire) == "" {
		t.Skipf("%v (set %s=1 to make this a failure)", err, EnvRequire)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("testhosts cleanup: %v", err)
		}
	})
	return n
}

// NewHosts returns a Net that t's cleanup closes, with k hosts up (named h1
// to hk, in that order); it skips t as NewT does.
func NewHosts(t testing.TB, cfg Config, k int) (*Net, []*Host) {
	t.Helper()
	n := NewT(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), n.cfg.StartTimeout+time.Duration(k)*time.Second)
	defer cancel()
	hs, err := n.AddHosts(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	return n, hs
}

// New creates an empty Net: the switch namespace with its bridge, and the
// client key. Close removes it.
func New(cfg Config) (*Net, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := Available(); err != nil {
		return nil, err
	}
	removeStale(cfg.Prefix)
	var r [2]byte
	_, _ = rand.Read(r[:])
	n := &Net{cfg: cfg, id: fmt.Sprintf("%s%d-%s", cfg.Prefix, os.Getpid(), hex.EncodeToString(r[:])), next: 1}
	if n.dir, err = os.MkdirTemp("", n.id+"-"); err != nil {
		return nil, err
	}
	// sshd refuses to start without its privilege separation directory, which
	// the package's service would create.
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		os.RemoveAll(n.dir)
		return nil, err
	}
	n.sw = n.id + "-sw"
	ctx, cancel := context.WithTimeout(context.Background(), cfg.StartTimeout)
	defer cancel()
	if err := run(ctx, "ip", "netns", "add", n.sw); err != nil {
		os.RemoveAll(n.dir)
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	n.clientKey = filepath.Join(n.dir, "client_ed25519")
	n.knownHosts = filepath.Join(n.dir, "known_hosts")
	n.hostsFile = filepath.Join(n.dir, "hosts")
	steps := [][]string{
		{"ip", "-n", n.sw, "link", "add", "br0", "type", "bridge"},
		{"ip", "-n", n.sw, "link", "set", "br0", "up"},
		{"ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", n.id + "-client", "-f", n.clientKey},
	}
	for _, s := range steps {
		if err = run(ctx, s[0], s[1:]...); err != nil {
			break
		}
	}
	if err == nil {
		err = copyFile(n.clientKey+".pub", filepath.Join(n.dir, "authorized_keys"))
	}
	if err == nil {
		err = n.writeFiles()
	}
	if err != nil {
		_ = n.Close()
		return nil, err
	}
	return n, nil
}

// ID is the prefix of every name this Net created.
func (n *Net) ID() string { return n.id }

// Dir holds the keys, the configurations and each host's sshd log
// (HOST-sshd.log), which is where to look when a connection is refused.
func (n *Net) Dir() string { return n.dir }

// ClientKey is the private key every host's root accepts.
func (n *Net) ClientKey() string { return n.clientKey }

// KnownHostsFile lists every host's key under its name and address.
func (n *Net) KnownHostsFile() string { return n.knownHosts }

// SSHPort is the port every sshd listens on.
func (n *Net) SSHPort() int { return n.cfg.SSHPort }

// SSHArgs are the ssh client options that reach the hosts: this key, the
// hosts' keys checked strictly, no user configuration, no prompt.
func (n *Net) SSHArgs() []string {
	return []string{"-F", "none", "-p", strconv.Itoa(n.cfg.SSHPort), "-i", n.clientKey, "-l", "root",
		"-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile=" + n.knownHosts,
		"-o", "GlobalKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"}
}

// Hosts returns the hosts not removed, in creation order.
func (n *Net) Hosts() []*Host {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.hosts)
}

// AddHosts brings up k more hosts, concurrently; they are returned in the
// order of their names.
func (n *Net) AddHosts(ctx context.Context, k int) ([]*Host, error) {
	first, err := n.reserve(k)
	if err != nil {
		return nil, err
	}
	hs := make([]*Host, k)
	errs := make([]error, k)
	var wg sync.WaitGroup
	for i := range k {
		wg.Go(func() { hs[i], errs[i] = n.addHost(ctx, first+i) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, h := range hs {
			if h != nil {
				_ = n.RemoveHost(h)
			}
		}
		return nil, err
	}
	return hs, nil
}

// AddHost brings up one more host: its namespaces, its link on the bridge,
// its address and its sshd, which accepts connections when AddHost returns.
func (n *Net) AddHost(ctx context.Context) (*Host, error) {
	index, err := n.reserve(1)
	if err != nil {
		return nil, err
	}
	return n.addHost(ctx, index)
}

// reserve takes k host indices (names and addresses are never reused).
func (n *Net) reserve(k int) (int, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return 0, errors.New("testhosts: the Net is closed")
	}
	if n.next+k-1 > maxHosts {
		return 0, fmt.Errorf("testhosts: more than %d hosts", maxHosts)
	}
	first := n.next
	n.next += k
	return first, nil
}

func (n *Net) addHost(ctx context.Context, index int) (*Host, error) {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.StartTimeout)
	defer cancel()
	addr := subnet.Addr().As4()
	addr[3] = byte(index + 1)
	h := &Host{Name: "h" + strconv.Itoa(index), Addr: netip.AddrFrom4(addr), net: n, index: index}
	h.ns = fmt.Sprintf("%s-%s", n.id, h.Name)
	h.nsPath = "/run/netns/" + h.ns
	h.dir = filepath.Join(n.dir, h.Name)
	if err := os.Mkdir(h.dir, 0o700); err != nil {
		return nil, err
	}
	port := "v" + strconv.Itoa(index) // the switch's end of the link
	steps := [][]string{
		{"ip", "netns", "add", h.ns},
		{"ip", "-n", n.sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", h.ns},
		{"ip", "-n", n.sw, "link", "set", port, "master", "br0", "up"},
		{"ip", "-n", h.ns, "addr", "add", netip.PrefixFrom(h.Addr, subnet.Bits()).String(), "dev", "eth0"},
		{"ip", "-n", h.ns, "link", "set", "eth0", "up"},
		{"ip", "-n", h.ns, "link", "set", "lo", "up"},
		{"ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", h.ns, "-f", filepath.Join(h.dir, "ssh_host_ed25519_key")},
	}
	var err error
	for _, s := range steps {
		if err = run(ctx, s[0], s[1:]...); err != nil {
			break
		}
	}
	if err == nil && n.cfg.Link.Rate > 0 {
		err = h.Shape(n.cfg.Link)
	}
	if err == nil {
		err = h.writeSSHDConfig()
	}
	if err == nil {
		n.mu.Lock()
		n.hosts = append(n.hosts, h)
		slices.SortFunc(n.hosts, func(a, b *Host) int { return a.index - b.index })
		err = n.writeFilesLocked()
		n.mu.Unlock()
	}
	if err == nil {
		err = h.Start(ctx)
	}
	if err != nil {
		_ = n.RemoveHost(h)
		return nil, fmt.Errorf("testhosts: bringing up %s: %w", h.Name, err)
	}
	return h, nil
}

// RemoveHost kills every process of h, stops its impairment and deletes its
// namespace (and with it its link).
func (n *Net) RemoveHost(h *Host) error {
	ctx, cancel := context.WithTimeout(context.Background(), n.cfg.StartTimeout)
	defer cancel()
	h.mu.Lock()
	if h.removed {
		h.mu.Unlock()
		return nil
	}
	h.removed = true
	d := h.delay
	h.delay = nil
	h.mu.Unlock()
	var errs []error
	if d != nil {
		d.close()
	}
	if _, err := os.Stat(h.nsPath); err == nil {
		errs = append(errs, h.KillAll(ctx))
		errs = append(errs, run(ctx, "ip", "netns", "del", h.ns))
	}
	n.mu.Lock()
	n.hosts = slices.DeleteFunc(n.hosts, func(x *Host) bool { return x == h })
	if !n.closed {
		errs = append(errs, n.writeFilesLocked())
	}
	n.mu.Unlock()
	return errors.Join(errs...)
}

// Close removes every host, the switch and the files.
func (n *Net) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	hosts := slices.Clone(n.hosts)
	n.mu.Unlock()
	var errs []error
	for _, h := range hosts {
		errs = append(errs, n.RemoveHost(h))
	}
	if _, err := os.Stat("/run/netns/" + n.sw); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), n.cfg.StartTimeout)
		errs = append(errs, run(ctx, "ip", "netns", "del", n.sw))
		cancel()
	}
	errs = append(errs, os.RemoveAll(n.dir))
	return errors.Join(errs...)
}

func (n *Net) writeFiles() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.writeFilesLocked()
}

// writeFilesLocked rewrites the hosts file and known_hosts. The hosts file
// is rewritten in place: it is bind-mounted into every host, and a new inode
// would not be seen there.
func (n *Net) writeFilesLocked() error {
	var hosts, known strings.Builder
	hosts.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	for _, h := range n.hosts {
		fmt.Fprintf(&hosts, "%s\t%s\n", h.Addr, h.Name)
		pub, err := os.ReadFile(filepath.Join(h.dir, "ssh_host_ed25519_key.pub"))
		if err != nil {
			return err
		}
		names := h.Name + "," + h.Addr.String()
		if n.cfg.SSHPort != 22 {
			names = fmt.Sprintf("[%s]:%d,[%s]:%d", h.Name, n.cfg.SSHPort, h.Addr, n.cfg.SSHPort)
		}
		fmt.Fprintf(&known, "%s %s\n", names, strings.TrimSpace(string(pub)))
	}
	f, err := os.OpenFile(n.hostsFile, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(hosts.String())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.WriteFile(n.knownHosts, []byte(known.String()), 0o600)
}

// removeStale deletes the namespaces of harnesses with this prefix whose
// process is gone (a test binary killed before its cleanup ran), and kills
// what still runs in them.
func removeStale(prefix string) {
	entries, err := os.ReadDir("/run/netns")
	if err != nil {
		return
	}
	for _, e := range entries {
		name := e.Name()
		rest, ok := strings.CutPrefix(name, prefix)
		if !ok {
			continue
		}
		pidStr, _, ok := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid <= 0 || processAlive(pid) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		path := "/run/netns/" + name
		_ = killNetNS(ctx, path)
		_ = run(ctx, "ip", "netns", "del", name)
		cancel()
		if dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+pidStr+"-*")); len(dirs) > 0 {
			for _, d := range dirs {
				os.RemoveAll(d)
			}
		}
	}
}

func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// run runs a setup command and returns its output in the error.
func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o600)
}
