package cli

import (
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gorovod/gorovod/cluster/kube"
	"github.com/gorovod/gorovod/cluster/kube/api"
	"github.com/gorovod/gorovod/heuristics/goodput"
	"github.com/gorovod/gorovod/internal/envconfig"
)

// TestTakeBack: a replacement driver takes the job back only with the
// secret of the Secret its record names, and gives the adopted job the
// workers' environment (id, secret, seed, minimum, and the probe timeout
// where the record has one) and the workers' gossip addresses to contact.
func TestTakeBack(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	record := func() *api.Adoption {
		return &api.Adoption{JobID: "job-9", Seeds: []string{"198.18.0.3:7946"}, Workers: []string{"198.18.0.4:40001", "198.18.0.5:40002"}, MinWorkers: 2,
			ProbeTimeout: &metav1.Duration{Duration: 3 * time.Second}, SecretName: kube.SecretNameFor("mnist", kube.SecretEnv(secret))}
	}
	for _, tc := range []struct {
		name      string
		env       string // GOROVOD_SECRET
		record    func(*api.Adoption)
		want      string        // "" for taken back
		wantProbe time.Duration // the workers' GOROVOD_PROBE_TIMEOUT (0: none)
	}{
		{"the job's secret", hex.EncodeToString(secret), func(*api.Adoption) {}, "", 3 * time.Second},
		{"no probe timeout recorded", hex.EncodeToString(secret), func(a *api.Adoption) { a.ProbeTimeout = nil }, "", 0},
		{"no secret", "", func(*api.Adoption) {}, "has no GOROVOD_SECRET", 0},
		{"not hex", "zz", func(*api.Adoption) {}, "hex-encoded", 0},
		{"another secret", hex.EncodeToString([]byte("another secret of 32 bytes......")), func(*api.Adoption) {}, "is not the one of the job's Secret", 0},
		{"another Secret named", hex.EncodeToString(secret), func(a *api.Adoption) { a.SecretName = "mnist-secret-0000000000" }, "is not the one", 0},
		{"no seed", hex.EncodeToString(secret), func(a *api.Adoption) { a.Seeds = nil }, "no job id or seed", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(envconfig.EnvSecret, tc.env)
			d := &gorovodJobDriver{name: "mnist"}
			a := record()
			tc.record(a)
			got, err := d.takeBack(a)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("got %v, want an error saying %q", err, tc.want)
				}
				if d.adopting != nil {
					t.Fatal("adopting after an error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			w, err := envconfig.LoadElastic(func(name string) string {
				for _, kv := range got.Env {
					if k, v, _ := strings.Cut(kv, "="); k == name {
						return v
					}
				}
				return ""
			})
			if err != nil || w.JobID != "job-9" || string(w.Secret) != string(secret) || !slices.Equal(w.Seeds, []string{"198.18.0.3:7946"}) || w.MinWorkers != 2 || w.ProbeTimeout != tc.wantProbe {
				t.Fatalf("the adopted job's environment: %+v, %v (want probe timeout %v)", w, err, tc.wantProbe)
			}
			if got.Record.JobID != "job-9" || !strings.HasSuffix(got.Dir, "gorovod-job-9") || d.adopting == nil ||
				!slices.Equal(got.Contact, []string{"198.18.0.4:40001", "198.18.0.5:40002"}) {
				t.Fatalf("adoption %+v", got)
			}
		})
	}
}

