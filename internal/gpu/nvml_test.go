package gpu

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// fakeGPU describes one GPU of a mocked host.
type fakeGPU struct {
	uuid, bus, name string
	memMiB          uint64
	cc              [2]int
	nvlinks         []string // the PCI bus id at the far end of each active link
	uuidErr         nvmlReturn
}

// fakeHost is a mocked NVML (nvmlLib).
type fakeHost struct {
	gpus      []fakeGPU
	initRet   nvmlReturn
	countRet  nvmlReturn
	noNVLink  bool               // NVLinkActive is not supported
	topology  func(i, j int) int // nil: not supported
	shutdowns int
}

func (h *fakeHost) lib() nvmlLib { return h }

func (h *fakeHost) Init() nvmlReturn                { return h.initRet }
func (h *fakeHost) Shutdown() nvmlReturn            { h.shutdowns++; return nvmlSuccess }
func (h *fakeHost) ErrorString(r nvmlReturn) string { return "fake error" }
func (h *fakeHost) DeviceCount() (int, nvmlReturn) {
	if h.countRet != nvmlSuccess {
		return 0, h.countRet
	}
	return len(h.gpus), nvmlSuccess
}
func (h *fakeHost) DeviceByIndex(i int) (nvmlDevice, nvmlReturn) {
	if i < 0 || i >= len(h.gpus) {
		return nil, nvmlInvalidArgument
	}
	return &fakeDevice{h: h, i: i}, nvmlSuccess
}
func (h *fakeHost) DriverVersion() (string, nvmlReturn)  { return "535.161.08", nvmlSuccess }
func (h *fakeHost) CUDADriverVersion() (int, nvmlReturn) { return 12020, nvmlSuccess }

type fakeDevice struct {
	h *fakeHost
	i int
}

func (d *fakeDevice) g() fakeGPU { return d.h.gpus[d.i] }

func (d *fakeDevice) UUID() (string, nvmlReturn) {
	if d.g().uuidErr != nvmlSuccess {
		return "", d.g().uuidErr
	}
	return d.g().uuid, nvmlSuccess
}
func (d *fakeDevice) Name() (string, nvmlReturn)        { return d.g().name, nvmlSuccess }
func (d *fakeDevice) MemoryTotal() (uint64, nvmlReturn) { return d.g().memMiB << 20, nvmlSuccess }
func (d *fakeDevice) PCIBusID() (string, nvmlReturn)    { return nvmlBus(d.g().bus), nvmlSuccess }
func (d *fakeDevice) ComputeCapability() (int, int, nvmlReturn) {
	if d.g().cc[0] == 0 {
		return 0, 0, nvmlNotSupported
	}
	return d.g().cc[0], d.g().cc[1], nvmlSuccess
}
func (d *fakeDevice) NVLinkActive(l int) (bool, nvmlReturn) {
	switch {
	case d.h.noNVLink:
		return false, nvmlNotSupported
	case l >= 12: // this fake GPU has 12 links
		return false, nvmlInvalidArgument
	}
	return l < len(d.g().nvlinks), nvmlSuccess
}
func (d *fakeDevice) NVLinkRemotePCIBusID(l int) (string, nvmlReturn) {
	if l >= len(d.g().nvlinks) {
		return "", nvmlInvalidArgument
	}
	return nvmlBus(d.g().nvlinks[l]), nvmlSuccess
}
func (d *fakeDevice) CommonAncestor(other nvmlDevice) (int, nvmlReturn) {
	o, ok := other.(*fakeDevice)
	if d.h.topology == nil {
		return 0, nvmlNotSupported
	}
	if !ok || o.h != d.h {
		return 0, nvmlInvalidArgument
	}
	return d.h.topology(d.i, o.i), nvmlSuccess
}

// nvmlBus is NVML's form of a bus id: an 8-digit domain, upper case.
func nvmlBus(bus string) string { return "0000" + strings.ToUpper(bus) }

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// A DGX-like host: 8 GPUs, each with 12 links into NVSwitches.
func dgx() *fakeHost {
	h := &fakeHost{}
	for i := range 8 {
		h.gpus = append(h.gpus, fakeGPU{
			uuid: "GPU-" + string(rune('a'+i)), bus: []string{"0000:07:00.0", "0000:0f:00.0", "0000:47:00.0", "0000:4e:00.0",
				"0000:87:00.0", "0000:90:00.0", "0000:b7:00.0", "0000:bd:00.0"}[i],
			name: "NVIDIA A100-SXM4-80GB", memMiB: 81920, cc: [2]int{8, 0},
			nvlinks: repeat("0000:c4:00.0", 12), // an NVSwitch, not a GPU
		})
	}
	h.topology = func(i, j int) int { return nvmlTopologySystem }
	return h
}

