package envconfig

import (
	"encoding/hex"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/tcp"
	"github.com/gorovod/gorovod/internal/netaddr"
)

// The variables a launcher sets for its workers.
const (
	EnvJobID      = "GOROVOD_JOB_ID"
	EnvRank       = "GOROVOD_RANK"
	EnvSize       = "GOROVOD_SIZE"
	EnvSecret     = "GOROVOD_SECRET" // hex; never put on a command line, where ps would show it
	EnvRendezvous = "GOROVOD_RENDEZVOUS"
	EnvListenAddr = "GOROVOD_LISTEN_ADDR" // optional: the collective listen address
	EnvSeeds      = "GOROVOD_SEEDS"       // elastic jobs: comma-separated gossip addresses to join through
	EnvGossipAddr = "GOROVOD_GOSSIP_ADDR" // elastic jobs, optional: the gossip bind address (host or host:port)
	// EnvNetworkInterface names the interface whose address a worker binds to
	// and advertises (gossip and collectives), a comma-separated list of
	// names (the first this host has is used), as Horovod's
	// --network-interface. Without it, and without GOROVOD_LISTEN_ADDR and
	// GOROVOD_GOSSIP_ADDR, a worker whose driver or rendezvous is on another
	// host uses the address its route there leaves from; one whose driver is
	// on this host uses loopback.
	EnvNetworkInterface = "GOROVOD_NETWORK_INTERFACE"
	// EnvAdvertiseAddr is the host other processes reach this worker at, when
	// it differs from the bind address (a wildcard bind address, NAT). The
	// ports stay the bound ones.
	EnvAdvertiseAddr = "GOROVOD_ADVERTISE_ADDR"
	// EnvElasticTimeout bounds how long an elastic worker waits for a world
	// after a change (a Go duration, "10m"), as Horovod's --elastic-timeout:
	// past it, the worker gives up with an error. Default: the session's
	// (sync.Config.RecoveryTimeout, 10 minutes).
	EnvElasticTimeout = "GOROVOD_ELASTIC_TIMEOUT"
	// EnvMinWorkers is the job's minimum number of workers (gorovod run's
	// --min-np, job.Config.MinWorkers), a positive integer. A worker that
	// takes over proposing worlds (the driver out of its view for the
	// takeover grace) proposes none smaller: without it, a lone worker could
	// form a world of one while the driver forms its own. Unset: 1.
	EnvMinWorkers = "GOROVOD_MIN_WORKERS"
	// EnvFirstWorld is the number of workers the job was started with
	// (gorovod run's --np, job.Config.Workers), a positive integer: the
	// voters of its first world. A worker that takes over proposing before
	// any world has reached it proposes a first world only with a strict
	// majority of them: without it, workers cut off from the driver as the
	// first world forms would form one of their own beside the driver's.
	// Unset: not known, and a first world needs no majority.
	EnvFirstWorld = "GOROVOD_NP"
	// EnvProbeTimeout is the job's probe timeout (job.Config.ProbeTimeout,
	// the driver's driver.Config.ProbeTimeout), a positive Go duration
	// ("2s"): how long the proposer waits for a worker blamed for a failure
	// to answer its liveness probe before it leaves it out of the next
	// world. A worker that takes over proposing (the driver gone) waits as
	// long as the driver it replaces. Unset: the proposer's default, 500 ms.
	EnvProbeTimeout = "GOROVOD_PROBE_TIMEOUT"
	// EnvLaunchIndex is the launcher's number for the process (0, 1, ... in
	// start order, never reused), unlike a rank, which changes with the world.
	EnvLaunchIndex = "GOROVOD_LAUNCH_INDEX"
	// EnvDataSecurity is how the collective transport protects frames
	// between hosts (transport.Security): plain, authenticated or
	// encrypted, as `gorovod run --security` (or --encrypt) says. Every
	// worker of a job must have the same. Default: authenticated between
	// hosts, plain between workers of one host (transport.SecurityDefault).
	EnvDataSecurity = "GOROVOD_DATA_SECURITY"
	// EnvTCPLanes is how many TCP connections (lanes) each link between
	// two workers has, 1 to 16 (tcp.Config.Lanes), as `gorovod run
	// --lanes` says: large frames are striped over them. Every worker of a
	// job must have the same. Default (unset or 0): automatic, one lane
	// between workers of one host; between hosts four, of which each link
	// uses as many as raise the rate it measures.
	EnvTCPLanes = "GOROVOD_TCP_LANES"
)

