package gpu

import (
	"math"
	"strings"
	"testing"
)

func TestSummary(t *testing.T) {
	a100 := GPU{UUID: "GPU-a", Name: "NVIDIA A100-SXM4-80GB", MemoryBytes: 80 << 30, CCMajor: 8}
	h100 := GPU{UUID: "GPU-b", Name: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30, CCMajor: 9}
	v100 := GPU{UUID: "GPU-c", Name: "Tesla V100-SXM2-16GB", MemoryBytes: 16 << 30, CCMajor: 7}
	linked := func(l Link, gs ...GPU) []GPU {
		for i := range gs {
			gs[i].Links = map[string]Link{}
			for j := range gs {
				if i != j {
					gs[i].Links[gs[j].UUID] = l
				}
			}
		}
		return gs
	}
	tests := []struct {
		name string
		inv  Inventory
		want Summary
	}{
		{"no GPUs", Inventory{}, Summary{}},
		{"one GPU", Inventory{GPUs: []GPU{a100}}, Summary{Count: 1, MemoryMiB: 80 << 10, Model: a100.Name, CC: "8.0"}},
		{"NVLink pair", Inventory{GPUs: linked(Link{LevelNVLink, 12}, a100, a100)},
			Summary{Count: 2, MemoryMiB: 160 << 10, Topology: "nvlink", Model: a100.Name, CC: "8.0"}},
		{"mixed models, lowest capability, worst link", Inventory{GPUs: linked(Link{Level: LevelNUMANode}, h100, v100, a100)},
			Summary{Count: 3, MemoryMiB: 176 << 10, Topology: "node", Model: "mixed", CC: "7.0"}},
		{"links unknown", Inventory{GPUs: []GPU{a100, h100}}, Summary{Count: 2, MemoryMiB: 160 << 10, Topology: "unknown", Model: "mixed", CC: "8.0"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.inv.Summary()
			if got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			back, err := DecodeSummary(got.Encode())
			if err != nil || back != got {
				t.Fatalf("round trip: %+v, %v", back, err)
			}
		})
	}
}

// TestSummaryEncodeBound: membership metadata must stay far below 512 bytes
// whatever the driver reports.
func TestSummaryEncodeBound(t *testing.T) {
	tests := []Summary{
		{},
		{Count: math.MinInt64, MemoryMiB: math.MaxUint64, Topology: "unknown", Model: strings.Repeat("x", 500), CC: "10.10"},
		{Count: math.MaxInt64, MemoryMiB: math.MaxUint64, Topology: strings.Repeat("<", 100), Model: strings.Repeat("\"<>&\\\x00é", 100), CC: strings.Repeat("&", 100)},
	}
	for i, s := range tests {
		b := s.Encode()
		if len(b) > MaxSummaryBytes {
			t.Errorf("case %d: %d bytes > %d: %s", i, len(b), MaxSummaryBytes, b)
		}
		if _, err := DecodeSummary(b); err != nil && s.Count >= 0 {
			t.Errorf("case %d: %v", i, err)
		}
	}
}

func TestDecodeSummaryRejects(t *testing.T) {
	tests := []struct{ name, in string }{
		{"not JSON", "n=2"},
		{"negative count", `{"n":-1}`},
		{"too long", `{"n":1,"model":"` + strings.Repeat("x", MaxSummaryBytes) + `"}`},
	}
	for _, tc := range tests {
		if _, err := DecodeSummary([]byte(tc.in)); err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
}
