package gpu

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// GPU is one NVIDIA GPU of the host.
type GPU struct {
	Index       int    // NVML's index (PCI bus order; CUDA's order may differ)
	UUID        string // "GPU-…": what CUDA_VISIBLE_DEVICES accepts whatever the enumeration order
	Name        string // product name, e.g. "NVIDIA A100-SXM4-80GB"
	MemoryBytes uint64 // total device memory
	PCIBusID    string // domain:bus:device.function, lower case, e.g. "0000:3b:00.0"
	CCMajor     int    // CUDA compute capability, e.g. 8 and 0 for an A100; 0, 0 if unknown
	CCMinor     int
	NVLinks     int // active NVLink links, to GPUs or NVSwitches
	// Links says how this GPU reaches each other GPU of the host, by UUID.
	Links map[string]Link
}

// Level is how directly two GPUs of a host are connected, best first.
type Level uint8

// The levels, in the order of nvidia-smi topo -m (LevelUnknown is worst:
// NVML could not tell).
const (
	LevelNVLink     Level = iota + 1 // NVLink, direct or through an NVSwitch
	LevelBoard                       // on one board (a multi-GPU card)
	LevelPCIeSwitch                  // PIX: through one PCIe switch
	LevelPCIeMulti                   // PXB: through several PCIe switches, no host bridge
	LevelHostBridge                  // PHB: through a PCIe host bridge
	LevelNUMANode                    // NODE: through the host bridges of one NUMA node
	LevelSystem                      // SYS: across NUMA nodes (the SMP interconnect)
	LevelUnknown
)

// String is the level's short name, as in Summary.Topology.
func (l Level) String() string {
	switch l {
	case LevelNVLink:
		return "nvlink"
	case LevelBoard:
		return "board"
	case LevelPCIeSwitch:
		return "pix"
	case LevelPCIeMulti:
		return "pxb"
	case LevelHostBridge:
		return "phb"
	case LevelNUMANode:
		return "node"
	case LevelSystem:
		return "sys"
	}
	return "unknown"
}

// worse reports whether l is a slower connection than m.
func (l Level) worse(m Level) bool { return l.rank() > m.rank() }

func (l Level) rank() int {
	if l < LevelNVLink || l > LevelUnknown {
		return int(LevelUnknown)
	}
	return int(l)
}

// Link is the connection between two GPUs.
type Link struct {
	Level   Level
	NVLinks int // direct NVLink links between the two; 0 when connected through an NVSwitch
}

// Inventory is what discovery found on the host.
type Inventory struct {
	GPUs              []GPU  // in NVML index order
	DriverVersion     string // e.g. "535.161.08"; empty if NVML would not say
	CUDADriverVersion int    // the CUDA version the driver supports, e.g. 12020; 0 if unknown
}

// NoGPUsError means the host has no usable NVIDIA GPU: no driver library, a
// library without its kernel module, or a driver that finds no device.
// Callers treat it as a CPU-only host.
type NoGPUsError struct {
	Reason string
}

func (e *NoGPUsError) Error() string { return "gpu: no GPUs: " + e.Reason }

// IsNoGPUs reports whether err is (or wraps) a *NoGPUsError.
func IsNoGPUs(err error) bool {
	var e *NoGPUsError
	return errors.As(err, &e)
}

// NVMLError is an NVML call that failed for another reason than the absence
// of GPUs.
type NVMLError struct {
	Op      string // the NVML function, e.g. "nvmlDeviceGetUUID"
	Index   int    // the GPU's index, -1 for calls about no GPU
	Code    int    // nvmlReturn_t
	Message string // NVML's text for Code
}

func (e *NVMLError) Error() string {
	if e.Index >= 0 {
		return fmt.Sprintf("gpu: %s on GPU %d: %s (NVML error %d)", e.Op, e.Index, e.Message, e.Code)
	}
	return fmt.Sprintf("gpu: %s: %s (NVML error %d)", e.Op, e.Message, e.Code)
}

