package envconfig

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// The variables Slurm sets inside an allocation (salloc, sbatch, and in every
// srun step) that say where the job may run.
const (
	EnvSlurmJobID        = "SLURM_JOB_ID"
	EnvSlurmNodeList     = "SLURM_JOB_NODELIST"   // a hostlist expression: node[01-03,07],gpu1
	EnvSlurmTasksPerNode = "SLURM_TASKS_PER_NODE" // per node of the list, compressed: 2(x3),1
	EnvSlurmNTasks       = "SLURM_NTASKS"         // set when the allocation was asked for -n
	EnvSlurmCPUsPerTask  = "SLURM_CPUS_PER_TASK"  // set when the allocation was asked for -c
	// Older names, still set by Slurm 22.05 next to the new ones.
	envSlurmJobIDOld    = "SLURM_JOBID"
	envSlurmNodeListOld = "SLURM_NODELIST"
)

// MaxHostlistHosts bounds what a hostlist or tasks-per-node expression may
// expand to: a typo such as node[0-99999999] is an error, not an allocation
// of a hundred million entries.
const MaxHostlistHosts = 1 << 16

// SlurmHost is one node of an allocation and the tasks Slurm placed on it.
type SlurmHost struct {
	Name  string
	Slots int
}

// SlurmAllocation is the Slurm job this process runs inside.
type SlurmAllocation struct {
	JobID string
	Hosts []SlurmHost // in the node list's order
	// NTasks is the allocation's task count: SLURM_NTASKS, or the sum of the
	// slots when the allocation was not asked for a task count.
	NTasks int
	// CPUsPerTask is SLURM_CPUS_PER_TASK (0 when the allocation was not
	// asked for a count).
	CPUsPerTask int
}

// LoadSlurm reads the allocation this process runs in through getenv; ok is
// false outside Slurm (no SLURM_JOB_ID).
func LoadSlurm(getenv func(string) string) (a SlurmAllocation, ok bool, err error) {
	first := func(names ...string) string {
		for _, n := range names {
			if v := getenv(n); v != "" {
				return v
			}
		}
		return ""
	}
	a.JobID = first(EnvSlurmJobID, envSlurmJobIDOld)
	if a.JobID == "" {
		return a, false, nil
	}
	nodeList := first(EnvSlurmNodeList, envSlurmNodeListOld)
	perNode := getenv(EnvSlurmTasksPerNode)
	if nodeList == "" || perNode == "" {
		return a, true, fmt.Errorf("envconfig: Slurm job %s: %s and %s must both be set", a.JobID, EnvSlurmNodeList, EnvSlurmTasksPerNode)
	}
	hosts, err := ParseHostlist(nodeList)
	if err != nil {
		return a, true, fmt.Errorf("envconfig: %s: %w", EnvSlurmNodeList, err)
	}
	slots, err := ParseTasksPerNode(perNode)
	if err != nil {
		return a, true, fmt.Errorf("envconfig: %s: %w", EnvSlurmTasksPerNode, err)
	}
	if len(hosts) != len(slots) {
		return a, true, fmt.Errorf("envconfig: %s names %d nodes but %s=%q gives tasks for %d", EnvSlurmNodeList, len(hosts), EnvSlurmTasksPerNode, perNode, len(slots))
	}
	total := 0
	for i, h := range hosts {
		a.Hosts = append(a.Hosts, SlurmHost{Name: h, Slots: slots[i]})
		total += slots[i]
	}
	a.NTasks = total
	if v := getenv(EnvSlurmNTasks); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > total {
			return a, true, fmt.Errorf("envconfig: %s=%q: want a task count from 1 to the %d tasks of %s", EnvSlurmNTasks, v, total, EnvSlurmTasksPerNode)
		}
		a.NTasks = n
	}
	if v := getenv(EnvSlurmCPUsPerTask); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return a, true, fmt.Errorf("envconfig: %s=%q is not a CPU count", EnvSlurmCPUsPerTask, v)
		}
		a.CPUsPerTask = n
	}
	return a, true, nil
}

// ParseHostlist expands a Slurm hostlist expression: comma-separated names,
// each with any number of bracketed ranges, as in "node[01-03,07],gpu1" or
// "rack[1-2]-n[1-2]" (zero-padding follows the lower bound's width).
func ParseHostlist(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("empty hostlist")
	}
	var hosts []string
	for _, item := range splitOutsideBrackets(s) {
		item = strings.TrimSpace(item)
		if item == "" {
			return nil, fmt.Errorf("hostlist %q: empty entry", s)
		}
		expanded, err := expandHost(item, MaxHostlistHosts-len(hosts))
		if err != nil {
			return nil, fmt.Errorf("hostlist %q: %w", s, err)
		}
		hosts = append(hosts, expanded...)
	}
	return hosts, nil
}