// A PCIe workstation: 4 GPUs, 0-1 and 2-3 bridged by NVLink, each pair under
// one PCIe switch, the pairs on two NUMA nodes.
func workstation() *fakeHost {
	bus := []string{"0000:1a:00.0", "0000:1b:00.0", "0000:88:00.0", "0000:89:00.0"}
	h := &fakeHost{gpus: []fakeGPU{
		{uuid: "GPU-0", bus: bus[0], name: "NVIDIA RTX A6000", memMiB: 49140, cc: [2]int{8, 6}, nvlinks: repeat(bus[1], 4)},
		{uuid: "GPU-1", bus: bus[1], name: "NVIDIA RTX A6000", memMiB: 49140, cc: [2]int{8, 6}, nvlinks: repeat(bus[0], 4)},
		{uuid: "GPU-2", bus: bus[2], name: "NVIDIA RTX A6000", memMiB: 49140, cc: [2]int{8, 6}, nvlinks: repeat(bus[3], 4)},
		{uuid: "GPU-3", bus: bus[3], name: "NVIDIA RTX A6000", memMiB: 49140, cc: [2]int{8, 6}, nvlinks: repeat(bus[2], 4)},
	}}
	h.topology = func(i, j int) int {
		if i/2 == j/2 {
			return nvmlTopologySingle
		}
		return nvmlTopologySystem
	}
	return h
}

// A cloud VM: 2 GPUs, no NVLink, NVML cannot tell the topology.
func cloudVM() *fakeHost {
	return &fakeHost{noNVLink: true, gpus: []fakeGPU{
		{uuid: "GPU-x", bus: "0000:00:05.0", name: "Tesla T4", memMiB: 15360, cc: [2]int{7, 5}},
		{uuid: "GPU-y", bus: "0000:00:04.0", name: "Tesla T4", memMiB: 15360, cc: [2]int{7, 5}},
	}}
}