// Summary is the host's GPUs in a few bytes, for membership metadata (which
// memberlist caps at 512 bytes for all of a node's metadata): Encode never
// exceeds MaxSummaryBytes.
type Summary struct {
	Count     int    `json:"n"`
	MemoryMiB uint64 `json:"mib,omitempty"`  // total over all GPUs
	Topology  string `json:"topo,omitempty"` // the worst link between any two GPUs (Level names); empty for fewer than 2
	Model     string `json:"model,omitempty"`
	CC        string `json:"cc,omitempty"` // the lowest compute capability, "8.0"
}

// MaxSummaryBytes bounds the encoded Summary.
const MaxSummaryBytes = 160

// maxModel bounds Summary.Model; it is "mixed" when the GPUs differ.
const maxModel = 48

// Summary condenses the inventory.
func (inv Inventory) Summary() Summary {
	s := Summary{Count: len(inv.GPUs)}
	if s.Count == 0 {
		return s
	}
	worst := Level(0)
	minCC := [2]int{-1, -1}
	s.Model = inv.GPUs[0].Name
	for i, g := range inv.GPUs {
		s.MemoryMiB += g.MemoryBytes >> 20
		if g.Name != s.Model {
			s.Model = "mixed"
		}
		if cc := [2]int{g.CCMajor, g.CCMinor}; minCC[0] < 0 || cc[0] < minCC[0] || cc[0] == minCC[0] && cc[1] < minCC[1] {
			minCC = cc
		}
		for _, h := range inv.GPUs[i+1:] {
			l, ok := g.Links[h.UUID]
			if !ok {
				l.Level = LevelUnknown
			}
			if worst == 0 || l.Level.worse(worst) {
				worst = l.Level
			}
		}
	}
	if worst != 0 {
		s.Topology = worst.String()
	}
	if minCC[0] > 0 {
		s.CC = strconv.Itoa(minCC[0]) + "." + strconv.Itoa(minCC[1])
	}
	return s
}

// Encode serializes s as compact JSON of at most MaxSummaryBytes bytes: the
// strings are cut to a fixed length and limited to printable ASCII that JSON
// does not escape (anything else becomes '?'), so the bound holds for any
// Summary.
func (s Summary) Encode() []byte {
	s.Model = plain(s.Model, maxModel)
	s.Topology = plain(s.Topology, 8)
	s.CC = plain(s.CC, 8)
	b, _ := json.Marshal(s) // a struct of strings and integers always marshals
	return b
}

// plain cuts s to n bytes of printable ASCII that json.Marshal copies as is.
func plain(s string, n int) string {
	b := []byte(s)
	if len(b) > n {
		b = b[:n]
	}
	for i, c := range b {
		if c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			b[i] = '?'
		}
	}
	return string(b)
}

// DecodeSummary parses what Encode wrote.
func DecodeSummary(b []byte) (Summary, error) {
	var s Summary
	if len(b) > MaxSummaryBytes {
		return s, fmt.Errorf("gpu: summary of %d bytes exceeds %d", len(b), MaxSummaryBytes)
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("gpu: decoding summary: %w", err)
	}
	if s.Count < 0 {
		return s, fmt.Errorf("gpu: summary has negative GPU count %d", s.Count)
	}
	return s, nil
}

// String describes the inventory in one line per GPU, for logs.
func (inv Inventory) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d GPUs (driver %s, CUDA %d.%d)", len(inv.GPUs), inv.DriverVersion, inv.CUDADriverVersion/1000, inv.CUDADriverVersion%1000/10)
	for _, g := range inv.GPUs {
		fmt.Fprintf(&b, "\n  %d %s %s %s %d MiB cc %d.%d nvlinks %d", g.Index, g.UUID, g.Name, g.PCIBusID, g.MemoryBytes>>20, g.CCMajor, g.CCMinor, g.NVLinks)
	}
	return b.String()
}
