package slurm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// Node is where Slurm reaches a node of the cluster: its name in node lists
// (NodeName) is not necessarily a host name.
type Node struct {
	Name     string // NodeName
	Addr     string // NodeAddr: what slurmctld connects to
	Hostname string // NodeHostName
}

// Nodes asks slurmctld (scontrol) where the allocation's nodes are.
func (a Allocation) Nodes(ctx context.Context) ([]Node, error) {
	if len(a.Hosts) == 0 {
		return nil, nil
	}
	names := make([]string, len(a.Hosts))
	for i, h := range a.Hosts {
		names[i] = h.Name
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "scontrol", "--oneliner", "show", "node", strings.Join(names, ",")).Output()
	if err != nil {
		var xe *exec.ExitError
		if errors.As(err, &xe) {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(xe.Stderr)))
		}
		return nil, fmt.Errorf("slurm: scontrol show node: %w", err)
	}
	nodes := parseNodes(string(out))
	if len(nodes) != len(names) {
		return nil, fmt.Errorf("slurm: scontrol described %d of the allocation's %d nodes", len(nodes), len(names))
	}
	return nodes, nil
}

// parseNodes reads `scontrol --oneliner show node`: one node a line, as
// Key=Value fields.
func parseNodes(out string) []Node {
	var nodes []Node
	for _, line := range strings.Split(out, "\n") {
		var n Node
		for _, f := range strings.Fields(line) {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "NodeName":
				n.Name = v
			case "NodeAddr":
				n.Addr = v
			case "NodeHostName":
				n.Hostname = v
			}
		}
		if n.Name != "" {
			nodes = append(nodes, n)
		}
	}
	return nodes
}

// RemoteNode returns the address of a node of the allocation that is not
// this host ("" when every node is this one): the driver of a job whose
// workers run there must bind an address they can reach, not loopback.
func (a Allocation) RemoteNode(ctx context.Context) (string, error) {
	nodes, err := a.Nodes(ctx)
	if err != nil {
		return "", err
	}
	self, err := os.Hostname()
	if err != nil {
		return "", err
	}
	return remoteNode(nodes, self), nil
}

func remoteNode(nodes []Node, self string) string {
	short := func(h string) string { s, _, _ := strings.Cut(h, "."); return s }
	for _, n := range nodes {
		if short(n.Hostname) != short(self) {
			if n.Addr != "" {
				return n.Addr
			}
			return n.Hostname
		}
	}
	return ""
}