// tcpLanes reads EnvTCPLanes (0 when not set).
func tcpLanes(getenv func(string) string) (int, error) {
	v := getenv(EnvTCPLanes)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > tcp.MaxLanes {
		return 0, fmt.Errorf("%s=%q is not a lane count from 0 to %d", EnvTCPLanes, v, tcp.MaxLanes)
	}
	return n, nil
}

func appendLanes(env []string, n int) []string {
	if n != 0 {
		env = append(env, EnvTCPLanes+"="+strconv.Itoa(n))
	}
	return env
}

// dataSecurity reads EnvDataSecurity.
func dataSecurity(getenv func(string) string) (transport.Security, error) {
	v := getenv(EnvDataSecurity)
	s, err := transport.ParseSecurity(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: %w", EnvDataSecurity, v, err)
	}
	return s, nil
}

func appendSecurity(env []string, s transport.Security) []string {
	if s != transport.SecurityDefault {
		env = append(env, EnvDataSecurity+"="+s.String())
	}
	return env
}

// LaunchIndex reads EnvLaunchIndex; ok is false when it is unset.
func LaunchIndex(getenv func(string) string) (index int, ok bool, err error) {
	v := getenv(EnvLaunchIndex)
	if v == "" {
		return 0, false, nil
	}
	i, err := strconv.Atoi(v)
	if err != nil || i < 0 {
		return 0, false, fmt.Errorf("envconfig: %s=%q is not a launch index", EnvLaunchIndex, v)
	}
	return i, true, nil
}

// Worker is what a launched worker learns from its environment.
type Worker struct {
	JobID      string
	Rank       int
	Size       int
	Secret     []byte
	Rendezvous string
	// ListenAddr is the collective transport's listen address. Default: see
	// EnvNetworkInterface (the rendezvous is the peer whose route counts).
	ListenAddr       string
	NetworkInterface string // EnvNetworkInterface
	AdvertiseAddr    string // EnvAdvertiseAddr
	// Security is EnvDataSecurity (SecurityDefault when not set).
	Security transport.Security
	// TCPLanes is EnvTCPLanes (0 when not set: the transport's choice).
	TCPLanes int
}

// Load reads a Worker through getenv (os.Getenv in a program, a map in tests).
func Load(getenv func(string) string) (Worker, error) {
	w := Worker{
		JobID:            getenv(EnvJobID),
		Rendezvous:       getenv(EnvRendezvous),
		ListenAddr:       getenv(EnvListenAddr),
		NetworkInterface: getenv(EnvNetworkInterface),
		AdvertiseAddr:    getenv(EnvAdvertiseAddr),
	}
	var missing []string
	for _, v := range []string{EnvJobID, EnvRank, EnvSize, EnvSecret, EnvRendezvous} {
		if getenv(v) == "" {
			missing = append(missing, v)
		}
	}
	if len(missing) > 0 {
		return w, fmt.Errorf("not started by a gorovod launcher: %v unset", missing)
	}
	var err error
	if w.Rank, err = strconv.Atoi(getenv(EnvRank)); err != nil {
		return w, fmt.Errorf("%s=%q: %w", EnvRank, getenv(EnvRank), err)
	}
	if w.Size, err = strconv.Atoi(getenv(EnvSize)); err != nil || w.Size < 1 {
		return w, fmt.Errorf("%s=%q is not a positive number", EnvSize, getenv(EnvSize))
	}
	if w.Rank < 0 || w.Rank >= w.Size {
		return w, fmt.Errorf("%s=%d outside world of size %d", EnvRank, w.Rank, w.Size)
	}
	if w.Security, err = dataSecurity(getenv); err != nil {
		return w, err
	}
	if w.TCPLanes, err = tcpLanes(getenv); err != nil {
		return w, err
	}
	if w.Secret, err = hex.DecodeString(getenv(EnvSecret)); err != nil || len(w.Secret) < 16 {
		return w, fmt.Errorf("%s must be at least 16 hex-encoded bytes", EnvSecret)
	}
	if w.ListenAddr == "" {
		a, err := bindAddr(w.NetworkInterface, w.Rendezvous)
		if err != nil {
			return w, err
		}
		w.ListenAddr = net.JoinHostPort(a, "0")
	}
	return w, nil
}

