package gpu

import (
	"context"
	"strings"
)

// nvmlReturn is NVML's nvmlReturn_t: 0 is success.
type nvmlReturn int

// The NVML return codes discovery tells apart (nvml.h's values).
const (
	nvmlSuccess          nvmlReturn = 0
	nvmlInvalidArgument  nvmlReturn = 2
	nvmlNotSupported     nvmlReturn = 3
	nvmlNoPermission     nvmlReturn = 4
	nvmlDriverNotLoaded  nvmlReturn = 9
	nvmlLibraryNotFound  nvmlReturn = 12
	nvmlFunctionNotFound nvmlReturn = 13 // also: this driver's library lacks a function we looked up
	nvmlGPUIsLost        nvmlReturn = 15
	nvmlUnknown          nvmlReturn = 999
)

// NVML's nvmlGpuTopologyLevel_t values.
const (
	nvmlTopologyInternal   = 0
	nvmlTopologySingle     = 10
	nvmlTopologyMultiple   = 20
	nvmlTopologyHostBridge = 30
	nvmlTopologyNode       = 40
	nvmlTopologySystem     = 50
)

// nvmlMaxLinks is NVML_NVLINK_MAX_LINKS (18 in current drivers; a GPU with
// fewer answers INVALID_ARGUMENT past its last link).
const nvmlMaxLinks = 18

// nvmlLib is the part of NVML discovery uses: the driver's library loaded at
// run time (nvml_cgo.go), or a fake in tests.
type nvmlLib interface {
	Init() nvmlReturn
	Shutdown() nvmlReturn
	ErrorString(r nvmlReturn) string
	DeviceCount() (int, nvmlReturn)
	DeviceByIndex(i int) (nvmlDevice, nvmlReturn)
	DriverVersion() (string, nvmlReturn)
	CUDADriverVersion() (int, nvmlReturn)
}

// nvmlDevice is one GPU's handle.
type nvmlDevice interface {
	UUID() (string, nvmlReturn)
	Name() (string, nvmlReturn)
	MemoryTotal() (uint64, nvmlReturn)
	// PCIBusID is NVML's busId field, e.g. "00000000:3B:00.0".
	PCIBusID() (string, nvmlReturn)
	ComputeCapability() (major, minor int, r nvmlReturn)
	NVLinkActive(link int) (bool, nvmlReturn)
	NVLinkRemotePCIBusID(link int) (string, nvmlReturn)
	// CommonAncestor is an nvmlGpuTopologyLevel_t.
	CommonAncestor(other nvmlDevice) (int, nvmlReturn)
}

// discover reads the GPUs and their topology from lib, which it initializes
// and shuts down. Optional facts NVML does not support on a GPU (compute
// capability, NVLink, topology on some virtual machines) are left zero or
// LevelUnknown; failures of the essential ones (count, UUID, memory, PCI bus
// id) are *NVMLError. ctx is checked between GPUs: NVML calls themselves
// cannot be interrupted.
func discover(ctx context.Context, lib nvmlLib) (Inventory, error) {
	if err := ctx.Err(); err != nil {
		return Inventory{}, err
	}
	switch r := lib.Init(); r {
	case nvmlSuccess:
	case nvmlLibraryNotFound:
		return Inventory{}, &NoGPUsError{Reason: "no NVML: the NVIDIA driver library libnvidia-ml.so.1 is not installed"}
	case nvmlDriverNotLoaded:
		return Inventory{}, &NoGPUsError{Reason: "no NVML: libnvidia-ml.so.1 is installed but the NVIDIA kernel driver is not loaded"}
	default:
		return Inventory{}, nvmlError(lib, "nvmlInit", -1, r)
	}
	defer lib.Shutdown()

	n, r := lib.DeviceCount()
	if r != nvmlSuccess {
		return Inventory{}, nvmlError(lib, "nvmlDeviceGetCount", -1, r)
	}
	if n == 0 {
		return Inventory{}, &NoGPUsError{Reason: "the NVIDIA driver reports no devices"}
	}
	inv := Inventory{GPUs: make([]GPU, n)}
	if v, r := lib.DriverVersion(); r == nvmlSuccess {
		inv.DriverVersion = v
	}
	if v, r := lib.CUDADriverVersion(); r == nvmlSuccess {
		inv.CUDADriverVersion = v
	}
	devs := make([]nvmlDevice, n)
	remotes := make([][]string, n) // PCI bus ids at the far end of each active NVLink
	for i := range n {
		if err := ctx.Err(); err != nil {
			return Inventory{}, err
		}
		var err error
		if devs[i], inv.GPUs[i], remotes[i], err = describe(lib, i); err != nil {
			return Inventory{}, err
		}
	}
	linkGPUs(inv.GPUs, devs, remotes)
	return inv, nil
}