// A driver that left its job exits 143, which the scheduler reads as a
// driver to replace; its other ends keep their statuses.
func TestExitStatus(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{nil, 0},
		{flag.ErrHelp, 0},
		{ErrUsage, 2},
		{&commandError{command: "run", err: ErrDetached}, 143},
		{&commandError{command: "run", err: errors.New("job failed")}, 1},
		{&commandError{command: "run", err: errJobDeleted}, 1},
	} {
		if got := exitStatus(tc.err); got != tc.want {
			t.Errorf("exitStatus(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

// TestRecordedGoodput: a replacement driver takes the goodput profile the
// driver before it recorded, leaving out with a report what no driver
// writes; the profile a driver records holds the configurations of the most
// steps.
func TestRecordedGoodput(t *testing.T) {
	entry := func(replicas int, steps int64) goodput.ProfileEntry {
		return goodput.ProfileEntry{Nodes: 1, Replicas: replicas, MicroBatch: 16, AccumTime: 0.01 * float64(steps), AccumCount: steps, OptimTime: 0.02 * float64(steps), OptimCount: steps}
	}
	model := goodput.Model{Perf: goodput.PerfParams{AlphaC: 0.01, BetaC: 1e-4, Gamma: 1.5}, Grad: goodput.GradParams{Sqr: 1, Var: 2}, InitBatch: 64}
	many := make([]goodput.ProfileEntry, api.MaxGoodputProfile+3)
	for i := range many {
		many[i] = entry(i+1, 10)
	}
	for _, tc := range []struct {
		name     string
		status   *api.GoodputStatus
		entries  int    // configurations taken (-1: no record)
		grad     bool   // the recorded gradient statistics kept
		reported string // "" for nothing reported
	}{
		{"nothing recorded", nil, -1, false, ""},
		{"a model without a profile", &api.GoodputStatus{Model: model, MaxProfiledWorkers: 2}, 0, true, ""},
		{"two configurations", &api.GoodputStatus{Model: model, Profile: []goodput.ProfileEntry{entry(1, 10), entry(2, 20)}}, 2, true, ""},
		{"one a driver could not have written", &api.GoodputStatus{Model: model, Profile: []goodput.ProfileEntry{entry(1, 10), {Nodes: 2, Replicas: 1}, entry(2, 20)}},
			2, true, "status.goodput.profile[1] left out"},
		{"more configurations than a driver writes", &api.GoodputStatus{Model: model, Profile: many}, api.MaxGoodputProfile, true, "taking the first"},
		{"gradient statistics not a number", &api.GoodputStatus{Model: goodput.Model{Grad: goodput.GradParams{Sqr: math.NaN(), Var: 1}, InitBatch: 64}}, 0, false,
			"status.goodput.model.grad"},
		{"negative gradient statistics", &api.GoodputStatus{Model: goodput.Model{Grad: goodput.GradParams{Sqr: 1, Var: -1}, InitBatch: 64}}, 0, false,
			"status.goodput.model.grad"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var reports []string
			r := recordedGoodput("mnist", tc.status, func(format string, args ...any) { reports = append(reports, fmt.Sprintf(format, args...)) })
			if tc.entries < 0 {
				if r != nil {
					t.Fatalf("a record %+v of nothing", r)
				}
				return
			}
			if r == nil || r.Profile.Len() != tc.entries || (r.Model.Grad.Var > 0) != tc.grad || r.Model.InitBatch != 64 {
				t.Fatalf("record %+v (%d configurations), want %d, gradient statistics kept %v", r, r.Profile.Len(), tc.entries, tc.grad)
			}
			said := strings.Join(reports, "\n")
			if (tc.reported == "") != (said == "") || !strings.Contains(said, tc.reported) {
				t.Errorf("reported %q, want %q", said, tc.reported)
			}
		})
	}

	// The most-stepped configurations are kept.
	kept := goodputProfile(append(slices.Clone(many), entry(99, 1000)))
	if len(kept) != api.MaxGoodputProfile || !slices.ContainsFunc(kept, func(e goodput.ProfileEntry) bool { return e.Replicas == 99 }) {
		t.Errorf("recorded %d configurations %+v; want %d with the one of 1000 steps", len(kept), kept, api.MaxGoodputProfile)
	}
	if few := []goodput.ProfileEntry{entry(1, 1)}; !slices.Equal(goodputProfile(few), few) {
		t.Errorf("a short profile recorded as %+v", goodputProfile(few))
	}
}