// bindAddr is the default bind address (see EnvNetworkInterface).
func bindAddr(iface, peer string) (string, error) {
	a, err := netaddr.Pick(iface, peer)
	if err != nil {
		if iface != "" {
			return "", fmt.Errorf("%s=%s: %w", EnvNetworkInterface, iface, err)
		}
		return "", fmt.Errorf("choosing the address to reach %s from: %w (set %s)", peer, err, EnvNetworkInterface)
	}
	return a.String(), nil
}

// Environ renders w as NAME=value entries for a child process.
func (w Worker) Environ() []string {
	env := []string{
		EnvJobID + "=" + w.JobID,
		EnvRank + "=" + strconv.Itoa(w.Rank),
		EnvSize + "=" + strconv.Itoa(w.Size),
		EnvSecret + "=" + hex.EncodeToString(w.Secret),
		EnvRendezvous + "=" + w.Rendezvous,
	}
	if w.ListenAddr != "" {
		env = append(env, EnvListenAddr+"="+w.ListenAddr)
	}
	env = appendSecurity(env, w.Security)
	env = appendLanes(env, w.TCPLanes)
	return appendAddressing(env, w.NetworkInterface, w.AdvertiseAddr)
}

func appendAddressing(env []string, iface, advertise string) []string {
	if iface != "" {
		env = append(env, EnvNetworkInterface+"="+iface)
	}
	if advertise != "" {
		env = append(env, EnvAdvertiseAddr+"="+advertise)
	}
	return env
}

// ElasticWorker is what a worker of an elastic job learns from its environment:
// no rank or size (those change with every epoch), but where to join.
type ElasticWorker struct {
	JobID  string
	Secret []byte
	Seeds  []string
	// ListenAddr (collective transport, "host:port") and GossipAddr
	// (membership, "host" or "host:port") default to the address
	// EnvNetworkInterface says, with any port: the named interface's, else
	// the one the route to the first seed leaves from, else loopback.
	ListenAddr       string
	GossipAddr       string
	NetworkInterface string // EnvNetworkInterface
	AdvertiseAddr    string // EnvAdvertiseAddr
	// ElasticTimeout is EnvElasticTimeout (0: not set).
	ElasticTimeout time.Duration
	// Security is EnvDataSecurity (SecurityDefault when not set).
	Security transport.Security
	// TCPLanes is EnvTCPLanes (0 when not set: the transport's choice).
	TCPLanes int
	// MinWorkers is EnvMinWorkers (0: not set).
	MinWorkers int
	// FirstWorld is EnvFirstWorld (0: not set).
	FirstWorld int
	// ProbeTimeout is EnvProbeTimeout (0: not set).
	ProbeTimeout time.Duration
}

