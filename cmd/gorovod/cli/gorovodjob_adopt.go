package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gorovod/gorovod/cluster/kube"
	"github.com/gorovod/gorovod/cluster/kube/api"
	"github.com/gorovod/gorovod/cluster/steer"
	"github.com/gorovod/gorovod/heuristics/goodput"
	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/job"
)

// A GorovodJob's driver pod that dies (killed, or its pod deleted) is
// replaced by the scheduler, and the replacement takes the running job back
// instead of starting it again:
//
//   - the first driver writes status.adoption once its first workers run:
//     the job id, the workers' gossip seed (its own address), the name of
//     the job's Secret, the floor and the probe timeout the workers were
//     given; then, with the job's status, the workers' gossip addresses as
//     they change; and marks it ended when the job is over. A replacement
//     writes it again with its own address as the seed. The worker pods,
//     their Secret and Service belong to the GorovodJob, not to the
//     driver's pod, so they outlive it.
//   - SIGTERM (its pod deleted) makes the driver leave: it returns without
//     stopping the workers (ErrDetached, exit status 143).
//   - the scheduler starts a driver pod in place of one that ended so while
//     status.adoption is not ended, with the job secret from the Secret in
//     its environment (service.replaceDriver).
//   - the replacement finds status.adoption, checks the secret against the
//     Secret's name (a hash of its contents), binds the seed if it is at
//     its own pod IP and free (a host-network pod on the same node), else
//     its own pod IP (job.Adoption.OwnAddr, set by podGossip), contacts the
//     workers at their recorded gossip addresses, and adopts the worker pods the pod
//     watch finds running (kube.Launcher.Adopt); the workers, which train on
//     without a driver, come back to it.
//   - the replacement's steering heuristic fits the job's goodput model to
//     the profile the driver before it recorded (status.goodput.profile)
//     with what it measures itself (recordedGoodput), so the scheduler goes
//     on from the job's measured sizes instead of seeing it as new.
//   - should the driver it replaced come back (its node was only cut off),
//     the older of the two stops proposing as soon as it sees the newer one
//     (driver.Driver.Superseded) and leaves the workers to it.

// ErrDetached is returned by a GorovodJob's driver that left its running
// job to a replacement driver pod (SIGTERM); Run exits 143 for it, which
// the scheduler reads as a driver that did not end the job.
var ErrDetached = errors.New("left the running job to a replacement driver pod")

// exitDetached is Run's exit status for ErrDetached: 128+SIGTERM.
const exitDetached = 143

// takeBack prepares the adoption of the running job status.adoption
// describes: the job secret comes from the environment (the Secret the
// scheduler named in this pod's spec) and must be the Secret's.
func (d *gorovodJobDriver) takeBack(a *api.Adoption) (*job.Adoption, error) {
	secret, ok, err := envconfig.LoadJobSecret(os.Getenv)
	switch {
	case err != nil:
		return nil, fmt.Errorf("gorovodjob %s: taking the running job back: %w", d.name, err)
	case !ok:
		return nil, fmt.Errorf("gorovodjob %s: status.adoption says job %s runs, but this driver has no %s to take it back with (the scheduler gives a replacement driver pod the job's Secret %s)",
			d.name, a.JobID, envconfig.EnvSecret, a.SecretName)
	case len(a.Seeds) == 0 || a.JobID == "":
		return nil, fmt.Errorf("gorovodjob %s: status.adoption names no job id or seed", d.name)
	}
	if got := kube.SecretNameFor(d.name, kube.SecretEnv(secret)); got != a.SecretName {
		return nil, fmt.Errorf("gorovodjob %s: the secret in %s is not the one of the job's Secret %s", d.name, envconfig.EnvSecret, a.SecretName)
	}
	dir, err := filepath.Abs(filepath.Join(os.TempDir(), "gorovod-"+a.JobID))
	if err != nil {
		return nil, err
	}
	d.adopting, d.secret = a, secret
	// The workers it launches get what the running ones were given: the
	// floor and the probe timeout, which the adopting driver then uses too
	// (job.Config.ProbeTimeout unset: startGorovodJob leaves it).
	var probeTimeout time.Duration
	if a.ProbeTimeout != nil {
		probeTimeout = a.ProbeTimeout.Duration
	}
	env := envconfig.ElasticWorker{JobID: a.JobID, Secret: secret, Seeds: a.Seeds, MinWorkers: int(a.MinWorkers), ProbeTimeout: probeTimeout}.Environ()
	return &job.Adoption{Dir: dir, Record: job.JobRecord{JobID: a.JobID}, Env: env, Contact: slices.Clone(a.Workers)}, nil
}

