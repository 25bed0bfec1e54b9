package job

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/internal/gpu"
)

// threeGPUs is a host whose ring order is not its bus order: GPU-a and
// GPU-c share NVLink, GPU-b reaches both over PCIe only.
func threeGPUs(context.Context) (gpu.Inventory, error) {
	link := func(l gpu.Level) gpu.Link { return gpu.Link{Level: l} }
	return gpu.Inventory{GPUs: []gpu.GPU{
		{Index: 0, UUID: "GPU-a", PCIBusID: "0000:1a:00.0", Links: map[string]gpu.Link{"GPU-b": link(gpu.LevelSystem), "GPU-c": {Level: gpu.LevelNVLink, NVLinks: 4}}},
		{Index: 1, UUID: "GPU-b", PCIBusID: "0000:1b:00.0", Links: map[string]gpu.Link{"GPU-a": link(gpu.LevelSystem), "GPU-c": link(gpu.LevelSystem)}},
		{Index: 2, UUID: "GPU-c", PCIBusID: "0000:1c:00.0", Links: map[string]gpu.Link{"GPU-a": {Level: gpu.LevelNVLink, NVLinks: 4}, "GPU-b": link(gpu.LevelSystem)}},
	}}, nil
}

func noGPUs(context.Context) (gpu.Inventory, error) {
	return gpu.Inventory{}, &gpu.NoGPUsError{Reason: "no NVML: test"}
}

// TestLocalLauncherGPUs starts real worker processes that print the
// CUDA_VISIBLE_DEVICES they got: by default the launcher's own (unset, or
// what the user set), so that every worker sees every GPU and picks its own
// by local rank, as under horovodrun; with AssignGPUs one GPU each, in ring
// order, when the host has enough, and otherwise the launcher's own with a
// notice saying why.
func TestLocalLauncherGPUs(t *testing.T) {
	const unset = "unset"
	cases := []struct {
		name      string
		assign    bool
		discover  gpuInventory
		workers   int
		userValue string // the launcher's CUDA_VISIBLE_DEVICES; unset: none
		want      []string
		notice    string // a notice that must come; "" none about GPUs
		looked    bool   // whether the launcher must look for GPUs
	}{
		{name: "default leaves it unset", discover: threeGPUs, workers: 2, userValue: unset, want: []string{unset, unset}},
		{name: "default keeps the user's", discover: threeGPUs, workers: 2, userValue: "1,2", want: []string{"1,2", "1,2"}},
		{name: "default with more workers than GPUs says nothing", discover: threeGPUs, workers: 4, userValue: unset, want: []string{unset, unset, unset, unset}},
		{name: "assigned in ring order", assign: true, discover: threeGPUs, workers: 2, userValue: unset, want: []string{"GPU-a", "GPU-c"}, notice: "one GPU per worker, in this order: GPU-a, GPU-c, GPU-b", looked: true},
		{name: "assigned over the user's", assign: true, discover: threeGPUs, workers: 3, userValue: "0", want: []string{"GPU-a", "GPU-c", "GPU-b"}, notice: "one GPU per worker", looked: true},
		{name: "assign with too few GPUs", assign: true, discover: threeGPUs, workers: 4, userValue: "0,1", want: []string{"0,1", "0,1", "0,1", "0,1"}, notice: "cannot assign GPUs to 4 local workers (3 GPUs): fewer GPUs than workers", looked: true},
		{name: "assign without GPUs", assign: true, discover: noGPUs, workers: 2, userValue: unset, want: []string{unset, unset}, looked: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.userValue == unset {
				t.Setenv(envconfig.EnvVisibleDevices, "") // restored after the test
				os.Unsetenv(envconfig.EnvVisibleDevices)
			} else {
				t.Setenv(envconfig.EnvVisibleDevices, tc.userValue)
			}
			var mu sync.Mutex
			looks := 0
			var notices []string
			l := &LocalLauncher{AssignGPUs: tc.assign, StopGrace: time.Second, discoverGPUs: func(ctx context.Context) (gpu.Inventory, error) {
				mu.Lock()
				looks++
				mu.Unlock()
				return tc.discover(ctx)
			}}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			lines := make(chan string, tc.workers)
			var procs []Process
			for i := range tc.workers {
				p, err := l.Launch(ctx, LaunchRequest{
					Index: i, Share: tc.workers,
					// Each worker stays until the test ends, holding its GPU.
					Argv: []string{"sh", "-c", fmt.Sprintf(`echo "%d ${%s-%s}"; exec sleep 60`, i, envconfig.EnvVisibleDevices, unset)},
					Output: func(stream string, line []byte) {
						if stream == "stdout" {
							lines <- string(line)
						}
					},
					Notice: func(msg string) { mu.Lock(); notices = append(notices, msg); mu.Unlock() },
				})
				if err != nil {
					t.Fatal(err)
				}
				procs = append(procs, p)
			}
			got := make([]string, tc.workers)
			deadline := time.After(30 * time.Second)
			for range tc.workers {
				select {
				case line := <-lines:
					var i int
					var v string
					if _, err := fmt.Sscanf(line, "%d %s", &i, &v); err != nil || i < 0 || i >= tc.workers {
						t.Fatalf("worker printed %q", line)
					}
					got[i] = v
				case <-deadline:
					t.Fatalf("workers printed only %q within 30 s", got)
				}
			}
			cancel()
			for _, p := range procs {
				<-p.Done()
			}
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("CUDA_VISIBLE_DEVICES of the workers: %q, want %q", got, tc.want)
			}
			mu.Lock()
			defer mu.Unlock()
			if (looks > 0) != tc.looked || looks > 1 {
				t.Errorf("the launcher looked for GPUs %d times, want looked=%v (once at most)", looks, tc.looked)
			}
			all := strings.Join(notices, "\n")
			if tc.notice != "" && !strings.Contains(all, tc.notice) {
				t.Errorf("notices %q lack %q", notices, tc.notice)
			}
			if tc.notice == "" && strings.Contains(all, "GPU") {
				t.Errorf("notices %q speak of GPUs", notices)
			}
		})
	}
}