// LoadElastic reads an ElasticWorker through getenv.
func LoadElastic(getenv func(string) string) (ElasticWorker, error) {
	w := ElasticWorker{JobID: getenv(EnvJobID), ListenAddr: getenv(EnvListenAddr), GossipAddr: getenv(EnvGossipAddr),
		NetworkInterface: getenv(EnvNetworkInterface), AdvertiseAddr: getenv(EnvAdvertiseAddr)}
	var missing []string
	for _, v := range []string{EnvJobID, EnvSecret, EnvSeeds} {
		if getenv(v) == "" {
			missing = append(missing, v)
		}
	}
	if len(missing) > 0 {
		return w, fmt.Errorf("not started by gorovod run (or its job file): %v unset", missing)
	}
	var err error
	if w.Secret, err = hex.DecodeString(getenv(EnvSecret)); err != nil || len(w.Secret) < 16 {
		return w, fmt.Errorf("%s must be at least 16 hex-encoded bytes", EnvSecret)
	}
	for _, s := range strings.Split(getenv(EnvSeeds), ",") {
		if s = strings.TrimSpace(s); s != "" {
			w.Seeds = append(w.Seeds, s)
		}
	}
	if len(w.Seeds) == 0 {
		return w, fmt.Errorf("%s lists no address", EnvSeeds)
	}
	if w.Security, err = dataSecurity(getenv); err != nil {
		return w, err
	}
	if w.TCPLanes, err = tcpLanes(getenv); err != nil {
		return w, err
	}
	if v := getenv(EnvElasticTimeout); v != "" {
		if w.ElasticTimeout, err = time.ParseDuration(v); err != nil || w.ElasticTimeout <= 0 {
			return w, fmt.Errorf("%s=%q is not a positive duration", EnvElasticTimeout, v)
		}
	}
	if v := getenv(EnvMinWorkers); v != "" {
		if w.MinWorkers, err = strconv.Atoi(v); err != nil || w.MinWorkers < 1 {
			return w, fmt.Errorf("%s=%q is not a positive number of workers", EnvMinWorkers, v)
		}
	}
	if v := getenv(EnvFirstWorld); v != "" {
		if w.FirstWorld, err = strconv.Atoi(v); err != nil || w.FirstWorld < 1 {
			return w, fmt.Errorf("%s=%q is not a positive number of workers", EnvFirstWorld, v)
		}
	}
	if v := getenv(EnvProbeTimeout); v != "" {
		if w.ProbeTimeout, err = time.ParseDuration(v); err != nil || w.ProbeTimeout <= 0 {
			return w, fmt.Errorf("%s=%q is not a positive duration", EnvProbeTimeout, v)
		}
	}
	if w.ListenAddr == "" || w.GossipAddr == "" {
		a, err := bindAddr(w.NetworkInterface, w.Seeds[0])
		if err != nil {
			return w, err
		}
		if w.ListenAddr == "" {
			w.ListenAddr = net.JoinHostPort(a, "0")
		}
		if w.GossipAddr == "" {
			w.GossipAddr = a
		}
	}
	return w, nil
}

// Environ renders w as NAME=value entries for a child process.
func (w ElasticWorker) Environ() []string {
	env := []string{
		EnvJobID + "=" + w.JobID,
		EnvSecret + "=" + hex.EncodeToString(w.Secret),
		EnvSeeds + "=" + strings.Join(w.Seeds, ","),
	}
	if w.ListenAddr != "" {
		env = append(env, EnvListenAddr+"="+w.ListenAddr)
	}
	if w.GossipAddr != "" {
		env = append(env, EnvGossipAddr+"="+w.GossipAddr)
	}
	if w.ElasticTimeout > 0 {
		env = append(env, EnvElasticTimeout+"="+w.ElasticTimeout.String())
	}
	env = appendSecurity(env, w.Security)
	env = appendLanes(env, w.TCPLanes)
	if w.MinWorkers > 0 {
		env = append(env, EnvMinWorkers+"="+strconv.Itoa(w.MinWorkers))
	}
	if w.FirstWorld > 0 {
		env = append(env, EnvFirstWorld+"="+strconv.Itoa(w.FirstWorld))
	}
	if w.ProbeTimeout > 0 {
		env = append(env, EnvProbeTimeout+"="+w.ProbeTimeout.String())
	}
	return appendAddressing(env, w.NetworkInterface, w.AdvertiseAddr)
}