// adoptPods fills the adoption's workers from the job's pods as the
// launcher's watch found them: each running pod with its launch index and
// host. The hosts are published again with the running pods' slots
// occupied, so that the job's first host list keeps the slots they hold
// on the allocation's nodes; the workers on slots the list lacks (their
// node left the allocation, or holds fewer of the job's workers now) the
// job stops as a dropped host's.
func (d *gorovodJobDriver) adoptPods(l *kube.Launcher, a *job.Adoption) error {
	if err := l.AdoptSecret(kube.SecretEnv(d.secret)); err != nil {
		return err
	}
	defer d.publish()
	for _, w := range l.Provisioner().Workers() {
		rw := job.RecordedWorker{Index: w.Index, Host: w.Host}
		aw := job.AdoptedWorker{RecordedWorker: rw}
		switch {
		case w.Index < 0:
			continue
		case w.Running && !w.Ended && !w.Deleted && w.Host != "":
			aw.Remote = true
			d.mu.Lock()
			d.podHost[w.Index] = w.Host
			d.occupied[w.Host] = w.Index
			d.mu.Unlock()
		case w.Ended || w.Deleted:
			aw.Exited, aw.State = true, job.Unknown.String()
			if w.Exited && w.ExitCode == 0 {
				aw.State = job.Finished.String()
			}
		default:
			aw.Why = fmt.Sprintf("pod %s not running", w.Pod)
		}
		a.Workers = append(a.Workers, aw)
	}
	return nil
}

// writeAdoption records what a replacement driver needs (status.adoption),
// once the job's first workers run: this driver's address is the job's
// seed. A driver that took the job back keeps the record it found (the
// floor and probe timeout the workers were given, their addresses) with
// its own address as the seed: for the workers it starts, and for the
// driver that replaces it.
func (d *gorovodJobDriver) writeAdoption(ctx context.Context, jobID string, seeds []string, minWorkers int, probeTimeout time.Duration) {
	if d.kl == nil {
		return
	}
	a := api.Adoption{JobID: jobID, Seeds: seeds, SecretName: d.kl.Provisioner().SecretName(), MinWorkers: int32(minWorkers)}
	if probeTimeout > 0 {
		a.ProbeTimeout = &metav1.Duration{Duration: probeTimeout}
	}
	if t := d.adopting; t != nil {
		a.SecretName, a.MinWorkers, a.ProbeTimeout, a.Workers = t.SecretName, t.MinWorkers, t.ProbeTimeout, t.Workers
	}
	if d.patchAdoption(ctx, a) {
		d.mu.Lock()
		d.recorded = true
		d.mu.Unlock()
	}
}

// endAdoption marks the record ended: the job is over, and this driver's
// end is the job's.
func (d *gorovodJobDriver) endAdoption(ctx context.Context) {
	d.mu.Lock()
	have := d.recorded || d.adopting != nil
	d.mu.Unlock()
	if !have {
		return
	}
	body := []byte(`{"status":{"adoption":{"ended":true}}}`)
	if _, err := d.clients.jobs(d.clients.namespace).Patch(ctx, d.name, types.MergePatchType, body, metav1.PatchOptions{}, "status"); err != nil {
		d.report("marking gorovodjob %s's adoption record ended: %v", d.name, d.clients.apiError(err))
	}
}

