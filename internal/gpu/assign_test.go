package gpu

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// host builds GPUs with bus ids in the given order and symmetric links.
func host(bus []string, links map[[2]int]Link) []GPU {
	gpus := make([]GPU, len(bus))
	for i := range gpus {
		gpus[i] = GPU{Index: i, UUID: fmt.Sprintf("GPU-%d", i), PCIBusID: bus[i], Links: map[string]Link{}}
	}
	for i := range gpus {
		for j := range gpus {
			if i == j {
				continue
			}
			l, ok := links[[2]int{min(i, j), max(i, j)}]
			if !ok {
				l = Link{Level: LevelSystem}
			}
			gpus[i].Links[gpus[j].UUID] = l
		}
	}
	return gpus
}

func TestAssignDevices(t *testing.T) {
	pcie := host([]string{"0000:3b:00.0", "0000:1a:00.0", "0000:88:00.0", "0000:5e:00.0"}, nil)
	// GPUs 0-2 and 1-3 bridged; all on one switch otherwise.
	bridged := host([]string{"0000:01:00.0", "0000:02:00.0", "0000:03:00.0", "0000:04:00.0"}, map[[2]int]Link{
		{0, 2}: {LevelNVLink, 2}, {1, 3}: {LevelNVLink, 2},
		{0, 1}: {Level: LevelPCIeSwitch}, {0, 3}: {Level: LevelPCIeSwitch}, {1, 2}: {Level: LevelPCIeSwitch}, {2, 3}: {Level: LevelPCIeSwitch},
	})
	// More links beat fewer.
	uneven := host([]string{"0000:01:00.0", "0000:02:00.0", "0000:03:00.0"}, map[[2]int]Link{
		{0, 1}: {LevelNVLink, 1}, {0, 2}: {LevelNVLink, 4}, {1, 2}: {LevelNVLink, 1},
	})
	dupe := host([]string{"0000:01:00.0", "0000:02:00.0"}, nil)
	dupe[1].UUID = dupe[0].UUID
	noUUID := host([]string{"0000:01:00.0"}, nil)
	noUUID[0].UUID = ""

	tests := []struct {
		name    string
		gpus    []GPU
		ranks   int
		want    []string
		wantErr bool
	}{
		{"PCI bus order, not NVML index order", pcie, 4, []string{"GPU-1", "GPU-0", "GPU-3", "GPU-2"}, false},
		{"NVLink pairs are neighbours", bridged, 4, []string{"GPU-0", "GPU-2", "GPU-1", "GPU-3"}, false},
		{"most links first", uneven, 3, []string{"GPU-0", "GPU-2", "GPU-1"}, false},
		{"fewer workers take the closest GPUs", bridged, 2, []string{"GPU-0", "GPU-2"}, false},
		{"one worker", pcie, 1, []string{"GPU-1"}, false},
		{"no workers", pcie, 0, []string{}, false},
		{"more workers than GPUs", pcie, 5, nil, true},
		{"no GPUs", nil, 1, nil, true},
		{"negative", pcie, -1, nil, true},
		{"duplicate UUID", dupe, 2, nil, true},
		{"missing UUID", noUUID, 1, nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := AssignDevices(tc.gpus, tc.ranks)
			if tc.wantErr {
				var ae *AssignError
				if !errors.As(err, &ae) {
					t.Fatalf("got %v, %v; want an *AssignError", got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestAssignDevicesIsStable: launchers on one host must agree whatever order
// they list the GPUs in.
func TestAssignDevicesIsStable(t *testing.T) {
	gpus := host([]string{"0000:3b:00.0", "0000:1a:00.0", "0000:88:00.0", "0000:5e:00.0"}, map[[2]int]Link{{1, 2}: {LevelNVLink, 1}})
	want, err := AssignDevices(gpus, 4)
	if err != nil {
		t.Fatal(err)
	}
	rev := slices.Clone(gpus)
	slices.Reverse(rev)
	got, err := AssignDevices(rev, 4)
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("reversed input: %v, %v; want %v", got, err, want)
	}
	if strings.Join(want, ",") != "GPU-1,GPU-2,GPU-0,GPU-3" {
		t.Fatalf("order %v", want)
	}
}