func TestDiscover(t *testing.T) {
	tests := []struct {
		name      string
		host      *fakeHost
		noGPUs    bool
		nvmlErr   string // the Op of the expected *NVMLError
		shutdowns int
		check     func(t *testing.T, inv Inventory)
	}{
		{name: "library missing", host: &fakeHost{initRet: nvmlLibraryNotFound}, noGPUs: true},
		{name: "driver not loaded", host: &fakeHost{initRet: nvmlDriverNotLoaded}, noGPUs: true},
		{name: "no permission", host: &fakeHost{initRet: nvmlNoPermission}, nvmlErr: "nvmlInit"},
		{name: "no devices", host: &fakeHost{}, noGPUs: true, shutdowns: 1},
		{name: "count fails", host: &fakeHost{countRet: nvmlUnknown}, nvmlErr: "nvmlDeviceGetCount", shutdowns: 1},
		{name: "UUID fails", host: func() *fakeHost { h := workstation(); h.gpus[1].uuidErr = nvmlGPUIsLost; return h }(),
			nvmlErr: "nvmlDeviceGetUUID", shutdowns: 1},
		{name: "NVSwitch host", host: dgx(), shutdowns: 1, check: func(t *testing.T, inv Inventory) {
			if len(inv.GPUs) != 8 || inv.DriverVersion != "535.161.08" || inv.CUDADriverVersion != 12020 {
				t.Fatalf("inventory %v", inv)
			}
			for _, g := range inv.GPUs {
				if g.NVLinks != 12 || len(g.Links) != 7 {
					t.Fatalf("GPU %d: %d NVLinks, %d peers", g.Index, g.NVLinks, len(g.Links))
				}
				for peer, l := range g.Links {
					if l != (Link{Level: LevelNVLink}) {
						t.Errorf("GPU %d to %s: %+v, want NVLink through the switch", g.Index, peer, l)
					}
				}
			}
			if s := inv.Summary(); s != (Summary{Count: 8, MemoryMiB: 8 * 81920, Topology: "nvlink", Model: "NVIDIA A100-SXM4-80GB", CC: "8.0"}) {
				t.Errorf("summary %+v", s)
			}
		}},
		{name: "NVLink bridges and PCIe", host: workstation(), shutdowns: 1, check: func(t *testing.T, inv Inventory) {
			g := inv.GPUs[0]
			if g.PCIBusID != "0000:1a:00.0" || g.MemoryBytes != 49140<<20 || g.CCMajor != 8 || g.CCMinor != 6 || g.NVLinks != 4 {
				t.Fatalf("GPU 0: %+v", g)
			}
			want := map[string]Link{"GPU-1": {LevelNVLink, 4}, "GPU-2": {Level: LevelSystem}, "GPU-3": {Level: LevelSystem}}
			for peer, l := range want {
				if g.Links[peer] != l {
					t.Errorf("GPU 0 to %s: %+v, want %+v", peer, g.Links[peer], l)
				}
			}
			if s := inv.Summary(); s.Topology != "sys" {
				t.Errorf("summary topology %q, want sys", s.Topology)
			}
		}},
		{name: "no NVLink, no topology", host: cloudVM(), shutdowns: 1, check: func(t *testing.T, inv Inventory) {
			for _, g := range inv.GPUs {
				if g.NVLinks != 0 {
					t.Errorf("GPU %d: %d NVLinks", g.Index, g.NVLinks)
				}
				for _, l := range g.Links {
					if l.Level != LevelUnknown {
						t.Errorf("GPU %d: %+v, want unknown", g.Index, l)
					}
				}
			}
			if s := inv.Summary(); s.Topology != "unknown" || s.CC != "7.5" {
				t.Errorf("summary %+v", s)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			inv, err := discover(context.Background(), tc.host.lib())
			var ne *NVMLError
			switch {
			case tc.noGPUs:
				if !IsNoGPUs(err) {
					t.Fatalf("got %v, want a *NoGPUsError", err)
				}
			case tc.nvmlErr != "":
				if !errors.As(err, &ne) || ne.Op != tc.nvmlErr {
					t.Fatalf("got %v, want an *NVMLError from %s", err, tc.nvmlErr)
				}
			case err != nil:
				t.Fatal(err)
			default:
				tc.check(t, inv)
			}
			if tc.host.shutdowns != tc.shutdowns {
				t.Errorf("Shutdown called %d times, want %d", tc.host.shutdowns, tc.shutdowns)
			}
		})
	}
}

func TestDiscoverCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	h := dgx()
	if _, err := discover(ctx, h.lib()); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
}

// TestAssignDiscovered hands the workstation's GPUs to 4 workers: NVLinked
// pairs must be ring neighbours.
func TestAssignDiscovered(t *testing.T) {
	inv, err := discover(context.Background(), workstation().lib())
	if err != nil {
		t.Fatal(err)
	}
	got, err := AssignDevices(inv.GPUs, 4)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"GPU-0", "GPU-1", "GPU-2", "GPU-3"}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestBusID(t *testing.T) {
	tests := []struct{ in, want string }{
		{"00000000:3B:00.0", "0000:3b:00.0"},
		{"0000:3b:00.0", "0000:3b:00.0"},
		{"00000001:01:00.0", "0001:01:00.0"},
		{"10000000:01:00.0", "10000000:01:00.0"}, // a real 8-digit domain stays
	}
	for _, tc := range tests {
		if got := busID(tc.in + "\x00junk"); got != tc.want {
			t.Errorf("busID(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestSystem runs discovery against whatever this machine has. Without an
// NVIDIA driver (CI, most developer machines) it must report no GPUs cleanly,
// not crash; on a GPU host it logs what it found.
func TestSystem(t *testing.T) {
	inv, err := System(context.Background())
	switch {
	case IsNoGPUs(err):
		t.Logf("no GPUs, as expected without a driver: %v", err)
	case err != nil:
		t.Fatalf("discovery failed with something other than no GPUs: %v", err)
	default:
		if len(inv.GPUs) == 0 {
			t.Fatal("success with no GPUs")
		}
		t.Logf("found %v", inv)
		t.Logf("summary %s", inv.Summary().Encode())
	}
}
