package job_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/job"
	"github.com/gorovod/gorovod/job/hosts"
	"github.com/gorovod/gorovod/job/launch"
	"github.com/gorovod/gorovod/sync/driver"
	"github.com/gorovod/gorovod/sync/epoch"
)

// hostsLauncher pretends that this machine is several hosts: it records where
// each worker was asked to run and starts it here.
type hostsLauncher struct {
	local job.LocalLauncher
	mu    sync.Mutex
	hosts map[int]string // launch index → host
}

func (l *hostsLauncher) Launch(ctx context.Context, r job.LaunchRequest) (job.Process, error) {
	l.mu.Lock()
	l.hosts[r.Index] = r.Host
	l.mu.Unlock()
	r.Host = ""
	return l.local.Launch(ctx, r)
}

// channelDiscovery reports the host lists a test sends.
type channelDiscovery chan []job.Host

func (c channelDiscovery) Discover(ctx context.Context, found func([]job.Host)) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case hosts := <-c:
			found(hosts)
		}
	}
}

// Workers go to the hosts the discovery lists, as many as their slots take;
// a host that leaves the list takes its workers out of the job, which goes on
// with the others.
func TestHostsFromDiscovery(t *testing.T) {
	r := newRecorder()
	cfg := config(t, r, 2, envSteps+"=300", envStepTime+"=20ms")
	disc := make(channelDiscovery, 1)
	disc <- []job.Host{{Name: "a", Slots: 1}, {Name: "b", Slots: 1}}
	launcher := &hostsLauncher{hosts: map[int]string{}}
	cfg.Launcher, cfg.Discovery = launcher, disc
	j, err := job.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := launcher.hosts; got[0] != "a" || got[1] != "b" {
		t.Fatalf("workers placed on %v, want a and b", got)
	}
	r.waitFor(t, "a world of 2", worldOf(2))
	if err := j.AddWorkers(context.Background(), 1); !errors.Is(err, job.ErrNoSlot) {
		t.Fatalf("a third worker on two hosts of one slot: %v", err)
	}
	disc <- []job.Host{{Name: "a", Slots: 1}}
	r.waitFor(t, "a world of 1 after host b left", func(evs []job.Event) bool {
		i := slices.IndexFunc(evs, func(e job.Event) bool {
			n, ok := e.(job.Notice)
			return ok && strings.Contains(n.Message, `host "b" left`)
		})
		return i >= 0 && slices.ContainsFunc(evs[i:], func(e job.Event) bool {
			w, ok := e.(job.WorldChanged)
			return ok && len(w.World.Members) == 1
		})
	})
	o, err := j.Wait()
	if err != nil {
		t.Fatalf("job failed: %v\n%s", err, describe(r.all()))
	}
	if o.Workers[0].State != job.Finished || o.Workers[1].State != job.Stopped || o.Workers[1].StopReason != job.StopHostDropped || o.Workers[1].Host != "b" {
		t.Fatalf("workers %+v", o.Workers)
	}
}

// lostHostLauncher is hostsLauncher whose workers, when a signal kills
// them, end as the ssh launcher's do when their host dies: the connection
// to the worker broke (a *launch.HostError).
type lostHostLauncher struct{ hostsLauncher }

func (l *lostHostLauncher) Launch(ctx context.Context, r job.LaunchRequest) (job.Process, error) {
	host := r.Host
	p, err := l.hostsLauncher.Launch(ctx, r)
	if err != nil {
		return nil, err
	}
	return lostHostProcess{Process: p, host: host}, nil
}

type lostHostProcess struct {
	job.Process
	host string
}

func (p lostHostProcess) Err() error {
	err := p.Process.Err()
	if job.KilledBySignal(err) {
		return &launch.HostError{Host: p.host, Err: errors.New("lost the connection to the worker (ssh: exit status 255)")}
	}
	return err
}

// removals is a driver that records the workers the runner takes out of
// the job (Remove, and RemoveLost, which it also lists in lost).
type removals struct {
	job.Driver
	mu      sync.Mutex
	removed []string
	lost    []string
}

func (d *removals) Remove(name string) {
	d.mu.Lock()
	d.removed = append(d.removed, name)
	d.mu.Unlock()
	d.Driver.Remove(name)
}

func (d *removals) RemoveLost(name string) {
	d.mu.Lock()
	d.removed = append(d.removed, name)
	d.lost = append(d.lost, name)
	d.mu.Unlock()
	d.Driver.RemoveLost(name)
}