// EnvVisibleDevices is CUDA's own variable: the GPUs a process may use.
const EnvVisibleDevices = "CUDA_VISIBLE_DEVICES"

// EnvAssignGPUs, read by gorovod run, turns on what --assign-gpus does when
// the flag is not given: each worker the launcher starts on its own host gets
// one GPU of its own through CUDA_VISIBLE_DEVICES (then seen as device 0).
// A boolean as Go's strconv.ParseBool reads it ("1", "true", "0", "false").
// Unset: off; every worker sees the GPUs the launcher's environment shows.
const EnvAssignGPUs = "GOROVOD_ASSIGN_GPUS"

// AssignGPUs reads EnvAssignGPUs (false when unset).
func AssignGPUs(getenv func(string) string) (bool, error) {
	v := getenv(EnvAssignGPUs)
	if v == "" {
		return false, nil
	}
	on, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("envconfig: %s=%q: want 1 or 0 (true or false)", EnvAssignGPUs, v)
	}
	return on, nil
}

// VisibleDevices returns the entries of CUDA_VISIBLE_DEVICES, and whether it
// is set at all (set but empty means no GPU).
func VisibleDevices(lookup func(string) (string, bool)) ([]string, bool) {
	v, ok := lookup(EnvVisibleDevices)
	if !ok {
		return nil, false
	}
	var devs []string
	for _, d := range strings.Split(v, ",") {
		if d = strings.TrimSpace(d); d != "" {
			devs = append(devs, d)
		}
	}
	return devs, true
}

// The variables a Kubernetes pod of a gorovod job gets from the downward API
// (the manifests in deploy/kubernetes and the worker pods the Kubernetes
// provisioner creates set them).
const (
	EnvPodName      = "GOROVOD_POD_NAME"
	EnvPodNamespace = "GOROVOD_POD_NAMESPACE"
	EnvPodUID       = "GOROVOD_POD_UID"
	EnvPodIP        = "GOROVOD_POD_IP"
)

// KubernetesPod is the pod this process runs in.
type KubernetesPod struct {
	Name, Namespace, UID, IP string
}

// LoadKubernetesPod reads the pod this process runs in; ok is false when
// GOROVOD_POD_NAME is unset (not in a pod, or a pod without those variables).
func LoadKubernetesPod(getenv func(string) string) (p KubernetesPod, ok bool, err error) {
	p = KubernetesPod{Name: getenv(EnvPodName), Namespace: getenv(EnvPodNamespace), UID: getenv(EnvPodUID), IP: getenv(EnvPodIP)}
	if p.Name == "" {
		return p, false, nil
	}
	var missing []string
	for _, v := range []string{EnvPodNamespace, EnvPodUID} {
		if getenv(v) == "" {
			missing = append(missing, v)
		}
	}
	if len(missing) > 0 {
		return p, true, fmt.Errorf("envconfig: %s is set but %v are not (the downward API gives all three)", EnvPodName, missing)
	}
	return p, true, nil
}

// WithoutSecrets is env (NAME=value entries) less the variables that hold a
// job's credentials (GOROVOD_SECRET), for a program the launcher runs that is
// not a worker: an autoscaling plugin, a host discovery script.
func WithoutSecrets(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if name, _, _ := strings.Cut(kv, "="); name != EnvSecret {
			out = append(out, kv)
		}
	}
	return out
}

// LoadJobSecret reads the job secret alone (EnvSecret, hex): what a
// replacement driver pod of a GorovodJob gets from the job's Secret. ok is
// false when it is not set.
func LoadJobSecret(getenv func(string) string) (secret []byte, ok bool, err error) {
	v := getenv(EnvSecret)
	if v == "" {
		return nil, false, nil
	}
	if secret, err = hex.DecodeString(v); err != nil || len(secret) < 16 {
		return nil, true, fmt.Errorf("%s must be at least 16 hex-encoded bytes", EnvSecret)
	}
	return secret, true, nil
}