func (d *gorovodJobDriver) patchAdoption(ctx context.Context, a api.Adoption) bool {
	body, err := json.Marshal(map[string]any{"status": map[string]any{"adoption": a}})
	if err != nil {
		d.report("gorovodjob status: %v", err)
		return false
	}
	if _, err := d.clients.jobs(d.clients.namespace).Patch(ctx, d.name, types.MergePatchType, body, metav1.PatchOptions{}, "status"); err != nil {
		d.report("writing gorovodjob %s's adoption record (a replacement driver could not take the job back): %v", d.name, d.clients.apiError(err))
		return false
	}
	return true
}

// canHandOver says whether a replacement driver could take the job back.
func (d *gorovodJobDriver) canHandOver() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return (d.recorded || d.adopting != nil) && d.kl != nil
}

// detach leaves the worker pods to a replacement driver.
func (d *gorovodJobDriver) detach() {
	d.kl.Detach()
	d.stop()
}

// owner is the owner reference of the job's worker pods, Secret and
// Service: the GorovodJob, so that they outlive a driver pod.
func (d *gorovodJobDriver) owner() *metav1.OwnerReference {
	return &metav1.OwnerReference{APIVersion: api.Group + "/" + api.Version, Kind: api.Kind, Name: d.name, UID: d.uid}
}

// Adopt takes back a worker pod of the job (job.WorkerAdopter); its slot,
// marked occupied by adoptPods, is freed if it cannot be.
func (p placedLauncher) Adopt(ctx context.Context, r job.AdoptRequest) (job.Process, error) {
	proc, err := p.d.kl.Adopt(ctx, r)
	if err != nil {
		p.d.vacate(r.Index)
	}
	return proc, err
}

// recordedGoodput is what the job's earlier driver recorded of its goodput
// (status.goodput), for the steering heuristic of a driver that takes the
// job back; nil when it recorded nothing. What no driver writes is left
// out, with a report: entries past api.MaxGoodputProfile, an entry the
// profile refuses (goodput.Profile.AddEntry), gradient statistics that are
// not finite numbers ≥ 0.
func recordedGoodput(name string, g *api.GoodputStatus, report func(string, ...any)) *steer.Recorded {
	if g == nil {
		return nil
	}
	entries := g.Profile
	if len(entries) > api.MaxGoodputProfile {
		report("GorovodJob %s: status.goodput.profile holds %d configurations, more than a driver writes: taking the first %d",
			name, len(entries), api.MaxGoodputProfile)
		entries = entries[:api.MaxGoodputProfile]
	}
	prof := &goodput.Profile{}
	for i, e := range entries {
		if err := prof.AddEntry(e); err != nil {
			report("GorovodJob %s: status.goodput.profile[%d] left out: %v", name, i, err)
		}
	}
	r := &steer.Recorded{Model: g.Model, Profile: prof}
	if gr := g.Model.Grad; !(gr.Sqr >= 0 && gr.Var >= 0) || math.IsInf(gr.Sqr, 0) || math.IsInf(gr.Var, 0) {
		report("GorovodJob %s: status.goodput.model.grad %+v left out: not finite numbers ≥ 0", name, gr)
		r.Model.Grad = goodput.GradParams{}
	}
	return r
}

// goodputProfile is the profile status.goodput records: at most
// api.MaxGoodputProfile configurations, those of the most steps.
func goodputProfile(entries []goodput.ProfileEntry) []goodput.ProfileEntry {
	if len(entries) <= api.MaxGoodputProfile {
		return entries
	}
	kept := slices.Clone(entries)
	slices.SortStableFunc(kept, func(a, b goodput.ProfileEntry) int { return cmp.Compare(b.OptimCount, a.OptimCount) })
	return kept[:api.MaxGoodputProfile]
}