func (d *removals) names() (removed, lost []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.removed), slices.Clone(d.lost)
}

// A host that dies (every worker there killed, their connections broken)
// is blacklisted, and each of its workers is taken out of the job for good
// at once, the ones whose connection broke first too: before, only the
// workers still running when the host left the list were, and the others
// stayed members until the survivors' blame and the driver's probes found
// them, which cost the job a world with a dead member in it. The job goes
// on with the other host's worker and finishes.
func TestDeadHostsWorkersAllRemoved(t *testing.T) {
	r := newRecorder()
	cfg := config(t, r, 3, envSteps+"=300", envStepTime+"=20ms")
	cfg.MinWorkers = 1
	launcher := &lostHostLauncher{hostsLauncher{hosts: map[int]string{}}}
	cfg.Launcher = launcher
	watch := job.NewHostWatch(hosts.Static{{Name: "a", Slots: 1}, {Name: "b", Slots: 2}}, hosts.WatchConfig{})
	var toldMu sync.Mutex
	var told []string
	watch.OnError = func(msg string) {
		toldMu.Lock()
		told = append(told, msg)
		toldMu.Unlock()
	}
	cfg.Discovery = watch
	var d *removals
	cfg.StartDriver = func(ctx context.Context, dc driver.Config) (job.Driver, error) {
		real, err := driver.Start(ctx, dc)
		if err != nil {
			return nil, err
		}
		d = &removals{Driver: real}
		return d, nil
	}
	j, err := job.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, "a world of 3", worldOf(3))
	var onB []job.WorkerRecord
	deadline := time.After(time.Minute)
	for len(onB) < 2 { // the runner learns the member names of its processes on its tick
		onB = slices.DeleteFunc(j.Workers(), func(w job.WorkerRecord) bool { return w.Host != "b" || w.Name == "" })
		if len(onB) < 2 {
			select {
			case <-deadline:
				t.Fatalf("workers on b: %+v", j.Workers())
			case <-r.notify:
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	for _, w := range onB {
		if err := syscall.Kill(w.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	o, err := j.Wait()
	if err != nil {
		t.Fatalf("job failed: %v\n%s", err, describe(r.all()))
	}
	removed, lost := d.names()
	for _, w := range onB {
		if !slices.Contains(removed, w.Name) {
			t.Errorf("worker %d (%s) of the dead host b was not taken out of the job; removed: %v\n%s", w.Index, w.Name, removed, describe(r.all()))
		}
	}
	// The worker whose loss blacklisted b is taken out as lost: that
	// explains the failure of its world to the driver, which forms the
	// next one without probing every member first.
	if len(lost) == 0 || !slices.ContainsFunc(onB, func(w job.WorkerRecord) bool { return slices.Contains(lost, w.Name) }) {
		t.Errorf("no worker of b was taken out as lost (RemoveLost); removed %v, lost %v", removed, lost)
	}
	for _, w := range o.Workers {
		// A worker of b is lost, or stopped as its host left the list when
		// the first one's loss blacklisted it before its own exit was seen.
		ok := w.State == job.Finished
		if w.Host == "b" {
			ok = w.State == job.Lost || (w.State == job.Stopped && w.StopReason == job.StopHostDropped)
		}
		if !ok {
			t.Errorf("worker %d on %s: %v (%v)", w.Index, w.Host, w.State, w.StopReason)
		}
	}
	toldMu.Lock()
	defer toldMu.Unlock()
	if !slices.ContainsFunc(told, func(m string) bool { return strings.Contains(m, "host b lost a worker: blacklisted") }) {
		t.Errorf("b was not blacklisted; the host watch said %q", told)
	}
}

// fakeDriver plays a driver whose job's training is over while the members
// of the last world in unfinished have not said so; launch is what w0
// published.
type fakeDriver struct {
	finished   chan struct{}
	world      epoch.World
	launch     string
	unfinished []string
}

func (d *fakeDriver) GossipAddr() string        { return "127.0.0.1:1" }
func (d *fakeDriver) Current() epoch.World      { return d.world }
func (d *fakeDriver) Finished() <-chan struct{} { return d.finished }
func (d *fakeDriver) Unfinished() []string      { return d.unfinished }
func (d *fakeDriver) Remove(string)             {}
func (d *fakeDriver) RemoveLost(string)         {}
func (d *fakeDriver) Exited(string)             {}
func (d *fakeDriver) SetMinWorkers(int)         {}
func (d *fakeDriver) SetFirstWorld(int)         {}
func (d *fakeDriver) Close() error              { return nil }
func (d *fakeDriver) Workers() []driver.WorkerInfo {
	return []driver.WorkerInfo{{Name: "w0", Launch: d.launch}, {Name: "w1", Launch: "1"}}
}

// End-of-job rules 2 and 3: once training is over, the job waits up to
// RescueLimit while a process of its own is finishing the last step, stops
// the processes left after FinishGrace when none is, and leaves members that
// reported the end until ExitLimit to exit.
func TestLastStepGetsTime(t *testing.T) {
	for _, tc := range []struct {
		name       string
		launch     string   // what w0 published
		unfinished []string // the members that did not report the end
		rescue     time.Duration
		atLeast    time.Duration // the workers are stopped no earlier
		atMost     time.Duration // and no later than this after the end of training
	}{
		{"a process of the job finishes the last step", "0", []string{"w0"}, 2 * time.Second, 2 * time.Second, time.Minute},
		{"the unfinished member is not the job's", "", []string{"w0"}, time.Minute, 0, time.Minute - time.Second},
		{"the members reported the end and are exiting", "0", nil, time.Minute, 2 * time.Second, time.Minute - time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecorder()
			cfg := config(t, r, 2, envModes+"=wait")
			d := &fakeDriver{finished: make(chan struct{}), launch: tc.launch, unfinished: tc.unfinished,
				world: epoch.World{Number: 3, Members: []epoch.Member{{Name: "w0"}, {Name: "w1"}}}}
			cfg.StartDriver = func(context.Context, driver.Config) (job.Driver, error) { return d, nil }
			cfg.FinishGrace, cfg.RescueLimit, cfg.ExitLimit = 300*time.Millisecond, tc.rescue, 2*time.Second
			j, err := job.Start(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			r.waitFor(t, "both workers waiting", saidLine("waiting", 2))
			finishedAt := time.Now()
			close(d.finished)
			o, err := j.Wait()
			if !errors.Is(err, job.ErrFailed) || !o.TrainingFinished || o.World.Number != 3 {
				t.Fatalf("outcome %+v, error %v: training finished, but no worker finished it here", o, err)
			}
			for _, w := range o.Workers {
				after := w.Exited.Sub(finishedAt)
				if w.State != job.Stopped || w.StopReason != job.StopNotNeeded || after < tc.atLeast || after > tc.atMost {
					t.Errorf("worker %d: %v (%v) %v after the end of training, want stopped (not-needed) after [%v, %v]", w.Index, w.State, w.StopReason, after, tc.atLeast, tc.atMost)
				}
			}
		})
	}
}

// Rule 7 with a slow driver: the workers report the end of training and
// exit, and the driver (loaded, or frozen for a moment) takes the report only
// after it has seen every process exit. The job waits a moment for such a
// late report before its verdict, instead of failing for "training did not
// finish"; without any report it still fails.
func TestLateEndOfTrainingReport(t *testing.T) {
	for _, tc := range []struct {
		name     string
		reported bool
	}{
		{"the report comes after the exits", true},
		{"no report at all", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecorder()
			cfg := config(t, r, 2, envModes+"=exit")
			d := &fakeDriver{finished: make(chan struct{}), launch: "0",
				world: epoch.World{Number: 1, Members: []epoch.Member{{Name: "w0"}, {Name: "w1"}}}}
			cfg.StartDriver = func(context.Context, driver.Config) (job.Driver, error) { return d, nil }
			if tc.reported {
				// The driver reads the report a moment after the exits.
				cfg.Sinks = append(cfg.Sinks, &afterExits{n: 2, then: func() {
					time.AfterFunc(200*time.Millisecond, func() { close(d.finished) })
				}})
			}
			j, err := job.Start(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			o, err := j.Wait()
			if o.TrainingFinished != tc.reported {
				t.Fatalf("training finished %v, want %v (error %v)\n%s", o.TrainingFinished, tc.reported, err, describe(r.all()))
			}
			if !tc.reported && !errors.Is(err, job.ErrFailed) {
				t.Fatalf("no report of the end, and the job did not fail: %v", err)
			}
		})
	}
}

// afterExits calls then once n workers have exited (sinks are called one at
// a time).
type afterExits struct {
	n    int
	then func()
}

func (a *afterExits) Event(e job.Event) {
	if _, ok := e.(job.WorkerExited); ok {
		if a.n--; a.n == 0 {
			a.then()
		}
	}
}