// splitOutsideBrackets splits s at the commas that are not inside [...].
func splitOutsideBrackets(s string) []string {
	var parts []string
	depth, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 {
				parts = append(parts, s[start:i])
				start = i + 1
			}
		}
	}
	return append(parts, s[start:])
}

// expandHost expands one entry: the product of its bracket groups, in order.
func expandHost(item string, limit int) ([]string, error) {
	out := []string{""}
	for rest := item; rest != ""; {
		open := strings.IndexByte(rest, '[')
		if open < 0 {
			if strings.IndexByte(rest, ']') >= 0 {
				return nil, fmt.Errorf("%q: ']' without '['", item)
			}
			for i := range out {
				out[i] += rest
			}
			break
		}
		prefix := rest[:open]
		if strings.IndexByte(prefix, ']') >= 0 {
			return nil, fmt.Errorf("%q: ']' without '['", item)
		}
		end := strings.IndexByte(rest[open:], ']')
		if end < 0 {
			return nil, fmt.Errorf("%q: '[' without ']'", item)
		}
		values, err := expandRanges(rest[open+1:open+end], limit)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", item, err)
		}
		if len(out)*len(values) > limit {
			return nil, fmt.Errorf("%q: more than %d hosts", item, MaxHostlistHosts)
		}
		next := make([]string, 0, len(out)*len(values))
		for _, o := range out {
			for _, v := range values {
				next = append(next, o+prefix+v)
			}
		}
		out = next
		rest = rest[open+end+1:]
	}
	for _, h := range out {
		if h == "" || strings.ContainsAny(h, " \t\n[],") {
			return nil, fmt.Errorf("%q: %q is not a host name", item, h)
		}
	}
	return out, nil
}

// expandRanges expands the inside of a bracket: "01-03,07".
func expandRanges(s string, limit int) ([]string, error) {
	var out []string
	for _, r := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		if !isRange {
			hi = lo
		}
		a, errA := parseDigits(lo)
		b, errB := parseDigits(hi)
		if errA != nil || errB != nil {
			return nil, fmt.Errorf("range %q: want N or N-M with decimal numbers", r)
		}
		if b < a {
			return nil, fmt.Errorf("range %q: the end is below the start", r)
		}
		if b-a >= uint64(limit-len(out)) {
			return nil, fmt.Errorf("range %q: more than %d hosts", r, MaxHostlistHosts)
		}
		width := len(lo)
		for v := a; v <= b; v++ {
			out = append(out, fmt.Sprintf("%0*d", width, v))
		}
	}
	return out, nil
}

func parseDigits(s string) (uint64, error) {
	if s == "" || len(s) > 18 || strings.TrimLeft(s, "0123456789") != "" {
		return 0, errors.New("not a number")
	}
	return strconv.ParseUint(s, 10, 64)
}

// ParseTasksPerNode expands SLURM_TASKS_PER_NODE: comma-separated counts,
// each optionally repeated, as in "2(x3),1" for 2,2,2,1.
func ParseTasksPerNode(s string) ([]int, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("empty tasks per node")
	}
	var out []int
	for _, item := range strings.Split(s, ",") {
		count, repeat := item, "1"
		if i := strings.IndexByte(item, '('); i >= 0 {
			if !strings.HasPrefix(item[i:], "(x") || !strings.HasSuffix(item, ")") {
				return nil, fmt.Errorf("tasks per node %q: %q: want N or N(xM)", s, item)
			}
			count, repeat = item[:i], item[i+2:len(item)-1]
		}
		n, errN := parseDigits(count)
		r, errR := parseDigits(repeat)
		if errN != nil || errR != nil || n < 1 || r < 1 || n > 1<<20 {
			return nil, fmt.Errorf("tasks per node %q: %q: want N or N(xM) with positive numbers", s, item)
		}
		if r > uint64(MaxHostlistHosts-len(out)) {
			return nil, fmt.Errorf("tasks per node %q: more than %d nodes", s, MaxHostlistHosts)
		}
		for range r {
			out = append(out, int(n))
		}
	}
	return out, nil
}
