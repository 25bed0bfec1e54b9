//go:build cgo && !gorovod_nonvml

package gpu

import (
	"context"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// System discovers the GPUs of this host through the NVML library of the
// installed driver (Discover with nvml.New()). On a host without a driver it
// returns a *NoGPUsError.
func System(ctx context.Context) (Inventory, error) {
	return Discover(ctx, nvml.New())
}

// Discover reads the GPUs and their topology from lib, which it initializes
// and shuts down. Optional facts NVML does not support on a GPU (compute
// capability, NVLink, topology on some virtual machines) are left zero or
// LevelUnknown; failures of the essential ones (count, UUID, memory, PCI bus
// id) are *NVMLError. ctx is checked between GPUs: NVML calls themselves
// cannot be interrupted. It is meant to run once at start-up: go-nvml keeps
// process-wide state while loading the library, so concurrent calls with the
// real library are not safe.
func Discover(ctx context.Context, lib nvml.Interface) (Inventory, error) {
	if err := ctx.Err(); err != nil {
		return Inventory{}, err
	}
	switch r := lib.Init(); r {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return Inventory{}, &NoGPUsError{Reason: "the NVIDIA driver library libnvidia-ml.so.1 is not installed"}
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return Inventory{}, &NoGPUsError{Reason: "the NVIDIA kernel driver is not loaded"}
	default:
		return Inventory{}, nvmlError("nvmlInit", -1, r)
	}
	defer lib.Shutdown()

	n, r := lib.DeviceGetCount()
	if r != nvml.SUCCESS {
		return Inventory{}, nvmlError("nvmlDeviceGetCount", -1, r)
	}
	if n == 0 {
		return Inventory{}, &NoGPUsError{Reason: "the NVIDIA driver reports no devices"}
	}
	inv := Inventory{GPUs: make([]GPU, n)}
	if v, r := lib.SystemGetDriverVersion(); r == nvml.SUCCESS {
		inv.DriverVersion = v
	}
	if v, r := lib.SystemGetCudaDriverVersion(); r == nvml.SUCCESS {
		inv.CUDADriverVersion = v
	}
	devs := make([]nvml.Device, n)
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
func describe(lib nvml.Interface, i int) (nvml.Device, GPU, []string, error) {
	g := GPU{Index: i, Links: map[string]Link{}}
	d, r := lib.DeviceGetHandleByIndex(i)
	if r != nvml.SUCCESS {
		return nil, g, nil, nvmlError("nvmlDeviceGetHandleByIndex", i, r)
	}
	if g.UUID, r = d.GetUUID(); r != nvml.SUCCESS {
		return nil, g, nil, nvmlError("nvmlDeviceGetUUID", i, r)
	}
	mem, r := d.GetMemoryInfo()
	if r != nvml.SUCCESS {
		return nil, g, nil, nvmlError("nvmlDeviceGetMemoryInfo", i, r)
	}
	g.MemoryBytes = mem.Total
	pci, r := d.GetPciInfo()
	if r != nvml.SUCCESS {
		return nil, g, nil, nvmlError("nvmlDeviceGetPciInfo", i, r)
	}
	g.PCIBusID = busID(pci)
	if name, r := d.GetName(); r == nvml.SUCCESS {
		g.Name = name
	}
	if major, minor, r := d.GetCudaComputeCapability(); r == nvml.SUCCESS {
		g.CCMajor, g.CCMinor = major, minor
	}
	var remotes []string
	for l := range nvml.NVLINK_MAX_LINKS {
		state, r := d.GetNvLinkState(l)
		if r != nvml.SUCCESS {
			// NOT_SUPPORTED: no NVLink at all; INVALID_ARGUMENT: past the
			// GPU's last link. Either way there are no more.
			break
		}
		if state != nvml.FEATURE_ENABLED {
			continue
		}
		g.NVLinks++
		if remote, r := d.GetNvLinkRemotePciInfo(l); r == nvml.SUCCESS {
			remotes = append(remotes, busID(remote))
		}
	}
	return d, g, remotes, nil
}

// linkGPUs fills every GPU's Links.
func linkGPUs(gpus []GPU, devs []nvml.Device, remotes [][]string) {
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
				if level, r := devs[i].GetTopologyCommonAncestor(devs[j]); r == nvml.SUCCESS {
					l.Level = pcieLevel(level)
				}
			}
			gpus[i].Links[gpus[j].UUID] = l
		}
	}
}

func pcieLevel(l nvml.GpuTopologyLevel) Level {
	switch l {
	case nvml.TOPOLOGY_INTERNAL:
		return LevelBoard
	case nvml.TOPOLOGY_SINGLE:
		return LevelPCIeSwitch
	case nvml.TOPOLOGY_MULTIPLE:
		return LevelPCIeMulti
	case nvml.TOPOLOGY_HOSTBRIDGE:
		return LevelHostBridge
	case nvml.TOPOLOGY_NODE:
		return LevelNUMANode
	case nvml.TOPOLOGY_SYSTEM:
		return LevelSystem
	}
	return LevelUnknown
}

// busID formats NVML's bus id ("00000000:3B:00.0") as sysfs does
// ("0000:3b:00.0"), so ids from NVML calls and elsewhere compare equal.
func busID(p nvml.PciInfo) string {
	b := p.BusId[:]
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		b = b[:i]
	}
	id := strings.ToLower(string(b))
	if dom, rest, ok := strings.Cut(id, ":"); ok && len(dom) > 4 && strings.TrimLeft(dom[:len(dom)-4], "0") == "" {
		id = dom[len(dom)-4:] + ":" + rest
	}
	return id
}

func nvmlError(op string, index int, r nvml.Return) error {
	return &NVMLError{Op: op, Index: index, Code: int(r), Message: r.Error()}
}