// describe reads GPU i.
func describe(lib nvmlLib, i int) (nvmlDevice, GPU, []string, error) {
	g := GPU{Index: i, Links: map[string]Link{}}
	d, r := lib.DeviceByIndex(i)
	if r != nvmlSuccess {
		return nil, g, nil, nvmlError(lib, "nvmlDeviceGetHandleByIndex", i, r)
	}
	if g.UUID, r = d.UUID(); r != nvmlSuccess {
		return nil, g, nil, nvmlError(lib, "nvmlDeviceGetUUID", i, r)
	}
	if g.MemoryBytes, r = d.MemoryTotal(); r != nvmlSuccess {
		return nil, g, nil, nvmlError(lib, "nvmlDeviceGetMemoryInfo", i, r)
	}
	bus, r := d.PCIBusID()
	if r != nvmlSuccess {
		return nil, g, nil, nvmlError(lib, "nvmlDeviceGetPciInfo", i, r)
	}
	g.PCIBusID = busID(bus)
	if name, r := d.Name(); r == nvmlSuccess {
		g.Name = name
	}
	if major, minor, r := d.ComputeCapability(); r == nvmlSuccess {
		g.CCMajor, g.CCMinor = major, minor
	}
	var remotes []string
	for l := range nvmlMaxLinks {
		active, r := d.NVLinkActive(l)
		if r != nvmlSuccess {
			// NOT_SUPPORTED: no NVLink at all; INVALID_ARGUMENT: past the
			// GPU's last link. Either way there are no more.
			break
		}
		if !active {
			continue
		}
		g.NVLinks++
		if remote, r := d.NVLinkRemotePCIBusID(l); r == nvmlSuccess {
			remotes = append(remotes, busID(remote))
		}
	}
	return d, g, remotes, nil
}

// linkGPUs fills every GPU's Links.
func linkGPUs(gpus []GPU, devs []nvmlDevice, remotes [][]string) {
	index := make(map[string]int, len(gpus)) // PCI bus id -> GPU
	for i, g := range gpus {
		index[g.PCIBusID] = i
	}
	direct := make([]map[int]int, len(gpus)) // direct NVLinks from GPU i to GPU j
	switched := make([]bool, len(gpus))      // GPU i has an NVLink to something that is not a GPU: an NVSwitch
	for i, rs := range remotes {
		direct[i] = map[int]int{}
		for _, id := range rs {
			if j, ok := index[id]; ok && j != i {
				direct[i][j]++
			} else {
				switched[i] = true
			}
		}
	}
	for i := range gpus {
		for j := range gpus {
			if i == j {
				continue
			}
			l := Link{Level: LevelUnknown}
			switch {
			case direct[i][j] > 0:
				l = Link{Level: LevelNVLink, NVLinks: direct[i][j]}
			case switched[i] && switched[j]:
				l.Level = LevelNVLink
			default:
				if level, r := devs[i].CommonAncestor(devs[j]); r == nvmlSuccess {
					l.Level = pcieLevel(level)
				}
			}
			gpus[i].Links[gpus[j].UUID] = l
		}
	}
}

func pcieLevel(l int) Level {
	switch l {
	case nvmlTopologyInternal:
		return LevelBoard
	case nvmlTopologySingle:
		return LevelPCIeSwitch
	case nvmlTopologyMultiple:
		return LevelPCIeMulti
	case nvmlTopologyHostBridge:
		return LevelHostBridge
	case nvmlTopologyNode:
		return LevelNUMANode
	case nvmlTopologySystem:
		return LevelSystem
	}
	return LevelUnknown
}

// busID formats NVML's bus id ("00000000:3B:00.0") as sysfs does
// ("0000:3b:00.0"), so ids from NVML calls and elsewhere compare equal.
func busID(nvmlID string) string {
	if i := strings.IndexByte(nvmlID, 0); i >= 0 {
		nvmlID = nvmlID[:i]
	}
	id := strings.ToLower(nvmlID)
	if dom, rest, ok := strings.Cut(id, ":"); ok && len(dom) > 4 && strings.TrimLeft(dom[:len(dom)-4], "0") == "" {
		id = dom[len(dom)-4:] + ":" + rest
	}
	return id
}

func nvmlError(lib nvmlLib, op string, index int, r nvmlReturn) error {
	return &NVMLError{Op: op, Index: index, Code: int(r), Message: lib.ErrorString(r)}
}
