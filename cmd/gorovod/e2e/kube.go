package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/cluster/kube"
	"github.com/gorovod/gorovod/internal/testing/testkube"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// podLogRe names a worker pod's container log under the node's LogDir:
// <namespace>_<pod>_<uid>/trainer/<restart>.log.
var podLogRe = regexp.MustCompile(`_[a-z0-9-]+-worker-(\d+)_[^/]+/` + kube.ContainerName + `/\d+\.log$`)

// PodLogs feeds the trainer lines of the worker pods' logs (the CRI log
// format: "time stream tag line") to a harness, as if gorovod run had
// printed them with their launch index: the workers' output stays with
// their pods.
type PodLogs struct {
	Dir     string
	Job     string            // when set, only this job's workers
	Read    map[string]int64  // bytes of each file taken
	Partial map[string]string // a line begun, not ended
}

// Follow reads the logs every 100 ms (files have no change notification to
// Wait on) until ctx ends.
func (p *PodLogs) Follow(ctx context.Context, h *RunJobHarness) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		p.Poll(h)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Poll takes what the logs gained since the last call.
func (p *PodLogs) Poll(h *RunJobHarness) {
	files, _ := filepath.Glob(filepath.Join(p.Dir, "*", kube.ContainerName, "*.log"))
	for _, f := range files {
		m := podLogRe.FindStringSubmatch(f)
		if m == nil || (p.Job != "" && !strings.Contains(f, "_"+p.Job+"-worker-")) {
			continue
		}
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		if _, err := fh.Seek(p.Read[f], 0); err == nil {
			r := bufio.NewReaderSize(fh, 1<<20)
			for {
				// Only whole lines: the container runtime may be writing
				// this one now, and its rest is taken at the next poll
				// (a Scanner would hand the part written so far over as
				// a line of its own at the end of the file).
				line, err := r.ReadString('\n')
				if err != nil {
					break
				}
				p.Read[f] += int64(len(line))
				line = strings.TrimSuffix(line, "\n")
				// 2026-11-24T02:00:00.000000000Z stdout F {...}
				parts := strings.SplitN(line, " ", 4)
				if len(parts) < 4 {
					continue
				}
				text := p.Partial[f] + parts[3]
				if parts[2] == "P" { // continued in the next entry
					p.Partial[f] = text
					continue
				}
				delete(p.Partial, f)
				// The time the container runtime took the line, rather
				// than this poll's (up to 100 ms later).
				at, err := time.Parse(time.RFC3339Nano, parts[0])
				if err != nil {
					at = time.Now()
				}
				h.readLine(fmt.Sprintf("[%s] %s", m[1], text), at)
			}
		}
		fh.Close()
	}
}

// InstallGorovod applies deploy/kubernetes/gorovod.yaml (the GorovodJob
// resource, the scheduler's and the driver's roles) as the admin, and
// returns the admin's dynamic client.
func InstallGorovod(ctx context.Context, t *testing.T, cp *testkube.ControlPlane) dynamic.Interface {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := testkube.ApplyManifest(ctx, dyn, Path("deploy/kubernetes/gorovod.yaml")); err != nil {
		t.Fatal(err)
	}
	return dyn
}

// Images of the tests' worker pods on a real kubelet.
const (
	PauseImage   = "gorovod.local/pause:test"
	TrainerImage = "gorovod.local/synthetic:test"
)

// TrainerImages are the pause container and the synthetic trainer
// (examples/synthetic) as images, static builds.
func TrainerImages(t *testing.T) []testkube.Image {
	t.Helper()
	pause := testkube.BuildStatic(t, Path("cluster/kube/testdata/podhelper"))
	trainer := testkube.BuildStatic(t, Path("examples/synthetic"))
	return []testkube.Image{
		{Ref: PauseImage, Files: map[string]string{"bin/pause": pause}, Entrypoint: []string{"/bin/pause", "pause"}},
		{Ref: TrainerImage, Files: map[string]string{"bin/synthetic": trainer}, Entrypoint: []string{"/bin/synthetic"}},
	}
}

// AdvertiseSlots gives node n gorovod.io/slot resources, as an operator
// advertises them on a node without GPUs (the kubelet admits a pod only
// within them), and waits until they are allocatable.
func AdvertiseSlots(ctx context.Context, t *testing.T, admin kubernetes.Interface, node string, n int) {
	t.Helper()
	if _, err := admin.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType,
		fmt.Appendf(nil, `{"status":{"capacity":{"gorovod.io/slot":"%d"}}}`, n), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	Poll(t, "the node's slots allocatable", time.Minute, func() bool {
		got, err := admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		q := got.Status.Allocatable["gorovod.io/slot"]
		return err == nil && q.Value() == int64(n)
	})
}
