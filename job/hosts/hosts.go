package hosts

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// Host is a machine a job may run workers on, and how many at once.
type Host struct {
	Name  string // as ssh reaches it: a host name or an address (IPv6 in brackets)
	Slots int    // at least 1
}

// String is the host in -H syntax, "name:slots".
func (h Host) String() string { return h.Name + ":" + strconv.Itoa(h.Slots) }

// MaxSlots bounds one host's slots (a typo such as "h1:80000" is an error,
// not 80000 worker processes).
const MaxSlots = 4096

// maxName is the longest DNS name.
const maxName = 253

// CheckName says what is wrong with a host name, if anything. Names are
// what ssh and a shell take as one word and never as an option: letters,
// digits, '.', '-', '_' (not first: '-' would be read as an ssh option), or an
// IPv6 address in brackets.
func CheckName(name string) error {
	switch {
	case name == "":
		return errors.New("empty host name")
	case len(name) > maxName:
		return fmt.Errorf("host name %.20q... is longer than %d bytes", name, maxName)
	case strings.HasPrefix(name, "["):
		inner, ok := strings.CutSuffix(name[1:], "]")
		if a, err := netip.ParseAddr(inner); !ok || err != nil || !a.Is6() {
			return fmt.Errorf("host %q: not an IPv6 address in brackets", name)
		} else if zone := a.Zone(); zone != "" && !plainName(zone) {
			// A zone is an interface name; anything else (a ',' splits a
			// host list, a space a shell word) is refused.
			return fmt.Errorf("host %q: zone %q is not an interface name (letters, digits, '.', '-', '_')", name, zone)
		}
		return nil
	case name[0] == '-' || name[0] == '.':
		return fmt.Errorf("host name %q starts with %q", name, name[0])
	}
	for _, r := range name {
		if !plainRune(r) {
			return fmt.Errorf("host name %q: %q is not allowed (letters, digits, '.', '-', '_'; IPv6 in brackets)", name, r)
		}
	}
	return nil
}

// plainRune reports whether r may stand in a host name.
func plainRune(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_'
}

// plainName reports whether every rune of s may stand in a host name.
func plainName(s string) bool {
	for _, r := range s {
		if !plainRune(r) {
			return false
		}
	}
	return true
}

func parseSlots(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > MaxSlots {
		return 0, fmt.Errorf("slots %q: want a whole number from 1 to %d", s, MaxSlots)
	}
	return n, nil
}

// parseHostSlots parses "name" (1 slot) or "name:slots".
func parseHostSlots(s string) (Host, error) {
	name, slots := s, ""
	if strings.HasPrefix(s, "[") { // [v6]:slots
		if i := strings.LastIndex(s, "]"); i >= 0 {
			name, slots = s[:i+1], strings.TrimPrefix(s[i+1:], ":")
			if slots == "" && i+1 < len(s) {
				return Host{}, fmt.Errorf("%q: empty slot count", s)
			}
		}
	} else if i := strings.LastIndexByte(s, ':'); i >= 0 {
		name, slots = s[:i], s[i+1:]
		if slots == "" {
			return Host{}, fmt.Errorf("%q: empty slot count", s)
		}
	}
	if err := CheckName(name); err != nil {
		return Host{}, err
	}
	h := Host{Name: name, Slots: 1}
	if slots != "" {
		n, err := parseSlots(slots)
		if err != nil {
			return Host{}, fmt.Errorf("host %s: %w", name, err)
		}
		h.Slots = n
	}
	return h, nil
}

// ParseList parses a host list as `horovodrun -H` takes it:
// "host1:2,host2:2" (a host without ":slots" has one slot). A host listed
// twice is an error.
func ParseList(s string) ([]Host, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("empty host list")
	}
	var hs []Host
	seen := map[string]bool{}
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			return nil, fmt.Errorf("host list %q has an empty entry", s)
		}
		h, err := parseHostSlots(item)
		if err != nil {
			return nil, err
		}
		if seen[h.Name] {
			return nil, fmt.Errorf("host %s is listed twice", h.Name)
		}
		seen[h.Name] = true
		hs = append(hs, h)
	}
	return hs, nil
}

// Format writes hosts in -H syntax, the inverse of ParseList.
func Format(hs []Host) string {
	parts := make([]string, len(hs))
	for i, h := range hs {
		parts[i] = h.String()
	}
	return strings.Join(parts, ",")
}

// maxLine bounds a line of a host file or of a discovery script's output.
const maxLine = 64 << 10

// ParseHostfile parses a host file as `horovodrun --hostfile` and mpirun take
// it: one host per line, "host slots=N" (without slots=, one slot); '#'
// starts a comment; blank lines are skipped. Errors name the line.
func ParseHostfile(r io.Reader) ([]Host, error) {
	var hs []Host
	seen := map[string]int{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), maxLine)
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		if i := strings.IndexByte(text, '#'); i >= 0 {
			text = text[:i]
		}
		fields := strings.Fields(text)
		if len(fields) == 0 {
			continue
		}
		if err := CheckName(fields[0]); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		h := Host{Name: fields[0], Slots: 1}
		slotsSet := false
		for _, f := range fields[1:] {
			key, val, ok := strings.Cut(f, "=")
			if !ok || key != "slots" {
				return nil, fmt.Errorf("line %d: %q: want \"host slots=N\"", line, f)
			}
			if slotsSet {
				return nil, fmt.Errorf("line %d: slots given twice", line)
			}
			n, err := parseSlots(val)
			if err != nil {
				return nil, fmt.Errorf("line %d: host %s: %w", line, h.Name, err)
			}
			h.Slots, slotsSet = n, true
		}
		if prev, ok := seen[h.Name]; ok {
			return nil, fmt.Errorf("line %d: host %s is already on line %d", line, h.Name, prev)
		}
		seen[h.Name] = line
		hs = append(hs, h)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(hs) == 0 {
		return nil, errors.New("no host in the host file")
	}
	return hs, nil
}

// ReadHostfile reads and parses the host file at path.
func ReadHostfile(path string) ([]Host, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	hs, err := ParseHostfile(f)
	if err != nil {
		return nil, fmt.Errorf("host file %s: %w", path, err)
	}
	return hs, nil
}

// ParseDiscovered parses what a host discovery script prints: one host per
// line, "host:slots" or "host" (defaultSlots), as Horovod's scripts do;
// blank lines are skipped, and no line at all means no host is available.
// The same host twice is an error unless both lines agree.
func ParseDiscovered(out []byte, defaultSlots int) ([]Host, error) {
	if defaultSlots < 1 {
		defaultSlots = 1
	}
	var hs []Host
	seen := map[string]int{} // index in hs
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	sc.Buffer(make([]byte, 4096), maxLine)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		h, err := parseHostSlots(text)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if !strings.Contains(strings.TrimPrefix(text, h.Name), ":") {
			h.Slots = defaultSlots
		}
		if i, ok := seen[h.Name]; ok {
			if hs[i].Slots != h.Slots {
				return nil, fmt.Errorf("line %d: host %s has %d slots, and %d on an earlier line", line, h.Name, h.Slots, hs[i].Slots)
			}
			continue
		}
		seen[h.Name] = len(hs)
		hs = append(hs, h)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return hs, nil
}
