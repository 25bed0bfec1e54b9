package envconfig

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
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
	// EnvLaunchIndex is the launcher's number for the process (0, 1, ... in
	// start order, never reused), unlike a rank, which changes with the world.
	EnvLaunchIndex = "GOROVOD_LAUNCH_INDEX"
)

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
	ListenAddr string
}

// Load reads a Worker through getenv (os.Getenv in a program, a map in tests).
func Load(getenv func(string) string) (Worker, error) {
	w := Worker{
		JobID:      getenv(EnvJobID),
		Rendezvous: getenv(EnvRendezvous),
		ListenAddr: getenv(EnvListenAddr),
	}
	if w.ListenAddr == "" {
		w.ListenAddr = "127.0.0.1:0"
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
	if w.Secret, err = hex.DecodeString(getenv(EnvSecret)); err != nil || len(w.Secret) < 16 {
		return w, fmt.Errorf("%s must be at least 16 hex-encoded bytes", EnvSecret)
	}
	return w, nil
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
	return env
}

// ElasticWorker is what a worker of an elastic job learns from its environment:
// no rank or size (those change with every epoch), but where to join.
type ElasticWorker struct {
	JobID      string
	Secret     []byte
	Seeds      []string
	ListenAddr string // collective transport; default 127.0.0.1:0
	GossipAddr string // membership bind address; default 127.0.0.1 (any port)
}

// LoadElastic reads an ElasticWorker through getenv.
func LoadElastic(getenv func(string) string) (ElasticWorker, error) {
	w := ElasticWorker{JobID: getenv(EnvJobID), ListenAddr: getenv(EnvListenAddr), GossipAddr: getenv(EnvGossipAddr)}
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
	if w.ListenAddr == "" {
		w.ListenAddr = "127.0.0.1:0"
	}
	if w.GossipAddr == "" {
		w.GossipAddr = "127.0.0.1"
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
	return env
}

// EnvVisibleDevices is CUDA's own variable: the GPUs a process may use.
const EnvVisibleDevices = "CUDA_VISIBLE_DEVICES"

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
